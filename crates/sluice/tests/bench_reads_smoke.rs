//! `sluice bench reads --quick` runs end to end — point reads by key and through an index,
//! in-process, over HTTP and over pipelined WebSocket `get` requests (JSON and
//! MessagePack), with and without a background writer, and the Redis and PostgreSQL peers
//! — and the batched cases (WebSocket `get` by `keys`, Redis `MGET`), and every read
//! returned the row it asked for. No timing is asserted.

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
    // The batched get by keys, with and without background writes; rows are counted as
    // reads, so a case reads at least one whole batch.
    for background in [false, true] {
        let case = cases
            .iter()
            .find(|c| {
                c["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("WS MessagePack batched get ("))
                    && (c["background_target"].as_u64().unwrap_or(0) > 0) == background
            })
            .unwrap_or_else(|| panic!("no batched case (background {background}) in {samples}"));
        assert!(case["error"].is_null(), "{case}");
        assert!(case["reads"].as_u64().unwrap_or(0) >= 20, "{case}");
        assert_eq!(case["mismatches"], 0, "{case}");
    }
    let mget = cases
        .iter()
        .find(|c| {
            c["system"] == "redis" && c["path"].as_str().is_some_and(|p| p.starts_with("MGET ("))
        })
        .unwrap_or_else(|| panic!("no redis MGET case in {samples}"));
    assert_eq!(mget["mismatches"], 0, "{mget}");
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
