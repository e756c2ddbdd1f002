//! In a cluster each commit travels as one NATS message, so `--max-commit-bytes` above
//! what one message carries is refused at startup, naming the limit — before anything is
//! opened or any NATS server asked (the port named here has nothing listening).

mod common;

use common::{Server, TempDir};

#[test]
fn a_commit_limit_above_one_nats_message_is_refused_naming_it() {
    let tmp = TempDir::new("cluster-commit-limit");
    let data = tmp.join("data");
    let args = [
        "--cluster",
        "nats://127.0.0.1:1",
        "--max-commit-bytes",
        "2000000",
    ];
    let (status, stderr) = Server::start_expecting_failure(&data, tmp.path(), &args);
    assert!(!status.success());
    assert!(
        stderr.contains("--max-commit-bytes 2000000 is above 1040384 bytes")
            && stderr.contains("max_payload"),
        "{stderr}"
    );
    assert!(!data.join("log").exists(), "nothing was opened: {stderr}");
}
