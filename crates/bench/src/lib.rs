//! `sluice-bench`: the `sluice bench` suites — honest numbers, reproducible on any machine,
//! next to real peers started in the same run (SPEC §11).
//!
//! Responsible for: driving load against Sluice (in-process through
//! [`sluice_server::Core`], and over HTTP and WebSocket against the real `sluice serve`
//! binary), starting and stopping peers (PostgreSQL; SQLite and the peers' HTTP RPC server
//! run inside the bench), measuring throughput and latency, and writing
//! `bench-results/<suite>/{summary.md, samples.json, run.json, *.svg}`.
//! Not responsible for: asserting behaviour (tests do that; a suite only checks what it
//! needs to trust its own numbers, such as "the restart came back at the acked seq"), or
//! anything the server needs at run time — peers' drivers live only here.
//!
//! Every run is bounded in time and size, uses only loopback, and stops only the
//! processes it started, by their pid.
//!
//! # Layout
//! - [`ingest`]: `sluice bench ingest` — write throughput and ack latency per durability
//!   class, in-process and over HTTP, against PostgreSQL.
//! - [`fanout`]: `sluice bench fanout` — append → every watcher latency and deliveries/s
//!   of topic watchers over SSE and WebSocket, against Redis pub/sub and Redis Streams.
//! - [`topics`]: the topic rows of `sluice bench ingest` and the tag index micro-benchmark.
//! - [`recovery`]: `sluice bench recovery` — time-to-ready after `kill -9`.
//! - [`bootstrap`]: `sluice bench bootstrap` — subscribe → last snapshot row by view size
//!   and transport, and how long a concurrent writer is held meanwhile.
//! - [`snapshot`]: `sluice bench snapshot` — ack latency of writes while a snapshot is
//!   written, and the copy-on-write row map against `BTreeMap`.
//! - [`live`]: `sluice bench live` — write → diff latency of live queries by view size,
//!   number of views and query shape, memory per view, against PostgreSQL's
//!   trigger + LISTEN/NOTIFY + re-query.
//! - [`reads`]: `sluice bench reads` — point reads by key and by index in-process, over
//!   HTTP and pipelined WebSocket, with and without background writes, against Redis
//!   `GET`/`HGETALL` and PostgreSQL prepared `SELECT`.
//! - [`transfer`]: `sluice bench transfer` — the SpacetimeDB keynote-2 transfer workload
//!   against Sluice (WebSocket and HTTP), PostgreSQL and SQLite behind HTTP RPC servers.
//! - [`cluster`]: `sluice bench cluster` — `replicated` vs `fsync` writes, reads over a
//!   leader and a follower, live views spread over 1 / 2 / 3 nodes, failover time, on a
//!   loopback NATS JetStream cluster.
//! - [`harness`]: what every suite shares — runtime, the server under test with its own
//!   data dir, warm-up + measured window, notes, writing and printing the report.
//! - [`load`]: the closed-loop load driver (warm-up, measured window, per-second samples).
//! - [`workload`]: the `events` rows every path writes.
//! - [`server`]: the real `sluice serve` binary as a child process; `/metrics` parsing.
//! - [`peers`]: real peers for the run ([`peers::postgres`], [`peers::redis`]; SQLite is
//!   linked in, see [`transfer::rpc`]).
//! - [`report`]: result tables, targets, and the files a suite writes.
//! - [`svg`]: a dependency-free SVG bar and line chart writer.
//! - [`hist`]: latency histograms (p50/p95/p99) and number formatting.
//! - [`progress`]: progress lines on stderr.
//! - [`sys`]: temp dirs, free ports, signals by pid, machine facts.

use std::path::PathBuf;
use std::process::ExitCode;

pub mod bootstrap;
pub mod cluster;
pub mod fanout;
pub mod harness;
pub mod hist;
pub mod ingest;
pub mod live;
pub mod load;
pub mod peers;
pub mod progress;
pub mod reads;
pub mod recovery;
pub mod report;
pub mod server;
pub mod snapshot;
pub mod snapshot_pacing;
pub mod svg;
pub mod sys;
pub mod topics;
pub mod transfer;
pub mod workload;

/// `sluice bench <suite> [options]`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(clap::Subcommand, Debug)]
pub enum Suite {
    /// Write throughput and ack latency per durability class: in-process, over HTTP, and
    /// PostgreSQL with synchronous_commit=on.
    Ingest(ingest::IngestArgs),
    /// Time-to-ready after kill -9, by records in the log, with and without a snapshot.
    Recovery(recovery::RecoveryArgs),
    /// The SpacetimeDB keynote-2 transfer workload: TPS and p50/p99 of durable transfers
    /// under Zipf(α) contention, Sluice vs PostgreSQL and SQLite behind HTTP RPC servers.
    Transfer(transfer::TransferArgs),
    /// Live queries: write → diff latency (p50/p95/p99) by rows in the view, number of
    /// views and query shape, memory per view; PostgreSQL trigger + LISTEN/NOTIFY + re-query
    /// as the peer.
    Live(live::LiveArgs),
    /// Topic fan-out: append → every watcher p50/p95/p99 at 100 / 1 000 / 10 000 watchers
    /// over SSE and WebSocket, deliveries/s at saturation, one tag vs own tag; Redis
    /// pub/sub and Redis Streams (XREAD BLOCK) as peers.
    Fanout(fanout::FanoutArgs),
    Snapshot(snapshot::SnapshotArgs),
    /// Point reads by key and by index: in-process, HTTP, WebSocket pipelined (JSON and
    /// MessagePack), with and without background writes; Redis GET/HGETALL and PostgreSQL
    /// prepared SELECT as peers.
    Reads(reads::ReadsArgs),
    /// Subscription bootstrap: subscribe → last snapshot row (rows/s) over SSE and WebSocket
    /// (JSON, MessagePack) by view size, and the slowest ack of a concurrent writer.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Beyond one node: `replicated` vs `fsync` write TPS and ack p50/p99, reads spread over
    /// a leader and a follower, failover time after kill -9 (3-node NATS JetStream R3).
    Cluster(cluster::ClusterArgs),
}

/// Options every suite takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Results go to <OUT>/<suite>/.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// A tiny smoke run (a few seconds): checks that the suite works, numbers mean nothing.
    #[arg(long)]
    pub quick: bool,
    /// The sluice binary to run as the server (default: $SLUICE_BIN, else this executable).
    #[arg(long)]
    pub sluice_bin: Option<PathBuf>,
}

/// Checks that `<out>/<suite>/` holds a complete, non-empty result of `suite`: the three
/// files, at least one chart, and samples in which every case succeeded with non-zero
/// numbers. For smoke tests and CI.
pub fn verify_results(out: &std::path::Path, suite: &str) -> anyhow::Result<()> {
    let samples = report::verify_files(&out.join(suite))?;
    match suite {
        "ingest" => ingest::verify_samples(&samples),
        "recovery" => recovery::verify_samples(&samples),
        "transfer" => transfer::verify_samples(&samples),
        "live" => live::verify_samples(&samples),
        "fanout" => fanout::verify_samples(&samples),
        "snapshot" => snapshot::verify_samples(&samples),
        "reads" => reads::verify_samples(&samples),
        "bootstrap" => bootstrap::verify_samples(&samples),
        "cluster" => cluster::verify_samples(&samples),
        other => anyhow::bail!("unknown bench suite {other:?}"),
    }
}

/// Runs one suite. Exits with failure if any case failed (its files are written anyway).
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    sys::stop_children_on_signal();
    server::pages_as_serve();
    let ok = match args.suite {
        Suite::Ingest(a) => ingest::run(a)?,
        Suite::Recovery(a) => recovery::run(a)?,
        Suite::Transfer(a) => transfer::run(a)?,
        Suite::Live(a) => live::run(a)?,
        Suite::Fanout(a) => fanout::run(a)?,
        Suite::Snapshot(a) => snapshot::run(a)?,
        Suite::Reads(a) => reads::run(a)?,
        Suite::Bootstrap(a) => bootstrap::run(a)?,
        Suite::Cluster(a) => cluster::run(a)?,
    };
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
