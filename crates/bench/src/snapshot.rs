//! `sluice bench snapshot`: how much a snapshot slows the writes that go on while it is
//! written, and what the copy-on-write row map costs the write path.
//!
//! Three parts:
//! - **ack latency around a snapshot** (the real binary): load `--rows` `events` rows, then
//!   one closed-loop writer (one HTTP client, one single-row upsert of a random existing row
//!   per request, the next sent when the previous is acknowledged) runs for `--seconds`
//!   before, then while `POST /v1/admin/snapshot` is in flight, then `--seconds` after; the
//!   acknowledgement latency (max, p99, p99.9) of each phase and the snapshot's duration are
//!   reported, per durability class (`disk`, `fsync`). Then the server is killed with
//!   SIGKILL and restarted: it must come back with the same rows (count and checksum),
//!   replaying only the commits after its last snapshot — the snapshot file recovers the
//!   state it froze.
//! - **snapshot pacing** (the real binary, `crate::snapshot_pacing`): steady updates to a
//!   state far larger than `--pacing-interval-bytes`, with `--snapshot-log-percent` 0 and
//!   100: snapshots taken, and snapshot bytes written per log byte;
//! - **row map micro-benchmark** (in process): CPU time per operation of the engine's
//!   `CowMap` next to `BTreeMap` — ascending inserts, random inserts, gets and removes at
//!   each of `--map-sizes` — and the time to clone (freeze) a full map.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use sluice_engine::cow::CowMap;
use sluice_engine::table::RowEntry;
use sluice_engine::Key;
use sluice_log::Durability;

use crate::hist::{fmt_le, fmt_si, fmt_us, Latency, LatencySummary};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::server::{sluice_bin, Metrics, SluiceServer};
use crate::svg::{BarChart, BarSeries};
use crate::sys::TempDir;
use crate::workload;
use crate::CommonArgs;

/// Goal: the slowest acknowledgement while a 1 M-row snapshot is written (issue 12).
const TARGET_ACK_MAX_DURING_US: u64 = 5_000;
/// Rows per mutate while loading.
const LOAD_BATCH: u64 = 500;
/// Concurrent clients while loading.
const LOAD_CLIENTS: usize = 4;
/// `--snapshot-log-bytes` that keeps the server from snapshotting on its own.
const NO_BACKGROUND_SNAPSHOTS: u64 = 1 << 60;
/// Most rows one run may load.
const ROWS_MAX: u64 = 50_000_000;

#[derive(clap::Args, Debug, Clone)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows in the table when the snapshot is taken.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Seconds of writes measured before and after the snapshot.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Durability classes of the writer's commits; one before/during/after run each.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["disk".to_string(), "fsync".to_string()])]
    pub classes: Vec<String>,
    /// Map sizes of the micro-benchmark (0 or an empty list skips it).
    #[arg(long, value_delimiter = ',', default_values_t = vec![100_000u64, 1_000_000, 10_000_000])]
    pub map_sizes: Vec<u64>,
    /// Skip the server part (only the map micro-benchmark).
    #[arg(long)]
    pub map_only: bool,
    /// Seconds of updates measured per snapshot-pacing case (0 skips the pacing part).
    #[arg(long, default_value_t = 10.0)]
    pub pacing_seconds: f64,
    /// `--snapshot-log-bytes` of the pacing cases: far below the state's size, as for a
    /// large table at the default interval.
    #[arg(long, default_value_t = 16 << 20)]
    pub pacing_interval_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
struct Params {
    rows: u64,
    seconds: f64,
    classes: Vec<String>,
    map_sizes: Vec<u64>,
    map_only: bool,
    pacing_seconds: f64,
    pacing_interval_bytes: u64,
    quick: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
struct Phase {
    ack: LatencySummary,
    p999_us: u64,
    seconds: f64,
    /// Where the phase's slowest acks could have spent their time: the slowest bucket the
    /// server's own histograms filled during the phase (upper bounds, µs).
    server: Breakdown,
}

/// The slowest bucket (its upper bound in µs; 0 = nothing recorded) each server-side
/// histogram filled within one phase, from `/metrics` read at the phase's ends.
#[derive(Clone, Debug, Default, Serialize)]
struct Breakdown {
    /// A mutate from queued for the writer to settled (HTTP, JSON and the socket excluded).
    mutate_le_us: u64,
    /// One writer round (lock, apply, unlock, hand over to the log).
    writer_round_le_us: u64,
    /// One write to the log segment (segment roll included).
    log_append_le_us: u64,
    /// One fdatasync of the log.
    log_sync_le_us: u64,
    /// One log thread round (take, write, sync, complete the waiters).
    log_round_le_us: u64,
    /// Log segments started during the phase.
    segment_rolls: u64,
}

/// Server-side histograms read for [`Breakdown`].
const BREAKDOWN_HISTOGRAMS: [&str; 5] = [
    "sluice_mutate_seconds",
    "sluice_writer_round_seconds",
    "sluice_log_append_seconds",
    "sluice_log_sync_seconds",
    "sluice_log_round_seconds",
];

/// The upper bound (µs) of the slowest bucket `name` filled between `a` and `b`.
fn slowest_bucket(a: &Metrics, b: &Metrics, name: &str) -> u64 {
    let (a, b) = (a.histogram(name), b.histogram(name));
    let last = b.len() - 1;
    let total = b[last].saturating_sub(a[last]);
    if total == 0 {
        return 0;
    }
    (0..last)
        .find(|&i| b[i].saturating_sub(a[i]) >= total)
        .map_or(u64::MAX, |i| 1u64 << i)
}

fn breakdown(a: &Metrics, b: &Metrics) -> Breakdown {
    let [mutate, round, append, sync, log_round] =
        BREAKDOWN_HISTOGRAMS.map(|name| slowest_bucket(a, b, name));
    Breakdown {
        mutate_le_us: mutate,
        writer_round_le_us: round,
        log_append_le_us: append,
        log_sync_le_us: sync,
        log_round_le_us: log_round,
        segment_rolls: (b.get("sluice_segments_created_total")
            - a.get("sluice_segments_created_total")) as u64,
    }
}

/// One of a case's slowest acknowledgements.
#[derive(Clone, Debug, Serialize)]
struct SlowAck {
    /// When it was sent, seconds since the case started.
    at_s: f64,
    took_us: u64,
    phase: &'static str,
}

/// Slowest acks kept per case.
const SLOWEST_KEPT: usize = 8;

#[derive(Clone, Debug, Serialize)]
struct AckCase {
    class: String,
    rows: u64,
    before: Phase,
    during: Phase,
    after: Phase,
    snapshot_seq: u64,
    snapshot_s: f64,
    snapshot_bytes: u64,
    /// The case's slowest acks, slowest first.
    slowest: Vec<SlowAck>,
    error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
struct Recovered {
    rows: u64,
    checksum: String,
    replayed_commits: u64,
    commits_after_snapshot: u64,
    ok: bool,
}

#[derive(Clone, Debug, Serialize)]
struct MapCase {
    map: &'static str,
    size: u64,
    ascending_insert_ns: f64,
    random_insert_ns: f64,
    random_get_ns: f64,
    random_remove_ns: f64,
    clone_us: f64,
}

pub fn run(args: SnapshotArgs) -> anyhow::Result<bool> {
    let quick = args.common.quick;
    anyhow::ensure!(
        (1..=ROWS_MAX).contains(&args.rows),
        "--rows must be between 1 and {ROWS_MAX}"
    );
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    let classes: Vec<Durability> = args
        .classes
        .iter()
        .map(|c| c.parse::<Durability>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let params = Params {
        rows: if quick { 20_000 } else { args.rows },
        seconds: if quick { 0.5 } else { args.seconds },
        classes: classes.iter().map(|c| c.as_str().to_string()).collect(),
        map_sizes: if quick {
            vec![10_000]
        } else {
            args.map_sizes.iter().copied().filter(|&n| n > 0).collect()
        },
        map_only: args.map_only,
        pacing_seconds: if quick { 0.5 } else { args.pacing_seconds },
        pacing_interval_bytes: if quick {
            256 << 10
        } else {
            args.pacing_interval_bytes
        },
        quick,
    };
    anyhow::ensure!(
        (0.0..=600.0).contains(&params.pacing_seconds),
        "--pacing-seconds must be in [0, 600]"
    );
    anyhow::ensure!(
        params.pacing_interval_bytes >= 4096,
        "--pacing-interval-bytes must be at least 4096"
    );
    let mut report = Report::new("snapshot", serde_json::to_value(&params)?);
    let progress = Progress::new("snapshot");
    let mut failed = 0;

    let mut ack_cases = Vec::new();
    let mut recovered = None;
    let mut pacing = Vec::new();
    if !params.map_only {
        let bin = sluice_bin(args.common.sluice_bin.as_deref())?;
        let runtime = crate::harness::runtime()?;
        match runtime.block_on(run_server(&params, &classes, &bin, &progress)) {
            Ok((cases, rec)) => {
                failed += cases.iter().filter(|c| c.error.is_some()).count();
                failed += usize::from(!rec.ok);
                ack_cases = cases;
                recovered = Some(rec);
            }
            Err(e) => {
                progress.say(format!("  FAILED: {e:#}"));
                report.notes.push(format!("the server part failed: {e:#}"));
                failed += 1;
            }
        }
        if params.pacing_seconds > 0.0 {
            pacing = runtime.block_on(crate::snapshot_pacing::run(
                &bin,
                params.rows,
                params.pacing_seconds,
                params.pacing_interval_bytes,
                &progress,
            ));
            failed += pacing.iter().filter(|c| c.error.is_some()).count();
        }
    }
    let mut map_cases = Vec::new();
    for &size in &params.map_sizes {
        progress.say(format!(
            "map micro-benchmark: {} entries",
            fmt_si(size as f64)
        ));
        map_cases.push(map_case::<true>(size));
        map_cases.push(map_case::<false>(size));
    }
    progress.say(format!("done in {:.0}s", progress.elapsed_s()));
    write_report(
        &mut report,
        &params,
        &ack_cases,
        recovered.as_ref(),
        &map_cases,
    );
    if !pacing.is_empty() {
        report.tables.push(crate::snapshot_pacing::table(&pacing));
    }
    report.samples["pacing"] = serde_json::to_value(&pacing)?;
    crate::harness::standard_notes(&mut report, quick);
    crate::harness::finish_report(&report, &args.common.out, failed)
}

// ---------------------------------------------------------------------------------------
// Ack latency around a snapshot

const PHASE_BEFORE: u8 = 0;
const PHASE_DURING: u8 = 1;
const PHASE_AFTER: u8 = 2;

async fn run_server(
    params: &Params,
    classes: &[Durability],
    bin: &std::path::Path,
    progress: &Progress,
) -> anyhow::Result<(Vec<AckCase>, Recovered)> {
    let dir = TempDir::new("snapshot")?;
    let data = dir.path().join("data");
    let flags = vec![
        "--snapshot-log-bytes".to_string(),
        NO_BACKGROUND_SNAPSHOTS.to_string(),
    ];
    let (server, _) = SluiceServer::start(bin, &data, &flags).await?;
    server.sql(workload::CREATE_SLUICE).await?;
    let started = Instant::now();
    workload::load_over_http(&server, params.rows, LOAD_CLIENTS, LOAD_BATCH).await?;
    progress.say(format!(
        "loaded {} rows in {:.1}s",
        params.rows,
        started.elapsed().as_secs_f64()
    ));
    let mut cases = Vec::new();
    for &class in classes {
        progress.say(format!(
            "case: {} rows, writer {}",
            params.rows,
            class.as_str()
        ));
        let mut case = AckCase {
            class: class.as_str().to_string(),
            rows: params.rows,
            before: Phase::default(),
            during: Phase::default(),
            after: Phase::default(),
            snapshot_seq: 0,
            snapshot_s: 0.0,
            snapshot_bytes: 0,
            slowest: Vec::new(),
            error: None,
        };
        if let Err(e) = ack_case(&server, &data, params, class, &mut case, progress).await {
            progress.say(format!("  FAILED: {e:#}"));
            case.error = Some(format!("{e:#}"));
        }
        cases.push(case);
    }
    // The snapshot recovers the state: count and checksum before a crash and after restart.
    let last_snapshot = cases.iter().map(|c| c.snapshot_seq).max().unwrap_or(0);
    let before = table_fingerprint(&server).await?;
    let last_seq = server.health_seq().await?;
    server.kill9();
    let (server, _) = SluiceServer::start(bin, &data, &flags).await?;
    let after = table_fingerprint(&server).await?;
    let m = server.metrics().await?;
    let replayed = m.get("sluice_recovery_replayed") as u64;
    let commits_after_snapshot = last_seq.saturating_sub(last_snapshot);
    let ok = before == after && replayed == commits_after_snapshot && last_snapshot > 0;
    progress.say(format!(
        "  restart after kill -9: {} rows (before {}), {replayed} commits replayed, {} after the \
         snapshot at seq {last_snapshot}: {}",
        after.0,
        before.0,
        commits_after_snapshot,
        if ok { "same rows" } else { "MISMATCH" }
    ));
    drop(server);
    tokio::task::spawn_blocking(move || drop(dir)).await?;
    Ok((
        cases,
        Recovered {
            rows: after.0,
            checksum: after.1,
            replayed_commits: replayed,
            commits_after_snapshot,
            ok,
        },
    ))
}

/// Row count and a checksum over every row's columns.
async fn table_fingerprint(server: &SluiceServer) -> anyhow::Result<(u64, String)> {
    let v = server
        .sql(
            "SELECT count(*) AS n, sum(id) AS ids, sum(ts) AS ts, min(author) AS a0, \
             max(author) AS a1, min(body) AS b0, max(body) AS b1 FROM events",
        )
        .await?;
    let row = find_row(&v).with_context(|| format!("no row in the answer: {v}"))?;
    let n = row["n"]
        .as_u64()
        .with_context(|| format!("no count: {v}"))?;
    Ok((n, row.to_string()))
}

/// The first row object of a `/v1/sql` answer, wherever the answer nests it.
fn find_row(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(rows)) = o.get("rows") {
                if let Some(r) = rows.first() {
                    return Some(r);
                }
            }
            o.values().find_map(find_row)
        }
        Value::Array(a) => a.iter().find_map(find_row),
        _ => None,
    }
}

async fn ack_case(
    server: &SluiceServer,
    data: &std::path::Path,
    params: &Params,
    class: Durability,
    case: &mut AckCase,
    progress: &Progress,
) -> anyhow::Result<()> {
    let phase = Arc::new(AtomicU8::new(PHASE_BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (phase, stop) = (phase.clone(), stop.clone());
        let url = server.url("/v1/mutate");
        let rows = params.rows;
        let client = reqwest::Client::builder()
            .default_headers(crate::server::auth_headers())
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()?;
        let case_started = Instant::now();
        tokio::spawn(async move {
            let mut hists = [Latency::new(), Latency::new(), Latency::new()];
            let mut slowest: Vec<SlowAck> = Vec::with_capacity(SLOWEST_KEPT + 1);
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = workload::xorshift64(&mut x) % rows;
                n += 1;
                let body = format!(
                    r#"{{"durability":"{}","ops":[{{"op":"upsert","table":"{}","row":{{"id":{id},"room":"room-w","author":"w-{n}","body":"{}","ts":{n}}}}}]}}"#,
                    class.as_str(),
                    workload::TABLE,
                    workload::body(id),
                );
                let at = phase.load(Ordering::Relaxed);
                let sent = Instant::now();
                crate::live::client::post_json(&client, &url, body).await?;
                let took = sent.elapsed();
                // A request that overlapped the snapshot at all counts as `during`.
                let now = phase.load(Ordering::Relaxed);
                let counted = if at == now { at } else { PHASE_DURING };
                hists[usize::from(counted)].record(took);
                let took_us = took.as_micros() as u64;
                if slowest.len() < SLOWEST_KEPT || took_us > slowest[SLOWEST_KEPT - 1].took_us {
                    let at = slowest.partition_point(|s| s.took_us >= took_us);
                    slowest.insert(
                        at,
                        SlowAck {
                            at_s: (sent - case_started).as_secs_f64(),
                            took_us,
                            phase: ["before", "during", "after"][usize::from(counted)],
                        },
                    );
                    slowest.truncate(SLOWEST_KEPT);
                }
            }
            Ok::<_, anyhow::Error>((hists, slowest))
        })
    };
    let window = Duration::from_secs_f64(params.seconds);
    let m0 = server.metrics().await?;
    tokio::time::sleep(window).await;
    let m1 = server.metrics().await?;
    let snap_started = Instant::now();
    phase.store(PHASE_DURING, Ordering::Relaxed);
    let seq = server.snapshot().await.context("POST /v1/admin/snapshot");
    let snapshot_s = snap_started.elapsed().as_secs_f64();
    phase.store(PHASE_AFTER, Ordering::Relaxed);
    let m2 = server.metrics().await?;
    if seq.is_ok() {
        tokio::time::sleep(window).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (hists, slowest) = writer.await.context("the writer task panicked")??;
    let m3 = server.metrics().await?;
    case.slowest = slowest;
    case.snapshot_seq = seq?;
    case.snapshot_s = snapshot_s;
    case.snapshot_bytes = sluice_log::snapshot::list_snapshots(data)?
        .iter()
        .find(|(s, _)| *s == case.snapshot_seq)
        .and_then(|(_, p)| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let phase_of = |h: &Latency, seconds: f64, a: &Metrics, b: &Metrics| Phase {
        ack: h.summary(),
        p999_us: h.quantile_us(0.999),
        seconds,
        server: breakdown(a, b),
    };
    case.before = phase_of(&hists[0], params.seconds, &m0, &m1);
    case.during = phase_of(&hists[1], snapshot_s, &m1, &m2);
    case.after = phase_of(&hists[2], params.seconds, &m2, &m3);
    progress.say(format!(
        "  snapshot at seq {} took {} ({} bytes); ack max before {} / during {} / after {}",
        case.snapshot_seq,
        fmt_us((snapshot_s * 1e6) as u64),
        fmt_si(case.snapshot_bytes as f64),
        fmt_us(case.before.ack.max_us),
        fmt_us(case.during.ack.max_us),
        fmt_us(case.after.ack.max_us),
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Row map micro-benchmark

/// CPU time this thread has run (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU ns per op of `f` over `ops` operations.
fn cpu_ns_per_op(ops: u64, f: impl FnOnce()) -> f64 {
    let t0 = thread_cpu();
    f();
    (thread_cpu() - t0).as_nanos() as f64 / ops.max(1) as f64
}

/// The two maps under test behind one interface.
trait RowMap: Clone {
    const NAME: &'static str;
    fn empty() -> Self;
    fn put(&mut self, k: Key, v: RowEntry);
    fn read(&self, k: &Key) -> Option<&RowEntry>;
    fn take(&mut self, k: &Key) -> Option<RowEntry>;
}

impl RowMap for BTreeMap<Key, RowEntry> {
    const NAME: &'static str = "BTreeMap";
    fn empty() -> Self {
        BTreeMap::new()
    }
    fn put(&mut self, k: Key, v: RowEntry) {
        self.insert(k, v);
    }
    fn read(&self, k: &Key) -> Option<&RowEntry> {
        self.get(k)
    }
    fn take(&mut self, k: &Key) -> Option<RowEntry> {
        self.remove(k)
    }
}

impl RowMap for CowMap<Key, RowEntry> {
    const NAME: &'static str = "CowMap";
    fn empty() -> Self {
        CowMap::new()
    }
    fn put(&mut self, k: Key, v: RowEntry) {
        self.insert(k, v);
    }
    fn read(&self, k: &Key) -> Option<&RowEntry> {
        self.get(k)
    }
    fn take(&mut self, k: &Key) -> Option<RowEntry> {
        self.remove(k)
    }
}

fn map_case<const COW: bool>(size: u64) -> MapCase {
    if COW {
        map_case_of::<CowMap<Key, RowEntry>>(size)
    } else {
        map_case_of::<BTreeMap<Key, RowEntry>>(size)
    }
}

fn map_case_of<M: RowMap>(size: u64) -> MapCase {
    let values: Arc<[sluice_engine::Value]> = vec![
        sluice_engine::Value::Integer(1),
        sluice_engine::Value::Text("room-1".into()),
    ]
    .into();
    let entry = |i: u64| RowEntry {
        values: values.clone(),
        version: i,
    };
    // A fixed permutation of 0..size (multiplying by an odd constant modulo a power of two,
    // folded into range), the same for both maps.
    let mut order: Vec<u64> = (0..size).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..order.len()).rev() {
        order.swap(i, (workload::xorshift64(&mut x) % (i as u64 + 1)) as usize);
    }
    let mut m = M::empty();
    let ascending_insert_ns = cpu_ns_per_op(size, || {
        for i in 0..size {
            m.put(Key::Int(i as i64), entry(i));
        }
    });
    drop(m);
    let mut m = M::empty();
    let random_insert_ns = cpu_ns_per_op(size, || {
        for &i in &order {
            m.put(Key::Int(i as i64), entry(i));
        }
    });
    let mut found = 0u64;
    let random_get_ns = cpu_ns_per_op(size, || {
        for &i in &order {
            found += m.read(&Key::Int(i as i64)).map_or(0, |e| e.version & 1);
        }
    });
    std::hint::black_box(found);
    let t0 = Instant::now();
    let frozen = std::hint::black_box(m.clone());
    let clone_us = t0.elapsed().as_secs_f64() * 1e6;
    drop(frozen);
    let random_remove_ns = cpu_ns_per_op(size, || {
        for &i in order.iter().rev() {
            std::hint::black_box(m.take(&Key::Int(i as i64)));
        }
    });
    MapCase {
        map: M::NAME,
        size,
        ascending_insert_ns,
        random_insert_ns,
        random_get_ns,
        random_remove_ns,
        clone_us,
    }
}

// ---------------------------------------------------------------------------------------
// Report

/// Every ack case of a snapshot `samples.json` succeeded and the restart recovered the rows.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["ack_cases"]
        .as_array()
        .context("samples.json has no ack_cases")?;
    for c in cases {
        anyhow::ensure!(c["error"].is_null(), "a case failed: {c}");
        anyhow::ensure!(
            c["snapshot_seq"].as_u64().unwrap_or(0) > 0,
            "no snapshot: {c}"
        );
    }
    if !cases.is_empty() {
        anyhow::ensure!(
            samples["recovered"]["ok"] == true,
            "the restart did not recover the same rows: {}",
            samples["recovered"]
        );
    }
    for c in samples["pacing"].as_array().into_iter().flatten() {
        anyhow::ensure!(c["error"].is_null(), "a pacing case failed: {c}");
        anyhow::ensure!(
            c["rows_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
            "no writes in a pacing case: {c}"
        );
    }
    Ok(())
}

fn write_report(
    report: &mut Report,
    params: &Params,
    cases: &[AckCase],
    recovered: Option<&Recovered>,
    maps: &[MapCase],
) {
    report.intro.push(format!(
        "The server holds {} `events` rows (5 columns, ~150 bytes). One closed-loop writer \
         upserts a random existing row per request (the next request leaves when the previous \
         one is acknowledged) for {} s, then while `POST /v1/admin/snapshot` is in flight, then \
         {} s more. The acknowledgement latency of each phase is reported; `during` (every \
         request that overlapped the snapshot, from its POST to its durable reply) is what a \
         snapshot costs the writes that go on beside it. Client and server share this \
         machine's CPUs.",
        params.rows, params.seconds, params.seconds
    ));
    for c in cases.iter().filter(|c| c.error.is_none()) {
        report.targets.push(Target {
            what: format!(
                "slowest ack while a {}-row snapshot is written ({})",
                fmt_si(c.rows as f64),
                c.class
            ),
            goal: format!("< {}", fmt_us(TARGET_ACK_MAX_DURING_US)),
            measured: format!(
                "{} (p99.9 {}; the same writer's slowest before {}, after {})",
                fmt_us(c.during.ack.max_us),
                fmt_us(c.during.p999_us),
                fmt_us(c.before.ack.max_us),
                fmt_us(c.after.ack.max_us),
            ),
            met: Some(c.during.ack.max_us < TARGET_ACK_MAX_DURING_US),
        });
    }
    if !cases.is_empty() {
        let mut t = Table::new(
            "Ack latency around a snapshot",
            &[
                "class",
                "phase",
                "acks",
                "p50",
                "p99",
                "p99.9",
                "max",
                "phase length",
            ],
        );
        for c in cases {
            if c.error.is_some() {
                t.failed_row(vec![c.class.clone()]);
                continue;
            }
            for (name, p) in [
                ("before", &c.before),
                ("during snapshot", &c.during),
                ("after", &c.after),
            ] {
                t.row(vec![
                    c.class.clone(),
                    name.into(),
                    p.ack.count.to_string(),
                    fmt_us(p.ack.p50_us),
                    fmt_us(p.ack.p99_us),
                    fmt_us(p.p999_us),
                    fmt_us(p.ack.max_us),
                    fmt_us((p.seconds * 1e6) as u64),
                ]);
            }
        }
        t.note = Some(
            "The target compares one number: the slowest acknowledgement (client-measured, \
             POST sent to reply read) among the requests that overlapped the snapshot, \
             against 5 ms. `before` and `after` are the same writer without a snapshot \
             running: a spike there is not the snapshot's doing (machine noise, the client, \
             background syncs), and it bounds what `during` can show."
                .into(),
        );
        report.tables.push(t);
        let mut b = Table::new(
            "Where the slowest acks' time could go (server-side histograms, slowest bucket per phase)",
            &[
                "class",
                "phase",
                "client max",
                "mutate in server",
                "writer round",
                "log append",
                "log fsync",
                "log round",
                "segment rolls",
            ],
        );
        for c in cases.iter().filter(|c| c.error.is_none()) {
            for (name, p) in [
                ("before", &c.before),
                ("during snapshot", &c.during),
                ("after", &c.after),
            ] {
                let d = &p.server;
                b.row(vec![
                    c.class.clone(),
                    name.into(),
                    fmt_us(p.ack.max_us),
                    fmt_le(d.mutate_le_us),
                    fmt_le(d.writer_round_le_us),
                    fmt_le(d.log_append_le_us),
                    fmt_le(d.log_sync_le_us),
                    fmt_le(d.log_round_le_us),
                    d.segment_rolls.to_string(),
                ]);
            }
        }
        b.note = Some(
            "Each server column is the upper bound of the slowest log2 bucket its `/metrics` \
             histogram filled in the phase (`sluice_mutate_seconds`: queued for the writer → \
             reply settled; `sluice_writer_round_seconds`; `sluice_log_append_seconds`, segment \
             rolls included; `sluice_log_sync_seconds`; `sluice_log_round_seconds`). A client \
             max well above `mutate in server` was spent outside the server's core: HTTP, \
             tokio scheduling in either process, or the bench client's own thread."
                .into(),
        );
        report.tables.push(b);
        let mut w = Table::new(
            "The slowest acks of each case",
            &["class", "ack", "phase", "sent at (s into the case)"],
        );
        for c in cases.iter().filter(|c| c.error.is_none()) {
            for a in &c.slowest {
                w.row(vec![
                    c.class.clone(),
                    fmt_us(a.took_us),
                    a.phase.into(),
                    format!("{:.3}", a.at_s),
                ]);
            }
        }
        report.tables.push(w);
        let mut s = Table::new(
            "The snapshots",
            &["class", "rows", "seq", "POST → durable", "file bytes"],
        );
        for c in cases.iter().filter(|c| c.error.is_none()) {
            s.row(vec![
                c.class.clone(),
                c.rows.to_string(),
                c.snapshot_seq.to_string(),
                fmt_us((c.snapshot_s * 1e6) as u64),
                fmt_si(c.snapshot_bytes as f64),
            ]);
        }
        s.note = recovered.map(|r| {
            format!(
                "After the runs the server was killed with SIGKILL and restarted: {} rows, {} \
                 commits replayed ({} written after the last snapshot): {}.",
                r.rows,
                r.replayed_commits,
                r.commits_after_snapshot,
                if r.ok {
                    "the same rows as before the crash"
                } else {
                    "NOT the rows it had before the crash"
                }
            )
        });
        report.tables.push(s);
    }
    if !maps.is_empty() {
        let mut t = Table::new(
            "Row map: CPU ns per operation (Key::Int keys, RowEntry values)",
            &[
                "entries",
                "map",
                "ascending insert",
                "random insert",
                "random get",
                "random remove",
                "clone (freeze)",
            ],
        );
        for m in maps {
            t.row(vec![
                fmt_si(m.size as f64),
                m.map.into(),
                format!("{:.0}", m.ascending_insert_ns),
                format!("{:.0}", m.random_insert_ns),
                format!("{:.0}", m.random_get_ns),
                format!("{:.0}", m.random_remove_ns),
                fmt_us(m.clone_us as u64),
            ]);
        }
        t.note = Some(
            "Thread CPU time (CLOCK_THREAD_CPUTIME_ID) per operation over the whole size, \
             one thread, same key permutation for both maps; clone is wall time."
                .into(),
        );
        report.tables.push(t);
    }
    let ok: Vec<&AckCase> = cases.iter().filter(|c| c.error.is_none()).collect();
    if !ok.is_empty() {
        let series = |name: &str, phase: fn(&AckCase) -> &Phase| BarSeries {
            name: name.into(),
            values: ok
                .iter()
                .map(|c| Some(phase(c).ack.max_us as f64 / 1e3))
                .collect(),
        };
        report.chart(
            "ack_max.svg",
            "slowest acknowledgement before, during and after the snapshot",
            BarChart {
                title: format!(
                    "Slowest ack around a {}-row snapshot (ms)",
                    fmt_si(params.rows as f64)
                ),
                x_label: "writer's durability class".into(),
                y_label: "max ack latency, ms".into(),
                categories: ok.iter().map(|c| c.class.clone()).collect(),
                series: vec![
                    series("before", |c| &c.before),
                    series("during snapshot", |c| &c.during),
                    series("after", |c| &c.after),
                ],
            }
            .render(),
        );
    }
    if !maps.is_empty() {
        let mut sizes: Vec<u64> = maps.iter().map(|m| m.size).collect();
        sizes.dedup();
        let series = |name: &'static str| BarSeries {
            name: name.into(),
            values: sizes
                .iter()
                .map(|&n| {
                    maps.iter()
                        .find(|m| m.map == name && m.size == n)
                        .map(|m| m.random_insert_ns)
                })
                .collect(),
        };
        report.chart(
            "map_random_insert.svg",
            "CPU ns per random insert, CowMap and BTreeMap",
            BarChart {
                title: "Random insert, CPU ns per op".into(),
                x_label: "entries".into(),
                y_label: "ns".into(),
                categories: sizes.iter().map(|&n| fmt_si(n as f64)).collect(),
                series: vec![series("CowMap"), series("BTreeMap")],
            }
            .render(),
        );
    }
    report.samples = json!({
        "suite": "snapshot",
        "params": params,
        "ack_cases": cases,
        "recovered": recovered,
        "maps": maps,
    });
}
