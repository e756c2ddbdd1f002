//! `sluice bench cluster`: Sluice beyond one node. A 3-node NATS JetStream cluster (R3)
//! on loopback (`sluice_cluster::testkit`), a `sluice serve --cluster` leader and a
//! `--follower`, and:
//!
//! - **write classes**: `replicated` vs `fsync` (and `disk`) mutates over HTTP against
//!   the same leader, closed loop with `--clients` clients: TPS, ack p50/p99;
//! - **reads**: point reads (`GET /v1/tables/t/rows/{id}`) on the leader alone, then
//!   spread over the leader and the follower: reads/s by node count;
//! - **failover**: `kill -9` of the leader, then a `replicated` write retried against
//!   the follower every 20 ms: the time from the kill to the first write accepted (the
//!   lease's time to live, `--lease-ms`, is most of it).
//!
//! - **views over nodes**: `--views-per-node` (100 000) scoped live views (`SELECT * FROM msg
//!   WHERE room = $1`, one room each, subscribed with `subscribe_many` over one WebSocket)
//!   held on the leader, then also on a follower, then on a second follower (each node its
//!   own rooms); at each node count a writer sends one-row upserts to the leader over
//!   WebSocket at a fixed open-loop rate (`--views-rate`, 1 000/s) to random rooms among all
//!   the views held, for `--views-seconds`. Reports views held, their ratio to one node, and
//!   write→diff p50/p99 per node (measured from each write's scheduled time, so a writer
//!   that falls behind counts). Every acknowledged write must arrive as exactly one diff.
//!   The live client code is `live::load`'s (`subscriber`, `write_open_loop`). All nodes
//!   share the machine's cores: on one machine this shows that views spread and replicate,
//!   not the capacity of three machines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};

use futures_util::SinkExt;
use std::sync::atomic::Ordering;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{measure, runtime, Bench};
use crate::hist::{fmt_si, fmt_us, Latency};
use crate::live::client::Api as LiveApi;
use crate::live::load::{
    mix, subscriber, until, write_open_loop, Reader, WsSink, MSG_SCHEMA, ROOM_VIEW, SUBS_PER_FRAME,
};
use crate::live::Dist;
use crate::report::{Table, Target};
use crate::svg::{BarChart, BarSeries};
use crate::CommonArgs;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Concurrent HTTP clients per case.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds measured per case (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Rows the writes and reads pick from.
    #[arg(long, default_value_t = 10_000)]
    pub rows: u64,
    /// The leader lease's time to live (failover waits for it to lapse).
    #[arg(long, default_value_t = 3000)]
    pub lease_ms: u64,
    /// Live views each node holds in the views-over-nodes case (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    pub views_per_node: usize,
    /// Writes per second (open loop, to the leader) while the views are held.
    #[arg(long, default_value_t = 1_000)]
    pub views_rate: usize,
    /// Seconds of writes at each node count.
    #[arg(long, default_value_t = 10.0)]
    pub views_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
struct Params {
    clients: usize,
    seconds: f64,
    rows: u64,
    lease_ms: u64,
    views_per_node: usize,
    views_rate: usize,
    views_seconds: f64,
    quick: bool,
}

#[derive(Clone, Debug, Serialize)]
struct Case {
    name: String,
    /// Operations per second over the measured window.
    per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    ops: u64,
    error: Option<String>,
}

/// Runs the suite; `Ok(true)` when every case succeeded.
pub fn run(args: ClusterArgs) -> anyhow::Result<bool> {
    let quick = args.common.quick;
    let params = Params {
        clients: if quick { 4 } else { args.clients },
        seconds: if quick { 1.0 } else { args.seconds },
        rows: if quick { 500 } else { args.rows },
        lease_ms: if quick { 1500 } else { args.lease_ms },
        views_per_node: if quick {
            args.views_per_node.min(300)
        } else {
            args.views_per_node
        },
        views_rate: if quick { 200 } else { args.views_rate },
        views_seconds: if quick { 1.0 } else { args.views_seconds },
        quick,
    };
    let mut bench = Bench::new("cluster", &args.common, &params)?;
    let rt = runtime()?;
    let (cases, views, failover_ms) = rt.block_on(run_cases(&bench, &params))?;
    let failed = cases.iter().filter(|c| c.error.is_some()).count()
        + views
            .iter()
            .filter(|c| c.error.is_some() || !c.verified)
            .count()
        + usize::from(failover_ms.is_none());
    fill_report(&mut bench, &params, &cases, &views, failover_ms);
    bench.finish(failed)
}

async fn run_cases(
    bench: &Bench,
    p: &Params,
) -> anyhow::Result<(Vec<Case>, Vec<ViewsCase>, Option<f64>)> {
    let nats = sluice_cluster::testkit::NatsCluster::start(3)
        .await
        .context("cannot start the NATS cluster (Debian package nats-server)")?;
    let cluster = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--cluster",
            &nats.urls(),
            "--cluster-database",
            "bench",
            "--lease-ms",
            &p.lease_ms.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Room for the views-over-nodes case on every node.
        let per_conn = p.views_per_node.max(1024).to_string();
        v.extend(["--live-subscriptions-per-connection".to_string(), per_conn]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let leader = bench.sluice("cluster-leader", &cluster(&[])).await?;
    leader
        .sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, note TEXT)")
        .await?;
    let follower = bench
        .sluice("cluster-follower", &cluster(&["--follower"]))
        .await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .default_headers(crate::server::auth_headers())
        .timeout(Duration::from_secs(30))
        .build()?;
    // Load the rows the reads look up (replicated, so the follower has them too).
    let ops: Vec<Value> = (0..p.rows)
        .map(|id| json!({"op": "upsert", "table": "t", "row": {"id": id, "v": 0, "note": "x"}}))
        .collect();
    for chunk in ops.chunks(1000) {
        post(
            &http,
            &leader.url("/v1/mutate"),
            &json!({"ops": chunk, "durability": "replicated"}),
        )
        .await?;
    }
    let mut cases = Vec::new();
    for class in ["fsync", "replicated", "disk"] {
        let urls = vec![leader.url("/v1/mutate")];
        let case = clients(p, &http, urls, move |url, http, n| {
            let body = json!({"ops": [{"op": "upsert", "table": "t",
                "row": {"id": n % 1_000_000, "v": n, "note": "bench"}}], "durability": class});
            async move { post(&http, &url, &body).await.map(|_| 1) }
        })
        .await;
        cases.push(named(format!("write {class}"), case));
    }
    // Wait for the follower before reading from it.
    let target = leader.health_seq().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while follower.health_seq().await? < target {
        anyhow::ensure!(Instant::now() < deadline, "the follower did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows = p.rows;
    for (name, urls) in [
        ("reads 1 node", vec![leader.url("")]),
        ("reads 2 nodes", vec![leader.url(""), follower.url("")]),
    ] {
        let case = clients(p, &http, urls, move |base, http, n| {
            let url = format!("{base}/v1/tables/t/rows/{}", n % rows);
            async move {
                let resp = http.get(&url).send().await?;
                anyhow::ensure!(resp.status().is_success(), "GET {url}: {}", resp.status());
                Ok(1)
            }
        })
        .await;
        cases.push(named(name.into(), case));
    }
    let mut views = Vec::new();
    if p.views_per_node > 0 {
        // A second follower for the views (a read replica: it never takes the lease).
        let follower2 = bench
            .sluice(
                "cluster-follower-2",
                &cluster(&["--follower", "--no-takeover"]),
            )
            .await?;
        let nodes = [&leader.server, &follower.server, &follower2.server];
        if let Err(e) = views_over_nodes(bench, p, &nodes, &mut views).await {
            views.push(ViewsCase {
                error: Some(format!("{e:#}")),
                ..ViewsCase::default()
            });
        }
        drop(follower2);
    }
    // Failover: the follower takes the lease once it lapses.
    let mutate = follower.url("/v1/mutate");
    let body = json!({"ops": [{"op": "upsert", "table": "t", "row": {"id": 0, "v": -1}}],
                      "durability": "replicated"});
    let killed = Instant::now();
    leader.kill9();
    let mut failover_ms = None;
    while killed.elapsed() < Duration::from_secs(60) {
        if post(&http, &mutate, &body).await.is_ok() {
            failover_ms = Some(killed.elapsed().as_secs_f64() * 1e3);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(follower);
    drop(nats);
    Ok((cases, views, failover_ms))
}

/// One node count of the views-over-nodes case.
#[derive(Clone, Debug, Default, Serialize)]
struct ViewsCase {
    nodes: usize,
    /// Views subscribed (their snapshot received) over all nodes.
    views_held: u64,
    /// `views_held` over the one-node case's.
    ratio_to_one: f64,
    rate_target: usize,
    rate_achieved: f64,
    writes_acked: u64,
    diffs: u64,
    /// write→diff over every node, then per node (leader first).
    write_to_diff: Dist,
    per_node: Vec<Dist>,
    verified: bool,
    detail: String,
    error: Option<String>,
}

/// Subscribes rooms `rooms` to [`ROOM_VIEW`] on one connection to `base` with
/// `subscribe_many` frames; returns once every snapshot arrived.
async fn subscribe_range(
    base: &str,
    epoch: Instant,
    rooms: std::ops::Range<usize>,
) -> anyhow::Result<(WsSink, Reader)> {
    let (mut sink, reader) = subscriber(base, epoch, false).await?;
    let want = rooms.len() as u64;
    let rooms: Vec<usize> = rooms.collect();
    for (f, chunk) in rooms.chunks(SUBS_PER_FRAME).enumerate() {
        let subs: Vec<Value> = chunk
            .iter()
            .map(|&room| json!({"qid": room, "sql": ROOM_VIEW, "params": [room]}))
            .collect();
        let frame = json!({"id": f, "type": "subscribe_many", "subs": subs});
        sink.send(Message::Text(frame.to_string().into())).await?;
    }
    let live = reader.live.clone();
    until(VIEWS_SUBSCRIBE_TIMEOUT, "the views' snapshots", || {
        live.snapshots.load(Ordering::Relaxed) >= want || live.failures.load(Ordering::Relaxed) > 0
    })
    .await?;
    anyhow::ensure!(
        live.failures.load(Ordering::Relaxed) == 0,
        "a subscription on {base} was refused"
    );
    Ok((sink, reader))
}

/// Rows per preload mutate of the views' rooms (≈ 100 KB a commit).
const VIEWS_PRELOAD_BATCH: usize = 2_000;
/// How long subscribing one node's views may take.
const VIEWS_SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the last diffs may take after the writer stopped.
const VIEWS_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The views-over-nodes case: `nodes[0]` is the leader; node count 1, 2, 3 in turn.
async fn views_over_nodes(
    bench: &Bench,
    p: &Params,
    nodes: &[&crate::server::SluiceServer],
    cases: &mut Vec<ViewsCase>,
) -> anyhow::Result<()> {
    let v = p.views_per_node;
    let leader = &nodes[0].base_url;
    // One message per room, in commits small enough for one NATS message each (a commit
    // is published whole; nats-server's max_payload is 1 MiB by default).
    let api = LiveApi::new(leader)?;
    api.sql(MSG_SCHEMA).await?;
    api.preload(
        "msg",
        (0..v * nodes.len())
            .map(|room| format!("{{\"id\":{room},\"room\":{room},\"ts\":0,\"body\":\"hi\"}}")),
        VIEWS_PRELOAD_BATCH,
    )
    .await?;
    let target = nodes[0].health_seq().await?;
    for n in &nodes[1..] {
        let deadline = Instant::now() + Duration::from_secs(300);
        while n.health_seq().await? < target {
            anyhow::ensure!(Instant::now() < deadline, "a follower did not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let epoch = Instant::now();
    let mut held: Vec<(WsSink, Reader)> = Vec::new();
    for (k, node) in nodes.iter().enumerate() {
        let count = k + 1;
        let started = Instant::now();
        held.push(subscribe_range(&node.base_url, epoch, k * v..(k + 1) * v).await?);
        bench.progress.say(format!(
            "  views: {v} on node {count} in {:.1}s; writing at {}/s to {} rooms",
            started.elapsed().as_secs_f64(),
            p.views_rate,
            count * v
        ));
        let readers: Vec<&Reader> = held.iter().map(|(_, r)| r).collect();
        let diffs_now = || {
            readers
                .iter()
                .map(|r| r.live.diffs.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let diffs_before = diffs_now();
        let warm_us = (p.views_seconds * 0.2).min(1.0) * 1e6;
        let from = epoch.elapsed().as_micros() as u64 + warm_us as u64;
        for r in &readers {
            r.measure_from_us.store(from, Ordering::Relaxed);
            r.lat_us.lock().expect("not poisoned").clear();
            r.slow_us.lock().expect("not poisoned").clear();
        }
        let rooms = (count * v) as u64;
        let salt = epoch.elapsed().as_nanos() as u64;
        let row = move |i: u64, stamp: u64| {
            let room = mix(i ^ salt) % rooms;
            format!("{{\"id\":{room},\"room\":{room},\"ts\":{stamp},\"body\":\"w{i}\"}}")
        };
        let (acked, _, achieved) =
            write_open_loop(leader, epoch, p.views_rate, p.views_seconds, "msg", row).await?;
        let drained = until(VIEWS_DRAIN_TIMEOUT, "every write's diff", || {
            diffs_now() - diffs_before >= acked
        })
        .await;
        let diffs = diffs_now() - diffs_before;
        let mut all = Vec::new();
        let mut per_node = Vec::new();
        for r in &readers {
            let lat = std::mem::take(&mut *r.lat_us.lock().expect("not poisoned"));
            per_node.push(Dist::of(&lat));
            all.extend(lat);
        }
        let views_held: u64 = readers
            .iter()
            .map(|r| r.live.snapshots.load(Ordering::Relaxed))
            .sum();
        let one = cases.first().map_or(views_held, |c| c.views_held);
        cases.push(ViewsCase {
            nodes: count,
            views_held,
            ratio_to_one: views_held as f64 / one.max(1) as f64,
            rate_target: p.views_rate,
            rate_achieved: achieved,
            writes_acked: acked,
            diffs,
            write_to_diff: Dist::of(&all),
            per_node,
            verified: drained.is_ok() && diffs == acked && views_held == (count * v) as u64,
            detail: format!("{diffs} diffs for {acked} acknowledged writes"),
            error: None,
        });
    }
    for (sink, reader) in held {
        drop(sink);
        let seen = reader.finish().await?;
        if seen.resets > 0 || !seen.errors.is_empty() {
            for c in cases.iter_mut() {
                c.verified = false;
                c.detail.push_str(&format!(
                    "; {} resets, errors {:?}",
                    seen.resets, seen.errors
                ));
            }
        }
    }
    Ok(())
}

fn named(name: String, result: anyhow::Result<(u64, f64, Latency)>) -> Case {
    match result {
        Ok((ops, seconds, latency)) => {
            let s = latency.summary();
            Case {
                name,
                per_sec: ops as f64 / seconds.max(1e-9),
                p50_us: s.p50_us,
                p99_us: s.p99_us,
                ops,
                error: None,
            }
        }
        Err(e) => Case {
            name,
            per_sec: 0.0,
            p50_us: 0,
            p99_us: 0,
            ops: 0,
            error: Some(format!("{e:#}")),
        },
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Value> {
    let resp = http.post(url).json(body).send().await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "POST {url}: {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

/// `p.clients` closed-loop clients spread round-robin over `urls`, each measured with
/// [`measure`]; returns (ops, seconds, merged latency).
async fn clients<F, Fut>(
    p: &Params,
    http: &reqwest::Client,
    urls: Vec<String>,
    step: F,
) -> anyhow::Result<(u64, f64, Latency)>
where
    F: Fn(String, reqwest::Client, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send,
{
    let step = Arc::new(step);
    let window = Duration::from_secs_f64(p.seconds);
    let mut tasks = Vec::new();
    for c in 0..p.clients {
        let url = urls[c % urls.len()].clone();
        let http = http.clone();
        let step = step.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = (c as u64) << 32;
            measure(window / 5, window, u64::MAX, || {
                n += 1;
                step(url.clone(), http.clone(), n)
            })
            .await
        }));
    }
    let (mut ops, mut seconds, mut latency) = (0, 0f64, Latency::new());
    for t in tasks {
        let w = t.await??;
        ops += w.ops;
        seconds = seconds.max(w.seconds);
        latency.merge(&w.latency);
    }
    Ok((ops, seconds, latency))
}

fn fill_report(
    bench: &mut Bench,
    p: &Params,
    cases: &[Case],
    views: &[ViewsCase],
    failover_ms: Option<f64>,
) {
    let report = &mut bench.report;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    report.intro.push(format!(
        "A 3-node NATS JetStream cluster (R3) on loopback, a `sluice serve --cluster` leader and one `--follower` (a second follower for the views over nodes); {} HTTP clients per case, {} s measured per case. Every process — the Sluice nodes, the NATS nodes and the bench's clients — shares this machine's {cores} cores, so more nodes here add no CPU: the views-over-nodes rows show that views spread and stay exact, and what the spreading costs in latency, not three machines' capacity.",
        p.clients, p.seconds
    ));
    let per_sec = |name: &str| cases.iter().find(|c| c.name == name).map(|c| c.per_sec);
    if let (Some(r), Some(f)) = (per_sec("write replicated"), per_sec("write fsync")) {
        let ratio = r / f.max(1e-9);
        report.targets.push(Target {
            what: "`replicated` write TPS vs `fsync`".into(),
            goal: "≥ 50 %".into(),
            measured: format!("{:.0} %", ratio * 100.0),
            met: Some(ratio >= 0.5),
        });
    }
    report.targets.push(Target {
        what: "failover: kill -9 of the leader → first write accepted".into(),
        goal: format!("about the lease ({} ms)", p.lease_ms),
        measured: failover_ms.map_or("failed".into(), |ms| format!("{ms:.0} ms")),
        met: None,
    });
    let ok = |c: &&ViewsCase| c.error.is_none() && c.verified;
    let by_nodes = |n: usize| views.iter().filter(ok).find(|c| c.nodes == n);
    report.targets.push(match (by_nodes(1), by_nodes(3)) {
        (Some(one), Some(three)) => {
            let (p1, p3) = (one.write_to_diff.p50_us, three.write_to_diff.p50_us);
            Target {
                what: "live views held: 3 nodes vs 1, at the same write→diff latency (p50 within 1.5×)".into(),
                goal: "≥ 2.7×".into(),
                measured: format!(
                    "{:.2}× ({} vs {} views; p50 {} vs {})",
                    three.ratio_to_one,
                    three.views_held,
                    one.views_held,
                    fmt_us(p3 as u64),
                    fmt_us(p1 as u64)
                ),
                met: Some(three.ratio_to_one >= 2.7 && p3 <= 1.5 * p1.max(1.0)),
            }
        }
        _ => Target {
            what: "live views held: 3 nodes vs 1".into(),
            goal: "≥ 2.7×".into(),
            measured: if p.views_per_node == 0 {
                "not run (--views-per-node 0)".into()
            } else {
                "failed".into()
            },
            met: if p.views_per_node == 0 { None } else { Some(false) },
        },
    });
    let mut t = Table::new("Cases", &["case", "per second", "p50", "p99", "ops"]);
    for c in cases {
        if c.error.is_some() {
            t.failed_row(vec![c.name.clone()]);
        } else {
            t.row(vec![
                c.name.clone(),
                fmt_si(c.per_sec),
                fmt_us(c.p50_us),
                fmt_us(c.p99_us),
                c.ops.to_string(),
            ]);
        }
    }
    report.tables.push(t);
    if !views.is_empty() {
        let mut t = Table::new(
            format!(
                "Live views spread over nodes ({} views per node, writes at {}/s to the leader, {} s per node count; write→diff p50 / p99)",
                p.views_per_node, p.views_rate, p.views_seconds
            ),
            &[
                "nodes",
                "views held",
                "× 1 node",
                "writes/s",
                "all nodes",
                "leader",
                "follower 1",
                "follower 2",
                "verified",
            ],
        );
        for c in views {
            if c.error.is_some() {
                t.failed_row(vec![c.nodes.to_string()]);
                continue;
            }
            let pair =
                |d: &Dist| format!("{} / {}", fmt_us(d.p50_us as u64), fmt_us(d.p99_us as u64));
            let node = |i: usize| c.per_node.get(i).map_or("—".to_string(), pair);
            t.row(vec![
                c.nodes.to_string(),
                c.views_held.to_string(),
                format!("{:.2}×", c.ratio_to_one),
                format!("{:.0}", c.rate_achieved),
                pair(&c.write_to_diff),
                node(0),
                node(1),
                node(2),
                if c.verified {
                    "yes".into()
                } else {
                    format!("NO: {}", c.detail)
                },
            ]);
        }
        report.tables.push(t);
        let done: Vec<&ViewsCase> = views.iter().filter(ok).collect();
        report.chart(
            "views.svg",
            "live views held, by node count",
            BarChart {
                title: "Cluster: live views held by node count".into(),
                x_label: "nodes".into(),
                y_label: "views held".into(),
                categories: done.iter().map(|c| c.nodes.to_string()).collect(),
                series: vec![BarSeries {
                    name: "sluice".into(),
                    values: done.iter().map(|c| Some(c.views_held as f64)).collect(),
                }],
            }
            .render(),
        );
        report.chart(
            "views-latency.svg",
            "write→diff p50 (ms) over all nodes, by node count",
            BarChart {
                title: "Cluster: write→diff p50 by node count".into(),
                x_label: "nodes".into(),
                y_label: "ms".into(),
                categories: done.iter().map(|c| c.nodes.to_string()).collect(),
                series: vec![BarSeries {
                    name: "sluice".into(),
                    values: done
                        .iter()
                        .map(|c| Some(c.write_to_diff.p50_us / 1e3))
                        .collect(),
                }],
            }
            .render(),
        );
        for c in views {
            if let Some(e) = &c.error {
                report.notes.push(format!("FAILED: views over nodes: {e}"));
            } else if !c.verified {
                report.notes.push(format!(
                    "FAILED: views over {} nodes: {}",
                    c.nodes, c.detail
                ));
            }
        }
    }
    report.chart(
        "throughput.svg",
        "operations per second by case",
        BarChart {
            title: "Cluster: operations per second".into(),
            x_label: "case".into(),
            y_label: "ops / s".into(),
            categories: cases.iter().map(|c| c.name.clone()).collect(),
            series: vec![BarSeries {
                name: "sluice".into(),
                values: cases
                    .iter()
                    .map(|c| c.error.is_none().then_some(c.per_sec))
                    .collect(),
            }],
        }
        .render(),
    );
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.name,
            c.error.as_deref().unwrap_or_default()
        ));
    }
    if failover_ms.is_none() {
        report
            .notes
            .push("FAILED: failover: no write was accepted within 60 s of the kill".into());
    }
    report.samples = json!({
        "suite": "cluster",
        "params": p,
        "cases": cases,
        "views": views,
        "failover_ms": failover_ms,
    });
}

/// Checks a run's samples: every case succeeded with a rate, and failover was measured.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    for name in [
        "write fsync",
        "write replicated",
        "reads 1 node",
        "reads 2 nodes",
    ] {
        let c = cases
            .iter()
            .find(|c| c["name"] == name)
            .with_context(|| format!("no case {name:?}"))?;
        anyhow::ensure!(c["error"].is_null(), "case failed: {c}");
        anyhow::ensure!(c["per_sec"].as_f64().unwrap_or(0.0) > 0.0, "no rate: {c}");
    }
    anyhow::ensure!(
        samples["failover_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "failover was not measured"
    );
    let per_node = samples["params"]["views_per_node"].as_u64().unwrap_or(0);
    if per_node > 0 {
        let views = samples["views"]
            .as_array()
            .context("samples.json has no views cases")?;
        for n in 1..=3u64 {
            let c = views
                .iter()
                .find(|c| c["nodes"] == n)
                .with_context(|| format!("no views case over {n} nodes"))?;
            anyhow::ensure!(c["error"].is_null(), "views case failed: {c}");
            anyhow::ensure!(c["verified"] == true, "views case not verified: {c}");
            anyhow::ensure!(
                c["views_held"].as_u64() == Some(n * per_node),
                "{n} nodes hold {} views, not {}",
                c["views_held"],
                n * per_node
            );
            anyhow::ensure!(
                c["writes_acked"].as_u64().unwrap_or(0) > 0
                    && c["diffs"] == c["writes_acked"]
                    && c["per_node"].as_array().map(Vec::len) == Some(n as usize),
                "views case over {n} nodes: {c}"
            );
        }
    }
    Ok(())
}
