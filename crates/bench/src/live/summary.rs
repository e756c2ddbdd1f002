//! What `sluice bench live` writes: targets, tables, charts, notes and `samples.json`.

use serde_json::json;

use super::{fmt_bytes, fmt_signed_us, Case, Family, Params, SHAPES, TOP_K};
use crate::hist::fmt_ratio;
use crate::report::{Report, Table, Target};
use crate::svg::{BarChart, BarSeries};

/// Goal: write → diff p50 at every view size.
const TARGET_P50_US: f64 = 500.0;
/// Goal: p50 at the largest view size over p50 at the smallest.
const TARGET_FLAT_RATIO: f64 = 2.0;
/// Goal: write → diff p50 with 100 K views.
const TARGET_VIEWS_P50_US: f64 = 1_000.0;
/// The view count the two goals above are stated for.
const TARGET_VIEWS: usize = 100_000;
/// Goal: server memory per idle view.
const TARGET_BYTES_PER_VIEW: f64 = 2048.0;
/// Goal (rules): p50 at the most users over p50 at the fewest.
const TARGET_RULES_FLAT_RATIO: f64 = 1.5;
/// Goal (rules): server memory per subscribed user, plus its rows.
const TARGET_BYTES_PER_USER: f64 = 2048.0;
/// What the rules memory goal allows per row in a user's view: the row's values, its
/// result key and hash in the view's window and materialisation.
const ROW_BYTES_ALLOWANCE: f64 = 256.0;

fn ms(us: f64) -> f64 {
    us / 1e3
}

fn ok(c: &Case) -> bool {
    c.error.is_none() && c.samples > 0
}

fn verified(c: &Case) -> String {
    if c.error.is_some() {
        "—".into()
    } else if c.verify.ok {
        format!("✓ {}", c.verify.method)
    } else {
        format!("**no**: {}", c.verify.detail)
    }
}

fn fmt_rows(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{} M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{} K", n / 1_000),
        n => n.to_string(),
    }
}

/// The latency cells every table shares.
fn latency_cells(c: &Case) -> Vec<String> {
    if !ok(c) {
        let mut v = vec!["failed".to_string()];
        v.extend(std::iter::repeat_n("—".to_string(), 7));
        return v;
    }
    vec![
        c.samples.to_string(),
        fmt_signed_us(c.write_to_diff.p50_us),
        fmt_signed_us(c.write_to_diff.p95_us),
        fmt_signed_us(c.write_to_diff.p99_us),
        fmt_signed_us(c.ack_to_diff.p50_us),
        fmt_signed_us(c.ack_to_diff.p99_us),
        format!("{} / {}", c.diff_before_ack, c.samples),
        fmt_signed_us(c.ack.p50_us),
    ]
}

const LATENCY_HEADERS: [&str; 8] = [
    "samples",
    "write→diff p50",
    "p95",
    "p99",
    "ack→diff p50",
    "ack→diff p99",
    "diff before ack",
    "write ack p50",
];

fn headers(first: &[&str], last: &[&str]) -> Vec<String> {
    first
        .iter()
        .chain(LATENCY_HEADERS.iter())
        .chain(last.iter())
        .map(|s| s.to_string())
        .collect()
}

fn table(title: &str, first: &[&str], last: &[&str]) -> Table {
    Table {
        title: title.into(),
        headers: headers(first, last),
        ..Table::default()
    }
}

pub fn write_report(report: &mut Report, params: &Params, cases: &[Case]) {
    let of = |family: Family| cases.iter().filter(move |c| c.family == family);
    let sluice_size = |size: usize, transport: &str| {
        of(Family::Size).find(|c| {
            c.system == "sluice" && c.transport == transport && c.size == Some(size) && ok(c)
        })
    };
    let pg_size = |size: usize| {
        of(Family::Size).find(|c| c.system == "postgres" && c.size == Some(size) && ok(c))
    };
    let shape_case = |name: &str, system: &str, durability: &str| {
        of(Family::Shape).find(|c| {
            c.system == system
                && c.shape.as_deref() == Some(name)
                && c.durability == durability
                && ok(c)
        })
    };

    report.intro.push(
        "End-to-end latency of live queries against the real `sluice serve` binary on loopback: \
         **write→diff** is from just before a one-row `POST /v1/mutate` is sent to the moment the \
         subscriber has read the diff carrying that write's seq; **ack→diff** is from the mutate's \
         reply to the same diff (negative when the diff arrived before the ack — reported as \
         measured, not clamped); **write ack** is the mutate's own round trip. Writes are \
         sequential (one in flight), after a warm-up, so the numbers are latency, not queueing."
            .into(),
    );
    report.intro.push(format!(
        "Sluice runs with `--durability memory`, so the numbers measure view maintenance and \
         delivery, not fsync; one extra top-k row sends its writes with `\"durability\": \
         \"fsync\"` to show what confirmed delivery costs (a diff is delivered only once its \
         seq reached its durability class). The PostgreSQL peer is the usual do-it-yourself live \
         query: an `AFTER INSERT OR UPDATE OR DELETE … FOR EACH ROW` trigger calling \
         `pg_notify`, and a `LISTEN`ing connection (tokio-postgres) that re-runs the view's query \
         on each notification; its latency is from the write sent to the re-query's last row \
         received. Its writer uses `synchronous_commit=off` (the counterpart of the memory \
         class; the server itself runs with fsync=on), plus one `synchronous_commit=on` top-k \
         row. Up to {} measured writes per Sluice case (≤ {}s) and per PostgreSQL case (≤ {}s), \
         after up to {} warm-up writes.",
        params.samples, params.case_seconds, params.peer_seconds, params.warmup
    ));
    report.intro.push(
        "The bench checks its own numbers: every subscriber keeps its view (row hashes by \
         result key), recomputes the documented checksum (XXH3-64 of each row's canonical bytes, \
         summed) after every snapshot and diff and compares it with the server's; after each \
         case the view is compared with a one-shot `POST /v1/query` — rows and checksum for views \
         under 100 000 rows (`content`), the row count above (`count`). For PostgreSQL the last \
         re-query's row count is compared with `SELECT COUNT(*)`."
            .into(),
    );

    // Targets.
    let sizes: Vec<(usize, &Case)> = params
        .sizes
        .iter()
        .filter_map(|&s| sluice_size(s, "sse").map(|c| (s, c)))
        .collect();
    if !sizes.is_empty() {
        let all_under = sizes
            .iter()
            .all(|(_, c)| c.write_to_diff.p50_us < TARGET_P50_US);
        report.targets.push(Target {
            what: "write→diff p50, one filter view, every view size (SSE, memory class)".into(),
            goal: "< 0.5 ms".into(),
            measured: sizes
                .iter()
                .map(|(s, c)| {
                    format!(
                        "{} rows: {} (ack→diff {})",
                        fmt_rows(*s),
                        fmt_signed_us(c.write_to_diff.p50_us),
                        fmt_signed_us(c.ack_to_diff.p50_us)
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            met: Some(all_under),
        });
        let p50s: Vec<f64> = sizes.iter().map(|(_, c)| c.write_to_diff.p50_us).collect();
        let (lo, hi) = p50s
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let first = sizes[0].0;
        let last = sizes[sizes.len() - 1].0;
        report.targets.push(Target {
            what: format!(
                "write→diff p50 flat from {} to {} rows (largest / smallest p50)",
                fmt_rows(first),
                fmt_rows(last)
            ),
            goal: format!("within {TARGET_FLAT_RATIO:.0}× (from 1 K to 1 M rows)"),
            measured: format!(
                "{} ({} … {})",
                fmt_ratio(hi / lo.max(1e-9)),
                fmt_signed_us(lo),
                fmt_signed_us(hi)
            ),
            met: (sizes.len() >= 2).then_some(hi / lo.max(1e-9) <= TARGET_FLAT_RATIO),
        });
    }
    let views: Vec<&Case> = of(Family::Views).filter(|c| ok(c)).collect();
    if let Some(big) = views.iter().max_by_key(|c| c.views.unwrap_or(0)) {
        let v = big.views.unwrap_or(0);
        report.targets.push(Target {
            what: format!(
                "write→diff p50 with {} scoped views registered (WebSocket)",
                fmt_rows(v)
            ),
            goal: "< 1 ms with 100 K views".into(),
            measured: format!(
                "{} (p99 {}; ack→diff p50 {})",
                fmt_signed_us(big.write_to_diff.p50_us),
                fmt_signed_us(big.write_to_diff.p99_us),
                fmt_signed_us(big.ack_to_diff.p50_us)
            ),
            met: (v >= TARGET_VIEWS).then_some(big.write_to_diff.p50_us < TARGET_VIEWS_P50_US),
        });
        if let Some(m) = &big.memory {
            report.targets.push(Target {
                what: format!(
                    "server memory per idle view, {} views of {} rows (RSS delta / views)",
                    fmt_rows(v),
                    big.view_rows
                ),
                goal: "< 2 KiB".into(),
                measured: format!(
                    "{:.0} bytes ({} → {}); allocator's live heap: {}",
                    m.bytes_per_view,
                    fmt_bytes(m.rss_before),
                    fmt_bytes(m.rss_subscribed),
                    m.alloc_bytes_per_view
                        .map_or("not exposed".into(), |b| format!("{b:.0} bytes per view"))
                ),
                met: (v >= TARGET_VIEWS).then_some(m.bytes_per_view < TARGET_BYTES_PER_VIEW),
            });
        }
    }
    rules_targets(report, cases);
    let ratios: Vec<String> = params
        .sizes
        .iter()
        .filter_map(|&s| {
            let (a, b) = (sluice_size(s, "sse")?, pg_size(s)?);
            Some(format!(
                "{}: {}",
                fmt_rows(s),
                fmt_ratio(b.write_to_diff.p50_us / a.write_to_diff.p50_us)
            ))
        })
        .collect();
    if !ratios.is_empty() {
        report.targets.push(Target {
            what: "PostgreSQL trigger + LISTEN/NOTIFY + re-query p50 / Sluice p50, by view size"
                .into(),
            goal: "reported".into(),
            measured: ratios.join("; "),
            met: None,
        });
    }
    let ratios: Vec<String> = SHAPES
        .iter()
        .filter_map(|s| {
            let a = shape_case(s.name, "sluice", "memory")?;
            let b = shape_case(s.name, "postgres", "synchronous_commit=off")?;
            Some(format!(
                "{}: {}",
                s.name,
                fmt_ratio(b.write_to_diff.p50_us / a.write_to_diff.p50_us)
            ))
        })
        .collect();
    if !ratios.is_empty() {
        report.targets.push(Target {
            what: "PostgreSQL DIY p50 / Sluice p50, by query shape".into(),
            goal: "reported".into(),
            measured: ratios.join("; "),
            met: None,
        });
    }

    // Tables.
    let mut t = table(
        "Latency vs rows in the view (`SELECT * FROM items WHERE grp = 1`, every row in the view)",
        &["rows in view", "system", "transport", "durability"],
        &[
            "snapshot",
            "writes while subscribing: slowest ack",
            "verified",
        ],
    );
    for c in of(Family::Size) {
        let mut row = vec![
            c.size.map_or("—".into(), fmt_rows),
            c.system.to_string(),
            c.transport.to_string(),
            c.durability.clone(),
        ];
        row.extend(latency_cells(c));
        row.push(c.snapshot_ms.map_or("—".into(), |m| fmt_signed_us(m * 1e3)));
        row.push(match (c.probe_writes, c.probe_ack_max_ms) {
            (Some(n), Some(m)) => format!("{} ({n} writes)", fmt_signed_us(m * 1e3)),
            _ => "—".into(),
        });
        row.push(verified(c));
        t.row(row);
    }
    t.note = Some(
        "Each write patches one random row of the view (`val` = a fresh value), so every write \
         changes the view by one row. Sluice follows this view with its filter operator \
         (O(changed rows), routed by `grp = 1`); PostgreSQL re-reads the whole view on every \
         notification. snapshot: subscribe sent → last byte of the snapshot received (Sluice). \
         Writes while subscribing: a second client upserts one row of an unrelated table, one \
         write at a time, from just before the subscribe until the snapshot arrived; the \
         slowest ack shows how long building the view and its snapshot held writers up. For \
         PostgreSQL \"ack\" is the UPDATE's reply and \"diff\" the re-query's last row."
            .into(),
    );
    if !t.rows.is_empty() {
        report.tables.push(t);
    }

    let mut t = Table::new(
        "Sluice vs PostgreSQL by view size (write→diff)",
        &[
            "rows in view",
            "sluice p50",
            "postgres p50",
            "postgres / sluice",
            "sluice p99",
            "postgres p99",
            "postgres / sluice",
        ],
    );
    for &s in &params.sizes {
        let (Some(a), Some(b)) = (sluice_size(s, "sse"), pg_size(s)) else {
            continue;
        };
        t.row(vec![
            fmt_rows(s),
            fmt_signed_us(a.write_to_diff.p50_us),
            fmt_signed_us(b.write_to_diff.p50_us),
            fmt_ratio(b.write_to_diff.p50_us / a.write_to_diff.p50_us),
            fmt_signed_us(a.write_to_diff.p99_us),
            fmt_signed_us(b.write_to_diff.p99_us),
            fmt_ratio(b.write_to_diff.p99_us / a.write_to_diff.p99_us),
        ]);
    }
    t.note = Some(
        "PostgreSQL cases are capped by time, so the big views have few samples (see the \
         samples column above)."
            .into(),
    );
    if !t.rows.is_empty() {
        report.tables.push(t);
    }

    let mut t = table(
        &format!(
            "Latency and memory vs number of registered views (`SELECT * FROM msg WHERE room = $1 \
             ORDER BY ts DESC LIMIT {TOP_K}`, one view per room, {} rows per room)",
            params.rows_per_room
        ),
        &["views"],
        &[
            "subscribe all",
            "RSS before",
            "RSS subscribed",
            "bytes / view (RSS)",
            "heap bytes / view (allocator)",
            "heap blocks / view",
            "RSS after leaving",
            "RSS subscribed again",
            "verified",
        ],
    );
    for c in of(Family::Views) {
        let mut row = vec![c.views.map_or("—".into(), fmt_rows)];
        row.extend(latency_cells(c));
        let m = c.memory.as_ref();
        row.push(c.subscribe_s.map_or("—".into(), |s| {
            format!(
                "{s:.2} s ({:.0}/s)",
                c.views.unwrap_or(0) as f64 / s.max(1e-9)
            )
        }));
        row.push(m.map_or("—".into(), |m| fmt_bytes(m.rss_before)));
        row.push(m.map_or("—".into(), |m| fmt_bytes(m.rss_subscribed)));
        row.push(m.map_or("—".into(), |m| format!("{:.0}", m.bytes_per_view)));
        row.push(
            m.and_then(|m| m.alloc_bytes_per_view)
                .map_or("—".into(), |b| format!("{b:.0}")),
        );
        row.push(
            m.and_then(|m| m.alloc_blocks_per_view)
                .map_or("—".into(), |b| format!("{b:.1}")),
        );
        row.push(
            m.and_then(|m| m.rss_after_leave)
                .map_or("—".into(), fmt_bytes),
        );
        row.push(
            m.and_then(|m| m.rss_resubscribed)
                .map_or("—".into(), fmt_bytes),
        );
        row.push(verified(c));
        t.row(row);
    }
    t.note = Some(format!(
        "Views are subscribed over WebSocket (JSON), up to {} per connection and at most {} \
         connections, pipelined (all subscribes sent, then the snapshots read). Each write \
         inserts a row into one random subscribed room (newest `ts`, so it enters that room's \
         top {TOP_K}); its diff is awaited at that room's subscription. An \"idle view\" is a \
         subscribed view with its {} rows and no writes reaching it; bytes / view is (server \
         RSS with every view subscribed − RSS before subscribing) / views, and counts all the \
         server holds for it: the view, its materialisation, its routing entry, the \
         subscription's queue and its WebSocket forwarding task. RSS is read 1 s after each \
         step. RSS after leaving: every connection closed and every view expired \
         (`--live-ttl-secs 1`); the allocator (mimalloc) may keep freed pages, so RSS subscribed \
         again (the same views, subscribed a second time) tells whether that memory is reused. \
         Below ~10 K views the RSS figure is within the noise of RSS (it moves by whole pages, \
         and freed pages may stay), and can even be negative. Heap bytes / view is exact: the \
         server's global allocator counts the bytes it was asked for and not yet given back \
         (`sluice_alloc_bytes` in /metrics, read at the same moments as RSS), so (heap with \
         every view subscribed − heap before) / views is what the views, their subscriptions \
         and connections hold, without the allocator's own overhead and free pages that RSS \
         also counts; heap blocks / view counts allocations the same way.",
        super::SUBS_PER_CONNECTION,
        super::CONNECTIONS_MAX,
        params.rows_per_room.min(TOP_K)
    ));
    if !t.rows.is_empty() {
        report.tables.push(t);
    }

    let mut t = table(
        &format!(
            "Latency by query shape (`msg` {} rows in 100 rooms, `users` 1000, `teams` 100, \
             `orgs` 10)",
            params.shape_rows
        ),
        &[
            "shape",
            "sluice operator",
            "system",
            "durability",
            "rows in view",
        ],
        &["one-shot query p50", "verified"],
    );
    for c in of(Family::Shape) {
        let mut row = vec![
            c.shape.clone().unwrap_or_default(),
            if c.system == "sluice" {
                c.operator.unwrap_or("—").to_string()
            } else {
                "re-query".into()
            },
            c.system.to_string(),
            c.durability.clone(),
            c.view_rows.to_string(),
        ];
        row.extend(latency_cells(c));
        row.push(c.query_ms.map_or("—".into(), |m| fmt_signed_us(m * 1e3)));
        row.push(verified(c));
        t.row(row);
    }
    t.note = Some(
        "Queries: filter `SELECT id, room, author, ts FROM msg WHERE room < 50`; top-k `SELECT * \
         FROM msg ORDER BY ts DESC LIMIT 20`; join `SELECT m.id, m.ts, u.name FROM msg m JOIN \
         users u ON m.author = u.id WHERE m.room < 50`; subquery-1 `… WHERE room < 50 AND author \
         IN (SELECT id FROM users WHERE active = true)`; subquery-3 `… WHERE author IN (SELECT id \
         FROM users WHERE team IN (SELECT id FROM teams WHERE org IN (SELECT id FROM orgs WHERE \
         active = true)))`; aggregate `SELECT room, COUNT(*), MAX(ts) FROM msg GROUP BY room`. \
         Each write inserts one `msg` row (room < 50, an active author, newest ts), which \
         changes every one of these views. Operators follow crates/live/src/operator.rs at \
         this commit: the join uses the join operator (a changed row is walked back through \
         the ON columns to the rows it affects); `IN (SELECT …)` uses the subquery \
         operator (a changed `msg` row is re-tested alone; a change to a subquery's table \
         re-runs the subqueries and re-tests only the rows whose `IN` column holds a value \
         that entered or left a set). One-shot query p50: the same SQL through \
         `POST /v1/query` (HTTP and JSON of every row included), for scale. Rows in view: at \
         the end of the case (the table grows by one row per write)."
            .into(),
    );
    if !t.rows.is_empty() {
        report.tables.push(t);
    }

    let mut t = Table::new(
        "Sluice vs PostgreSQL by query shape (write→diff, Sluice memory class vs PostgreSQL \
         synchronous_commit=off)",
        &[
            "shape",
            "sluice p50",
            "postgres p50",
            "postgres / sluice",
            "sluice p99",
            "postgres p99",
            "postgres / sluice",
        ],
    );
    for s in &SHAPES {
        let (Some(a), Some(b)) = (
            shape_case(s.name, "sluice", "memory"),
            shape_case(s.name, "postgres", "synchronous_commit=off"),
        ) else {
            continue;
        };
        t.row(vec![
            s.name.to_string(),
            fmt_signed_us(a.write_to_diff.p50_us),
            fmt_signed_us(b.write_to_diff.p50_us),
            fmt_ratio(b.write_to_diff.p50_us / a.write_to_diff.p50_us),
            fmt_signed_us(a.write_to_diff.p99_us),
            fmt_signed_us(b.write_to_diff.p99_us),
            fmt_ratio(b.write_to_diff.p99_us / a.write_to_diff.p99_us),
        ]);
    }
    if let (Some(a), Some(b)) = (
        shape_case("top-k", "sluice", "fsync"),
        shape_case("top-k", "postgres", "synchronous_commit=on"),
    ) {
        t.row(vec![
            "top-k, durable (sluice fsync / postgres synchronous_commit=on)".into(),
            fmt_signed_us(a.write_to_diff.p50_us),
            fmt_signed_us(b.write_to_diff.p50_us),
            fmt_ratio(b.write_to_diff.p50_us / a.write_to_diff.p50_us),
            fmt_signed_us(a.write_to_diff.p99_us),
            fmt_signed_us(b.write_to_diff.p99_us),
            fmt_ratio(b.write_to_diff.p99_us / a.write_to_diff.p99_us),
        ]);
    }
    if !t.rows.is_empty() {
        report.tables.push(t);
    }

    rules_table(report, params, cases);

    // Charts (latencies in ms).
    let size_labels: Vec<String> = params.sizes.iter().map(|&s| fmt_rows(s)).collect();
    let size_series = |name: &str, f: &dyn Fn(usize) -> Option<f64>| BarSeries {
        name: name.into(),
        values: params.sizes.iter().map(|&s| f(s)).collect(),
    };
    if !sizes.is_empty() {
        let chart = BarChart {
            title: "Sluice write→diff latency vs rows in the view (SSE)".into(),
            x_label: "rows in the view".into(),
            y_label: "ms".into(),
            categories: size_labels.clone(),
            series: vec![
                size_series("p50", &|s| {
                    sluice_size(s, "sse").map(|c| ms(c.write_to_diff.p50_us))
                }),
                size_series("p95", &|s| {
                    sluice_size(s, "sse").map(|c| ms(c.write_to_diff.p95_us))
                }),
                size_series("p99", &|s| {
                    sluice_size(s, "sse").map(|c| ms(c.write_to_diff.p99_us))
                }),
            ],
        };
        report.chart(
            "size_latency.svg",
            "Sluice write→diff p50/p95/p99 by rows in the view",
            chart.render(),
        );
        if params.sizes.iter().any(|&s| pg_size(s).is_some()) {
            let chart = BarChart {
                title: "write→diff p50 vs rows in the view: Sluice vs PostgreSQL DIY".into(),
                x_label: "rows in the view".into(),
                y_label: "ms".into(),
                categories: size_labels,
                series: vec![
                    size_series("sluice (SSE)", &|s| {
                        sluice_size(s, "sse").map(|c| ms(c.write_to_diff.p50_us))
                    }),
                    size_series("postgres trigger+NOTIFY+re-query", &|s| {
                        pg_size(s).map(|c| ms(c.write_to_diff.p50_us))
                    }),
                ],
            };
            report.chart(
                "size_vs_postgres.svg",
                "write→diff p50 by rows in the view, Sluice vs PostgreSQL",
                chart.render(),
            );
        }
    }
    if !views.is_empty() {
        let labels: Vec<String> = of(Family::Views)
            .map(|c| fmt_rows(c.views.unwrap_or(0)))
            .collect();
        let series = |name: &str, f: &dyn Fn(&Case) -> f64| BarSeries {
            name: name.into(),
            values: of(Family::Views).map(|c| ok(c).then(|| f(c))).collect(),
        };
        let chart = BarChart {
            title: "write→diff latency vs number of registered views (WebSocket)".into(),
            x_label: "scoped views registered".into(),
            y_label: "ms".into(),
            categories: labels.clone(),
            series: vec![
                series("p50", &|c| ms(c.write_to_diff.p50_us)),
                series("p95", &|c| ms(c.write_to_diff.p95_us)),
                series("p99", &|c| ms(c.write_to_diff.p99_us)),
            ],
        };
        report.chart(
            "views_latency.svg",
            "write→diff p50/p95/p99 by number of views",
            chart.render(),
        );
        let chart = BarChart {
            title: "Server memory per idle view (RSS delta and allocator's heap delta / views)"
                .into(),
            x_label: "scoped views registered".into(),
            y_label: "bytes per view".into(),
            categories: labels,
            series: vec![
                series("RSS bytes / view", &|c| {
                    c.memory.as_ref().map_or(0.0, |m| m.bytes_per_view)
                }),
                series("heap bytes / view (allocator)", &|c| {
                    c.memory
                        .as_ref()
                        .and_then(|m| m.alloc_bytes_per_view)
                        .unwrap_or(0.0)
                }),
            ],
        };
        report.chart(
            "views_memory.svg",
            "server RSS per view by number of views",
            chart.render(),
        );
    }
    if of(Family::Shape).any(ok) {
        let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        let series = |name: &str, system: &str, durability: &str, p99: bool| BarSeries {
            name: name.into(),
            values: names
                .iter()
                .map(|n| {
                    shape_case(n, system, durability).map(|c| {
                        ms(if p99 {
                            c.write_to_diff.p99_us
                        } else {
                            c.write_to_diff.p50_us
                        })
                    })
                })
                .collect(),
        };
        let mut s = vec![
            series("sluice p50", "sluice", "memory", false),
            series("sluice p99", "sluice", "memory", true),
        ];
        if of(Family::Shape).any(|c| c.system == "postgres" && ok(c)) {
            s.push(series(
                "postgres p50",
                "postgres",
                "synchronous_commit=off",
                false,
            ));
        }
        let chart = BarChart {
            title: format!(
                "write→diff latency by query shape ({} rows)",
                params.shape_rows
            ),
            x_label: "query shape".into(),
            y_label: "ms".into(),
            categories: names.iter().map(|n| n.to_string()).collect(),
            series: s,
        };
        report.chart(
            "shapes.svg",
            "write→diff by query shape, Sluice vs PostgreSQL",
            chart.render(),
        );
    }

    rules_chart(report, cases);

    // Notes.
    report.notes.push(format!(
        "The machine has {} CPU(s), shared by the server, the bench's clients, PostgreSQL and \
         whatever else ran (other builds and tests may have run concurrently); latencies include \
         scheduling on that shared machine.",
        report.machine().nproc
    ));
    report.notes.push(
        "ack→diff can be negative: Sluice pushes the diff as soon as the commit is applied (and, \
         for the fsync class, synced), which can race the HTTP reply to the writer. \
         \"diff before ack\" counts those samples; values are as measured, never clamped."
            .into(),
    );
    if let Some(c) = of(Family::Size)
        .filter(|c| ok(c) && c.probe_ack_max_ms.is_some())
        .max_by_key(|c| c.size.unwrap_or(0))
    {
        report.notes.push(format!(
            "Subscribing to the {}-row view took {} to the last byte of its snapshot; a write to \
             an unrelated table waited up to {} for its ack meanwhile (the live thread reads the \
             view's rows under the state's read lock; ordering and the snapshot come after).",
            fmt_rows(c.size.unwrap_or(0)),
            fmt_signed_us(c.snapshot_ms.unwrap_or(0.0) * 1e3),
            fmt_signed_us(c.probe_ack_max_ms.unwrap_or(0.0) * 1e3)
        ));
    }
    let resets: usize = cases.iter().map(|c| c.resets).sum();
    let unexpected: usize = cases.iter().map(|c| c.unexpected).sum();
    let timeouts: usize = cases.iter().map(|c| c.timeouts).sum();
    report.notes.push(format!(
        "Across all cases: {timeouts} write(s) got no diff within 10 s, {resets} reset \
         snapshot(s) replaced diffs, {unexpected} unexpected diff(s) (another view or a later \
         seq) arrived while waiting."
    ));
    for c in cases.iter().filter(|c| c.error.is_some()) {
        report.notes.push(format!(
            "FAILED: {}: {}",
            c.label(),
            c.error.as_deref().unwrap_or_default()
        ));
    }
    for c in cases.iter().filter(|c| c.error.is_none() && !c.verify.ok) {
        report.notes.push(format!(
            "DID NOT VERIFY: {}: {}",
            c.label(),
            c.verify.detail
        ));
    }
    crate::harness::standard_notes(report, params.quick);
    report.samples = json!({ "suite": "live", "params": params, "cases": cases });
}

// ---------------------------------------------------------------------------------------
// The rules family.

fn rules_cases(cases: &[Case]) -> impl Iterator<Item = &Case> {
    cases.iter().filter(|c| c.family == Family::Rules)
}

fn rules_targets(report: &mut Report, cases: &[Case]) {
    let done: Vec<&Case> = rules_cases(cases).filter(|c| ok(c)).collect();
    if done.is_empty() {
        return;
    }
    let users = |c: &Case| c.users.unwrap_or(0);
    report.targets.push(Target {
        what: "write→diff p50 under a row policy (`owner = auth.sub`), one WebSocket and token \
               per user (memory class)"
            .into(),
        goal: "< 0.5 ms at every user count".into(),
        measured: done
            .iter()
            .map(|c| {
                format!(
                    "{} users: {} (p99 {})",
                    fmt_rows(users(c)),
                    fmt_signed_us(c.write_to_diff.p50_us),
                    fmt_signed_us(c.write_to_diff.p99_us)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        met: Some(done.iter().all(|c| c.write_to_diff.p50_us < TARGET_P50_US)),
    });
    let fewest = done.iter().min_by_key(|c| users(c)).copied();
    let most = done.iter().max_by_key(|c| users(c)).copied();
    if let (Some(a), Some(b)) = (fewest, most) {
        let ratio = b.write_to_diff.p50_us / a.write_to_diff.p50_us.max(1e-9);
        report.targets.push(Target {
            what: format!(
                "write→diff p50 flat from {} to {} users under the policy (p50 at the most / at \
                 the fewest)",
                fmt_rows(users(a)),
                fmt_rows(users(b))
            ),
            goal: format!("within {TARGET_RULES_FLAT_RATIO}× (from 100 to 10 K users)"),
            measured: format!(
                "{} ({} → {})",
                fmt_ratio(ratio),
                fmt_signed_us(a.write_to_diff.p50_us),
                fmt_signed_us(b.write_to_diff.p50_us)
            ),
            met: (done.len() >= 2).then_some(ratio <= TARGET_RULES_FLAT_RATIO),
        });
    }
    if let Some(c) = most {
        if let Some(r) = &c.rules {
            let m = &r.memory;
            let allowance = TARGET_BYTES_PER_USER + c.view_rows as f64 * ROW_BYTES_ALLOWANCE;
            report.targets.push(Target {
                what: format!(
                    "server memory per subscribed user, {} users of {} rows each (live heap \
                     with every user subscribed − with every user connected, / users)",
                    fmt_rows(users(c)),
                    c.view_rows
                ),
                goal: format!(
                    "< 2 KiB plus its rows ({} B per row: < {allowance:.0} B here)",
                    ROW_BYTES_ALLOWANCE
                ),
                measured: format!(
                    "{}; RSS {:.0} B per user; the user's WebSocket connection itself {}",
                    m.heap_bytes_per_user
                        .map_or("heap not exposed".into(), |b| format!("{b:.0} B heap")),
                    m.rss_bytes_per_user,
                    m.connection_heap_bytes_per_user
                        .map_or("?".into(), |b| format!("{b:.0} B heap"))
                ),
                met: m.heap_bytes_per_user.map(|b| b < allowance),
            });
        }
    }
    let foreign: u64 = done
        .iter()
        .filter_map(|c| c.rules.as_ref())
        .map(|r| r.foreign_diffs)
        .sum();
    let writes: u64 = done
        .iter()
        .filter_map(|c| c.rules.as_ref())
        .map(|r| r.writes)
        .sum();
    report.targets.push(Target {
        what: "foreign diffs: diffs at a user for a write to another user's rows".into(),
        goal: "0".into(),
        measured: format!("{foreign} over {writes} writes"),
        met: Some(foreign == 0),
    });
}

fn rules_table(report: &mut Report, params: &Params, cases: &[Case]) {
    let mut t = table(
        &format!(
            "Latency under a row policy (`CREATE POLICY own ON notes FOR SELECT USING (owner = \
             auth.sub)`; every user subscribes to `{}` with its own token, {} notes each)",
            super::rules::NOTES_VIEW,
            params.notes_per_user
        ),
        &["users"],
        &[
            "connect all",
            "subscribe all",
            "heap B / user (subscription)",
            "heap blocks / user",
            "RSS B / user (subscription)",
            "heap B / user (WebSocket)",
            "live views",
            "foreign diffs",
            "verified",
        ],
    );
    for c in rules_cases(cases) {
        let mut row = vec![c.users.map_or("—".into(), fmt_rows)];
        row.extend(latency_cells(c));
        let r = c.rules.as_ref();
        let m = r.map(|r| &r.memory);
        let n = c.users.unwrap_or(0) as f64;
        row.push(r.map_or("—".into(), |r| {
            format!("{:.2} s ({:.0}/s)", r.connect_s, n / r.connect_s.max(1e-9))
        }));
        row.push(r.map_or("—".into(), |r| {
            format!(
                "{:.2} s ({:.0}/s)",
                r.subscribe_s,
                n / r.subscribe_s.max(1e-9)
            )
        }));
        row.push(
            m.and_then(|m| m.heap_bytes_per_user)
                .map_or("—".into(), |b| format!("{b:.0}")),
        );
        row.push(
            m.and_then(|m| m.heap_blocks_per_user)
                .map_or("—".into(), |b| format!("{b:.1}")),
        );
        row.push(m.map_or("—".into(), |m| format!("{:.0}", m.rss_bytes_per_user)));
        row.push(
            m.and_then(|m| m.connection_heap_bytes_per_user)
                .map_or("—".into(), |b| format!("{b:.0}")),
        );
        row.push(m.map_or("—".into(), |m| format!("{:.0}", m.views_gauge)));
        row.push(r.map_or("—".into(), |r| {
            format!("{} / {} writes", r.foreign_diffs, r.writes)
        }));
        row.push(verified(c));
        t.row(row);
    }
    t.note = Some(format!(
        "The server runs with `--jwt-secret`; each user has its own HS256 client token (`sub` = \
         `user<i>`, minted with `sluice_server::auth::mint_hs256`) and its own WebSocket \
         (JSON), opened {} at a time, and subscribes to the same SQL text; the policy makes it \
         the user's own {TOP_K} newest notes. Each write (admin token, one at a time, after a \
         warm-up) inserts a note with the newest `ts` for one random user; its diff is awaited \
         at that user's subscription. Every diff any user receives is attributed to the write \
         of its seq: foreign diffs are diffs at a user the write was not for (they must be 0; \
         the bench also listens {} ms after the last write and compares each user's own count \
         of diffs with the writes made for it). Memory: server RSS and live heap \
         (`sluice_alloc_bytes`, `--count-allocations`) read 1 s after each step: before the \
         users connect, with every WebSocket open, and with every user subscribed; \
         subscription = (subscribed − connected) / users (the view under the rule, its \
         materialisation, routing entry, subscription queue and forwarding task), WebSocket = \
         (connected − before) / users (an open idle connection: its task and buffers), which a \
         user pays once however many queries it subscribes. Verified: every user's view was \
         materialised, every event checksum matched, no foreign diff, and the written users' \
         views (and 50 others) equal both a one-shot `POST /v1/query` of the same SQL with the \
         user's token and the admin's `{}` with the user's `sub`.",
        super::rules::CONNECT_CONCURRENCY,
        super::rules::LATE_DIFFS_WAIT.as_millis(),
        super::rules::OWN_NOTES
    ));
    if !t.rows.is_empty() {
        report.tables.push(t);
    }
}

fn rules_chart(report: &mut Report, cases: &[Case]) {
    let done: Vec<&Case> = rules_cases(cases).collect();
    if !done.iter().any(|c| ok(c)) {
        return;
    }
    let series = |name: &str, f: &dyn Fn(&Case) -> f64| BarSeries {
        name: name.into(),
        values: done.iter().map(|c| ok(c).then(|| f(c))).collect(),
    };
    let chart = BarChart {
        title: "write→diff latency vs users under a row policy (one WebSocket per user)".into(),
        x_label: "users subscribed, each to its own rows".into(),
        y_label: "ms".into(),
        categories: done
            .iter()
            .map(|c| fmt_rows(c.users.unwrap_or(0)))
            .collect(),
        series: vec![
            series("p50", &|c| ms(c.write_to_diff.p50_us)),
            series("p95", &|c| ms(c.write_to_diff.p95_us)),
            series("p99", &|c| ms(c.write_to_diff.p99_us)),
        ],
    };
    report.chart(
        "rules_latency.svg",
        "write→diff p50/p95/p99 by users under a row policy",
        chart.render(),
    );
}
