//! `sluice-fuzzkit`: a small seeded mutation fuzzer that runs on the stable toolchain, shared
//! by the fuzz targets of every crate that decodes outside bytes (log frames, commit
//! records, snapshots, SQL, function modules, HTTP bodies, WebSocket frames).
//!
//! It is a **dev-dependency only**: nothing in a shipped binary links it.
//!
//! A target starts from a corpus of valid inputs (real encoded frames, real request bodies,
//! real SQL), mutates them (bytes, text tokens or JSON trees, see [`mutate`]) and runs each
//! input under `catch_unwind`. The outcome a target reports for an input (`"ok"`, an error's
//! kind, …) is its only feedback: an input that produced an outcome never seen before joins
//! the corpus, so mutations build on inputs that reached new code. A panic is recorded with
//! its exact input (printed as a Rust literal ready to paste into a regression test) and
//! fails the run at the end; an execution that runs past the hang limit aborts the process
//! with its input printed.
//!
//! Environment:
//! - `SLUICE_FUZZ_EXECS=N`: executions per target (default: each target's bounded count);
//! - `SLUICE_FUZZ_SEED=S`: the base seed (default: from the clock; printed to stderr, past the
//!   test harness's capture, before the first input runs, so even an aborted run can be replayed);
//! - `SLUICE_FUZZ_HANG_SECS=T`: an execution running longer is a hang (default 30).
//!
//! # Layout
//! - [`Rng`]: splitmix64, the only source of randomness, so a seed replays a run exactly.
//! - [`mutate`]: byte, text-token and JSON-tree mutators.
//! - [`corpus`]: seeds taken from the project's tests (SQL, DDL, function modules).
//! - [`Fuzzer`]: the loop — corpus, novelty feedback, panic capture, hang watchdog, report.

pub mod corpus;
pub mod mutate;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// splitmix64: small, fast, and good enough to drive mutations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What a target's inputs are, which picks the mutator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Binary formats: bit flips, interesting integers, huge varints, splices.
    Bytes,
    /// Text with tokens (SQL, JavaScript): token edits, dictionary words, byte edits.
    Text,
    /// JSON documents: tree edits when the input parses, text edits otherwise.
    Json,
}

/// Inputs the corpus keeps at most (seeds plus novel inputs).
const CORPUS_MAX: usize = 1024;
/// Panicking inputs kept for the report.
const FOUND_MAX: usize = 20;
/// Panicking inputs shrunk before the report, and the executions each may take.
const MINIMIZE_MAX: usize = 3;
const MINIMIZE_TRIES: usize = 5000;

/// One fuzz target's run.
pub struct Fuzzer {
    name: String,
    seed: u64,
    execs: u64,
    done: u64,
    rng: Rng,
    kind: Kind,
    seeds: usize,
    corpus: Vec<Vec<u8>>,
    outcomes: HashSet<u64>,
    dict: Vec<Vec<u8>>,
    len_max: usize,
    panics: u64,
    found: Vec<(u64, Vec<u8>, String)>,
    /// Whether a panic on another thread during an execution counts as that input's.
    elsewhere: bool,
}

impl Fuzzer {
    /// A target named `name` that runs `default_execs` executions unless
    /// `SLUICE_FUZZ_EXECS` says otherwise.
    pub fn new(name: &str, default_execs: u64, kind: Kind) -> Fuzzer {
        install_panic_hook();
        let execs = env_u64("SLUICE_FUZZ_EXECS").unwrap_or(default_execs);
        // One base seed per process, so one `SLUICE_FUZZ_SEED` replays every target.
        static BASE: OnceLock<u64> = OnceLock::new();
        let base = *BASE.get_or_init(|| {
            let base = env_u64("SLUICE_FUZZ_SEED").unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    % 1_000_000_000
            });
            // Straight to the process's stderr, past the test harness's capture, and before
            // any input runs: a run that aborts (an allocation failure, a stack overflow)
            // prints no report, and its seed is all there is to replay it with.
            let _ = writeln!(
                std::io::stderr(),
                "sluice-fuzzkit: base seed {base} (SLUICE_FUZZ_SEED={base} replays this process's targets)"
            );
            base
        });
        // Each target gets its own stream from the same base seed.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        Fuzzer {
            name: name.to_string(),
            seed: base,
            execs,
            done: 0,
            rng: Rng::new(base ^ h.finish()),
            kind,
            seeds: 0,
            corpus: Vec::new(),
            outcomes: HashSet::new(),
            dict: Vec::new(),
            len_max: 1 << 16,
            panics: 0,
            found: Vec::new(),
            elsewhere: false,
        }
    }

    /// Valid inputs to start from; each also runs once unchanged.
    pub fn seeds<I: IntoIterator<Item = T>, T: Into<Vec<u8>>>(mut self, seeds: I) -> Self {
        self.corpus.extend(seeds.into_iter().map(Into::into));
        self.seeds = self.corpus.len();
        self
    }

    /// Tokens the text and byte mutators insert (keywords, field names, magic values).
    pub fn dictionary(mut self, words: &[&str]) -> Self {
        self.dict
            .extend(words.iter().map(|w| w.as_bytes().to_vec()));
        self
    }

    /// Mutated inputs are cut to this many bytes (default 64 KiB).
    pub fn len_max(mut self, len_max: usize) -> Self {
        self.len_max = len_max;
        self
    }

    /// Counts a panic on any other thread during an execution (a server's writer or a
    /// connection task the input reached) as a panic of that input. For targets that run
    /// one execution at a time against a whole server.
    pub fn panics_elsewhere_count(mut self) -> Self {
        self.elsewhere = true;
        self
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// The next input, or `None` once the run has made its executions.
    pub fn next_input(&mut self) -> Option<Vec<u8>> {
        if self.done >= self.execs {
            return None;
        }
        assert!(!self.corpus.is_empty(), "fuzz {}: no seeds", self.name);
        if (self.done as usize) < self.seeds {
            return Some(self.corpus[self.done as usize].clone());
        }
        let mut input = self.rng.pick(&self.corpus).clone();
        let rounds = 1 + self.rng.below(4);
        for _ in 0..rounds {
            let other = self.rng.pick(&self.corpus);
            input = match self.kind {
                Kind::Bytes => {
                    mutate::bytes(&mut self.rng, &mut input, other, &self.dict, self.len_max);
                    input
                }
                Kind::Text => mutate::text(&mut self.rng, &input, other, &self.dict, self.len_max),
                Kind::Json => mutate::json(&mut self.rng, &input, other, &self.dict, self.len_max),
            };
        }
        Some(input)
    }

    /// Runs `f` on `input` (one execution), catching a panic. `None` means it panicked.
    pub fn exec<R>(&mut self, input: &[u8], f: impl FnOnce() -> R) -> Option<R> {
        let watch = Watch::begin(&self.name, self.seed, self.done, input);
        let elsewhere = panics_elsewhere();
        IN_FUZZ.with(|c| *c.borrow_mut() = Some(String::new()));
        let result = std::panic::catch_unwind(AssertUnwindSafe(f));
        drop(watch);
        self.after(input, result.ok(), elsewhere)
    }

    /// [`Fuzzer::exec`] for a future (polled under `catch_unwind`).
    pub async fn exec_async<R>(&mut self, input: &[u8], fut: impl Future<Output = R>) -> Option<R> {
        let watch = Watch::begin(&self.name, self.seed, self.done, input);
        let elsewhere = panics_elsewhere();
        let result = CatchUnwind(Box::pin(fut)).await;
        drop(watch);
        self.after(input, result, elsewhere)
    }

    fn after<R>(&mut self, input: &[u8], result: Option<R>, elsewhere: u64) -> Option<R> {
        let mut message = IN_FUZZ.with(|c| c.borrow_mut().take()).unwrap_or_default();
        let mut result = result;
        if self.elsewhere && panics_elsewhere() != elsewhere {
            message = format!("on another thread: {}", last_panic_elsewhere());
            result = None;
        }
        if result.is_none() {
            self.panics += 1;
            if self.found.len() < FOUND_MAX {
                self.found.push((self.done, input.to_vec(), message));
            }
        }
        self.done += 1;
        result
    }

    /// Reports what `input` led to; an outcome not seen before keeps the input in the corpus.
    pub fn outcome(&mut self, input: &[u8], outcome: &str) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        outcome.hash(&mut h);
        if self.outcomes.insert(h.finish()) && !input.is_empty() {
            if self.corpus.len() < CORPUS_MAX {
                self.corpus.push(input.to_vec());
            } else {
                let i = self.seeds + self.rng.below(CORPUS_MAX - self.seeds);
                self.corpus[i] = input.to_vec();
            }
        }
    }

    /// Runs the whole target: `f` returns the outcome of an input (see [`Fuzzer::outcome`]).
    /// Panicking inputs are shrunk (see [`Fuzzer::minimize`]) before the report.
    pub fn run(mut self, mut f: impl FnMut(&[u8]) -> String) -> Summary {
        while let Some(input) = self.next_input() {
            if let Some(outcome) = self.exec(&input, || f(&input)) {
                self.outcome(&input, &outcome);
            }
        }
        let found = std::mem::take(&mut self.found);
        for (i, (exec, input, message)) in found.into_iter().enumerate() {
            let input = match i < MINIMIZE_MAX {
                true => self.minimize(&input, &message, &mut f),
                false => input,
            };
            self.found.push((exec, input, message));
        }
        self.finish()
    }

    /// The smallest input found (by deleting ever smaller chunks) that still panics at the
    /// same place as `input` — what a regression case should hold.
    pub fn minimize(
        &mut self,
        input: &[u8],
        message: &str,
        f: &mut impl FnMut(&[u8]) -> String,
    ) -> Vec<u8> {
        let place = |m: &str| m.split(": ").next().unwrap_or_default().to_string();
        let want = place(message);
        let mut best = input.to_vec();
        let mut tries = 0;
        let mut chunk = best.len().div_ceil(2).max(1);
        loop {
            let mut at = 0;
            while at < best.len() && tries < MINIMIZE_TRIES {
                let mut candidate = best.clone();
                candidate.drain(at..(at + chunk).min(best.len()));
                tries += 1;
                IN_FUZZ.with(|c| *c.borrow_mut() = Some(String::new()));
                let panicked =
                    std::panic::catch_unwind(AssertUnwindSafe(|| f(&candidate))).is_err();
                let got = IN_FUZZ.with(|c| c.borrow_mut().take()).unwrap_or_default();
                if panicked && place(&got) == want {
                    best = candidate;
                } else {
                    at += chunk;
                }
            }
            if chunk == 1 || tries >= MINIMIZE_TRIES {
                return best;
            }
            chunk /= 2;
        }
    }

    /// Prints `fuzz <target>: <n> executions, <k> panics` and fails (with every panicking
    /// input as a Rust literal and the seed) if any execution panicked.
    pub fn finish(self) -> Summary {
        println!(
            "fuzz {}: {} executions, {} panics (seed {}, corpus {}, outcomes {})",
            self.name,
            self.done,
            self.panics,
            self.seed,
            self.corpus.len(),
            self.outcomes.len()
        );
        if self.panics > 0 {
            let mut report = format!(
                "fuzz {}: {} of {} executions panicked (replay: SLUICE_FUZZ_SEED={} SLUICE_FUZZ_EXECS={})\n",
                self.name, self.panics, self.done, self.seed, self.execs
            );
            for (exec, input, message) in &self.found {
                report.push_str(&format!(
                    "--- execution {exec}: {message}\ninput: {}\n",
                    literal(input)
                ));
            }
            panic!("{report}");
        }
        Summary {
            execs: self.done,
            panics: self.panics,
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub execs: u64,
    pub panics: u64,
}

/// `bytes` as a Rust byte-string literal (`b"..."`), to paste into a regression case.
pub fn literal(bytes: &[u8]) -> String {
    let mut out = String::from("b\"");
    for &b in bytes {
        out.extend(std::ascii::escape_default(b).map(char::from));
    }
    out.push('"');
    out
}

/// Panics seen on threads that were not running a fuzz execution (a server's writer, a
/// runtime's worker) since the process started. Targets that drive a whole server check
/// this did not move.
pub fn panics_elsewhere() -> u64 {
    PANICS_ELSEWHERE.load(Ordering::SeqCst)
}

/// A number from the environment variable `name` (decimal, or hex with `0x`): the seeds and
/// long-mode knobs of every seeded test. Panics on anything else, naming the variable.
pub fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let t = text.trim();
    let parsed = match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={text:?} is not a number")))
}

// ---------------------------------------------------------------------------------------
// Panic capture

thread_local! {
    /// `Some` while this thread runs a fuzz execution: the last panic's message lands here
    /// instead of on stderr (thousands of expected-looking backtraces would hide the report).
    static IN_FUZZ: RefCell<Option<String>> = const { RefCell::new(None) };
}

static PANICS_ELSEWHERE: AtomicU64 = AtomicU64::new(0);

fn last_elsewhere() -> &'static Mutex<String> {
    static LAST: OnceLock<Mutex<String>> = OnceLock::new();
    LAST.get_or_init(|| Mutex::new(String::new()))
}

fn last_panic_elsewhere() -> String {
    last_elsewhere()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let text = format!("panicked at {location}: {message}");
            let captured = IN_FUZZ.with(|c| match c.borrow_mut().as_mut() {
                Some(slot) => {
                    *slot = text.clone();
                    true
                }
                None => false,
            });
            if !captured {
                *last_elsewhere().lock().unwrap_or_else(|e| e.into_inner()) = text;
                PANICS_ELSEWHERE.fetch_add(1, Ordering::SeqCst);
                previous(info);
            }
        }));
    });
}

/// Polls a future under `catch_unwind`; `None` if a poll panicked.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        IN_FUZZ.with(|c| *c.borrow_mut() = Some(String::new()));
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Some(v)),
            Ok(Poll::Pending) => {
                // Between polls this thread may run other tasks, whose panics are not ours.
                IN_FUZZ.with(|c| *c.borrow_mut() = None);
                Poll::Pending
            }
            // The message stays in `IN_FUZZ` for `Fuzzer::after`.
            Err(_) => Poll::Ready(None),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Hang watchdog

struct Running {
    name: String,
    seed: u64,
    exec: u64,
    started: Instant,
    input: Vec<u8>,
}

fn running() -> &'static Mutex<HashMap<u64, Running>> {
    static RUNNING: OnceLock<Mutex<HashMap<u64, Running>>> = OnceLock::new();
    RUNNING.get_or_init(|| {
        let hang = Duration::from_secs(env_u64("SLUICE_FUZZ_HANG_SECS").unwrap_or(30));
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                let map = running().lock().unwrap_or_else(|e| e.into_inner());
                if let Some(r) = map.values().find(|r| r.started.elapsed() > hang) {
                    eprintln!(
                        "fuzz {}: execution {} has run {:?} (hang; SLUICE_FUZZ_SEED={}); input: {}",
                        r.name,
                        r.exec,
                        r.started.elapsed(),
                        r.seed,
                        literal(&r.input)
                    );
                    std::process::abort();
                }
            })
            .expect("spawn the fuzz watchdog");
        Mutex::new(HashMap::new())
    })
}

/// Registers one execution with the watchdog for as long as it lives.
struct Watch(u64);

impl Watch {
    fn begin(name: &str, seed: u64, exec: u64, input: &[u8]) -> Watch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let r = Running {
            name: name.to_string(),
            seed,
            exec,
            started: Instant::now(),
            input: input.to_vec(),
        };
        running()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, r);
        Watch(id)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        running()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}
