//! `sluice bench fanout`: append sent → record received by every watcher.
//!
//! For each number of watchers (100 / 1 000 / 10 000), each transport (Sluice SSE and
//! WebSocket watchers; Redis pub/sub subscribers and Redis Streams `XREAD BLOCK` readers as
//! peers, started in the same run) and each filter mode:
//! - **one tag**: every watcher watches tag `all` (Redis: one channel / one stream), every
//!   record is tagged `all`, so each record goes to every watcher;
//! - **own tag**: watcher `i` watches `w:<i>` (Redis: channel / stream `w:<i>`), each record
//!   is addressed to a random subset of [`OWN_TAG_SUBSET`] watchers (Redis: one `PUBLISH` /
//!   `XADD` per addressee, pipelined).
//!
//! A case has two phases on one set of connections:
//! 1. **latency**: single-record appends (HTTP `POST …/records`, or Redis `PUBLISH`/`XADD`),
//!    each sent once the previous one reached every addressee; for each record, the time
//!    from just before it is sent until the *last* watcher it is addressed to has it
//!    (p50/p95/p99), and the latency of every single delivery;
//! 2. **saturation**: requests of about [`SAT_REQUEST_DELIVERIES`] deliveries back to back
//!    for a bounded time (at most [`SAT_DELIVERIES_MAX`] deliveries); deliveries/s =
//!    deliveries ÷ (first send → last delivery).
//!
//! Then every watcher's account is checked: it received exactly the records addressed to
//! it, each once, in order (count and an order-sensitive hash per watcher). A case that
//! does not check out fails. Watchers are one tokio task per connection and parse only the
//! record's number.

pub mod watchers;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};

use crate::harness::{Bench, Csv, Sluice};
use crate::hist::{fmt_ratio, fmt_si, fmt_us, Latency, LatencySummary};
use crate::peers::redis::{self, Redis};
use crate::peers::resp;
use crate::report::{Table, Target};
use crate::svg::{BarChart, BarSeries};
use crate::CommonArgs;
use watchers::{fold, Shared, Transport, WatcherState};

/// Goal: p99 of append → every watcher at 10 000 watchers.
const TARGET_P99_US: u64 = 5_000;
const TARGET_P99_WATCHERS: usize = 10_000;
/// Watchers each record is addressed to in the own-tag mode (≤ 16 tags per record).
pub const OWN_TAG_SUBSET: usize = 8;
/// Deliveries one saturation request aims at: records per request =
/// this ÷ addressees per record, between [`SAT_BATCH_MIN`] and [`SAT_BATCH_MAX`]. At least
/// 10 records per request, so that no side is held to one record per round trip (a Redis
/// `PUBLISH` is acknowledged only after it was queued to every subscriber).
pub const SAT_REQUEST_DELIVERIES: usize = 2_000;
pub const SAT_BATCH_MIN: usize = 10;
pub const SAT_BATCH_MAX: usize = 200;
/// Pause between two records of the latency phase, after the previous one reached every
/// addressee (so each is measured alone, not behind a queue).
const LATENCY_PHASE_GAP: Duration = Duration::from_millis(2);
/// Deliveries of the latency phase at most (fewer records when each reaches many).
const LATENCY_DELIVERIES_MAX: u64 = 1_000_000;
/// Deliveries one saturation phase may produce at most (a bound on time and memory).
const SAT_DELIVERIES_MAX: u64 = 5_000_000;
/// Watchers connecting at once.
const CONNECT_CONCURRENCY: usize = 200;
/// Open files this process wants: one per watcher plus the publisher and some slack.
const NOFILE_WANT: u64 = 20_000;

#[derive(clap::Args, Debug, Clone)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Watchers per case, one case each [default: 100,1000,10000; --quick: 20].
    #[arg(long, value_delimiter = ',')]
    pub watchers: Option<Vec<usize>>,
    /// Transports: sse, ws, redis-pubsub, redis-streams.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["sse".to_string(), "ws".to_string(), "redis-pubsub".to_string(), "redis-streams".to_string()])]
    pub transports: Vec<String>,
    /// Filter modes: one-tag (every watcher on tag `all`), own-tag (watcher i on `w:<i>`,
    /// each record addressed to a random subset).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["one-tag".to_string(), "own-tag".to_string()])]
    pub filters: Vec<String>,
    /// Records sent in the latency phase of a case [default: 200; --quick: 10]; fewer for
    /// big one-tag cases (at most 2 M deliveries).
    #[arg(long)]
    pub appends: Option<u64>,
    /// Seconds of the saturation phase [default: 3; --quick: 0.3].
    #[arg(long)]
    pub saturation_seconds: Option<f64>,
    /// Durability class of the Sluice appends (Redis pub/sub and Streams keep nothing).
    #[arg(long, default_value = "memory")]
    pub durability: String,
    /// Seed of the own-tag subsets (printed in samples.json and on failure).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds every watcher may take to receive what was sent before the case fails.
    #[arg(long, default_value_t = 60.0)]
    pub drain_seconds: f64,
    /// Skip the Redis peers.
    #[arg(long)]
    pub no_peers: bool,
}

#[derive(Clone, Debug, Serialize)]
struct Params {
    watchers: Vec<usize>,
    transports: Vec<Transport>,
    filters: Vec<&'static str>,
    appends: u64,
    saturation_seconds: f64,
    durability: String,
    seed: u64,
    drain_seconds: f64,
    own_tag_subset: usize,
    saturation_request_deliveries: usize,
    quick: bool,
}

/// One case's identity and results (`samples.json`).
#[derive(Clone, Debug, Serialize)]
struct Case {
    transport: Transport,
    filter: &'static str,
    watchers: usize,
    /// Records sent in the latency phase.
    latency_appends: u64,
    /// Append sent → the last addressed watcher has it.
    all_watchers: LatencySummary,
    /// Append sent → one watcher has it (every delivery of the latency phase).
    delivery_p50_us: u64,
    delivery_p95_us: u64,
    delivery_p99_us: u64,
    /// Saturation phase: records per request, records, deliveries.
    sat_batch: usize,
    sat_records: u64,
    sat_deliveries: u64,
    sat_seconds: f64,
    deliveries_per_sec: f64,
    /// Every watcher got exactly its records, in order.
    verified: bool,
    connect_s: f64,
    error: Option<String>,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} {}, {} watchers",
            self.transport.name(),
            self.filter,
            self.watchers
        )
    }
}

impl Params {
    fn from(a: &FanoutArgs) -> anyhow::Result<Params> {
        let quick = a.common.quick;
        let watchers = a.watchers.clone().unwrap_or_else(|| {
            if quick {
                vec![20]
            } else {
                vec![100, 1000, 10_000]
            }
        });
        anyhow::ensure!(
            watchers.iter().all(|&w| (1..=15_000).contains(&w)),
            "--watchers must each be between 1 and 15000 (open files: ulimit -n)"
        );
        let mut transports = Vec::new();
        for t in &a.transports {
            let t = Transport::parse(t)?;
            let skipped = a.no_peers && t.is_redis();
            if !skipped && !transports.contains(&t) {
                transports.push(t);
            }
        }
        let mut filters = Vec::new();
        for f in &a.filters {
            filters.push(match f.as_str() {
                "one-tag" => "one-tag",
                "own-tag" => "own-tag",
                other => anyhow::bail!(
                    "unknown filter mode {other:?} (--filters takes one-tag, own-tag)"
                ),
            });
        }
        anyhow::ensure!(
            ["memory", "disk", "fsync"].contains(&a.durability.as_str()),
            "--durability takes memory, disk or fsync"
        );
        let appends = a.appends.unwrap_or(if quick { 10 } else { 200 });
        anyhow::ensure!(
            (1..=100_000).contains(&appends),
            "--appends must be between 1 and 100000"
        );
        let saturation_seconds = a
            .saturation_seconds
            .unwrap_or(if quick { 0.3 } else { 3.0 });
        anyhow::ensure!(
            saturation_seconds > 0.0 && saturation_seconds <= 600.0,
            "--saturation-seconds must be in (0, 600]"
        );
        anyhow::ensure!(a.drain_seconds > 0.0, "--drain-seconds must be positive");
        Ok(Params {
            watchers,
            transports,
            filters,
            appends,
            saturation_seconds,
            durability: a.durability.clone(),
            seed: a.seed,
            drain_seconds: a.drain_seconds,
            own_tag_subset: OWN_TAG_SUBSET,
            saturation_request_deliveries: SAT_REQUEST_DELIVERIES,
            quick,
        })
    }
}

pub fn run(args: FanoutArgs) -> anyhow::Result<bool> {
    let params = Params::from(&args)?;
    let mut bench = Bench::new("fanout", &args.common, &params)?;
    let nofile = crate::harness::raise_nofile_limit(NOFILE_WANT);
    let most = params.watchers.iter().max().copied().unwrap_or(0) as u64;
    anyhow::ensure!(
        nofile >= most + 256,
        "{most} watchers need at least {} open files, the limit is {nofile} (raise ulimit -n, or lower --watchers)",
        most + 256
    );
    let redis_bin = if params.transports.iter().any(|t| t.is_redis()) {
        Some(redis::find_bin()?)
    } else {
        None
    };
    let runtime = crate::harness::runtime()?;
    let cases = runtime.block_on(run_cases(&params, &mut bench, redis_bin))?;
    drop(runtime);
    let failed = cases.iter().filter(|c| c.error.is_some()).count();
    write_report(&mut bench, &params, &cases);
    bench.finish(failed)
}

async fn run_cases(
    params: &Params,
    bench: &mut Bench,
    redis_bin: Option<PathBuf>,
) -> anyhow::Result<Vec<Case>> {
    let progress = bench.progress;
    let most = params.watchers.iter().max().copied().unwrap_or(1);
    let mut cases = Vec::new();
    let queue = (params.appends + SAT_DELIVERIES_MAX).to_string();
    let mut sluice: Option<Sluice> = None;
    if params.transports.iter().any(|t| !t.is_redis()) {
        progress.say("starting sluice serve");
        let s = bench
            .sluice(
                "fanout",
                &[
                    "--durability".into(),
                    params.durability.clone(),
                    // No watcher is cut off for lagging: the saturation phase is bounded.
                    "--watch-queue-records".into(),
                    queue,
                ],
            )
            .await?;
        progress.say(format!("sluice ready at {} (pid {})", s.base_url, s.pid()));
        sluice = Some(s);
    }
    let mut redis_server: Option<Redis> = None;
    if let Some(bin) = &redis_bin {
        let r = Redis::start(bin, redis::Aof::Off, most as u32 + 128).await?;
        progress.say(format!(
            "Redis {} ready on 127.0.0.1:{} (pid {})",
            r.version,
            r.port,
            r.pid()
        ));
        bench
            .report
            .run_extra
            .insert("redis_version".into(), json!(r.version));
        redis_server = Some(r);
    }
    let total = params.watchers.len() * params.transports.len() * params.filters.len();
    let mut k = 0;
    for &n in &params.watchers {
        for &filter in &params.filters {
            for &transport in &params.transports {
                k += 1;
                let mut case = Case {
                    transport,
                    filter,
                    watchers: n,
                    latency_appends: 0,
                    all_watchers: LatencySummary::default(),
                    delivery_p50_us: 0,
                    delivery_p95_us: 0,
                    delivery_p99_us: 0,
                    sat_batch: 0,
                    sat_records: 0,
                    sat_deliveries: 0,
                    sat_seconds: 0.0,
                    deliveries_per_sec: 0.0,
                    verified: false,
                    connect_s: 0.0,
                    error: None,
                };
                progress.say(format!("case {k}/{total}: {}", case.label()));
                let endpoint = match transport {
                    Transport::Sse | Transport::Ws => {
                        let s = sluice.as_ref().context("sluice runs")?;
                        Endpoint::Sluice(s.base_url.clone())
                    }
                    _ => Endpoint::Redis(redis_server.as_ref().context("redis runs")?.port),
                };
                let name = format!("fan{k}");
                match run_case(params, &endpoint, &name, &mut case, &progress).await {
                    Ok(()) => progress.say(format!(
                        "  all-watchers p50 {} p99 {}; delivery p99 {}; {} deliveries/s; verified",
                        fmt_us(case.all_watchers.p50_us),
                        fmt_us(case.all_watchers.p99_us),
                        fmt_us(case.delivery_p99_us),
                        fmt_si(case.deliveries_per_sec)
                    )),
                    Err(e) => {
                        progress.say(format!("  FAILED: {e:#}"));
                        case.error = Some(format!("{e:#} (seed {})", params.seed));
                    }
                }
                cases.push(case);
            }
        }
    }
    drop(sluice);
    if let Some(r) = redis_server {
        tokio::task::spawn_blocking(move || drop(r)).await?;
    }
    progress.say(format!("done in {:.0}s", progress.elapsed_s()));
    Ok(cases)
}

enum Endpoint {
    Sluice(String),
    Redis(u16),
}

/// The watchers each record is addressed to; own-tag subsets are drawn as records are
/// sent, from the seeded generator.
struct Plan {
    /// Own-tag mode: addressees of record r at `subsets[r * per_record..][..per_record]`;
    /// one-tag mode: empty (everyone).
    subsets: Vec<u32>,
    per_record: usize,
    watchers: usize,
    own: bool,
    next: Box<dyn FnMut() -> u64 + Send>,
}

impl Plan {
    fn new(own: bool, watchers: usize, seed: u64) -> Plan {
        Plan {
            subsets: Vec::new(),
            per_record: if own {
                OWN_TAG_SUBSET.min(watchers)
            } else {
                watchers
            },
            watchers,
            own,
            next: Box::new(rng(seed)),
        }
    }

    fn addressed(&self, _r: u64) -> usize {
        self.per_record
    }

    /// The addressees of record `r` (own-tag mode; drawn up to `r` on first use).
    fn subset(&mut self, r: u64) -> &[u32] {
        let k = self.per_record;
        while self.subsets.len() < (r as usize + 1) * k {
            let start = self.subsets.len();
            while self.subsets.len() < start + k {
                let w = ((self.next)() % self.watchers as u64) as u32;
                if !self.subsets[start..].contains(&w) {
                    self.subsets.push(w);
                }
            }
        }
        &self.subsets[r as usize * k..(r as usize + 1) * k]
    }
}

/// xorshift64*, seeded: the subsets are reproducible from `--seed`.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

async fn run_case(
    params: &Params,
    endpoint: &Endpoint,
    name: &str,
    case: &mut Case,
    progress: &crate::progress::Progress,
) -> anyhow::Result<()> {
    let n = case.watchers;
    let own = case.filter == "own-tag";
    let per_record = if own { OWN_TAG_SUBSET.min(n) } else { n };
    // Fewer latency records when each reaches very many watchers.
    let latency_appends = params
        .appends
        .min((LATENCY_DELIVERIES_MAX / per_record as u64).max(if params.quick { 1 } else { 20 }));
    let sat_batch = (SAT_REQUEST_DELIVERIES / per_record).clamp(SAT_BATCH_MIN, SAT_BATCH_MAX);
    case.sat_batch = sat_batch;
    let sat_max = (SAT_DELIVERIES_MAX / per_record as u64).max(sat_batch as u64);
    let capacity = (latency_appends + sat_max) as usize;
    let mut plan = Plan::new(own, n, params.seed ^ ((n as u64) << 20));
    let shared = Arc::new(Shared::new(capacity, latency_appends));

    // Set up the topic / channels and the publisher.
    let mut publisher = match endpoint {
        Endpoint::Sluice(base) => {
            let http = reqwest::Client::builder()
                .no_proxy()
                .default_headers(crate::server::auth_headers())
                .timeout(Duration::from_secs(60))
                .build()?;
            let resp = http
                .put(format!("{base}/v1/topics/{name}"))
                .header("content-type", "application/json")
                .body(json!({"retain_records": capacity as u64 + 1}).to_string())
                .send()
                .await?;
            let status = resp.status();
            anyhow::ensure!(
                status.is_success(),
                "PUT /v1/topics/{name}: {status}: {}",
                resp.text().await.unwrap_or_default()
            );
            Publisher::Sluice {
                http,
                url: format!("{base}/v1/topics/{name}/records"),
                durability: params.durability.clone(),
            }
        }
        Endpoint::Redis(port) => Publisher::Redis {
            conn: resp::Conn::connect(*port).await?,
            streams: case.transport == Transport::RedisStreams,
            prefix: name.to_string(),
        },
    };
    let (addr, port) = match endpoint {
        Endpoint::Sluice(base) => (base.trim_start_matches("http://").to_string(), 0),
        Endpoint::Redis(port) => (format!("127.0.0.1:{port}"), *port),
    };
    let targets: Vec<watchers::Target> = (0..n)
        .map(|i| {
            let tag = if own {
                format!("w:{i}")
            } else {
                "all".to_string()
            };
            watchers::Target {
                transport: case.transport,
                addr: addr.clone(),
                port,
                topic: name.to_string(),
                // Redis: the channel / stream key carries the case name too.
                tag: Some(if case.transport.is_redis() {
                    format!("{name}:{tag}")
                } else {
                    tag
                }),
            }
        })
        .collect();
    let connecting = Instant::now();
    let (tasks, states) = watchers::start_all(
        targets,
        &shared,
        CONNECT_CONCURRENCY,
        Duration::from_secs(120),
    )
    .await?;
    case.connect_s = connecting.elapsed().as_secs_f64();
    progress.say(format!(
        "  {n} watchers registered in {:.2}s",
        case.connect_s
    ));
    let result = phases(
        params,
        &mut plan,
        &shared,
        &states,
        &mut publisher,
        case,
        latency_appends,
        sat_max,
    )
    .await;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Publisher::Sluice { http, .. } = &publisher {
        if let Endpoint::Sluice(base) = endpoint {
            // Free the topic's memory for the next case.
            let _ = http.delete(format!("{base}/v1/topics/{name}")).send().await;
        }
    }
    if let Publisher::Redis { conn, .. } = &mut publisher {
        if case.transport == Transport::RedisStreams {
            let _ = conn.call(&[b"FLUSHALL"]).await;
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn phases(
    params: &Params,
    plan: &mut Plan,
    shared: &Arc<Shared>,
    states: &[Arc<WatcherState>],
    publisher: &mut Publisher,
    case: &mut Case,
    latency_appends: u64,
    sat_max: u64,
) -> anyhow::Result<()> {
    let drain = Duration::from_secs_f64(params.drain_seconds);
    let sat_batch = case.sat_batch;
    // 1. Latency: one record at a time, each once the previous reached every addressee.
    let mut expected = 0u64;
    for i in 0..latency_appends {
        shared.sent[i as usize].store(shared.now_us().max(1), Ordering::Relaxed);
        publisher.send(plan, i, 1).await?;
        expected += plan.addressed(i) as u64;
        wait_for(shared, states, expected, drain).await?;
        tokio::time::sleep(LATENCY_PHASE_GAP).await;
    }
    case.latency_appends = latency_appends;
    let mut all = Latency::new();
    for i in 0..latency_appends as usize {
        let sent = shared.sent[i].load(Ordering::Relaxed);
        let recv = shared.last_recv[i].load(Ordering::Relaxed);
        all.record(Duration::from_micros(recv.saturating_sub(sent)));
    }
    case.all_watchers = all.summary();
    case.delivery_p50_us = shared.delivery.quantile(0.50);
    case.delivery_p95_us = shared.delivery.quantile(0.95);
    case.delivery_p99_us = shared.delivery.quantile(0.99);

    // 2. Saturation: batches back to back for a bounded time.
    let window = Duration::from_secs_f64(params.saturation_seconds);
    let first = latency_appends;
    let mut next = first;
    let sat_start_us = shared.now_us();
    let sat_start = Instant::now();
    let before = shared.deliveries.load(Ordering::Relaxed);
    while sat_start.elapsed() < window && next + sat_batch as u64 <= first + sat_max {
        let now = shared.now_us().max(1);
        for j in next..next + sat_batch as u64 {
            shared.sent[j as usize].store(now, Ordering::Relaxed);
            expected += plan.addressed(j) as u64;
        }
        publisher.send(plan, next, sat_batch).await?;
        next += sat_batch as u64;
    }
    wait_for(shared, states, expected, drain).await?;
    let last = (first..next)
        .map(|j| shared.last_recv[j as usize].load(Ordering::Relaxed))
        .max()
        .unwrap_or(sat_start_us);
    case.sat_records = next - first;
    case.sat_deliveries = shared.deliveries.load(Ordering::Relaxed) - before;
    case.sat_seconds = last.saturating_sub(sat_start_us) as f64 / 1e6;
    case.deliveries_per_sec = case.sat_deliveries as f64 / case.sat_seconds.max(1e-6);

    // 3. Every watcher got exactly its records, in order.
    verify(plan, states, next)?;
    case.verified = true;
    Ok(())
}

/// Waits until `expected` deliveries arrived in all; fails on a watcher error or after
/// `timeout`.
async fn wait_for(
    shared: &Shared,
    states: &[Arc<WatcherState>],
    expected: u64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let got = shared.deliveries.load(Ordering::Relaxed);
        if got >= expected {
            return Ok(());
        }
        if let Some(e) = watchers::first_error(states) {
            anyhow::bail!("a watcher failed: {e}");
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "the watchers received {got} of {expected} deliveries within {timeout:?} (--drain-seconds)"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Each watcher's count and order-sensitive hash against what was addressed to it among
/// records `0..sent`.
fn verify(plan: &mut Plan, states: &[Arc<WatcherState>], sent: u64) -> anyhow::Result<()> {
    let n = plan.watchers;
    let mut count = vec![0u64; n];
    let mut hash = vec![0u64; n];
    if !plan.own {
        let h = (0..sent).fold(0, fold);
        count.iter_mut().for_each(|c| *c = sent);
        hash.iter_mut().for_each(|x| *x = h);
    } else {
        for r in 0..sent {
            for &w in plan.subset(r) {
                count[w as usize] += 1;
                hash[w as usize] = fold(hash[w as usize], r);
            }
        }
    }
    let mut wrong = Vec::new();
    for (i, s) in states.iter().enumerate() {
        let (c, h) = (
            s.count.load(Ordering::Relaxed),
            s.hash.load(Ordering::Relaxed),
        );
        if let Some(e) = s.error.lock().expect("watcher error lock").clone() {
            wrong.push(format!("watcher {i}: {e}"));
        } else if s.out_of_order.load(Ordering::Relaxed) {
            wrong.push(format!("watcher {i}: records out of order"));
        } else if c != count[i] {
            wrong.push(format!("watcher {i}: {c} records, expected {}", count[i]));
        } else if h != hash[i] {
            wrong.push(format!(
                "watcher {i}: {c} records as expected but not the expected ones"
            ));
        }
    }
    anyhow::ensure!(
        wrong.is_empty(),
        "{} of {n} watchers did not receive exactly their records in order; first: {}",
        wrong.len(),
        wrong[..wrong.len().min(5)].join("; ")
    );
    Ok(())
}

enum Publisher {
    Sluice {
        http: reqwest::Client,
        url: String,
        durability: String,
    },
    Redis {
        conn: resp::Conn,
        streams: bool,
        prefix: String,
    },
}

impl Publisher {
    /// Sends records `first..first + count` (one request / one pipeline) and waits for the
    /// acknowledgement.
    async fn send(&mut self, plan: &mut Plan, first: u64, count: usize) -> anyhow::Result<()> {
        let range = first..first + count as u64;
        match self {
            Publisher::Sluice {
                http,
                url,
                durability,
            } => {
                let records: Vec<Value> = range
                    .map(|r| {
                        let tags: Vec<String> = if !plan.own {
                            vec!["all".into()]
                        } else {
                            plan.subset(r).iter().map(|w| format!("w:{w}")).collect()
                        };
                        json!({"tags": tags, "data": {"n": r}})
                    })
                    .collect();
                let body = json!({"records": records, "durability": durability}).to_string();
                let text = crate::live::client::post_json(http, url.as_str(), body)
                    .await
                    .context("append")?;
                let v: Value = serde_json::from_str(&text)?;
                anyhow::ensure!(
                    v["first"].as_u64() == Some(first),
                    "append got offsets {text}, expected to start at {first} (the topic is the case's own)"
                );
                Ok(())
            }
            Publisher::Redis {
                conn,
                streams,
                prefix,
            } => {
                let mut out = Vec::new();
                let mut replies = 0;
                for r in range {
                    let digits = r.to_string();
                    let mut one = |key: String| {
                        if *streams {
                            resp::encode(
                                &mut out,
                                &[b"XADD", key.as_bytes(), b"*", b"n", digits.as_bytes()],
                            );
                        } else {
                            resp::encode(
                                &mut out,
                                &[b"PUBLISH", key.as_bytes(), digits.as_bytes()],
                            );
                        }
                        replies += 1;
                    };
                    if !plan.own {
                        one(format!("{prefix}:all"));
                    } else {
                        for w in plan.subset(r) {
                            one(format!("{prefix}:w:{w}"));
                        }
                    }
                }
                conn.send(&out).await?;
                for _ in 0..replies {
                    if let resp::Value::Error(e) = conn.read().await? {
                        anyhow::bail!("redis: {e}");
                    }
                }
                Ok(())
            }
        }
    }
}

fn write_report(bench: &mut Bench, params: &Params, cases: &[Case]) {
    let report = &mut bench.report;
    report.intro.push(format!(
        "Append sent → record received. Sluice: a fresh topic per case, single-record appends \
         over HTTP (`{}` class) to watchers over SSE (`GET /v1/topics/{{t}}/watch`) or WebSocket \
         (`watch`); peers: Redis pub/sub (`SUBSCRIBE`/`PUBLISH`) and Redis Streams (`XREAD BLOCK` \
         readers, `XADD`), no persistence. **one tag**: every watcher on one tag (channel, \
         stream), every record to all; **own tag**: watcher i on `w:<i>`, each record to {} \
         random watchers (Redis: one PUBLISH/XADD per addressee, pipelined). The latency phase \
         sends single records, each once the previous one reached every addressee; *all \
         watchers* is the time until the last addressee has the record, *delivery* the time of \
         each single delivery. The saturation phase sends requests of about {} deliveries \
         (records × addressees, at least 10 records; column `records/request`) back to back for {:.1}s; deliveries/s counts \
         from the first send to the last delivery. Every case then checks that each watcher got \
         exactly its records, once each, in order. Watchers, server and Redis share this \
         machine's CPUs; one tokio task per watcher connection.",
        params.durability, OWN_TAG_SUBSET, SAT_REQUEST_DELIVERIES, params.saturation_seconds
    ));
    report.intro.push(
        "How to read the big cases: the watchers run in this process on the same CPUs as the \
         server and Redis, so a record to N watchers costs N socket writes there and N socket \
         reads here (one wake-up and one read per watcher connection), whichever server sends \
         it; Redis pub/sub in the same setup is the yardstick for what the machine allows."
            .into(),
    );
    let ok: Vec<&Case> = cases.iter().filter(|c| c.error.is_none()).collect();
    // Target 1: p99 at 10 000 watchers, per Sluice transport, one tag.
    for t in [Transport::Sse, Transport::Ws] {
        let best = ok
            .iter()
            .filter(|c| c.transport == t && c.filter == "one-tag")
            .max_by_key(|c| c.watchers);
        if let Some(c) = best {
            report.targets.push(Target {
                what: format!(
                    "append → every watcher p99, {} watchers, {}, one tag",
                    c.watchers,
                    t.name()
                ),
                goal: format!(
                    "< {} at {} watchers",
                    fmt_us(TARGET_P99_US),
                    TARGET_P99_WATCHERS
                ),
                measured: format!(
                    "{} (p50 {}, one delivery p99 {})",
                    fmt_us(c.all_watchers.p99_us),
                    fmt_us(c.all_watchers.p50_us),
                    fmt_us(c.delivery_p99_us)
                ),
                met: (c.watchers >= TARGET_P99_WATCHERS)
                    .then_some(c.all_watchers.p99_us < TARGET_P99_US),
            });
        }
    }
    // Target 2: deliveries/s at saturation vs Redis pub/sub, same watchers and mode.
    for t in [Transport::Sse, Transport::Ws] {
        for &filter in &params.filters {
            let best = ok
                .iter()
                .filter(|c| c.transport == t && c.filter == filter)
                .max_by_key(|c| c.watchers);
            let Some(c) = best else { continue };
            let peer = ok.iter().find(|p| {
                p.transport == Transport::RedisPubSub
                    && p.filter == filter
                    && p.watchers == c.watchers
            });
            if let Some(p) = peer {
                report.targets.push(Target {
                    what: format!(
                        "deliveries/s at saturation, {} {filter}, {} watchers, vs Redis pub/sub",
                        t.name(),
                        c.watchers
                    ),
                    goal: "≥ Redis pub/sub".into(),
                    measured: format!(
                        "{} vs {} ({})",
                        fmt_si(c.deliveries_per_sec),
                        fmt_si(p.deliveries_per_sec),
                        fmt_ratio(c.deliveries_per_sec / p.deliveries_per_sec.max(1e-9))
                    ),
                    met: Some(c.deliveries_per_sec >= p.deliveries_per_sec),
                });
            }
        }
    }
    let mut table = Table::new(
        "Fan-out: append → watchers",
        &[
            "watchers",
            "filter",
            "transport",
            "all watchers p50",
            "p95",
            "p99",
            "one delivery p50",
            "p99",
            "records/request (saturation)",
            "deliveries/s (saturation)",
            "vs Redis pub/sub",
            "verified",
        ],
    );
    table.note = Some(
        "`all watchers`: append sent → the last addressed watcher has it. `one delivery`: \
         append sent → one watcher has it, over every delivery of the latency phase. \
         `verified`: every watcher received exactly its records, each once, in order."
            .into(),
    );
    let mut csv = Csv::new(&[
        "watchers",
        "filter",
        "transport",
        "latency_appends",
        "all_p50_us",
        "all_p95_us",
        "all_p99_us",
        "all_max_us",
        "delivery_p50_us",
        "delivery_p95_us",
        "delivery_p99_us",
        "sat_batch",
        "sat_records",
        "sat_deliveries",
        "sat_seconds",
        "deliveries_per_sec",
        "connect_s",
        "verified",
        "error",
    ]);
    for c in cases {
        let redis = cases.iter().find(|p| {
            p.error.is_none()
                && p.transport == Transport::RedisPubSub
                && p.filter == c.filter
                && p.watchers == c.watchers
        });
        let vs = match (redis, &c.error) {
            (Some(p), None) => fmt_ratio(c.deliveries_per_sec / p.deliveries_per_sec.max(1e-9)),
            _ => "—".into(),
        };
        if c.error.is_some() {
            table.failed_row(vec![
                c.watchers.to_string(),
                c.filter.into(),
                c.transport.name().into(),
            ]);
        } else {
            table.row(vec![
                c.watchers.to_string(),
                c.filter.into(),
                c.transport.name().into(),
                fmt_us(c.all_watchers.p50_us),
                fmt_us(c.all_watchers.p95_us),
                fmt_us(c.all_watchers.p99_us),
                fmt_us(c.delivery_p50_us),
                fmt_us(c.delivery_p99_us),
                c.sat_batch.to_string(),
                fmt_si(c.deliveries_per_sec),
                vs,
                if c.verified { "yes" } else { "no" }.into(),
            ]);
        }
        csv.row(vec![
            c.watchers.to_string(),
            c.filter.into(),
            c.transport.name().into(),
            c.latency_appends.to_string(),
            c.all_watchers.p50_us.to_string(),
            c.all_watchers.p95_us.to_string(),
            c.all_watchers.p99_us.to_string(),
            c.all_watchers.max_us.to_string(),
            c.delivery_p50_us.to_string(),
            c.delivery_p95_us.to_string(),
            c.delivery_p99_us.to_string(),
            c.sat_batch.to_string(),
            c.sat_records.to_string(),
            c.sat_deliveries.to_string(),
            format!("{:.3}", c.sat_seconds),
            format!("{:.0}", c.deliveries_per_sec),
            format!("{:.2}", c.connect_s),
            c.verified.to_string(),
            c.error.clone().unwrap_or_default(),
        ]);
    }
    report.tables.push(table);
    report.csv = Some(csv);
    for &filter in &params.filters {
        let categories: Vec<usize> = params.watchers.clone();
        let series = |f: &dyn Fn(&Case) -> f64| -> Vec<BarSeries> {
            params
                .transports
                .iter()
                .map(|&t| BarSeries {
                    name: t.name().into(),
                    values: categories
                        .iter()
                        .map(|&w| {
                            ok.iter()
                                .find(|c| c.transport == t && c.filter == filter && c.watchers == w)
                                .map(|c| f(c))
                        })
                        .collect(),
                })
                .collect()
        };
        report.chart(
            &format!("p99_{filter}.svg"),
            &format!("append → every watcher p99 by watchers ({filter})"),
            BarChart {
                title: format!("Append → every watcher, p99 ({filter})"),
                x_label: "watchers".into(),
                y_label: "ms".into(),
                categories: categories.iter().map(|w| w.to_string()).collect(),
                series: series(&|c| c.all_watchers.p99_us as f64 / 1e3),
            }
            .render(),
        );
        report.chart(
            &format!("deliveries_{filter}.svg"),
            &format!("deliveries/s at saturation by watchers ({filter})"),
            BarChart {
                title: format!("Deliveries/s at saturation ({filter})"),
                x_label: "watchers".into(),
                y_label: "deliveries/s".into(),
                categories: categories.iter().map(|w| w.to_string()).collect(),
                series: series(&|c| c.deliveries_per_sec),
            }
            .render(),
        );
    }
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.label(),
            c.error.as_deref().unwrap_or_default()
        ));
    }
    report.samples = json!({ "suite": "fanout", "params": params, "cases": cases });
}

/// Checks the samples of a fan-out run: at least one case, every case verified.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "samples.json has no cases");
    for c in cases {
        anyhow::ensure!(
            c["error"].is_null() && c["verified"] == true,
            "case {} {} {} did not verify: {}",
            c["transport"],
            c["filter"],
            c["watchers"],
            c["error"]
        );
        anyhow::ensure!(
            c["sat_deliveries"].as_u64().unwrap_or(0) > 0,
            "case {} has no deliveries",
            c["transport"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_tag_plan_counts_addressees() {
        let mut next = rng(7);
        let a: Vec<u64> = (0..4).map(|_| next()).collect();
        let mut again = rng(7);
        assert_eq!(a, (0..4).map(|_| again()).collect::<Vec<_>>(), "seeded");
        let mut plan = Plan::new(true, 20, 3);
        assert_eq!(plan.addressed(0), OWN_TAG_SUBSET);
        let s5 = plan.subset(5).to_vec();
        assert_eq!(s5.len(), OWN_TAG_SUBSET);
        assert!(s5.iter().all(|&w| w < 20));
        let mut distinct = s5.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            OWN_TAG_SUBSET,
            "no watcher twice in one subset"
        );
        assert_eq!(Plan::new(true, 20, 3).subset(5), &s5[..], "seeded");
        assert_eq!(Plan::new(false, 3, 1).addressed(5), 3);
    }
}
