//! The pacing part of `sluice bench snapshot`: automatic snapshots of a state many times
//! larger than `--snapshot-log-bytes`, under a steady stream of updates (the table does not
//! grow), with the byte interval alone (`--snapshot-log-percent 0`) and in proportion to the
//! last snapshot's size (the default, 100): how many snapshots the updates trigger, how many
//! snapshot bytes they write per byte of log, and what the writes get done meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_log::Durability;

use crate::hist::{fmt_si, fmt_us, Latency, LatencySummary};
use crate::progress::Progress;
use crate::report::Table;
use crate::server::SluiceServer;
use crate::sys::TempDir;
use crate::workload;

/// `--snapshot-log-percent` of each case: the byte interval alone, then the default.
pub const PERCENTS: [u64; 2] = [0, 100];
/// Concurrent writers, each with one request in flight.
const CLIENTS: usize = 8;
/// Rows upserted per request.
const BATCH: u64 = 100;
/// Rows per mutate and clients while loading.
const LOAD_BATCH: u64 = 500;
const LOAD_CLIENTS: usize = 4;

#[derive(Clone, Debug, Default, Serialize)]
pub struct PacingCase {
    pub percent: u64,
    pub interval_bytes: u64,
    pub rows: u64,
    pub seconds: f64,
    pub rows_per_sec: f64,
    pub ack: LatencySummary,
    /// Snapshots written in the measured window.
    pub snapshots: u64,
    /// Log bytes written in the window.
    pub log_bytes: u64,
    /// The newest snapshot's size (the state does not grow, so each is about this large).
    pub snapshot_bytes: u64,
    /// Snapshot bytes written per log byte in the window (snapshots × size / log bytes).
    pub snapshot_per_log_byte: f64,
    pub error: Option<String>,
}

/// One case per [`PERCENTS`], each on a fresh server loaded with `rows` `events` rows.
pub async fn run(
    bin: &std::path::Path,
    rows: u64,
    seconds: f64,
    interval_bytes: u64,
    progress: &Progress,
) -> Vec<PacingCase> {
    let mut cases = Vec::new();
    for percent in PERCENTS {
        progress.say(format!(
            "pacing: {} rows, --snapshot-log-bytes {interval_bytes}, --snapshot-log-percent {percent}",
            fmt_si(rows as f64)
        ));
        let mut case = PacingCase {
            percent,
            interval_bytes,
            rows,
            seconds,
            ..PacingCase::default()
        };
        if let Err(e) = one_case(bin, &mut case, progress).await {
            progress.say(format!("  FAILED: {e:#}"));
            case.error = Some(format!("{e:#}"));
        }
        cases.push(case);
    }
    cases
}

async fn one_case(
    bin: &std::path::Path,
    case: &mut PacingCase,
    progress: &Progress,
) -> anyhow::Result<()> {
    let dir = TempDir::new("snapshot-pacing")?;
    let data = dir.path().join("data");
    let flags = vec![
        "--durability".to_string(),
        "disk".to_string(),
        "--snapshot-log-bytes".to_string(),
        case.interval_bytes.to_string(),
        "--snapshot-log-percent".to_string(),
        case.percent.to_string(),
    ];
    let (server, _) = SluiceServer::start(bin, &data, &flags).await?;
    server.sql(workload::CREATE_SLUICE).await?;
    workload::load_over_http(&server, case.rows, LOAD_CLIENTS, LOAD_BATCH).await?;
    // Whatever the load triggered is written before the window opens.
    server.snapshot().await?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::with_capacity(CLIENTS);
    for w in 0..CLIENTS as u64 {
        let stop = stop.clone();
        let url = server.url("/v1/mutate");
        let rows = case.rows;
        let client = crate::live::client::http_client(Some(Duration::from_secs(60)))?;
        writers.push(tokio::spawn(async move {
            let mut latency = Latency::new();
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1);
            let mut acked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let first = workload::xorshift64(&mut x) % rows.saturating_sub(BATCH).max(1);
                let body = workload::upsert_body(first, BATCH.min(rows), Durability::Disk);
                let sent = Instant::now();
                crate::live::client::post_json(&client, &url, body).await?;
                latency.record(sent.elapsed());
                acked += BATCH.min(rows);
            }
            Ok::<_, anyhow::Error>((latency, acked))
        }));
    }
    let m0 = server.metrics().await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(case.seconds)).await;
    let m1 = server.metrics().await?;
    let window = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut latency = Latency::new();
    let mut acked = 0;
    for w in writers {
        let (l, n) = w.await??;
        latency.merge(&l);
        acked += n;
    }
    case.rows_per_sec = acked as f64 / window;
    case.ack = latency.summary();
    case.snapshots = (m1.get("sluice_snapshots_total") - m0.get("sluice_snapshots_total")) as u64;
    case.log_bytes = (m1.get("sluice_log_bytes_total") - m0.get("sluice_log_bytes_total")) as u64;
    case.snapshot_bytes = m1.get("sluice_snapshot_bytes") as u64;
    case.snapshot_per_log_byte = if case.log_bytes > 0 {
        (case.snapshots * case.snapshot_bytes) as f64 / case.log_bytes as f64
    } else {
        0.0
    };
    anyhow::ensure!(
        m1.get("sluice_snapshot_failures_total") == 0.0,
        "a snapshot failed"
    );
    progress.say(format!(
        "  {} rows/s (ack p99 {}), {} snapshots of {}B over {}B of log: {:.2} snapshot bytes per log byte",
        fmt_si(case.rows_per_sec),
        fmt_us(case.ack.p99_us),
        case.snapshots,
        fmt_si(case.snapshot_bytes as f64),
        fmt_si(case.log_bytes as f64),
        case.snapshot_per_log_byte
    ));
    drop(server);
    tokio::task::spawn_blocking(move || drop(dir)).await?;
    Ok(())
}

pub fn table(cases: &[PacingCase]) -> Table {
    let mut t = Table::new(
        "Snapshot pacing: updates to a state larger than the snapshot interval",
        &[
            "--snapshot-log-percent",
            "rows",
            "interval",
            "rows/s",
            "ack p50",
            "ack p99",
            "snapshots",
            "snapshot size",
            "log written",
            "snapshot bytes per log byte",
        ],
    );
    for c in cases.iter().filter(|c| c.error.is_none()) {
        t.row(vec![
            c.percent.to_string(),
            fmt_si(c.rows as f64),
            format!("{}B", fmt_si(c.interval_bytes as f64)),
            fmt_si(c.rows_per_sec),
            fmt_us(c.ack.p50_us),
            fmt_us(c.ack.p99_us),
            c.snapshots.to_string(),
            format!("{}B", fmt_si(c.snapshot_bytes as f64)),
            format!("{}B", fmt_si(c.log_bytes as f64)),
            format!("{:.2}", c.snapshot_per_log_byte),
        ]);
    }
    t.note = Some(format!(
        "{CLIENTS} HTTP clients upsert {BATCH} existing rows per request (`disk` class) for the \
         window, on a fresh server per case loaded first (and snapshotted, so the window starts \
         clean). With 0 the server snapshots after every interval of log, however large the \
         state; with 100 it also waits for a log as large as the last snapshot. Snapshots in \
         the window × the newest snapshot's size / log bytes in the window: the write \
         amplification snapshots add."
    ));
    t
}
