//! [`LatencyHistogram`]: a lock-free log2-microsecond histogram for `/metrics`, cheap enough
//! to record on the writer and log threads (two relaxed atomic adds).
//!
//! Where a slow write acknowledgement spent its time is read off several of these (the
//! server's ack time, the writer's round, the log's append and sync): a client diffs them
//! before and after a window and looks at the slowest bucket of each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets: `i` counts durations below 2^i µs (above the previous bound); the last is +Inf.
pub const LATENCY_BUCKETS: usize = 24;

#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// The bucket a duration of `us` microseconds falls in.
pub fn bucket_of(us: u64) -> usize {
    (64 - us.leading_zeros() as usize).min(LATENCY_BUCKETS - 1)
}

impl LatencyHistogram {
    pub fn record(&self, took: Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// `(per-bucket counts, sum in µs)`.
    pub fn snapshot(&self) -> ([u64; LATENCY_BUCKETS], u64) {
        (
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            self.sum_us.load(Ordering::Relaxed),
        )
    }

    /// Appends the histogram as Prometheus `name` (seconds, cumulative `le` buckets).
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        use std::fmt::Write;
        let (buckets, sum_us) = self.snapshot();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, n) in buckets.iter().enumerate() {
            cumulative += n;
            if i + 1 == LATENCY_BUCKETS {
                break;
            }
            let le = (1u64 << i) as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_their_log2_bucket_and_render_cumulatively() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_micros(0));
        h.record(Duration::from_micros(3));
        h.record(Duration::from_micros(1500));
        h.record(Duration::from_secs(100_000));
        let (b, sum) = h.snapshot();
        assert_eq!(b[0], 1);
        assert_eq!(b[2], 1, "3 µs is below 4 µs");
        assert_eq!(b[11], 1, "1.5 ms is below 2048 µs");
        assert_eq!(b[LATENCY_BUCKETS - 1], 1);
        assert_eq!(sum, 1503 + 100_000_000_000);
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "test");
        assert!(
            out.contains("x_seconds_bucket{le=\"0.000004\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_seconds_count 4\n"), "{out}");
    }
}
