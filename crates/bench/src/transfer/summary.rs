//! What `sluice bench transfer` reports: the keynote-shaped table per α with each system's
//! ratio to PostgreSQL, the goals, failures and balance checks, charts and raw samples.

use serde_json::json;

use super::{profile, Case, Params, Target};
use crate::hist::{fmt_le, fmt_ratio, fmt_ratio_against, fmt_si, fmt_us};
use crate::report::{Report, Table, Target as Goal};
use crate::svg::{BarChart, BarSeries, LineChart, LineSeries};

/// Goal: `sluice-ws` transactions per second, durable, at every α (issue 12).
const GOAL_TPS: f64 = 200_000.0;
/// Goal: `sluice-ws` over `postgres` in the same run, at α = 0 and at α = 1.5 (issue 12).
const GOAL_RATIO_UNIFORM: f64 = 50.0;
const GOAL_RATIO_SKEWED: f64 = 150.0;
/// Goal: `sluice-http` over `postgres` in the same run, at every α (issue 12).
const GOAL_RATIO_HTTP: f64 = 10.0;
/// Goal: `sluice-ws` p99 latency, in µs.
const GOAL_P99_US: u64 = 15_000;

/// The keynote's published rows (its README; a different, larger machine), for context:
/// (system, clients, pipelining, TPS at α = 0, TPS at α = 1.5).
const KEYNOTE_ROWS: [(&str, u32, &str, f64, f64); 3] = [
    ("SpacetimeDB", 64, "40", 279_024.0, 303_919.0),
    ("Node.js + Postgres", 64, "off", 9_904.0, 961.0),
    ("Node.js + SQLite", 64, "off", 3_121.0, 3_188.0),
];

fn ms(us: u64) -> String {
    let ms = us as f64 / 1e3;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

fn tps(v: f64) -> String {
    // Thousands separators, as the keynote prints them.
    let digits = (v.max(0.0).round() as u64).to_string();
    let head = digits.len() % 3;
    let mut groups: Vec<&str> = Vec::with_capacity(digits.len() / 3 + 1);
    if head > 0 {
        groups.push(&digits[..head]);
    }
    groups.extend(
        digits.as_bytes()[head..]
            .chunks(3)
            .map(|g| std::str::from_utf8(g).expect("ASCII digits")),
    );
    groups.join(",")
}

fn alpha_label(alpha: f64) -> String {
    if alpha <= 0.0 {
        format!("α = {alpha} (uniform)")
    } else {
        format!("α = {alpha}")
    }
}

fn find(cases: &[Case], target: Target, alpha: f64) -> Option<&Case> {
    cases
        .iter()
        .find(|c| c.target == target && c.alpha == alpha)
}

fn ok_tps(cases: &[Case], target: Target, alpha: f64) -> Option<f64> {
    find(cases, target, alpha)
        .filter(|c| c.ok().is_some())
        .map(|c| c.tps_mean)
}

fn pipelining(params: &Params, target: Target) -> String {
    match (target, params.in_flight(target)) {
        (Target::SluiceWs, n) => n.to_string(),
        (_, 1) => "off".into(),
        (_, n) => format!("{n} (concurrent requests)"),
    }
}

pub fn write(
    report: &mut Report,
    params: &Params,
    cases: &[Case],
    profile_before: Option<&(String, Vec<profile::Row>)>,
) {
    intro(report, params);
    goals(report, params, cases);
    for &alpha in &params.alphas {
        report.tables.push(keynote_table(params, cases, alpha));
    }
    report.tables.push(verification_table(params, cases));
    report.tables.push(checks_table(params, cases));
    if let Some(t) = threads_table(cases) {
        report.tables.push(t);
    }
    if let Some(t) = rounds_table(cases) {
        report.tables.push(t);
    }
    writer_profile(report, params, cases, profile_before);
    let mut reference = Table::new(
        "For context: the keynote's published numbers (their machine, not this one)",
        &[
            "system",
            "clients",
            "pipelining",
            "TPS α = 0",
            "TPS α = 1.5",
        ],
    );
    for (system, clients, pipe, uniform, skewed) in KEYNOTE_ROWS {
        reference.row(vec![
            system.into(),
            clients.to_string(),
            pipe.into(),
            tps(uniform),
            tps(skewed),
        ]);
    }
    reference.note = Some(
        "From templates/keynote-2/README.md in the SpacetimeDB repository: 300-second runs, \
         30-second warm-up, client, server and database on one large cloud machine. Compare \
         ratios, not absolute numbers."
            .into(),
    );
    report.tables.push(reference);
    charts(report, params, cases);
    notes(report, params, cases);
    report.samples = json!({ "suite": "transfer", "params": params, "cases": cases });
}

fn intro(report: &mut Report, params: &Params) {
    report.intro.push(format!(
        "The SpacetimeDB keynote-2 workload: {} accounts with balance {}, each transaction \
         moves 1 between two distinct accounts drawn by Zipf(α) (mulberry32, seed 0x12345678, \
         {} precomputed pairs; worker w starts at w × pairs / clients). A transfer fails on \
         the same account, a missing account or insufficient funds. Every system commits \
         durably: Sluice with the `{}` class, PostgreSQL with synchronous_commit=on and fsync=on \
         at serializable isolation, SQLite in WAL mode with synchronous=FULL.",
        params.accounts,
        tps(params.initial_balance as f64),
        params.pairs,
        params.durability
    ));
    report.intro.push(format!(
        "Every system sits behind a network API on loopback, started by the bench on this \
         machine: Sluice runs the transfer as a server function (`examples/bank.js`), called \
         over the binary WebSocket protocol with {} calls in flight per connection \
         (`sluice-ws`) or by `POST /v1/call/transfer` (`sluice-http`); PostgreSQL and SQLite \
         sit behind an HTTP RPC server with the same API (Rust, axum; PostgreSQL through a \
         pool of {} connections, SQLite through one connection). {} clients; HTTP clients \
         keep {} request(s) in flight each, every one on its own keep-alive connection \
         (HTTP/1.1 has no usable pipelining), written and read by a lean HTTP/1.1 client \
         (`transfer/http1.rs`, not reqwest: the clients share the machine's CPUs with the \
         server, and a real client runs elsewhere). Each case: {:.0}s warm-up, then {:.0}s \
         measured; TPS counts transfers whose success reply arrived in the window; TPS \
         stddev is the sample standard deviation of the per-second series.",
        params.pipeline,
        params.pg_pool,
        params.concurrency,
        params.http_inflight,
        params.warmup_seconds,
        params.seconds
    ));
}

fn goals(report: &mut Report, params: &Params, cases: &[Case]) {
    if params.targets.contains(&Target::SluiceHttp) {
        for &alpha in &params.alphas {
            let ratio = ok_tps(cases, Target::SluiceHttp, alpha)
                .zip(ok_tps(cases, Target::Postgres, alpha))
                .map(|(s, p)| s / p);
            report.targets.push(Goal {
                what: format!("sluice-http / postgres TPS, {}", alpha_label(alpha)),
                goal: format!("≥ {GOAL_RATIO_HTTP:.0}×"),
                measured: ratio.map_or("not measured".into(), |r| {
                    fmt_ratio_against(r, GOAL_RATIO_HTTP)
                }),
                met: ratio.map(|r| r >= GOAL_RATIO_HTTP),
            });
        }
    }
    if !params.targets.contains(&Target::SluiceWs) {
        return;
    }
    for &alpha in &params.alphas {
        let ws = find(cases, Target::SluiceWs, alpha).filter(|c| c.ok().is_some());
        report.targets.push(Goal {
            what: format!(
                "sluice-ws TPS, {} durable, {}",
                params.durability,
                alpha_label(alpha)
            ),
            goal: format!("≥ {}", fmt_si(GOAL_TPS)),
            measured: ws.map_or("not measured".into(), |c| tps(c.tps_mean)),
            met: ws.map(|c| c.tps_mean >= GOAL_TPS),
        });
        let goal_ratio = if alpha <= 0.0 {
            Some(GOAL_RATIO_UNIFORM)
        } else if (alpha - 1.5).abs() < 1e-9 {
            Some(GOAL_RATIO_SKEWED)
        } else {
            None
        };
        let ratio = ok_tps(cases, Target::SluiceWs, alpha)
            .zip(ok_tps(cases, Target::Postgres, alpha))
            .map(|(s, p)| s / p);
        report.targets.push(Goal {
            what: format!("sluice-ws / postgres TPS, {}", alpha_label(alpha)),
            goal: goal_ratio.map_or("reported".into(), |g| format!("≥ {g:.0}×")),
            measured: ratio.map_or("not measured".into(), |r| match goal_ratio {
                Some(g) => fmt_ratio_against(r, g),
                None => fmt_ratio(r),
            }),
            met: goal_ratio.zip(ratio).map(|(g, r)| r >= g),
        });
        let p99 = ws.and_then(|c| c.ok()).map(|m| m.latency.p99_us);
        report.targets.push(Goal {
            what: format!("sluice-ws p99 latency, {}", alpha_label(alpha)),
            goal: format!("< {} ms", GOAL_P99_US / 1000),
            measured: p99.map_or("not measured".into(), |us| format!("{} ms", ms(us))),
            met: p99.map(|us| us < GOAL_P99_US),
        });
    }
}

fn keynote_table(params: &Params, cases: &[Case], alpha: f64) -> Table {
    let mut t = Table::new(
        format!("Transfers, {}", alpha_label(alpha)),
        &[
            "system",
            "clients",
            "pipelining",
            "TPS",
            "TPS stddev",
            "p50 ms",
            "p99 ms",
            "vs postgres",
        ],
    );
    let pg = ok_tps(cases, Target::Postgres, alpha);
    for &target in &params.targets {
        let Some(c) = find(cases, target, alpha) else {
            continue;
        };
        let mut row = vec![
            format!("{} (`{}`)", target.system(), target.name()),
            c.clients.to_string(),
            pipelining(params, target),
        ];
        match c.ok() {
            Some(m) => row.extend([
                tps(c.tps_mean),
                tps(c.tps_stddev),
                ms(m.latency.p50_us),
                ms(m.latency.p99_us),
                pg.map_or("—".into(), |p| fmt_ratio(c.tps_mean / p)),
            ]),
            None => {
                row.push("failed".into());
                row.extend(std::iter::repeat_n("—".to_string(), 4));
            }
        }
        t.row(row);
    }
    t.note = Some(
        "Latency is from sending a call to its success reply, as the client sees it; with \
         pipelining it includes the time a call waits behind the others in flight on its \
         connection."
            .into(),
    );
    t
}

fn checks_table(params: &Params, cases: &[Case]) -> Table {
    let mut t = Table::new(
        "Refusals, balance checks and CPU",
        &[
            "system",
            "α",
            "committed in window",
            "refused (by kind)",
            "retries",
            "balance sum after",
            "server CPU (cores)",
            "bench CPU (cores)",
            "CPU per transfer",
            "commits/sync",
        ],
    );
    for c in cases {
        let refused = if c.failures.is_empty() {
            "none".to_string()
        } else {
            c.failures
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let balance = match &c.balance {
            Some(b) if b.verified => {
                format!("{} over {} accounts ✓", tps(b.sum as f64), b.accounts)
            }
            Some(b) => format!(
                "**{} over {} accounts, expected {}**",
                tps(b.sum as f64),
                b.accounts,
                tps(b.sum_expected as f64)
            ),
            None => "not checked".into(),
        };
        let m = c.result.as_ref();
        t.row(vec![
            c.target.name().into(),
            c.alpha.to_string(),
            m.map_or("—".into(), |m| m.requests.to_string()),
            refused,
            c.retries.map_or("—".into(), |r| r.to_string()),
            balance,
            c.server_cpu_cores.map_or("—".into(), |x| format!("{x:.2}")),
            c.bench_cpu_cores.map_or("—".into(), |x| format!("{x:.2}")),
            cpu_per_transfer(c),
            m.and_then(|m| m.commits_per_sync)
                .map_or("—".into(), |x| format!("{x:.0}")),
        ]);
    }
    t.note = Some(format!(
        "Balances are read after the load stopped (every account, as in the verification \
         table); their sum must stay {} × {}. Retries: PostgreSQL \
         transactions retried after 40001/40P01/55P03. Server CPU: the Sluice process, or \
         PostgreSQL's postmaster and backends; bench CPU: this process (clients, plus the RPC \
         server and SQLite for the peers); both averaged over warm-up and window on {} \
         CPU(s). CPU per transfer: server plus bench CPU time over transfers per second (an \
         upper bound: the warm-up and drain are in the CPU, not in the count). commits/sync: \
         fsync-class commits per log sync (group commit).",
        params.accounts,
        tps(params.initial_balance as f64),
        report_nproc()
    ));
    t
}

/// Every balance against the bench's ledger, after each case and (Sluice) after a restart.
fn verification_table(params: &Params, cases: &[Case]) -> Table {
    let mut t = Table::new(
        "Verification: every account's balance",
        &[
            "system",
            "α",
            "transfers acked (so far)",
            "unknown outcome",
            "accounts checked",
            "mismatches",
            "after kill -9 and restart",
        ],
    );
    for c in cases {
        let (acked, unknown, checked, mismatches) = match &c.balance {
            Some(b) => {
                let e = &b.every_account;
                (
                    e.acked_transfers.to_string(),
                    match e.unknown_applied {
                        Some(a) if e.unknown_transfers > 0 => {
                            format!("{} ({a} applied in the subset found)", e.unknown_transfers)
                        }
                        _ => e.unknown_transfers.to_string(),
                    },
                    format!("{} ({})", e.accounts_checked, e.method),
                    if e.ok {
                        format!("{} ✓", e.mismatches)
                    } else {
                        format!("**{}**: {}", e.mismatches, e.detail)
                    },
                )
            }
            None => ("—".into(), "—".into(), "not checked".into(), "—".into()),
        };
        let restart = match &c.restart {
            None if matches!(c.target, Target::SluiceWs | Target::SluiceHttp) => {
                "after the target's last α".into()
            }
            None => "— (peer)".into(),
            Some(r) if !r.done => r.detail.clone(),
            Some(r) => match (&r.balance, r.ok) {
                (Some(b), true) => format!(
                    "ready in {:.2}s; {} accounts, {} mismatches ✓",
                    r.ready_s.unwrap_or_default(),
                    b.every_account.accounts_checked,
                    b.every_account.mismatches
                ),
                _ => format!("**failed**: {}", r.detail),
            },
        };
        t.row(vec![
            c.target.name().into(),
            c.alpha.to_string(),
            acked,
            unknown,
            checked,
            mismatches,
            restart,
        ]);
    }
    t.note = Some(format!(
        "The bench keeps the expected balance of each of the {} accounts from the transfers \
         whose success reply it received (a target's cases share its accounts, so the counts \
         add up over its α values). After each case it reads every balance back (Sluice: \
         paging GET /v1/tables/accounts/rows; PostgreSQL and SQLite: SELECT id, balance) and \
         compares each one; a refused transfer must have changed nothing. A transfer whose \
         reply was lost or did not say whether it applied (transport error, `log_poisoned`, \
         `shutting_down`, `internal`) is unknown: the check accepts exactly it having applied \
         or not (`exact`: one subset of the unknown transfers must explain every difference, \
         found by enumeration up to {} of them, else as a maximum flow, exact when they all \
         move the same amount, as here; `bounded` otherwise: each account within their \
         reach). For the \
         Sluice targets the bench then kills the server with SIGKILL (its own child, by pid), \
         starts it on the same data dir and compares every balance again; ready = spawn to \
         the first good /health, recovery included. Any mismatch fails the run.",
        params.accounts,
        super::ledger::UNKNOWN_EXACT_MAX
    ));
    t
}

/// Server plus bench CPU time per committed transfer, in µs.
fn cpu_per_transfer(c: &Case) -> String {
    let cores = c.server_cpu_cores.unwrap_or(0.0) + c.bench_cpu_cores.unwrap_or(0.0);
    if c.ok().is_none() || c.tps_mean <= 0.0 || cores <= 0.0 {
        return "—".into();
    }
    format!("{:.1} µs", cores * 1e6 / c.tps_mean)
}

/// The server threads the CPU table names, by the prefix of their thread name (Sluice
/// names its own threads `sluice-<role>`; tokio's are `tokio-rt-worker`).
const THREAD_COLUMNS: [(&str, &str); 4] = [
    ("writer", "sluice-writer"),
    ("tokio", "tokio-"),
    ("log", "sluice-log"),
    ("live", "sluice-live"),
];

/// Sluice's CPU by thread, per transfer: the single writer against the network threads,
/// the log, the live-query thread, the rest of the server, and the bench (the clients).
fn threads_table(cases: &[Case]) -> Option<Table> {
    let mut t = Table::new(
        "Where Sluice's CPU went, by server thread (µs of CPU per committed transfer)",
        &[
            "system",
            "α",
            "TPS",
            "writer",
            "tokio workers",
            "log",
            "live",
            "other server threads",
            "bench (clients)",
            "total",
            "server threads (cores)",
        ],
    );
    for c in cases.iter().filter(|c| !c.server_threads_cores.is_empty()) {
        let per_transfer = |cores: f64| {
            if c.tps_mean > 0.0 {
                format!("{:.2}", cores * 1e6 / c.tps_mean)
            } else {
                "—".into()
            }
        };
        let mut row = vec![c.target.name().into(), c.alpha.to_string(), tps(c.tps_mean)];
        let mut named = 0.0;
        for (_, prefix) in THREAD_COLUMNS {
            let cores: f64 = c
                .server_threads_cores
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .fold(0.0, |sum, (_, cores)| sum + cores);
            named += cores;
            row.push(per_transfer(cores));
        }
        let all: f64 = c.server_threads_cores.values().fold(0.0, |sum, c| sum + c);
        row.push(per_transfer((all - named).max(0.0)));
        let bench = c.bench_cpu_cores.unwrap_or(0.0);
        row.push(c.bench_cpu_cores.map_or("—".into(), per_transfer));
        row.push(per_transfer(all + bench));
        row.push(
            c.server_threads_cores
                .iter()
                .map(|(name, cores)| format!("{name} {cores:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        t.row(row);
    }
    t.note = Some(
        "CPU time of each server thread (from /proc, by thread name; threads using under \
         0.005 core are left out) and of the bench process, averaged over warm-up and window, \
         over the mean TPS of the window: an upper bound, as the warm-up is in the CPU but not \
         in the count. The writer applies every transaction one at a time (the function runs \
         there): if it nears 1.00 core it is the bottleneck; otherwise the CPUs shared by the \
         network threads, the log and the clients are."
            .into(),
    );
    (!t.rows.is_empty()).then_some(t)
}

/// The writer's rounds in each Sluice case's window, beside the acknowledgement latency
/// they make up.
fn rounds_table(cases: &[Case]) -> Option<Table> {
    let mut t = Table::new(
        "Sluice's writer rounds (measured window)",
        &[
            "system",
            "α",
            "TPS",
            "rounds/s",
            "transfers per round",
            "round p50",
            "round p99",
            "rounds > 4.1 ms",
            "ack p50",
            "ack p99",
        ],
    );
    for c in cases {
        let Some(m) = &c.result else { continue };
        let Some(r) = m.writer_rounds else { continue };
        t.row(vec![
            c.target.name().into(),
            c.alpha.to_string(),
            tps(c.tps_mean),
            format!("{:.0}", r.per_sec),
            format!("{:.0}", r.commits_per_round),
            fmt_le(r.p50_le_us),
            fmt_le(r.p99_le_us),
            format!("{:.0} %", r.over_4ms * 100.0),
            fmt_us(m.latency.p50_us),
            fmt_us(m.latency.p99_us),
        ]);
    }
    t.note = Some(
        "From the server's `sluice_writer_round_seconds` (log2 buckets: a round's time is \
         given as its bucket's upper bound) before and after the window. A round applies every \
         call waiting when it starts, then hands their frames to the log at once; a call that \
         arrives during a round waits for the rest of it, then for its own round and the \
         sync, so long rounds are what lifts ack p99 above the mean. Transfers per round: \
         commits over rounds (a round may also hold nothing but a live-query or topic step)."
            .into(),
    );
    (!t.rows.is_empty()).then_some(t)
}

fn report_nproc() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn charts(report: &mut Report, params: &Params, cases: &[Case]) {
    let categories: Vec<String> = params.alphas.iter().map(|&a| alpha_label(a)).collect();
    let series_for =
        |targets: &[Target], metric: &dyn Fn(&Case) -> Option<f64>| -> Vec<BarSeries> {
            targets
                .iter()
                .filter(|t| params.targets.contains(t))
                .map(|&t| BarSeries {
                    name: t.name().into(),
                    values: params
                        .alphas
                        .iter()
                        .map(|&a| {
                            find(cases, t, a)
                                .filter(|c| c.ok().is_some())
                                .and_then(metric)
                        })
                        .collect(),
                })
                .collect()
        };
    let all = series_for(&params.targets, &|c| Some(c.tps_mean));
    report.chart(
        "tps.svg",
        "transactions per second by system and α",
        BarChart {
            title: format!(
                "Transfers per second ({} clients, durable)",
                params.concurrency
            ),
            x_label: "Zipf α".into(),
            y_label: "transactions/s".into(),
            categories: categories.clone(),
            series: all,
        }
        .render(),
    );
    // The request/response systems on their own scale: next to sluice-ws their bars are
    // too short to compare on a linear axis.
    let rr: Vec<Target> = params
        .targets
        .iter()
        .copied()
        .filter(|t| *t != Target::SluiceWs)
        .collect();
    if rr.len() >= 2 {
        report.chart(
            "tps_request_response.svg",
            "transactions per second, request/response systems only",
            BarChart {
                title: "Transfers per second, HTTP request/response".into(),
                x_label: "Zipf α".into(),
                y_label: "transactions/s".into(),
                categories: categories.clone(),
                series: series_for(&rr, &|c| Some(c.tps_mean)),
            }
            .render(),
        );
    }
    report.chart(
        "p99.svg",
        "p99 latency by system and α",
        BarChart {
            title: "p99 latency (ms)".into(),
            x_label: "Zipf α".into(),
            y_label: "p99 latency, ms".into(),
            categories,
            series: series_for(&params.targets, &|c| {
                c.ok().map(|m| m.latency.p99_us as f64 / 1e3)
            }),
        }
        .render(),
    );
    for (i, &alpha) in params.alphas.iter().enumerate() {
        let series: Vec<LineSeries> = params
            .targets
            .iter()
            .filter_map(|&t| {
                let m = find(cases, t, alpha)?.ok()?;
                Some(LineSeries {
                    name: t.name().into(),
                    points: m
                        .per_second
                        .iter()
                        .map(|s| (s.t, s.requests_per_sec))
                        .collect(),
                })
            })
            .collect();
        if !series.is_empty() {
            report.chart(
                &format!("timeline_{i}.svg"),
                &format!("per-second TPS, {}", alpha_label(alpha)),
                LineChart {
                    title: format!(
                        "Transfers per second over the window, {}",
                        alpha_label(alpha)
                    ),
                    x_label: "seconds into the measured window".into(),
                    y_label: "transactions/s".into(),
                    series,
                }
                .render(),
            );
        }
    }
}

fn notes(report: &mut Report, params: &Params, cases: &[Case]) {
    let in_flight = params.concurrency * params.pipeline;
    if params.targets.contains(&Target::SluiceWs) {
        report.notes.push(format!(
            "sluice-ws keeps {} × {} = {in_flight} calls in flight, so by Little's law its mean \
             latency is {in_flight} / TPS: {:.1} ms at {} TPS. The p99 goal can only be met at \
             well above that rate, or with fewer calls in flight.",
            params.concurrency,
            params.pipeline,
            in_flight as f64 / GOAL_TPS * 1e3,
            fmt_si(GOAL_TPS)
        ));
    }
    if params.durability != "fsync" {
        report.notes.push(format!(
            "Sluice ran with the {} durability class; PostgreSQL and SQLite still fsync every \
             commit, so the comparison is not like for like.",
            params.durability
        ));
    }
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {} at α = {}: {}",
            c.target,
            c.alpha,
            c.error.as_deref().unwrap_or_default()
        ));
    }
    crate::harness::standard_notes(report, params.quick);
}

/// The writer thread's profile (issue 12: "the before/after profile in the bench summary"),
/// or a note saying why there is none.
fn writer_profile(
    report: &mut Report,
    params: &Params,
    cases: &[Case],
    before: Option<&(String, Vec<profile::Row>)>,
) {
    let taken = cases.iter().find_map(|c| c.writer_profile.as_ref());
    match (taken, &params.profile) {
        (Some(p), _) if p.missing.is_none() => {
            let before = before.map(|(label, rows)| (label.as_str(), rows.as_slice()));
            report.tables.push(profile::table(p, before));
            if let Some((label, rows)) = before {
                report.tables.push(profile::before_table(label, rows, p));
            }
        }
        (Some(p), _) => report.notes.push(format!(
            "writer profile ({}): not taken: {}",
            p.case,
            p.missing.as_deref().unwrap_or("unknown")
        )),
        (None, Err(why)) => report.notes.push(format!(
            "writer profile: not taken ({why}; --profile takes one)"
        )),
        (None, Ok(alpha)) => report.notes.push(format!(
            "writer profile: not taken (the sluice-ws case at α = {alpha} did not run)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_like_the_keynote() {
        assert_eq!(tps(279_024.4), "279,024");
        assert_eq!(tps(961.0), "961");
        assert_eq!(tps(1_000_000_000.0), "1,000,000,000");
        assert_eq!(ms(8_123), "8.12");
        assert_eq!(ms(12_345), "12.3");
        assert_eq!(ms(250_100), "250");
    }
}
