//! `sluice bench transfer --quick` runs end to end — the real binary serving `bank.js`
//! over WebSocket and HTTP, PostgreSQL and SQLite behind the bench's RPC server, both
//! alphas — and writes `summary.md`, `samples.json`, `run.json` and SVG charts in which
//! every target committed transfers and every account's balance is the one the bench
//! expects from the transfers it saw acknowledged, for Sluice also after `kill -9` and a
//! restart. A balance changed behind the bench's back fails the run, naming the account.
//!
//! PostgreSQL's server binaries (Debian package `postgresql`) are required: without them
//! this test fails and says so, rather than skipping the peer silently.

mod common;

use sluice_bench::peers::postgres::find_bin_dir;
use sluice_bench::sys::TempDir;

#[test]
fn quick_transfer_bench_commits_on_every_target_and_verifies_every_balance() {
    if let Err(e) = find_bin_dir(None) {
        panic!("{e:#}\n(CI installs the postgresql package; `sluice bench transfer` needs it as a peer)");
    }
    let out = common::bench::run_quick(
        "transfer",
        &[
            "--accounts",
            "1000",
            "--alpha",
            "0,1.5",
            "--targets",
            "sluice-ws,sluice-http,postgres,sqlite",
        ],
        "",
    );
    let samples = common::bench::samples(&out, "transfer");
    let cases = samples["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4 * 2, "four targets × two alphas");
    let summary = std::fs::read_to_string(out.path().join("transfer/summary.md")).unwrap();
    for c in cases {
        let every = &c["balance"]["every_account"];
        assert_eq!(every["accounts_checked"], 1000, "{c}");
        assert_eq!(every["mismatches"], 0, "{c}");
        assert!(every["acked_transfers"].as_u64().unwrap_or(0) > 0, "{c}");
    }
    for target in ["sluice-ws", "sluice-http"] {
        let restarted: Vec<_> = cases
            .iter()
            .filter(|c| c["target"] == target && !c["restart"].is_null())
            .collect();
        assert_eq!(restarted.len(), 1, "{target}: one restart check");
        let r = &restarted[0]["restart"];
        assert_eq!(r["ok"], true, "{target}: {r}");
        assert_eq!(r["balance"]["every_account"]["accounts_checked"], 1000);
        assert_eq!(r["balance"]["every_account"]["mismatches"], 0);
        assert!(r["ready_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
    for needle in [
        "| system | clients | pipelining | TPS | TPS stddev | p50 ms | p99 ms |",
        "vs postgres",
        "## Verification: every account's balance",
        "accounts, 0 mismatches ✓",
    ] {
        assert!(
            summary.contains(needle),
            "summary.md lacks {needle:?}:\n{summary}"
        );
    }
}

/// A quick 100-account transfer run over `targets` with one hidden test `flag`.
fn quick_run(name: &str, targets: &str, flag: &str) -> (TempDir, std::process::Output) {
    let out = TempDir::new(&format!("transfer-{name}-results")).expect("a temp dir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "transfer",
            "--quick",
            "--accounts",
            "100",
            "--alpha",
            "0",
        ])
        .args(["--targets", targets, flag, "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .output()
        .expect("run sluice bench transfer");
    (out, output)
}

#[test]
fn a_balance_changed_behind_the_benchs_back_fails_the_run_naming_the_account() {
    let (out, output) = quick_run("tamper", "sluice-http", "--tamper-before-restart");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a tampered balance must fail the run:\n{stderr}"
    );
    // The check right after the case passed (the tampering comes later); the one after the
    // restart names the account, what the bench expected and what it read.
    assert!(
        stderr.contains("verified: 100 accounts checked (exact), all balances as expected"),
        "{stderr}"
    );
    assert!(
        stderr.contains("after kill -9 and restart")
            && stderr.contains("1 of 100 accounts wrong: account 0: expected "),
        "{stderr}"
    );
    let samples = common::bench::samples(&out, "transfer");
    let r = &samples["cases"][0]["restart"];
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["balance"]["every_account"]["mismatches"], 1, "{r}");
    assert!(sluice_bench::verify_results(out.path(), "transfer").is_err());
}

#[test]
fn transfers_in_flight_when_the_server_dies_are_resolved_by_the_check_after_restart() {
    let (out, output) = quick_run("kill", "sluice-http,sluice-ws", "--kill-mid-window");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The case fails (its clients lost the server), but every acknowledged transfer is
    // there after the restart and the unknown ones are accounted for exactly.
    assert!(!output.status.success(), "{stderr}");
    let samples = common::bench::samples(&out, "transfer");
    for case in samples["cases"].as_array().expect("cases") {
        assert!(!case["error"].is_null(), "{case}");
        let r = &case["restart"];
        assert_eq!(r["ok"], true, "{r}\n{stderr}");
        let every = &r["balance"]["every_account"];
        assert_eq!(every["accounts_checked"], 100, "{r}");
        assert_eq!(every["mismatches"], 0, "{r}");
        // HTTP: four requests in flight at most, enumerated; WebSocket: 4 × 8, by a flow.
        assert_eq!(every["method"], "exact", "{r}");
        assert!(every["acked_transfers"].as_u64().unwrap_or(0) > 0, "{r}");
        eprintln!(
            "{} after the kill: {} acknowledged, {} unknown, explained by {} of them applied",
            case["target"],
            every["acked_transfers"],
            every["unknown_transfers"],
            every["unknown_applied"]
        );
    }
}
