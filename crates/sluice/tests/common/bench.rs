//! Running a `sluice bench` suite from a smoke test.

use std::process::Command;
use std::time::Instant;

use sluice_bench::sys::TempDir;

/// Runs `sluice bench <suite> --quick <args…> --out <a temp dir>` with this build as the
/// server binary, asserts it succeeded and that its results are complete
/// (`sluice_bench::verify_results`), and returns the results dir (`<dir>/<suite>/…`).
/// `what` names the run in failures (e.g. the seed it used).
pub fn run_quick(suite: &str, args: &[&str], what: &str) -> TempDir {
    let out = TempDir::new(&format!("{suite}-smoke-results")).expect("a temp dir");
    run_quick_into(&out, suite, args, what);
    out
}

/// [`run_quick`] into an existing results dir (several suites sharing one).
pub fn run_quick_into(out: &TempDir, suite: &str, args: &[&str], what: &str) {
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", suite, "--quick"])
        .args(args)
        .arg("--out")
        .arg(out.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .status()
        .unwrap_or_else(|e| panic!("run sluice bench {suite}: {e}"));
    eprintln!(
        "sluice bench {suite} --quick {what} took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "sluice bench {suite} --quick {what} failed: {status}"
    );
    if let Err(e) = sluice_bench::verify_results(out.path(), suite) {
        panic!("sluice bench {suite} --quick {what}: {e:#}");
    }
}

/// The suite's `samples.json` in a results dir.
pub fn samples(out: &TempDir, suite: &str) -> serde_json::Value {
    let path = out.path().join(suite).join("samples.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}
