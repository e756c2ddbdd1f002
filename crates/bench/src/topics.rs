//! The topic rows of `sluice bench ingest`: appends in-process (the engine's
//! `TxRef::append` on a `Db`, no log, no server), over HTTP and WebSocket per durability
//! class, Redis `XADD` and PostgreSQL `COPY` as peers; and the tag index micro-benchmark
//! (exact and prefix lookups at 1 K / 100 K / 1 M distinct tags).
//!
//! Every record carries a 64-byte `data` (compact JSON); the in-process cases run with
//! and without one tag per record.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use sluice_engine::{Changelog, Db, Limits, Retention, TopicConfig};

use crate::harness::{measure, measure_sync, Csv, Window};
use crate::hist::{fmt_ratio, fmt_si, fmt_us, LatencySummary};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::svg::{BarChart, BarSeries};

/// Goal: in-process appends, batched (≥ 100 records per commit).
pub const TARGET_INPROC_RECORDS_PER_SEC: f64 = 6e6;
/// Goal: HTTP appends, batched, aggregate over clients.
pub const TARGET_HTTP_RECORDS_PER_SEC: f64 = 1e6;
/// Goal: fsync class as a share of the disk class (HTTP, batched).
pub const TARGET_FSYNC_SHARE: f64 = 0.5;
/// Goal: one exact tag lookup.
pub const TARGET_EXACT_NS: f64 = 200.0;
/// Compact JSON size of every record's data.
pub const PAYLOAD_BYTES: usize = 64;
/// The topic every append case writes.
pub const TOPIC: &str = "bench";

/// A 64-byte compact JSON object: `{"n":<n>,"p":"xxxx…"}` padded to [`PAYLOAD_BYTES`].
pub fn payload(n: u64) -> Value {
    let head = format!("{{\"n\":{n},\"p\":\"\"}}").len();
    json!({ "n": n, "p": "x".repeat(PAYLOAD_BYTES.saturating_sub(head)) })
}

/// An engine `Db` with one topic big enough for the run (retention by count only, high).
fn inproc_db(retain_records: u64) -> anyhow::Result<Db> {
    let limits = Limits {
        topic_retain_records: retain_records,
        topic_retain_bytes: 1 << 40,
        ..Limits::default()
    };
    let mut db = Db::new(limits, Changelog::new(Retention::default()));
    db.put_topic(
        TOPIC,
        Some(TopicConfig {
            retain_records,
            retain_bytes: 1 << 40,
            retain_secs: 0,
        }),
    )
    .map_err(|e| anyhow::anyhow!("put_topic: {e}"))?;
    Ok(db)
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// One topic append case: who, how, and what it measured.
#[derive(Clone, Debug, Serialize)]
pub struct AppendCase {
    /// `inproc`, `http`, `ws`, `redis-xadd`, `postgres-copy`.
    pub kind: &'static str,
    /// Durability class (or the peer's setting).
    pub class: String,
    /// Records per commit / request / pipeline / COPY.
    pub batch: u64,
    /// Concurrent clients (1 in-process).
    pub clients: usize,
    /// Tags per record.
    pub tags: usize,
    pub seconds: f64,
    pub records: u64,
    pub records_per_sec: f64,
    /// Latency of one batch (commit, request, pipeline or COPY).
    pub latency: LatencySummary,
    pub error: Option<String>,
}

impl AppendCase {
    pub fn new(kind: &'static str, class: &str, batch: u64, clients: usize, tags: usize) -> Self {
        AppendCase {
            kind,
            class: class.to_string(),
            batch,
            clients,
            tags,
            seconds: 0.0,
            records: 0,
            records_per_sec: 0.0,
            latency: LatencySummary::default(),
            error: None,
        }
    }

    pub fn label(&self) -> String {
        let who = match self.kind {
            "inproc" => "in-process",
            "http" => "HTTP",
            "ws" => "WebSocket",
            "redis-xadd" => "Redis XADD",
            "postgres-copy" => "PostgreSQL COPY",
            k => k,
        };
        format!(
            "{who} {}, {} records/batch, {} client(s), {} tag(s)",
            self.class, self.batch, self.clients, self.tags
        )
    }

    pub fn set(&mut self, r: anyhow::Result<Window>) {
        match r {
            Ok(w) => {
                self.seconds = w.seconds;
                self.records = w.items;
                self.records_per_sec = w.items_per_sec();
                self.latency = w.latency.summary();
            }
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }
}

/// In-process appends: one commit of `batch` records per step, `tags` tags per record
/// (from 1 000 distinct), for `window` after `warmup`.
pub fn inproc_append(batch: u64, tags: usize, warmup: Duration, window: Duration) -> AppendCase {
    let mut case = AppendCase::new("inproc", "engine (no log)", batch, 1, tags);
    let run = || -> anyhow::Result<Window> {
        // Retention keeps 1 M records: a long run trims, as a real topic does.
        let mut db = inproc_db(1_000_000)?;
        let data = payload(0);
        let mut n = 0u64;
        let tag_names: Vec<String> = (0..1000).map(|i| format!("room:{i}")).collect();
        measure_sync(warmup, window, u64::MAX, || {
            let ts = now_us();
            let mut tx = db.transaction();
            for _ in 0..batch {
                let t = if tags == 0 {
                    Vec::new()
                } else {
                    (0..tags)
                        .map(|k| tag_names[(n as usize + k) % tag_names.len()].clone())
                        .collect()
                };
                tx.append(TOPIC, t, &data, ts)
                    .map_err(|e| anyhow::anyhow!("append: {e}"))?;
                n += 1;
            }
            tx.commit().context("an append commit is never empty")?;
            Ok(batch)
        })
    };
    case.set(run());
    case
}

/// The tag index micro-benchmark at one size.
#[derive(Clone, Debug, Serialize)]
pub struct TagCase {
    /// Distinct tags in the topic (one record each).
    pub tags: u64,
    /// Seconds to build the topic (appends of 1 000 records per commit).
    pub build_s: f64,
    /// Mean ns per exact lookup of a present tag, random order.
    pub exact_ns: f64,
    /// p50 and p99 over batches of [`TAG_BATCH`] lookups (ns per lookup within a batch).
    pub exact_p50_ns: f64,
    pub exact_p99_ns: f64,
    /// Mean ns per exact lookup of an absent tag.
    pub exact_miss_ns: f64,
    /// Mean ns per prefix lookup matching 10 tags, iterating all of them.
    pub prefix10_ns: f64,
    pub prefix10_p99_ns: f64,
    /// Lookups timed per kind.
    pub lookups: u64,
    pub error: Option<String>,
}

/// Lookups timed together; per-lookup clocks would cost more than a lookup.
pub const TAG_BATCH: usize = 100;

/// Builds a topic with `n` distinct tags (`t:0000000` …) and times lookups for about
/// `window` per kind.
pub fn tag_lookups(n: u64, window: Duration, seed: u64) -> TagCase {
    let mut case = TagCase {
        tags: n,
        build_s: 0.0,
        exact_ns: 0.0,
        exact_p50_ns: 0.0,
        exact_p99_ns: 0.0,
        exact_miss_ns: 0.0,
        prefix10_ns: 0.0,
        prefix10_p99_ns: 0.0,
        lookups: 0,
        error: None,
    };
    if let Err(e) = tag_lookups_into(&mut case, n, window, seed) {
        case.error = Some(format!("{e:#}"));
    }
    case
}

fn tag_name(i: u64) -> String {
    format!("t:{i:07}")
}

fn tag_lookups_into(case: &mut TagCase, n: u64, window: Duration, seed: u64) -> anyhow::Result<()> {
    let built = Instant::now();
    let mut db = inproc_db(n.max(1))?;
    let data = payload(0);
    let mut i = 0u64;
    while i < n {
        let ts = now_us();
        let mut tx = db.transaction();
        for _ in 0..1000.min(n - i) {
            tx.append(TOPIC, vec![tag_name(i)], &data, ts)
                .map_err(|e| anyhow::anyhow!("append: {e}"))?;
            i += 1;
        }
        tx.commit();
    }
    case.build_s = built.elapsed().as_secs_f64();
    let topic = db.topics.get(TOPIC).context("the topic exists")?;
    let index = topic.tags();
    anyhow::ensure!(
        index.len() as u64 == n,
        "the index holds {} tags, expected {n}",
        index.len()
    );
    // Random present tags, in a random order (xorshift; the seed is in samples.json).
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let probes: Vec<String> = (0..100_000).map(|_| tag_name(next() % n)).collect();
    let misses: Vec<String> = (0..100_000).map(|k| format!("u:{k:07}")).collect();
    // Prefixes of 10 tags: `t:000012` matches t:0000120 … t:0000129 (n ≥ 10).
    let prefixes: Vec<String> = (0..100_000)
        .map(|_| {
            let t = tag_name(next() % n.max(10));
            t[..t.len() - 1].to_string()
        })
        .collect();
    let timed = |f: &dyn Fn(usize) -> usize| -> (f64, f64, f64, u64) {
        let mut per_batch = Vec::new();
        let started = Instant::now();
        let mut k = 0usize;
        let mut found = 0usize;
        while started.elapsed() < window || per_batch.is_empty() {
            let t = Instant::now();
            for _ in 0..TAG_BATCH {
                found += f(k % 100_000);
                k += 1;
            }
            per_batch.push(t.elapsed().as_nanos() as f64 / TAG_BATCH as f64);
        }
        black_box(found);
        let total = started.elapsed().as_nanos() as f64;
        per_batch.sort_by(f64::total_cmp);
        let at = |q: usize| per_batch[(per_batch.len() * q / 100).min(per_batch.len() - 1)];
        (total / k as f64, at(50), at(99), k as u64)
    };
    let (exact, exact_p50, exact_p99, count) = timed(&|k| {
        index
            .lookup_exact(black_box(&probes[k]))
            .map_or(0, |l| l.len())
    });
    let (miss, _, _, _) = timed(&|k| {
        index
            .lookup_exact(black_box(&misses[k]))
            .map_or(0, |l| l.len())
    });
    let (prefix, _, prefix_p99, _) = timed(&|k| {
        index
            .lookup_prefix(black_box(&prefixes[k]))
            .map(|(_, l)| l.len())
            .sum()
    });
    let matched: usize = index.lookup_prefix(&prefixes[0]).count();
    anyhow::ensure!(
        n < 10 || matched == 10,
        "prefix {:?} matched {matched} tags, expected 10",
        prefixes[0]
    );
    case.exact_ns = exact;
    case.exact_p50_ns = exact_p50;
    case.exact_p99_ns = exact_p99;
    case.exact_miss_ns = miss;
    case.prefix10_ns = prefix;
    case.prefix10_p99_ns = prefix_p99;
    case.lookups = count;
    Ok(())
}

/// Writes the append and tag tables, targets and charts into the ingest report.
pub fn write_report(report: &mut Report, appends: &[AppendCase], tags: &[TagCase]) {
    let ok = |c: &&AppendCase| c.error.is_none();
    let best = |kind: &str, class: Option<&str>, min_batch: u64| {
        appends
            .iter()
            .filter(ok)
            .filter(|c| c.kind == kind && c.batch >= min_batch)
            .filter(|c| class.is_none_or(|k| c.class == k))
            .max_by(|a, b| a.records_per_sec.total_cmp(&b.records_per_sec))
    };
    if let Some(c) = best("inproc", None, 100) {
        report.targets.push(Target {
            what: "topic appends in-process, batched (≥ 100 records/commit)".into(),
            goal: format!("≥ {} records/s", fmt_si(TARGET_INPROC_RECORDS_PER_SEC)),
            measured: format!(
                "{} records/s ({} records/commit, {} tag(s))",
                fmt_si(c.records_per_sec),
                c.batch,
                c.tags
            ),
            met: Some(c.records_per_sec >= TARGET_INPROC_RECORDS_PER_SEC),
        });
    }
    if let Some(c) = best("http", None, 100) {
        report.targets.push(Target {
            what: "topic appends over HTTP, batched, aggregate".into(),
            goal: format!("≥ {} records/s", fmt_si(TARGET_HTTP_RECORDS_PER_SEC)),
            measured: format!(
                "{} records/s ({} class, {} clients, {} records/request)",
                fmt_si(c.records_per_sec),
                c.class,
                c.clients,
                c.batch
            ),
            met: Some(c.records_per_sec >= TARGET_HTTP_RECORDS_PER_SEC),
        });
    }
    for kind in ["http", "ws"] {
        if let (Some(f), Some(d)) = (best(kind, Some("fsync"), 1), best(kind, Some("disk"), 1)) {
            let share = f.records_per_sec / d.records_per_sec.max(1e-9);
            report.targets.push(Target {
                what: format!("topic appends {kind}: fsync class vs disk class (best of each)"),
                goal: format!("≥ {:.0}% of disk", TARGET_FSYNC_SHARE * 100.0),
                measured: format!(
                    "{:.0}% ({} vs {} records/s)",
                    share * 100.0,
                    fmt_si(f.records_per_sec),
                    fmt_si(d.records_per_sec)
                ),
                met: Some(share >= TARGET_FSYNC_SHARE),
            });
        }
    }
    for (class, peer) in [("disk", "everysec"), ("fsync", "always")] {
        let (Some(s), Some(r)) = (
            best("http", Some(class), 1).or(best("ws", Some(class), 1)),
            best("redis-xadd", Some(peer), 1),
        ) else {
            continue;
        };
        report.targets.push(Target {
            what: format!("sluice {class} vs Redis XADD appendfsync {peer} (best of each)"),
            goal: "reported".into(),
            measured: format!(
                "{} ({} vs {} records/s)",
                fmt_ratio(s.records_per_sec / r.records_per_sec.max(1e-9)),
                fmt_si(s.records_per_sec),
                fmt_si(r.records_per_sec)
            ),
            met: None,
        });
    }
    if let Some(t) = tags
        .iter()
        .filter(|t| t.error.is_none())
        .max_by_key(|t| t.tags)
    {
        report.targets.push(Target {
            what: format!(
                "exact tag lookup at {} distinct tags",
                fmt_si(t.tags as f64)
            ),
            goal: format!("< {TARGET_EXACT_NS:.0} ns"),
            measured: format!(
                "{:.0} ns mean ({:.0} ns p50, {:.0} ns p99 of batches)",
                t.exact_ns, t.exact_p50_ns, t.exact_p99_ns
            ),
            met: Some(t.exact_ns < TARGET_EXACT_NS),
        });
    }

    let mut table = Table::new(
        "Topic appends (64-byte records)",
        &[
            "path",
            "class",
            "records/batch",
            "clients",
            "tags",
            "records/s",
            "batch p50",
            "batch p99",
        ],
    );
    table.note = Some(
        "A batch is one commit in-process, one request over HTTP and WebSocket (one commit, \
         acked once its class is reached), one pipeline of XADDs for Redis, one COPY for \
         PostgreSQL (synchronous_commit=on). In-process appends go to the engine alone (no log)."
            .into(),
    );
    let mut csv = report.csv.take().unwrap_or_else(|| {
        Csv::new(&[
            "case",
            "path",
            "class",
            "batch",
            "clients",
            "tags",
            "records_per_sec",
            "p50_us",
            "p99_us",
            "error",
        ])
    });
    for c in appends {
        let (rate, p50, p99) = match &c.error {
            None => (
                fmt_si(c.records_per_sec),
                fmt_us(c.latency.p50_us),
                fmt_us(c.latency.p99_us),
            ),
            Some(_) => ("failed".into(), "—".into(), "—".into()),
        };
        table.row(vec![
            c.kind.to_string(),
            c.class.clone(),
            c.batch.to_string(),
            c.clients.to_string(),
            c.tags.to_string(),
            rate,
            p50,
            p99,
        ]);
        csv.row(vec![
            "topic-append".into(),
            c.kind.into(),
            c.class.clone(),
            c.batch.to_string(),
            c.clients.to_string(),
            c.tags.to_string(),
            format!("{:.0}", c.records_per_sec),
            c.latency.p50_us.to_string(),
            c.latency.p99_us.to_string(),
            c.error.clone().unwrap_or_default(),
        ]);
    }
    report.tables.push(table);
    let mut tt = Table::new(
        "Tag index lookups (one topic, one record per tag)",
        &[
            "distinct tags",
            "build",
            "exact (hit)",
            "exact p50",
            "exact p99",
            "exact (miss)",
            "prefix → 10 tags",
            "prefix p99",
        ],
    );
    tt.note = Some(format!(
        "Times per lookup: the mean over the whole timed loop, and p50/p99 over batches of \
         {TAG_BATCH} lookups of random tags (a clock read per lookup would cost more than the \
         lookup). Prefix lookups iterate every matching tag's posting list."
    ));
    for t in tags {
        if t.error.is_some() {
            tt.failed_row(vec![fmt_si(t.tags as f64)]);
            continue;
        }
        tt.row(vec![
            fmt_si(t.tags as f64),
            format!("{:.2} s", t.build_s),
            format!("{:.0} ns", t.exact_ns),
            format!("{:.0} ns", t.exact_p50_ns),
            format!("{:.0} ns", t.exact_p99_ns),
            format!("{:.0} ns", t.exact_miss_ns),
            format!("{:.0} ns", t.prefix10_ns),
            format!("{:.0} ns", t.prefix10_p99_ns),
        ]);
        csv.row(vec![
            "tag-lookup".into(),
            "inproc".into(),
            format!("{} tags", t.tags),
            "1".into(),
            "1".into(),
            "1".into(),
            format!("{:.0}", 1e9 / t.exact_ns.max(1e-9)),
            format!("{:.3}", t.exact_ns / 1e3),
            format!("{:.3}", t.exact_p99_ns / 1e3),
            String::new(),
        ]);
    }
    report.tables.push(tt);
    report.csv = Some(csv);

    let measured: Vec<&AppendCase> = appends.iter().filter(ok).collect();
    if !measured.is_empty() {
        report.chart(
            "topic_appends.svg",
            "Topic appends: records/s by path, class and batch",
            BarChart {
                title: "Topic appends (64-byte records)".into(),
                x_label: "path, class, records/batch, clients".into(),
                y_label: "records/s".into(),
                categories: measured
                    .iter()
                    .map(|c| format!("{} {} ×{} c{}", c.kind, c.class, c.batch, c.clients))
                    .collect(),
                series: vec![BarSeries {
                    name: "records/s".into(),
                    values: measured.iter().map(|c| Some(c.records_per_sec)).collect(),
                }],
            }
            .render(),
        );
    }
    for c in appends.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.label(),
            c.error.as_deref().unwrap_or_default()
        ));
    }
    for t in tags.iter().filter(|t| t.error.is_some()) {
        report.notes.push(format!(
            "FAILED: tag lookups at {} tags: {}",
            t.tags,
            t.error.as_deref().unwrap_or_default()
        ));
    }
}

/// Runs the in-process append cases and the tag micro-benchmark.
pub fn run_inproc(
    batches: &[u64],
    tag_sizes: &[u64],
    warmup: Duration,
    window: Duration,
    seed: u64,
    progress: &Progress,
) -> (Vec<AppendCase>, Vec<TagCase>) {
    let mut appends = Vec::new();
    let mut shapes: Vec<(u64, usize)> = batches.iter().map(|&b| (b, 0)).collect();
    if let Some(&b) = batches.iter().max() {
        shapes.push((b, 1));
    }
    for (batch, tags) in shapes {
        progress.say(format!(
            "topic appends in-process, {batch} records/commit, {tags} tag(s)"
        ));
        let c = inproc_append(batch, tags, warmup, window);
        progress.say(format!("  {} records/s", fmt_si(c.records_per_sec)));
        appends.push(c);
    }
    let mut tags = Vec::new();
    for &n in tag_sizes {
        progress.say(format!("tag index: {} distinct tags", fmt_si(n as f64)));
        let t = tag_lookups(n, window.min(Duration::from_secs(2)), seed);
        progress.say(format!(
            "  exact {:.0} ns, prefix→10 {:.0} ns",
            t.exact_ns, t.prefix10_ns
        ));
        tags.push(t);
    }
    (appends, tags)
}

/// Appends over HTTP: `clients` keep-alive clients each posting `batch` records per
/// request with `durability`.
pub async fn http_append(
    base_url: &str,
    class: &str,
    batch: u64,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> AppendCase {
    let mut case = AppendCase::new("http", class, batch, clients, 1);
    let url = format!("{base_url}/v1/topics/{TOPIC}/records");
    let body: Arc<Vec<u8>> = Arc::new(
        serde_json::to_vec(&json!({
            "records": (0..batch)
                .map(|i| json!({"tags": [format!("room:{}", i % 100)], "data": payload(i)}))
                .collect::<Vec<_>>(),
            "durability": class,
        }))
        .expect("JSON"),
    );
    let http = match reqwest::Client::builder()
        .default_headers(crate::server::auth_headers())
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            case.error = Some(e.to_string());
            return case;
        }
    };
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, url, body) = (http.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                measure(warmup, window, u64::MAX, || {
                    let (http, url, body) = (&http, &url, body.clone());
                    async move {
                        crate::live::client::post_json(http, url, (*body).clone()).await?;
                        Ok(batch)
                    }
                })
                .await
            })
        })
        .collect();
    case.set(merge_windows(tasks).await);
    case
}

/// Appends over WebSocket: `clients` connections each sending `append` requests of `batch`
/// records and waiting for each reply (closed loop).
pub async fn ws_append(
    ws_url: &str,
    class: &str,
    batch: u64,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> AppendCase {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut case = AppendCase::new("ws", class, batch, clients, 1);
    let records: Vec<Value> = (0..batch)
        .map(|i| json!({"tags": [format!("room:{}", i % 100)], "data": payload(i)}))
        .collect();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let url = ws_url.to_string();
            let records = records.clone();
            let class = class.to_string();
            tokio::spawn(async move {
                let request = crate::server::ws_request(&url, crate::server::admin_token(), None)?;
                let (ws, _) = tokio_tungstenite::connect_async_with_config(
                    request,
                    Some(crate::server::ws_config()),
                    false,
                )
                .await
                .with_context(|| format!("cannot connect to {url}"))?;
                let ws = Arc::new(tokio::sync::Mutex::new(ws));
                let mut id = 0u64;
                measure(warmup, window, u64::MAX, || {
                    id += 1;
                    let text = json!({"id": id, "type": "append", "topic": TOPIC,
                        "records": records, "durability": class})
                    .to_string();
                    let ws = ws.clone();
                    async move {
                        let mut ws = ws.lock().await;
                        ws.send(Message::text(text)).await?;
                        loop {
                            let msg = ws.next().await.context("the server closed")??;
                            let Message::Text(t) = msg else { continue };
                            let v: Value = serde_json::from_str(&t)?;
                            anyhow::ensure!(v["type"] == "result", "append failed: {v}");
                            return Ok(batch);
                        }
                    }
                })
                .await
            })
        })
        .collect();
    case.set(merge_windows(tasks).await);
    case
}

/// Joins per-client windows into one: records add up, latencies merge, the longest
/// window counts.
pub async fn merge_windows(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Window>>>,
) -> anyhow::Result<Window> {
    let mut total: Option<Window> = None;
    for t in tasks {
        let w = t.await.context("a client task panicked")??;
        match &mut total {
            None => total = Some(w),
            Some(acc) => {
                acc.seconds = acc.seconds.max(w.seconds);
                acc.ops += w.ops;
                acc.items += w.items;
                acc.latency.merge(&w.latency);
            }
        }
    }
    total.context("no client")
}

/// Redis `XADD` pipelined: each client sends `batch` XADDs (one field `d` = the payload,
/// a tag field `t`) and reads the replies.
pub async fn redis_xadd(
    port: u16,
    aof: &str,
    batch: u64,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> AppendCase {
    let mut case = AppendCase::new("redis-xadd", aof, batch, clients, 1);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                let conn = crate::peers::resp::Conn::connect(port).await?;
                let mut pipeline = Vec::new();
                for i in 0..batch {
                    let data = payload(i).to_string();
                    let tag = format!("room:{}", i % 100);
                    crate::peers::resp::encode(
                        &mut pipeline,
                        &[
                            b"XADD",
                            TOPIC.as_bytes(),
                            b"*",
                            b"t",
                            tag.as_bytes(),
                            b"d",
                            data.as_bytes(),
                        ],
                    );
                }
                let conn = Arc::new(tokio::sync::Mutex::new(conn));
                let pipeline = &pipeline;
                measure(warmup, window, u64::MAX, move || {
                    let conn = conn.clone();
                    async move {
                        let mut conn = conn.lock().await;
                        conn.send(pipeline).await?;
                        for _ in 0..batch {
                            if let crate::peers::resp::Value::Error(e) = conn.read().await? {
                                anyhow::bail!("XADD: {e}");
                            }
                        }
                        Ok(batch)
                    }
                })
                .await
            })
        })
        .collect();
    case.set(merge_windows(tasks).await);
    case
}

/// PostgreSQL `COPY … FROM STDIN` of `batch` rows per statement into a table of the
/// topic's shape (`offset bigserial, ts bigint, tags text[], data jsonb`).
pub async fn postgres_copy(
    pg: &crate::peers::postgres::Postgres,
    batch: u64,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> AppendCase {
    use futures_util::SinkExt;
    let mut case = AppendCase::new("postgres-copy", "synchronous_commit=on", batch, clients, 1);
    let setup = async {
        let c = pg.connect().await?;
        c.batch_execute(
            "DROP TABLE IF EXISTS topic_records;
             CREATE TABLE topic_records (\"offset\" bigserial PRIMARY KEY, ts bigint NOT NULL,
                 tags text[] NOT NULL, data jsonb NOT NULL)",
        )
        .await?;
        anyhow::Ok(())
    };
    if let Err(e) = setup.await {
        case.error = Some(format!("{e:#}"));
        return case;
    }
    let mut text = String::new();
    for i in 0..batch {
        // COPY text format: tab-separated, `\` escaped (the payload has none).
        text.push_str(&format!(
            "{}\t{{room:{}}}\t{}\n",
            now_us(),
            i % 100,
            payload(i)
        ));
    }
    let text = Arc::new(text);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = match pg.connect().await {
            Ok(c) => c,
            Err(e) => {
                case.error = Some(format!("{e:#}"));
                return case;
            }
        };
        let text = text.clone();
        tasks.push(tokio::spawn(async move {
            let client = &client;
            measure(warmup, window, u64::MAX, || {
                let text = text.clone();
                async move {
                    let sink = client
                        .copy_in("COPY topic_records (ts, tags, data) FROM STDIN")
                        .await?;
                    let mut sink = std::pin::pin!(sink);
                    sink.send(bytes_of(&text)).await?;
                    let n = sink.finish().await?;
                    anyhow::ensure!(n == batch, "COPY wrote {n} rows, expected {batch}");
                    Ok(batch)
                }
            })
            .await
        }));
    }
    case.set(merge_windows(tasks).await);
    case
}

fn bytes_of(s: &str) -> std::io::Cursor<Vec<u8>> {
    std::io::Cursor::new(s.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_64_bytes_of_compact_json() {
        for n in [0, 7, 123_456] {
            assert_eq!(payload(n).to_string().len(), PAYLOAD_BYTES, "n = {n}");
        }
    }

    #[test]
    fn tag_lookups_find_every_tag_and_ten_per_prefix() {
        let t = tag_lookups(1_000, Duration::from_millis(20), 42);
        assert_eq!(t.error, None, "seed 42");
        assert!(t.exact_ns > 0.0 && t.prefix10_ns > 0.0 && t.lookups > 0);
    }

    #[test]
    fn inproc_appends_count_whole_batches() {
        let c = inproc_append(10, 1, Duration::ZERO, Duration::from_millis(20));
        assert_eq!(c.error, None);
        assert!(
            c.records > 0 && c.records.is_multiple_of(10),
            "{}",
            c.records
        );
    }
}

/// What the ingest suite asks of the topic rows.
#[derive(Clone, Debug, Serialize)]
pub struct TopicParams {
    pub batches: Vec<u64>,
    pub clients: Vec<usize>,
    pub tag_sizes: Vec<u64>,
    pub classes: Vec<&'static str>,
    pub redis: bool,
    pub seed: u64,
}

/// Every topic case of one ingest run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TopicResults {
    pub appends: Vec<AppendCase>,
    pub tags: Vec<TagCase>,
}

impl TopicResults {
    pub fn failed(&self) -> usize {
        self.appends.iter().filter(|c| c.error.is_some()).count()
            + self.tags.iter().filter(|t| t.error.is_some()).count()
    }
}

/// Runs the topic rows: in-process, then one server for the HTTP and WebSocket cases of
/// every class (the class travels with each request), then Redis XADD per AOF setting and
/// PostgreSQL COPY (when `pg` is running).
#[allow(clippy::too_many_arguments)]
pub async fn run_cases(
    p: &TopicParams,
    bin: &std::path::Path,
    pg: Option<&crate::peers::postgres::Postgres>,
    warmup: Duration,
    window: Duration,
    progress: &Progress,
    report: &mut Report,
) -> TopicResults {
    let mut out = TopicResults::default();
    let (batches, sizes, seed) = (p.batches.clone(), p.tag_sizes.clone(), p.seed);
    let pr = *progress;
    let (appends, tags) = tokio::task::spawn_blocking(move || {
        run_inproc(&batches, &sizes, warmup, window, seed, &pr)
    })
    .await
    .unwrap_or_default();
    out.appends = appends;
    out.tags = tags;
    let big = *p.batches.iter().max().unwrap_or(&100);
    let server = crate::harness::Sluice::start(
        bin,
        "topics",
        &["--max-body-bytes".to_string(), (16u64 << 20).to_string()],
    )
    .await;
    match server {
        Err(e) => {
            let mut c = AppendCase::new("http", "all", big, 0, 1);
            c.error = Some(format!("cannot start the server: {e:#}"));
            out.appends.push(c);
        }
        Ok(server) => {
            let put = server
                .http_put(&format!("/v1/topics/{TOPIC}"), &json!({}))
                .await;
            if let Err(e) = put {
                let mut c = AppendCase::new("http", "all", big, 0, 1);
                c.error = Some(format!("PUT /v1/topics/{TOPIC}: {e:#}"));
                out.appends.push(c);
            } else {
                let ws_url = server.url("/v1/ws").replacen("http://", "ws://", 1);
                for class in &p.classes {
                    for &clients in &p.clients {
                        for (kind, batch) in [("http", 1u64), ("http", big), ("ws", big)] {
                            progress.say(format!(
                                "topic appends {kind} {class}, {batch} records/request, {clients} clients"
                            ));
                            let c = if kind == "http" {
                                http_append(&server.base_url, class, batch, clients, warmup, window)
                                    .await
                            } else {
                                ws_append(&ws_url, class, batch, clients, warmup, window).await
                            };
                            say_case(progress, &c);
                            out.appends.push(c);
                        }
                    }
                }
            }
        }
    }
    if p.redis {
        match crate::peers::redis::find_bin() {
            Err(e) => {
                let mut c = AppendCase::new("redis-xadd", "-", big, 0, 1);
                c.error = Some(format!("{e:#}"));
                out.appends.push(c);
            }
            Ok(redis_bin) => {
                for (aof, name) in [
                    (crate::peers::redis::Aof::EverySec, "everysec"),
                    (crate::peers::redis::Aof::Always, "always"),
                ] {
                    let redis = match crate::peers::redis::Redis::start(&redis_bin, aof, 1000).await
                    {
                        Ok(r) => r,
                        Err(e) => {
                            let mut c = AppendCase::new("redis-xadd", name, big, 0, 1);
                            c.error = Some(format!("{e:#}"));
                            out.appends.push(c);
                            continue;
                        }
                    };
                    report
                        .run_extra
                        .insert("redis_version".into(), json!(redis.version));
                    for &clients in &p.clients {
                        progress.say(format!(
                            "Redis XADD appendfsync {name}, pipelines of {big}, {clients} clients"
                        ));
                        let c = redis_xadd(redis.port, name, big, clients, warmup, window).await;
                        say_case(progress, &c);
                        out.appends.push(c);
                    }
                    tokio::task::spawn_blocking(move || drop(redis)).await.ok();
                }
            }
        }
    }
    if let Some(pg) = pg {
        for &clients in &p.clients {
            progress.say(format!("PostgreSQL COPY of {big} rows, {clients} clients"));
            let c = postgres_copy(pg, big, clients, warmup, window).await;
            say_case(progress, &c);
            out.appends.push(c);
        }
    }
    out
}

fn say_case(progress: &Progress, c: &AppendCase) {
    match &c.error {
        None => progress.say(format!(
            "  {} records/s, batch p99 {}",
            fmt_si(c.records_per_sec),
            fmt_us(c.latency.p99_us)
        )),
        Some(e) => progress.say(format!("  FAILED: {e}")),
    }
}
