//! The closed-loop load driver shared by every throughput case.
//!
//! `workers` tasks each loop "take the next `batch` ids, send one request, wait for the
//! ack". After a warm-up, the driver measures a fixed window: rows and requests acked
//! inside it, ack latencies of requests that completed inside it, and once a second the
//! server-side counters (commits, syncs) through a [`Probe`]. Then it stops the workers
//! and waits (bounded) for the requests still in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hist::{Latency, LatencySummary};
use sluice_log::latency::LATENCY_BUCKETS;

/// How long workers may take to finish their in-flight request after the window.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest interval between two per-second samples.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Server-side counters read at the start, once a second, and at the end of a window.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Counts {
    pub commits: u64,
    pub syncs: u64,
    /// Commits whose ack waited for a sync (fsync class); `None` if not exposed.
    pub synced_commits: Option<u64>,
    pub snapshots: Option<u64>,
    /// The writer's rounds (`sluice_writer_round_seconds`, [`Metrics::histogram`]).
    ///
    /// [`Metrics::histogram`]: crate::server::Metrics::histogram
    pub writer_rounds: Option<[u64; LATENCY_BUCKETS]>,
}

/// The writer's rounds in a measured window: how many, how many commits each, how long.
/// A round applies every request waiting when it starts and hands their frames to the log
/// at once, so its length is what a request that arrives during it waits on top of its own.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Rounds {
    pub per_sec: f64,
    pub commits_per_round: f64,
    /// Upper bounds (µs) of the buckets holding the median and the 99th-percentile round
    /// (`u64::MAX`: past the last bound).
    pub p50_le_us: u64,
    pub p99_le_us: u64,
    /// Share of rounds longer than 4.1 ms (the bound of the 4 096 µs bucket).
    pub over_4ms: f64,
}

impl Rounds {
    /// From the histogram at the window's start (`a`) and end (`b`).
    fn between(
        a: &[u64; LATENCY_BUCKETS],
        b: &[u64; LATENCY_BUCKETS],
        commits: u64,
        seconds: f64,
    ) -> Option<Rounds> {
        let d: [u64; LATENCY_BUCKETS] = std::array::from_fn(|i| b[i].saturating_sub(a[i]));
        let n = d[LATENCY_BUCKETS - 1];
        if n == 0 {
            return None;
        }
        let le = |q: f64| {
            (0..LATENCY_BUCKETS - 1)
                .find(|&i| d[i] as f64 >= q * n as f64)
                .map_or(u64::MAX, |i| 1u64 << i)
        };
        Some(Rounds {
            per_sec: n as f64 / seconds,
            commits_per_round: commits as f64 / n as f64,
            p50_le_us: le(0.5),
            p99_le_us: le(0.99),
            over_4ms: 1.0 - d[12] as f64 / n as f64,
        })
    }
}

/// Reads [`Counts`]; `None` when the system under test has no such counters (PostgreSQL).
pub type Probe =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Option<Counts>> + Send>> + Send + Sync>;

/// Shared between the driver and its workers.
#[derive(Debug, Default)]
pub struct Meter {
    next_id: AtomicU64,
    rows: AtomicU64,
    requests: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
}

impl Meter {
    /// Ids start at `first_id`.
    pub fn new(first_id: u64) -> Arc<Meter> {
        let m = Meter::default();
        m.next_id.store(first_id, Ordering::Relaxed);
        Arc::new(m)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Whether the measured window is running (not the warm-up, not the drain after it).
    pub fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    /// Reserves `batch` consecutive ids and returns the first.
    pub fn take_ids(&self, batch: u64) -> u64 {
        self.next_id.fetch_add(batch, Ordering::Relaxed)
    }

    /// Counts one acknowledged request of `rows` rows.
    pub fn acked(&self, rows: u64, took: Duration, latency: &mut Latency) {
        if self.measuring.load(Ordering::Relaxed) {
            latency.record(took);
        }
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Tells every worker to stop after its current request (also used on error).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One per-second sample.
#[derive(Clone, Debug, Serialize)]
pub struct Second {
    /// Seconds since the start of the window, at the end of this sample.
    pub t: f64,
    pub rows_per_sec: f64,
    pub requests_per_sec: f64,
    pub commits_per_sec: Option<f64>,
    pub syncs_per_sec: Option<f64>,
}

/// What one measured window produced.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    pub seconds: f64,
    pub rows: u64,
    pub requests: u64,
    pub rows_per_sec: f64,
    pub requests_per_sec: f64,
    pub commits_per_sec: Option<f64>,
    pub syncs_per_sec: Option<f64>,
    /// Commits per sync: fsync-class commits per sync when the server says which commits
    /// waited for a sync, else all commits per sync.
    pub commits_per_sync: Option<f64>,
    pub snapshots: Option<u64>,
    /// The writer's rounds in the window (Sluice over HTTP or WebSocket).
    pub writer_rounds: Option<Rounds>,
    pub latency: LatencySummary,
    pub per_second: Vec<Second>,
}

/// A running worker: its task returns its latencies, or the error that stopped it.
pub type Worker = tokio::task::JoinHandle<anyhow::Result<Latency>>;

/// Runs a warm-up, then measures a `window`; `workers` must already be running against
/// `meter`. Stops them afterwards and merges their latencies.
pub async fn measure(
    meter: &Arc<Meter>,
    workers: Vec<Worker>,
    warmup: Duration,
    window: Duration,
    probe: &Probe,
) -> anyhow::Result<Measured> {
    let result = measure_window(meter, warmup, window, probe).await;
    meter.measuring.store(false, Ordering::Relaxed);
    meter.stop();
    let mut latency = Latency::new();
    let mut first_error = None;
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        for w in workers {
            match w.await {
                Ok(Ok(l)) => latency.merge(&l),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(anyhow::anyhow!("a worker panicked: {e}"));
                }
            }
        }
    })
    .await;
    anyhow::ensure!(
        drained.is_ok(),
        "workers did not finish their last request within {DRAIN_TIMEOUT:?}"
    );
    if let Some(e) = first_error {
        return Err(e.context("a load worker failed"));
    }
    let mut measured = result?;
    measured.latency = latency.summary();
    Ok(measured)
}

async fn measure_window(
    meter: &Meter,
    warmup: Duration,
    window: Duration,
    probe: &Probe,
) -> anyhow::Result<Measured> {
    sleep_unless_stopped(meter, warmup).await;
    anyhow::ensure!(!meter.stopped(), "a worker failed during the warm-up");
    let read = || {
        (
            meter.rows.load(Ordering::Relaxed),
            meter.requests.load(Ordering::Relaxed),
        )
    };
    let counts0 = probe().await;
    let (rows0, requests0) = read();
    meter.measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    let end = start + window;
    let mut per_second = Vec::new();
    let (mut last_t, mut last_rows, mut last_requests, mut last_counts) =
        (0.0, rows0, requests0, counts0);
    loop {
        let now = Instant::now();
        if now >= end || meter.stopped() {
            break;
        }
        let next = (now + SAMPLE_INTERVAL).min(end);
        sleep_unless_stopped(meter, next - now).await;
        let (rows, requests) = read();
        let counts = probe().await;
        let t = start.elapsed().as_secs_f64();
        let dt = (t - last_t).max(1e-9);
        let rate = |a: u64, b: u64| (a - b) as f64 / dt;
        per_second.push(Second {
            t,
            rows_per_sec: rate(rows, last_rows),
            requests_per_sec: rate(requests, last_requests),
            commits_per_sec: counts
                .zip(last_counts)
                .map(|(c, l)| rate(c.commits, l.commits)),
            syncs_per_sec: counts.zip(last_counts).map(|(c, l)| rate(c.syncs, l.syncs)),
        });
        (last_t, last_rows, last_requests, last_counts) = (t, rows, requests, counts);
    }
    anyhow::ensure!(
        !meter.stopped(),
        "a worker failed during the measured window"
    );
    let seconds = start.elapsed().as_secs_f64();
    let rows = last_rows - rows0;
    let requests = last_requests - requests0;
    let deltas = counts0.zip(last_counts).map(|(a, b)| {
        (
            b.commits - a.commits,
            b.syncs - a.syncs,
            b.synced_commits.zip(a.synced_commits).map(|(b, a)| b - a),
            b.snapshots.zip(a.snapshots).map(|(b, a)| b - a),
        )
    });
    let commits_per_sync = deltas.and_then(|(commits, syncs, synced, _)| {
        let waited = synced.filter(|&s| s > 0).unwrap_or(commits);
        (syncs > 0).then(|| waited as f64 / syncs as f64)
    });
    Ok(Measured {
        seconds,
        rows,
        requests,
        rows_per_sec: rows as f64 / seconds,
        requests_per_sec: requests as f64 / seconds,
        commits_per_sec: deltas.map(|d| d.0 as f64 / seconds),
        syncs_per_sec: deltas.map(|d| d.1 as f64 / seconds),
        commits_per_sync,
        snapshots: deltas.and_then(|d| d.3),
        writer_rounds: counts0.zip(last_counts).and_then(|(a, b)| {
            Rounds::between(
                &a.writer_rounds?,
                &b.writer_rounds?,
                b.commits - a.commits,
                seconds,
            )
        }),
        latency: LatencySummary::default(),
        per_second,
    })
}

async fn sleep_unless_stopped(meter: &Meter, d: Duration) {
    let end = Instant::now() + d;
    while !meter.stopped() {
        let now = Instant::now();
        if now >= end {
            return;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(50))).await;
    }
}

/// A probe for systems without server-side counters.
pub fn no_probe() -> Probe {
    Box::new(|| Box::pin(async { None }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_window_counts_acked_rows_and_latencies() {
        let meter = Meter::new(1);
        let workers: Vec<Worker> = (0..2)
            .map(|_| {
                let meter = meter.clone();
                tokio::spawn(async move {
                    let mut latency = Latency::new();
                    while !meter.stopped() {
                        let _first = meter.take_ids(10);
                        let t = Instant::now();
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        meter.acked(10, t.elapsed(), &mut latency);
                    }
                    Ok(latency)
                })
            })
            .collect();
        let probe = no_probe();
        let m = measure(
            &meter,
            workers,
            Duration::from_millis(20),
            Duration::from_millis(200),
            &probe,
        )
        .await
        .unwrap();
        assert!(m.rows > 0 && m.rows % 10 == 0, "{m:?}");
        assert!(m.rows_per_sec > 0.0);
        assert!(m.latency.count > 0 && m.latency.p50_us >= 2_000, "{m:?}");
        assert_eq!(m.per_second.len(), 1);
        assert!(m.commits_per_sec.is_none());
    }

    #[tokio::test]
    async fn a_failing_worker_fails_the_case() {
        let meter = Meter::new(1);
        let m2 = meter.clone();
        let workers: Vec<Worker> = vec![tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            m2.stop();
            Err(anyhow::anyhow!("server said no"))
        })];
        let probe = no_probe();
        let err = measure(
            &meter,
            workers,
            Duration::ZERO,
            Duration::from_secs(5),
            &probe,
        )
        .await
        .unwrap_err();
        assert!(format!("{err:#}").contains("server said no"), "{err:#}");
    }

    /// Rounds come from the difference of the two histograms: 100 rounds in 2 s, 60 of
    /// them within 1 ms, 39 more within 4.1 ms, one within 16.4 ms.
    #[test]
    fn rounds_are_read_from_the_window_s_histogram_difference() {
        let mut a = [0u64; LATENCY_BUCKETS];
        let mut b = [0u64; LATENCY_BUCKETS];
        // Before the window: 7 rounds, all within 1 µs (they must not count).
        a.iter_mut().for_each(|c| *c = 7);
        for (i, c) in b.iter_mut().enumerate() {
            *c = 7 + match i {
                0..=9 => 0,
                10 => 60,
                11 | 12 => 99,
                _ => 100,
            };
        }
        let r = Rounds::between(&a, &b, 2_500, 2.0).expect("rounds in the window");
        assert_eq!(r.per_sec, 50.0);
        assert_eq!(r.commits_per_round, 25.0);
        assert_eq!(r.p50_le_us, 1 << 10);
        assert_eq!(r.p99_le_us, 1 << 11);
        assert!((r.over_4ms - 0.01).abs() < 1e-9, "{}", r.over_4ms);
        assert!(Rounds::between(&a, &a, 0, 2.0).is_none());
    }
}
