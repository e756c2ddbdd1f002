//! `sluice bench bootstrap --quick` runs end to end — the real binary loaded with 10 K and
//! 100 K rows, `SELECT * FROM events` subscribed over SSE, WebSocket JSON and WebSocket
//! MessagePack on a fresh view each time while a writer keeps writing — and every snapshot
//! the client received held exactly the table's rows and ended with its checksum. No
//! timing is asserted.

use std::process::Command;
use std::time::Instant;

use sluice_bench::sys::TempDir;

#[test]
fn quick_bootstrap_delivers_every_row_over_every_transport() {
    let out = TempDir::new("bootstrap-smoke-results").expect("a temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "bootstrap", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench bootstrap");
    eprintln!(
        "sluice bench bootstrap --quick took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench bootstrap --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "bootstrap") {
        panic!("sluice bench bootstrap --quick: {e:#}");
    }
    let samples: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("bootstrap/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["cases"].as_array().expect("cases");
    for rows in [10_000, 100_000] {
        for transport in ["sse", "ws-json", "ws-msgpack"] {
            let case = cases
                .iter()
                .find(|c| c["rows"] == rows && c["transport"] == transport)
                .unwrap_or_else(|| panic!("no {transport} case at {rows} rows in {samples}"));
            assert_eq!(case["verified"], true, "{case}");
            assert_eq!(case["time_us"].as_array().map(Vec::len), Some(1), "{case}");
        }
    }
}
