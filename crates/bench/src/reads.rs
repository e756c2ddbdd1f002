//! `sluice bench reads`: point reads by primary key and through a secondary index —
//! in-process ([`Core::get_row`] / [`Core::find_rows`], the same code the server runs per
//! read), over HTTP (`GET /v1/tables/items/rows/{id}`, keep-alive) and over the WebSocket
//! `get` request (pipelined, JSON and MessagePack) — with no writes and with an open-loop
//! background writer (a fixed rate of row patches, default 100 K rows/s); next to Redis
//! `GET` / `HGETALL` and PostgreSQL prepared `SELECT … WHERE id = $1` (and `WHERE code =
//! $1` through an index), pipelined likewise, over the same rows.
//!
//! Every read is checked: the row returned must be the one asked for (its `id` and its
//! `code`); a case with any mismatch fails the run. Latencies are per read, from the
//! request leaving the client to its reply being parsed, in nanoseconds. The batched cases
//! — WebSocket `get` by `keys` (MessagePack) and Redis `MGET`, `batch_keys` keys per
//! request — count every row returned as a read (each checked, in order) and time each
//! request.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{FutureExt, SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_engine::{Key, Value as Cell};
use sluice_log::Durability;
use sluice_server::decode::{TypedMutate, TypedOp};
use sluice_server::point::{Given, IndexBy, IndexLookup};
use sluice_server::{Caller, Config, Core};
use tokio_tungstenite::tungstenite::Message;

use crate::harness::Bench;
use crate::hist::{fmt_ratio, fmt_si};
use crate::peers::{postgres, redis, resp};
use crate::report::{Table, Target};
use crate::svg::{BarChart, BarSeries};
use crate::sys::TempDir;
use crate::CommonArgs;

/// Goal (issue 13): in-process point read by key, p50.
const TARGET_INPROC_P50_NS: u64 = 1_000;
/// Goal (issue 13): WebSocket pipelined point reads per second.
const TARGET_WS_READS_PER_SEC: f64 = 1e6;

const DDL: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY, code TEXT NOT NULL, \
    name TEXT NOT NULL, n INTEGER NOT NULL); CREATE INDEX items_code ON items (code)";

#[derive(clap::Args, Debug, Clone)]
pub struct ReadsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows in the table (and keys in Redis, rows in PostgreSQL).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Seconds measured per case (after a short warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Pipelined connections (WebSocket, Redis, PostgreSQL).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight per pipelined connection.
    #[arg(long, default_value_t = 128)]
    pub depth: usize,
    /// Concurrent keep-alive HTTP clients (one request at a time each).
    #[arg(long, default_value_t = 16)]
    pub http_clients: usize,
    /// Rows patched per second by the open-loop background writer (0: no such cases).
    #[arg(long, default_value_t = 100_000)]
    pub background_writes: u64,
    /// Skip Redis and PostgreSQL.
    #[arg(long)]
    pub no_peers: bool,
    /// Directory holding PostgreSQL's `initdb` and `postgres` (default: `$PG_BIN`, else
    /// the newest /usr/lib/postgresql/*/bin).
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
    /// Seed of the keys read.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keys per batched request (WebSocket `get` by `keys`, Redis `MGET`).
    #[arg(long, default_value_t = 100)]
    pub batch_keys: usize,
    /// Batched requests in flight per connection.
    #[arg(long, default_value_t = 8)]
    pub batch_depth: usize,
}

#[derive(Clone, Debug, Serialize)]
struct Params {
    rows: u64,
    seconds: f64,
    warmup_seconds: f64,
    connections: usize,
    depth: usize,
    http_clients: usize,
    background_writes: u64,
    /// Rows per background mutate (one commit each).
    background_batch: u64,
    peers: bool,
    seed: u64,
    /// Keys per batched request and batched requests in flight per connection.
    batch_keys: usize,
    batch_depth: usize,
}

/// Rows per background mutate (so 100 K rows/s is 10 K commits/s).
const BACKGROUND_BATCH: u64 = 10;

impl Params {
    fn from(a: &ReadsArgs) -> Params {
        // A quick run caps every size at a smoke-test value.
        fn capped<T: PartialOrd>(quick: bool, value: T, cap: T) -> T {
            if quick && value > cap {
                cap
            } else {
                value
            }
        }
        let quick = a.common.quick;
        Params {
            rows: capped(quick, a.rows, 5_000),
            seconds: capped(quick, a.seconds, 0.3),
            warmup_seconds: if quick { 0.05 } else { 0.5 },
            connections: capped(quick, a.connections, 2),
            depth: capped(quick, a.depth, 16),
            http_clients: capped(quick, a.http_clients, 2),
            background_writes: capped(quick, a.background_writes, 2_000),
            background_batch: BACKGROUND_BATCH,
            peers: !a.no_peers,
            seed: a.seed,
            batch_keys: capped(quick, a.batch_keys, 20),
            batch_depth: capped(quick, a.batch_depth, 4),
        }
    }

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_seconds)
    }

    /// The path label of the batched cases (`what`: `WS MessagePack batched get`, `MGET`).
    fn batched(&self, what: &str) -> String {
        format!(
            "{what} ({} keys per request, {} in flight)",
            self.batch_keys, self.batch_depth
        )
    }

    fn backgrounds(&self) -> Vec<u64> {
        if self.background_writes > 0 {
            vec![0, self.background_writes]
        } else {
            vec![0]
        }
    }
}

/// The `code` of row `id` (the indexed column).
fn code(id: u64) -> String {
    format!("c{id:09}")
}

/// A small seeded generator of the keys read (xorshift64*).
#[derive(Clone)]
struct Keys {
    state: u64,
    rows: u64,
}

impl Keys {
    fn new(seed: u64, stream: u64, rows: u64) -> Keys {
        Keys {
            state: (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (stream + 1)).max(1),
            rows,
        }
    }
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.rows
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Lookup {
    Key,
    Index,
}

impl Lookup {
    fn label(self) -> &'static str {
        match self {
            Lookup::Key => "by key",
            Lookup::Index => "by index",
        }
    }
}

/// What one reader saw: latencies (ns), reads, mismatches (and the first one).
struct Tally {
    latency: Histogram<u64>,
    reads: u64,
    mismatches: u64,
    first_mismatch: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid bounds"),
            reads: 0,
            mismatches: 0,
            first_mismatch: None,
        }
    }
    fn record(&mut self, took: Duration, measuring: bool) {
        self.record_batch(took, 1, measuring);
    }
    /// A request that read `rows` rows: they count as reads; its latency is the request's.
    fn record_batch(&mut self, took: Duration, rows: u64, measuring: bool) {
        if measuring {
            self.reads += rows;
            let _ = self.latency.record((took.as_nanos() as u64).max(1));
        }
    }
    fn mismatch(&mut self, what: impl FnOnce() -> String) {
        self.mismatches += 1;
        if self.first_mismatch.is_none() {
            self.first_mismatch = Some(what());
        }
    }
    fn merge(&mut self, other: Tally) {
        let _ = self.latency.add(&other.latency);
        self.reads += other.reads;
        self.mismatches += other.mismatches;
        if self.first_mismatch.is_none() {
            self.first_mismatch = other.first_mismatch;
        }
    }
}

/// The phases of a reader: warm-up, measured window, then stop.
#[derive(Clone)]
struct Clock {
    measure_from: Instant,
    stop_at: Instant,
}

impl Clock {
    fn new(p: &Params) -> Clock {
        let measure_from = Instant::now() + p.warmup();
        Clock {
            measure_from,
            stop_at: measure_from + p.window(),
        }
    }
    fn measuring(&self, at: Instant) -> bool {
        at >= self.measure_from
    }
    fn done(&self, at: Instant) -> bool {
        at >= self.stop_at
    }
}

/// One case as measured.
#[derive(Clone, Debug, Serialize)]
struct Case {
    system: &'static str,
    path: String,
    lookup: Lookup,
    /// Rows/s the background writer was asked for.
    background_target: u64,
    /// Rows/s it got acknowledged during the window.
    background_achieved: f64,
    reads: u64,
    seconds: f64,
    reads_per_sec: f64,
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    mismatches: u64,
    error: Option<String>,
}

impl Case {
    fn new(system: &'static str, path: &str, lookup: Lookup, background: u64) -> Case {
        Case {
            system,
            path: path.to_string(),
            lookup,
            background_target: background,
            background_achieved: 0.0,
            reads: 0,
            seconds: 0.0,
            reads_per_sec: 0.0,
            p50_ns: 0,
            p99_ns: 0,
            p999_ns: 0,
            mismatches: 0,
            error: None,
        }
    }

    fn fill(&mut self, tally: &Tally, seconds: f64) {
        self.reads = tally.reads;
        self.seconds = seconds;
        self.reads_per_sec = tally.reads as f64 / seconds.max(1e-9);
        self.p50_ns = tally.latency.value_at_quantile(0.5);
        self.p99_ns = tally.latency.value_at_quantile(0.99);
        self.p999_ns = tally.latency.value_at_quantile(0.999);
        self.mismatches = tally.mismatches;
        if tally.mismatches > 0 {
            self.error = Some(format!(
                "{} reads returned another row than asked for (first: {})",
                tally.mismatches,
                tally.first_mismatch.as_deref().unwrap_or("?")
            ));
        } else if tally.reads == 0 {
            self.error = Some("no read completed in the window".into());
        }
    }

    fn label(&self) -> String {
        format!("{} {} {}", self.system, self.path, self.lookup.label())
    }
}

pub fn run(args: ReadsArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(args.rows >= 10, "--rows must be at least 10");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        (1..=256).contains(&args.connections) && (1..=4096).contains(&args.depth),
        "--connections must be 1..=256 and --depth 1..=4096"
    );
    anyhow::ensure!(
        (1..=1024).contains(&args.http_clients),
        "--http-clients must be 1..=1024"
    );
    anyhow::ensure!(
        (1..=sluice_server::point::GET_KEYS_MAX).contains(&args.batch_keys)
            && (1..=1024).contains(&args.batch_depth),
        "--batch-keys must be 1..={} (get_keys_max) and --batch-depth 1..=1024",
        sluice_server::point::GET_KEYS_MAX
    );
    let params = Params::from(&args);
    let mut bench = Bench::new("reads", &args.common, &params)?;
    let pg_bin = if params.peers {
        Some(postgres::find_bin_dir(args.pg_bin.as_deref())?)
    } else {
        None
    };
    let redis_bin = if params.peers {
        Some(redis::find_bin()?)
    } else {
        None
    };
    let runtime = crate::harness::runtime()?;
    let mut cases = Vec::new();
    runtime.block_on(async {
        bench.progress.say("in-process");
        inproc_cases(&params, &mut cases).await;
        bench.progress.say("sluice serve");
        server_cases(&bench, &params, &mut cases).await;
        if let Some(bin) = &redis_bin {
            bench.progress.say("redis");
            match redis_cases(&params, bin, &mut cases).await {
                Ok(version) => {
                    bench
                        .report
                        .run_extra
                        .insert("redis_version".into(), version.into());
                }
                Err(e) => {
                    let mut c = Case::new("redis", "GET", Lookup::Key, 0);
                    c.error = Some(format!("{e:#}"));
                    cases.push(c);
                }
            }
        }
        if let Some(dir) = &pg_bin {
            bench.progress.say("postgresql");
            match postgres_cases(&params, dir, &mut cases).await {
                Ok(version) => {
                    bench
                        .report
                        .run_extra
                        .insert("postgres_version".into(), version.into());
                }
                Err(e) => {
                    let mut c = Case::new("postgresql", "prepared SELECT", Lookup::Key, 0);
                    c.error = Some(format!("{e:#}"));
                    cases.push(c);
                }
            }
        }
    });
    drop(runtime);
    let failed = cases.iter().filter(|c| c.error.is_some()).count();
    write_report(&mut bench, &params, &cases);
    bench.finish(failed)
}

// ---------------------------------------------------------------------------------------
// In-process

async fn inproc_cases(p: &Params, cases: &mut Vec<Case>) {
    let opened = open_core(p).await;
    let (core, _dir) = match opened {
        Ok(c) => c,
        Err(e) => {
            let mut c = Case::new("sluice", "in-process", Lookup::Key, 0);
            c.error = Some(format!("{e:#}"));
            cases.push(c);
            return;
        }
    };
    for background in p.backgrounds() {
        for lookup in [Lookup::Key, Lookup::Index] {
            let mut case = Case::new("sluice", "in-process", lookup, background);
            let writer = InprocWriter::start(&core, p, background);
            let started = Instant::now();
            let clock = Clock::new(p);
            let tally = inproc_reader(&core, p, lookup, clock.clone()).await;
            let seconds = clock
                .stop_at
                .duration_since(clock.measure_from)
                .as_secs_f64();
            case.fill(&tally, seconds);
            case.background_achieved = writer.stop(started.elapsed()).await;
            cases.push(case);
        }
    }
    let _ = core.shutdown().await;
}

async fn open_core(p: &Params) -> anyhow::Result<(Core, TempDir)> {
    let dir = TempDir::new("reads-inproc")?;
    let config = Config::new(dir.path().join("data"));
    let core = tokio::task::spawn_blocking(move || Core::open(config))
        .await?
        .context("cannot open an in-process core")?;
    let ddl = sluice_sql::parse_ddl(DDL)?;
    core.ddl(
        ddl.into_iter().map(|d| d.change).collect(),
        DDL.into(),
        None,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let schema = core
        .db()
        .table("items")
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .schema
        .clone();
    let mut id = 0;
    while id < p.rows {
        let end = (id + 10_000).min(p.rows);
        let ops = (id..end)
            .map(|i| TypedOp::Put {
                schema: schema.clone(),
                key: Key::Int(i as i64),
                values: vec![
                    Cell::Integer(i as i64),
                    Cell::Text(code(i).into()),
                    Cell::Text(format!("name {i}").into()),
                    Cell::Integer(0),
                ]
                .into(),
                if_version: None,
                replace: false,
            })
            .collect();
        core.mutate_decoded_as(
            &Caller::Admin,
            TypedMutate::from_ops(ops, Some(Durability::Memory)),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        id = end;
    }
    Ok((core, dir))
}

/// One reader on this task, one read at a time, as an in-process caller would read.
async fn inproc_reader(core: &Core, p: &Params, lookup: Lookup, clock: Clock) -> Tally {
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, 0, p.rows);
    let admin = Caller::Admin;
    let mut i = 0u64;
    loop {
        let id = keys.next();
        // Timed: the read and its confirmation; checked after.
        let (took, ok) = match lookup {
            Lookup::Key => {
                let key = Key::Int(id as i64);
                let t = Instant::now();
                let read = core.get_row(&admin, "items", Given::Typed(&key));
                let outcome = match read.now() {
                    Ok(outcome) => outcome,
                    Err(read) => read.confirmed(core).await,
                };
                let took = t.elapsed();
                let ok = outcome.is_ok_and(|got| got.row.is_some_and(|r| row_is(&r.values, id)));
                (took, ok)
            }
            Lookup::Index => {
                let value = Cell::Text(code(id).into());
                let lookup = IndexLookup {
                    by: IndexBy::Column("code"),
                    value: Given::Typed(&value),
                    after: None,
                    limit: 10,
                };
                let t = Instant::now();
                let read = core.find_rows(&admin, "items", lookup);
                let outcome = match read.now() {
                    Ok(outcome) => outcome,
                    Err(read) => read.confirmed(core).await,
                };
                let took = t.elapsed();
                let ok = outcome
                    .is_ok_and(|found| found.rows.len() == 1 && row_is(&found.rows[0].values, id));
                (took, ok)
            }
        };
        let now = Instant::now();
        if !ok {
            tally.mismatch(|| format!("in-process read of id {id}"));
        }
        tally.record(took, clock.measuring(now));
        i += 1;
        // Yield now and then so the background writer's tasks run on this runtime too.
        if i.is_multiple_of(256) {
            if clock.done(now) {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
    tally
}

/// Whether `values` is row `id`: its `id` and its `code`.
fn row_is(values: &[Cell], id: u64) -> bool {
    let id_ok = matches!(values.first(), Some(Cell::Integer(i)) if *i == id as i64);
    let code_ok = matches!(values.get(1), Some(Cell::Text(c)) if **c == *code(id));
    id_ok && code_ok
}

/// The open-loop background writer of the in-process cases: every millisecond it starts
/// the mutates of that millisecond (patches of `n` on random rows) without waiting for
/// earlier ones, at most `INFLIGHT_MAX` at once (past that, ticks are skipped and the
/// achieved rate says so).
struct InprocWriter {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

const BACKGROUND_INFLIGHT_MAX: usize = 4096;

impl InprocWriter {
    fn start(core: &Core, p: &Params, rows_per_sec: u64) -> InprocWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        if rows_per_sec == 0 {
            return InprocWriter {
                stop,
                acked,
                task: None,
            };
        }
        let (core, rows, seed) = (core.clone(), p.rows, p.seed);
        let (stop2, acked2) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            let schema = match core.db().table("items") {
                Ok(t) => t.schema.clone(),
                Err(_) => return,
            };
            let gate = Arc::new(tokio::sync::Semaphore::new(BACKGROUND_INFLIGHT_MAX));
            let mut keys = Keys::new(seed, 999, rows);
            let mut ticker = tokio::time::interval(Duration::from_millis(1));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut owed = 0.0f64;
            let mut value = 0i64;
            while !stop2.load(Ordering::Relaxed) {
                ticker.tick().await;
                owed += rows_per_sec as f64 / 1000.0 / BACKGROUND_BATCH as f64;
                while owed >= 1.0 {
                    owed -= 1.0;
                    let Ok(permit) = gate.clone().try_acquire_owned() else {
                        continue;
                    };
                    value += 1;
                    let ops = (0..BACKGROUND_BATCH)
                        .map(|_| TypedOp::Patch {
                            schema: schema.clone(),
                            key: Key::Int(keys.next() as i64),
                            set: vec![(3, Cell::Integer(value))],
                            if_version: None,
                        })
                        .collect();
                    let (core, acked) = (core.clone(), acked2.clone());
                    tokio::spawn(async move {
                        let m = TypedMutate::from_ops(ops, None);
                        if core.mutate_decoded_as(&Caller::Admin, m).await.is_ok() {
                            acked.fetch_add(BACKGROUND_BATCH, Ordering::Relaxed);
                        }
                        drop(permit);
                    });
                }
            }
        });
        InprocWriter {
            stop,
            acked,
            task: Some(task),
        }
    }

    /// Stops it; the rows/s acknowledged over `elapsed`.
    async fn stop(mut self, elapsed: Duration) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.acked.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-9)
    }
}

// ---------------------------------------------------------------------------------------
// The server: HTTP and WebSocket

async fn server_cases(bench: &Bench, p: &Params, cases: &mut Vec<Case>) {
    let server = match start_server(bench, p).await {
        Ok(s) => s,
        Err(e) => {
            let mut c = Case::new("sluice", "server", Lookup::Key, 0);
            c.error = Some(format!("{e:#}"));
            cases.push(c);
            return;
        }
    };
    let paths: [(&str, Option<bool>); 3] = [
        ("HTTP", None),
        ("WS JSON", Some(false)),
        ("WS MessagePack", Some(true)),
    ];
    for background in p.backgrounds() {
        for (path, ws) in paths {
            for lookup in [Lookup::Key, Lookup::Index] {
                let mut case = Case::new("sluice", path, lookup, background);
                let writer = match WsWriter::start(&server, p, background).await {
                    Ok(w) => w,
                    Err(e) => {
                        case.error = Some(format!("background writer: {e:#}"));
                        cases.push(case);
                        continue;
                    }
                };
                let started = Instant::now();
                let clock = Clock::new(p);
                let result = match ws {
                    None => http_readers(&server, p, lookup, clock.clone()).await,
                    Some(msgpack) => ws_readers(&server, p, lookup, msgpack, clock.clone()).await,
                };
                let seconds = clock
                    .stop_at
                    .duration_since(clock.measure_from)
                    .as_secs_f64();
                match result {
                    Ok(tally) => case.fill(&tally, seconds),
                    Err(e) => case.error = Some(format!("{e:#}")),
                }
                match writer.stop(started.elapsed()).await {
                    Ok(rate) => case.background_achieved = rate,
                    Err(e) => case.error = Some(format!("background writer: {e:#}")),
                }
                cases.push(case);
            }
        }
        cases.push(batched_case(&server, p, background).await);
    }
}

async fn start_server(bench: &Bench, p: &Params) -> anyhow::Result<crate::harness::Sluice> {
    let server = bench.sluice("reads", &[]).await?;
    server.sql(DDL).await?;
    let http = reqwest::Client::builder()
        .default_headers(crate::server::auth_headers())
        .build()?;
    let batch = 5_000u64;
    let mut id = 0;
    while id < p.rows {
        let end = (id + batch).min(p.rows);
        let ops: Vec<Value> = (id..end)
            .map(|i| {
                json!({"op": "insert", "table": "items",
                       "row": {"id": i, "code": code(i), "name": format!("name {i}"), "n": 0}})
            })
            .collect();
        let reply = http
            .post(server.url("/v1/mutate"))
            .json(&json!({"ops": ops, "durability": "memory"}))
            .send()
            .await?;
        anyhow::ensure!(
            reply.status().is_success(),
            "loading rows: {}",
            reply.text().await?
        );
        id = end;
    }
    Ok(server)
}

/// The reply fields a reader checks (strings borrowed from the frame).
#[derive(Deserialize)]
struct GetReply<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    id: Option<u64>,
    #[serde(default, borrow)]
    row: Option<RowFields<'a>>,
    #[serde(default, borrow)]
    rows: Option<Vec<RowItem<'a>>>,
}

#[derive(Deserialize)]
struct RowFields<'a> {
    id: i64,
    #[serde(borrow)]
    code: &'a str,
}

#[derive(Deserialize)]
struct RowItem<'a> {
    #[serde(borrow)]
    row: RowFields<'a>,
}

impl GetReply<'_> {
    /// Whether this reply holds row `id` (by key: `row`; by index: exactly one in `rows`).
    fn holds(&self, id: u64, lookup: Lookup) -> bool {
        let row = match lookup {
            Lookup::Key => self.row.as_ref(),
            Lookup::Index => match self.rows.as_deref() {
                Some([one]) => Some(&one.row),
                _ => None,
            },
        };
        self.kind == "result" && row.is_some_and(|r| r.id == id as i64 && r.code == code(id))
    }
}

fn get_request(req: u64, id: u64, lookup: Lookup, msgpack: bool) -> Message {
    #[derive(Serialize)]
    struct Get<'a> {
        id: u64,
        #[serde(rename = "type")]
        kind: &'static str,
        table: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        column: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<&'a str>,
    }
    let code = code(id);
    let get = Get {
        id: req,
        kind: "get",
        table: "items",
        key: (lookup == Lookup::Key).then_some(id),
        column: (lookup == Lookup::Index).then_some("code"),
        value: (lookup == Lookup::Index).then_some(code.as_str()),
    };
    if msgpack {
        Message::Binary(rmp_serde::to_vec_named(&get).expect("a get encodes").into())
    } else {
        Message::Text(serde_json::to_string(&get).expect("a get encodes").into())
    }
}

fn parse_reply(message: &Message) -> Option<GetReply<'_>> {
    match message {
        Message::Text(t) => serde_json::from_str(t.as_str()).ok(),
        Message::Binary(b) => rmp_serde::from_slice(b).ok(),
        _ => None,
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(server: &crate::harness::Sluice, msgpack: bool) -> anyhow::Result<Ws> {
    let url = server.url("/v1/ws").replacen("http://", "ws://", 1);
    let protocol = if msgpack {
        sluice_server::ws::MSGPACK_PROTOCOL
    } else {
        sluice_server::ws::JSON_PROTOCOL
    };
    let request = crate::server::ws_request(&url, server.admin_token(), Some(protocol))?;
    let (ws, _) = tokio_tungstenite::connect_async_with_config(
        request,
        Some(crate::server::ws_config()),
        false,
    )
    .await
    .context("WebSocket connect")?;
    Ok(ws)
}

/// `connections` pipelined WebSocket readers, `depth` gets in flight each.
async fn ws_readers(
    server: &crate::harness::Sluice,
    p: &Params,
    lookup: Lookup,
    msgpack: bool,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let mut tasks = Vec::new();
    for c in 0..p.connections {
        let ws = ws_connect(server, msgpack).await?;
        let (p, clock) = (p.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            ws_reader(ws, &p, c as u64, lookup, msgpack, clock).await
        }));
    }
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await??);
    }
    Ok(tally)
}

async fn ws_reader(
    mut ws: Ws,
    p: &Params,
    stream: u64,
    lookup: Lookup,
    msgpack: bool,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, stream + 1, p.rows);
    // Requests in flight, in the order sent (replies come in that order).
    let mut inflight: VecDeque<(u64, u64, Instant)> = VecDeque::with_capacity(p.depth);
    let mut next_req = 0u64;
    let mut sending = true;
    for _ in 0..p.depth {
        let id = keys.next();
        inflight.push_back((next_req, id, Instant::now()));
        ws.feed(get_request(next_req, id, lookup, msgpack)).await?;
        next_req += 1;
    }
    ws.flush().await?;
    while !inflight.is_empty() {
        let message = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .context("no reply within 30 s")?
            .context("the server closed the connection")??;
        let mut answered = 0;
        let mut message = Some(message);
        while let Some(m) = message.take() {
            let now = Instant::now();
            let Some((req, id, sent)) = inflight.pop_front() else {
                anyhow::bail!("a reply nobody asked for: {m:?}");
            };
            match parse_reply(&m) {
                Some(reply) if reply.id == Some(req) && reply.holds(id, lookup) => {}
                _ => tally.mismatch(|| format!("request {req} (id {id}) got {m:?}")),
            }
            tally.record(now - sent, clock.measuring(sent));
            answered += 1;
            if sending && clock.done(now) {
                sending = false;
            }
            if answered < p.depth {
                message = match ws.next().now_or_never() {
                    Some(Some(Ok(m))) => Some(m),
                    _ => None,
                };
            }
        }
        if sending {
            let now = Instant::now();
            for _ in 0..answered {
                let id = keys.next();
                inflight.push_back((next_req, id, now));
                ws.feed(get_request(next_req, id, lookup, msgpack)).await?;
                next_req += 1;
            }
            ws.flush().await?;
        }
    }
    let _ = ws.close(None).await;
    Ok(tally)
}

/// The batched WebSocket case: `connections` MessagePack connections, each with
/// `batch_depth` gets of `batch_keys` keys in flight; every row returned is a read.
async fn batched_case(server: &crate::harness::Sluice, p: &Params, background: u64) -> Case {
    let mut case = Case::new(
        "sluice",
        &p.batched("WS MessagePack batched get"),
        Lookup::Key,
        background,
    );
    let writer = match WsWriter::start(server, p, background).await {
        Ok(w) => w,
        Err(e) => {
            case.error = Some(format!("background writer: {e:#}"));
            return case;
        }
    };
    let started = Instant::now();
    let clock = Clock::new(p);
    let mut tasks = Vec::new();
    let mut error = None;
    for c in 0..p.connections {
        match ws_connect(server, true).await {
            Ok(ws) => {
                let (p, clock) = (p.clone(), clock.clone());
                tasks.push(tokio::spawn(async move {
                    ws_batched_reader(ws, &p, c as u64, clock).await
                }));
            }
            Err(e) => error = Some(format!("{e:#}")),
        }
    }
    let mut tally = Tally::new();
    for t in tasks {
        match t.await {
            Ok(Ok(t)) => tally.merge(t),
            Ok(Err(e)) => error = Some(format!("{e:#}")),
            Err(e) => error = Some(format!("{e}")),
        }
    }
    let seconds = clock
        .stop_at
        .duration_since(clock.measure_from)
        .as_secs_f64();
    case.fill(&tally, seconds);
    if error.is_some() {
        case.error = error;
    }
    match writer.stop(started.elapsed()).await {
        Ok(rate) => case.background_achieved = rate,
        Err(e) => case.error = Some(format!("background writer: {e:#}")),
    }
    case
}

/// The reply to a batched get: one entry per key, in order (`null`: no such row).
#[derive(Deserialize)]
struct ManyReply<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    id: Option<u64>,
    #[serde(default, borrow)]
    rows: Vec<Option<RowItem<'a>>>,
}

fn batched_request(req: u64, ids: &[u64]) -> Message {
    #[derive(Serialize)]
    struct Get<'a> {
        id: u64,
        #[serde(rename = "type")]
        kind: &'static str,
        table: &'static str,
        keys: &'a [u64],
    }
    let get = Get {
        id: req,
        kind: "get",
        table: "items",
        keys: ids,
    };
    Message::Binary(rmp_serde::to_vec_named(&get).expect("a get encodes").into())
}

/// `batch_depth` batched gets in flight on one connection; each reply's rows are checked
/// one by one against the keys asked (id and code, in order).
async fn ws_batched_reader(
    mut ws: Ws,
    p: &Params,
    stream: u64,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, 200 + stream, p.rows);
    let mut inflight: VecDeque<(u64, Vec<u64>, Instant)> = VecDeque::with_capacity(p.batch_depth);
    let mut next_req = 0u64;
    let mut send = |ws_inflight: &mut VecDeque<(u64, Vec<u64>, Instant)>| {
        let ids: Vec<u64> = (0..p.batch_keys).map(|_| keys.next()).collect();
        let message = batched_request(next_req, &ids);
        ws_inflight.push_back((next_req, ids, Instant::now()));
        next_req += 1;
        message
    };
    for _ in 0..p.batch_depth {
        let message = send(&mut inflight);
        ws.feed(message).await?;
    }
    ws.flush().await?;
    let mut sending = true;
    while let Some((req, ids, sent)) = inflight.pop_front() {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .context("no reply within 30 s")?
            .context("the server closed the connection")??;
        let now = Instant::now();
        let ok = match m {
            Message::Binary(ref b) => rmp_serde::from_slice::<ManyReply>(b).is_ok_and(|r| {
                r.kind == "result"
                    && r.id == Some(req)
                    && r.rows.len() == ids.len()
                    && r.rows.iter().zip(&ids).all(|(row, &id)| {
                        row.as_ref()
                            .is_some_and(|r| r.row.id == id as i64 && r.row.code == code(id))
                    })
            }),
            _ => false,
        };
        if !ok {
            tally.mismatch(|| format!("batched request {req} (ids {ids:?}) got {m:?}"));
        }
        tally.record_batch(now - sent, ids.len() as u64, clock.measuring(sent));
        if sending && clock.done(now) {
            sending = false;
        }
        if sending {
            let message = send(&mut inflight);
            ws.send(message).await?;
        }
    }
    let _ = ws.close(None).await;
    Ok(tally)
}

/// `http_clients` keep-alive clients, one request at a time each.
async fn http_readers(
    server: &crate::harness::Sluice,
    p: &Params,
    lookup: Lookup,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let http = reqwest::Client::builder()
        .default_headers(crate::server::auth_headers())
        .pool_max_idle_per_host(p.http_clients)
        .build()?;
    let base = server.url("/v1/tables/items/rows");
    let mut tasks = Vec::new();
    for c in 0..p.http_clients {
        let (http, base, clock) = (http.clone(), base.clone(), clock.clone());
        let mut keys = Keys::new(p.seed, 100 + c as u64, p.rows);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            loop {
                let id = keys.next();
                let url = match lookup {
                    Lookup::Key => format!("{base}/{id}"),
                    Lookup::Index => format!("{base}?column=code&value={}", code(id)),
                };
                let t = Instant::now();
                let body = http.get(&url).send().await?.bytes().await?;
                let now = Instant::now();
                let ok = serde_json::from_slice::<HttpReply>(&body).is_ok_and(|r| {
                    let row = match lookup {
                        Lookup::Key => r.row.as_ref(),
                        Lookup::Index => match r.rows.as_deref() {
                            Some([one]) => Some(&one.row),
                            _ => None,
                        },
                    };
                    row.is_some_and(|r| r.id == id as i64 && r.code == code(id))
                });
                if !ok {
                    tally.mismatch(|| format!("GET {url}: {}", String::from_utf8_lossy(&body)));
                }
                tally.record(now - t, clock.measuring(t));
                if clock.done(now) {
                    break;
                }
            }
            anyhow::Ok(tally)
        }));
    }
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await??);
    }
    Ok(tally)
}

#[derive(Deserialize)]
struct HttpReply<'a> {
    #[serde(default, borrow)]
    row: Option<RowFields<'a>>,
    #[serde(default, borrow)]
    rows: Option<Vec<RowItem<'a>>>,
}

/// The open-loop background writer of the server cases: one WebSocket connection sending,
/// every millisecond, that millisecond's mutates (`BACKGROUND_BATCH` patches each, the
/// server's default durability) without waiting for replies; a second task reads and
/// counts the replies. When the server stops reading (its in-flight bound), sending waits:
/// the achieved rate says so.
struct WsWriter {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl WsWriter {
    async fn start(
        server: &crate::harness::Sluice,
        p: &Params,
        rows_per_sec: u64,
    ) -> anyhow::Result<WsWriter> {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        if rows_per_sec == 0 {
            return Ok(WsWriter {
                stop,
                acked,
                tasks: Vec::new(),
            });
        }
        let ws = ws_connect(server, false).await?;
        let (mut sink, mut stream) = ws.split();
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2) = (stop.clone(), sent.clone());
        let (rows, seed) = (p.rows, p.seed);
        let sender = tokio::spawn(async move {
            let mut keys = Keys::new(seed, 999, rows);
            let mut ticker = tokio::time::interval(Duration::from_millis(1));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut owed = 0.0f64;
            let mut value = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                ticker.tick().await;
                owed += rows_per_sec as f64 / 1000.0 / BACKGROUND_BATCH as f64;
                while owed >= 1.0 {
                    owed -= 1.0;
                    value += 1;
                    let ops: Vec<Value> = (0..BACKGROUND_BATCH)
                        .map(|_| {
                            json!({"op": "patch", "table": "items", "id": keys.next(),
                                   "set": {"n": value}})
                        })
                        .collect();
                    let frame = json!({"id": value, "type": "mutate", "ops": ops});
                    sink.feed(Message::Text(frame.to_string().into())).await?;
                    sent2.fetch_add(1, Ordering::Relaxed);
                }
                sink.flush().await?;
            }
            let _ = sink.close().await;
            anyhow::Ok(())
        });
        let (stop3, acked2) = (stop.clone(), acked.clone());
        let reader = tokio::spawn(async move {
            let mut received = 0u64;
            loop {
                let done = stop3.load(Ordering::Relaxed);
                if done && received >= sent.load(Ordering::Relaxed) {
                    break;
                }
                let next = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
                let Ok(Some(Ok(message))) = next else {
                    break;
                };
                if let Message::Text(t) = &message {
                    received += 1;
                    if t.as_str().starts_with("{\"type\":\"result\"") {
                        acked2.fetch_add(BACKGROUND_BATCH, Ordering::Relaxed);
                    } else {
                        anyhow::bail!("a background write failed: {}", t.as_str());
                    }
                }
            }
            anyhow::Ok(())
        });
        Ok(WsWriter {
            stop,
            acked,
            tasks: vec![sender, reader],
        })
    }

    async fn stop(self, elapsed: Duration) -> anyhow::Result<f64> {
        let rate = self.acked.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-9);
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await??;
        }
        Ok(rate)
    }
}

// ---------------------------------------------------------------------------------------
// Peers

async fn redis_cases(
    p: &Params,
    bin: &std::path::Path,
    cases: &mut Vec<Case>,
) -> anyhow::Result<String> {
    let server = redis::Redis::start(bin, redis::Aof::Off, (p.connections + 16) as u32).await?;
    // Load: one string and one hash per row, pipelined.
    let mut conn = server.connect().await?;
    let mut id = 0;
    while id < p.rows {
        let end = (id + 1_000).min(p.rows);
        let mut out = Vec::new();
        for i in id..end {
            let (key, hkey, value) = (
                format!("item:{i}"),
                format!("h:{i}"),
                format!("{i}|{}|name {i}|0", code(i)),
            );
            resp::encode(&mut out, &[b"SET", key.as_bytes(), value.as_bytes()]);
            let (sid, scode, sname) = (i.to_string(), code(i), format!("name {i}"));
            resp::encode(
                &mut out,
                &[
                    b"HSET",
                    hkey.as_bytes(),
                    b"id",
                    sid.as_bytes(),
                    b"code",
                    scode.as_bytes(),
                    b"name",
                    sname.as_bytes(),
                    b"n",
                    b"0",
                ],
            );
        }
        conn.send(&out).await?;
        for _ in 0..2 * (end - id) {
            if let resp::Value::Error(e) = conn.read().await? {
                anyhow::bail!("redis load: {e}");
            }
        }
        id = end;
    }
    for command in ["GET", "HGETALL"] {
        let case = Case::new("redis", command, Lookup::Key, 0);
        let clock = Clock::new(p);
        let mut tasks = Vec::new();
        for c in 0..p.connections {
            let conn = server.connect().await?;
            let (p, clock) = (p.clone(), clock.clone());
            tasks.push(tokio::spawn(async move {
                redis_reader(conn, &p, c as u64, command, clock).await
            }));
        }
        cases.push(join_peer_readers(case, tasks, p.seconds).await?);
    }
    let case = Case::new("redis", &p.batched("MGET"), Lookup::Key, 0);
    let clock = Clock::new(p);
    let mut tasks = Vec::new();
    for c in 0..p.connections {
        let conn = server.connect().await?;
        let (p, clock) = (p.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            redis_mget_reader(conn, &p, c as u64, clock).await
        }));
    }
    cases.push(join_peer_readers(case, tasks, p.seconds).await?);
    Ok(server.version.clone())
}

/// `batch_depth` `MGET`s of `batch_keys` keys in flight on one connection, the keys drawn
/// as the batched WebSocket reader draws them; every value checked.
async fn redis_mget_reader(
    mut conn: resp::Conn,
    p: &Params,
    stream: u64,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, 200 + stream, p.rows);
    let mut inflight: VecDeque<(Vec<u64>, Instant)> = VecDeque::with_capacity(p.batch_depth);
    let mut command = |out: &mut Vec<u8>| -> Vec<u64> {
        let ids: Vec<u64> = (0..p.batch_keys).map(|_| keys.next()).collect();
        let names: Vec<String> = ids.iter().map(|id| format!("item:{id}")).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(names.iter().map(|n| n.as_bytes()));
        resp::encode(out, &args);
        ids
    };
    let mut out = Vec::new();
    for _ in 0..p.batch_depth {
        let ids = command(&mut out);
        inflight.push_back((ids, Instant::now()));
    }
    conn.send(&out).await?;
    let mut sending = true;
    while let Some((ids, sent)) = inflight.pop_front() {
        let reply = conn.read().await?;
        let now = Instant::now();
        let items = reply.items();
        let ok = items.len() == ids.len()
            && items.iter().zip(&ids).all(|(v, &id)| {
                let want = format!("{id}|{}|", code(id));
                v.as_bytes().is_some_and(|b| b.starts_with(want.as_bytes()))
            });
        if !ok {
            tally.mismatch(|| format!("MGET of ids {ids:?}: {reply:?}"));
        }
        tally.record_batch(now - sent, ids.len() as u64, clock.measuring(sent));
        if sending && clock.done(now) {
            sending = false;
        }
        if sending {
            out.clear();
            let ids = command(&mut out);
            inflight.push_back((ids, Instant::now()));
            conn.send(&out).await?;
        }
    }
    Ok(tally)
}

/// Joins a peer case's reader tasks into `case`: their tallies merged, and a reader's error
/// kept as the case's (the others' reads still count).
async fn join_peer_readers(
    mut case: Case,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Tally>>>,
    seconds: f64,
) -> anyhow::Result<Case> {
    let mut tally = Tally::new();
    let mut error = None;
    for t in tasks {
        match t.await? {
            Ok(t) => tally.merge(t),
            Err(e) => error = Some(format!("{e:#}")),
        }
    }
    case.fill(&tally, seconds);
    if error.is_some() {
        case.error = error;
    }
    Ok(case)
}

async fn redis_reader(
    mut conn: resp::Conn,
    p: &Params,
    stream: u64,
    command: &'static str,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, stream + 1, p.rows);
    let mut inflight: VecDeque<(u64, Instant)> = VecDeque::with_capacity(p.depth);
    let prefix = if command == "GET" { "item:" } else { "h:" };
    let send = |ids: &mut dyn Iterator<Item = u64>, out: &mut Vec<u8>| {
        for id in ids {
            let key = format!("{prefix}{id}");
            resp::encode(out, &[command.as_bytes(), key.as_bytes()]);
        }
    };
    let mut out = Vec::new();
    let first: Vec<u64> = (0..p.depth).map(|_| keys.next()).collect();
    send(&mut first.iter().copied(), &mut out);
    let now = Instant::now();
    inflight.extend(first.iter().map(|&id| (id, now)));
    conn.send(&out).await?;
    let mut sending = true;
    while let Some((id, sent)) = inflight.pop_front() {
        let reply = conn.read().await?;
        let now = Instant::now();
        let ok = match (&reply, command) {
            (resp::Value::Bulk(Some(b)), "GET") => {
                let want = format!("{id}|{}|", code(id));
                b.starts_with(want.as_bytes())
            }
            (resp::Value::Array(Some(items)), _) => {
                let want_id = id.to_string();
                let want_code = code(id);
                let mut fields = items.chunks(2);
                let (mut id_ok, mut code_ok) = (false, false);
                for pair in fields.by_ref() {
                    if let [k, v] = pair {
                        match k.as_bytes() {
                            Some(b"id") => id_ok = v.as_bytes() == Some(want_id.as_bytes()),
                            Some(b"code") => code_ok = v.as_bytes() == Some(want_code.as_bytes()),
                            _ => {}
                        }
                    }
                }
                id_ok && code_ok
            }
            _ => false,
        };
        if !ok {
            tally.mismatch(|| format!("{command} of id {id}: {reply:?}"));
        }
        tally.record(now - sent, clock.measuring(sent));
        if sending && clock.done(now) {
            sending = false;
        }
        if sending {
            // Keep `depth` in flight: one more for the one answered (batched when several
            // replies are already buffered is the driver's business; one write each here).
            let id = keys.next();
            out.clear();
            send(&mut std::iter::once(id), &mut out);
            inflight.push_back((id, Instant::now()));
            conn.send(&out).await?;
        }
    }
    Ok(tally)
}

async fn postgres_cases(
    p: &Params,
    bin_dir: &std::path::Path,
    cases: &mut Vec<Case>,
) -> anyhow::Result<String> {
    let pg = postgres::Postgres::start(bin_dir).await?;
    let admin = pg.connect().await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE items (id BIGINT PRIMARY KEY, code TEXT NOT NULL, name TEXT NOT NULL, n BIGINT NOT NULL);
             INSERT INTO items SELECT i, 'c' || lpad(i::text, 9, '0'), 'name ' || i, 0
               FROM generate_series(0, {}) AS i;
             CREATE INDEX items_code ON items (code);",
            p.rows - 1
        ))
        .await
        .context("loading PostgreSQL")?;
    // On its own: VACUUM cannot run inside the implicit transaction of a batch.
    admin
        .batch_execute("VACUUM ANALYZE items")
        .await
        .context("VACUUM ANALYZE in PostgreSQL")?;
    for lookup in [Lookup::Key, Lookup::Index] {
        let case = Case::new("postgresql", "prepared SELECT", lookup, 0);
        let clock = Clock::new(p);
        let mut tasks = Vec::new();
        for c in 0..p.connections {
            let client = pg.connect().await?;
            let (p, clock) = (p.clone(), clock.clone());
            tasks.push(tokio::spawn(async move {
                postgres_reader(client, &p, c as u64, lookup, clock).await
            }));
        }
        cases.push(join_peer_readers(case, tasks, p.seconds).await?);
    }
    Ok(pg.version.clone())
}

/// `depth` prepared SELECTs in flight on one connection (tokio-postgres pipelines the
/// queries of one client).
async fn postgres_reader(
    client: tokio_postgres::Client,
    p: &Params,
    stream: u64,
    lookup: Lookup,
    clock: Clock,
) -> anyhow::Result<Tally> {
    let sql = match lookup {
        Lookup::Key => "SELECT id, code, name, n FROM items WHERE id = $1",
        Lookup::Index => "SELECT id, code, name, n FROM items WHERE code = $1",
    };
    let statement = client.prepare(sql).await?;
    let client = Arc::new(client);
    let mut tally = Tally::new();
    let mut keys = Keys::new(p.seed, stream + 1, p.rows);
    let mut inflight = futures_util::stream::FuturesUnordered::new();
    let query = |id: u64| {
        let (client, statement) = (client.clone(), statement.clone());
        async move {
            let sent = Instant::now();
            let rows = match lookup {
                Lookup::Key => client.query(&statement, &[&(id as i64)]).await,
                Lookup::Index => client.query(&statement, &[&code(id)]).await,
            };
            (id, sent, rows)
        }
    };
    for _ in 0..p.depth {
        inflight.push(query(keys.next()));
    }
    let mut sending = true;
    while let Some((id, sent, rows)) = inflight.next().await {
        let now = Instant::now();
        let rows = rows?;
        let ok = rows.len() == 1
            && rows[0].get::<_, i64>(0) == id as i64
            && rows[0].get::<_, &str>(1) == code(id);
        if !ok {
            tally.mismatch(|| format!("SELECT of id {id}: {} rows", rows.len()));
        }
        tally.record(now - sent, clock.measuring(sent));
        if sending && clock.done(now) {
            sending = false;
        }
        if sending {
            inflight.push(query(keys.next()));
        }
    }
    Ok(tally)
}

// ---------------------------------------------------------------------------------------
// Report

/// Checks `samples.json` of a run: every case succeeded, read something, and every read
/// returned the row asked for.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "no case ran");
    for c in cases {
        anyhow::ensure!(c["error"].is_null(), "a case failed: {c}");
        anyhow::ensure!(c["mismatches"] == 0, "mismatched reads: {c}");
        anyhow::ensure!(c["reads"].as_u64().unwrap_or(0) > 0, "no reads: {c}");
    }
    Ok(())
}

fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else if ns < 10_000_000 {
        format!("{:.0} µs", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

/// The target "`ours` reads at least as many rows per second as the Redis case `redis`".
fn at_least_redis(what: &str, ours: Option<&Case>, redis: Option<&Case>) -> Target {
    let (measured, met) = match (ours, redis) {
        (Some(w), Some(r)) => (
            format!(
                "{} ({} vs {} reads/s)",
                fmt_ratio(w.reads_per_sec / r.reads_per_sec),
                fmt_si(w.reads_per_sec),
                fmt_si(r.reads_per_sec)
            ),
            Some(w.reads_per_sec >= r.reads_per_sec),
        ),
        _ => ("—".into(), None),
    };
    Target {
        what: what.into(),
        goal: "≥ 1× Redis on the same machine".into(),
        measured,
        met,
    }
}

fn find<'a>(
    cases: &'a [Case],
    system: &str,
    path: &str,
    lookup: Lookup,
    background: u64,
) -> Option<&'a Case> {
    cases.iter().find(|c| {
        c.system == system
            && c.path == path
            && c.lookup == lookup
            && c.background_target == background
            && c.error.is_none()
    })
}

fn write_report(bench: &mut Bench, p: &Params, cases: &[Case]) {
    let report = &mut bench.report;
    // A failed case is a "failed" row in its table; its reason goes here, where a reader
    // of the summary (or of a smoke test's output) sees it, not only in samples.json.
    for c in cases {
        if let Some(e) = &c.error {
            report.notes.push(format!(
                "{} with {} background writes/s failed: {e}",
                c.label(),
                c.background_target
            ));
        }
    }
    report.intro.push(format!(
        "A table of {} rows `items (id INTEGER PRIMARY KEY, code TEXT NOT NULL, name TEXT, n \
         INTEGER)` with an index on `code`. Each case reads random rows for {} s (after a \
         {} s warm-up): **by key** (`id`) and **by index** (`code`, one row per value). \
         In-process: one task calling `Core::get_row` / `Core::find_rows` (the code the \
         server runs per read, confirmation check included), one read at a time. HTTP: {} \
         keep-alive clients, one request at a time each (`GET /v1/tables/items/rows/{{id}}`, \
         `?column=code&value=…`). WebSocket, Redis and PostgreSQL: {} connections with {} \
         requests in flight each (WebSocket `get`, Redis `GET item:{{id}}` / `HGETALL \
         h:{{id}}`, PostgreSQL prepared `SELECT … WHERE id = $1` / `WHERE code = $1`, \
         pipelined by tokio-postgres). Background: an open-loop writer patching `n` of {} \
         random rows/s ({} rows per mutate, the server's default durability `fsync`); the \
         peers run without it. Every reply is checked (id and code); latency is per read, \
         send to parsed reply. Batched: {} MessagePack WebSocket connections with {} `get` \
         requests of {} keys each in flight (`{{\"type\": \"get\", \"keys\": [...]}}`, one \
         reply with a row per key), against Redis `MGET` of {} keys likewise; reads/s \
         counts rows returned (each checked), latency is per request.",
        fmt_si(p.rows as f64),
        p.seconds,
        p.warmup_seconds,
        p.http_clients,
        p.connections,
        p.depth,
        fmt_si(p.background_writes as f64),
        p.background_batch,
        p.connections,
        p.batch_depth,
        p.batch_keys,
        p.batch_keys,
    ));
    let mut table = Table::new(
        "Point reads",
        &[
            "system",
            "path",
            "lookup",
            "background rows/s (asked / acked)",
            "reads/s",
            "p50",
            "p99",
            "p99.9",
            "checked",
        ],
    );
    for c in cases {
        let id = vec![
            c.system.to_string(),
            c.path.clone(),
            c.lookup.label().to_string(),
            if c.background_target == 0 {
                "0".into()
            } else {
                format!(
                    "{} / {}",
                    fmt_si(c.background_target as f64),
                    fmt_si(c.background_achieved)
                )
            },
        ];
        if c.error.is_some() {
            table.failed_row(id);
            continue;
        }
        let mut cells = id;
        cells.extend([
            fmt_si(c.reads_per_sec),
            fmt_ns(c.p50_ns),
            fmt_ns(c.p99_ns),
            fmt_ns(c.p999_ns),
            format!("{} ok", fmt_si(c.reads as f64)),
        ]);
        table.row(cells);
    }
    report.tables.push(table);

    // Ratios to the peers, same machine, same run.
    let redis_get = find(cases, "redis", "GET", Lookup::Key, 0);
    let redis_mget = find(cases, "redis", &p.batched("MGET"), Lookup::Key, 0);
    let pg_key = find(cases, "postgresql", "prepared SELECT", Lookup::Key, 0);
    let pg_index = find(cases, "postgresql", "prepared SELECT", Lookup::Index, 0);
    let mut ratios = Table::new(
        "Reads/s against the peers (no background writes)",
        &[
            "Sluice case",
            "reads/s",
            "vs Redis GET",
            "vs Redis MGET",
            "vs PostgreSQL (same lookup)",
        ],
    );
    for c in cases
        .iter()
        .filter(|c| c.system == "sluice" && c.background_target == 0 && c.error.is_none())
    {
        let pg = if c.lookup == Lookup::Key {
            pg_key
        } else {
            pg_index
        };
        ratios.row(vec![
            c.label(),
            fmt_si(c.reads_per_sec),
            redis_get.map_or("—".into(), |r| {
                fmt_ratio(c.reads_per_sec / r.reads_per_sec)
            }),
            redis_mget.map_or("—".into(), |r| {
                fmt_ratio(c.reads_per_sec / r.reads_per_sec)
            }),
            pg.map_or("—".into(), |r| {
                fmt_ratio(c.reads_per_sec / r.reads_per_sec)
            }),
        ]);
    }
    report.tables.push(ratios);

    // Targets.
    let inproc = find(cases, "sluice", "in-process", Lookup::Key, 0);
    report.targets.push(Target {
        what: "in-process point read by key, p50".into(),
        goal: format!("< {}", fmt_ns(TARGET_INPROC_P50_NS)),
        measured: inproc.map_or("—".into(), |c| fmt_ns(c.p50_ns)),
        met: inproc.map(|c| c.p50_ns < TARGET_INPROC_P50_NS),
    });
    // The best WebSocket case by key with no writes: single-key pipelined, and batched.
    let best_ws = |batched: bool| {
        cases
            .iter()
            .filter(|c| {
                c.system == "sluice"
                    && c.path.starts_with("WS")
                    && c.path.contains("batched") == batched
                    && c.lookup == Lookup::Key
                    && c.background_target == 0
                    && c.error.is_none()
            })
            .max_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec))
    };
    let (single_ws, batched_ws) = (best_ws(false), best_ws(true));
    let best = [single_ws, batched_ws]
        .into_iter()
        .flatten()
        .max_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec));
    report.targets.push(Target {
        what: "WebSocket reads by key (pipelined or batched)".into(),
        goal: format!("≥ {} reads/s", fmt_si(TARGET_WS_READS_PER_SEC)),
        measured: best.map_or("—".into(), |c| {
            let mut m = format!("{} reads/s ({})", fmt_si(c.reads_per_sec), c.path);
            if let Some(s) = single_ws.filter(|s| !std::ptr::eq(*s, c)) {
                m.push_str(&format!(
                    "; single-key pipelined: {} reads/s ({})",
                    fmt_si(s.reads_per_sec),
                    s.path
                ));
            }
            m
        }),
        met: best.map(|c| c.reads_per_sec >= TARGET_WS_READS_PER_SEC),
    });
    report.targets.push(at_least_redis(
        "WebSocket pipelined single-key reads by key vs Redis GET",
        single_ws,
        redis_get,
    ));
    report.targets.push(at_least_redis(
        "WebSocket batched get by key vs Redis MGET (same keys per request)",
        batched_ws,
        redis_mget,
    ));

    // Chart: reads/s per case, without and with background writes.
    let labels: Vec<String> = {
        let mut seen = Vec::new();
        for c in cases.iter().filter(|c| c.error.is_none()) {
            let l = format!("{} {} {}", c.system, c.path, c.lookup.label());
            if !seen.contains(&l) {
                seen.push(l);
            }
        }
        seen
    };
    let series = |background: u64, name: String| BarSeries {
        name,
        values: labels
            .iter()
            .map(|l| {
                cases
                    .iter()
                    .find(|c| {
                        c.error.is_none()
                            && c.background_target == background
                            && &format!("{} {} {}", c.system, c.path, c.lookup.label()) == l
                    })
                    .map(|c| c.reads_per_sec)
            })
            .collect(),
    };
    let mut all_series = vec![series(0, "no writes".into())];
    if p.background_writes > 0 {
        all_series.push(series(
            p.background_writes,
            format!("{} rows/s written", fmt_si(p.background_writes as f64)),
        ));
    }
    report.chart(
        "reads_per_sec.svg",
        "Point reads per second by path and lookup",
        BarChart {
            title: "Point reads per second".into(),
            x_label: "system, path, lookup".into(),
            y_label: "reads/s".into(),
            categories: labels,
            series: all_series,
        }
        .render(),
    );
    report.notes.push(
        "Reads are confirmed reads: nothing is shown before its commit is durable in its \
         class (crate::point). A read whose answer no unconfirmed commit changed — the row's \
         own commit is confirmed, or for a lookup through the index no unconfirmed commit \
         took a row from the value — answers at once; the others wait for the next group \
         commit of the background writer's `fsync` commits."
            .into(),
    );
    report.samples = json!({
        "suite": "reads",
        "params": p,
        "cases": cases,
    });
}
