//! `sluice bench bootstrap --quick` runs end to end — the real binary loaded with 10 K and
//! 100 K rows, `SELECT * FROM events` subscribed over SSE, WebSocket JSON and WebSocket
//! MessagePack on a fresh view each time while a writer keeps writing — and every snapshot
//! the client received held exactly the table's rows and ended with its checksum. No
//! timing is asserted.

mod common;

#[test]
fn quick_bootstrap_delivers_every_row_over_every_transport() {
    let out = common::bench::run_quick("bootstrap", &[], "");
    let samples = common::bench::samples(&out, "bootstrap");
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
