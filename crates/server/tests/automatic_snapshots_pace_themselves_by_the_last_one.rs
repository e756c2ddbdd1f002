//! An automatic snapshot waits for a log of `snapshot_log_percent` of the last snapshot's
//! size, not just `snapshot_log_bytes`: a large state is not snapshotted back to back.
//!
//! One commit builds a ~256 KiB state, which the (tiny) byte interval snapshots at once.
//! Then small commits follow. With the default 100 %, no snapshot comes until their log
//! reaches the snapshot's size, and one comes after it; with 0 % (the byte interval alone)
//! they are snapshotted after a few KiB, as before.

mod common;

use std::time::{Duration, Instant};

use common::{TempDir, TestDb};
use serde_json::json;

const BODY_BYTES: usize = 1024;
const STATE_ROWS: usize = 256;

async fn load_state(db: &TestDb) {
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"}).to_string(),
    )
    .await;
    let ops: Vec<_> = (0..STATE_ROWS)
        .map(|id| json!({"op": "insert", "table": "t", "row": {"id": id, "body": "s".repeat(BODY_BYTES)}}))
        .collect();
    db.post_ok(
        "/v1/mutate",
        &json!({"ops": ops, "durability": "disk"}).to_string(),
    )
    .await;
}

/// One small commit: a row of `BODY_BYTES` upserted (about that much log).
async fn small_commit(db: &TestDb, i: usize) {
    let body = json!({"ops": [{"op": "upsert", "table": "t",
        "row": {"id": i % 8, "body": "u".repeat(BODY_BYTES)}}], "durability": "disk"});
    db.post_ok("/v1/mutate", &body.to_string()).await;
}

async fn wait_for_snapshots(db: &TestDb, at_least: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = db.metric("sluice_snapshots_total").await;
        if n >= at_least {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "{n} snapshots after 20 s, expected {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_commits_after_a_large_snapshot_wait_for_a_log_of_its_size() {
    let dir = TempDir::new("snapshot-pace");
    let db = TestDb::open(dir.path(), |c| {
        c.snapshot_log_bytes = 4096;
        c.snapshot_log_percent = 100;
    });
    load_state(&db).await;
    wait_for_snapshots(&db, 1.0).await;
    let snapshot_bytes = db.metric("sluice_snapshot_bytes").await;
    assert!(
        snapshot_bytes >= (STATE_ROWS * BODY_BYTES) as f64,
        "the state's snapshot is {snapshot_bytes} bytes"
    );

    // Half the snapshot's size of log: 128 commits of ~1 KiB, each of them far past the
    // 4 KiB interval.
    let half = STATE_ROWS / 2;
    for i in 0..half {
        small_commit(&db, i).await;
    }
    // A snapshot offered by the writer would be counted once written: give it the time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.metric("sluice_snapshots_total").await,
        1.0,
        "a snapshot came before the log reached the last snapshot's size"
    );

    // Past the snapshot's size: the next one comes.
    for i in half..STATE_ROWS + 32 {
        small_commit(&db, i).await;
    }
    wait_for_snapshots(&db, 2.0).await;
    assert_eq!(db.metric("sluice_snapshot_failures_total").await, 0.0);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_zero_snapshots_after_the_byte_interval_alone() {
    let dir = TempDir::new("snapshot-pace-zero");
    let db = TestDb::open(dir.path(), |c| {
        c.snapshot_log_bytes = 4096;
        c.snapshot_log_percent = 0;
    });
    load_state(&db).await;
    wait_for_snapshots(&db, 1.0).await;
    for i in 0..STATE_ROWS / 2 {
        small_commit(&db, i).await;
    }
    wait_for_snapshots(&db, 2.0).await;
    db.close().await;
}
