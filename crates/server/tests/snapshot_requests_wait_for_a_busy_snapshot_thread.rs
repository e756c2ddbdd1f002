//! `POST /v1/admin/snapshot` never fails because a snapshot is already being written: a
//! request that arrives while the snapshot thread is busy (with an automatic snapshot or
//! another request's) waits for it and is served by the next one.
//!
//! Eight clients ask for snapshots back to back while eight others write and tiny
//! `snapshot_log_bytes` keeps automatic snapshots running. Every request must get a 200 with
//! a seq at least the one applied before it asked; reopening the directory must show every
//! acknowledged row.

mod common;

use common::{TempDir, TestDb};
use serde_json::json;
use sluice_server::Config;

const WRITERS: i64 = 8;
const WRITES_PER_WRITER: i64 = 60;
const SNAPSHOTTERS: usize = 8;
const SNAPSHOTS_PER_CLIENT: usize = 6;

fn snapshot_often(config: &mut Config) {
    config.snapshot_log_bytes = 2048;
    // The byte interval alone: not paced by the last snapshot's size.
    config.snapshot_log_percent = 0;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_requests_during_a_snapshot_wait_instead_of_failing() {
    let dir = TempDir::new("snapshot-busy");
    let db = std::sync::Arc::new(TestDb::open(dir.path(), snapshot_often));
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"}).to_string(),
    )
    .await;

    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..WRITES_PER_WRITER {
                let id = w * 1_000 + i;
                let body = json!({"ops": [{"op": "insert", "table": "t",
                    "row": {"id": id, "body": "x".repeat(64)}}], "durability": "disk"});
                db.post_ok("/v1/mutate", &body.to_string()).await;
            }
            Vec::new()
        }));
    }
    for _ in 0..SNAPSHOTTERS {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            for _ in 0..SNAPSHOTS_PER_CLIENT {
                let applied_before = db.core.db().seq;
                let reply = db.post("/v1/admin/snapshot", "{}").await;
                assert_eq!(reply.status, 200, "snapshot request: {}", reply.text);
                let seq = reply.json["seq"].as_u64().expect("a seq");
                assert!(
                    seq >= applied_before,
                    "snapshot seq {seq} is older than the state {applied_before} it was asked for at"
                );
                answered.push(seq);
            }
            answered
        }));
    }
    let mut answered = 0;
    for task in tasks {
        answered += task.await.expect("a client task").len();
    }
    assert_eq!(answered, SNAPSHOTTERS * SNAPSHOTS_PER_CLIENT);
    assert!(db.metric("sluice_snapshots_total").await >= 1.0);
    assert_eq!(db.metric("sluice_snapshot_failures_total").await, 0.0);

    let db = std::sync::Arc::into_inner(db).expect("every client is done");
    db.close().await;
    // Old snapshots and segments were deleted in steps; nothing of that is left.
    let names = file_names(dir.path());
    assert!(
        !names.iter().any(|n| n.ends_with(".retired.tmp")),
        "{names:?}"
    );
    let snaps = names.iter().filter(|n| n.ends_with(".snap")).count();
    assert!((1..=2).contains(&snaps), "{names:?}");
    let reopened = TestDb::open(dir.path(), |_| {});
    let page = reopened.get_ok("/v1/tables/t/rows?limit=1000").await;
    let mut ids: Vec<i64> = page["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["row"]["id"].as_i64().expect("an id"))
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<i64> = (0..WRITERS)
        .flat_map(|w| (0..WRITES_PER_WRITER).map(move |i| w * 1_000 + i))
        .collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
    reopened.close().await;
}

fn file_names(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("the data directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// A crash while an old segment or snapshot was being deleted in steps leaves it renamed
/// `<name>.retired.tmp` and shortened: the next start removes it, and reads nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_left_half_deleted_by_a_crash_is_removed_at_start() {
    let dir = TempDir::new("snapshot-retired-left");
    let db = TestDb::open(dir.path(), |_| {});
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY)"}).to_string(),
    )
    .await;
    db.post_ok(
        "/v1/mutate",
        &json!({"ops": [{"op": "insert", "table": "t", "row": {"id": 1}}]}).to_string(),
    )
    .await;
    db.close().await;
    // Garbage under the names a gradual deletion uses (a reader of it would fail).
    let left = [
        "00000000000000000001.log.retired.tmp",
        "snapshot-00000000000000000001.snap.retired.tmp",
    ];
    for name in left {
        std::fs::write(dir.path().join(name), vec![0xAB; 1000]).unwrap();
    }
    let reopened = TestDb::open(dir.path(), |_| {});
    let names = file_names(dir.path());
    for name in left {
        assert!(
            !names.iter().any(|n| n == name),
            "{name} is left: {names:?}"
        );
    }
    let page = reopened.get_ok("/v1/tables/t/rows").await;
    assert_eq!(page["rows"][0]["row"]["id"], 1, "{page}");
    reopened.close().await;
}
