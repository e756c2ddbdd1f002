//! Concurrent `fsync` commits share syncs (group commit), while a lone writer still gets
//! one sync per commit. Asserted on the server's own counters, never on time.
//!
//! This relies on `fdatasync` taking real time (commits pile up while one runs), as on any
//! disk; on a tmpfs that makes syncs free, sharing would not be needed.

mod common;

use common::{Api, Server, TempDir};
use serde_json::json;

const WRITERS: u64 = 64;
const COMMITS_PER_WRITER: u64 = 20;
const LONE_COMMITS: u64 = 20;

struct Counters {
    commits: u64,
    syncs: u64,
    synced_commits: u64,
}

async fn counters(api: &Api) -> Counters {
    Counters {
        commits: api.metric("sluice_commits_total").await as u64,
        syncs: api.metric("sluice_log_syncs_total").await as u64,
        synced_commits: api.metric("sluice_log_synced_commits_total").await as u64,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fsync_commits_share_syncs() {
    let root = TempDir::new("group-commit");
    let server = Server::start(&root.join("data"), root.path(), &["--durability", "fsync"]);
    let api = server.api();
    api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL)")
        .await;

    // Alone, every commit waits for a sync of its own: none is acknowledged unsynced.
    let before = counters(&api).await;
    for id in 0..LONE_COMMITS as i64 {
        api.mutate(json!([{"op": "insert", "table": "t", "row": {"id": -1 - id, "writer": -1}}]))
            .await;
    }
    let after = counters(&api).await;
    assert_eq!(after.commits - before.commits, LONE_COMMITS);
    assert_eq!(after.synced_commits - before.synced_commits, LONE_COMMITS);
    assert!(
        after.syncs - before.syncs >= LONE_COMMITS,
        "{} lone fsync commits were acknowledged with only {} syncs",
        LONE_COMMITS,
        after.syncs - before.syncs
    );

    // Together, commits that arrive while a sync runs share the next one.
    let before = counters(&api).await;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                for i in 0..COMMITS_PER_WRITER {
                    let id = (w * COMMITS_PER_WRITER + i) as i64;
                    let body = json!({"ops": [{"op": "insert", "table": "t",
                                               "row": {"id": id, "writer": w}}],
                                      "durability": "fsync"});
                    let (status, resp) = api.post("/v1/mutate", &body).await;
                    assert_eq!(status, 200, "{resp}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    let after = counters(&api).await;
    let commits = after.commits - before.commits;
    let syncs = after.syncs - before.syncs;
    assert_eq!(commits, WRITERS * COMMITS_PER_WRITER);
    assert_eq!(after.synced_commits - before.synced_commits, commits);
    assert!(syncs > 0);
    assert!(
        syncs < commits / 2,
        "{commits} concurrent fsync commits took {syncs} syncs: they do not share syncs"
    );
    eprintln!("{commits} concurrent commits, {syncs} syncs");
    // Whichever way each round synced (inline while syncs are fast, else handed off), the
    // inline ones are a part of all syncs, and the average that chose is published.
    let inline = api.metric("sluice_log_inline_syncs_total").await;
    let recent_s = api.metric("sluice_log_sync_recent_seconds").await;
    assert!(
        inline <= api.metric("sluice_log_syncs_total").await,
        "{inline} inline syncs"
    );
    assert!(
        (0.0..10.0).contains(&recent_s),
        "recent sync latency {recent_s} s"
    );
    eprintln!("{inline} of the syncs inline, recent sync latency {recent_s} s");

    let rows = api.scan_all("t", 10_000).await;
    assert_eq!(
        rows.len() as u64,
        LONE_COMMITS + WRITERS * COMMITS_PER_WRITER
    );
}
