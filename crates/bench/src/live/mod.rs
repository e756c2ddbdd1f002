//! `sluice bench live`: end-to-end latency of live queries — a write sent, its ack, and the
//! diff for that write's seq at a subscriber — against the real `sluice serve` binary, next
//! to PostgreSQL doing the usual do-it-yourself live query (row trigger + `pg_notify`, a
//! `LISTEN`ing connection that re-runs the query on every notification).
//!
//! Families of cases:
//! 1. **view size**: one unordered filter view (`SELECT * FROM items WHERE grp = 1`) holding
//!    1 K … 1 M rows, followed over SSE (and over WebSocket at one size); every write patches
//!    one row of the view;
//! 2. **number of views**: V scoped top-k views (`… WHERE room = $1 ORDER BY ts DESC LIMIT
//!    20`, one per room, a few rows each) subscribed over a few WebSocket connections;
//!    writes insert into a random subscribed room; server RSS before/after gives memory per
//!    view;
//! 3. **shape**: plain filter, top-k, 2-way join, `IN (SELECT …)` depth 1 and 3, and an
//!    aggregate over the same tables, each alone; every write changes the view;
//! 4. **rules**: N users (100 … 10 000), each with its own client token and WebSocket,
//!    subscribed to the same `SELECT * FROM notes ORDER BY ts DESC LIMIT 20` under the row
//!    policy `owner = auth.sub`; writes insert a note for one random user; besides latency
//!    and memory per user it counts diffs at users a write was not for (`foreign_diffs`,
//!    which must be 0). See [`rules`].
//! 5. **compression** (only when named; its own report, `live-compression/`): a 10 K-row
//!    snapshot over SSE with identity, gzip and zstd and over the WebSocket in JSON and
//!    MessagePack — bytes and time to the last snapshot byte. See [`compression`].
//!
//! Writes are sequential (one in flight), so a sample is latency, not queueing. The bench
//! checks its own numbers: each subscriber recomputes the documented checksum after every
//! event and compares it with the server's, and after each case its materialised rows are
//! compared with a one-shot `POST /v1/query` (full content for views under 100 000 rows, the
//! row count above).
//!
//! # Layout
//! - [`client`]: SSE and WebSocket subscribers, the writer, the client-side materialisation.
//! - [`peer`]: the PostgreSQL trigger and listener.
//! - [`rules`]: the rules family.
//! - [`load`]: the load families (sustained write rates, a million views, coalescing; run
//!   only when named, their own report `live-load/`).
//! - [`summary`]: tables, targets, charts and `samples.json`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::hist::fmt_us;
use crate::peers::postgres::{find_bin_dir, Postgres};
use crate::progress::Progress;
use crate::report::Report;
use crate::server::{sluice_bin, SluiceServer};
use crate::sys::TempDir;
use crate::CommonArgs;

pub mod client;
pub mod compression;
pub mod load;
pub mod peer;
pub mod rules;
pub mod summary;

use client::{result_checksum, rss_bytes, Api, Mat, Note, SseSub, WsConn, SSE_QID};
use peer::Listener;

/// Rows per preload mutate.
const PRELOAD_BATCH: usize = 50_000;
/// Largest one-shot result the server returns (`rows_per_query_max`): bigger views are
/// checked by count instead of content.
const CONTENT_CHECK_ROWS_MAX: usize = 100_000;
/// How long one diff may take before the sample counts as a timeout.
const DIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a PostgreSQL re-query may take (1 M rows are slow by design).
const PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeouts after which a case gives up.
const TIMEOUTS_MAX: usize = 5;
/// Subscriptions per WebSocket connection in the views cases (the last takes the rest).
const SUBS_PER_CONNECTION: usize = 12_500;
/// WebSocket connections at most in the views cases.
const CONNECTIONS_MAX: usize = 8;
/// Rooms whose views are compared with a one-shot query after a views case, at most.
const ROOMS_CHECKED_MAX: usize = 200;
/// Rows in the window of a scoped view.
const TOP_K: usize = 20;

#[derive(clap::Args, Debug, Clone)]
pub struct LiveArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows in the view, one case each [default: 1000,10000,100000,1000000; --quick:
    /// 1000,4000].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Number of registered scoped views, one case each [default: 100,1000,10000,100000;
    /// --quick: 10,200].
    #[arg(long, value_delimiter = ',')]
    pub views: Option<Vec<usize>>,
    /// Measured writes per case (after the warm-up) [default: 1000; --quick: 40].
    #[arg(long)]
    pub samples: Option<usize>,
    /// Warm-up writes per case [default: 100; --quick: 5].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Rows of the `msg` table in the shape cases [default: 10000; --quick: 1000].
    #[arg(long)]
    pub shape_rows: Option<usize>,
    /// Rows per room in the number-of-views cases (each view holds its room's rows).
    #[arg(long, default_value_t = 3)]
    pub rows_per_room: usize,
    /// Longest measured time of one Sluice case, in seconds [default: 20; --quick: 5].
    #[arg(long)]
    pub case_seconds: Option<f64>,
    /// Longest measured time of one PostgreSQL case, in seconds [default: 10; --quick: 2].
    #[arg(long)]
    pub peer_seconds: Option<f64>,
    /// Users under a row policy, one case each (rules family) [default: 100,1000,10000;
    /// --quick: 20].
    #[arg(long, value_delimiter = ',')]
    pub users: Option<Vec<usize>>,
    /// Notes each user starts with (rules family).
    #[arg(long, default_value_t = 3)]
    pub notes_per_user: usize,
    /// Families to run: size, views, shape, rules, and compression (not run unless named;
    /// its results go to `live-compression/`).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["size".to_string(), "views".to_string(), "shape".to_string(), "rules".to_string()])]
    pub families: Vec<String>,
    /// Rows of the snapshot in the compression family.
    #[arg(long, default_value_t = 10_000)]
    pub compression_rows: usize,
    /// Snapshots per transport and encoding in the compression family [default: 7;
    /// --quick: 2].
    #[arg(long)]
    pub compression_runs: Option<usize>,
    /// Load family: open-loop write rates, one run each [default: 10000,50000; --quick: 500].
    #[arg(long, value_delimiter = ',')]
    pub load_rates: Option<Vec<usize>>,
    /// Load family: scoped views registered [default: 100000; --quick: 200].
    #[arg(long)]
    pub load_views: Option<usize>,
    /// Load and coalesce families: seconds each rate runs [default: 10; --quick: 1].
    #[arg(long)]
    pub load_seconds: Option<f64>,
    /// Million family: scoped views on one server [default: 1000000; --quick: 2000].
    #[arg(long)]
    pub million_views: Option<usize>,
    /// Coalesce family: rows of the hot view [default: 1000; --quick: 100].
    #[arg(long)]
    pub hot_rows: Option<usize>,
    /// Coalesce family: writes per second [default: 2000; --quick: 500].
    #[arg(long)]
    pub hot_rate: Option<usize>,
    /// Coalesce family: `coalesce_ms` windows, one subscriber each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0u32, 10, 100])]
    pub coalesce_windows: Vec<u32>,
    /// Skip the PostgreSQL peer (it is also skipped, with a note, when not installed).
    #[arg(long)]
    pub no_peers: bool,
    /// Directory holding PostgreSQL's `initdb` and `postgres` (default: `$PG_BIN`, else
    /// the newest /usr/lib/postgresql/*/bin).
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
}

/// Parameters after `--quick` is applied.
#[derive(Clone, Debug, Serialize)]
pub struct Params {
    pub sizes: Vec<usize>,
    pub views: Vec<usize>,
    pub users: Vec<usize>,
    pub notes_per_user: usize,
    pub samples: usize,
    pub warmup: usize,
    pub shape_rows: usize,
    pub rows_per_room: usize,
    pub case_seconds: f64,
    pub peer_seconds: f64,
    pub families: Vec<String>,
    pub compression_rows: usize,
    pub compression_runs: usize,
    /// The view size also measured over WebSocket.
    pub ws_size: Option<usize>,
    pub peers: bool,
    pub quick: bool,
    pub load: load::LoadParams,
}

impl Params {
    fn from(args: &LiveArgs) -> anyhow::Result<Params> {
        let quick = args.common.quick;
        let pick = |given: &Option<Vec<usize>>, full: &[usize], small: &[usize]| {
            let mut v = given
                .clone()
                .unwrap_or_else(|| if quick { small } else { full }.to_vec());
            v.sort_unstable();
            v.dedup();
            v
        };
        let sizes = pick(
            &args.sizes,
            &[1_000, 10_000, 100_000, 1_000_000],
            &[1_000, 4_000],
        );
        let views = pick(&args.views, &[100, 1_000, 10_000, 100_000], &[10, 200]);
        let users = pick(&args.users, &[100, 1_000, 10_000], &[20]);
        anyhow::ensure!(users.iter().all(|&u| u >= 1), "--users must be at least 1");
        anyhow::ensure!(
            sizes.iter().all(|&s| (1..=1_000_000).contains(&s)),
            "--sizes must be between 1 and 1000000 (a view is built by one query, which reads at most joined_rows_max = 1000000 rows)"
        );
        anyhow::ensure!(views.iter().all(|&v| v >= 1), "--views must be at least 1");
        for f in &args.families {
            anyhow::ensure!(
                ["size", "views", "shape", "rules", "compression"]
                    .iter()
                    .chain(LOAD_FAMILIES)
                    .any(|k| k == f),
                "unknown family {f:?}: expected size, views, shape, rules, compression, load, million or coalesce"
            );
        }
        let ws_size = sizes
            .iter()
            .copied()
            .min_by_key(|&s| (s as i64 - 10_000).abs());
        let p = Params {
            ws_size,
            sizes,
            views,
            users,
            notes_per_user: args.notes_per_user,
            samples: args.samples.unwrap_or(if quick { 40 } else { 1_000 }),
            warmup: args.warmup.unwrap_or(if quick { 5 } else { 100 }),
            shape_rows: args
                .shape_rows
                .unwrap_or(if quick { 1_000 } else { 10_000 }),
            rows_per_room: args.rows_per_room,
            case_seconds: args.case_seconds.unwrap_or(if quick { 5.0 } else { 20.0 }),
            peer_seconds: args.peer_seconds.unwrap_or(if quick { 2.0 } else { 10.0 }),
            families: args.families.clone(),
            compression_rows: args.compression_rows,
            compression_runs: args.compression_runs.unwrap_or(if quick { 2 } else { 7 }),
            peers: !args.no_peers,
            quick,
            load: load::LoadParams {
                rates: args.load_rates.clone().unwrap_or(if quick {
                    vec![500]
                } else {
                    vec![10_000, 50_000]
                }),
                views: args.load_views.unwrap_or(if quick { 200 } else { 100_000 }),
                seconds: args.load_seconds.unwrap_or(if quick { 1.0 } else { 10.0 }),
                million_views: args
                    .million_views
                    .unwrap_or(if quick { 2_000 } else { 1_000_000 }),
                hot_rows: args.hot_rows.unwrap_or(if quick { 100 } else { 1_000 }),
                hot_rate: args.hot_rate.unwrap_or(if quick { 500 } else { 2_000 }),
                windows: args.coalesce_windows.clone(),
            },
        };
        anyhow::ensure!(
            p.load.rates.iter().all(|&r| r >= 1)
                && p.load.views >= 1
                && p.load.million_views >= 1
                && p.load.hot_rows >= 10
                && p.load.hot_rate >= 1
                && p.load.seconds > 0.0,
            "--load-rates, --load-views, --million-views and --hot-rate must be at least 1, --hot-rows at least 10, --load-seconds positive"
        );
        anyhow::ensure!(
            p.load
                .windows
                .iter()
                .all(|&w| w <= sluice_live_coalesce_ms_max()),
            "--coalesce-windows must be at most 10000 ms (the server's coalesce_ms_max)"
        );
        anyhow::ensure!(p.samples >= 1, "--samples must be at least 1");
        anyhow::ensure!(
            p.compression_rows >= 1 && p.compression_runs >= 1,
            "--compression-rows and --compression-runs must be at least 1"
        );
        anyhow::ensure!(
            p.shape_rows >= 100,
            "--shape-rows must be at least 100 (100 rooms)"
        );
        anyhow::ensure!(
            p.case_seconds > 0.0 && p.peer_seconds > 0.0,
            "--case-seconds and --peer-seconds must be positive"
        );
        Ok(p)
    }

    fn runs(&self, family: &str) -> bool {
        self.families.iter().any(|f| f == family)
    }
}

// ---------------------------------------------------------------------------------------
// Results.

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Size,
    Views,
    Shape,
    Rules,
}

/// Percentiles of one series of samples, in µs (may be negative for ack → diff).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Dist {
    pub n: usize,
    pub mean_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Dist {
    pub fn of(values: &[f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let q = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Dist {
            n: v.len(),
            mean_us: v.iter().sum::<f64>() / v.len() as f64,
            min_us: v[0],
            p50_us: q(0.50),
            p95_us: q(0.95),
            p99_us: q(0.99),
            max_us: v[v.len() - 1],
        }
    }
}

/// What the bench checked about its own numbers after a case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verify {
    /// Rows the subscriber(s) held at the end (sum over the checked views).
    pub rows_seen: usize,
    /// Rows a one-shot query returned (or counted) for the same views.
    pub rows_expected: usize,
    /// `content`: rows and checksum compared with the one-shot result; `count`: rows only.
    pub method: &'static str,
    /// The subscriber's recomputed checksum equals the one-shot result's (content checks).
    pub content_match: Option<bool>,
    /// Events whose server checksum was compared with the subscriber's, and disagreements.
    pub checksums_checked: u64,
    pub checksum_mismatches: u64,
    pub ok: bool,
    pub detail: String,
}

/// Server memory in a views case: RSS, and the server allocator's own live-heap counters
/// (`sluice_alloc_bytes` / `sluice_alloc_blocks` in `/metrics`), read at the same moments.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    pub rss_before: u64,
    pub rss_subscribed: u64,
    pub rss_after_leave: Option<u64>,
    /// The same views subscribed again after the first ones expired: memory reused or not.
    pub rss_resubscribed: Option<u64>,
    /// (RSS subscribed − RSS before) / views.
    pub bytes_per_view: f64,
    /// Live heap bytes and blocks before subscribing and with every view subscribed; `None`
    /// when the server does not expose the counters.
    pub alloc_bytes_before: Option<i64>,
    pub alloc_bytes_subscribed: Option<i64>,
    pub alloc_blocks_before: Option<i64>,
    pub alloc_blocks_subscribed: Option<i64>,
    /// (heap subscribed − heap before) / views: exact bytes the server asked for per view.
    pub alloc_bytes_per_view: Option<f64>,
    pub alloc_blocks_per_view: Option<f64>,
    /// Live heap bytes once every view expired, and after subscribing the same views again.
    pub alloc_bytes_after_leave: Option<i64>,
    pub alloc_bytes_resubscribed: Option<i64>,
    /// `sluice_live_views` / `sluice_live_subscribers` once all were subscribed.
    pub views_gauge: f64,
    pub subscribers_gauge: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Case {
    pub family: Family,
    /// `sluice` or `postgres`.
    pub system: &'static str,
    /// `sse`, `ws` or `listen/notify`.
    pub transport: &'static str,
    /// Sluice: the mutate's durability class; PostgreSQL: the writer's synchronous_commit.
    pub durability: String,
    /// Rows in the view (size family).
    pub size: Option<usize>,
    /// Views registered (views family).
    pub views: Option<usize>,
    /// Shape name (shape family).
    pub shape: Option<String>,
    /// Users, each with its own token and subscription (rules family).
    pub users: Option<usize>,
    pub sql: String,
    /// Sluice's operator for the view (by the rules of `crates/live/src/operator.rs`).
    pub operator: Option<&'static str>,
    /// Rows in the view the subscriber saw at the end (per view in the views family).
    pub view_rows: usize,
    pub warmup: usize,
    pub samples: usize,
    pub timeouts: usize,
    /// Diffs of the write's seq for another view, or of a later seq, while waiting.
    pub unexpected: usize,
    /// Reset snapshots instead of diffs (a subscriber fell behind).
    pub resets: usize,
    /// Write sent → diff (or re-query result) received.
    pub write_to_diff: Dist,
    /// Ack received → diff received; negative when the diff arrived first.
    pub ack_to_diff: Dist,
    /// Write sent → ack received.
    pub ack: Dist,
    pub diff_before_ack: usize,
    /// Subscribe sent → snapshot received (one view), in ms.
    pub snapshot_ms: Option<f64>,
    /// Writes to an unrelated table, one at a time, while the view was being subscribed:
    /// how many, and the slowest ack (ms) — how long building the snapshot held writers up.
    pub probe_writes: Option<usize>,
    pub probe_ack_max_ms: Option<f64>,
    /// Median of one-shot `POST /v1/query` runs of the view's SQL (ms), for context.
    pub query_ms: Option<f64>,
    /// All views subscribed: first subscribe sent → last snapshot received, in s.
    pub subscribe_s: Option<f64>,
    pub memory: Option<Memory>,
    /// Foreign diffs, memory per user, … (rules family).
    pub rules: Option<rules::RulesStats>,
    pub verify: Verify,
    /// Measured window, s.
    pub seconds: f64,
    pub error: Option<String>,
    /// Raw samples, µs, in the order taken.
    pub write_to_diff_us: Vec<f64>,
    pub ack_to_diff_us: Vec<f64>,
}

impl Case {
    fn new(family: Family, system: &'static str, transport: &'static str, sql: &str) -> Case {
        Case {
            family,
            system,
            transport,
            durability: String::new(),
            size: None,
            views: None,
            shape: None,
            users: None,
            sql: sql.to_string(),
            operator: None,
            view_rows: 0,
            warmup: 0,
            samples: 0,
            timeouts: 0,
            unexpected: 0,
            resets: 0,
            write_to_diff: Dist::default(),
            ack_to_diff: Dist::default(),
            ack: Dist::default(),
            diff_before_ack: 0,
            snapshot_ms: None,
            probe_writes: None,
            probe_ack_max_ms: None,
            query_ms: None,
            subscribe_s: None,
            memory: None,
            rules: None,
            verify: Verify::default(),
            seconds: 0.0,
            error: None,
            write_to_diff_us: Vec::new(),
            ack_to_diff_us: Vec::new(),
        }
    }

    pub fn label(&self) -> String {
        let what = match self.family {
            Family::Size => format!("{} rows in the view", self.size.unwrap_or(0)),
            Family::Views => format!("{} views", self.views.unwrap_or(0)),
            Family::Shape => format!("shape {}", self.shape.as_deref().unwrap_or("?")),
            Family::Rules => format!("{} users under a row policy", self.users.unwrap_or(0)),
        };
        format!(
            "{} {what} ({}, {})",
            self.system, self.transport, self.durability
        )
    }

    fn take(&mut self, s: Samples) {
        self.warmup = s.warmup;
        self.samples = s.w2d.len();
        self.timeouts = s.timeouts;
        self.unexpected = s.unexpected;
        self.resets = s.resets;
        self.write_to_diff = Dist::of(&s.w2d);
        self.ack_to_diff = Dist::of(&s.a2d);
        self.ack = Dist::of(&s.ack);
        self.diff_before_ack = s.a2d.iter().filter(|&&d| d < 0.0).count();
        self.seconds = s.seconds;
        let round = |v: Vec<f64>| v.into_iter().map(|x| (x * 10.0).round() / 10.0).collect();
        self.write_to_diff_us = round(s.w2d);
        self.ack_to_diff_us = round(s.a2d);
    }

    fn say(&self, progress: &Progress) {
        match &self.error {
            Some(e) => progress.say(format!("  FAILED: {e}")),
            None => progress.say(format!(
                "  {} samples: write→diff p50 {} p99 {}, ack→diff p50 {}, {} of {} diffs before the ack{}{}",
                self.samples,
                fmt_signed_us(self.write_to_diff.p50_us),
                fmt_signed_us(self.write_to_diff.p99_us),
                fmt_signed_us(self.ack_to_diff.p50_us),
                self.diff_before_ack,
                self.samples,
                if self.verify.ok { ", verified" } else { ", VERIFICATION FAILED: " },
                if self.verify.ok { "" } else { self.verify.detail.as_str() },
            )),
        }
    }
}

/// `850 µs`, `-12 µs`, `1.25 ms`.
pub fn fmt_signed_us(us: f64) -> String {
    let sign = if us < 0.0 { "-" } else { "" };
    format!("{sign}{}", fmt_us(us.abs().round() as u64))
}

// ---------------------------------------------------------------------------------------
// Sampling.

#[derive(Debug, Default)]
struct Samples {
    warmup: usize,
    w2d: Vec<f64>,
    a2d: Vec<f64>,
    ack: Vec<f64>,
    timeouts: usize,
    unexpected: usize,
    resets: usize,
    seconds: f64,
}

/// How many samples, for how long.
#[derive(Clone, Copy, Debug)]
struct Budget {
    warmup: usize,
    samples: usize,
    seconds: f64,
}

/// The sampling loop's bookkeeping: warm-up ends after `warmup` writes or a fifth of the
/// time budget; the measured phase after `samples` writes or `seconds`.
struct Run {
    budget: Budget,
    started: Instant,
    measuring: Option<Instant>,
    i: usize,
    s: Samples,
}

impl Run {
    fn new(budget: Budget) -> Run {
        Run {
            budget,
            started: Instant::now(),
            measuring: None,
            i: 0,
            s: Samples::default(),
        }
    }

    /// The index of the next write, or `None` when the case is done.
    fn next(&mut self) -> anyhow::Result<Option<usize>> {
        let b = self.budget;
        if self.measuring.is_none()
            && (self.i >= b.warmup || self.started.elapsed().as_secs_f64() > b.seconds / 5.0)
        {
            self.s.warmup = self.i;
            self.measuring = Some(Instant::now());
        }
        if let Some(m) = self.measuring {
            let t = m.elapsed().as_secs_f64();
            if self.s.w2d.len() >= b.samples || (t > b.seconds && !self.s.w2d.is_empty()) {
                self.s.seconds = t;
                return Ok(None);
            }
            anyhow::ensure!(
                t < b.seconds * 3.0 + DIFF_TIMEOUT.as_secs_f64(),
                "no sample in {t:.0}s"
            );
        }
        self.i += 1;
        Ok(Some(self.i - 1))
    }

    /// One write's outcome: (write→diff, ack→diff, ack) in µs, or `None` for a timeout.
    fn record(&mut self, sample: Option<(f64, f64, f64)>) -> anyhow::Result<()> {
        match sample {
            Some((w2d, a2d, ack)) => {
                if self.measuring.is_some() {
                    self.s.w2d.push(w2d);
                    self.s.a2d.push(a2d);
                    self.s.ack.push(ack);
                }
            }
            None => {
                self.s.timeouts += 1;
                anyhow::ensure!(
                    self.s.timeouts < TIMEOUTS_MAX,
                    "{} writes got no diff in time",
                    self.s.timeouts
                );
            }
        }
        Ok(())
    }
}

/// How waiting for one write's diff ended.
enum Waited {
    Diff(Instant),
    /// A reset snapshot covered the write's seq instead.
    Reset,
    Timeout,
}

/// Reads notes until the diff of `seq` for `qid` arrives.
async fn wait_diff(
    notes: &mut mpsc::UnboundedReceiver<Note>,
    qid: u64,
    seq: u64,
    unexpected: &mut usize,
) -> anyhow::Result<Waited> {
    let deadline = tokio::time::Instant::now() + DIFF_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, notes.recv()).await {
            Err(_) => return Ok(Waited::Timeout),
            Ok(None) => anyhow::bail!("every subscriber ended"),
            Ok(Some(Note::Diff { qid: q, seq: s, at })) => {
                if q == qid && s == seq {
                    return Ok(Waited::Diff(at));
                }
                if s >= seq {
                    *unexpected += 1;
                }
            }
            Ok(Some(Note::Snapshot {
                qid: q,
                seq: s,
                reset,
                ..
            })) => {
                if reset && q == qid && s >= seq {
                    return Ok(Waited::Reset);
                }
            }
            Ok(Some(Note::Failed { qid, message })) => {
                anyhow::bail!("subscription {qid:?} failed: {message}")
            }
        }
    }
}

/// Sequential writes through `api`, each waited for at subscriber `qid`.
async fn sample_sluice(
    api: &Api,
    notes: &mut mpsc::UnboundedReceiver<Note>,
    budget: Budget,
    mut write: impl FnMut(usize) -> (String, u64),
) -> anyhow::Result<Samples> {
    let mut run = Run::new(budget);
    let mut unexpected = 0;
    let mut resets = 0;
    while let Some(i) = run.next()? {
        let (body, qid) = write(i);
        let t0 = Instant::now();
        let (seq, acked) = api.mutate(body).await?;
        let sample = match wait_diff(notes, qid, seq, &mut unexpected).await? {
            Waited::Diff(at) => Some((us(at - t0), signed_us(acked, at), us(acked - t0))),
            Waited::Reset => {
                // A reset carries no latency sample.
                resets += 1;
                continue;
            }
            Waited::Timeout => None,
        };
        run.record(sample)?;
    }
    let mut s = run.s;
    s.unexpected = unexpected;
    s.resets = resets;
    Ok(s)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `b - a` in µs, negative when `b` came first.
fn signed_us(a: Instant, b: Instant) -> f64 {
    if b >= a {
        us(b - a)
    } else {
        -us(a - b)
    }
}

/// A small deterministic generator (xorshift64*), so runs write the same rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------
// Servers.

struct Ctx<'a> {
    params: &'a Params,
    bin: &'a Path,
    progress: Progress,
}

impl Ctx<'_> {
    fn budget(&self) -> Budget {
        Budget {
            warmup: self.params.warmup,
            samples: self.params.samples,
            seconds: self.params.case_seconds,
        }
    }

    fn peer_budget(&self) -> Budget {
        Budget {
            warmup: self.params.warmup.min(20),
            samples: self.params.samples,
            seconds: self.params.peer_seconds,
        }
    }

    /// `sluice serve` with `memory` as the default class and room for big preloads.
    async fn start(&self, extra: &[&str]) -> anyhow::Result<(SluiceServer, Api, TempDir)> {
        let dir = TempDir::new("live")?;
        let mut flags: Vec<String> = [
            "--durability",
            "memory",
            "--max-ops",
            "100000",
            "--max-body-bytes",
            "33554432",
            "--live-ttl-secs",
            "1",
            // Memory per view from the allocator's own counters, beside RSS.
            "--count-allocations",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        flags.extend(extra.iter().map(|s| s.to_string()));
        let (server, _) = SluiceServer::start(self.bin, &dir.path().join("data"), &flags).await?;
        let api = Api::new(&server.base_url)?;
        self.progress.say(format!(
            "sluice serve on {} (pid {}) {}",
            server.base_url,
            server.pid(),
            flags.join(" ")
        ));
        Ok((server, api, dir))
    }
}

/// Waits until the server holds no live view (idle views expire after `--live-ttl-secs 1`).
async fn wait_no_views(api: &Api) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if api.metric("sluice_live_views").await? == 0.0 {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "live views did not expire within 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the bench checks a case's final view against a one-shot query.
enum Check<'a> {
    /// Run the view's own query and compare rows and checksum.
    Content,
    /// Compare the row count with this `SELECT COUNT(*) AS n …`.
    Count(&'a str),
}

async fn check_view(
    api: &Api,
    mat: &Mat,
    sql: &str,
    params: &Value,
    check: Check<'_>,
) -> anyhow::Result<Verify> {
    let mut v = Verify {
        rows_seen: mat.len(),
        checksums_checked: mat.checked,
        checksum_mismatches: mat.mismatches,
        ..Verify::default()
    };
    let check = match check {
        Check::Count(_) if mat.len() < CONTENT_CHECK_ROWS_MAX => Check::Content,
        c => c,
    };
    match check {
        Check::Content => {
            let (rows, sum) = result_checksum(&api.query(sql, params).await?)?;
            v.method = "content";
            v.rows_expected = rows;
            v.content_match = Some(rows == mat.len() && sum == mat.sum);
        }
        Check::Count(count_sql) => {
            v.method = "count";
            v.rows_expected = api.count(count_sql, params).await?;
        }
    }
    v.ok = v.rows_seen == v.rows_expected
        && v.content_match != Some(false)
        && v.checksum_mismatches == 0
        && v.checksums_checked > 0;
    v.detail = format!(
        "{} rows seen, {} by one-shot query ({}){}; {} of {} event checksums disagreed",
        v.rows_seen,
        v.rows_expected,
        v.method,
        match v.content_match {
            Some(true) => ", same checksum",
            Some(false) => ", DIFFERENT checksum",
            None => "",
        },
        v.checksum_mismatches,
        v.checksums_checked
    );
    Ok(v)
}

/// One subscriber on one view: subscribe, wait for the snapshot, sample, verify.
struct OneView<'a> {
    transport: &'static str,
    sql: &'a str,
    params: Value,
    check: Check<'a>,
    /// The mutate's durability, when not the server default.
    durability: Option<&'static str>,
    operator: &'static str,
    /// Write to the `probe` table while the view is subscribed (see [`Case::probe_writes`]).
    probe: bool,
    /// Time one-shot queries of the view's SQL after the case.
    time_query: bool,
}

/// Upserts into `probe`, one at a time with a 2 ms pause, until `stop`; returns the acks (µs).
fn spawn_probe(
    api: &Api,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<f64>>> {
    let api = api.clone();
    tokio::spawn(async move {
        let mut acks = Vec::new();
        let mut i = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            i += 1;
            let t = Instant::now();
            api.mutate(format!(
                "{{\"ops\":[{{\"op\":\"upsert\",\"table\":\"probe\",\"row\":{{\"id\":1,\"v\":{i}}}}}]}}"
            ))
            .await?;
            acks.push(us(t.elapsed()));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(acks)
    })
}

async fn one_view_case(
    ctx: &Ctx<'_>,
    api: &Api,
    view: OneView<'_>,
    case: &mut Case,
    mut write: impl FnMut(usize) -> String,
) -> anyhow::Result<()> {
    case.durability = view.durability.unwrap_or("memory").to_string();
    case.operator = Some(view.operator);
    let (tx, mut notes) = mpsc::unbounded_channel();
    let stop_probe = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = view.probe.then(|| spawn_probe(api, stop_probe.clone()));
    let asked = Instant::now();
    enum Sub {
        Sse(SseSub),
        Ws(WsConn),
    }
    let sub = if view.transport == "ws" {
        let mut conn = WsConn::connect(&api.base, tx).await?;
        conn.subscribe_many(view.sql, std::iter::once((SSE_QID, view.params.clone())))
            .await?;
        Sub::Ws(conn)
    } else {
        Sub::Sse(SseSub::open(&api.base, view.sql, &view.params, tx).await?)
    };
    let snapshot_at = loop {
        match tokio::time::timeout(Duration::from_secs(300), notes.recv()).await {
            Err(_) => anyhow::bail!("no snapshot within 300s"),
            Ok(None) => anyhow::bail!("the subscriber ended before its snapshot"),
            Ok(Some(Note::Snapshot { at, .. })) => break at,
            Ok(Some(Note::Failed { message, .. })) => anyhow::bail!("subscribe failed: {message}"),
            Ok(Some(Note::Diff { .. })) => {}
        }
    };
    case.snapshot_ms = Some(us(snapshot_at - asked) / 1e3);
    if let Some(probe) = probe {
        stop_probe.store(true, std::sync::atomic::Ordering::Relaxed);
        let acks = probe.await.context("the probe writer panicked")??;
        case.probe_writes = Some(acks.len());
        case.probe_ack_max_ms = Some(acks.iter().fold(0.0f64, |m, &a| m.max(a)) / 1e3);
    }
    let samples = sample_sluice(api, &mut notes, ctx.budget(), |i| {
        let body = write(i);
        let body = match view.durability {
            Some(d) => format!(
                "{},\"durability\":\"{d}\"}}",
                body.strip_suffix('}').unwrap_or(&body)
            ),
            None => body,
        };
        (body, SSE_QID)
    })
    .await?;
    case.take(samples);
    // Anything still in flight lands before the subscriber is closed.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mat = match sub {
        Sub::Sse(s) => s.close().await?,
        Sub::Ws(c) => c
            .close()
            .await?
            .remove(&SSE_QID)
            .context("the WebSocket subscription saw nothing")?,
    };
    case.view_rows = mat.len();
    case.resets += mat.resets as usize;
    case.verify = check_view(api, &mat, view.sql, &view.params, view.check).await?;
    if view.time_query && mat.len() < CONTENT_CHECK_ROWS_MAX {
        let mut took = Vec::new();
        for _ in 0..21 {
            let t = Instant::now();
            api.query(view.sql, &view.params).await?;
            took.push(us(t.elapsed()));
        }
        case.query_ms = Some(Dist::of(&took).p50_us / 1e3);
    }
    Ok(())
}

/// Records the outcome of a case and prints it.
fn finish(progress: &Progress, case: &mut Case, outcome: anyhow::Result<()>) {
    if let Err(e) = outcome {
        case.error = Some(format!("{e:#}"));
    }
    case.say(progress);
}

// ---------------------------------------------------------------------------------------
// Family 1: view size.

const ITEMS_SCHEMA: &str =
    "CREATE TABLE items (id INTEGER PRIMARY KEY, grp INTEGER NOT NULL, val INTEGER NOT NULL)";
const PROBE_SCHEMA: &str = "CREATE TABLE probe (id INTEGER PRIMARY KEY, v INTEGER)";
const SIZE_VIEW: &str = "SELECT * FROM items WHERE grp = 1";
const SIZE_COUNT: &str = "SELECT COUNT(*) AS n FROM items WHERE grp = 1";

fn patch_item(id: usize, val: u64) -> String {
    format!("{{\"ops\":[{{\"op\":\"patch\",\"table\":\"items\",\"id\":{id},\"set\":{{\"val\":{val}}}}}]}}")
}

async fn size_family(
    ctx: &Ctx<'_>,
    pg: Option<&Postgres>,
    cases: &mut Vec<Case>,
) -> anyhow::Result<()> {
    let p = ctx.params;
    let max = p.sizes.iter().copied().max().unwrap_or(1);
    let rows_max = (2 * max).max(2_000_000).to_string();
    let (server, api, _dir) = ctx
        .start(&["--live-view-rows-max", rows_max.as_str()])
        .await?;
    api.sql(ITEMS_SCHEMA).await?;
    api.sql(PROBE_SCHEMA).await?;
    let pg_writer = match pg {
        Some(pg) => {
            let c = pg.connect().await?;
            c.batch_execute(
                "SET client_min_messages = warning;
                 DROP TABLE IF EXISTS items;
                 CREATE TABLE items (id integer PRIMARY KEY, grp integer NOT NULL, val integer NOT NULL)",
            )
            .await?;
            c.batch_execute(&peer::trigger_sql("items", "val")).await?;
            Some(c)
        }
        None => None,
    };
    let mut have = 0usize;
    let mut token = 0u64;
    let mut rng = Rng(0x5eed_0001);
    for &size in &p.sizes {
        wait_no_views(&api).await?;
        let t = Instant::now();
        api.preload(
            "items",
            (have..size).map(|id| format!("{{\"id\":{id},\"grp\":1,\"val\":0}}")),
            PRELOAD_BATCH,
        )
        .await?;
        ctx.progress.say(format!(
            "items grown from {have} to {size} rows in {:.1}s (server RSS {})",
            t.elapsed().as_secs_f64(),
            rss_bytes(server.pid()).map_or("?".into(), fmt_bytes)
        ));
        let transports: &[&'static str] = if Some(size) == p.ws_size {
            &["sse", "ws"]
        } else {
            &["sse"]
        };
        for &transport in transports {
            wait_no_views(&api).await?;
            let mut case = Case::new(Family::Size, "sluice", transport, SIZE_VIEW);
            case.size = Some(size);
            ctx.progress
                .say(format!("case: {size} rows in the view, over {transport}"));
            let view = OneView {
                transport,
                sql: SIZE_VIEW,
                params: json!([]),
                check: Check::Count(SIZE_COUNT),
                durability: None,
                operator: "filter",
                probe: true,
                time_query: false,
            };
            let outcome = one_view_case(ctx, &api, view, &mut case, |_| {
                token += 1;
                patch_item(rng.below(size), token)
            })
            .await;
            finish(&ctx.progress, &mut case, outcome);
            cases.push(case);
        }
        if let (Some(pg), Some(w)) = (pg, &pg_writer) {
            let mut case = Case::new(Family::Size, "postgres", "listen/notify", SIZE_VIEW);
            case.size = Some(size);
            ctx.progress
                .say(format!("case: PostgreSQL, {size} rows in the view"));
            let grow = format!(
                "ALTER TABLE items DISABLE TRIGGER items_notify;
                 INSERT INTO items SELECT g, 1, 0 FROM generate_series({have}, {}) g;
                 ALTER TABLE items ENABLE TRIGGER items_notify;
                 ANALYZE items;",
                size as i64 - 1
            );
            let outcome = async {
                w.batch_execute(&grow).await?;
                let view = PgView {
                    sql: SIZE_VIEW,
                    write_sql: "UPDATE items SET val = $1 WHERE id = $2",
                    synchronous_commit: false,
                };
                pg_case(ctx, pg, w, &mut case, view, |_| {
                    token += 1;
                    vec![token as i32, rng.below(size) as i32]
                })
                .await
            }
            .await;
            finish(&ctx.progress, &mut case, outcome);
            cases.push(case);
        }
        have = size;
    }
    drop(server);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Family 2: number of views.

const MSG_SCHEMA: &str = "CREATE TABLE msg (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, \
    author INTEGER NOT NULL, ts INTEGER NOT NULL, body TEXT); CREATE INDEX msg_room ON msg (room)";
const ROOM_VIEW: &str = "SELECT * FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 20";

fn msg_row(id: usize, room: usize, author: usize, ts: usize, body: &str) -> String {
    format!("{{\"id\":{id},\"room\":{room},\"author\":{author},\"ts\":{ts},\"body\":\"{body}\"}}")
}

fn insert_msg(id: usize, room: usize, author: usize) -> String {
    format!(
        "{{\"ops\":[{{\"op\":\"insert\",\"table\":\"msg\",\"row\":{}}}]}}",
        msg_row(id, room, author, id, "x")
    )
}

/// Subscribes rooms `0..v` over a few WebSocket connections, pipelined; returns the
/// connections, their notes and the time until the last snapshot arrived.
async fn subscribe_rooms(
    ctx: &Ctx<'_>,
    api: &Api,
    v: usize,
) -> anyhow::Result<(Vec<WsConn>, mpsc::UnboundedReceiver<Note>, f64)> {
    let conns_n = v.div_ceil(SUBS_PER_CONNECTION).clamp(1, CONNECTIONS_MAX);
    let (tx, mut notes) = mpsc::unbounded_channel();
    let mut conns = Vec::with_capacity(conns_n);
    for _ in 0..conns_n {
        conns.push(WsConn::connect(&api.base, tx.clone()).await?);
    }
    drop(tx);
    let started = Instant::now();
    let sends = conns.iter_mut().enumerate().map(|(c, conn)| {
        conn.subscribe_many(
            ROOM_VIEW,
            (0..v)
                .filter(move |room| room % conns_n == c)
                .map(|room| (room as u64, json!([room]))),
        )
    });
    let counting = await_snapshots(&mut notes, v, "views", &ctx.progress);
    let (sent, last) = tokio::join!(futures_util::future::try_join_all(sends), counting);
    sent?;
    let secs = (last? - started).as_secs_f64();
    ctx.progress.say(format!(
        "  {v} views subscribed over {conns_n} connection(s) in {secs:.1}s"
    ));
    Ok((conns, notes, secs))
}

/// RSS once the allocator had a moment (the live thread also publishes its counters once
/// per round).
async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    tokio::time::sleep(Duration::from_millis(1000)).await;
    rss_bytes(pid).context("cannot read the server's RSS")
}

/// The server's live heap bytes and blocks from its allocator's counters, right after a
/// [`settled_rss`]; `None` if the server does not expose them.
async fn heap(api: &Api) -> anyhow::Result<Option<(i64, i64)>> {
    let bytes = api.metric_opt("sluice_alloc_bytes").await?;
    let blocks = api.metric_opt("sluice_alloc_blocks").await?;
    Ok(bytes.zip(blocks).map(|(a, b)| (a as i64, b as i64)))
}

async fn views_case(ctx: &Ctx<'_>, v: usize, case: &mut Case) -> anyhow::Result<()> {
    let p = ctx.params;
    let per_connection = v.max(1024).to_string();
    let (server, api, _dir) = ctx
        .start(&[
            "--live-subscriptions-per-connection",
            per_connection.as_str(),
        ])
        .await?;
    api.sql(MSG_SCHEMA).await?;
    let r = p.rows_per_room;
    api.preload(
        "msg",
        (0..v * r).map(|id| msg_row(id, id / r.max(1), 0, id, "hello")),
        PRELOAD_BATCH,
    )
    .await?;
    let rss_before = settled_rss(server.pid()).await?;
    let heap_before = heap(&api).await?;
    let (conns, mut notes, secs) = subscribe_rooms(ctx, &api, v).await?;
    case.subscribe_s = Some(secs);
    let rss_subscribed = settled_rss(server.pid()).await?;
    let heap_subscribed = heap(&api).await?;
    let per_view = |a: i64, b: i64| (b - a) as f64 / v as f64;
    let heaps = heap_before.zip(heap_subscribed);
    let mut memory = Memory {
        rss_before,
        rss_subscribed,
        rss_after_leave: None,
        rss_resubscribed: None,
        bytes_per_view: (rss_subscribed as f64 - rss_before as f64) / v as f64,
        alloc_bytes_before: heap_before.map(|h| h.0),
        alloc_bytes_subscribed: heap_subscribed.map(|h| h.0),
        alloc_blocks_before: heap_before.map(|h| h.1),
        alloc_blocks_subscribed: heap_subscribed.map(|h| h.1),
        alloc_bytes_per_view: heaps.map(|(a, b)| per_view(a.0, b.0)),
        alloc_blocks_per_view: heaps.map(|(a, b)| per_view(a.1, b.1)),
        alloc_bytes_after_leave: None,
        alloc_bytes_resubscribed: None,
        views_gauge: api.metric("sluice_live_views").await?,
        subscribers_gauge: api.metric("sluice_live_subscribers").await?,
    };
    ctx.progress.say(format!(
        "  RSS {} → {} ({:.0} bytes/view); heap {} ({}); sluice_live_views {}, sluice_live_subscribers {}",
        fmt_bytes(rss_before),
        fmt_bytes(rss_subscribed),
        memory.bytes_per_view,
        match heaps {
            Some((a, b)) => format!(
                "{} → {}",
                fmt_bytes(a.0.max(0) as u64),
                fmt_bytes(b.0.max(0) as u64)
            ),
            None => "not exposed by the server".into(),
        },
        match (memory.alloc_bytes_per_view, memory.alloc_blocks_per_view) {
            (Some(bytes), Some(blocks)) =>
                format!("{bytes:.0} bytes and {blocks:.1} blocks per view"),
            _ => "—".into(),
        },
        memory.views_gauge,
        memory.subscribers_gauge
    ));

    let mut rng = Rng(0x5eed_0002 + v as u64);
    let mut next_id = v * r;
    let mut written = BTreeSet::new();
    let samples = sample_sluice(&api, &mut notes, ctx.budget(), |_| {
        let room = rng.below(v);
        next_id += 1;
        if written.len() < ROOMS_CHECKED_MAX {
            written.insert(room);
        }
        (insert_msg(next_id, room, 1), room as u64)
    })
    .await?;
    case.take(samples);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut mats = std::collections::HashMap::new();
    for conn in conns {
        mats.extend(conn.close().await?);
    }
    drop(notes);
    // Compare the written rooms and a few others with one-shot queries.
    for _ in 0..50 {
        written.insert(rng.below(v));
    }
    let mut verify = Verify {
        method: "content",
        content_match: Some(true),
        ..Verify::default()
    };
    let mut details = Vec::new();
    if mats.len() != v {
        details.push(format!("{} of {v} views materialised", mats.len()));
    }
    for m in mats.values() {
        verify.checksums_checked += m.checked;
        verify.checksum_mismatches += m.mismatches;
        case.resets += m.resets as usize;
    }
    for &room in &written {
        let (rows, sum) = result_checksum(&api.query(ROOM_VIEW, &json!([room])).await?)?;
        let (seen, seen_sum) = mats
            .get(&(room as u64))
            .map_or((0, 0), |m| (m.len(), m.sum));
        verify.rows_seen += seen;
        verify.rows_expected += rows;
        if rows != seen || sum != seen_sum {
            verify.content_match = Some(false);
            details.push(format!("room {room}: {seen} rows seen, {rows} by query"));
        }
    }
    verify.ok = mats.len() == v
        && verify.content_match == Some(true)
        && verify.rows_seen == verify.rows_expected
        && verify.checksum_mismatches == 0;
    verify.detail = format!(
        "{} views materialised; {} rooms compared with one-shot queries ({} rows seen, {} by query); {} of {} event checksums disagreed{}",
        mats.len(),
        written.len(),
        verify.rows_seen,
        verify.rows_expected,
        verify.checksum_mismatches,
        verify.checksums_checked,
        if details.is_empty() {
            String::new()
        } else {
            format!("; {}", details.join("; "))
        }
    );
    case.verify = verify;
    case.view_rows = r.min(TOP_K);
    drop(mats);
    // Every subscriber left: the views expire after the TTL.
    wait_no_views(&api).await?;
    memory.rss_after_leave = Some(settled_rss(server.pid()).await?);
    memory.alloc_bytes_after_leave = heap(&api).await?.map(|h| h.0);
    // The same views again: if their memory is reused, RSS barely moves.
    let (conns, notes, _) = subscribe_rooms(ctx, &api, v).await?;
    memory.rss_resubscribed = Some(settled_rss(server.pid()).await?);
    memory.alloc_bytes_resubscribed = heap(&api).await?.map(|h| h.0);
    let heap_fmt = |b: Option<i64>| b.map_or("?".into(), |b| fmt_bytes(b.max(0) as u64));
    ctx.progress.say(format!(
        "  RSS after leaving {} (heap {}), after subscribing the same views again {} (heap {})",
        memory.rss_after_leave.map_or("?".into(), fmt_bytes),
        heap_fmt(memory.alloc_bytes_after_leave),
        memory.rss_resubscribed.map_or("?".into(), fmt_bytes),
        heap_fmt(memory.alloc_bytes_resubscribed)
    ));
    for conn in conns {
        drop(conn.close().await?);
    }
    drop(notes);
    case.memory = Some(memory);
    drop(server);
    Ok(())
}

async fn views_family(ctx: &Ctx<'_>, cases: &mut Vec<Case>) {
    for &v in &ctx.params.views {
        let mut case = Case::new(Family::Views, "sluice", "ws", ROOM_VIEW);
        case.views = Some(v);
        case.durability = "memory".into();
        case.operator = Some("filter, top-k window, routed by room");
        ctx.progress.say(format!(
            "case: {v} scoped views ({} rows each), over WebSocket",
            ctx.params.rows_per_room.min(TOP_K)
        ));
        let outcome = views_case(ctx, v, &mut case).await;
        finish(&ctx.progress, &mut case, outcome);
        cases.push(case);
    }
}

// ---------------------------------------------------------------------------------------
// Family 3: shapes.

/// Waits for `n` snapshots on `notes` (saying how many every 5 s); the time the last came.
/// Fails on a refused subscribe or 60 s without progress.
pub(crate) async fn await_snapshots(
    notes: &mut mpsc::UnboundedReceiver<Note>,
    n: usize,
    what: &str,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Instant> {
    let mut got = 0usize;
    let mut last = Instant::now();
    let mut said = Instant::now();
    while got < n {
        match tokio::time::timeout(Duration::from_secs(60), notes.recv()).await {
            Err(_) => anyhow::bail!("only {got} of {n} snapshots after 60s without progress"),
            Ok(None) => anyhow::bail!("the WebSocket readers ended after {got} snapshots"),
            Ok(Some(Note::Snapshot { at, .. })) => {
                got += 1;
                last = at;
            }
            Ok(Some(Note::Failed { qid, message })) => {
                anyhow::bail!("subscribe {qid:?} failed: {message}")
            }
            Ok(Some(Note::Diff { .. })) => {}
        }
        if said.elapsed() > Duration::from_secs(5) {
            progress.say(format!("  {got} of {n} {what} subscribed"));
            said = Instant::now();
        }
    }
    Ok(last)
}

/// One query shape over `orgs`, `teams`, `users`, `msg`; every bench write (a `msg` row in
/// a room below 50 by an even author, newest `ts`) changes its result.
pub struct Shape {
    pub name: &'static str,
    pub sql: &'static str,
    /// `SELECT COUNT(*) AS n …` of the same rows, for views too big for a one-shot query.
    pub count_sql: Option<&'static str>,
    pub operator: &'static str,
}

pub const SHAPES: [Shape; 6] = [
    Shape {
        name: "filter",
        sql: "SELECT id, room, author, ts FROM msg WHERE room < 50",
        count_sql: Some("SELECT COUNT(*) AS n FROM msg WHERE room < 50"),
        operator: "filter",
    },
    Shape {
        name: "top-k",
        sql: "SELECT * FROM msg ORDER BY ts DESC LIMIT 20",
        count_sql: None,
        operator: "filter, top-k window",
    },
    Shape {
        name: "join",
        sql:
            "SELECT m.id, m.ts, u.name FROM msg m JOIN users u ON m.author = u.id WHERE m.room < 50",
        count_sql: Some(
            "SELECT COUNT(*) AS n FROM msg m JOIN users u ON m.author = u.id WHERE m.room < 50",
        ),
        operator: "join",
    },
    Shape {
        name: "subquery-1",
        sql: "SELECT id, room, ts FROM msg WHERE room < 50 AND author IN \
              (SELECT id FROM users WHERE active = true)",
        count_sql: Some(
            "SELECT COUNT(*) AS n FROM msg WHERE room < 50 AND author IN \
             (SELECT id FROM users WHERE active = true)",
        ),
        operator: "subquery",
    },
    Shape {
        name: "subquery-3",
        sql: "SELECT id, room, ts FROM msg WHERE author IN (SELECT id FROM users WHERE team IN \
              (SELECT id FROM teams WHERE org IN (SELECT id FROM orgs WHERE active = true)))",
        count_sql: Some(
            "SELECT COUNT(*) AS n FROM msg WHERE author IN (SELECT id FROM users WHERE team IN \
             (SELECT id FROM teams WHERE org IN (SELECT id FROM orgs WHERE active = true)))",
        ),
        operator: "subquery",
    },
    Shape {
        name: "aggregate",
        sql: "SELECT room, COUNT(*), MAX(ts) FROM msg GROUP BY room",
        count_sql: None,
        operator: "aggregate",
    },
];

const SHAPE_SCHEMA: &str = "CREATE TABLE orgs (id INTEGER PRIMARY KEY, active BOOLEAN NOT NULL); \
    CREATE TABLE teams (id INTEGER PRIMARY KEY, org INTEGER NOT NULL); \
    CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, team INTEGER NOT NULL, \
    active BOOLEAN NOT NULL)";

/// The same tables and rows in PostgreSQL (generated server-side).
fn shape_schema_postgres(rows: usize) -> String {
    format!(
        "SET client_min_messages = warning;
         DROP TABLE IF EXISTS msg, users, teams, orgs;
         CREATE TABLE orgs (id integer PRIMARY KEY, active boolean NOT NULL);
         CREATE TABLE teams (id integer PRIMARY KEY, org integer NOT NULL);
         CREATE TABLE users (id integer PRIMARY KEY, name text NOT NULL, team integer NOT NULL,
                             active boolean NOT NULL);
         CREATE TABLE msg (id integer PRIMARY KEY, room integer NOT NULL, author integer NOT NULL,
                           ts integer NOT NULL, body text);
         CREATE INDEX msg_room ON msg (room);
         INSERT INTO orgs SELECT g, g % 2 = 0 FROM generate_series(0, 9) g;
         INSERT INTO teams SELECT g, g % 10 FROM generate_series(0, 99) g;
         INSERT INTO users SELECT g, 'user' || g, g % 100, g % 2 = 0 FROM generate_series(0, 999) g;
         INSERT INTO msg SELECT g, g % 100, g % 1000, g, 'm' || g FROM generate_series(0, {}) g;
         ANALYZE;",
        rows as i64 - 1
    )
}

async fn shape_family(
    ctx: &Ctx<'_>,
    pg: Option<&Postgres>,
    cases: &mut Vec<Case>,
) -> anyhow::Result<()> {
    let n = ctx.params.shape_rows;
    let (server, api, _dir) = ctx.start(&[]).await?;
    api.sql(SHAPE_SCHEMA).await?;
    api.sql(MSG_SCHEMA).await?;
    api.preload(
        "orgs",
        (0..10).map(|g| format!("{{\"id\":{g},\"active\":{}}}", g % 2 == 0)),
        PRELOAD_BATCH,
    )
    .await?;
    api.preload(
        "teams",
        (0..100).map(|g| format!("{{\"id\":{g},\"org\":{}}}", g % 10)),
        PRELOAD_BATCH,
    )
    .await?;
    api.preload(
        "users",
        (0..1000).map(|g| {
            format!(
                "{{\"id\":{g},\"name\":\"user{g}\",\"team\":{},\"active\":{}}}",
                g % 100,
                g % 2 == 0
            )
        }),
        PRELOAD_BATCH,
    )
    .await?;
    api.preload(
        "msg",
        (0..n).map(|g| msg_row(g, g % 100, g % 1000, g, &format!("m{g}"))),
        PRELOAD_BATCH,
    )
    .await?;
    ctx.progress
        .say(format!("shape tables loaded: msg {n} rows, users 1000"));
    let mut rng = Rng(0x5eed_0003);
    let mut next_id = n;
    for shape in &SHAPES {
        let classes: &[Option<&'static str>] = if shape.name == "top-k" {
            &[None, Some("fsync")]
        } else {
            &[None]
        };
        for &durability in classes {
            wait_no_views(&api).await?;
            let mut case = Case::new(Family::Shape, "sluice", "sse", shape.sql);
            case.shape = Some(shape.name.to_string());
            ctx.progress.say(format!(
                "case: shape {} ({})",
                shape.name,
                durability.unwrap_or("memory")
            ));
            let view = OneView {
                transport: "sse",
                sql: shape.sql,
                params: json!([]),
                check: shape.count_sql.map_or(Check::Content, Check::Count),
                durability,
                operator: shape.operator,
                probe: false,
                time_query: durability.is_none(),
            };
            let outcome = one_view_case(ctx, &api, view, &mut case, |_| {
                next_id += 1;
                insert_msg(next_id, rng.below(50), 2 * rng.below(500))
            })
            .await;
            finish(&ctx.progress, &mut case, outcome);
            cases.push(case);
        }
    }
    drop(server);

    let Some(pg) = pg else { return Ok(()) };
    let w = pg.connect().await?;
    w.batch_execute(&shape_schema_postgres(n)).await?;
    w.batch_execute(&peer::trigger_sql("msg", "id")).await?;
    let mut next_id = n;
    for shape in &SHAPES {
        let classes: &[bool] = if shape.name == "top-k" {
            &[false, true]
        } else {
            &[false]
        };
        for &synchronous_commit in classes {
            let mut case = Case::new(Family::Shape, "postgres", "listen/notify", shape.sql);
            case.shape = Some(shape.name.to_string());
            ctx.progress.say(format!(
                "case: PostgreSQL, shape {} (synchronous_commit={})",
                shape.name,
                if synchronous_commit { "on" } else { "off" }
            ));
            let view = PgView {
                sql: shape.sql,
                write_sql:
                    "INSERT INTO msg (id, room, author, ts, body) VALUES ($1, $2, $3, $1, 'x')",
                synchronous_commit,
            };
            let outcome = pg_case(ctx, pg, &w, &mut case, view, |_| {
                next_id += 1;
                vec![
                    next_id as i32,
                    rng.below(50) as i32,
                    2 * rng.below(500) as i32,
                ]
            })
            .await;
            finish(&ctx.progress, &mut case, outcome);
            cases.push(case);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The PostgreSQL peer.

struct PgView<'a> {
    sql: &'a str,
    /// The write, with `$1` the token the trigger notifies with.
    write_sql: &'a str,
    synchronous_commit: bool,
}

/// Sequential writes on `writer`; each waits for the listener's re-query after the
/// notification carrying its token (`$1`).
async fn pg_case(
    ctx: &Ctx<'_>,
    pg: &Postgres,
    writer: &tokio_postgres::Client,
    case: &mut Case,
    view: PgView<'_>,
    mut write: impl FnMut(usize) -> Vec<i32>,
) -> anyhow::Result<()> {
    let sc = if view.synchronous_commit { "on" } else { "off" };
    case.durability = format!("synchronous_commit={sc}");
    writer
        .batch_execute(&format!("SET synchronous_commit = {sc}"))
        .await?;
    let statement = writer.prepare(view.write_sql).await?;
    let mut listener = Listener::start(pg, view.sql).await?;
    let mut run = Run::new(ctx.peer_budget());
    let mut last_rows = None;
    while let Some(i) = run.next()? {
        let values = write(i);
        let token = values[0].to_string();
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let t0 = Instant::now();
        writer.execute(&statement, &refs).await?;
        let acked = Instant::now();
        let sample = listener.wait_for(&token, PEER_TIMEOUT).await?.map(|r| {
            last_rows = Some(r.rows);
            (us(r.at - t0), signed_us(acked, r.at), us(acked - t0))
        });
        run.record(sample)?;
    }
    listener.stop().await;
    case.take(run.s);
    let count: i64 = writer
        .query_one(&format!("SELECT COUNT(*) FROM ({}) v", view.sql), &[])
        .await?
        .get(0);
    let seen = last_rows.unwrap_or(0);
    case.view_rows = seen;
    case.verify = Verify {
        rows_seen: seen,
        rows_expected: count as usize,
        method: "count",
        ok: seen == count as usize,
        detail: format!("the last re-query returned {seen} rows, SELECT COUNT(*) {count}"),
        ..Verify::default()
    };
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The suite.

/// `12.3 MiB`.
pub fn fmt_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

pub fn run(args: LiveArgs) -> anyhow::Result<bool> {
    let params = Params::from(&args)?;
    let bin = sluice_bin(args.common.sluice_bin.as_deref())?;
    // The compression family writes its own report (`live-compression/`).
    let mut compression_ok = true;
    if params.runs("compression") {
        compression_ok = compression::run(&params, &bin, &args.common.out)?;
        if params.families.iter().all(|f| f == "compression") {
            return Ok(compression_ok);
        }
    }
    // So do the load families (`live-load/`).
    let mut load_ok = true;
    if LOAD_FAMILIES.iter().any(|f| params.runs(f)) {
        load_ok = load::run(&params, &bin, &args.common.out)?;
    }
    if params
        .families
        .iter()
        .all(|f| f == "compression" || LOAD_FAMILIES.contains(&f.as_str()))
    {
        return Ok(compression_ok && load_ok);
    }
    let mut skipped = Vec::new();
    let pg_bin = if !params.peers {
        skipped.push("PostgreSQL peer skipped (--no-peers).".to_string());
        None
    } else if !params.runs("size") && !params.runs("shape") {
        None
    } else {
        match find_bin_dir(args.pg_bin.as_deref()) {
            Ok(dir) => Some(dir),
            Err(e) => {
                eprintln!("live: PostgreSQL peer skipped: {e:#}");
                skipped.push(format!("PostgreSQL peer skipped: {e:#}"));
                None
            }
        }
    };
    let runtime = crate::harness::runtime()?;
    let mut report = Report::new("live", serde_json::to_value(&params)?);
    let cases = runtime.block_on(run_cases(&params, &bin, pg_bin, &mut report))?;
    report.notes.extend(skipped);
    summary::write_report(&mut report, &params, &cases);
    let dir = report.write(&args.common.out)?;
    report.print();
    eprintln!("results in {}", dir.display());
    let failed = cases
        .iter()
        .filter(|c| c.error.is_some() || !c.verify.ok)
        .count();
    if failed > 0 {
        eprintln!("{failed} case(s) failed or did not verify; see the notes in summary.md");
    }
    drop(runtime);
    Ok(failed == 0 && compression_ok && load_ok)
}

/// The families with their own report (`live-load/`), run only when named.
const LOAD_FAMILIES: &[&str] = &["load", "million", "coalesce"];

/// The server's bound on `coalesce_ms`.
const fn sluice_live_coalesce_ms_max() -> u32 {
    10_000
}

async fn run_cases(
    params: &Params,
    bin: &Path,
    pg_bin: Option<PathBuf>,
    report: &mut Report,
) -> anyhow::Result<Vec<Case>> {
    let ctx = Ctx {
        params,
        bin,
        progress: Progress::new("live"),
    };
    ctx.progress.say(format!(
        "sizes {:?}, views {:?}, shapes over {} rows, users {:?}; {} samples per case (≤ {}s), warm-up {}",
        params.sizes,
        params.views,
        params.shape_rows,
        params.users,
        params.samples,
        params.case_seconds,
        params.warmup
    ));
    let pg = match &pg_bin {
        Some(dir) => {
            ctx.progress
                .say(format!("starting PostgreSQL from {}", dir.display()));
            let pg = Postgres::start(dir).await?;
            ctx.progress.say(format!(
                "PostgreSQL {} ready on 127.0.0.1:{} (pid {})",
                pg.version,
                pg.port,
                pg.pid()
            ));
            report
                .run_extra
                .insert("postgres_version".into(), json!(pg.version));
            Some(pg)
        }
        None => None,
    };
    let mut cases = Vec::new();
    if params.runs("size") {
        if let Err(e) = size_family(&ctx, pg.as_ref(), &mut cases).await {
            let mut c = Case::new(Family::Size, "sluice", "sse", SIZE_VIEW);
            finish(
                &ctx.progress,
                &mut c,
                Err(e.context("the view-size family stopped")),
            );
            cases.push(c);
        }
    }
    if params.runs("views") {
        views_family(&ctx, &mut cases).await;
    }
    if params.runs("shape") {
        if let Err(e) = shape_family(&ctx, pg.as_ref(), &mut cases).await {
            let mut c = Case::new(Family::Shape, "sluice", "sse", "");
            finish(
                &ctx.progress,
                &mut c,
                Err(e.context("the shape family stopped")),
            );
            cases.push(c);
        }
    }
    if params.runs("rules") {
        rules::rules_family(&ctx, &mut cases).await;
    }
    if let Some(pg) = pg {
        ctx.progress
            .say(format!("stopping PostgreSQL (pid {})", pg.pid()));
        tokio::task::spawn_blocking(move || drop(pg)).await?;
    }
    ctx.progress
        .say(format!("done in {:.0}s", ctx.progress.elapsed_s()));
    Ok(cases)
}

/// Checks `samples.json` of a run: every case ran, took samples and verified.
pub fn verify_samples(samples: &Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "samples.json has no cases");
    for c in cases {
        let label = format!(
            "{} {} {} {}",
            c["system"], c["family"], c["transport"], c["durability"]
        );
        anyhow::ensure!(c["error"].is_null(), "case {label} failed: {}", c["error"]);
        anyhow::ensure!(
            c["samples"].as_u64().unwrap_or(0) > 0,
            "case {label} has no samples"
        );
        anyhow::ensure!(
            c["write_to_diff"]["p50_us"].as_f64().unwrap_or(0.0) > 0.0,
            "case {label} has no latency"
        );
        anyhow::ensure!(
            c["verify"]["ok"].as_bool() == Some(true),
            "case {label} did not verify: {}",
            c["verify"]["detail"]
        );
        if c["family"] == "rules" {
            anyhow::ensure!(
                c["rules"]["foreign_diffs"].as_u64() == Some(0),
                "case {label}: users received diffs of writes to other users' rows: {}",
                c["rules"]
            );
        }
    }
    Ok(())
}
