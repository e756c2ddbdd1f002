//! `sluice bench recovery`: time-to-ready after `kill -9`, by records in the log, with and
//! without a snapshot.
//!
//! For each record count N, two cases, each on a fresh data dir of the real binary:
//! - **no snapshot**: load N rows (disk class, batched mutates) with background snapshots
//!   disabled (`--snapshot-log-bytes` huge), `kill -9`; every row is replayed from the log;
//! - **snapshot**: load N rows, `POST /v1/admin/snapshot`, write a small tail, `kill -9`;
//!   recovery loads the snapshot and replays the tail.
//!
//! Then the binary is restarted `--restarts` times on that directory (`kill -9` after each)
//! and the time from spawn to the first `200 /health` is measured, next to the server's
//! own `sluice_recovery_seconds` and `sluice_recovery_replayed`, where that time went
//! (`sluice_recovery_{snapshot,read_check,window,replay,build}_seconds`) and the server's
//! memory once ready (peak and current RSS). Every restart must come back at the seq of the
//! last acknowledged write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use sluice_log::Durability;

use crate::hist::{fmt_si, fmt_us};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::server::{sluice_bin, SluiceServer};
use crate::svg::{BarChart, BarSeries};
use crate::sys::TempDir;
use crate::workload;
use crate::CommonArgs;

/// Goal: rows replayed per second of recovery.
const TARGET_REPLAY_ROWS_PER_SEC: f64 = 5e6;
/// `--snapshot-log-bytes` that keeps the server from snapshotting on its own.
const NO_BACKGROUND_SNAPSHOTS: u64 = 1 << 60;
/// Tail written after the snapshot: this share of the records (at least one batch).
const TAIL_SHARE: u64 = 100;
/// Most records one run may load (a bound on time and memory).
const RECORDS_MAX: u64 = 100_000_000;

#[derive(clap::Args, Debug, Clone)]
pub struct RecoveryArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Records (rows) loaded before the crash; one pair of cases (no snapshot, snapshot)
    /// per value.
    #[arg(long, value_delimiter = ',', default_values_t = vec![100_000u64, 1_000_000, 10_000_000])]
    pub records: Vec<u64>,
    /// Rows per mutate while loading: each mutate is one commit, one log frame.
    #[arg(long, default_value_t = 100)]
    pub batch: u64,
    /// Concurrent HTTP clients while loading.
    #[arg(long, default_value_t = 4)]
    pub load_clients: usize,
    /// Restarts measured per case; the median is reported (five by default: on a VM
    /// whose memory speed swings from one second to the next, a median of three moved by
    /// half between runs of the same build).
    #[arg(long, default_value_t = 5)]
    pub restarts: usize,
    /// Rows written after the snapshot (default: 1% of the records, at least one batch).
    #[arg(long)]
    pub tail: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
struct Params {
    records: Vec<u64>,
    batch: u64,
    load_clients: usize,
    restarts: usize,
    tail: Option<u64>,
    quick: bool,
}

/// One measured restart.
#[derive(Clone, Debug, Serialize)]
struct Restart {
    /// Spawn to first `200 /health`, as a client sees it.
    ready_s: f64,
    /// `sluice_recovery_seconds`: the server's own time in recovery.
    recovery_s: f64,
    /// `sluice_recovery_replayed`: commits replayed from the log.
    replayed_commits: u64,
    seq: u64,
    /// `sluice_recovery_{phase}_seconds` for each of [`PHASES`].
    #[serde(default)]
    phases_s: Vec<f64>,
    /// The server's peak and current resident memory once ready (`VmHWM`, `VmRSS`), bytes.
    #[serde(default)]
    peak_rss_bytes: u64,
    #[serde(default)]
    rss_bytes: u64,
    /// `sluice_recovery_whole_log`: the server replayed the whole log in place of the
    /// snapshot (the changelog window needed every commit up to it anyway).
    #[serde(default)]
    whole_log: bool,
}

/// Recovery's phases as the server reports them, with their labels in the report.
const PHASES: [(&str, &str); 5] = [
    ("snapshot", "snapshot load"),
    ("read_check", "read + check log"),
    ("window", "changelog window"),
    ("replay", "decode + apply"),
    ("build", "bulk table build"),
];

/// `VmHWM` and `VmRSS` of process `pid`, in bytes (0 where unknown).
fn rss_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[derive(Clone, Debug, Serialize)]
struct Case {
    records: u64,
    snapshot: bool,
    /// Rows written after the snapshot (0 without one).
    tail_rows: u64,
    batch: u64,
    load_s: f64,
    last_seq: u64,
    snapshot_seq: Option<u64>,
    log_bytes: u64,
    snapshot_bytes: u64,
    segments: usize,
    restarts: Vec<Restart>,
    error: Option<String>,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} records, {}",
            fmt_si(self.records as f64),
            if self.snapshot {
                "with snapshot"
            } else {
                "no snapshot"
            }
        )
    }

    /// Whether the server replayed the whole log in place of this case's snapshot.
    fn whole_log(&self) -> bool {
        self.restarts.iter().any(|r| r.whole_log)
    }

    /// Rows recovery had to replay from the log (all of them when it replayed the whole
    /// log in place of the snapshot).
    fn rows_replayed(&self) -> u64 {
        if self.snapshot && !self.whole_log() {
            self.tail_rows
        } else {
            self.records + self.tail_rows
        }
    }

    fn median(&self, f: impl Fn(&Restart) -> f64) -> Option<f64> {
        let mut v: Vec<f64> = self.restarts.iter().map(f).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    fn ready_s(&self) -> Option<f64> {
        self.median(|r| r.ready_s)
    }

    fn recovery_s(&self) -> Option<f64> {
        self.median(|r| r.recovery_s)
    }

    /// The restart whose recovery time is the median (for its phases and memory).
    fn median_restart(&self) -> Option<&Restart> {
        let mut v: Vec<&Restart> = self.restarts.iter().collect();
        v.sort_by(|a, b| a.recovery_s.total_cmp(&b.recovery_s));
        v.get(v.len() / 2).copied()
    }

    /// Rows in the table after recovery (from the snapshot plus replayed).
    fn rows_recovered(&self) -> u64 {
        self.records + self.tail_rows
    }

    /// Rows recovered per second of the server's recovery time. Without a snapshot every
    /// row is replayed from the log, so this is the replay rate.
    fn recovered_rows_per_sec(&self) -> Option<f64> {
        let s = self.recovery_s()?;
        (s > 0.0).then(|| self.rows_recovered() as f64 / s)
    }
}

pub fn run(args: RecoveryArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(
        (1..=256).contains(&args.load_clients),
        "--load-clients must be between 1 and 256"
    );
    anyhow::ensure!(
        (1..=100).contains(&args.restarts),
        "--restarts must be between 1 and 100"
    );
    anyhow::ensure!(
        !args.records.is_empty() && args.records.iter().all(|&n| (1..=RECORDS_MAX).contains(&n)),
        "--records must each be between 1 and {RECORDS_MAX}"
    );
    let quick = args.common.quick;
    let params = Params {
        records: if quick {
            vec![2_000]
        } else {
            args.records.clone()
        },
        batch: args.batch,
        load_clients: args.load_clients,
        restarts: if quick { 1 } else { args.restarts },
        tail: args.tail,
        quick,
    };
    let bin = sluice_bin(args.common.sluice_bin.as_deref())?;
    let runtime = crate::harness::runtime()?;
    let mut report = Report::new("recovery", serde_json::to_value(&params)?);
    let progress = Progress::new("recovery");
    let mut cases = Vec::new();
    for &records in &params.records {
        for snapshot in [false, true] {
            let tail_rows = if snapshot {
                params
                    .tail
                    .unwrap_or((records / TAIL_SHARE).max(params.batch))
            } else {
                0
            };
            let mut case = Case {
                records,
                snapshot,
                tail_rows,
                batch: params.batch,
                load_s: 0.0,
                last_seq: 0,
                snapshot_seq: None,
                log_bytes: 0,
                snapshot_bytes: 0,
                segments: 0,
                restarts: Vec::new(),
                error: None,
            };
            progress.say(format!("case: {}", case.label()));
            if let Err(e) = runtime.block_on(run_case(&params, &bin, &mut case, &progress)) {
                progress.say(format!("  FAILED: {e:#}"));
                case.error = Some(format!("{e:#}"));
            }
            cases.push(case);
        }
    }
    progress.say(format!("done in {:.0}s", progress.elapsed_s()));
    drop(runtime);
    let failed = cases.iter().filter(|c| c.error.is_some()).count();
    write_report(&mut report, &params, &cases);
    crate::harness::finish_report(&report, &args.common.out, failed)
}

async fn run_case(
    params: &Params,
    bin: &std::path::Path,
    case: &mut Case,
    progress: &Progress,
) -> anyhow::Result<()> {
    let dir = TempDir::new("recovery")?;
    let data = dir.path().join("data");
    let flags = vec![
        "--durability".to_string(),
        "disk".to_string(),
        "--snapshot-log-bytes".to_string(),
        NO_BACKGROUND_SNAPSHOTS.to_string(),
    ];
    let (server, _) = SluiceServer::start(bin, &data, &flags).await?;
    server.sql(workload::CREATE_SLUICE).await?;
    let started = Instant::now();
    let mut last_seq = load(&server, 1, case.records, params, progress).await?;
    case.load_s = started.elapsed().as_secs_f64();
    progress.say(format!(
        "  loaded {} rows in {:.1}s ({} rows/s)",
        case.records,
        case.load_s,
        fmt_si(case.records as f64 / case.load_s)
    ));
    if case.snapshot {
        let seq = server.snapshot().await.context("POST /v1/admin/snapshot")?;
        case.snapshot_seq = Some(seq);
        last_seq = load(&server, case.records + 1, case.tail_rows, params, progress).await?;
        progress.say(format!(
            "  snapshot at seq {seq}, then {} tail rows",
            case.tail_rows
        ));
    }
    let metrics = server.metrics().await?;
    anyhow::ensure!(
        case.snapshot || metrics.get("sluice_snapshots_total") == 0.0,
        "the server took a snapshot on its own despite --snapshot-log-bytes {NO_BACKGROUND_SNAPSHOTS}"
    );
    case.last_seq = last_seq;
    server.kill9();
    let segments = sluice_log::segment::list_segments(&data)?;
    case.segments = segments.len();
    // Whole frames only: a torn tail left by the kill is not log (recovery cuts it).
    case.log_bytes = 0;
    for (i, s) in segments.iter().enumerate() {
        let bytes = std::fs::read(&s.path)?;
        let end = sluice_log::segment::scan(&s.path, &bytes, i + 1 == segments.len(), |_, _| {
            Ok::<(), sluice_log::LogError>(())
        })?;
        case.log_bytes += end.valid_len;
    }
    case.snapshot_bytes = sluice_log::snapshot::list_snapshots(&data)?
        .iter()
        .filter_map(|(_, p)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0);
    // The load's dirty pages (its log, and a prepared segment's zeros) are written back
    // now, not by the kernel during the first restarts, where that took CPU and disk
    // from recovery and made those restarts 2-4x slower than the later ones.
    sync_files_in(&data)?;

    for i in 0..params.restarts {
        let (server, ready) = SluiceServer::start(bin, &data, &flags).await?;
        let (peak_rss_bytes, rss_bytes) = rss_of(server.pid());
        let m = server.metrics().await?;
        let seq = server.health_seq().await?;
        server.kill9();
        let restart = Restart {
            ready_s: ready.as_secs_f64(),
            recovery_s: m.get("sluice_recovery_seconds"),
            replayed_commits: m.get("sluice_recovery_replayed") as u64,
            seq,
            phases_s: PHASES
                .iter()
                .map(|(p, _)| m.get(&format!("sluice_recovery_{p}_seconds")))
                .collect(),
            peak_rss_bytes,
            rss_bytes,
            whole_log: m.get("sluice_recovery_whole_log") == 1.0,
        };
        progress.say(format!(
            "  restart {}/{}: ready in {}, recovery {} ({} commits replayed)",
            i + 1,
            params.restarts,
            fmt_us(ready.as_micros() as u64),
            fmt_us((restart.recovery_s * 1e6) as u64),
            restart.replayed_commits
        ));
        anyhow::ensure!(
            seq == last_seq,
            "after kill -9 the server came back at seq {seq}, but seq {last_seq} was acknowledged \
             (disk class must survive a process crash)"
        );
        case.restarts.push(restart);
    }
    tokio::task::spawn_blocking(move || drop(dir)).await?;
    Ok(())
}

/// Inserts rows `first..first + rows` with `disk`-class mutates of `batch` rows from
/// `load_clients` clients; returns the highest acknowledged seq.
/// `fsync`s every file in `dir`.
fn sync_files_in(dir: &std::path::Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("syncing {}", path.display()))?;
        }
    }
    Ok(())
}

async fn load(
    server: &SluiceServer,
    first: u64,
    rows: u64,
    params: &Params,
    progress: &Progress,
) -> anyhow::Result<u64> {
    let end = first + rows;
    let next = Arc::new(AtomicU64::new(first));
    let done = Arc::new(AtomicU64::new(0));
    let url = server.url("/v1/mutate");
    let mut tasks = Vec::new();
    for _ in 0..params.load_clients {
        let (next, done, url, batch) = (next.clone(), done.clone(), url.clone(), params.batch);
        let client = reqwest::Client::builder()
            .default_headers(crate::server::auth_headers())
            .no_proxy()
            .pool_max_idle_per_host(1)
            .timeout(Duration::from_secs(60))
            .build()?;
        tasks.push(tokio::spawn(async move {
            let mut max_seq = 0;
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= end {
                    return Ok::<u64, anyhow::Error>(max_seq);
                }
                let n = batch.min(end - from);
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(workload::mutate_body(from, n, Durability::Disk))
                    .send()
                    .await?;
                let status = resp.status();
                let text = resp.text().await?;
                anyhow::ensure!(status.is_success(), "mutate answered {status}: {text}");
                let v: Value = serde_json::from_str(&text)?;
                let seq = v["seq"].as_u64().context("mutate answer without a seq")?;
                max_seq = max_seq.max(seq);
                done.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    let reporter = {
        let done = done.clone();
        let progress = *progress;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                progress.say(format!(
                    "  loading: {} / {} rows",
                    done.load(Ordering::Relaxed),
                    rows
                ));
            }
        })
    };
    let mut max_seq = 0;
    let mut result = Ok(());
    for t in tasks {
        match t.await {
            Ok(Ok(s)) => max_seq = max_seq.max(s),
            Ok(Err(e)) => result = Err(e),
            Err(e) => result = Err(anyhow::anyhow!("a load task panicked: {e}")),
        }
    }
    reporter.abort();
    result?;
    Ok(max_seq)
}

/// Every case of a recovery `samples.json` succeeded, restarted and recovered rows.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "samples.json has no cases");
    for c in cases {
        anyhow::ensure!(c["error"].is_null(), "a case failed: {c}");
        let restarts = c["restarts"]
            .as_array()
            .context("a case without restarts")?;
        anyhow::ensure!(!restarts.is_empty(), "a case without restarts: {c}");
        for r in restarts {
            anyhow::ensure!(
                r["ready_s"].as_f64().unwrap_or(0.0) > 0.0,
                "no time-to-ready: {c}"
            );
            anyhow::ensure!(
                r["recovery_s"].as_f64().unwrap_or(0.0) > 0.0,
                "no recovery time: {c}"
            );
            anyhow::ensure!(r["seq"] == c["last_seq"], "restart at another seq: {c}");
        }
    }
    for snapshot in [false, true] {
        anyhow::ensure!(
            cases.iter().any(|c| c["snapshot"] == snapshot),
            "no case with snapshot={snapshot} in samples.json"
        );
    }
    Ok(())
}

fn write_report(report: &mut Report, params: &Params, cases: &[Case]) {
    report.intro.push(format!(
        "Each case loads the records as `events` rows over HTTP ({} rows per disk-class mutate, \
         so one log frame per {} rows), kills the server with SIGKILL, then restarts it {} \
         time(s) on the same directory (SIGKILL after each) and reports the median. \
         Time-to-ready runs from spawning the process to the first `200 /health`. \
         The files were just written, so they are in the OS page cache (a warm restart); \
         they are synced to disk before the first restart, so that the kernel's write-back of \
         the load does not run during the measured restarts.",
        params.batch, params.batch, params.restarts
    ));
    for c in cases.iter().filter(|c| !c.snapshot) {
        let rate = c.recovered_rows_per_sec();
        report.targets.push(Target {
            what: format!(
                "log replay, {} records, no snapshot",
                fmt_si(c.records as f64)
            ),
            goal: format!("≥ {} records/s", fmt_si(TARGET_REPLAY_ROWS_PER_SEC)),
            measured: rate.map_or("not measured".into(), |r| {
                format!(
                    "{} records/s ({} commits/s)",
                    fmt_si(r),
                    fmt_si(r / params.batch as f64)
                )
            }),
            met: rate.map(|r| r >= TARGET_REPLAY_ROWS_PER_SEC),
        });
    }
    for &n in &params.records {
        let case = |snapshot: bool| {
            cases
                .iter()
                .find(|c| c.records == n && c.snapshot == snapshot && c.error.is_none())
        };
        let (without, with) = (
            case(false).and_then(Case::ready_s),
            case(true).and_then(Case::ready_s),
        );
        let whole_log = case(true).is_some_and(Case::whole_log);
        report.targets.push(Target {
            what: format!(
                "time-to-ready, {} records: with a snapshot ≤ without",
                fmt_si(n as f64)
            ),
            goal: "with ≤ without".into(),
            measured: match (with, without) {
                (Some(w), Some(wo)) => format!(
                    "{} with, {} without{}",
                    fmt_us((w * 1e6) as u64),
                    fmt_us((wo * 1e6) as u64),
                    if whole_log {
                        " (both replay the whole log: see the note under the next table)"
                    } else {
                        ""
                    }
                ),
                _ => "not measured".into(),
            },
            met: with.zip(without).map(|(w, wo)| w <= wo),
        });
    }
    let mut t = Table::new(
        "Time-to-ready after kill -9",
        &[
            "records",
            "snapshot",
            "log",
            "snapshot file",
            "time-to-ready",
            "first restart",
            "recovery (server)",
            "commits replayed",
            "rows from snapshot",
            "rows replayed",
            "rows/s recovered (server)",
            "rows/s recovered (wall)",
        ],
    );
    for c in cases {
        let mut row = vec![
            fmt_si(c.records as f64),
            match (c.snapshot, c.whole_log()) {
                (false, _) => "no".into(),
                (true, false) => format!("yes (+{} tail rows)", c.tail_rows),
                (true, true) => format!("yes (+{} tail rows), whole log replayed", c.tail_rows),
            },
            format!(
                "{:.1} MiB in {} segment(s)",
                c.log_bytes as f64 / (1 << 20) as f64,
                c.segments
            ),
            if c.snapshot_bytes > 0 {
                format!("{:.1} MiB", c.snapshot_bytes as f64 / (1 << 20) as f64)
            } else {
                "—".into()
            },
        ];
        match (&c.error, c.ready_s(), c.recovery_s()) {
            (None, Some(ready), Some(recovery)) => row.extend([
                fmt_us((ready * 1e6) as u64),
                fmt_us((c.restarts[0].ready_s * 1e6) as u64),
                fmt_us((recovery * 1e6) as u64),
                c.restarts[0].replayed_commits.to_string(),
                (c.rows_recovered() - c.rows_replayed()).to_string(),
                c.rows_replayed().to_string(),
                c.recovered_rows_per_sec().map_or("—".into(), fmt_si),
                fmt_si(c.rows_recovered() as f64 / ready),
            ]),
            _ => {
                row.push("failed".into());
                row.extend(std::iter::repeat_n("—".to_string(), 7));
            }
        }
        t.row(row);
    }
    t.note = Some(
        "recovery (server) is `sluice_recovery_seconds` and commits replayed is \
         `sluice_recovery_replayed` (the DDL is one of them). rows/s recovered = rows in the \
         table after recovery / recovery (server), or / time-to-ready for (wall); without a \
         snapshot every row is replayed from the log, so that is the replay rate the target \
         is about. time-to-ready and the rest are medians over the restarts; first restart is \
         the time-to-ready of the first one alone, often the slowest on a VM with free page \
         reporting (virtio-balloon): memory left free for a few seconds — here, what the \
         killed loader freed — is handed back to the host, and every page recovery then \
         touches is faulted in through the host again; back-to-back restarts reuse warm pages. \
         \"whole log replayed\": the log still starts at seq 1 and the changelog window would \
         need every commit up to the snapshot anyway, so the server replays the whole log in \
         place of loading the snapshot (`sluice_recovery_whole_log`), as the case without a \
         snapshot does, and checks the snapshot after it is ready (its snapshotter waits for the \
         verdict; a damaged one is moved aside); commits replayed counts only those after the \
         snapshot. The two times then differ by the tail rows and by noise."
            .into(),
    );
    report.tables.push(t);

    let mut headers = vec!["records", "snapshot", "recovery (server)"];
    headers.extend(PHASES.iter().map(|(_, label)| *label));
    headers.extend(["other", "peak RSS", "RSS when ready"]);
    let mut t = Table::new("Where recovery's time went (median restart)", &headers);
    for c in cases.iter().filter(|c| c.error.is_none()) {
        let Some(r) = c.median_restart() else {
            continue;
        };
        let mut row = vec![
            fmt_si(c.records as f64),
            if c.snapshot { "yes" } else { "no" }.to_string(),
            fmt_us((r.recovery_s * 1e6) as u64),
        ];
        let mut accounted = 0.0;
        for i in 0..PHASES.len() {
            let s = r.phases_s.get(i).copied().unwrap_or(0.0);
            accounted += s;
            row.push(fmt_us((s * 1e6) as u64));
        }
        row.push(fmt_us(((r.recovery_s - accounted).max(0.0) * 1e6) as u64));
        let mib = |b: u64| format!("{:.0} MiB", b as f64 / (1 << 20) as f64);
        row.push(mib(r.peak_rss_bytes));
        row.push(mib(r.rss_bytes));
        t.row(row);
    }
    t.note = Some(
        "Phases are the server's `sluice_recovery_{snapshot,read_check,window,replay,build}_seconds`: \
         loading the snapshot; waiting for segments to be read and every frame and the seq \
         chain checked (a reader thread runs one piece of a segment — 1 MiB first, doubling to 16 MiB — ahead of decoding: only what it does \
         not hide counts); \
         decoding the commits at or before the snapshot into the changelog window (rows the \
         snapshot holds are shared, not decoded again); decoding (on worker threads) and \
         applying the commits after it; building tables whose rows arrived in ascending key \
         order into an empty table in bulk. Peak RSS is the server's `VmHWM` once ready \
         (recovery's peak)."
            .into(),
    );
    report.tables.push(t);

    let categories: Vec<String> = params
        .records
        .iter()
        .map(|&n| format!("{} records", fmt_si(n as f64)))
        .collect();
    let series = |snapshot: bool, f: &dyn Fn(&Case) -> Option<f64>| BarSeries {
        name: if snapshot {
            "with snapshot"
        } else {
            "no snapshot"
        }
        .into(),
        values: params
            .records
            .iter()
            .map(|&n| {
                cases
                    .iter()
                    .find(|c| c.records == n && c.snapshot == snapshot && c.error.is_none())
                    .and_then(f)
            })
            .collect(),
    };
    let ready_ms = |c: &Case| c.ready_s().map(|s| s * 1e3);
    report.chart(
        "time_to_ready.svg",
        "time-to-ready after kill -9",
        BarChart {
            title: "Time-to-ready after kill -9 (ms)".into(),
            x_label: "records in the table".into(),
            y_label: "time-to-ready, ms".into(),
            categories: categories.clone(),
            series: vec![series(false, &ready_ms), series(true, &ready_ms)],
        }
        .render(),
    );
    let rate = |c: &Case| c.recovered_rows_per_sec();
    report.chart(
        "recovery_rate.svg",
        "rows recovered per second of server recovery time",
        BarChart {
            title: "Rows recovered per second of recovery (server time)".into(),
            x_label: "records in the table".into(),
            y_label: "rows / s".into(),
            categories,
            series: vec![series(false, &rate), series(true, &rate)],
        }
        .render(),
    );
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.label(),
            c.error.as_deref().unwrap_or_default()
        ));
    }
    crate::harness::standard_notes(report, params.quick);
    report.samples = json!({ "suite": "recovery", "params": params, "cases": cases });
}
