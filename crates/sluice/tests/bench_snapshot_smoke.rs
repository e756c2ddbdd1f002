//! `sluice bench snapshot --quick` runs end to end — the real binary loaded with rows, a
//! closed-loop writer before, during and after `POST /v1/admin/snapshot` in the `disk` and
//! `fsync` classes, then SIGKILL and a restart — and the restarted server has exactly the
//! rows it had (count and checksum), replaying only the commits after the last snapshot: the
//! snapshot written while writes went on holds the state of its seq. No timing is asserted.

use std::process::Command;
use std::time::Instant;

use sluice_bench::sys::TempDir;

#[test]
fn quick_snapshot_taken_under_writes_recovers_the_same_rows() {
    let out = TempDir::new("snapshot-smoke-results").expect("a temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "snapshot", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench snapshot");
    eprintln!(
        "sluice bench snapshot --quick took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench snapshot --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "snapshot") {
        panic!("sluice bench snapshot --quick: {e:#}");
    }
    let samples: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("snapshot/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["ack_cases"].as_array().expect("ack_cases");
    for class in ["disk", "fsync"] {
        let case = cases
            .iter()
            .find(|c| c["class"] == class)
            .unwrap_or_else(|| panic!("no {class} case in {samples}"));
        assert!(case["snapshot_bytes"].as_u64().unwrap_or(0) > 0, "{case}");
        assert!(
            case["after"]["ack"]["count"].as_u64().unwrap_or(0) > 0,
            "{case}"
        );
    }
    let recovered = &samples["recovered"];
    assert_eq!(recovered["ok"], true, "{recovered}");
    assert_eq!(recovered["rows"], 20_000, "{recovered}");
    assert!(!samples["maps"].as_array().expect("maps").is_empty());
}
