//! Black-box conformance checks of a running Sluice server: every message type and error
//! code of `docs/protocol.md` and `docs/api.md`, over HTTP, Server-Sent Events and the
//! WebSocket (JSON and MessagePack).
//!
//! The check list is meant to be read as the protocol's executable spec by an SDK author
//! in another language: each check is small and named by the behaviour it expects
//! (`area/what_happens`). [`run`] runs them in order and reports each one as passed, failed
//! (with why) or skipped (with the reason: something the server was not started with, such
//! as client tokens).
//!
//! The suite touches only objects named with a unique prefix (`conf_<random>_…`: tables and
//! topics) and drops them at the end. The function checks load a module only when the
//! server has none (no exports) and load an empty module again afterwards.
//!
//! Depends on client crates only (reqwest, tokio-tungstenite, rmp-serde, serde_json), never
//! on the server's crates, so it checks the wire and nothing else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

mod checks;
mod checksum;
mod client;
mod jwt;

pub use checksum::{row_checksum, rows_checksum};

/// What to run against which server.
#[derive(Clone, Debug)]
pub struct Options {
    /// The server's base URL, e.g. `http://127.0.0.1:7070`.
    pub url: String,
    /// The admin token.
    pub token: String,
    /// A client token (JWT) the server accepts, for the checks of rules and client
    /// refusals; its `sub` is read from its claims.
    pub client_token: Option<String>,
    /// The server's `--jwt-secret`: the suite mints its own client tokens (several
    /// subjects, expired ones, ones missing a claim). Wins over `client_token`.
    pub jwt_secret: Option<String>,
    /// Run only the checks whose `area/name` contains one of these substrings (all when
    /// empty).
    pub only: Vec<String>,
    /// Leave out (report as skipped) the checks whose `area/name` contains one of these.
    pub exclude: Vec<String>,
    /// What the server was started with, when known: enables the checks of limits that
    /// only small settings make reachable (`--live-queue-events`, `--watch-queue-records`,
    /// `--live-heartbeat-ms`).
    pub server: ServerSettings,
    /// Time one check may take before it fails as timed out.
    pub check_timeout: Duration,
    /// Stops the server (e.g. sends it SIGTERM): enables the `shutdown/*` checks, which run
    /// last, after the clean-up, and leave their table and topic behind. Without it they
    /// are skipped (the CLI cannot stop a server).
    pub stop_server: Option<StopServer>,
}

/// A way to stop the server under test, for the `shutdown/*` checks.
#[derive(Clone)]
pub struct StopServer(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for StopServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StopServer(..)")
    }
}

/// Server settings the caller knows (all optional).
#[derive(Clone, Debug, Default)]
pub struct ServerSettings {
    /// `--live-heartbeat-ms`: the heartbeat check waits twice this (at most 3 s when unknown,
    /// then skips).
    pub live_heartbeat_ms: Option<u64>,
    /// `--watch-queue-records`: enables the `lagging` check when small (≤ 64).
    pub watch_queue_records: Option<u64>,
    /// `--live-queue-events`: enables the reset-on-backlog check when small (≤ 16).
    pub live_queue_events: Option<u64>,
    /// `--max-body-bytes`: enables the WebSocket frame-size checks (a frame over it is a
    /// `limit` error; over twice it, at least 1 MiB, the connection is closed).
    pub max_body_bytes: Option<u64>,
    /// `--live-subscriptions-per-connection`: enables its `limit` check when small (≤ 64).
    pub live_subscriptions_per_connection: Option<u64>,
}

impl Options {
    pub fn new(url: &str, token: &str) -> Options {
        Options {
            url: url.trim_end_matches('/').to_string(),
            token: token.to_string(),
            client_token: None,
            jwt_secret: None,
            only: Vec::new(),
            exclude: Vec::new(),
            server: ServerSettings::default(),
            check_timeout: Duration::from_secs(20),
            stop_server: None,
        }
    }
}

/// How one check ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct CheckResult {
    pub area: &'static str,
    pub name: &'static str,
    pub outcome: Outcome,
}

impl CheckResult {
    /// `area/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.area, self.name)
    }

    /// The line the CLI prints: `ok   area/name`, `FAIL area/name: why`,
    /// `skip area/name: reason`.
    pub fn line(&self) -> String {
        match &self.outcome {
            Outcome::Passed => format!("ok   {}", self.id()),
            Outcome::Failed(why) => format!("FAIL {}: {}", self.id(), one_line(why)),
            Outcome::Skipped(why) => format!("skip {}: {}", self.id(), one_line(why)),
        }
    }
}

fn one_line(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.len() > 600 {
        let mut cut = 600;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

/// Every result of one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Passed))
    }
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Failed(_)))
    }
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skipped(_)))
    }
    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
    /// `N passed, M failed, K skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

/// Why a check did not pass.
#[derive(Debug)]
pub(crate) enum Verdict {
    Fail(String),
    Skip(String),
}

impl From<String> for Verdict {
    fn from(s: String) -> Verdict {
        Verdict::Fail(s)
    }
}

impl From<&str> for Verdict {
    fn from(s: &str) -> Verdict {
        Verdict::Fail(s.to_string())
    }
}

pub(crate) type R<T = ()> = Result<T, Verdict>;

/// Fails the check with a formatted reason.
macro_rules! fail {
    ($($arg:tt)*) => { return Err($crate::Verdict::Fail(format!($($arg)*))) };
}
/// Skips the check with a formatted reason.
macro_rules! skip {
    ($($arg:tt)*) => { return Err($crate::Verdict::Skip(format!($($arg)*))) };
}
/// Fails the check unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => { if !$cond { $crate::fail!($($arg)*) } };
}
pub(crate) use {ensure, fail, skip};

type CheckFuture = Pin<Box<dyn Future<Output = R> + Send>>;

/// One entry of the check list.
pub(crate) struct Check {
    pub area: &'static str,
    pub name: &'static str,
    pub run: fn(Arc<Ctx>) -> CheckFuture,
}

/// The `area/name` of every check, in the order [`run`] runs them.
pub fn check_names() -> Vec<String> {
    let mut names: Vec<String> = checks::all()
        .iter()
        .map(|c| format!("{}/{}", c.area, c.name))
        .collect();
    names.extend(
        checks::shutdown::NAMES
            .iter()
            .map(|n| format!("shutdown/{n}")),
    );
    names
}

/// What every check gets: the server, the tokens and the run's unique prefix.
pub(crate) struct Ctx {
    pub opts: Options,
    pub http: reqwest::Client,
    /// `conf_<random>`: every table and topic the suite creates starts with it.
    pub prefix: String,
    pub counter: std::sync::atomic::AtomicU64,
}

impl Ctx {
    /// A fresh object name under the run's prefix: `conf_<random>_<what>_<n>`.
    pub fn name(&self, what: &str) -> String {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}_{what}_{n}", self.prefix)
    }
}

fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

fn selected(opts: &Options, id: &str) -> Result<(), String> {
    if !opts.only.is_empty() && !opts.only.iter().any(|p| id.contains(p.as_str())) {
        return Err(String::new());
    }
    if let Some(p) = opts.exclude.iter().find(|p| id.contains(p.as_str())) {
        return Err(format!("left out by the caller (pattern {p:?})"));
    }
    Ok(())
}

/// Runs the selected checks one after another against `opts.url`, calling `on_result` as
/// each ends, then drops what the suite created. Checks not selected by `only` are not
/// reported at all; those left out by `exclude` are reported as skipped.
pub async fn run(opts: &Options, mut on_result: impl FnMut(&CheckResult)) -> Report {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client");
    let ctx = Arc::new(Ctx {
        opts: opts.clone(),
        http,
        prefix: format!("conf_{}", random_hex()),
        counter: std::sync::atomic::AtomicU64::new(0),
    });
    let mut report = Report::default();
    for check in checks::all() {
        let id = format!("{}/{}", check.area, check.name);
        let outcome = match selected(opts, &id) {
            Err(why) if why.is_empty() => continue,
            Err(why) => Outcome::Skipped(why),
            Ok(()) => {
                let fut = (check.run)(ctx.clone());
                match tokio::time::timeout(opts.check_timeout, fut).await {
                    Ok(Ok(())) => Outcome::Passed,
                    Ok(Err(Verdict::Fail(why))) => Outcome::Failed(why),
                    Ok(Err(Verdict::Skip(why))) => Outcome::Skipped(why),
                    Err(_) => Outcome::Failed(format!(
                        "timed out after {:?} (no answer the check was waiting for)",
                        opts.check_timeout
                    )),
                }
            }
        };
        let result = CheckResult {
            area: check.area,
            name: check.name,
            outcome,
        };
        on_result(&result);
        report.results.push(result);
    }
    checks::cleanup(&ctx).await;
    // Last: the checks that stop the server.
    let selected_shutdown: Vec<(&'static str, Result<(), String>)> = checks::shutdown::NAMES
        .iter()
        .filter_map(|n| match selected(opts, &format!("shutdown/{n}")) {
            Err(why) if why.is_empty() => None,
            other => Some((*n, other)),
        })
        .collect();
    if !selected_shutdown.is_empty() {
        let results = match (&opts.stop_server, selected_shutdown.iter().all(|(_, s)| s.is_ok())) {
            (Some(stop), true) => {
                match tokio::time::timeout(opts.check_timeout, checks::shutdown::run(&ctx, stop))
                    .await
                {
                    Ok(results) => results
                        .into_iter()
                        .map(|r| match r {
                            Ok(()) => Outcome::Passed,
                            Err(Verdict::Fail(why)) => Outcome::Failed(why),
                            Err(Verdict::Skip(why)) => Outcome::Skipped(why),
                        })
                        .collect(),
                    Err(_) => vec![
                        Outcome::Failed(format!("timed out after {:?}", opts.check_timeout));
                        checks::shutdown::NAMES.len()
                    ],
                }
            }
            (Some(_), false) => vec![
                Outcome::Skipped("the shutdown checks run together or not at all".into());
                checks::shutdown::NAMES.len()
            ],
            (None, _) => vec![
                Outcome::Skipped(
                    "needs a server the suite may stop (the library's Options::stop_server; the CLI cannot)".into()
                );
                checks::shutdown::NAMES.len()
            ],
        };
        for (name, outcome) in checks::shutdown::NAMES.iter().zip(results) {
            if !selected_shutdown.iter().any(|(n, _)| n == name) {
                continue;
            }
            let result = CheckResult {
                area: "shutdown",
                name,
                outcome,
            };
            on_result(&result);
            report.results.push(result);
        }
    }
    report
}

/// A short description of a JSON value for failure messages.
pub(crate) fn show(v: &Value) -> String {
    one_line(&v.to_string())
}
