//! `sluice bench snapshot --quick` runs end to end — the real binary loaded with rows, a
//! closed-loop writer before, during and after `POST /v1/admin/snapshot` in the `disk` and
//! `fsync` classes, then SIGKILL and a restart — and the restarted server has exactly the
//! rows it had (count and checksum), replaying only the commits after the last snapshot: the
//! snapshot written while writes went on holds the state of its seq; and the snapshot-pacing
//! cases (`--snapshot-log-percent` 0 and 100) run with writes acknowledged. No timing is
//! asserted.

mod common;

#[test]
fn quick_snapshot_taken_under_writes_recovers_the_same_rows() {
    let out = common::bench::run_quick("snapshot", &[], "");
    let samples = common::bench::samples(&out, "snapshot");
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
    // The pacing part: one case per --snapshot-log-percent, each with writes acknowledged.
    let pacing = samples["pacing"].as_array().expect("pacing");
    let percents: Vec<u64> = pacing
        .iter()
        .filter_map(|c| c["percent"].as_u64())
        .collect();
    assert_eq!(percents, [0, 100], "{samples}");
    for c in pacing {
        assert!(c["error"].is_null(), "{c}");
        assert!(c["ack"]["count"].as_u64().unwrap_or(0) > 0, "{c}");
        assert!(c["log_bytes"].as_u64().unwrap_or(0) > 0, "{c}");
    }
}
