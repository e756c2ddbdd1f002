//! `sluice`: the single binary — `serve`, `check`, `bench`, `token`, `sql`, `conformance`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice_log::Durability;
use sluice_server::{Config, Core};

mod alloc;
use sluice_sched as sched;
mod tls;

/// mimalloc: the write path allocates on tokio threads and frees on the writer thread;
/// glibc malloc's per-thread arenas handle that pattern poorly. Wrapped to count live heap
/// bytes for `/metrics` (`sluice_alloc_bytes`).
#[global_allocator]
static GLOBAL: alloc::Counting<mimalloc::MiMalloc> = alloc::Counting(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(name = "sluice", version, about = "A single-binary real-time database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Verify every snapshot and log segment of a data directory, offline.
    Check {
        #[arg(long, default_value = "./sluice-data")]
        data: PathBuf,
    },
    /// Run a benchmark suite; results go under bench-results/<suite>/.
    Bench(sluice_bench::BenchArgs),
    /// Print a client token (an HS256 JWT) for development.
    Token(TokenArgs),
    /// An interactive SQL shell against a running server (reads stdin when it is not a
    /// terminal).
    Sql(sluice_shell::SqlArgs),
    /// Run the protocol conformance checks against a running server (black-box: HTTP,
    /// SSE, WebSocket JSON and MessagePack); exit status 1 if any check failed.
    Conformance(ConformanceArgs),
}

#[derive(Args)]
struct ConformanceArgs {
    /// The server's base URL.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:7070")]
    url: String,
    /// The server's admin token.
    #[arg(
        long,
        env = "SLUICE_ADMIN_TOKEN",
        hide_env_values = true,
        required_unless_present = "list"
    )]
    token: Option<String>,
    /// A client token (JWT) the server accepts, for the checks of client refusals and rules.
    #[arg(long, hide_env_values = true)]
    client_token: Option<String>,
    /// The server's --jwt-secret: the suite mints its own client tokens (enables every
    /// token and policy check).
    #[arg(long, env = "SLUICE_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// Run only the checks whose `area/name` contains this text (repeatable).
    #[arg(long = "only", value_name = "PATTERN")]
    only: Vec<String>,
    /// Report as skipped the checks whose `area/name` contains this text (repeatable).
    #[arg(long = "exclude", value_name = "PATTERN")]
    exclude: Vec<String>,
    /// The server's --live-heartbeat-ms, when known (the heartbeat check waits for it).
    #[arg(long)]
    live_heartbeat_ms: Option<u64>,
    /// The server's --watch-queue-records, when known and small (enables the `lagging` check).
    #[arg(long)]
    watch_queue_records: Option<u64>,
    /// The server's --live-queue-events, when known and small (enables the backlog check).
    #[arg(long)]
    live_queue_events: Option<u64>,
    /// The server's --max-body-bytes, when known (enables the WebSocket frame-size checks).
    #[arg(long)]
    max_body_bytes: Option<u64>,
    /// The server's --live-subscriptions-per-connection, when known and small (enables its
    /// `limit` check).
    #[arg(long)]
    live_subscriptions_per_connection: Option<u64>,
    /// Seconds one check may take.
    #[arg(long, default_value_t = 20)]
    check_timeout_secs: u64,
    /// Print the check names and exit.
    #[arg(long)]
    list: bool,
}

#[derive(Args)]
struct TokenArgs {
    /// The HS256 secret the server verifies with (its --jwt-secret).
    #[arg(long, env = "SLUICE_JWT_SECRET", hide_env_values = true)]
    secret: String,
    /// The token's subject (`sub`).
    #[arg(long)]
    sub: String,
    /// A claim `name=value`; the value is JSON when it parses as JSON, else a string.
    /// Repeatable.
    #[arg(long = "claim", value_name = "NAME=VALUE")]
    claims: Vec<String>,
    /// How long the token is valid: a number with a unit, `s`, `m`, `h` or `d` (`90s`,
    /// `15m`, `1h`, `7d`).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    ttl: std::time::Duration,
    /// The `aud` claim.
    #[arg(long)]
    aud: Option<String>,
    /// The `iss` claim.
    #[arg(long)]
    iss: Option<String>,
}

/// `90s`, `15m`, `1h`, `7d` (a bare number is seconds).
fn parse_ttl(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let scale: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: the unit must be s, m, h or d (like 15m or 1h)"
            ))
        }
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number then s, m, h or d (like 15m or 1h)"))?;
    match n.checked_mul(scale) {
        Some(secs) if secs > 0 => Ok(std::time::Duration::from_secs(secs)),
        Some(_) => Err("the ttl must be more than 0".into()),
        None => Err(format!("{text:?} is too long")),
    }
}

fn token(args: TokenArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.secret.is_empty(), "--secret is empty");
    let mut claims = serde_json::Map::new();
    for claim in &args.claims {
        let (name, value) = claim
            .split_once('=')
            .with_context(|| format!("--claim {claim:?}: expected NAME=VALUE"))?;
        anyhow::ensure!(!name.is_empty(), "--claim {claim:?}: the name is empty");
        anyhow::ensure!(
            name != "sub" && name != "exp",
            "--claim {name}: set `sub` with --sub and `exp` with --ttl"
        );
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        claims.insert(name.to_string(), value);
    }
    if let Some(aud) = &args.aud {
        claims.insert("aud".into(), aud.clone().into());
    }
    if let Some(iss) = &args.iss {
        claims.insert("iss".into(), iss.clone().into());
    }
    println!(
        "{}",
        sluice_server::auth::mint_hs256(&args.secret, &args.sub, &claims, args.ttl)
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
struct ServeArgs {
    /// Data directory (created if missing).
    #[arg(long, default_value = "./sluice-data")]
    data: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Durability class for requests that do not name one: memory, disk, fsync or
    /// replicated (with --cluster).
    #[arg(long, default_value = "fsync")]
    durability: Durability,
    /// Largest request body in bytes (at most 32 MiB).
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Most ops in one mutate.
    #[arg(long, default_value_t = 10_000)]
    max_ops: usize,
    /// Largest encoded row in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_row_bytes: usize,
    /// Largest transaction, as the encoded size of its commit record in bytes (a mutate, a
    /// function call); checked op by op while the transaction is built. At most 32 MiB;
    /// default 16 MiB, and in a cluster (`--cluster`) 1 MiB − 8 KiB, at most, as each
    /// commit travels as one NATS message (nats-server's `max_payload`, 1 MiB by default).
    #[arg(long)]
    max_commit_bytes: Option<usize>,
    /// Most columns in one table.
    #[arg(long, default_value_t = 256)]
    max_columns: usize,
    /// Most rows or changes in one page of a scan or of catch-up.
    #[arg(long, default_value_t = 10_000)]
    max_page_rows: usize,
    /// Commits kept in the changelog for catch-up.
    #[arg(long, default_value_t = 100_000)]
    retain_commits: usize,
    /// Approximate bytes kept in the changelog for catch-up.
    #[arg(long, default_value_t = 64 << 20)]
    retain_bytes: usize,
    /// Log bytes written between background snapshots (at least; see
    /// --snapshot-log-percent).
    #[arg(long, default_value_t = 256 << 20)]
    snapshot_log_bytes: u64,
    /// A background snapshot also waits for a log of this percent of the last snapshot's
    /// size, so a large state is not snapshotted back to back: snapshots then write at most
    /// 100 / percent times the log's bytes, and a restart replays at most that share of the
    /// state from the log. 0: --snapshot-log-bytes alone.
    #[arg(long, default_value_t = sluice_server::config::SNAPSHOT_LOG_PERCENT_DEFAULT)]
    snapshot_log_percent: u64,
    /// Size at which a log segment is closed and a new one started.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    /// JavaScript module whose exported functions can be called (`PUT /v1/functions`
    /// replaces it at run time).
    #[arg(long)]
    functions: Option<PathBuf>,
    /// Wall time one function call may take.
    #[arg(long, default_value_t = 1000)]
    function_time_ms: u64,
    /// Memory the JavaScript heap may use.
    #[arg(long, default_value_t = 64 << 20)]
    function_memory_bytes: usize,
    /// Live views held at once (subscribed or warm).
    #[arg(long, default_value_t = sluice_live::Limits::default().views_max)]
    live_views_max: usize,
    /// Rows one live view may hold (its whole result, before LIMIT).
    #[arg(long, default_value_t = sluice_live::Limits::default().view_rows_max)]
    live_view_rows_max: usize,
    /// Rows a top-k live view (one table, ORDER BY … LIMIT n) keeps beyond its window; it
    /// reads the table again when rows leaving the window use them up.
    #[arg(long, default_value_t = sluice_live::Limits::default().top_k_spare_rows)]
    live_top_k_spare_rows: usize,
    /// Events queued for one live subscriber before its backlog becomes a reset snapshot.
    #[arg(long, default_value_t = sluice_live::Limits::default().subscriber_queue_max)]
    live_queue_events: usize,
    /// Seconds a live view with no subscribers stays warm.
    #[arg(long, default_value_t = 60)]
    live_ttl_secs: u64,
    /// Interval of heartbeat comments on idle SSE streams, in milliseconds.
    #[arg(long, default_value_t = 15_000)]
    live_heartbeat_ms: u64,
    /// After SIGINT/SIGTERM, how long open connections get to finish (live streams and
    /// WebSockets are told to close at once) before they are cut and the final snapshot is
    /// written, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    shutdown_grace_ms: u64,
    /// Log bytes handed to the log thread and not yet written before the writer waits
    /// (back-pressure when commits arrive faster than the disk takes them).
    #[arg(long, default_value_t = 64 << 20)]
    log_pending_bytes: usize,
    /// Nice value the writer thread, through which every commit passes, takes while it has
    /// a backlog (a round starting with 256 or more requests queued; back to the process's
    /// own below 32): it keeps the writer on a core when it is the bottleneck on saturated
    /// CPUs, and leaves short queues to batch (-20 to 0; the process's own: never). Below
    /// 0 needs root, CAP_SYS_NICE or RLIMIT_NICE; without, the writer keeps the process's
    /// priority (logged once; `sluice_writer_nice` on /metrics says what it runs at).
    #[arg(long, default_value_t = sluice_server::config::WRITER_NICE_DEFAULT, allow_hyphen_values = true)]
    writer_nice: i32,
    /// Log syncs (`fdatasync`) that may run at once, each on a thread of its own: while one
    /// is in the device the next round is written and its sync started (1 to 8). 0: the log
    /// thread syncs each round itself (no overlap, less CPU per sync: better where fsync is
    /// fast and the CPUs are busy).
    #[arg(long, default_value_t = sluice_log::writer::SYNC_THREADS_DEFAULT)]
    log_sync_threads: usize,
    /// While recent log syncs (a moving average) took less than this many µs, the log
    /// thread syncs each round itself even with sync threads: on a fast disk overlapping
    /// costs CPU (more, smaller syncs) to save a short wait. Slower syncs are handed off and
    /// overlap. 0: always hand off (at most 10 000 000).
    #[arg(long, default_value_t = sluice_log::writer::SYNC_INLINE_BELOW_DEFAULT.as_micros() as u64)]
    log_sync_inline_below_us: u64,
    /// Write every log segment as a plain growing file. By default the next segment is
    /// prepared in the background (zeros written and synced, `next-segment.prepared` in the
    /// data directory) and written over: a sync of a file that does not grow writes no
    /// file-system metadata, a third faster and cheaper on ext4.
    #[arg(long)]
    log_unprepared_segments: bool,
    /// Write the prepared log segments with direct I/O (`O_DIRECT`), around the page cache
    /// (Linux). For VMs whose host backs guest memory on first use, where filling fresh
    /// page-cache pages is a large share of ingest's CPU; the price is that a `disk` commit
    /// waits for the device's write, and recovery after a crash reads the log from the
    /// device. Needs prepared segments (not with --log-unprepared-segments).
    #[arg(long)]
    log_direct_io: bool,
    /// Commits handed to the live-query thread and not yet applied before the writer waits.
    #[arg(long, default_value_t = sluice_live::Limits::default().handoff_commits_max)]
    live_handoff_commits: usize,
    /// Scheduler slice (µs) the threads a write's acknowledgement waits on ask for — the
    /// runtime's workers and the writer and log threads — so they preempt bulk work (a
    /// large snapshot's build and encoding, other processes) when they wake (Linux 6.12+;
    /// a hint that needs no privilege). 0: the kernel's default slice.
    #[arg(long, default_value_t = 100)]
    ack_slice_us: u64,
    /// Requests in flight on one WebSocket connection before the server stops reading it.
    #[arg(long, default_value_t = 1024)]
    ws_inflight_requests: usize,
    /// Messages (replies, live events) queued for one WebSocket connection's socket.
    #[arg(long, default_value_t = 64)]
    ws_outbound_messages: usize,
    /// A write to a client that takes no byte for this many milliseconds closes the
    /// connection (HTTP, SSE and WebSocket alike): a client that stopped reading lets go of
    /// its connection and its slot under --max-connections-per-subject. A slow client that
    /// reads is never cut (100 to 3 600 000).
    #[arg(long, default_value_t = sluice_server::stall::WRITE_TIMEOUT_DEFAULT.as_millis() as u64)]
    write_timeout_ms: u64,
    /// An HTTP connection must send a whole request head within this many milliseconds of
    /// connecting and of each response; otherwise it is closed (idle keep-alive connections,
    /// clients that send nothing or trickle their headers). An open SSE stream or WebSocket
    /// is not idle (100 to 3 600 000).
    #[arg(long, default_value_t = sluice_server::serve::HTTP_IDLE_TIMEOUT_DEFAULT.as_millis() as u64)]
    http_idle_timeout_ms: u64,
    /// TCP keepalive on every client connection: after this many seconds of silence the
    /// kernel probes the peer (every third of it, 9 times), so a client that vanished without
    /// closing (a phone that lost its network, a crashed host) is noticed within about
    /// four times this and its connection and its slot under --max-connections-per-subject
    /// are let go, even on an idle WebSocket. 0: off (at most 7200).
    #[arg(long, default_value_t = TCP_KEEPALIVE_SECS_DEFAULT)]
    tcp_keepalive_secs: u64,
    /// Keep transparent huge pages (2 MiB) once serving. By default recovery runs with them
    /// (rebuilding the tables grows the heap in bulk: one fault per 2 MiB, not 512) and the
    /// server turns them off as it starts serving: the first touch of each huge page stalls
    /// the thread touching it while the kernel clears 2 MiB — a writer round, a view's build
    /// (4.6 ms p99 per fresh page on the VM measured). Where that is cheap, huge pages save
    /// TLB misses on large tables.
    #[arg(long)]
    transparent_huge_pages: bool,
    /// Count live heap bytes and blocks for `/metrics` (`sluice_alloc_bytes`,
    /// `sluice_alloc_blocks`); costs two shared atomic adds per allocation, so off by default.
    #[arg(long)]
    count_allocations: bool,
    /// Live subscriptions and topic watches one WebSocket connection may hold.
    #[arg(long, default_value_t = 1024)]
    live_subscriptions_per_connection: usize,
    /// Most topics in the database.
    #[arg(long, default_value_t = sluice_engine::Limits::default().topics_max)]
    max_topics: usize,
    /// Largest topic record: its data as compact JSON plus its tags, in bytes.
    #[arg(long, default_value_t = sluice_engine::Limits::default().record_bytes_max)]
    max_record_bytes: usize,
    /// Most records in one append.
    #[arg(long, default_value_t = 10_000)]
    max_append_records: usize,
    /// Records a topic keeps when created without `retain_records`.
    #[arg(long, default_value_t = sluice_engine::Limits::default().topic_retain_records)]
    topic_retain_records: u64,
    /// Bytes of records a topic keeps when created without `retain_bytes`, and the most any
    /// topic may keep.
    #[arg(long, default_value_t = sluice_engine::Limits::default().topic_retain_bytes)]
    topic_retain_bytes: u64,
    /// The admin token (bypasses every rule). Without it, one is generated on first start
    /// and kept in `<data>/admin-token` (mode 0600).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// HS256 secret that client tokens (JWTs) are signed with.
    #[arg(long, env = "SLUICE_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// PEM public key that client tokens are signed for; the algorithm follows the key
    /// (RSA: RS256, EC P-256: ES256, Ed25519: EdDSA).
    #[arg(long, value_name = "FILE", conflicts_with = "jwt_secret")]
    jwt_public_key: Option<PathBuf>,
    /// When set, client tokens must carry this `aud`.
    #[arg(long)]
    jwt_audience: Option<String>,
    /// When set, client tokens must carry this `iss`.
    #[arg(long)]
    jwt_issuer: Option<String>,
    /// PEM certificate chain: serve HTTPS and `wss://` on the listen address (with
    /// --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Open WebSockets and SSE streams one client token subject (`sub`) may hold; the
    /// admin token is not limited.
    #[arg(long, default_value_t = sluice_server::AuthConfig::default().max_connections_per_subject)]
    max_connections_per_subject: usize,
    /// Records queued for one topic watcher; a watcher that falls this far behind is cut
    /// off with `lagging` (and the offset to resume from).
    #[arg(long, default_value_t = 4096)]
    watch_queue_records: usize,
    /// Serve the files of DIR without a token on every GET/HEAD path outside /v1/,
    /// /console/, /metrics and /health (`/` serves DIR/index.html; a path with no extension
    /// that names no file serves it too, for single-page apps).
    #[arg(long, env = "SLUICE_PUBLIC", value_name = "DIR")]
    public: Option<PathBuf>,
    /// Let pages from ORIGIN call the API from the browser (CORS), e.g.
    /// `--cors-origin http://localhost:5173` for a dev server; repeat it or separate origins
    /// with commas; `*` allows any origin. Default: same origin only.
    #[arg(
        long,
        env = "SLUICE_CORS_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    cors_origin: Vec<String>,
    /// Join a cluster: NATS URLs, comma-separated (`nats://10.0.0.1:4222,nats://…`). The
    /// changelog is replicated through JetStream; see docs/operations.md.
    #[arg(long, value_name = "NATS_URLS")]
    cluster: Option<String>,
    /// With --cluster: follow the leader (serve reads, queries, live views and watches;
    /// refuse writes with `not_leader` naming the leader) instead of leading.
    #[arg(long, requires = "cluster")]
    follower: bool,
    /// With --follower: never take the leader lease when it lapses (a read replica).
    #[arg(long, requires = "follower")]
    no_takeover: bool,
    /// The database's name in the cluster (its JetStream stream is `sluice-<name>`).
    #[arg(long, default_value = "default")]
    cluster_database: String,
    /// Copies JetStream keeps of each commit (3 survives losing one NATS node).
    #[arg(long, default_value_t = 3)]
    cluster_replicas: usize,
    /// Commits the cluster's stream keeps (a follower further behind needs a snapshot).
    #[arg(long, default_value_t = 1_000_000)]
    cluster_retain_commits: i64,
    /// Bytes the cluster's stream keeps.
    #[arg(long, default_value_t = 1 << 30)]
    cluster_retain_bytes: i64,
    /// The leader stores a snapshot in the cluster's object store every N commits (and
    /// when it starts leading), so followers behind the retained stream can start from
    /// one; 0: never. Default: a quarter of --cluster-retain-commits.
    #[arg(long, value_name = "N")]
    cluster_snapshot_commits: Option<u64>,
    /// With --follower: if this node's data does not continue the cluster's stream (a
    /// deposed leader's unreplicated commits), move its log and snapshots aside into
    /// `displaced-…/` in the data directory and start from the cluster's snapshot, instead
    /// of refusing to start.
    #[arg(long, requires = "follower")]
    discard_diverged: bool,
    /// The leader lease's time to live in ms: a leader silent this long is replaced.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// The address other nodes name for this one (default: http(s)://<listen address>).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
}

/// Most accepted `--log-sync-threads`: more syncs at once than this only queue in the device.
const LOG_SYNC_THREADS_MAX: usize = 8;

/// Largest accepted `--log-sync-inline-below-us` (10 s): any sync is "fast" below it.
const LOG_SYNC_INLINE_BELOW_US_MAX: u64 = 10_000_000;

/// Largest accepted `--max-body-bytes`: keeps every commit well inside one log frame.
const BODY_BYTES_MAX_CEILING: usize = 32 << 20;

/// Largest commit in a cluster: one NATS message of at most nats-server's default
/// `max_payload` (1 MiB), less room for the frame header and the message's headers. A
/// larger commit could not be replicated, and its leader would lose its lease over it.
const CLUSTER_COMMIT_BYTES_MAX: usize = (1 << 20) - (8 << 10);

impl ServeArgs {
    fn config(&self) -> anyhow::Result<Config> {
        anyhow::ensure!(
            self.max_body_bytes <= BODY_BYTES_MAX_CEILING,
            "--max-body-bytes {} is above the ceiling of {BODY_BYTES_MAX_CEILING} bytes (a commit must fit in one log frame)",
            self.max_body_bytes
        );
        let ceiling = sluice_engine::db::COMMIT_BYTES_MAX_CEILING;
        let max_commit_bytes = match (self.max_commit_bytes, &self.cluster) {
            (Some(n), Some(_)) if n > CLUSTER_COMMIT_BYTES_MAX => anyhow::bail!(
                "--max-commit-bytes {n} is above {CLUSTER_COMMIT_BYTES_MAX} bytes, the most a commit may be in a cluster: each commit is one NATS message, and nats-server's max_payload is 1 MiB by default"
            ),
            (Some(n), _) => n,
            (None, Some(_)) => CLUSTER_COMMIT_BYTES_MAX,
            (None, None) => sluice_engine::Limits::default().commit_bytes_max,
        };
        anyhow::ensure!(
            max_commit_bytes <= ceiling,
            "--max-commit-bytes {max_commit_bytes} is above the ceiling of {ceiling} bytes (a commit must fit in one log frame)"
        );
        anyhow::ensure!(
            self.max_ops > 0 && self.max_page_rows > 0 && self.retain_commits > 0,
            "--max-ops, --max-page-rows and --retain-commits must be at least 1"
        );
        let mut config = Config::new(&self.data);
        config.durability = self.durability;
        config.follower = self.follower;
        anyhow::ensure!(
            self.cluster.is_some() || self.durability != Durability::Replicated,
            "--durability replicated needs --cluster"
        );
        anyhow::ensure!(
            self.lease_ms >= 300 && self.cluster_replicas >= 1,
            "--lease-ms must be at least 300 and --cluster-replicas at least 1"
        );
        config.body_bytes_max = self.max_body_bytes;
        config.ops_per_mutate_max = self.max_ops;
        config.limits.row_bytes_max = self.max_row_bytes;
        config.limits.columns_per_table_max = self.max_columns;
        config.limits.commit_bytes_max = max_commit_bytes;
        config.page_rows_max = self.max_page_rows;
        config.retention.commits_max = self.retain_commits;
        config.retention.bytes_max = self.retain_bytes;
        config.snapshot_log_bytes = self.snapshot_log_bytes;
        config.snapshot_log_percent = self.snapshot_log_percent;
        config.segment_bytes_max = self.segment_bytes;
        config.function_limits.time_max = std::time::Duration::from_millis(self.function_time_ms);
        config.function_limits.memory_bytes_max = self.function_memory_bytes;
        anyhow::ensure!(
            self.live_queue_events >= 1 && self.live_heartbeat_ms >= 1,
            "--live-queue-events and --live-heartbeat-ms must be at least 1"
        );
        config.live.views_max = self.live_views_max;
        config.live.view_rows_max = self.live_view_rows_max;
        config.live.subscriber_queue_max = self.live_queue_events;
        config.live.top_k_spare_rows = self.live_top_k_spare_rows;
        config.live.idle_ttl = std::time::Duration::from_secs(self.live_ttl_secs);
        config.live_heartbeat = std::time::Duration::from_millis(self.live_heartbeat_ms);
        config.live_subscriptions_per_connection_max = self.live_subscriptions_per_connection;
        anyhow::ensure!(
            self.max_record_bytes >= 1
                && self.max_append_records >= 1
                && self.topic_retain_records >= 1
                && self.topic_retain_bytes >= 1
                && self.watch_queue_records >= 1,
            "--max-record-bytes, --max-append-records, --topic-retain-records, --topic-retain-bytes and --watch-queue-records must be at least 1"
        );
        config.limits.topics_max = self.max_topics;
        config.limits.record_bytes_max = self.max_record_bytes;
        config.limits.topic_retain_records = self.topic_retain_records;
        config.limits.topic_retain_bytes = self.topic_retain_bytes;
        config.append_records_max = self.max_append_records;
        config.watch_queue_records = self.watch_queue_records;
        config.auth.admin_token = self.admin_token.clone();
        config.auth.jwt_secret = self.jwt_secret.clone();
        if let Some(path) = &self.jwt_public_key {
            let pem = std::fs::read(path).with_context(|| {
                format!("cannot read the --jwt-public-key file {}", path.display())
            })?;
            config.auth.jwt_public_key_pem = Some(pem);
        }
        config.auth.jwt_audience = self.jwt_audience.clone();
        config.auth.jwt_issuer = self.jwt_issuer.clone();
        config.auth.max_connections_per_subject = self.max_connections_per_subject;
        sluice_server::auth::check_jwt_config(&config.auth).map_err(|e| {
            match &self.jwt_public_key {
                Some(path) => anyhow::anyhow!("{e} (file {})", path.display()),
                None => anyhow::anyhow!("{e}"),
            }
        })?;
        anyhow::ensure!(
            self.log_pending_bytes >= 1 << 16
                && self.live_handoff_commits >= 1
                && self.ws_inflight_requests >= 1
                && self.ws_outbound_messages >= 1,
            "--log-pending-bytes must be at least 65536, and --live-handoff-commits, --ws-inflight-requests and --ws-outbound-messages at least 1"
        );
        config.log_pending_bytes_max = self.log_pending_bytes;
        anyhow::ensure!(
            (0..=LOG_SYNC_THREADS_MAX).contains(&self.log_sync_threads),
            "--log-sync-threads {} is outside 0..={LOG_SYNC_THREADS_MAX}",
            self.log_sync_threads
        );
        config.log_sync_threads = self.log_sync_threads;
        anyhow::ensure!(
            (-20..=0).contains(&self.writer_nice),
            "--writer-nice {} is outside -20..=0 (a priority for the writer while it has a backlog; 0: never raised)",
            self.writer_nice
        );
        config.writer_nice = self.writer_nice;
        anyhow::ensure!(
            self.log_sync_inline_below_us <= LOG_SYNC_INLINE_BELOW_US_MAX,
            "--log-sync-inline-below-us {} is above {LOG_SYNC_INLINE_BELOW_US_MAX}",
            self.log_sync_inline_below_us
        );
        config.log_sync_inline_below =
            std::time::Duration::from_micros(self.log_sync_inline_below_us);
        config.log_prepare_segments = !self.log_unprepared_segments;
        if self.log_direct_io {
            anyhow::ensure!(
                !self.log_unprepared_segments,
                "--log-direct-io writes prepared segments, which --log-unprepared-segments turns off: give one of them"
            );
            config.log_files = direct_log_files(&self.data)?;
        }
        config.live.handoff_commits_max = self.live_handoff_commits;
        config.ws_inflight_max = self.ws_inflight_requests;
        config.ws_outbound_max = self.ws_outbound_messages;
        config.write_timeout = millis_within(
            "--write-timeout-ms",
            self.write_timeout_ms,
            sluice_server::stall::WRITE_TIMEOUT_MIN..=sluice_server::stall::WRITE_TIMEOUT_MAX,
        )?;
        config.http_idle_timeout = millis_within(
            "--http-idle-timeout-ms",
            self.http_idle_timeout_ms,
            sluice_server::serve::HTTP_IDLE_TIMEOUT_MIN
                ..=sluice_server::serve::HTTP_IDLE_TIMEOUT_MAX,
        )?;
        if let Some(path) = &self.functions {
            let source = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the functions module {}", path.display()))?;
            config.functions_source = Some(source);
        }
        if let Some(dir) = &self.public {
            config.public_dir = Some(sluice_server::static_files::check_public_dir(dir)?);
        }
        let mut origins = Vec::with_capacity(self.cors_origin.len());
        for origin in &self.cors_origin {
            // A browser sends `Origin: scheme://host[:port]`, never a path or a slash.
            let o = origin.trim().trim_end_matches('/');
            let host = o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"));
            let valid =
                o == "*" || host.is_some_and(|h| !h.is_empty() && !h.contains(['/', ' ', '*']));
            if !valid {
                anyhow::bail!(
                    "--cors-origin {origin:?}: expected an origin such as http://localhost:5173 (scheme and host, no path) or *"
                );
            }
            origins.push(o.to_string());
        }
        config.cors_origins = origins;
        Ok(config)
    }
}

/// Default `--tcp-keepalive-secs` (Go's HTTP servers probe after 15 s, Linux's own default
/// is two hours, far too long to free a vanished client's slot).
const TCP_KEEPALIVE_SECS_DEFAULT: u64 = 30;
/// Most `--tcp-keepalive-secs` (Linux's own default).
const TCP_KEEPALIVE_SECS_MAX: u64 = 7200;

/// Sets up an accepted client socket: no Nagle delay (replies are small and flushed
/// explicitly; Nagle would hold them back up to a delayed-ACK timeout), and TCP keepalive
/// after `keepalive` of silence, probing every third of it (`--tcp-keepalive-secs`).
pub(crate) fn tune_client_socket(
    tcp: &tokio::net::TcpStream,
    keepalive: Option<std::time::Duration>,
) {
    let _ = tcp.set_nodelay(true);
    if let Some(idle) = keepalive {
        let probes = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval((idle / 3).max(std::time::Duration::from_secs(1)));
        if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&probes) {
            tracing::debug!("cannot set TCP keepalive on a client socket: {e}");
        }
    }
}

/// Open files the server asks for: Linux's default ceiling (`fs.nr_open`).
const OPEN_FILES_WANT: u64 = 1 << 20;
/// Below this many open files the server says how few clients it can hold.
const OPEN_FILES_WARN_BELOW: u64 = 4096;

/// The log file factory of `--log-direct-io`, once the data directory's file system was
/// seen to take direct writes (else a clear error, before anything is served).
#[cfg(target_os = "linux")]
fn direct_log_files(data: &std::path::Path) -> anyhow::Result<sluice_server::config::LogFiles> {
    sluice_log::direct::DirectFiles::check_dir(data)
        .with_context(|| format!("--log-direct-io: a direct write in {}", data.display()))?;
    Ok(sluice_server::config::LogFiles(std::sync::Arc::new(
        sluice_log::direct::DirectFiles,
    )))
}

#[cfg(not(target_os = "linux"))]
fn direct_log_files(_data: &std::path::Path) -> anyhow::Result<sluice_server::config::LogFiles> {
    anyhow::bail!("--log-direct-io is only available on Linux")
}

/// Every connection is a file descriptor: the soft limit a service manager starts us with
/// (1024 under systemd) is raised to the hard limit (see `sluice_sched::raise_open_files_limit`).
fn raise_open_files_limit() {
    match sluice_sched::raise_open_files_limit(OPEN_FILES_WANT) {
        Ok((before, after)) => {
            if after > before {
                tracing::info!(from = before, to = after, "raised the open-files limit");
            }
            if after < OPEN_FILES_WARN_BELOW {
                tracing::warn!(
                    limit = after,
                    "the open-files limit (ulimit -n, its hard limit included) holds fewer than {OPEN_FILES_WARN_BELOW} connections; raise it (systemd: LimitNOFILE=) for more clients"
                );
            }
        }
        Err(e) => tracing::warn!("cannot raise the open-files limit: {e}"),
    }
}

/// A flag given in milliseconds as a duration, refused by name outside `range`.
fn millis_within(
    flag: &str,
    ms: u64,
    range: std::ops::RangeInclusive<std::time::Duration>,
) -> anyhow::Result<std::time::Duration> {
    let d = std::time::Duration::from_millis(ms);
    anyhow::ensure!(
        range.contains(&d),
        "{flag} {ms} is outside {}..={}",
        range.start().as_millis(),
        range.end().as_millis()
    );
    Ok(d)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        // Recovery runs with huge pages (see `sched::set_transparent_huge_pages`), whatever
        // the parent process chose (the setting is inherited); `serve` decides once it has
        // recovered. `bench` puts itself on 4 KiB pages, as `serve` serves
        // (`sluice_bench::server::pages_as_serve`); other commands keep what the system
        // gives them.
        set_transparent_huge_pages(true);
    }
    if matches!(cli.command, Command::Bench(_)) {
        // The bench process is a server's client (whose stalls count against the server: a
        // purge on a subscriber's thread held diffs for 30 ms in `bench live`) or embeds a
        // core in-process as `serve` runs it: freed memory goes back on a thread of its own.
        alloc::purge_in_background();
    }
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Check { data } => check(&data),
        Command::Bench(args) => sluice_bench::run(args),
        Command::Token(args) => token(args),
        Command::Sql(args) => Ok(sluice_shell::run(args)),
        Command::Conformance(args) => conformance(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn set_transparent_huge_pages(enabled: bool) {
    if let Err(e) = sched::set_transparent_huge_pages(enabled) {
        tracing::debug!("transparent huge pages stay as the kernel has them: {e}");
    }
}

fn conformance(args: ConformanceArgs) -> anyhow::Result<ExitCode> {
    if args.list {
        for name in sluice_conformance::check_names() {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let token = args
        .token
        .context("--token (the admin token) is required")?;
    let mut opts = sluice_conformance::Options::new(&args.url, &token);
    opts.client_token = args.client_token;
    opts.jwt_secret = args.jwt_secret;
    opts.only = args.only;
    opts.exclude = args.exclude;
    opts.server.live_heartbeat_ms = args.live_heartbeat_ms;
    opts.server.watch_queue_records = args.watch_queue_records;
    opts.server.live_queue_events = args.live_queue_events;
    opts.server.max_body_bytes = args.max_body_bytes;
    opts.server.live_subscriptions_per_connection = args.live_subscriptions_per_connection;
    opts.check_timeout = std::time::Duration::from_secs(args.check_timeout_secs.max(1));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(sluice_conformance::run(&opts, |r| {
        println!("{}", r.line());
    }));
    println!("{}", report.summary());
    Ok(if report.failed() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    anyhow::ensure!(
        args.tcp_keepalive_secs <= TCP_KEEPALIVE_SECS_MAX,
        "--tcp-keepalive-secs {} is above {TCP_KEEPALIVE_SECS_MAX}",
        args.tcp_keepalive_secs
    );
    let keepalive = (args.tcp_keepalive_secs > 0)
        .then(|| std::time::Duration::from_secs(args.tcp_keepalive_secs));
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::load(cert, key)?),
        (None, None) => None,
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    };
    if args.count_allocations {
        alloc::enable_counting();
        sluice_server::add_metrics_hook(alloc::render_metrics);
    }
    alloc::purge_in_background();
    raise_open_files_limit();
    let slice =
        (args.ack_slice_us > 0).then(|| std::time::Duration::from_micros(args.ack_slice_us));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let data = config.data_dir.clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let node_options = args.cluster.as_ref().map(|urls| {
            let mut cluster = sluice_cluster::ClusterOptions::new(urls.clone());
            cluster.database = args.cluster_database.clone();
            cluster.replicas = args.cluster_replicas;
            cluster.retain_commits = args.cluster_retain_commits;
            cluster.retain_bytes = args.cluster_retain_bytes;
            cluster.lease_ttl = std::time::Duration::from_millis(args.lease_ms);
            cluster.snapshot_commits = args.cluster_snapshot_commits;
            cluster.discard_diverged = args.discard_diverged;
            sluice_cluster::NodeOptions {
                cluster,
                follower: args.follower,
                address: args
                    .advertise
                    .clone()
                    .unwrap_or_else(|| base_url(scheme, args.listen)),
                takeover: !args.no_takeover,
            }
        });
        if let Some(opts) = &node_options {
            // A follower whose data ends before the stream's retained commits starts from
            // the cluster's newest stored snapshot (fetched into the data directory).
            let start = sluice_cluster::node::prepare(&data, opts)
                .await
                .context("cannot join the cluster")?;
            tracing::info!(?start, "where this node starts");
        }
        let core = tokio::task::spawn_blocking(move || Core::open(config))
            .await?
            .with_context(|| format!("cannot open data directory {}", data.display()))?;
        if !args.transparent_huge_pages {
            // Recovered (with huge pages: bulk growth); serving on 4 KiB pages from here.
            set_transparent_huge_pages(false);
        }
        if let Some(slice) = slice {
            // By name, once the threads exist, rather than as each starts: a thread inherits
            // its creator's slice, and the live thread (bulk work: building a large view)
            // is started from a runtime thread by `Core::open`. The runtime's workers all
            // start with it; the writer, log and log-sync threads are named by
            // `sluice_log::critical::spawn` (the log thread starts its sync threads as it
            // starts, inside `Core::open`).
            let names = ["tokio-rt-worker", "sluice-writer", "sluice-log", "sluice-log-sync"];
            if let Err(e) = sched::request_slice_named(&names, slice) {
                tracing::warn!(
                    "--ack-slice-us: the scheduler refused a short slice ({e}); running with its default"
                );
            }
        }
        let r = core.recovery();
        tracing::info!(
            data = %data.display(),
            seq = r.seq,
            snapshot_seq = ?r.snapshot_seq,
            whole_log = r.whole_log,
            replayed = r.replayed,
            recovery_ms = r.duration.as_secs_f64() * 1e3,
            "recovered"
        );
        if let Some(torn) = &r.torn_tail {
            tracing::warn!("truncated a torn log tail: {torn}");
        }
        // Joined before listening: a node that cannot join never answers requests.
        let _node = match (&args.cluster, node_options) {
            (Some(urls), Some(opts)) => {
                let address = opts.address.clone();
                let node = sluice_cluster::node::start(core.clone(), opts)
                    .await
                    .context("cannot join the cluster")?;
                let role = if args.follower { "follower" } else { "leader" };
                tracing::info!(%address, urls = %urls, database = %args.cluster_database, "joined the cluster as {role}");
                // The node's task ends only when it cannot go on (a follower that cannot
                // follow, a leader that lost its lease): say why; reads go on being served.
                Some(tokio::spawn(async move {
                    let mut node = node;
                    if let Err(e) = node.finished().await {
                        tracing::error!("cluster: {e}");
                    }
                }))
            }
            _ => None,
        };
        let signalled = shutdown_signal().context("cannot install the SIGINT/SIGTERM handlers")?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        // Accepted connections queue from here on: what startup deferred may begin.
        core.serving();
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(%addr, data = %data.display(), durability = %core.config().durability, "sluice listening on {scheme}://{addr}");
        if let Some(notice) = core.tokens().admin_token_notice(&base_url(scheme, addr)) {
            tracing::info!("{notice}");
        }
        let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
        let closing = core.clone();
        let shutdown = async move {
            signalled.await;
            tracing::info!("shutting down: ending live streams and WebSockets");
            closing.begin_shutdown();
            let _ = signalled_tx.send(());
        };
        let router = sluice_server::api::router(core.clone());
        let idle = core.config().http_idle_timeout;
        let server: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            match tls {
                None => {
                    let listener = axum::serve::ListenerExt::tap_io(listener, move |tcp| {
                        tune_client_socket(tcp, keepalive)
                    });
                    Box::pin(sluice_server::serve::serve(
                        core.stall_guard(listener),
                        router,
                        idle,
                        shutdown,
                    ))
                }
                Some(config) => Box::pin(sluice_server::serve::serve(
                    core.stall_guard(tls::TlsListener::spawn(listener, config, keepalive)?),
                    router,
                    idle,
                    shutdown,
                )),
            };
        let grace = std::time::Duration::from_millis(args.shutdown_grace_ms);
        tokio::select! {
            () = server => {}
            () = async {
                match signalled_rx.await {
                    Ok(()) => tokio::time::sleep(grace).await,
                    Err(_) => std::future::pending().await,
                }
            } => {
                tracing::warn!(grace_ms = args.shutdown_grace_ms, "connections still open after the grace period (--shutdown-grace-ms); closing them");
            }
        }
        tracing::info!("shutting down: writing a final snapshot");
        core.shutdown().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!("stopped cleanly");
        Ok(ExitCode::SUCCESS)
    })
}

/// `scheme://host:port` a client on this machine can use: an unspecified listen address
/// (`0.0.0.0`, `::`) is reached through loopback.
fn base_url(scheme: &str, addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// SIGINT or SIGTERM. The handlers are installed when this is called (not when the
/// future is first polled), so a signal that arrives as soon as the port is open is not
/// taken by the default action (which would kill the process without a final snapshot).
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    })
}

fn check(data: &std::path::Path) -> anyhow::Result<ExitCode> {
    match sluice_engine::recovery::check(data) {
        Ok(report) => {
            println!(
                "ok: {} snapshot(s), {} segment(s), {} frame(s), state at seq {}",
                report.snapshots, report.segments, report.frames, report.seq
            );
            if let Some(torn) = report.torn_tail {
                println!("note: {torn} (recovery truncates it)");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("damaged: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
