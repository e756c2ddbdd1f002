//! The keynote-2 workload, bit for bit: which accounts each transfer moves money between.
//!
//! A mulberry32 PRNG seeded `0x12345678` feeds a Zipf(α) sampler over the account ids
//! (α ≤ 0: uniform; otherwise P(k) ∝ 1/(k+1)^α by an exact, Kahan-summed CDF and a binary
//! search), and each pair redraws its receiver up to [`REDRAWS_MAX`] times until it differs
//! from the sender. This is the reference's `zipfSampler` + `pickTwoDistinct`
//! (`templates/keynote-2/src/core/zipf.ts`), so the same seed yields the same pairs.
//!
//! The pairs are precomputed once per α ([`Pairs`], two `u32` each) so that drawing them
//! costs the clients nothing during the run.

/// Seed of the reference's PRNG.
pub const SEED: u32 = 0x1234_5678;
/// Redraws of the receiver while it equals the sender (the reference's `maxSpins`).
pub const REDRAWS_MAX: u32 = 32;
/// Pairs precomputed per α for a full run (the reference's default).
pub const PAIRS_FULL: usize = 10_000_000;
/// Every account's balance before the run.
pub const INITIAL_BALANCE: i64 = 1_000_000_000;
/// Amount moved by every transfer.
pub const AMOUNT: i64 = 1;

/// The server functions module every Sluice target runs (`transfer`, `balance`).
pub const BANK_JS: &str = include_str!("../../../../examples/bank.js");

/// The `accounts` table, in each system's dialect.
pub const CREATE_SLUICE: &str =
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)";
pub const CREATE_POSTGRES: &str =
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)";
pub const CREATE_SQLITE: &str =
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)";

/// mulberry32: 32 bits of state, uniform doubles in [0, 1).
#[derive(Clone, Debug)]
pub struct Mulberry32 {
    state: u32,
}

impl Mulberry32 {
    pub fn new(seed: u32) -> Self {
        Mulberry32 { state: seed }
    }

    /// `t = (a += 0x6D2B79F5); t = imul(t ^ t >>> 15, t | 1);
    /// t ^= t + imul(t ^ t >>> 7, t | 61); return ((t ^ t >>> 14) >>> 0) / 2^32`.
    pub fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x6D2B_79F5);
        let mut t = self.state;
        t = (t ^ (t >> 15)).wrapping_mul(t | 1);
        t ^= t.wrapping_add((t ^ (t >> 7)).wrapping_mul(t | 61));
        f64::from(t ^ (t >> 14)) / 4_294_967_296.0
    }
}

/// Account ids drawn from Zipf(α) over `0..n`.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u32,
    /// `cdf[k]` = P(id ≤ k); empty for the uniform case. Invariant: non-decreasing and
    /// `cdf[n - 1] == 1.0`, so the binary search always lands inside `0..n`.
    cdf: Vec<f64>,
    rng: Mulberry32,
}

impl Zipf {
    pub fn new(n: u32, alpha: f64, seed: u32) -> Zipf {
        assert!(n >= 1, "Zipf over no accounts");
        let cdf = if alpha <= 0.0 {
            Vec::new()
        } else {
            // Kahan sums, as the reference does, so the CDF (and the pairs) match it.
            let weight = |i: u32| 1.0 / f64::from(i + 1).powf(alpha);
            let (mut sum, mut c) = (0.0f64, 0.0f64);
            for i in 0..n {
                let y = weight(i) - c;
                let t = sum + y;
                c = (t - sum) - y;
                sum = t;
            }
            let mut cdf = Vec::with_capacity(n as usize);
            let (mut cumulative, mut comp) = (0.0f64, 0.0f64);
            for i in 0..n {
                let y = weight(i) / sum - comp;
                let t = cumulative + y;
                comp = (t - cumulative) - y;
                cumulative = t;
                cdf.push(cumulative);
            }
            cdf[n as usize - 1] = 1.0;
            cdf
        };
        Zipf {
            n,
            cdf,
            rng: Mulberry32::new(seed),
        }
    }

    pub fn sample(&mut self) -> u32 {
        let u = self.rng.next_f64();
        if self.cdf.is_empty() {
            return ((u * f64::from(self.n)) as u32).min(self.n - 1);
        }
        // The first k with cdf[k] >= u.
        self.cdf.partition_point(|&p| p < u) as u32
    }

    /// A sender and a receiver, the receiver redrawn up to [`REDRAWS_MAX`] times while it
    /// equals the sender (so with one account, or after 32 unlucky redraws, they may match:
    /// the transfer then fails with `same_account`, as in the reference).
    pub fn pair(&mut self) -> (u32, u32) {
        let from = self.sample();
        let mut to = self.sample();
        let mut redraws = 0;
        while to == from && redraws < REDRAWS_MAX {
            to = self.sample();
            redraws += 1;
        }
        (from, to)
    }
}

/// Precomputed (from, to) pairs; worker `w` of `c` starts at `w × ⌊len / c⌋` and wraps.
#[derive(Debug)]
pub struct Pairs {
    pub alpha: f64,
    pub accounts: u32,
    pairs: Vec<[u32; 2]>,
}

impl Pairs {
    pub fn generate(accounts: u32, alpha: f64, count: usize) -> Pairs {
        assert!(count >= 1, "at least one pair");
        let mut zipf = Zipf::new(accounts, alpha, SEED);
        let pairs = (0..count)
            .map(|_| {
                let (a, b) = zipf.pair();
                [a, b]
            })
            .collect();
        Pairs {
            alpha,
            accounts,
            pairs,
        }
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Where worker `worker` of `workers` starts (the reference's
    /// `workerIndex * floor(count / concurrency)`).
    pub fn start_of(&self, worker: usize, workers: usize) -> usize {
        let per_worker = (self.pairs.len() / workers.max(1)).max(1);
        (worker * per_worker) % self.pairs.len()
    }

    /// The pair at `index`, wrapping around the end.
    pub fn get(&self, index: usize) -> (u32, u32) {
        let [a, b] = self.pairs[index % self.pairs.len()];
        (a, b)
    }

    /// Share of pairs whose sender is account 0 (the hottest account under skew).
    pub fn share_from_zero(&self) -> f64 {
        let hits = self.pairs.iter().filter(|p| p[0] == 0).count();
        hits as f64 / self.pairs.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mulberry32_matches_the_reference_outputs() {
        // From the JavaScript reference with seed 0x12345678 (computed with node).
        let mut r = Mulberry32::new(SEED);
        let expected = [
            0.106_152_008_753_269_91,
            0.941_276_284_167_543,
            0.939_870_615_256_950_3,
            0.233_884_801_855_310_8,
            0.904_587_714_700_028_3,
        ];
        for e in expected {
            let got = r.next_f64();
            assert!((got - e).abs() < 1e-15, "got {got}, expected {e}");
        }
    }

    #[test]
    fn pairs_match_the_reference_generator() {
        // `zipfSampler(N, α)` + `pickTwoDistinct`, first six pairs (computed with node).
        let cases: [(u32, f64, [[u32; 2]; 6]); 3] = [
            (
                100_000,
                0.0,
                [
                    [10615, 94127],
                    [93987, 23388],
                    [90458, 77833],
                    [27943, 34101],
                    [19990, 35710],
                    [36982, 65305],
                ],
            ),
            (
                100_000,
                1.5,
                [[0, 157], [150, 0], [61, 11], [0, 4], [3, 24], [0, 1]],
            ),
            (
                1_000,
                1.5,
                [[0, 87], [84, 0], [42, 9], [0, 3], [3, 19], [0, 1]],
            ),
        ];
        for (n, alpha, expected) in cases {
            let mut z = Zipf::new(n, alpha, SEED);
            let got: Vec<[u32; 2]> = (0..6)
                .map(|_| {
                    let (a, b) = z.pair();
                    [a, b]
                })
                .collect();
            assert_eq!(got, expected, "n={n} alpha={alpha}");
        }
    }

    #[test]
    fn skew_concentrates_on_account_zero_and_pairs_are_distinct() {
        let uniform = Pairs::generate(1_000, 0.0, 100_000);
        let skewed = Pairs::generate(1_000, 1.5, 100_000);
        // Uniform: ~0.1% of senders are account 0; α = 1.5: ~39% (1/ζ(1.5) over 1000 ids).
        assert!(
            uniform.share_from_zero() < 0.005,
            "{}",
            uniform.share_from_zero()
        );
        assert!(
            skewed.share_from_zero() > 0.3,
            "{}",
            skewed.share_from_zero()
        );
        for p in [&uniform, &skewed] {
            for i in 0..p.len() {
                let (a, b) = p.get(i);
                assert_ne!(a, b, "pair {i} of alpha {}", p.alpha);
                assert!(a < 1_000 && b < 1_000);
            }
        }
    }

    #[test]
    fn workers_start_spread_over_the_pairs_and_wrap() {
        let p = Pairs::generate(10, 0.0, 100);
        assert_eq!(p.start_of(0, 4), 0);
        assert_eq!(p.start_of(3, 4), 75);
        assert_eq!(p.get(100), p.get(0));
        // More workers than pairs: each still gets a valid start.
        let q = Pairs::generate(10, 0.0, 3);
        assert!((0..8).all(|w| q.start_of(w, 8) < 3));
    }

    #[test]
    fn the_bank_module_is_embedded() {
        assert!(BANK_JS.contains("export function transfer"));
        assert!(BANK_JS.contains("insufficient_funds"));
    }
}
