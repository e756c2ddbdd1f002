//! `sluice bench transfer`: the SpacetimeDB keynote-2 workload (SPEC §11).
//!
//! 100 000 accounts with balance 1 000 000 000; every transaction moves 1 from one account
//! to another, picked by Zipf(α) (α = 0: uniform; α = 1.5: ~80% of transactions touch the
//! few hottest accounts). N clients, durable commits, the same pairs for every system.
//! Reported per system and α: TPS (mean and sample standard deviation of the per-second
//! series after a warm-up), p50/p99 latency, refused transfers by kind, and a check of
//! every balance after the run: the bench keeps the expected balance of each account from
//! the transfers it saw acknowledged ([`ledger`]), reads every account back and compares
//! them all (and their sum). For the Sluice targets it then `kill -9`s the server, starts
//! it again on the same data dir, and compares every balance again: acknowledged transfers
//! must survive the crash. A mismatch fails the case, naming the account.
//!
//! Every system sits behind the same shape of network API, as in the keynote:
//! - `sluice-ws`: the real `sluice serve --functions bank.js`; clients call `transfer`
//!   over `/v1/ws` in binary MessagePack frames, `--pipeline` calls in flight each;
//! - `sluice-http`: the same server and function through `POST /v1/call/transfer`;
//! - `postgres`: an HTTP RPC server (in the bench, on its own runtime) over a pool of
//!   `--pg-pool` connections to PostgreSQL with `default_transaction_isolation =
//!   serializable`: `SELECT … FOR UPDATE` + two `UPDATE`s, retried on 40001/40P01/55P03;
//! - `sqlite`: the same RPC server over one SQLite connection (WAL, `synchronous=FULL`).
//!
//! The HTTP targets answer request/response: `--http-inflight N` runs N concurrent
//! requests per client, each on its own keep-alive connection (default 1: "pipelining
//! off", the keynote's headline setting).
//!
//! # Layout
//! - [`workload`]: mulberry32, Zipf(α), precomputed pairs, the bank module and schemas.
//! - [`clients`]: the pipelined WebSocket client and the HTTP request/response client.
//! - [`rpc`]: the RPC server and its PostgreSQL and SQLite backends.
//! - [`targets`]: starting, loading, reading back, restarting and stopping each system.
//! - [`ledger`]: the expected balance of every account, and the per-account check.
//! - [`cpu`]: CPU used by the server (by thread for Sluice) and by the bench, from `/proc`.
//! - [`summary`]: tables, targets, charts and `samples.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use sluice_log::Durability;

use crate::hist::{fmt_si, fmt_us};
use crate::load::{measure, Measured, Meter, Worker};
use crate::peers::postgres::find_bin_dir;
use crate::progress::Progress;
use crate::report::Report;
use crate::server::sluice_bin;
use crate::CommonArgs;

pub mod clients;
pub mod cpu;
pub mod http1;
pub mod ledger;
pub mod profile;
pub mod rpc;
pub mod summary;
pub mod targets;
pub mod workload;

use clients::{connect_ws, http_connect, http_worker, ws_worker, Failures, Shared};
use cpu::CpuSample;
use ledger::{AccountCheck, Ledger};
use targets::{Balances, Running};
use workload::{Pairs, INITIAL_BALANCE, PAIRS_FULL};

/// Accounts, seconds and clients of a `--quick` run: a smoke test, not a measurement.
const QUICK_ACCOUNTS_MAX: u32 = 1_000;
const QUICK_SECONDS: f64 = 1.5;
const QUICK_WARMUP_SECONDS: f64 = 0.3;
const QUICK_CONCURRENCY_MAX: usize = 4;
const QUICK_PIPELINE_MAX: usize = 8;
const QUICK_PAIRS: usize = 100_000;
const QUICK_PG_POOL_MAX: usize = 8;
/// Calls in flight per WebSocket connection the server accepts (`docs/protocol.md`).
const WS_INFLIGHT_MAX: usize = 1024;

/// A system under test.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// `sluice serve`, calls over the binary WebSocket protocol, pipelined.
    SluiceWs,
    /// `sluice serve`, `POST /v1/call/transfer`.
    SluiceHttp,
    /// HTTP RPC server + PostgreSQL (serializable).
    Postgres,
    /// HTTP RPC server + SQLite (WAL, synchronous=FULL).
    Sqlite,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::SluiceWs,
        Target::SluiceHttp,
        Target::Postgres,
        Target::Sqlite,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::SluiceWs => "sluice-ws",
            Target::SluiceHttp => "sluice-http",
            Target::Postgres => "postgres",
            Target::Sqlite => "sqlite",
        }
    }

    /// The row label in the keynote-shaped table.
    pub fn system(self) -> &'static str {
        match self {
            Target::SluiceWs => "Sluice (WebSocket, MessagePack)",
            Target::SluiceHttp => "Sluice (HTTP/JSON)",
            Target::Postgres => "HTTP RPC server + PostgreSQL",
            Target::Sqlite => "HTTP RPC server + SQLite",
        }
    }

    fn pipelined(self) -> bool {
        self == Target::SluiceWs
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct TransferArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Zipf exponents, one case per target each (≤ 0: uniform).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 1.5])]
    pub alpha: Vec<f64>,
    /// Seconds measured per case, after the warm-up.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Seconds of load before the measured window (not counted).
    #[arg(long, default_value_t = 10.0)]
    pub warmup_sec: f64,
    /// Concurrent clients (WebSocket connections, or HTTP clients).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Calls in flight per WebSocket client (sluice-ws).
    #[arg(long, default_value_t = 40)]
    pub pipeline: usize,
    /// Concurrent requests per HTTP client (sluice-http, postgres, sqlite), each on its own
    /// keep-alive connection; 1 = pipelining off, the keynote's headline setting.
    #[arg(long, default_value_t = 1)]
    pub http_inflight: usize,
    /// Systems to run, in this order.
    #[arg(long, value_delimiter = ',', default_values_t = Target::ALL.to_vec())]
    pub targets: Vec<Target>,
    /// Durability class of Sluice's commits (the peers always commit with fsync).
    #[arg(long, default_value_t = Durability::Fsync)]
    pub durability: Durability,
    /// Accounts (ids 0 … N−1).
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u32,
    /// (from, to) pairs precomputed per α (default 10 000 000; --quick: 100 000).
    #[arg(long)]
    pub pairs: Option<usize>,
    /// Connections in the PostgreSQL RPC server's pool.
    #[arg(long, default_value_t = 64)]
    pub pg_pool: usize,
    /// Directory holding PostgreSQL's `initdb` and `postgres` (default: `$PG_BIN`, else
    /// the newest /usr/lib/postgresql/*/bin).
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
    /// Tests the check itself: before each Sluice target's kill -9, add 1 to account 0's
    /// balance behind the bench's back, so the check after the restart must fail naming it.
    #[arg(long, hide = true)]
    pub tamper_before_restart: bool,
    /// Tests the check itself: `kill -9` each Sluice target's server halfway through its
    /// first measured window, so transfers in flight end unknown and the check after the
    /// restart must account for them (the case itself fails: its clients lost the server).
    #[arg(long, hide = true)]
    pub kill_mid_window: bool,
    /// Profile the server's writer thread (`perf record -e cpu-clock -t <tid>`) over the
    /// warm-up of the `sluice-ws` case at the first α ≤ 0 (else the first α; from 2 s in to
    /// 1 s before the measured window, which never runs under perf; the warm-up must be at
    /// least 5 s), and put its top symbols in the summary (the flat report in writer-profile.txt). On by
    /// default in full-length runs (not --quick, --seconds ≥ 60) when `perf` is installed.
    #[arg(long, conflicts_with = "no_profile")]
    pub profile: bool,
    /// Never profile the writer thread.
    #[arg(long)]
    pub no_profile: bool,
    /// A saved flat profile of an earlier build (`perf report --no-children --stdio -g none
    /// --sort sym`, e.g. an earlier run's writer-profile.txt), shown beside this one as
    /// "before"; the label is the file name.
    #[arg(long)]
    pub profile_before: Option<PathBuf>,
}

/// Parameters after `--quick` is applied.
#[derive(Clone, Debug, Serialize)]
pub struct Params {
    pub alphas: Vec<f64>,
    pub seconds: f64,
    pub warmup_seconds: f64,
    pub concurrency: usize,
    pub pipeline: usize,
    pub http_inflight: usize,
    pub targets: Vec<Target>,
    pub durability: &'static str,
    pub accounts: u32,
    pub initial_balance: i64,
    pub pairs: usize,
    pub pg_pool: usize,
    pub quick: bool,
    /// `--tamper-before-restart`: a run that must fail its restart check.
    pub tamper_before_restart: bool,
    /// `--kill-mid-window`: a run whose Sluice cases fail, with unknown transfers.
    pub kill_mid_window: bool,
    /// The α of the `sluice-ws` case whose writer thread is profiled, if one is; else why
    /// not (`--no-profile`, a short run or warm-up, no `perf`).
    #[serde(skip)]
    pub profile: Result<f64, String>,
}

impl Params {
    fn from(args: &TransferArgs) -> anyhow::Result<Params> {
        let quick = args.common.quick;
        anyhow::ensure!(!args.alpha.is_empty(), "--alpha needs at least one value");
        anyhow::ensure!(
            args.alpha.iter().all(|a| a.is_finite()),
            "--alpha values must be finite numbers"
        );
        anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
        anyhow::ensure!(args.warmup_sec >= 0.0, "--warmup-sec must not be negative");
        anyhow::ensure!(
            (1..=4096).contains(&args.concurrency),
            "--concurrency must be between 1 and 4096"
        );
        anyhow::ensure!(
            (1..=WS_INFLIGHT_MAX).contains(&args.pipeline),
            "--pipeline must be between 1 and {WS_INFLIGHT_MAX} (the server's in-flight bound per connection)"
        );
        anyhow::ensure!(
            (1..=256).contains(&args.http_inflight),
            "--http-inflight must be between 1 and 256"
        );
        anyhow::ensure!(args.accounts >= 2, "--accounts must be at least 2");
        anyhow::ensure!(
            (1..=1024).contains(&args.pg_pool),
            "--pg-pool must be between 1 and 1024"
        );
        anyhow::ensure!(
            !args.targets.is_empty(),
            "--targets needs at least one target"
        );
        let mut targets = args.targets.clone();
        let mut seen = std::collections::HashSet::new();
        targets.retain(|t| seen.insert(*t));
        let mut alphas = args.alpha.clone();
        alphas.dedup();
        let pairs = args
            .pairs
            .unwrap_or(if quick { QUICK_PAIRS } else { PAIRS_FULL });
        anyhow::ensure!(pairs >= 1, "--pairs must be at least 1");
        let full_length = !quick && args.seconds >= 60.0;
        let warmup_seconds = if quick {
            args.warmup_sec.min(QUICK_WARMUP_SECONDS)
        } else {
            args.warmup_sec
        };
        let profile = if !targets.contains(&Target::SluiceWs) {
            Err("no sluice-ws case".to_string())
        } else if args.no_profile {
            Err("--no-profile".to_string())
        } else if !args.profile && !full_length {
            Err("not a full-length run and no --profile".to_string())
        } else if warmup_seconds < PROFILE_WARMUP_MIN.as_secs_f64() {
            Err(format!(
                "the warm-up is under {} s (the profile is taken in it)",
                PROFILE_WARMUP_MIN.as_secs()
            ))
        } else if !profile::perf_available() {
            Err("perf is not installed (Debian: linux-perf)".to_string())
        } else {
            Ok(alphas
                .iter()
                .copied()
                .find(|&a| a <= 0.0)
                .unwrap_or(alphas[0]))
        };
        Ok(Params {
            profile,
            alphas,
            seconds: if quick {
                args.seconds.min(QUICK_SECONDS)
            } else {
                args.seconds
            },
            warmup_seconds,
            concurrency: if quick {
                args.concurrency.min(QUICK_CONCURRENCY_MAX)
            } else {
                args.concurrency
            },
            pipeline: if quick {
                args.pipeline.min(QUICK_PIPELINE_MAX)
            } else {
                args.pipeline
            },
            http_inflight: args.http_inflight,
            targets,
            durability: args.durability.as_str(),
            accounts: if quick {
                args.accounts.min(QUICK_ACCOUNTS_MAX)
            } else {
                args.accounts
            },
            initial_balance: INITIAL_BALANCE,
            pairs,
            pg_pool: if quick {
                args.pg_pool.min(QUICK_PG_POOL_MAX)
            } else {
                args.pg_pool
            },
            quick,
            tamper_before_restart: args.tamper_before_restart,
            kill_mid_window: args.kill_mid_window,
        })
    }

    fn durability(&self) -> Durability {
        self.durability.parse().expect("parsed by clap")
    }

    /// Requests each client keeps in flight for `target`.
    pub fn in_flight(&self, target: Target) -> usize {
        if target.pipelined() {
            self.pipeline
        } else {
            self.http_inflight
        }
    }
}

/// The balance check after a case: the sum, and every account against the ledger.
#[derive(Clone, Debug, Serialize)]
pub struct BalanceCheck {
    pub accounts_expected: u64,
    /// Rows read back.
    pub accounts: u64,
    pub sum_expected: i64,
    pub sum: i64,
    /// Every account's balance against the one expected from the acknowledged transfers
    /// (all cases of the target so far: they share the server).
    pub every_account: AccountCheck,
    pub verified: bool,
}

/// The check after `kill -9` and a restart on the same data dir (Sluice targets, once per
/// target after its last case).
#[derive(Clone, Debug, Serialize)]
pub struct RestartCheck {
    /// `false`: not done (the reason is in `detail`), e.g. `--durability memory`, which
    /// does not survive a crash.
    pub done: bool,
    /// Spawn of the restarted server → its first good `/health`, recovery included.
    pub ready_s: Option<f64>,
    pub balance: Option<BalanceCheck>,
    pub ok: bool,
    pub detail: String,
}

/// One (target, α) case, as stored in `samples.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Case {
    pub target: Target,
    pub alpha: f64,
    pub clients: usize,
    /// Requests each client keeps in flight (WebSocket pipelining, or concurrent HTTP
    /// requests on separate connections).
    pub in_flight_per_client: usize,
    /// Mean and sample standard deviation of the per-second TPS series.
    pub tps_mean: f64,
    pub tps_stddev: f64,
    /// Refused transfers in the measured window, by kind.
    pub failures: BTreeMap<String, u64>,
    /// Transactions the PostgreSQL RPC server retried during the case.
    pub retries: Option<u64>,
    pub balance: Option<BalanceCheck>,
    /// Sluice targets, on the target's last case: every balance again after `kill -9` and
    /// a restart.
    pub restart: Option<RestartCheck>,
    /// CPU used over the case (warm-up + window), in cores: the database server process
    /// (Sluice, or PostgreSQL's postmaster and backends), and this bench process (the
    /// clients; for the peers also the RPC server, and SQLite itself).
    pub server_cpu_cores: Option<f64>,
    pub bench_cpu_cores: Option<f64>,
    /// Sluice's CPU by thread name (`sluice-writer`, `tokio-rt-worker`, `sluice-log`, …),
    /// in cores over the case.
    pub server_threads_cores: BTreeMap<String, f64>,
    /// The writer thread's profile over the measured window (see [`profile`]).
    pub writer_profile: Option<profile::Profile>,
    #[serde(flatten)]
    pub result: Option<Measured>,
    pub error: Option<String>,
}

impl Case {
    /// A case not run yet.
    fn new(params: &Params, target: Target, alpha: f64) -> Case {
        Case {
            target,
            alpha,
            clients: params.concurrency,
            in_flight_per_client: params.in_flight(target),
            tps_mean: 0.0,
            tps_stddev: 0.0,
            failures: BTreeMap::new(),
            retries: None,
            balance: None,
            restart: None,
            server_cpu_cores: None,
            bench_cpu_cores: None,
            server_threads_cores: BTreeMap::new(),
            writer_profile: None,
            result: None,
            error: None,
        }
    }

    pub fn ok(&self) -> Option<&Measured> {
        self.result.as_ref().filter(|_| self.error.is_none())
    }

    /// Marks the case failed with `e`, keeping an earlier error.
    fn fail(&mut self, e: String) {
        self.error = Some(match self.error.take() {
            Some(earlier) => format!("{earlier}; {e}"),
            None => e,
        });
    }
}

pub fn run(args: TransferArgs) -> anyhow::Result<bool> {
    let params = Params::from(&args)?;
    // Read up front: a bad file fails the run before its cases, not after.
    let before = match &args.profile_before {
        Some(path) => {
            let label = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            );
            Some((label, profile::read_before(path)?))
        }
        None => None,
    };
    let bin = sluice_bin(args.common.sluice_bin.as_deref())?;
    let pg_bin = if params.targets.contains(&Target::Postgres) {
        Some(find_bin_dir(args.pg_bin.as_deref())?)
    } else {
        None
    };
    let runtime = crate::harness::runtime()?;
    let mut report = Report::new("transfer", serde_json::to_value(&params)?);
    let cases = runtime.block_on(run_cases(&params, &bin, pg_bin.as_deref(), &mut report))?;
    let failed = cases.iter().filter(|c| c.error.is_some()).count();
    summary::write(&mut report, &params, &cases, before.as_ref());
    let ok = crate::harness::finish_report(&report, &args.common.out, failed)?;
    if let Some(p) = cases.iter().find_map(|c| c.writer_profile.as_ref()) {
        if !p.text.is_empty() {
            let path = args.common.out.join("transfer").join("writer-profile.txt");
            std::fs::write(&path, &p.text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(ok)
}

async fn run_cases(
    params: &Params,
    bin: &Path,
    pg_bin: Option<&Path>,
    report: &mut Report,
) -> anyhow::Result<Vec<Case>> {
    let progress = Progress::new("transfer");
    let per_case = params.warmup_seconds + params.seconds;
    let n_cases = params.targets.len() * params.alphas.len();
    progress.say(format!(
        "{n_cases} cases ({} targets × {} alphas) of {:.0}s warm-up + {:.0}s measured, about {:.0} min in all",
        params.targets.len(),
        params.alphas.len(),
        params.warmup_seconds,
        params.seconds,
        (n_cases as f64 * (per_case + 3.0) + params.targets.len() as f64 * 5.0) / 60.0
    ));
    let mut pairs = Vec::with_capacity(params.alphas.len());
    for &alpha in &params.alphas {
        let t = Instant::now();
        let accounts = params.accounts;
        let count = params.pairs;
        let p =
            tokio::task::spawn_blocking(move || Pairs::generate(accounts, alpha, count)).await?;
        progress.say(format!(
            "α = {alpha}: {} pairs over {accounts} accounts in {:.1}s; {:.1}% send from account 0",
            p.len(),
            t.elapsed().as_secs_f64(),
            100.0 * p.share_from_zero()
        ));
        pairs.push(Arc::new(p));
    }
    let durability = params.durability();
    let mut cases = Vec::with_capacity(n_cases);
    for &target in &params.targets {
        progress.say(format!(
            "{target}: starting and loading {} accounts",
            params.accounts
        ));
        let t = Instant::now();
        let mut running = match Running::start(
            target,
            params.accounts,
            durability,
            bin,
            pg_bin,
            params.pg_pool,
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                progress.say(format!("  FAILED to start: {e:#}"));
                for &alpha in &params.alphas {
                    cases.push(failed_case(params, target, alpha, &e));
                }
                continue;
            }
        };
        progress.say(format!(
            "  ready in {:.1}s: {}",
            t.elapsed().as_secs_f64(),
            running.describe()
        ));
        // Kept across the target's cases: they share its accounts.
        let ledger = Ledger::new(params.accounts, params.initial_balance);
        if let Running::Postgres { .. } = &running {
            if let Some(v) = postgres_version(&running) {
                report.run_extra.insert("postgres_version".into(), json!(v));
            }
        }
        if target == Target::Sqlite {
            report
                .run_extra
                .insert("sqlite_version".into(), json!(rusqlite::version()));
        }
        for (i, &alpha) in params.alphas.iter().enumerate() {
            progress.say(format!(
                "{target}, α = {alpha}: {} clients × {} in flight",
                params.concurrency,
                params.in_flight(target)
            ));
            let case = run_case(params, target, alpha, &running, pairs[i].clone(), &ledger).await;
            match (&case.error, &case.result) {
                (None, Some(m)) => progress.say(format!(
                    "  {} TPS (± {}), p50 {}, p99 {}{}{}",
                    fmt_si(case.tps_mean),
                    fmt_si(case.tps_stddev),
                    fmt_us(m.latency.p50_us),
                    fmt_us(m.latency.p99_us),
                    if case.failures.is_empty() {
                        String::new()
                    } else {
                        format!(", refused {:?}", case.failures)
                    },
                    m.commits_per_sync
                        .map(|c| format!(", {c:.0} commits/sync"))
                        .unwrap_or_default()
                )),
                (Some(e), _) => progress.say(format!("  FAILED: {e}")),
                (None, None) => {}
            }
            if let Some(b) = &case.balance {
                progress.say(format!("  verified: {}", b.every_account.detail));
            }
            cases.push(case);
        }
        if matches!(running, Running::Sluice { .. }) {
            let check = restart_check(params, &mut running, &ledger).await;
            progress.say(format!(
                "{target}: after kill -9 and restart: {}",
                check.detail
            ));
            if let Some(last) = cases.iter_mut().rev().find(|c| c.target == target) {
                if check.done && !check.ok {
                    last.fail(format!("after kill -9 and restart: {}", check.detail));
                }
                last.restart = Some(check);
            }
        }
        progress.say(format!("{target}: stopping"));
        running.stop().await;
    }
    progress.say(format!("done in {:.0}s", progress.elapsed_s()));
    Ok(cases)
}

fn postgres_version(running: &Running) -> Option<String> {
    match running {
        Running::Postgres { pg, .. } => Some(pg.version.clone()),
        _ => None,
    }
}

fn failed_case(params: &Params, target: Target, alpha: f64, e: &anyhow::Error) -> Case {
    let mut case = Case::new(params, target, alpha);
    case.error = Some(format!("{e:#}"));
    case
}

/// The writer's profile starts this far into a case's warm-up (the load has settled)...
const PROFILE_SETTLE: Duration = Duration::from_secs(2);
/// ...and stops this long before its measured window (perf writes out its data).
const PROFILE_MARGIN: Duration = Duration::from_secs(1);
/// The shortest warm-up a profile is taken in.
const PROFILE_WARMUP_MIN: Duration = Duration::from_secs(5);

async fn run_case(
    params: &Params,
    target: Target,
    alpha: f64,
    running: &Running,
    pairs: Arc<Pairs>,
    ledger: &Arc<Ledger>,
) -> Case {
    let mut case = Case::new(params, target, alpha);
    let failures = Arc::new(Failures::default());
    let retries0 = running.retries();
    let by_thread = matches!(running, Running::Sluice { .. });
    let cpu0 = CpuSample::take(running.server_pid(), by_thread);
    // `--kill-mid-window`: the server (our child, by its pid) dies under load.
    let killer = running
        .server_pid()
        .filter(|_| params.kill_mid_window && by_thread)
        .map(|pid| {
            let after = Duration::from_secs_f64(params.warmup_seconds + params.seconds / 2.0);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = tokio::task::spawn_blocking(move || crate::sys::signal(pid, "KILL")).await;
            })
        });
    // The writer's profile, from the end of the warm-up's first PROFILE_SETTLE to
    // PROFILE_MARGIN before the measured window: `perf record` stops by itself, and is
    // read back once the case is over.
    let profiler = running
        .server_pid()
        .filter(|_| target == Target::SluiceWs && params.profile == Ok(alpha))
        .map(|pid| {
            let window = Duration::from_secs_f64(params.warmup_seconds)
                .saturating_sub(PROFILE_SETTLE + PROFILE_MARGIN);
            let label = format!("{target}, α = {alpha}");
            tokio::spawn(async move {
                tokio::time::sleep(PROFILE_SETTLE).await;
                tokio::task::spawn_blocking(move || profile::record_writer(pid, window, label))
                    .await
            })
        });
    let measured = drive(params, target, running, pairs, failures.clone(), ledger).await;
    if let Some(killer) = killer {
        killer.abort();
    }
    if let Some(profiler) = profiler {
        let recorded = match profiler.await {
            Ok(Ok(recording)) => tokio::task::spawn_blocking(move || recording.report()).await,
            Ok(Err(e)) | Err(e) => Err(e),
        };
        case.writer_profile = match recorded {
            Ok(p) => Some(p),
            Err(e) => Some(profile::Profile {
                missing: Some(format!("the profiler task failed: {e}")),
                ..profile::Profile::default()
            }),
        };
    }
    let usage = CpuSample::take(running.server_pid(), by_thread).since(&cpu0);
    case.server_cpu_cores = usage.server_cores;
    case.bench_cpu_cores = usage.bench_cores;
    case.server_threads_cores = usage.server_threads_cores;
    case.retries = running.retries().zip(retries0).map(|(b, a)| b - a);
    case.failures = failures.snapshot();
    match measured {
        Ok(measured) => {
            (case.tps_mean, case.tps_stddev) = tps_stats(&measured);
            case.result = Some(measured);
        }
        // The balances are still checked: the ledger knows which transfers were in flight.
        Err(e) => case.fail(format!("{e:#}")),
    }
    match running.balances(params.accounts).await {
        Ok(b) => {
            let check = balance_check(params, &b, ledger);
            if let Some(e) = balance_error(&check) {
                case.fail(e);
            }
            case.balance = Some(check);
        }
        Err(e) => case.fail(format!("cannot read the balances back: {e:#}")),
    }
    if case.error.is_none() && case.tps_mean <= 0.0 {
        case.error = Some(format!(
            "no transfer succeeded (refused: {:?})",
            case.failures
        ));
    }
    case
}

/// `kill -9` the Sluice server, start it on the same data dir, and compare every balance
/// with the ledger again.
async fn restart_check(params: &Params, running: &mut Running, ledger: &Ledger) -> RestartCheck {
    let mut check = RestartCheck {
        done: false,
        ready_s: None,
        balance: None,
        ok: false,
        detail: String::new(),
    };
    if params.durability() == Durability::Memory {
        check.detail = "not checked: --durability memory does not survive kill -9".into();
        return check;
    }
    check.done = true;
    if params.tamper_before_restart {
        let balance = ledger.expected()[0] + 1;
        if let Err(e) = running.set_balance(0, balance).await {
            check.detail = format!("--tamper-before-restart: {e:#}");
            return check;
        }
    }
    let ready = match running.kill9_and_restart().await {
        Ok(ready) => ready,
        Err(e) => {
            check.detail = format!("{e:#}");
            return check;
        }
    };
    check.ready_s = Some(ready.as_secs_f64());
    match running.balances(params.accounts).await {
        Ok(b) => {
            let balance = balance_check(params, &b, ledger);
            check.ok = balance.verified;
            check.detail = format!(
                "ready in {:.2}s; {}",
                ready.as_secs_f64(),
                balance_error(&balance).unwrap_or_else(|| balance.every_account.detail.clone())
            );
            check.balance = Some(balance);
        }
        Err(e) => check.detail = format!("cannot read the balances back: {e:#}"),
    }
    check
}

/// Starts the clients for `target` and measures one window.
async fn drive(
    params: &Params,
    target: Target,
    running: &Running,
    pairs: Arc<Pairs>,
    failures: Arc<Failures>,
    ledger: &Arc<Ledger>,
) -> anyhow::Result<Measured> {
    let meter = Meter::new(0);
    let shared = Shared {
        meter: meter.clone(),
        failures,
        pairs: pairs.clone(),
        durability: params.durability(),
        ledger: ledger.clone(),
    };
    let clients = params.concurrency;
    let in_flight = params.in_flight(target);
    let mut workers: Vec<Worker> = Vec::with_capacity(clients * in_flight);
    if target.pipelined() {
        let url = running
            .ws_url()
            .context("this target has no WebSocket endpoint")?;
        // Connect every client before any sends, so a refused connection fails the case
        // up front rather than in the middle of the window.
        let mut sockets = Vec::with_capacity(clients);
        for _ in 0..clients {
            sockets.push(connect_ws(&url, clients::MSGPACK_PROTOCOL).await?);
        }
        for (c, ws) in sockets.into_iter().enumerate() {
            workers.push(ws_worker(
                ws,
                shared.clone(),
                pairs.start_of(c, clients),
                in_flight,
            ));
        }
    } else {
        let url: Arc<str> = running.call_url().into();
        for c in 0..clients {
            let cursor = Arc::new(AtomicUsize::new(pairs.start_of(c, clients)));
            for _ in 0..in_flight {
                workers.push(http_worker(
                    http_connect(&url).await?,
                    url.clone(),
                    shared.clone(),
                    cursor.clone(),
                ));
            }
        }
    }
    let probe = running.probe();
    measure(
        &meter,
        workers,
        Duration::from_secs_f64(params.warmup_seconds),
        Duration::from_secs_f64(params.seconds),
        &probe,
    )
    .await
}

/// Mean and sample standard deviation of the per-second TPS. Samples shorter than half a
/// second (the window's ragged end) are left out; with fewer than two samples the
/// deviation is 0.
pub fn tps_stats(m: &Measured) -> (f64, f64) {
    let mut last_t = 0.0;
    let mut series = Vec::with_capacity(m.per_second.len());
    for s in &m.per_second {
        if s.t - last_t >= 0.5 {
            series.push(s.requests_per_sec);
        }
        last_t = s.t;
    }
    if series.is_empty() {
        return (m.requests_per_sec, 0.0);
    }
    let n = series.len() as f64;
    let mean = series.iter().sum::<f64>() / n;
    if series.len() < 2 {
        return (mean, 0.0);
    }
    let var = series.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

fn balance_check(params: &Params, b: &Balances, ledger: &Ledger) -> BalanceCheck {
    let accounts_expected = u64::from(params.accounts);
    let sum_expected = i128::from(params.accounts) * i128::from(params.initial_balance);
    let every_account = ledger.check(&b.by_id, &b.extra);
    BalanceCheck {
        accounts_expected,
        accounts: b.accounts,
        sum_expected: sum_expected as i64,
        sum: i64::try_from(b.sum).unwrap_or(i64::MAX),
        verified: b.accounts == accounts_expected && b.sum == sum_expected && every_account.ok,
        every_account,
    }
}

/// Why a balance check failed, naming the accounts; `None` if it passed.
fn balance_error(check: &BalanceCheck) -> Option<String> {
    if check.verified {
        return None;
    }
    let mut parts = Vec::new();
    if check.accounts != check.accounts_expected || check.sum != check.sum_expected {
        parts.push(format!(
            "balances changed: {} accounts summing to {}, expected {} summing to {}",
            check.accounts, check.sum, check.accounts_expected, check.sum_expected
        ));
    }
    if !check.every_account.ok {
        parts.push(format!(
            "per-account check failed: {}",
            check.every_account.detail
        ));
    }
    Some(parts.join("; "))
}

/// Every case of a transfer `samples.json` ran, committed transfers, and kept the sum of
/// balances; every (target, α) of the parameters is there.
pub fn verify_samples(samples: &serde_json::Value) -> anyhow::Result<()> {
    let cases = samples["cases"]
        .as_array()
        .context("samples.json has no cases")?;
    anyhow::ensure!(!cases.is_empty(), "samples.json has no cases");
    for c in cases {
        let label = format!("{} at alpha {}", c["target"], c["alpha"]);
        anyhow::ensure!(c["error"].is_null(), "{label} failed: {}", c["error"]);
        anyhow::ensure!(
            c["tps_mean"].as_f64().unwrap_or(0.0) > 0.0,
            "{label} committed nothing"
        );
        anyhow::ensure!(
            c["latency"]["p99_us"].as_u64().unwrap_or(0) > 0,
            "{label} has no latencies"
        );
        anyhow::ensure!(
            c["balance"]["verified"] == json!(true),
            "{label}: balances not verified: {}",
            c["balance"]
        );
        let every = &c["balance"]["every_account"];
        anyhow::ensure!(
            every["ok"] == json!(true)
                && every["mismatches"] == json!(0)
                && every["accounts_checked"] == c["balance"]["accounts_expected"],
            "{label}: not every account was checked and found as expected: {every}"
        );
        if !c["restart"].is_null() {
            anyhow::ensure!(
                c["restart"]["ok"] == json!(true) || c["restart"]["done"] == json!(false),
                "{label}: the check after kill -9 and restart failed: {}",
                c["restart"]
            );
        }
    }
    let params = &samples["params"];
    // Every Sluice target was checked after kill -9 and a restart (unless its commits do
    // not survive one).
    if params["durability"] != json!("memory") {
        for t in params["targets"]
            .as_array()
            .context("no targets in params")?
        {
            if t.as_str().is_some_and(|t| t.starts_with("sluice")) {
                anyhow::ensure!(
                    cases
                        .iter()
                        .any(|c| &c["target"] == t && c["restart"]["ok"] == json!(true)),
                    "{t}: no check after kill -9 and restart"
                );
            }
        }
    }
    for t in params["targets"]
        .as_array()
        .context("no targets in params")?
    {
        for a in params["alphas"].as_array().context("no alphas in params")? {
            anyhow::ensure!(
                cases
                    .iter()
                    .any(|c| &c["target"] == t && c["alpha"].as_f64() == a.as_f64()),
                "no case for {t} at alpha {a}"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Second;

    fn measured(series: &[(f64, f64)]) -> Measured {
        Measured {
            seconds: series.last().map_or(0.0, |s| s.0),
            rows: 0,
            requests: 0,
            rows_per_sec: 0.0,
            requests_per_sec: 42.0,
            commits_per_sec: None,
            syncs_per_sec: None,
            commits_per_sync: None,
            snapshots: None,
            writer_rounds: None,
            latency: Default::default(),
            per_second: series
                .iter()
                .map(|&(t, r)| Second {
                    t,
                    rows_per_sec: r,
                    requests_per_sec: r,
                    commits_per_sec: None,
                    syncs_per_sec: None,
                })
                .collect(),
        }
    }

    #[test]
    fn tps_is_the_mean_and_sample_stddev_of_whole_seconds() {
        // The 0.1 s sliver at the end is left out.
        let m = measured(&[(1.0, 10.0), (2.0, 20.0), (3.0, 30.0), (3.1, 1000.0)]);
        let (mean, sd) = tps_stats(&m);
        assert!((mean - 20.0).abs() < 1e-9, "{mean}");
        assert!((sd - 10.0).abs() < 1e-9, "{sd}");
        assert_eq!(tps_stats(&measured(&[])), (42.0, 0.0));
        assert_eq!(tps_stats(&measured(&[(1.0, 7.0)])), (7.0, 0.0));
    }

    #[test]
    fn quick_params_are_small_and_targets_deduplicated() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: TransferArgs,
        }
        let cli = Cli::parse_from([
            "x",
            "--quick",
            "--targets",
            "sqlite,sluice-ws,sqlite",
            "--alpha",
            "0,1.5",
        ]);
        let p = Params::from(&cli.args).unwrap();
        assert_eq!(p.targets, vec![Target::Sqlite, Target::SluiceWs]);
        assert_eq!(p.alphas, vec![0.0, 1.5]);
        assert!(p.accounts <= QUICK_ACCOUNTS_MAX && p.seconds <= QUICK_SECONDS);
        assert_eq!(
            (p.in_flight(Target::SluiceWs), p.in_flight(Target::Sqlite)),
            (8, 1)
        );
        let cli = Cli::parse_from(["x"]);
        let p = Params::from(&cli.args).unwrap();
        assert_eq!(p.targets, Target::ALL.to_vec());
        assert_eq!(
            (p.accounts, p.concurrency, p.pipeline, p.pairs, p.durability),
            (100_000, 64, 40, PAIRS_FULL, "fsync")
        );
    }

    #[test]
    fn verify_samples_wants_every_case_verified() {
        let good = json!({
            "params": {"targets": ["sqlite", "sluice-ws"], "alphas": [0.0], "durability": "fsync"},
            "cases": [
                {"target": "sqlite", "alpha": 0.0, "error": null, "tps_mean": 5.0,
                 "latency": {"p99_us": 100},
                 "balance": {"verified": true, "accounts_expected": 10,
                             "every_account": {"ok": true, "mismatches": 0, "accounts_checked": 10}}},
                {"target": "sluice-ws", "alpha": 0.0, "error": null, "tps_mean": 5.0,
                 "latency": {"p99_us": 100},
                 "balance": {"verified": true, "accounts_expected": 10,
                             "every_account": {"ok": true, "mismatches": 0, "accounts_checked": 10}},
                 "restart": {"done": true, "ok": true}}
            ]
        });
        verify_samples(&good).unwrap();
        let mut bad = good.clone();
        bad["cases"][0]["balance"]["verified"] = json!(false);
        assert!(verify_samples(&bad).is_err());
        let mut one_account = good.clone();
        one_account["cases"][0]["balance"]["every_account"]["mismatches"] = json!(1);
        assert!(verify_samples(&one_account).is_err());
        let mut few_checked = good.clone();
        few_checked["cases"][1]["balance"]["every_account"]["accounts_checked"] = json!(9);
        assert!(verify_samples(&few_checked).is_err());
        let mut no_restart = good.clone();
        no_restart["cases"][1]["restart"] = json!(null);
        assert!(verify_samples(&no_restart).is_err());
        let mut restart_failed = good.clone();
        restart_failed["cases"][1]["restart"]["ok"] = json!(false);
        assert!(verify_samples(&restart_failed).is_err());
        let mut missing = good.clone();
        missing["params"]["alphas"] = json!([0.0, 1.5]);
        assert!(verify_samples(&missing).is_err());
    }
}
