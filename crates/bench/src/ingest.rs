//! `sluice bench ingest`: write throughput and ack latency per durability class.
//!
//! Three families of cases, all inserting the same `events` rows (see [`crate::workload`]):
//! 1. **in-process**: a [`Core`] on a temp dir, no HTTP — the writer, log and group
//!    commit alone — for several rows-per-mutate batch sizes and every class;
//! 2. **HTTP**: the real `sluice serve` binary, 1 / 16 / 64 concurrent keep-alive clients
//!    per class, `--batch` rows per request; syncs and commits per sync from `/metrics`;
//! 3. **PostgreSQL** (`synchronous_commit=on`, `fsync=on`): the same rows by a prepared
//!    multi-row `INSERT` of `--batch` rows, from the same numbers of connections.
//!
//! Every case starts from an empty table (a fresh Sluice data dir; `TRUNCATE` for
//! PostgreSQL) and runs a short warm-up, then a measured window of `--seconds`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use sluice_engine::Key;
use sluice_log::Durability;
use sluice_server::decode::{TypedMutate, TypedOp};
use sluice_server::{Caller, Config, Core};

use crate::hist::{fmt_ratio, fmt_ratio_against, fmt_si, fmt_us, Latency};
use crate::load::{measure, no_probe, Counts, Measured, Meter, Probe, Worker};
use crate::peers::postgres::{find_bin_dir, Postgres};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::server::sluice_bin;
use crate::svg::{BarChart, BarSeries, LineChart, LineSeries};
use crate::sys::TempDir;
use crate::transfer::cpu::CpuSample;
use crate::workload;
use crate::CommonArgs;

/// Goal: in-process apply + log, batched (>= 100 rows per mutate) — issue 12.
const TARGET_INPROC_ROWS_PER_SEC: f64 = 3e6;
/// Goal: HTTP disk class over PostgreSQL's batched INSERT, same client count (issue 12).
const TARGET_HTTP_DISK_OVER_POSTGRES: f64 = 3.0;
/// Goal: HTTP, disk class, batched.
const TARGET_HTTP_DISK_ROWS_PER_SEC: f64 = 1e6;
/// Goal: fsync-class throughput under 64 clients as a share of the disk class.
const TARGET_FSYNC_SHARE_OF_DISK: f64 = 0.5;
/// Client count the fsync/disk goal is stated for.
const TARGET_FSYNC_CLIENTS: usize = 64;

#[derive(clap::Args, Debug, Clone)]
pub struct IngestArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Seconds measured per case (after a short warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Rows per request over HTTP, and per INSERT for PostgreSQL.
    #[arg(long, default_value_t = 100)]
    pub batch: u64,
    /// The rows written: `events` (5 columns, ~100-byte body) and/or `wide` (10 columns,
    /// ~200 bytes); every case runs once per shape, and the summary has targets and tables
    /// for each.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![workload::Shape::Events, workload::Shape::Wide])]
    pub shape: Vec<workload::Shape>,
    /// Concurrent keep-alive HTTP clients (and PostgreSQL connections), one case each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16, 64])]
    pub clients: Vec<usize>,
    /// Rows per mutate for the in-process cases, one case each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u64, 100, 1000])]
    pub inproc_batches: Vec<u64>,
    /// Concurrent tasks submitting mutates in-process (so group commit has company).
    #[arg(long, default_value_t = 16)]
    pub inproc_tasks: usize,
    /// Durability classes to measure.
    #[arg(long, value_delimiter = ',', default_values_t = vec![Durability::Memory, Durability::Disk, Durability::Fsync])]
    pub classes: Vec<Durability>,
    /// Log bytes between background snapshots, for both the in-process core and the
    /// server (default: the server's own default).
    #[arg(long)]
    pub snapshot_log_bytes: Option<u64>,
    /// Skip the PostgreSQL peer (it is required otherwise).
    #[arg(long)]
    pub no_peers: bool,
    /// Directory holding PostgreSQL's `initdb` and `postgres` (default: `$PG_BIN`, else
    /// the newest /usr/lib/postgresql/*/bin).
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
    /// Skip the HTTP cases.
    #[arg(long)]
    pub no_http: bool,
    /// Skip the in-process cases.
    #[arg(long)]
    pub no_inproc: bool,
    /// Skip the topic rows (appends in-process, over HTTP and WebSocket, Redis XADD,
    /// PostgreSQL COPY) and the tag index micro-benchmark.
    #[arg(long)]
    pub no_topics: bool,
    /// Run only the topic rows and the tag index micro-benchmark.
    #[arg(long, conflicts_with = "no_topics")]
    pub topics_only: bool,
    /// Concurrent clients for the topic appends over HTTP and WebSocket, one case each
    /// (also Redis and PostgreSQL connections).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16])]
    pub topic_clients: Vec<usize>,
    /// Distinct tags in the tag index micro-benchmark, one case each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000u64, 100_000, 1_000_000])]
    pub tag_sizes: Vec<u64>,
    /// Seed of the tag lookups' random order (printed in samples.json).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Parameters after `--quick` is applied.
#[derive(Clone, Debug, Serialize)]
struct Params {
    seconds: f64,
    warmup_seconds: f64,
    batch: u64,
    shapes: Vec<workload::Shape>,
    clients: Vec<usize>,
    inproc_batches: Vec<u64>,
    inproc_tasks: usize,
    classes: Vec<&'static str>,
    snapshot_log_bytes: Option<u64>,
    peers: bool,
    http: bool,
    inproc: bool,
    quick: bool,
    /// The table rows run (not `--topics-only`).
    tables: bool,
    topics: Option<crate::topics::TopicParams>,
}

impl Params {
    fn from(args: &IngestArgs) -> Params {
        let quick = args.common.quick;
        let seconds = if quick {
            args.seconds.min(0.3)
        } else {
            args.seconds
        };
        let mut classes: Vec<&'static str> = args.classes.iter().map(|d| d.as_str()).collect();
        classes.dedup();
        Params {
            seconds,
            warmup_seconds: if quick {
                0.05
            } else {
                (seconds / 10.0).min(0.5)
            },
            batch: args.batch,
            shapes: {
                let mut shapes = args.shape.clone();
                shapes.dedup();
                shapes
            },
            clients: if quick {
                vec![1, 4]
            } else {
                args.clients.clone()
            },
            inproc_batches: if quick {
                vec![1, 100]
            } else {
                args.inproc_batches.clone()
            },
            inproc_tasks: if quick {
                args.inproc_tasks.min(4)
            } else {
                args.inproc_tasks
            },
            classes: classes.clone(),
            snapshot_log_bytes: args.snapshot_log_bytes,
            peers: !args.no_peers,
            http: !args.no_http && !args.topics_only,
            inproc: !args.no_inproc && !args.topics_only,
            quick,
            tables: !args.topics_only,
            topics: (!args.no_topics).then(|| crate::topics::TopicParams {
                batches: if quick {
                    vec![1, 100]
                } else {
                    args.inproc_batches.clone()
                },
                clients: if quick {
                    vec![2]
                } else {
                    args.topic_clients.clone()
                },
                tag_sizes: if quick {
                    vec![1_000]
                } else {
                    args.tag_sizes.clone()
                },
                classes: classes.clone(),
                redis: !args.no_peers,
                seed: args.seed,
            }),
        }
    }

    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_seconds)
    }

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    fn durabilities(&self) -> Vec<Durability> {
        self.classes
            .iter()
            .map(|c| c.parse().expect("parsed by clap"))
            .collect()
    }
}

/// One case's identity and result, as stored in `samples.json`.
#[derive(Clone, Debug, Serialize)]
struct Case {
    /// The rows written.
    shape: workload::Shape,
    /// `inproc`, `http` or `postgres`.
    kind: &'static str,
    /// `memory` / `disk` / `fsync` for Sluice, `synchronous_commit=on` for PostgreSQL.
    class: &'static str,
    /// Rows per request (mutate or INSERT).
    batch: u64,
    /// Concurrent tasks, clients or connections.
    concurrency: usize,
    /// CPU by thread group over the measured window (Sluice's threads: in this process
    /// for `inproc`, the server's for `http`), in µs per row acked in the window.
    cpu_us_per_row: BTreeMap<String, f64>,
    #[serde(flatten)]
    result: Option<Measured>,
    error: Option<String>,
}

impl Case {
    fn label(&self) -> String {
        let rows = shape_name(self.shape);
        let what = match self.kind {
            "inproc" => format!(
                "in-process {} class, {} rows/mutate, {} tasks",
                self.class, self.batch, self.concurrency
            ),
            "http" => format!(
                "HTTP {} class, {} clients, {} rows/request",
                self.class, self.concurrency, self.batch
            ),
            _ => format!(
                "PostgreSQL, {} connections, {} rows/INSERT",
                self.concurrency, self.batch
            ),
        };
        format!("{what} ({rows} rows)")
    }

    fn rows_per_sec(&self) -> Option<f64> {
        self.result.as_ref().map(|m| m.rows_per_sec)
    }
}

/// `events` or `wide`, as `--shape` names it.
fn shape_name(shape: workload::Shape) -> &'static str {
    match shape {
        workload::Shape::Events => "events",
        workload::Shape::Wide => "wide",
    }
}

pub fn run(args: IngestArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(!args.shape.is_empty(), "--shape names at least one shape");
    anyhow::ensure!(
        args.clients.iter().all(|&c| (1..=1024).contains(&c)),
        "--clients must each be between 1 and 1024"
    );
    anyhow::ensure!(
        args.inproc_batches.iter().all(|&b| b >= 1) && args.inproc_tasks >= 1,
        "--inproc-batches and --inproc-tasks must be at least 1"
    );
    let params = Params::from(&args);
    let bin = sluice_bin(args.common.sluice_bin.as_deref())?;
    let pg_bin = if params.peers {
        Some(find_bin_dir(args.pg_bin.as_deref())?)
    } else {
        None
    };
    let runtime = crate::harness::runtime()?;
    let mut report = Report::new("ingest", serde_json::to_value(&params)?);
    let mut topic_results = crate::topics::TopicResults::default();
    let cases = runtime.block_on(run_cases(
        &params,
        &bin,
        pg_bin,
        &mut report,
        &mut topic_results,
    ))?;
    let failed = cases.iter().filter(|c| c.error.is_some()).count() + topic_results.failed();
    write_report(&mut report, &params, &cases);
    if params.topics.is_some() {
        crate::topics::write_report(&mut report, &topic_results.appends, &topic_results.tags);
        report.samples["topics"] = serde_json::to_value(&topic_results)?;
    }
    crate::harness::finish_report(&report, &args.common.out, failed)
}

async fn run_cases(
    params: &Params,
    bin: &std::path::Path,
    pg_bin: Option<PathBuf>,
    report: &mut Report,
    topic_results: &mut crate::topics::TopicResults,
) -> anyhow::Result<Vec<Case>> {
    let progress = Progress::new("ingest");
    let classes = params.durabilities();
    let mut plan = Vec::new();
    for &shape in &params.shapes {
        if params.inproc {
            for &d in &classes {
                for &b in &params.inproc_batches {
                    plan.push((shape, "inproc", d.as_str(), b, params.inproc_tasks));
                }
            }
        }
        if params.http {
            for &d in &classes {
                for &c in &params.clients {
                    plan.push((shape, "http", d.as_str(), params.batch, c));
                }
            }
        }
        if pg_bin.is_some() && params.tables {
            for &c in &params.clients {
                plan.push((shape, "postgres", "synchronous_commit=on", params.batch, c));
            }
        }
    }
    let per_case = params.warmup_seconds + params.seconds;
    progress.say(format!(
        "{} cases of {:.1}s (+{:.2}s warm-up) each, about {:.0}s in all",
        plan.len(),
        params.seconds,
        params.warmup_seconds,
        plan.len() as f64 * (per_case + 0.5) + if pg_bin.is_some() { 3.0 } else { 0.0 }
    ));

    let mut postgres = None;
    if let Some(dir) = &pg_bin {
        progress.say(format!("starting PostgreSQL from {}", dir.display()));
        let pg = Postgres::start(dir).await?;
        let admin = pg.connect().await?;
        for shape in &params.shapes {
            admin.batch_execute(shape.create_postgres()).await?;
        }
        progress.say(format!(
            "PostgreSQL {} ready on 127.0.0.1:{} (pid {})",
            pg.version,
            pg.port,
            pg.pid()
        ));
        report
            .run_extra
            .insert("postgres_version".into(), json!(pg.version));
        postgres = Some((pg, admin));
    }

    let mut cases = Vec::with_capacity(plan.len());
    for (i, &(shape, kind, class, batch, concurrency)) in plan.iter().enumerate() {
        let mut case = Case {
            shape,
            kind,
            class,
            batch,
            concurrency,
            cpu_us_per_row: BTreeMap::new(),
            result: None,
            error: None,
        };
        progress.say(format!("case {}/{}: {}", i + 1, plan.len(), case.label()));
        let durability: Option<Durability> = class.parse().ok();
        let outcome = match (kind, durability, &postgres) {
            ("inproc", Some(d), _) => inproc_case(params, shape, d, batch, concurrency).await,
            ("http", Some(d), _) => http_case(params, bin, shape, d, batch, concurrency).await,
            ("postgres", _, Some((pg, admin))) => {
                postgres_case(params, shape, pg, admin, batch, concurrency)
                    .await
                    .map(|m| (m, None))
            }
            _ => unreachable!("the plan only holds runnable cases"),
        };
        match outcome {
            Ok((m, cpu)) => {
                progress.say(format!(
                    "  {} rows/s, ack p50 {} p99 {}{}",
                    fmt_si(m.rows_per_sec),
                    fmt_us(m.latency.p50_us),
                    fmt_us(m.latency.p99_us),
                    m.commits_per_sync
                        .map(|c| format!(", {c:.1} commits/sync"))
                        .unwrap_or_default()
                ));
                if let Some(cpu) = cpu {
                    case.cpu_us_per_row = cpu.per_row(m.rows_per_sec);
                    progress.say(format!("  CPU µs/row: {}", cpu_line(&case.cpu_us_per_row)));
                }
                case.result = Some(m);
            }
            Err(e) => {
                progress.say(format!("  FAILED: {e:#}"));
                case.error = Some(format!("{e:#}"));
            }
        }
        cases.push(case);
    }
    if let Some(tp) = &params.topics {
        let pg = postgres.as_ref().map(|(pg, _)| pg);
        let topics = crate::topics::run_cases(
            tp,
            bin,
            pg,
            params.warmup(),
            params.window(),
            &progress,
            report,
        )
        .await;
        *topic_results = topics;
    }
    if let Some((pg, admin)) = postgres {
        drop(admin);
        progress.say(format!("stopping PostgreSQL (pid {})", pg.pid()));
        tokio::task::spawn_blocking(move || drop(pg)).await?;
    }
    progress.say(format!("done in {:.0}s", progress.elapsed_s()));
    Ok(cases)
}

/// The CPU Sluice's threads used over a case's measured window, by thread, sampled from
/// `/proc` by the case's probe (the first call opens the window, the last one closes it).
#[derive(Clone)]
struct CpuWindow {
    /// The process running Sluice: this one (in-process) or the server.
    pid: u32,
    /// Whether the bench's own process is apart from Sluice's (its CPU is then reported).
    separate_bench: bool,
    samples: Arc<Mutex<(Option<CpuSample>, Option<CpuSample>)>>,
}

/// Thread groups of the CPU table: (column, prefix of the thread name). Sluice names its
/// own threads `sluice-<role>`; tokio's workers are `tokio-runtime-w…`.
const CPU_GROUPS: [(&str, &str); 3] = [
    ("writer", "sluice-writer"),
    ("tokio", "tokio-"),
    ("log", "sluice-log"),
];

impl CpuWindow {
    fn new(pid: u32, separate_bench: bool) -> CpuWindow {
        CpuWindow {
            pid,
            separate_bench,
            samples: Arc::default(),
        }
    }

    fn sample(&self) {
        let s = CpuSample::take(Some(self.pid), true);
        let mut w = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if w.0.is_none() {
            w.0 = Some(s);
        } else {
            w.1 = Some(s);
        }
    }

    /// µs of CPU per row by thread group (`writer`, `tokio`, `log`, `other` Sluice threads,
    /// and `bench` when it is a process of its own), at `rows_per_sec` over the window.
    fn per_row(&self, rows_per_sec: f64) -> BTreeMap<String, f64> {
        let w = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(first), Some(last)) = (&w.0, &w.1) else {
            return BTreeMap::new();
        };
        last.since(first)
            .us_per_op(&CPU_GROUPS, rows_per_sec, self.separate_bench)
    }
}

/// `writer 1.23, tokio 0.45, …` for the progress lines.
fn cpu_line(cpu: &BTreeMap<String, f64>) -> String {
    let order = ["writer", "tokio", "log", "other", "bench"];
    order
        .iter()
        .filter_map(|g| cpu.get(*g).map(|v| format!("{g} {v:.2}")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn api_err(e: sluice_server::CoreError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

async fn inproc_case(
    params: &Params,
    shape: workload::Shape,
    durability: Durability,
    batch: u64,
    tasks: usize,
) -> anyhow::Result<(Measured, Option<CpuWindow>)> {
    let dir = TempDir::new("inproc")?;
    let mut config = Config::new(dir.path().join("data"));
    config.durability = durability;
    if let Some(b) = params.snapshot_log_bytes {
        config.snapshot_log_bytes = b;
    }
    let core = tokio::task::spawn_blocking(move || Core::open(config))
        .await?
        .context("cannot open an in-process core")?;
    let ddl = sluice_sql::parse_ddl(shape.create_sluice())?;
    let sql = ddl
        .iter()
        .map(|d| d.sql.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    core.ddl(
        ddl.into_iter().map(|d| d.change).collect(),
        sql,
        Some(Durability::Fsync),
    )
    .await
    .map_err(api_err)?;

    let schema = core
        .db()
        .table(shape.table())
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .schema
        .clone();
    let meter = Meter::new(1);
    let workers: Vec<Worker> = (0..tasks)
        .map(|_| {
            let (meter, core, schema) = (meter.clone(), core.clone(), schema.clone());
            tokio::spawn(async move {
                let mut latency = Latency::new();
                while !meter.stopped() {
                    let first = meter.take_ids(batch);
                    // The fastest public way in: rows built typed against the table's
                    // schema on this task (what `POST /v1/mutate` decodes its body into).
                    let ops = (first..first + batch)
                        .map(|id| {
                            let values = shape.row_values(id);
                            TypedOp::Put {
                                schema: schema.clone(),
                                key: Key::Int(id as i64),
                                values,
                                if_version: None,
                                replace: false,
                            }
                        })
                        .collect();
                    let mutate = TypedMutate::from_ops(ops, Some(durability));
                    let t = Instant::now();
                    if let Err(e) = core.mutate_decoded_as(&Caller::Admin, mutate).await {
                        meter.stop();
                        return Err(api_err(e));
                    }
                    meter.acked(batch, t.elapsed(), &mut latency);
                }
                Ok(latency)
            })
        })
        .collect();
    let probe_core = core.clone();
    let cpu = CpuWindow::new(std::process::id(), false);
    let probe_cpu = cpu.clone();
    let probe: Probe = Box::new(move || {
        probe_cpu.sample();
        let counts = Counts {
            commits: probe_core.commits(),
            syncs: probe_core.syncs(),
            synced_commits: None,
            snapshots: None,
            writer_rounds: None,
        };
        Box::pin(async move { Some(counts) })
    });
    let measured = measure(&meter, workers, params.warmup(), params.window(), &probe).await;
    drop(probe);
    // Dropping the last handle closes the writer's queue: the writer, log and snapshot
    // threads finish on their own. No graceful shutdown: its final snapshot of millions
    // of rows is not what this case measures.
    // Waited for, so they neither take the next case's CPU nor lose their directory.
    drop(core);
    let gone = tokio::task::spawn_blocking(|| {
        wait_own_threads_gone(
            &["sluice-writer", "sluice-log", "sluice-snapshot"],
            Duration::from_secs(120),
        )
    })
    .await?;
    anyhow::ensure!(
        gone,
        "the core's threads still ran 120 s after it was dropped"
    );
    tokio::task::spawn_blocking(move || drop(dir)).await?;
    Ok((measured?, Some(cpu)))
}

async fn http_case(
    params: &Params,
    bin: &std::path::Path,
    shape: workload::Shape,
    durability: Durability,
    batch: u64,
    clients: usize,
) -> anyhow::Result<(Measured, Option<CpuWindow>)> {
    let mut flags = vec!["--durability".to_string(), durability.to_string()];
    if let Some(b) = params.snapshot_log_bytes {
        flags.extend(["--snapshot-log-bytes".to_string(), b.to_string()]);
    }
    let server = crate::harness::Sluice::start(bin, "http", &flags).await?;
    server.sql(shape.create_sluice()).await?;
    let url = server.url("/v1/mutate");
    let meter = Meter::new(1);
    let mut workers: Vec<Worker> = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (meter, url) = (meter.clone(), url.clone());
        // One keep-alive connection per worker, through the transfer bench's lean HTTP/1.1
        // client: the bench shares the machine's CPUs with the server it measures.
        let mut client = crate::transfer::http1::Http1::connect(
            &url,
            &crate::server::bearer(crate::server::admin_token()),
            Duration::from_secs(30),
        )
        .await?;
        workers.push(tokio::spawn(async move {
            let mut latency = Latency::new();
            let mut body = Vec::new();
            while !meter.stopped() {
                let first = meter.take_ids(batch);
                shape.write_mutate_body(first, batch, durability, &mut body);
                let t = Instant::now();
                let sent = async {
                    let (status, bytes) = client.post_json(&body).await?;
                    anyhow::ensure!(
                        (200..300).contains(&status),
                        "mutate answered {status}: {}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
                    );
                    Ok(())
                }
                .await;
                if let Err(e) = sent {
                    meter.stop();
                    return Err(e);
                }
                meter.acked(batch, t.elapsed(), &mut latency);
            }
            Ok(latency)
        }));
    }
    let cpu = CpuWindow::new(server.pid(), true);
    let server = Arc::new(server);
    let probe_server = server.clone();
    let probe_cpu = cpu.clone();
    let probe: Probe = Box::new(move || {
        probe_cpu.sample();
        let s = probe_server.clone();
        Box::pin(async move {
            let m = s.metrics().await.ok()?;
            Some(Counts {
                commits: m.get("sluice_commits_total") as u64,
                syncs: m.get("sluice_log_syncs_total") as u64,
                synced_commits: Some(m.get("sluice_log_synced_commits_total") as u64),
                snapshots: Some(m.get("sluice_snapshots_total") as u64),
                writer_rounds: Some(m.histogram("sluice_writer_round_seconds")),
            })
        })
    });
    let measured = measure(&meter, workers, params.warmup(), params.window(), &probe).await;
    drop(probe);
    // SIGKILL: a graceful stop would write a final snapshot this case does not measure.
    if let Ok(server) = Arc::try_unwrap(server) {
        tokio::task::spawn_blocking(move || server.kill9()).await?;
    }
    Ok((measured?, Some(cpu)))
}

async fn postgres_case(
    params: &Params,
    shape: workload::Shape,
    pg: &Postgres,
    admin: &tokio_postgres::Client,
    batch: u64,
    connections: usize,
) -> anyhow::Result<Measured> {
    admin
        .batch_execute(&format!("TRUNCATE {}; CHECKPOINT", shape.table()))
        .await?;
    let insert = shape.postgres_insert(batch as usize);
    let meter = Meter::new(1);
    let mut workers: Vec<Worker> = Vec::with_capacity(connections);
    for _ in 0..connections {
        let client = pg.connect().await?;
        let statement = client.prepare(&insert).await?;
        let meter = meter.clone();
        workers.push(tokio::spawn(async move {
            let mut latency = Latency::new();
            let n = batch as usize;
            while !meter.stopped() {
                let first = meter.take_ids(batch);
                if shape != workload::Shape::Events {
                    let boxed: Vec<_> = (first..first + batch)
                        .flat_map(|id| shape.postgres_params(id))
                        .collect();
                    let values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = boxed
                        .iter()
                        .map(|b| &**b as &(dyn tokio_postgres::types::ToSql + Sync))
                        .collect();
                    let t = Instant::now();
                    match client.execute(&statement, &values).await {
                        Ok(inserted) if inserted == batch => {}
                        Ok(inserted) => {
                            meter.stop();
                            anyhow::bail!("INSERT of {batch} rows inserted {inserted}");
                        }
                        Err(e) => {
                            meter.stop();
                            return Err(e.into());
                        }
                    }
                    meter.acked(batch, t.elapsed(), &mut latency);
                    continue;
                }
                let ids: Vec<i64> = (first..first + batch).map(|id| id as i64).collect();
                let rooms: Vec<String> = (first..first + batch).map(workload::room).collect();
                let authors: Vec<String> = (first..first + batch).map(workload::author).collect();
                let bodies: Vec<&str> = (first..first + batch).map(workload::body).collect();
                let tss: Vec<i64> = (first..first + batch).map(workload::ts).collect();
                let mut values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    Vec::with_capacity(n * 5);
                for r in 0..n {
                    values.extend([
                        &ids[r] as &(dyn tokio_postgres::types::ToSql + Sync),
                        &rooms[r],
                        &authors[r],
                        &bodies[r],
                        &tss[r],
                    ]);
                }
                let t = Instant::now();
                match client.execute(&statement, &values).await {
                    Ok(inserted) if inserted == batch => {}
                    Ok(inserted) => {
                        meter.stop();
                        anyhow::bail!("INSERT of {batch} rows inserted {inserted}");
                    }
                    Err(e) => {
                        meter.stop();
                        return Err(e.into());
                    }
                }
                meter.acked(batch, t.elapsed(), &mut latency);
            }
            Ok(latency)
        }));
    }
    measure(
        &meter,
        workers,
        params.warmup(),
        params.window(),
        &no_probe(),
    )
    .await
}

/// Every case of an ingest `samples.json` succeeded and acked rows.
pub fn verify_samples(samples: &serde_json::Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "samples.json has no cases");
    for c in cases {
        anyhow::ensure!(c["error"].is_null(), "a case failed: {c}");
        let rate = c["rows_per_sec"].as_f64().unwrap_or(0.0);
        anyhow::ensure!(rate > 0.0, "a case acked no rows: {c}");
        anyhow::ensure!(
            c["latency"]["p99_us"].as_u64().unwrap_or(0) > 0,
            "a case has no latencies: {c}"
        );
    }
    for kind in ["inproc", "http"] {
        anyhow::ensure!(
            cases.iter().any(|c| c["kind"] == kind),
            "no {kind} case in samples.json"
        );
    }
    Ok(())
}

fn opt_si(v: Option<f64>) -> String {
    v.map_or("—".into(), fmt_si)
}

/// The summary: targets, tables and charts for each shape (marked with it when there are
/// several), then the notes.
fn write_report(report: &mut Report, params: &Params, cases: &[Case]) {
    let multi = params.shapes.len() > 1;
    for (n, &shape) in params.shapes.iter().enumerate() {
        let of_shape: Vec<Case> = cases.iter().filter(|c| c.shape == shape).cloned().collect();
        let (targets, tables, charts) = (
            report.targets.len(),
            report.tables.len(),
            report.charts.len(),
        );
        write_shape_report(report, params, shape, &of_shape);
        if multi {
            let tag = shape_name(shape);
            for t in &mut report.targets[targets..] {
                t.what = format!("{} — `{tag}` rows", t.what);
            }
            for t in &mut report.tables[tables..] {
                t.title = format!("{} — `{tag}` rows", t.title);
            }
            for (file, caption, _) in &mut report.charts[charts..] {
                if n > 0 {
                    *file = format!("{tag}_{file}");
                }
                *caption = format!("{caption} (`{tag}` rows)");
            }
        }
    }
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.label(),
            c.error.as_deref().unwrap_or_default()
        ));
    }
    if !params.peers {
        report
            .notes
            .push("PostgreSQL peer skipped (--no-peers).".into());
    }
    crate::harness::standard_notes(report, params.quick);
    report.samples = json!({ "suite": "ingest", "params": params, "cases": cases });
}

fn write_shape_report(
    report: &mut Report,
    params: &Params,
    shape: workload::Shape,
    cases: &[Case],
) {
    let find = |kind: &str, class: &str, pred: &dyn Fn(&Case) -> bool| {
        cases
            .iter()
            .find(|c| c.kind == kind && c.class == class && pred(c))
            .and_then(Case::rows_per_sec)
    };
    report.intro.push(format!(
        "`--shape {}`: inserts of {} into an empty table. Each case: {:.2}s warm-up, then \
         {:.1}s measured; closed loop (every client waits for its ack before sending again). \
         Clients and server share this machine's CPUs.",
        shape_name(shape),
        shape.describe(),
        params.warmup_seconds,
        params.seconds
    ));

    // Targets.
    let batched_inproc = cases
        .iter()
        .filter(|c| c.kind == "inproc" && c.batch >= 100)
        .filter_map(|c| c.rows_per_sec().map(|r| (r, c)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    report.targets.push(Target {
        what: "in-process apply + log, batched (≥ 100 rows/mutate), best class".into(),
        goal: format!("≥ {} rows/s", fmt_si(TARGET_INPROC_ROWS_PER_SEC)),
        measured: batched_inproc.map_or("not measured".into(), |(r, c)| {
            format!(
                "{} rows/s ({}, {} rows/mutate)",
                fmt_si(r),
                c.class,
                c.batch
            )
        }),
        met: batched_inproc.map(|(r, _)| r >= TARGET_INPROC_ROWS_PER_SEC),
    });
    let http_disk = cases
        .iter()
        .filter(|c| c.kind == "http" && c.class == "disk")
        .filter_map(|c| c.rows_per_sec().map(|r| (r, c)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    report.targets.push(Target {
        what: format!(
            "HTTP, disk class, {} rows/request, best client count",
            params.batch
        ),
        goal: format!("≥ {} rows/s", fmt_si(TARGET_HTTP_DISK_ROWS_PER_SEC)),
        measured: http_disk.map_or("not measured".into(), |(r, c)| {
            format!("{} rows/s ({} clients)", fmt_si(r), c.concurrency)
        }),
        met: http_disk.map(|(r, _)| r >= TARGET_HTTP_DISK_ROWS_PER_SEC),
    });
    let share_clients = if params.clients.contains(&TARGET_FSYNC_CLIENTS) {
        Some(TARGET_FSYNC_CLIENTS)
    } else {
        params.clients.iter().copied().max()
    };
    let share = share_clients.and_then(|n| {
        let f = find("http", "fsync", &|c| c.concurrency == n)?;
        let d = find("http", "disk", &|c| c.concurrency == n)?;
        Some((n, f, d))
    });
    report.targets.push(Target {
        what: format!(
            "HTTP fsync class vs disk class, {} clients",
            share_clients.unwrap_or(TARGET_FSYNC_CLIENTS)
        ),
        goal: format!("≥ {:.0}% of disk", TARGET_FSYNC_SHARE_OF_DISK * 100.0),
        measured: share.map_or("not measured".into(), |(_, f, d)| {
            format!(
                "{:.0}% ({} vs {} rows/s)",
                100.0 * f / d,
                fmt_si(f),
                fmt_si(d)
            )
        }),
        // Only judged at the client count the goal is stated for.
        met: share
            .filter(|&(n, _, _)| n == TARGET_FSYNC_CLIENTS)
            .map(|(_, f, d)| f / d >= TARGET_FSYNC_SHARE_OF_DISK),
    });
    // Disk class over PostgreSQL at the client count where sluice does best.
    let over_pg = params
        .clients
        .iter()
        .filter_map(|&n| {
            let pg = find("postgres", "synchronous_commit=on", &|c| c.concurrency == n)?;
            let d = find("http", "disk", &|c| c.concurrency == n)?;
            Some((n, d / pg, d, pg))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    report.targets.push(Target {
        what: "sluice HTTP disk class / PostgreSQL batched INSERT, same clients, best count".into(),
        goal: format!("≥ {}", fmt_ratio(TARGET_HTTP_DISK_OVER_POSTGRES)),
        measured: over_pg.map_or("not measured".into(), |(n, r, d, pg)| {
            format!(
                "{} ({} vs {} rows/s, {n} clients)",
                fmt_ratio_against(r, TARGET_HTTP_DISK_OVER_POSTGRES),
                fmt_si(d),
                fmt_si(pg)
            )
        }),
        met: over_pg.map(|(_, r, _, _)| r >= TARGET_HTTP_DISK_OVER_POSTGRES),
    });
    for &n in &params.clients {
        let Some(pg) = find("postgres", "synchronous_commit=on", &|c| c.concurrency == n) else {
            continue;
        };
        let ratios: Vec<String> = params
            .classes
            .iter()
            .filter_map(|class| {
                find("http", class, &|c| c.concurrency == n)
                    .map(|s| format!("{class} {}", fmt_ratio(s / pg)))
            })
            .collect();
        report.targets.push(Target {
            what: format!("sluice HTTP / PostgreSQL rows/s, {n} clients"),
            goal: "reported".into(),
            measured: ratios.join(", "),
            met: None,
        });
    }

    // Tables.
    let mut t = Table::new(
        "In-process apply + log (Core on a temp dir, no HTTP)",
        &[
            "class",
            "rows/mutate",
            "tasks",
            "rows/s",
            "commits/s",
            "syncs/s",
            "commits/sync",
            "ack p50",
            "ack p99",
        ],
    );
    for c in cases.iter().filter(|c| c.kind == "inproc") {
        t.row(case_cells(
            c,
            &[
                c.class.to_string(),
                c.batch.to_string(),
                c.concurrency.to_string(),
            ],
            |m| {
                vec![
                    fmt_si(m.rows_per_sec),
                    opt_si(m.commits_per_sec),
                    opt_si(m.syncs_per_sec),
                    m.commits_per_sync.map_or("—".into(), |x| format!("{x:.1}")),
                    fmt_us(m.latency.p50_us),
                    fmt_us(m.latency.p99_us),
                ]
            },
        ));
    }
    t.note = Some(
        "syncs/s for memory and disk are the log's background syncs (about one a second). \
         The tasks build their rows as typed values against the table's schema \
         (`TypedMutate::from_ops`, the fastest public way in: what `POST /v1/mutate` decodes \
         its JSON body into on the request's task); that CPU is part of the measurement. \
         Before the typed decoder, these tasks built JSON maps converted on the writer."
            .into(),
    );
    if !t.rows.is_empty() {
        report.tables.push(t);
    }
    let mut t = Table::new(
        format!(
            "HTTP: real `sluice serve`, {} rows/request, keep-alive clients",
            params.batch
        ),
        &[
            "class",
            "clients",
            "rows/s",
            "requests/s",
            "ack p50",
            "ack p99",
            "syncs/s",
            "commits/sync",
            "snapshots",
        ],
    );
    for c in cases.iter().filter(|c| c.kind == "http") {
        t.row(case_cells(
            c,
            &[c.class.to_string(), c.concurrency.to_string()],
            |m| {
                vec![
                    fmt_si(m.rows_per_sec),
                    fmt_si(m.requests_per_sec),
                    fmt_us(m.latency.p50_us),
                    fmt_us(m.latency.p99_us),
                    opt_si(m.syncs_per_sec),
                    m.commits_per_sync.map_or("—".into(), |x| format!("{x:.1}")),
                    m.snapshots.map_or("—".into(), |s| s.to_string()),
                ]
            },
        ));
    }
    t.note = Some(
        "syncs/s and commits/sync from /metrics before and after the window \
         (fsync class: commits whose ack waited for a sync, per sync)."
            .into(),
    );
    if !t.rows.is_empty() {
        report.tables.push(t);
    }
    if let Some(t) = cpu_table(cases) {
        report.tables.push(t);
    }
    let mut t = Table::new(
        format!(
            "PostgreSQL peer (synchronous_commit=on, fsync=on), prepared {}-row INSERT",
            params.batch
        ),
        &["connections", "rows/s", "INSERTs/s", "ack p50", "ack p99"],
    );
    for c in cases.iter().filter(|c| c.kind == "postgres") {
        t.row(case_cells(c, &[c.concurrency.to_string()], |m| {
            vec![
                fmt_si(m.rows_per_sec),
                fmt_si(m.requests_per_sec),
                fmt_us(m.latency.p50_us),
                fmt_us(m.latency.p99_us),
            ]
        }));
    }
    if !t.rows.is_empty() {
        report.tables.push(t);
    }
    let mut headers = vec!["clients".to_string(), "postgres rows/s".to_string()];
    for class in &params.classes {
        headers.push(format!("sluice {class} rows/s"));
        headers.push(format!("{class} / postgres"));
    }
    let mut ratio_table = Table {
        title: "Sluice over HTTP vs PostgreSQL, same rows, same client count".into(),
        headers,
        ..Table::default()
    };
    for &n in &params.clients {
        let Some(pg) = find("postgres", "synchronous_commit=on", &|c| c.concurrency == n) else {
            continue;
        };
        let mut row = vec![n.to_string(), fmt_si(pg)];
        for class in &params.classes {
            let s = find("http", class, &|c| c.concurrency == n);
            row.push(opt_si(s));
            row.push(s.map_or("—".into(), |s| fmt_ratio(s / pg)));
        }
        ratio_table.row(row);
    }
    ratio_table.note = Some(
        "Durability: sluice fsync ≈ PostgreSQL synchronous_commit=on (acked after fdatasync); \
         sluice disk survives a process crash but not power loss."
            .into(),
    );
    if !ratio_table.rows.is_empty() {
        report.tables.push(ratio_table);
    }

    // Charts.
    let client_labels: Vec<String> = params
        .clients
        .iter()
        .map(|c| format!("{c} clients"))
        .collect();
    let series_of = |metric: &dyn Fn(&Measured) -> f64| -> Vec<BarSeries> {
        let mut s: Vec<BarSeries> = params
            .classes
            .iter()
            .map(|class| BarSeries {
                name: format!("sluice {class}"),
                values: params
                    .clients
                    .iter()
                    .map(|&n| {
                        cases
                            .iter()
                            .find(|c| c.kind == "http" && c.class == *class && c.concurrency == n)
                            .and_then(|c| c.result.as_ref())
                            .map(metric)
                    })
                    .collect(),
            })
            .collect();
        if cases.iter().any(|c| c.kind == "postgres") {
            s.push(BarSeries {
                name: "postgres".into(),
                values: params
                    .clients
                    .iter()
                    .map(|&n| {
                        cases
                            .iter()
                            .find(|c| c.kind == "postgres" && c.concurrency == n)
                            .and_then(|c| c.result.as_ref())
                            .map(metric)
                    })
                    .collect(),
            });
        }
        s
    };
    let rows_series = series_of(&|m| m.rows_per_sec);
    let p99_series = series_of(&|m| m.latency.p99_us as f64 / 1e3);
    if cases
        .iter()
        .any(|c| c.kind == "http" || c.kind == "postgres")
    {
        let chart = BarChart {
            title: format!(
                "Ingest rows/s over the network, {} rows/request",
                params.batch
            ),
            x_label: "concurrent clients".into(),
            y_label: "rows/s".into(),
            categories: client_labels.clone(),
            series: rows_series,
        };
        report.chart("rows_per_sec.svg", "rows/s by client count", chart.render());
        let chart = BarChart {
            title: "Ack latency p99 (ms)".into(),
            x_label: "concurrent clients".into(),
            y_label: "p99 ack latency, ms".into(),
            categories: client_labels,
            series: p99_series,
        };
        report.chart("ack_p99.svg", "ack p99 by client count", chart.render());
    }
    if cases.iter().any(|c| c.kind == "inproc") {
        let chart = BarChart {
            title: format!(
                "In-process apply + log rows/s, {} tasks",
                params.inproc_tasks
            ),
            x_label: "rows per mutate".into(),
            y_label: "rows/s".into(),
            categories: params
                .inproc_batches
                .iter()
                .map(|b| b.to_string())
                .collect(),
            series: params
                .classes
                .iter()
                .map(|class| BarSeries {
                    name: (*class).to_string(),
                    values: params
                        .inproc_batches
                        .iter()
                        .map(|&b| find("inproc", class, &|c| c.batch == b))
                        .collect(),
                })
                .collect(),
        };
        report.chart(
            "inprocess_rows_per_sec.svg",
            "in-process rows/s by batch size",
            chart.render(),
        );
    }
    if let Some(&n) = params.clients.iter().max() {
        let series: Vec<LineSeries> = cases
            .iter()
            .filter(|c| (c.kind == "http" || c.kind == "postgres") && c.concurrency == n)
            .filter_map(|c| {
                let m = c.result.as_ref()?;
                Some(LineSeries {
                    name: if c.kind == "http" {
                        format!("sluice {}", c.class)
                    } else {
                        "postgres".into()
                    },
                    points: m.per_second.iter().map(|s| (s.t, s.rows_per_sec)).collect(),
                })
            })
            .collect();
        if !series.is_empty() {
            let chart = LineChart {
                title: format!("rows/s over time, {n} clients"),
                x_label: "seconds into the measured window".into(),
                y_label: "rows/s".into(),
                series,
            };
            report.chart(
                "timeline.svg",
                "per-second rows/s at the largest client count",
                chart.render(),
            );
        }
    }
}

/// µs of CPU per row by thread for the Sluice cases: where a row's cost goes (the single
/// writer against the request tasks, the log and, over HTTP, the bench's own clients).
fn cpu_table(cases: &[Case]) -> Option<Table> {
    let mut t = Table::new(
        "Where the CPU went: µs of CPU per row, by thread (measured window)",
        &[
            "case",
            "rows/s",
            "writer",
            "tokio",
            "log",
            "other sluice",
            "bench clients",
            "total",
        ],
    );
    for c in cases.iter().filter(|c| !c.cpu_us_per_row.is_empty()) {
        let Some(m) = &c.result else { continue };
        let label = match c.kind {
            "inproc" => format!("in-process {}, {} rows/mutate", c.class, c.batch),
            _ => format!("HTTP {}, {} clients", c.class, c.concurrency),
        };
        let mut row = vec![label, fmt_si(m.rows_per_sec)];
        for g in ["writer", "tokio", "log", "other", "bench"] {
            row.push(
                c.cpu_us_per_row
                    .get(g)
                    .map_or("—".into(), |v| format!("{v:.2}")),
            );
        }
        let total: f64 = c.cpu_us_per_row.values().sum();
        row.push(format!("{total:.2}"));
        t.row(row);
    }
    t.note = Some(
        "CPU time from /proc by thread name (threads under 0.005 core left out) over the \
         measured window, divided by the rows acked in it. In-process, the tokio threads run \
         both the tasks that build the rows and the core's request side; over HTTP, `tokio` \
         is the server's request handling (body decode, reply) and `bench clients` the whole \
         bench process (building bodies, its lean HTTP/1.1 client `transfer/http1.rs`). \
         Everything shares this machine's CPUs: a total of 2 µs per row caps two cores at \
         1 M rows/s."
            .into(),
    );
    (!t.rows.is_empty()).then_some(t)
}

/// The identity cells of a case followed by its measurement cells, or `failed` cells.
fn case_cells(c: &Case, id: &[String], cells: impl Fn(&Measured) -> Vec<String>) -> Vec<String> {
    let mut row = id.to_vec();
    match &c.result {
        Some(m) => row.extend(cells(m)),
        None => {
            let n = cells(&Measured {
                seconds: 0.0,
                rows: 0,
                requests: 0,
                rows_per_sec: 0.0,
                requests_per_sec: 0.0,
                commits_per_sec: None,
                syncs_per_sec: None,
                commits_per_sync: None,
                snapshots: None,
                writer_rounds: None,
                latency: Default::default(),
                per_second: Vec::new(),
            })
            .len();
            row.push("failed".into());
            row.extend(std::iter::repeat_n("—".to_string(), n - 1));
        }
    }
    row
}

/// Waits (up to `limit`) until no thread of this process is named one of `names`;
/// whether they were all gone in time. An in-process case uses it so that threads of its
/// dropped core (a snapshot of millions of rows still being written) neither take CPU from
/// the next case nor see their data directory removed under them.
fn wait_own_threads_gone(names: &[&str], limit: std::time::Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if sluice_sched::own_threads_named(names).is_ok_and(|t| t.is_empty()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_threads_ends_when_they_end() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (running, started) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("bench-wait-test".into())
            .spawn(move || {
                let _ = running.send(());
                let _ = stopped.recv();
            })
            .unwrap();
        // A new thread names itself once it runs.
        started.recv().unwrap();
        let limit = std::time::Duration::from_millis(50);
        assert!(!wait_own_threads_gone(&["bench-wait-test"], limit));
        drop(stop);
        t.join().unwrap();
        assert!(wait_own_threads_gone(&["bench-wait-test"], limit));
    }
}
