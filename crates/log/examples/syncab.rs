//! The bare log under a closed loop of `fsync` commits: how many it acknowledges per second,
//! and at what latency, for a number of sync threads. Not a product benchmark (those are
//! `sluice bench`); the measurement behind ARCHITECTURE "Why syncs overlap".
//!
//! `cargo run --release -p sluice-log --example syncab -- SYNC_THREADS [IN_FLIGHT] [DIR]`
//! (defaults: 2 560 commits in flight, a directory under the system's temp dir; 5 s).
//! `SYNCAB_PREPARED=1` writes over prepared segments (`LogConfig::prepare_segments`): one
//! commit, a second for the prepared file, then the run.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice_log::writer::{Log, LogConfig, Waiter};
use sluice_log::{Durability, LogError};

/// One commit's waiter: reports its latency when acknowledged.
struct Timed(Instant, mpsc::Sender<Duration>);

impl Waiter for Timed {
    fn durability(&self) -> Durability {
        Durability::Fsync
    }
    fn complete(self, result: Result<(), &LogError>) {
        result.expect("the log failed a commit");
        let _ = self.1.send(self.0.elapsed());
    }
}

const RUN: Duration = Duration::from_secs(5);
/// A frame payload about the size of one bank transfer's commit.
const PAYLOAD_BYTES: usize = 120;

fn main() {
    let mut args = std::env::args().skip(1);
    let sync_threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let in_flight: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2560);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("sluice-syncab-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = LogConfig::new(&dir);
    config.sync_threads = sync_threads;
    config.prepare_segments = std::env::var("SYNCAB_PREPARED").is_ok_and(|v| v == "1");
    let log = Log::open(config, 0, |_| {}).expect("open the log");
    let (tx, rx) = mpsc::channel();
    let payload = vec![7u8; PAYLOAD_BYTES];
    let (mut seq, mut buf, mut latencies) = (0u64, Vec::new(), Vec::new());
    // The first segment grows by appends until the prepared one is ready (and rolled to).
    sluice_log::frame::encode_into(&mut buf, &payload).expect("encode");
    seq += 1;
    log.submit(&buf, 1, seq, [Timed(Instant::now(), tx.clone())])
        .expect("submit");
    rx.recv().expect("an ack");
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    while started.elapsed() < RUN {
        // Top the commits in flight up to `in_flight`, as one submit, then take the acks.
        let n = in_flight - (seq as usize - 1 - latencies.len());
        if n > 0 {
            buf.clear();
            let mut waiters = Vec::with_capacity(n);
            for _ in 0..n {
                seq += 1;
                sluice_log::frame::encode_into(&mut buf, &payload).expect("encode");
                waiters.push(Timed(Instant::now(), tx.clone()));
            }
            log.submit(&buf, n as u64, seq, waiters).expect("submit");
        }
        latencies.push(rx.recv().expect("an ack"));
        latencies.extend(rx.try_iter());
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let stats = log.stats();
    println!(
        "prepared segments {}: {} of {} segments; sync threads {sync_threads}, {in_flight} in flight:",
        stats.segments_prepared > 0,
        stats.segments_prepared,
        stats.segments_created + 1,
    );
    println!(
        "  sync threads {sync_threads}, {in_flight} in flight: {:.0} commits/s, p50 {:?}, p99 {:?}, {:.0} syncs/s, {:.0} commits per sync",
        latencies.len() as f64 / secs,
        at(0.5),
        at(0.99),
        stats.syncs as f64 / secs,
        stats.synced_commits as f64 / stats.syncs.max(1) as f64
    );
    drop(log);
    let _ = std::fs::remove_dir_all(&dir);
}
