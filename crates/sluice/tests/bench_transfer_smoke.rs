//! `sluice bench transfer --quick` runs end to end — the real binary serving `bank.js`
//! over WebSocket and HTTP, PostgreSQL and SQLite behind the bench's RPC server, both
//! alphas — and writes `summary.md`, `samples.json`, `run.json` and SVG charts in which
//! every target committed transfers and kept the sum of balances.
//!
//! PostgreSQL's server binaries (Debian package `postgresql`) are required: without them
//! this test fails and says so, rather than skipping the peer silently.

use std::process::Command;

use sluice_bench::peers::postgres::find_bin_dir;
use sluice_bench::sys::TempDir;

#[test]
fn quick_transfer_bench_commits_on_every_target_and_keeps_the_balance_sum() {
    if let Err(e) = find_bin_dir(None) {
        panic!("{e:#}\n(CI installs the postgresql package; `sluice bench transfer` needs it as a peer)");
    }
    let out = TempDir::new("transfer-smoke-results").expect("a temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "transfer",
            "--quick",
            "--accounts",
            "1000",
            "--alpha",
            "0,1.5",
            "--targets",
            "sluice-ws,sluice-http,postgres,sqlite",
            "--out",
        ])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench transfer");
    assert!(
        status.success(),
        "sluice bench transfer --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "transfer") {
        panic!("sluice bench transfer --quick: {e:#}");
    }
    let samples: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("transfer/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4 * 2, "four targets × two alphas");
    let summary = std::fs::read_to_string(out.path().join("transfer/summary.md")).unwrap();
    for needle in [
        "| system | clients | pipelining | TPS | TPS stddev | p50 ms | p99 ms |",
        "vs postgres",
    ] {
        assert!(
            summary.contains(needle),
            "summary.md lacks {needle:?}:\n{summary}"
        );
    }
}
