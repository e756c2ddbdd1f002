//! `sluice bench fanout --quick` runs end to end — the real binary with 20 topic watchers
//! over SSE and over WebSocket, Redis pub/sub and Redis Streams readers as peers — and every
//! watcher received exactly the records addressed to it, each once, in order (one tag for
//! all, and each watcher on its own tag with records addressed to random subsets). No
//! timing is asserted.
//!
//! `redis-server` (Debian package `redis-server`) is required: without it this test fails
//! and says so, rather than skipping the peer silently.

mod common;

#[test]
fn quick_fanout_delivers_exactly_the_matching_records_in_order_to_every_watcher() {
    if let Err(e) = sluice_bench::peers::redis::find_bin() {
        panic!("{e:#}\n(scripts/test.sh installs redis-server; `sluice bench fanout` needs it as its peer)");
    }
    let out = common::bench::run_quick("fanout", &["--seed", "7"], "(seed 7)");
    let samples = common::bench::samples(&out, "fanout");
    let cases = samples["cases"].as_array().expect("cases");
    for transport in ["sse", "ws", "redis-pub-sub", "redis-streams"] {
        for filter in ["one-tag", "own-tag"] {
            let case = cases
                .iter()
                .find(|c| c["transport"] == transport && c["filter"] == filter)
                .unwrap_or_else(|| panic!("no {transport} {filter} case in {samples}"));
            assert_eq!(case["verified"], true, "{case}");
            assert_eq!(case["watchers"], 20, "{case}");
            assert!(case["sat_records"].as_u64().unwrap_or(0) > 0, "{case}");
        }
    }
    let csv = std::fs::read_to_string(out.path().join("fanout/samples.csv")).expect("samples.csv");
    assert_eq!(csv.lines().count(), 1 + cases.len(), "{csv}");
}
