//! Latency histograms over `hdrhistogram`, in microseconds, and number formatting.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histogram tracks exactly; longer ones are clamped to it.
const LATENCY_US_MAX: u64 = 120_000_000;

/// Latencies in µs from 1 µs to [`LATENCY_US_MAX`], three significant digits.
#[derive(Clone, Debug)]
pub struct Latency {
    hist: Histogram<u64>,
}

/// The percentiles reported for a case.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    pub fn new() -> Self {
        Latency {
            hist: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    pub fn record(&mut self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.hist.saturating_record(us.clamp(1, LATENCY_US_MAX));
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so adding cannot fail.
        self.hist
            .add(&other.hist)
            .expect("histograms with equal bounds add");
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Value at quantile `q` (0..=1) in µs; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            self.hist.value_at_quantile(q)
        }
    }

    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.hist.len(),
            mean_us: self.hist.mean(),
            p50_us: self.quantile_us(0.50),
            p95_us: self.quantile_us(0.95),
            p99_us: self.quantile_us(0.99),
            max_us: self.hist.max(),
        }
    }
}

/// `850 µs`, `1.25 ms`, `2.50 s`.
pub fn fmt_us(us: u64) -> String {
    match us {
        0..=999 => format!("{us} µs"),
        1_000..=999_999 => format!("{:.2} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// `≤ 2.05 ms`-style text for a log2 histogram bucket's bound (`—` for an empty
/// histogram, `> 8 s` past the last bound).
pub fn fmt_le(us: u64) -> String {
    match us {
        0 => "—".into(),
        u64::MAX => "> 8 s".into(),
        _ => format!("≤ {}", fmt_us(us)),
    }
}

/// `12.3 M`, `456 k`, `789`: a rate or count with an SI suffix and three significant digits.
pub fn fmt_si(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, " G"),
        a if a >= 1e6 => (v / 1e6, " M"),
        a if a >= 1e3 => (v / 1e3, " k"),
        _ => (v, ""),
    };
    let digits = match scaled.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        _ => 2,
    };
    let digits = if suffix.is_empty() && scaled.fract() == 0.0 {
        0
    } else {
        digits
    };
    format!("{scaled:.digits$}{suffix}")
}

/// Decimals [`fmt_ratio`] shows for `r`.
fn ratio_decimals(r: f64) -> usize {
    if r >= 10.0 {
        0
    } else if r >= 1.0 {
        1
    } else {
        2
    }
}

/// `1.5×`, `0.42×`.
pub fn fmt_ratio(r: f64) -> String {
    format!("{r:.*}×", ratio_decimals(r))
}

/// [`fmt_ratio`] of a ratio measured against a `goal` of `≥ goal`: one more decimal when the
/// usual rounding would show a miss as the goal itself (2.97 against 3 reads "2.97×", not
/// "3.0×" beside a "no").
pub fn fmt_ratio_against(r: f64, goal: f64) -> String {
    let scale = 10f64.powi(ratio_decimals(r) as i32);
    if r < goal && (r * scale).round() / scale >= goal {
        // Truncated, not rounded: a miss never reads as the goal.
        format!("{:.2}×", (r * 100.0).floor() / 100.0)
    } else {
        fmt_ratio(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_just_short_of_its_goal_never_reads_as_the_goal() {
        assert_eq!(fmt_ratio_against(2.97, 3.0), "2.97×");
        assert_eq!(fmt_ratio_against(2.999, 3.0), "2.99×");
        assert_eq!(fmt_ratio_against(3.04, 3.0), "3.0×");
        assert_eq!(fmt_ratio_against(2.7, 3.0), "2.7×");
        assert_eq!(fmt_ratio_against(9.6, 10.0), "9.6×");
        assert_eq!(fmt_ratio_against(9.96, 10.0), "9.96×");
    }

    #[test]
    fn percentiles_come_from_recorded_values() {
        let mut a = Latency::new();
        for us in 1..=100 {
            a.record(Duration::from_micros(us));
        }
        let mut b = Latency::new();
        b.record(Duration::from_secs(1_000)); // clamped, not dropped
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 101);
        assert_eq!(s.p50_us, 51);
        assert!(s.max_us >= LATENCY_US_MAX - LATENCY_US_MAX / 1000);
        assert_eq!(Latency::new().summary().p99_us, 0);
    }

    #[test]
    fn numbers_format_with_units() {
        assert_eq!(fmt_us(850), "850 µs");
        assert_eq!(fmt_us(1_250), "1.25 ms");
        assert_eq!(fmt_si(12_345_678.0), "12.3 M");
        assert_eq!(fmt_si(456_000.0), "456 k");
        assert_eq!(fmt_si(789.0), "789");
        assert_eq!(fmt_si(1.5), "1.50");
        assert_eq!(fmt_ratio(0.4213), "0.42×");
        assert_eq!(fmt_ratio(3.04), "3.0×");
    }
}
