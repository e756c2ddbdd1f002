//! The load families (`sluice bench live --families load,million,coalesce`; run only when
//! named; their own report, `bench-results/live-load/`):
//!
//! - **load**: `--load-views` (100 000) scoped views (`SELECT * FROM msg WHERE room = $1`, one
//!   row per room), subscribed with `subscribe_many`; then, for each of `--load-rates`
//!   (10 000, 50 000 writes/s), open-loop writers send one-row upserts at that fixed rate
//!   over WebSocket `mutate`s for `--load-seconds`, each to a random room. Every row carries
//!   the time its write was *scheduled* (µs since the bench's epoch) in `ts`, so write→diff is
//!   measured from the schedule (a writer that falls behind counts against the server, no
//!   coordinated omission). Reports achieved writes/s and write→diff p50/p99.
//! - **million**: `--million-views` (1 000 000) such views on one server: heap bytes per idle
//!   view by the allocator's counters (`--count-allocations`), the subscribe rate with
//!   `subscribe_many` frames, and write→diff at a light open-loop rate (1 000 writes/s).
//! - **coalesce**: the hot-row workload: one view of `--hot-rows` (1 000) rows followed by one
//!   subscriber per `--coalesce-windows` (0, 10, 100 ms), each on its own connection; writers
//!   patch a row at `--hot-rate` (2 000) writes/s, 90 % of them into the hottest 10 % of the
//!   rows. Reports diffs received per commit (commits folded per diff) and bytes on the wire.
//!
//! Verification: under load every acknowledged write must reach its room's subscriber as a
//! diff (counts equal, no error or reset); a coalescing subscriber's view (row hashes, with the
//! documented checksum checked on every event) must equal a one-shot query at the end.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use super::client::{result_checksum, Api, Mat};
use super::{fmt_bytes, Ctx, Dist, Params};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::transfer::clients::connect_ws_as;
use crate::transfer::cpu::CpuSample;

/// Subscriptions per `subscribe_many` frame.
pub(crate) const SUBS_PER_FRAME: usize = 5_000;
/// Subscriptions per WebSocket connection.
const SUBS_PER_CONNECTION: usize = 250_000;
/// Writes per second one writer connection sends at most (more connections above).
const RATE_PER_WRITER: usize = 25_000;
/// How long the last diffs may take to arrive after the writers stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long subscribing may take.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(600);
/// The light rate at which the million-view case measures write→diff.
const MILLION_RATE: usize = 1_000;
/// Preload rows per mutate.
const PRELOAD_BATCH: usize = 50_000;

pub(crate) const MSG_SCHEMA: &str =
    "CREATE TABLE msg (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, \
    ts INTEGER NOT NULL, body TEXT); CREATE INDEX msg_room ON msg (room)";
pub(crate) const ROOM_VIEW: &str = "SELECT * FROM msg WHERE room = $1";
const HOT_SCHEMA: &str =
    "CREATE TABLE items (id INTEGER PRIMARY KEY, grp INTEGER NOT NULL, val INTEGER NOT NULL)";
const HOT_VIEW: &str = "SELECT * FROM items WHERE grp = 1";

/// The load families' parameters (after `--quick`).
#[derive(Clone, Debug, Serialize)]
pub struct LoadParams {
    pub rates: Vec<usize>,
    pub views: usize,
    pub seconds: f64,
    pub million_views: usize,
    pub hot_rows: usize,
    pub hot_rate: usize,
    pub windows: Vec<u32>,
}

/// One rate of the load family, or the million-view case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadCase {
    pub family: &'static str,
    pub views: usize,
    pub rate_target: usize,
    pub rate_achieved: f64,
    pub writes_acked: u64,
    pub diffs: u64,
    pub write_to_diff: Dist,
    /// How late the client sent each measured write after its schedule (its own share of
    /// write→diff).
    pub sent_late: Dist,
    /// CPU µs per write over the run: the server's threads by group (`writer`, `live`,
    /// `tokio`, `other`) and the bench client (`bench`: writers and subscribers' sockets).
    pub cpu_us_per_write: std::collections::BTreeMap<String, f64>,
    /// Subscribe all views: seconds and subscriptions/s.
    pub subscribe_s: Option<f64>,
    pub subscribes_per_s: Option<f64>,
    /// Heap bytes (allocator counters) per subscribed idle view.
    pub heap_bytes_per_view: Option<f64>,
    /// Writes slower than [`SLOW_US`], grouped into stalls by scheduled time.
    pub stalls: Vec<Stall>,
    /// CLOCK_MONOTONIC (s) when the measured part of the run began, which stall times count
    /// from: to match them with a trace taken meanwhile (`perf record -k CLOCK_MONOTONIC`).
    pub measured_from_monotonic_s: f64,
    pub verified: bool,
    pub detail: String,
    pub error: Option<String>,
}

/// A write→diff slower than this is part of a stall (the 50 K writes/s target's p99 bound).
pub(crate) const SLOW_US: f64 = 2_000.0;
/// Slow writes scheduled within this of each other belong to one stall.
const STALL_GAP_US: u64 = 5_000;

/// A run of slow writes: when it began (ms after the measured part of the run began), how
/// long its writes' schedule spans, how many writes and the slowest.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stall {
    pub at_ms: f64,
    pub span_ms: f64,
    pub writes: u64,
    pub max_us: f64,
}

/// Groups slow writes `(scheduled µs, write→diff µs)` into stalls: writes scheduled within
/// [`STALL_GAP_US`] of the previous one join its stall. Times count from `from_us`.
fn stalls_of(slow: &mut [(u64, f64)], from_us: u64) -> Vec<Stall> {
    slow.sort_unstable_by_key(|s| s.0);
    let mut stalls: Vec<Stall> = Vec::new();
    let mut last_us = 0;
    for &(ts, took_us) in slow.iter() {
        match stalls.last_mut() {
            Some(s) if ts - last_us <= STALL_GAP_US => {
                s.span_ms = (ts - from_us) as f64 / 1e3 - s.at_ms;
                s.writes += 1;
                s.max_us = s.max_us.max(took_us);
            }
            _ => stalls.push(Stall {
                at_ms: ts.saturating_sub(from_us) as f64 / 1e3,
                span_ms: 0.0,
                writes: 1,
                max_us: took_us,
            }),
        }
        last_us = ts;
    }
    stalls
}

/// How many stalls per case the summary lists.
const STALLS_LISTED: usize = 12;

/// One window of the coalesce family.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CoalesceCase {
    pub coalesce_ms: u32,
    pub rows: usize,
    pub rate_achieved: f64,
    pub commits: u64,
    pub diffs: u64,
    pub changes: u64,
    pub bytes: u64,
    pub commits_per_diff: f64,
    pub bytes_per_commit: f64,
    pub verified: bool,
    pub detail: String,
    pub error: Option<String>,
}

/// What one subscribing connection saw.
#[derive(Default)]
pub(crate) struct Seen {
    snapshots: u64,
    diffs: u64,
    changes: u64,
    bytes: u64,
    pub(crate) errors: Vec<String>,
    pub(crate) resets: u64,
    mats: HashMap<u64, Mat>,
}

/// Counters a reader keeps live, for waiting.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) snapshots: AtomicU64,
    pub(crate) diffs: AtomicU64,
    /// The newest seq a diff or snapshot carried.
    seq: AtomicU64,
    pub(crate) failures: AtomicU64,
}

pub(crate) struct Reader {
    pub(crate) live: Arc<Live>,
    /// write→diff of rows stamped at or after `measure_from_us`, taken by each run.
    pub(crate) lat_us: Arc<std::sync::Mutex<Vec<f64>>>,
    /// (scheduled µs, write→diff µs) of the measured writes slower than [`SLOW_US`]: the
    /// load family's stall timeline.
    pub(crate) slow_us: Arc<std::sync::Mutex<Vec<(u64, f64)>>>,
    pub(crate) measure_from_us: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<Seen>>,
}

pub(crate) type WsSink =
    futures_util::stream::SplitSink<crate::transfer::clients::WsStream, Message>;

/// Empties `v` with room for `n` items whose memory is already faulted in. A buffer that
/// grows (or is first touched) while a run is measured takes page faults on fresh memory,
/// and on this kind of VM a fault of a 2 MiB page held the bench's thread for 20–40 ms: a
/// stall of the client that the run counted against the server.
pub(crate) fn prefault<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    v.clear();
    v.reserve(n);
    v.resize(n, fill);
    std::hint::black_box(&mut *v);
    v.clear();
}

/// Opens a subscribing connection; its reader files events (keeping views when `mats`).
pub(crate) async fn subscriber(
    base: &str,
    epoch: Instant,
    mats: bool,
) -> anyhow::Result<(WsSink, Reader)> {
    let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
    let ws = connect_ws_as(&url, "sluice.json.v1", crate::server::admin_token()).await?;
    let (sink, mut stream) = ws.split();
    let live = Arc::new(Live::default());
    let measure_from_us = Arc::new(AtomicU64::new(u64::MAX));
    let (stop, mut stopped) = oneshot::channel();
    let lat_us = Arc::new(std::sync::Mutex::new(Vec::new()));
    let slow_us = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (l, m, lat, slow) = (
        live.clone(),
        measure_from_us.clone(),
        lat_us.clone(),
        slow_us.clone(),
    );
    let record = move |ts: u64, took_us: f64| {
        lat.lock().expect("not poisoned").push(took_us);
        if took_us > SLOW_US {
            slow.lock().expect("not poisoned").push((ts, took_us));
        }
    };
    let task = tokio::spawn(async move {
        let mut seen = Seen::default();
        loop {
            let message = tokio::select! {
                _ = &mut stopped => break,
                m = stream.next() => m,
            };
            let text = match message {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Err(e)) => return Err(anyhow::Error::from(e).context("reading")),
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(_)) => continue,
            };
            let now_us = epoch.elapsed().as_micros() as f64;
            seen.bytes += text.len() as u64;
            // Without materialised views, a diff is read by scanning its text (the client
            // shares the CPUs with the server: a `Value` per diff was its largest cost).
            if !mats && text.starts_with("{\"type\":\"diff\"") {
                if let Some(seq) = lean_u64(&text, "\"seq\":") {
                    seen.diffs += 1;
                    seen.changes += text.matches("{\"op\":").count() as u64;
                    let from = m.load(Ordering::Relaxed);
                    let mut rest = text.as_str();
                    while let Some(at) = rest.find("\"ts\":") {
                        rest = &rest[at + 5..];
                        if let Some(ts) = lean_u64(rest, "") {
                            if ts >= from {
                                record(ts, now_us - ts as f64);
                            }
                        }
                    }
                    l.seq.fetch_max(seq, Ordering::Relaxed);
                    l.diffs.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let v: Value = serde_json::from_str(text.as_str()).context("a frame")?;
            let qid = v["qid"].as_u64();
            let seq = v["seq"].as_u64().unwrap_or(0);
            match v["type"].as_str() {
                Some("diff") => {
                    let changes = v["changes"].as_array().map_or(&[][..], Vec::as_slice);
                    seen.diffs += 1;
                    seen.changes += changes.len() as u64;
                    let from = m.load(Ordering::Relaxed) as f64;
                    for c in changes {
                        if let Some(ts) = c["row"]["ts"].as_u64() {
                            if ts as f64 >= from {
                                record(ts, now_us - ts as f64);
                            }
                        }
                    }
                    if mats {
                        seen.mats.entry(qid.unwrap_or(0)).or_default().diff(&v)?;
                    }
                    l.seq.fetch_max(seq, Ordering::Relaxed);
                    l.diffs.fetch_add(1, Ordering::Relaxed);
                }
                Some("snapshot") => {
                    if v["more"].as_bool() == Some(true) {
                        // A chunk of a large snapshot: counted when its last chunk arrives.
                        if mats {
                            seen.mats
                                .entry(qid.unwrap_or(0))
                                .or_default()
                                .snapshot(&v)?;
                        }
                        continue;
                    }
                    seen.snapshots += 1;
                    if v["reset"].as_bool() == Some(true) {
                        seen.resets += 1;
                    }
                    if mats {
                        seen.mats
                            .entry(qid.unwrap_or(0))
                            .or_default()
                            .snapshot(&v)?;
                    }
                    l.seq.fetch_max(seq, Ordering::Relaxed);
                    l.snapshots.fetch_add(1, Ordering::Relaxed);
                }
                Some("error") => {
                    if seen.errors.len() < 5 {
                        seen.errors.push(v.to_string());
                    }
                    l.failures.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        Ok(seen)
    });
    Ok((
        sink,
        Reader {
            live,
            lat_us,
            slow_us,
            measure_from_us,
            stop: Some(stop),
            task,
        },
    ))
}

impl Reader {
    pub(crate) async fn finish(mut self) -> anyhow::Result<Seen> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.context("a reader panicked")?
    }
}

/// Waits until `done()` holds, or fails after `timeout` saying `what`.
pub(crate) async fn until(
    timeout: Duration,
    what: &str,
    done: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while !done() {
        anyhow::ensure!(started.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Subscribes rooms `0..v` to [`ROOM_VIEW`] with `subscribe_many` frames over as few
/// connections as [`SUBS_PER_CONNECTION`] allows; returns the sinks, the readers and the
/// seconds until the last snapshot arrived.
async fn subscribe_rooms(
    base: &str,
    epoch: Instant,
    v: usize,
    progress: &Progress,
) -> anyhow::Result<(Vec<WsSink>, Vec<Reader>, f64)> {
    let conns = v.div_ceil(SUBS_PER_CONNECTION).max(1);
    let mut sinks = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..conns {
        let (s, r) = subscriber(base, epoch, false).await?;
        sinks.push(s);
        readers.push(r);
    }
    let started = Instant::now();
    let sends = sinks.iter_mut().enumerate().map(|(c, sink)| async move {
        let rooms: Vec<usize> = (0..v).filter(|room| room % conns == c).collect();
        for (f, chunk) in rooms.chunks(SUBS_PER_FRAME).enumerate() {
            let subs: Vec<Value> = chunk
                .iter()
                .map(|&room| json!({"qid": room, "sql": ROOM_VIEW, "params": [room]}))
                .collect();
            let frame = json!({"id": f, "type": "subscribe_many", "subs": subs});
            sink.send(Message::Text(frame.to_string().into())).await?;
        }
        anyhow::Ok(())
    });
    futures_util::future::try_join_all(sends).await?;
    let lives: Vec<Arc<Live>> = readers.iter().map(|r| r.live.clone()).collect();
    let count = || {
        lives
            .iter()
            .map(|l| l.snapshots.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let failed = || lives.iter().any(|l| l.failures.load(Ordering::Relaxed) > 0);
    until(SUBSCRIBE_TIMEOUT, "the snapshots", || {
        count() >= v as u64 || failed()
    })
    .await?;
    anyhow::ensure!(!failed(), "a subscription was refused");
    let secs = started.elapsed().as_secs_f64();
    progress.say(format!(
        "  {v} views subscribed over {conns} connection(s) in {secs:.2}s ({:.0}/s)",
        v as f64 / secs
    ));
    Ok((sinks, readers, secs))
}

/// Sends one-row `mutate`s at `rate` per second for `seconds`, open loop, over enough
/// connections; `row(i, stamp_us)` renders the i-th write's row. Returns (acked, the last
/// acked seq, achieved writes/s).
pub(crate) async fn write_open_loop(
    base: &str,
    epoch: Instant,
    rate: usize,
    seconds: f64,
    table: &'static str,
    row: impl Fn(u64, u64) -> String + Send + Sync + Clone + 'static,
) -> anyhow::Result<(u64, u64, f64)> {
    let run = write_paced(base, epoch, rate, seconds, table, row).await?;
    Ok((run.acked, run.last_seq, run.achieved))
}

/// What an open-loop run did.
pub(crate) struct OpenLoop {
    pub(crate) acked: u64,
    pub(crate) last_seq: u64,
    pub(crate) achieved: f64,
    /// How late each write left the client after its scheduled time, µs: the client's own
    /// share of write→diff (measured from the schedule).
    pub(crate) late_us: Vec<f64>,
}

/// Below this, the pacer sends what is due instead of sleeping (a sleep costs a wake-up and
/// `nanosleep` overshoots by ~50–60 µs of timer slack anyway).
const PACER_SLEEP_MIN: Duration = Duration::from_micros(40);

/// [`write_open_loop`], and how late each write left. A pacing thread sleeps until each
/// write's scheduled time with the OS timer (~60 µs late) and hands the writes that are due to
/// the connections' tasks, which send each batch in one flush. (The tasks used to pace
/// themselves with `tokio::time::sleep`, whose 1 ms timer wheel sent writes up to a
/// millisecond after their stamp: at 1 000 writes/s that was most of the measured p50.)
pub(crate) async fn write_paced(
    base: &str,
    epoch: Instant,
    rate: usize,
    seconds: f64,
    table: &'static str,
    row: impl Fn(u64, u64) -> String + Send + Sync + Clone + 'static,
) -> anyhow::Result<OpenLoop> {
    let writers = rate.div_ceil(RATE_PER_WRITER).max(1);
    let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
    let total = (rate as f64 * seconds) as u64;
    let mut tasks = Vec::new();
    let mut queues = Vec::new();
    for w in 0..writers {
        let ws = connect_ws_as(&url, "sluice.json.v1", crate::server::admin_token()).await?;
        let (mut sink, mut stream) = ws.split();
        let n = (total + (writers - 1 - w) as u64) / writers as u64;
        let acks = tokio::spawn(async move {
            let (mut acked, mut last) = (0u64, 0u64);
            while acked < n {
                let Some(m) = stream.next().await else { break };
                if let Message::Text(t) = m? {
                    let (ok, seq) = lean_result(t.as_str())?;
                    anyhow::ensure!(ok, "a write failed: {t}");
                    last = last.max(seq);
                    acked += 1;
                }
            }
            anyhow::Ok((acked, last))
        });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, u64)>();
        queues.push(tx);
        let row = row.clone();
        let send = tokio::spawn(async move {
            let mut late = Vec::new();
            prefault(&mut late, n as usize, 0.0);
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                while let Some((i, due_us)) = next {
                    let frame = format!(
                        "{{\"type\":\"mutate\",\"id\":{i},\"ops\":[{{\"op\":\"upsert\",\"table\":\"{table}\",\"row\":{}}}]}}",
                        row(i, due_us)
                    );
                    late.push(epoch.elapsed().as_micros() as f64 - due_us as f64);
                    sink.feed(Message::Text(frame.into())).await?;
                    next = rx.try_recv().ok();
                }
                sink.flush().await?;
            }
            anyhow::Ok((sink, late))
        });
        tasks.push((send, acks));
    }
    let started = Instant::now();
    let start_us = epoch.elapsed().as_micros() as u64;
    let pacer = std::thread::Builder::new()
        .name("bench-pacer".into())
        .spawn(move || {
            let per_us = 1e6 / rate as f64;
            for i in 0..total {
                let due_us = start_us + (i as f64 * per_us) as u64;
                let now_us = epoch.elapsed().as_micros() as u64;
                if due_us > now_us + PACER_SLEEP_MIN.as_micros() as u64 {
                    std::thread::sleep(Duration::from_micros(due_us - now_us));
                }
                if queues[(i % writers as u64) as usize]
                    .send((i, due_us))
                    .is_err()
                {
                    return; // a writer failed; its error is reported below
                }
            }
        })?;
    let mut run = OpenLoop {
        acked: 0,
        last_seq: 0,
        achieved: 0.0,
        late_us: Vec::new(),
    };
    let mut sinks = Vec::new();
    for (send, acks) in tasks {
        let (sink, mut late) = send.await??;
        sinks.push(sink);
        run.late_us.append(&mut late);
        let (a, l) = acks.await??;
        run.acked += a;
        run.last_seq = run.last_seq.max(l);
    }
    let _ = pacer.join();
    let secs = started.elapsed().as_secs_f64();
    drop(sinks);
    run.achieved = run.acked as f64 / secs;
    Ok(run)
}

/// Whether a reply is a `result`, and its seq, read without building a `Value` for the
/// common case (`{"id":…,"type":"result",…,"seq":N,…}`); anything else is parsed.
fn lean_result(text: &str) -> anyhow::Result<(bool, u64)> {
    if text.starts_with("{\"type\":\"result\"") {
        if let Some(seq) = lean_u64(text, "\"seq\":") {
            return Ok((true, seq));
        }
    }
    let v: Value = serde_json::from_str(text)?;
    Ok((v["type"] == "result", v["seq"].as_u64().unwrap_or(0)))
}

/// The unsigned integer after the first `key` (e.g. `"seq":`) in `text`.
fn lean_u64(text: &str, key: &str) -> Option<u64> {
    let at = text.find(key)? + key.len();
    let digits = text[at..].bytes().take_while(u8::is_ascii_digit).count();
    text[at..at + digits].parse().ok()
}

/// Thread groups of the CPU columns: (group, prefix of the server thread's name).
const CPU_GROUPS: [(&str, &str); 3] = [
    ("writer", "sluice-writer"),
    ("live", "sluice-live"),
    ("tokio", "tokio-"),
];

/// A tiny deterministic generator.
pub(crate) fn mix(i: u64) -> u64 {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

/// Preloads one message per room.
pub(crate) async fn preload_rooms(api: &Api, v: usize) -> anyhow::Result<()> {
    api.sql(MSG_SCHEMA).await?;
    api.preload(
        "msg",
        (0..v).map(|room| format!("{{\"id\":{room},\"room\":{room},\"ts\":0,\"body\":\"hi\"}}")),
        PRELOAD_BATCH,
    )
    .await?;
    Ok(())
}

/// One open-loop run over rooms `0..v` already subscribed by `readers`.
#[allow(clippy::too_many_arguments)]
async fn load_run(
    base: &str,
    pid: u32,
    epoch: Instant,
    readers: &[Reader],
    v: usize,
    rate: usize,
    seconds: f64,
    case: &mut LoadCase,
) -> anyhow::Result<()> {
    let diffs_before: u64 = readers
        .iter()
        .map(|r| r.live.diffs.load(Ordering::Relaxed))
        .sum();
    // The first fifth (at most 1 s) warms up.
    let warm_us = (seconds * 0.2).min(1.0) * 1e6;
    let from = epoch.elapsed().as_micros() as u64 + warm_us as u64;
    let mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    case.measured_from_monotonic_s =
        mono.tv_sec as f64 + mono.tv_nsec as f64 * 1e-9 + warm_us * 1e-6;
    // Each reader hears about its share of the writes: room for twice that, faulted in now.
    let per_reader = (rate as f64 * seconds) as usize * 2 / readers.len().max(1);
    for r in readers {
        r.measure_from_us.store(from, Ordering::Relaxed);
        prefault(&mut r.lat_us.lock().expect("not poisoned"), per_reader, 0.0);
        r.slow_us.lock().expect("not poisoned").clear();
    }
    let salt = epoch.elapsed().as_nanos() as u64;
    let row = move |i: u64, stamp: u64| {
        let room = mix(i ^ salt) % v as u64;
        format!("{{\"id\":{room},\"room\":{room},\"ts\":{stamp},\"body\":\"w{i}\"}}")
    };
    let cpu_before = CpuSample::take(Some(pid), true);
    let run = write_paced(base, epoch, rate, seconds, "msg", row).await?;
    let cpu = CpuSample::take(Some(pid), true).since(&cpu_before);
    let (acked, achieved) = (run.acked, run.achieved);
    case.writes_acked = acked;
    case.rate_achieved = achieved;
    case.cpu_us_per_write = cpu.us_per_op(&CPU_GROUPS, achieved, true);
    let late: Vec<f64> = run
        .late_us
        .iter()
        .skip((run.late_us.len() as f64 * 0.2).min(rate as f64) as usize)
        .copied()
        .collect();
    case.sent_late = Dist::of(&late);
    let lives: Vec<Arc<Live>> = readers.iter().map(|r| r.live.clone()).collect();
    let diffs = || {
        lives
            .iter()
            .map(|l| l.diffs.load(Ordering::Relaxed))
            .sum::<u64>()
            - diffs_before
    };
    let waited = until(DRAIN_TIMEOUT, "every write's diff", || diffs() >= acked).await;
    case.diffs = diffs();
    let (mut lat, mut slow) = (Vec::new(), Vec::new());
    for r in readers {
        lat.append(&mut r.lat_us.lock().expect("not poisoned"));
        slow.append(&mut r.slow_us.lock().expect("not poisoned"));
    }
    case.write_to_diff = Dist::of(&lat);
    case.stalls = stalls_of(&mut slow, from);
    case.verified = waited.is_ok() && case.diffs == acked;
    case.detail = format!("{} diffs for {acked} acknowledged writes", case.diffs);
    Ok(())
}

async fn load_family(
    ctx: &Ctx<'_>,
    lp: &LoadParams,
    cases: &mut Vec<LoadCase>,
) -> anyhow::Result<()> {
    let v = lp.views;
    let per_conn = v.max(1024).to_string();
    let (server, api, _dir) = ctx
        .start(&["--live-subscriptions-per-connection", per_conn.as_str()])
        .await?;
    preload_rooms(&api, v).await?;
    let epoch = Instant::now();
    let (sinks, readers, _) = subscribe_rooms(&server.base_url, epoch, v, &ctx.progress).await?;
    for &rate in &lp.rates {
        let mut case = LoadCase {
            family: "load",
            views: v,
            rate_target: rate,
            ..LoadCase::default()
        };
        let outcome = load_run(
            &server.base_url,
            server.pid(),
            epoch,
            &readers,
            v,
            rate,
            lp.seconds,
            &mut case,
        )
        .await;
        if let Err(e) = outcome {
            case.error = Some(format!("{e:#}"));
        }
        cases.push(case);
    }
    drop(sinks);
    let first = cases.len() - lp.rates.len();
    for r in readers {
        let seen = r.finish().await?;
        if seen.resets > 0 || !seen.errors.is_empty() {
            for c in &mut cases[first..] {
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

async fn million_family(
    ctx: &Ctx<'_>,
    lp: &LoadParams,
    cases: &mut Vec<LoadCase>,
) -> anyhow::Result<()> {
    let v = lp.million_views;
    let per_conn = v.max(1024).to_string();
    let max_views = (v + 1024).to_string();
    let (server, api, _dir) = ctx
        .start(&[
            "--live-subscriptions-per-connection",
            per_conn.as_str(),
            "--live-views-max",
            max_views.as_str(),
        ])
        .await?;
    preload_rooms(&api, v).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let heap_before = api.metric_opt("sluice_alloc_bytes").await?;
    let epoch = Instant::now();
    let (sinks, readers, secs) = subscribe_rooms(&server.base_url, epoch, v, &ctx.progress).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let heap_after = api.metric_opt("sluice_alloc_bytes").await?;
    let mut case = LoadCase {
        family: "million",
        views: v,
        rate_target: MILLION_RATE,
        subscribe_s: Some(secs),
        subscribes_per_s: Some(v as f64 / secs),
        heap_bytes_per_view: heap_before.zip(heap_after).map(|(a, b)| (b - a) / v as f64),
        ..LoadCase::default()
    };
    ctx.progress.say(format!(
        "  heap per idle view: {}",
        case.heap_bytes_per_view
            .map_or("not exposed".into(), |b| format!("{b:.0} bytes"))
    ));
    let seconds = lp.seconds.min(5.0);
    if let Err(e) = load_run(
        &server.base_url,
        server.pid(),
        epoch,
        &readers,
        v,
        MILLION_RATE,
        seconds,
        &mut case,
    )
    .await
    {
        case.error = Some(format!("{e:#}"));
    }
    drop(sinks);
    for r in readers {
        let seen = r.finish().await?;
        if seen.resets > 0 || !seen.errors.is_empty() {
            case.verified = false;
            case.detail.push_str(&format!(
                "; {} resets, errors {:?}",
                seen.resets, seen.errors
            ));
        }
    }
    cases.push(case);
    Ok(())
}

async fn coalesce_family(
    ctx: &Ctx<'_>,
    lp: &LoadParams,
    cases: &mut Vec<CoalesceCase>,
) -> anyhow::Result<()> {
    let (server, api, _dir) = ctx.start(&[]).await?;
    let rows = lp.hot_rows.max(10);
    api.sql(HOT_SCHEMA).await?;
    api.preload(
        "items",
        (0..rows).map(|id| format!("{{\"id\":{id},\"grp\":1,\"val\":0}}")),
        PRELOAD_BATCH,
    )
    .await?;
    let epoch = Instant::now();
    let mut subs = Vec::new();
    for &w in &lp.windows {
        let (mut sink, reader) = subscriber(&server.base_url, epoch, true).await?;
        let frame = json!({"type": "subscribe", "qid": 1, "sql": HOT_VIEW, "coalesce_ms": w});
        sink.send(Message::Text(frame.to_string().into())).await?;
        subs.push((w, sink, reader));
    }
    for (_, _, r) in &subs {
        let live = r.live.clone();
        until(SUBSCRIBE_TIMEOUT, "a snapshot", || {
            live.snapshots.load(Ordering::Relaxed) > 0
        })
        .await?;
    }
    let hot = (rows / 10).max(1) as u64;
    let rows_n = rows as u64;
    let row = move |i: u64, _stamp: u64| {
        let r = mix(i);
        let id = if r % 10 < 9 {
            (r >> 8) % hot
        } else {
            hot + (r >> 8) % (rows_n - hot)
        };
        format!("{{\"id\":{id},\"grp\":1,\"val\":{}}}", i + 1)
    };
    let (acked, last, achieved) = write_open_loop(
        &server.base_url,
        epoch,
        lp.hot_rate,
        lp.seconds,
        "items",
        row,
    )
    .await?;
    let expected = result_checksum(&api.query(HOT_VIEW, &Value::Null).await?)?;
    for (w, sink, reader) in subs {
        let live = reader.live.clone();
        let caught_up = until(DRAIN_TIMEOUT, "the last diff", || {
            live.seq.load(Ordering::Relaxed) >= last
        })
        .await;
        drop(sink);
        let seen = reader.finish().await?;
        let mat = seen.mats.get(&1);
        let (len, sum, mismatches) = mat.map_or((0, 0, 1), |m| (m.len(), m.sum, m.mismatches));
        let verified = caught_up.is_ok()
            && seen.errors.is_empty()
            && mismatches == 0
            && (len, sum) == expected;
        cases.push(CoalesceCase {
            coalesce_ms: w,
            rows,
            rate_achieved: achieved,
            commits: acked,
            diffs: seen.diffs,
            changes: seen.changes,
            bytes: seen.bytes,
            commits_per_diff: acked as f64 / seen.diffs.max(1) as f64,
            bytes_per_commit: seen.bytes as f64 / acked.max(1) as f64,
            verified,
            detail: format!(
                "{len} rows (one-shot {}), {mismatches} checksum mismatches, resets {}, errors {:?}",
                expected.0, seen.resets, seen.errors
            ),
            error: None,
        });
    }
    Ok(())
}

pub fn run(params: &Params, bin: &Path, out: &Path) -> anyhow::Result<bool> {
    let runtime = crate::harness::runtime()?;
    let lp = &params.load;
    let mut report = Report::new("live-load", serde_json::to_value(params)?);
    let (loads, coalesced) = runtime.block_on(async {
        let ctx = Ctx {
            params,
            bin,
            progress: Progress::new("live-load"),
        };
        let mut loads = Vec::new();
        let mut coalesced = Vec::new();
        if params.runs("load") {
            if let Err(e) = load_family(&ctx, lp, &mut loads).await {
                loads.push(LoadCase {
                    family: "load",
                    error: Some(format!("{e:#}")),
                    ..LoadCase::default()
                });
            }
        }
        if params.runs("million") {
            if let Err(e) = million_family(&ctx, lp, &mut loads).await {
                loads.push(LoadCase {
                    family: "million",
                    error: Some(format!("{e:#}")),
                    ..LoadCase::default()
                });
            }
        }
        if params.runs("coalesce") {
            if let Err(e) = coalesce_family(&ctx, lp, &mut coalesced).await {
                coalesced.push(CoalesceCase {
                    error: Some(format!("{e:#}")),
                    ..CoalesceCase::default()
                });
            }
        }
        (loads, coalesced)
    });
    write_report(&mut report, &loads, &coalesced);
    let dir = report.write(out)?;
    report.print();
    eprintln!("results in {}", dir.display());
    drop(runtime);
    Ok(loads.iter().all(|c| c.error.is_none() && c.verified)
        && coalesced.iter().all(|c| c.error.is_none() && c.verified))
}

fn write_report(report: &mut Report, loads: &[LoadCase], coalesced: &[CoalesceCase]) {
    report.intro.push(
        "Live queries under sustained load (`sluice bench live --families load,million,coalesce`), against the real `sluice serve` binary on loopback with `--durability memory` and `--count-allocations`. Writers are open loop: a pacing thread (OS timer) hands each one-row upsert to its WebSocket connection at its scheduled time, and its row carries that time, so write→diff counts from the schedule (a writer held back by the server counts against it; how late the client itself sent each write is reported as *sent late*). Views are subscribed with `subscribe_many` frames of 5 000.".into(),
    );
    for c in loads {
        let p = fmt_us;
        match c.family {
            "load" => {
                report.targets.push(Target {
                    what: format!(
                        "write→diff p99 at {} writes/s over {} views",
                        c.rate_target, c.views
                    ),
                    goal: if c.rate_target >= 50_000 {
                        "< 2 ms".into()
                    } else {
                        "reported".into()
                    },
                    measured: format!(
                        "p50 {} / p99 {} (achieved {:.0} writes/s)",
                        p(c.write_to_diff.p50_us),
                        p(c.write_to_diff.p99_us),
                        c.rate_achieved
                    ),
                    met: (c.rate_target >= 50_000).then_some(
                        c.write_to_diff.p99_us < 2_000.0
                            && c.rate_achieved >= 0.95 * c.rate_target as f64,
                    ),
                });
            }
            _ => {
                let heap = c.heap_bytes_per_view.unwrap_or(f64::NAN);
                report.targets.push(Target {
                    what: format!("heap per idle view, {} views (allocator counters)", c.views),
                    goal: "< 1 KiB".into(),
                    measured: format!("{heap:.0} bytes"),
                    met: c.heap_bytes_per_view.map(|b| b < 1024.0),
                });
                report.targets.push(Target {
                    what: format!("subscribes/s with subscribe_many, {} views", c.views),
                    goal: "≥ 100 000/s".into(),
                    measured: format!("{:.0}/s", c.subscribes_per_s.unwrap_or(0.0)),
                    met: c.subscribes_per_s.map(|r| r >= 100_000.0),
                });
                report.targets.push(Target {
                    what: format!(
                        "write→diff p50 with {} views ({} writes/s)",
                        c.views, c.rate_target
                    ),
                    goal: "< 0.5 ms".into(),
                    measured: p(c.write_to_diff.p50_us),
                    met: Some(c.write_to_diff.p50_us > 0.0 && c.write_to_diff.p50_us < 500.0),
                });
            }
        }
    }
    if let Some(c) = coalesced.iter().find(|c| c.coalesce_ms == 10) {
        report.targets.push(Target {
            what: "commits folded per diff at coalesce_ms 10 (hot rows)".into(),
            goal: "≥ 10".into(),
            measured: format!("{:.1}", c.commits_per_diff),
            met: Some(c.commits_per_diff >= 10.0),
        });
    }
    let mut t = Table::new(
        "Write→diff under load",
        &[
            "family",
            "views",
            "target writes/s",
            "achieved writes/s",
            "writes acked",
            "diffs",
            "p50",
            "p95",
            "p99",
            "max",
            "sent late p50 / p99",
            "CPU µs / write: writer, live, tokio, other | bench",
            "subscribe all",
            "heap / view",
            "verified",
        ],
    );
    for c in loads {
        t.row(vec![
            c.family.into(),
            c.views.to_string(),
            c.rate_target.to_string(),
            format!("{:.0}", c.rate_achieved),
            c.writes_acked.to_string(),
            c.diffs.to_string(),
            fmt_us(c.write_to_diff.p50_us),
            fmt_us(c.write_to_diff.p95_us),
            fmt_us(c.write_to_diff.p99_us),
            fmt_us(c.write_to_diff.max_us),
            format!(
                "{} / {}",
                fmt_us(c.sent_late.p50_us),
                fmt_us(c.sent_late.p99_us)
            ),
            {
                let g = |k: &str| c.cpu_us_per_write.get(k).copied().unwrap_or(f64::NAN);
                format!(
                    "{:.1}, {:.1}, {:.1}, {:.1} | {:.1}",
                    g("writer"),
                    g("live"),
                    g("tokio"),
                    g("other"),
                    g("bench")
                )
            },
            c.subscribe_s.map_or("—".into(), |s| {
                format!("{s:.2} s ({:.0}/s)", c.subscribes_per_s.unwrap_or(0.0))
            }),
            c.heap_bytes_per_view
                .map_or("—".into(), |b| fmt_bytes(b.max(0.0) as u64)),
            match (&c.error, c.verified) {
                (Some(e), _) => format!("✗ {e}"),
                (None, true) => format!("✓ {}", c.detail),
                (None, false) => format!("✗ {}", c.detail),
            },
        ]);
    }
    t.note = Some("Each write upserts the one row of a random room (`SELECT * FROM msg WHERE room = $1`, one view per room), so every write is one diff at one subscriber; verified = every acknowledged write's diff arrived, with no reset or error. Sent late: how long after its scheduled time the client sent a write (a pacing thread with the OS timer; the client's own share of write→diff). CPU: µs of CPU per write over the run, by server thread group and for the bench process (writers and every subscriber's socket), which shares the CPUs with the server.".into());
    report.tables.push(t);
    let mut t = Table::new(
        "Stalls: writes whose diff took over 2 ms",
        &[
            "family",
            "target writes/s",
            "writes over 2 ms",
            "stalls",
            "largest stalls (at ms into the measured run: writes, schedule span, slowest)",
        ],
    );
    for c in loads.iter().filter(|c| c.family == "load") {
        let slow: u64 = c.stalls.iter().map(|s| s.writes).sum();
        let mut largest: Vec<&Stall> = c.stalls.iter().collect();
        largest.sort_by_key(|s| std::cmp::Reverse(s.writes));
        largest.truncate(STALLS_LISTED);
        largest.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        t.row(vec![
            c.family.into(),
            c.rate_target.to_string(),
            format!(
                "{slow} ({:.2} %)",
                100.0 * slow as f64 / c.write_to_diff.n.max(1) as f64
            ),
            c.stalls.len().to_string(),
            largest
                .iter()
                .map(|s| {
                    format!(
                        "+{:.0}: {} in {:.1} ms, {}",
                        s.at_ms,
                        s.writes,
                        s.span_ms,
                        fmt_us(s.max_us)
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ]);
    }
    t.note = Some(format!("A stall is a run of writes slower than 2 ms whose scheduled times lie within {} ms of each other; the {STALLS_LISTED} with the most writes are listed in time order, so a cause that recurs on a timer shows as evenly spaced stalls.", STALL_GAP_US / 1000));
    report.tables.push(t);
    let mut t = Table::new(
        "Coalescing: hot rows (10 % of the rows take 90 % of the writes)",
        &[
            "coalesce_ms",
            "rows in view",
            "achieved writes/s",
            "commits",
            "diffs received",
            "commits / diff",
            "changes / diff",
            "bytes on the wire",
            "bytes / commit",
            "verified",
        ],
    );
    for c in coalesced {
        t.row(vec![
            c.coalesce_ms.to_string(),
            c.rows.to_string(),
            format!("{:.0}", c.rate_achieved),
            c.commits.to_string(),
            c.diffs.to_string(),
            format!("{:.1}", c.commits_per_diff),
            format!("{:.1}", c.changes as f64 / c.diffs.max(1) as f64),
            fmt_bytes(c.bytes),
            format!("{:.0}", c.bytes_per_commit),
            match (&c.error, c.verified) {
                (Some(e), _) => format!("✗ {e}"),
                (None, ok) => format!("{} {}", if ok { "✓" } else { "✗" }, c.detail),
            },
        ]);
    }
    t.note = Some("One subscriber per window, each on its own WebSocket, all on the same view; bytes on the wire are the text frames received (snapshot included). verified = the subscriber's rows and recomputed checksum equal a one-shot query after the last write, and every event's checksum matched.".into());
    report.tables.push(t);
    report.samples = json!({"load": loads, "coalesce": coalesced});
}

/// Checks `live-load/samples.json`: every case ran and verified.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    for c in samples["load"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(samples["coalesce"].as_array().into_iter().flatten())
    {
        anyhow::ensure!(c["error"].is_null(), "a case failed: {c}");
        anyhow::ensure!(c["verified"] == true, "a case did not verify: {c}");
    }
    Ok(())
}

/// µs as the other tables print them (negative values do not occur here).
fn fmt_us(us: f64) -> String {
    crate::hist::fmt_us(us.max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_writes_close_in_schedule_form_one_stall_and_distant_ones_another() {
        let from = 1_000_000;
        let mut slow = vec![
            (from + 503_000, 2_500.0),
            (from + 500_000, 9_000.0),
            (from + 507_000, 2_100.0),
            (from + 1_000_000, 3_000.0),
        ];
        let stalls = stalls_of(&mut slow, from);
        assert_eq!(
            stalls,
            vec![
                Stall {
                    at_ms: 500.0,
                    span_ms: 7.0,
                    writes: 3,
                    max_us: 9_000.0
                },
                Stall {
                    at_ms: 1_000.0,
                    span_ms: 0.0,
                    writes: 1,
                    max_us: 3_000.0
                },
            ]
        );
        assert!(stalls_of(&mut [], from).is_empty());
    }
}
