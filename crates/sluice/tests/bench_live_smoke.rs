//! `sluice bench live --quick` runs end to end — the real binary serving live queries over
//! SSE and WebSocket, with PostgreSQL's trigger + LISTEN/NOTIFY + re-query as the peer when
//! it is installed — and writes `summary.md`, `samples.json`, `run.json` and SVG charts in
//! which every case took samples and verified its own numbers: each subscriber's recomputed
//! checksum matched the server's on every event, and its final view matched a one-shot
//! query (rows and checksum, or the row count). Memory per view is reported from RSS and
//! from the server allocator's own counters. The rules family runs too: users with their
//! own client tokens under a row policy, none receiving a diff of another user's write.

use std::process::Command;
use std::time::Instant;

use sluice_bench::peers::postgres::find_bin_dir;
use sluice_bench::sys::TempDir;

#[test]
fn quick_live_bench_samples_and_verifies_every_case() {
    let with_postgres = find_bin_dir(None).is_ok();
    let out = TempDir::new("live-smoke-results").expect("a temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "live", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench live");
    eprintln!(
        "sluice bench live --quick took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench live --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "live") {
        panic!("sluice bench live --quick: {e:#}");
    }
    let samples: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("live/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["cases"].as_array().expect("cases");
    let count = |family: &str, system: &str| {
        cases
            .iter()
            .filter(|c| c["family"] == family && c["system"] == system)
            .count()
    };
    // --quick: two view sizes (one also over WebSocket), two view counts, six shapes plus
    // the fsync top-k.
    assert_eq!(count("size", "sluice"), 3, "view-size cases");
    assert_eq!(count("views", "sluice"), 2, "number-of-views cases");
    assert_eq!(count("shape", "sluice"), 7, "shape cases");
    // --quick: one case of 20 users under the row policy.
    assert_eq!(count("rules", "sluice"), 1, "rules cases");
    if with_postgres {
        assert_eq!(count("size", "postgres"), 2, "PostgreSQL view-size cases");
        assert_eq!(count("shape", "postgres"), 7, "PostgreSQL shape cases");
    }
    for c in cases {
        assert!(
            c["samples"].as_u64().unwrap_or(0) > 0,
            "a case without samples: {c}"
        );
        assert_eq!(c["verify"]["ok"], true, "a case that did not verify: {c}");
        if c["system"] == "sluice" {
            let checked = c["verify"]["checksums_checked"].as_u64().unwrap_or(0);
            assert!(
                checked > c["samples"].as_u64().unwrap_or(0),
                "every diff's checksum was compared: {c}"
            );
            assert_eq!(c["verify"]["checksum_mismatches"], 0, "{c}");
            assert_eq!(
                c["verify"]["rows_seen"], c["verify"]["rows_expected"],
                "the subscriber's rows equal the one-shot query's: {c}"
            );
        }
    }
    for c in cases.iter().filter(|c| c["family"] == "rules") {
        let r = &c["rules"];
        assert_eq!(r["users"], 20, "{c}");
        assert_eq!(
            r["foreign_diffs"], 0,
            "no user receives a diff of another user's write: {c}"
        );
        assert!(
            r["own_diffs"].as_u64().unwrap_or(0) >= c["samples"].as_u64().unwrap_or(u64::MAX),
            "every sampled write's diff reached its user: {c}"
        );
        assert_eq!(
            r["memory"]["views_gauge"], 20.0,
            "one view per user (their claims differ): {c}"
        );
        assert!(
            r["memory"]["heap_bytes_per_user"].as_f64().unwrap_or(0.0) > 0.0,
            "memory per user from the server allocator's counters: {c}"
        );
    }
    for c in cases.iter().filter(|c| c["family"] == "views") {
        let m = &c["memory"];
        assert!(
            m["rss_subscribed"].as_u64().unwrap_or(0) > 0,
            "RSS was read: {c}"
        );
        // The allocator's own count: exact, so positive even for a handful of views (RSS
        // per view can be negative there).
        assert!(
            m["alloc_bytes_per_view"].as_f64().unwrap_or(0.0) > 0.0
                && m["alloc_blocks_per_view"].as_f64().unwrap_or(0.0) > 0.0,
            "memory per view from the server allocator's counters: {c}"
        );
        assert_eq!(
            m["views_gauge"].as_f64(),
            c["views"].as_f64(),
            "every view registered: {c}"
        );
    }
    let summary = std::fs::read_to_string(out.path().join("live/summary.md")).unwrap();
    for needle in [
        "## Targets",
        "Latency vs rows in the view",
        "Latency and memory vs number of registered views",
        "heap bytes / view (allocator)",
        "Latency by query shape",
        "write→diff p50",
        "ack→diff p50",
        "Latency under a row policy",
        "foreign diffs",
    ] {
        assert!(
            summary.contains(needle),
            "summary.md lacks {needle:?}:\n{summary}"
        );
    }
    if with_postgres {
        assert!(
            summary.contains("Sluice vs PostgreSQL by view size"),
            "{summary}"
        );
    }
}

/// `sluice bench live --quick --families load,million,coalesce` runs end to end and writes
/// `live-load/` in which every case verified: under open-loop load every acknowledged
/// write's diff reached its room's subscriber, and each coalescing subscriber's view equals
/// a one-shot query, with fewer diffs than commits once a window is open. Correctness only,
/// never a timing.
#[test]
fn quick_load_families_verify_every_write_and_fold_hot_rows() {
    let out = TempDir::new("live-load-smoke-results").expect("a temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "live",
            "--quick",
            "--families",
            "load,million,coalesce",
            "--out",
        ])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench live");
    assert!(
        status.success(),
        "sluice bench live (load families) failed: {status}"
    );
    let dir = out.path().join("live-load");
    assert!(dir.join("summary.md").is_file());
    let samples: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("samples.json")).expect("samples.json"))
            .expect("samples.json is JSON");
    sluice_bench::live::load::verify_samples(&samples).expect("every case verified");
    let load = samples["load"].as_array().expect("load cases");
    assert_eq!(
        load.len(),
        2,
        "one load rate and the million sweep: {load:?}"
    );
    for c in load {
        assert!(c["writes_acked"].as_u64().unwrap_or(0) > 0, "{c}");
        assert_eq!(c["writes_acked"], c["diffs"], "a diff per write: {c}");
        // The pacer reports how late the client sent the measured writes.
        assert!(c["sent_late"]["n"].as_u64().unwrap_or(0) > 0, "{c}");
    }
    let coalesce = samples["coalesce"].as_array().expect("coalesce cases");
    assert_eq!(coalesce.len(), 3, "windows 0, 10 and 100 ms");
    let diffs = |ms: u64| {
        coalesce
            .iter()
            .find(|c| c["coalesce_ms"] == ms)
            .and_then(|c| c["diffs"].as_u64())
            .expect("a case per window")
    };
    assert_eq!(
        diffs(0),
        coalesce[0]["commits"].as_u64().unwrap(),
        "no window: a diff per commit"
    );
    assert!(diffs(100) < diffs(0), "a 100 ms window folds commits");
}
