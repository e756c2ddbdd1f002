//! `sluice bench reads --quick` runs end to end — point reads by key and through an index,
//! in-process, over HTTP and over pipelined WebSocket `get` requests (JSON and
//! MessagePack), with and without a background writer, and the Redis and PostgreSQL peers
//! — and every read returned the row it asked for. No timing is asserted.

use std::process::Command;
use std::time::Instant;

use sluice_bench::sys::TempDir;

#[test]
fn quick_reads_return_the_rows_asked_for_on_every_path() {
    let out = TempDir::new("reads-smoke-results").expect("a temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "reads", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench reads");
    eprintln!(
        "sluice bench reads --quick took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench reads --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "reads") {
        panic!("sluice bench reads --quick: {e:#}");
    }
    let samples: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("reads/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["cases"].as_array().expect("cases");
    // Every Sluice path, both lookups, with and without background writes.
    for path in ["in-process", "HTTP", "WS JSON", "WS MessagePack"] {
        for lookup in ["key", "index"] {
            for background in [false, true] {
                let case = cases.iter().find(|c| {
                    c["path"] == path
                        && c["lookup"] == lookup
                        && (c["background_target"].as_u64().unwrap_or(0) > 0) == background
                });
                let case = case.unwrap_or_else(|| {
                    panic!("no {path} {lookup} case (background {background}) in {samples}")
                });
                assert!(case["reads"].as_u64().unwrap_or(0) > 0, "{case}");
                assert_eq!(case["mismatches"], 0, "{case}");
                if background {
                    assert!(
                        case["background_achieved"].as_f64().unwrap_or(0.0) > 0.0,
                        "the background writer wrote: {case}"
                    );
                }
            }
        }
    }
    for (system, path) in [
        ("redis", "GET"),
        ("redis", "HGETALL"),
        ("postgresql", "prepared SELECT"),
    ] {
        assert!(
            cases
                .iter()
                .any(|c| c["system"] == system && c["path"] == path),
            "no {system} {path} case"
        );
    }
}
