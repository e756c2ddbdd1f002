//! `sluice bench ingest --quick` and `sluice bench recovery --quick` run end to end — the
//! real binary as server, PostgreSQL as the ingest peer — and write `summary.md`,
//! `samples.json`, `run.json` and SVG charts with non-zero numbers.
//!
//! PostgreSQL's server binaries (Debian package `postgresql`) are required: without them
//! this test fails and says so, rather than skipping the peer silently.

mod common;

use sluice_bench::peers::postgres::find_bin_dir;
use sluice_bench::sys::TempDir;

#[test]
fn quick_bench_suites_write_complete_results() {
    if let Err(e) = find_bin_dir(None) {
        panic!("{e:#}\n(CI installs the postgresql package; `sluice bench ingest` needs it as its peer)");
    }
    let out = TempDir::new("smoke-results").expect("a temp dir");
    for suite in ["ingest", "recovery"] {
        common::bench::run_quick_into(&out, suite, &[], "");
    }
}
