//! `sluice bench reads --quick` runs end to end — point reads by key and through an index,
//! in-process, over HTTP and over pipelined WebSocket `get` requests (JSON and
//! MessagePack), with and without a background writer, and the Redis and PostgreSQL peers
//! — and every read returned the row it asked for. No timing is asserted.

mod common;

#[test]
fn quick_reads_return_the_rows_asked_for_on_every_path() {
    let out = common::bench::run_quick("reads", &[], "");
    let samples = common::bench::samples(&out, "reads");
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
