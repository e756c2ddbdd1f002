//! `sluice bench cluster --quick` runs end to end — a 3-node NATS JetStream cluster, a
//! leader and a follower, `fsync`/`replicated`/`disk` writes, reads over one and two
//! nodes, live views held on one, two and three nodes (every acknowledged write arrives as
//! exactly one diff, each node count holds its views), then kill -9 of the leader and a
//! write accepted by the follower that took over. No timing is asserted.

use std::process::Command;
use std::time::Instant;

use sluice_bench::sys::TempDir;

#[test]
fn quick_cluster_bench_runs_and_fails_over() {
    let out = TempDir::new("cluster-smoke-results").expect("a temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "cluster", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .expect("run sluice bench cluster");
    eprintln!(
        "sluice bench cluster --quick took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench cluster --quick failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), "cluster") {
        panic!("sluice bench cluster --quick: {e:#}");
    }
}
