//! When the whole log is replayed in place of the newest snapshot (it starts at seq 1 and the
//! changelog window would hold all of it anyway), that snapshot is checked after the server
//! is up rather than before. The state never depends on it; what the server keeps does: a
//! damaged one is moved aside (`*.damaged`, counted in `sluice_snapshots_damaged_total`)
//! before the snapshotter next lists the snapshots it keeps, and an intact one stays.

mod common;

use std::path::{Path, PathBuf};

use common::{TempDir, TestDb};
use serde_json::json;

const ROWS: i64 = 40;

/// A directory whose log starts at seq 1, with a snapshot of every row; returns the
/// newest snapshot's path.
async fn build(dir: &Path) -> PathBuf {
    let db = TestDb::open(dir, |_| {});
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"}).to_string(),
    )
    .await;
    for id in 0..ROWS {
        let body = json!({"ops": [{"op": "insert", "table": "t",
            "row": {"id": id, "body": format!("row {id}")}}], "durability": "fsync"});
        db.post_ok("/v1/mutate", &body.to_string()).await;
    }
    db.close().await; // writes the shutdown snapshot
    newest_snapshot(dir).expect("the shutdown wrote a snapshot")
}

fn newest_snapshot(dir: &Path) -> Option<PathBuf> {
    let snapshots = sluice_log::snapshot::list_snapshots(dir).expect("list snapshots");
    snapshots.last().map(|(_, path)| path.clone())
}

/// Flips a bit in the middle of `snapshot` (its checksums no longer hold).
fn damage(snapshot: &Path) {
    let mut bytes = std::fs::read(snapshot).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(snapshot, &bytes).unwrap();
}

async fn row_count(db: &TestDb) -> usize {
    let page = db.get_ok("/v1/tables/t/rows?limit=1000").await;
    page["rows"].as_array().expect("rows").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_moved_aside_and_the_data_stays_whole() {
    let dir = TempDir::new("whole-log-damaged-snapshot");
    let snapshot = build(dir.path()).await;
    damage(&snapshot);

    let db = TestDb::open(dir.path(), |_| {});
    assert_eq!(
        row_count(&db).await,
        ROWS as usize,
        "the whole log built every row"
    );
    // `/metrics` answers once the verdict is in, and then reads as what recovery was in
    // the end: every commit from the log, no snapshot standing in.
    assert_eq!(db.metric("sluice_recovery_whole_log").await, 0.0);
    let seq = db.core.db().seq;
    assert_eq!(db.metric("sluice_recovery_replayed").await, seq as f64);
    // A snapshot request waits for the verdict, so once it is answered the damaged file
    // has been dealt with.
    let reply = db.post("/v1/admin/snapshot", "{}").await;
    assert_eq!(reply.status, 200, "snapshot request: {}", reply.text);
    assert_eq!(db.metric("sluice_snapshots_damaged_total").await, 1.0);
    let mut aside = snapshot.clone().into_os_string();
    aside.push(".damaged");
    assert!(Path::new(&aside).exists(), "moved aside to {aside:?}");
    // Nothing was written since, so the requested snapshot has the damaged one's seq: it
    // was written anew (not skipped as "already on disk") and passes the checks.
    let (seq, path) = sluice_log::snapshot::list_snapshots(dir.path())
        .unwrap()
        .pop()
        .expect("the requested snapshot");
    assert_eq!(path, snapshot);
    let written = sluice_engine::recovery::UncheckedSnapshot { seq, path };
    assert!(
        written.is_intact(),
        "the snapshot written in its place is intact"
    );
    db.close().await;

    // The next start finds only intact snapshots and the same rows.
    let db = TestDb::open(dir.path(), |_| {});
    assert_eq!(row_count(&db).await, ROWS as usize);
    let reply = db.post("/v1/admin/snapshot", "{}").await;
    assert_eq!(reply.status, 200, "snapshot request: {}", reply.text);
    assert_eq!(db.metric("sluice_snapshots_damaged_total").await, 0.0);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intact_snapshot_stays_where_it_is() {
    let dir = TempDir::new("whole-log-intact-snapshot");
    let snapshot = build(dir.path()).await;
    let db = TestDb::open(dir.path(), |_| {});
    assert_eq!(db.metric("sluice_recovery_whole_log").await, 1.0);
    assert_eq!(row_count(&db).await, ROWS as usize);
    let reply = db.post("/v1/admin/snapshot", "{}").await;
    assert_eq!(reply.status, 200, "snapshot request: {}", reply.text);
    assert_eq!(db.metric("sluice_snapshots_damaged_total").await, 0.0);
    assert!(snapshot.exists(), "an intact snapshot is kept");
    db.close().await;
}

/// The check waits for the server to listen (`Core::serving`): until then nothing reads the
/// snapshot, so the damaged file is still where it was; once told, the check runs on its own
/// (nobody waits for the verdict here) and moves it aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_begins_once_the_server_listens() {
    let dir = TempDir::new("whole-log-check-waits-for-serving");
    let snapshot = build(dir.path()).await;
    damage(&snapshot);
    let mut aside = snapshot.clone().into_os_string();
    aside.push(".damaged");
    let aside = PathBuf::from(aside);

    let db = TestDb::open(dir.path(), |_| {});
    // Long enough for a check started at once to have moved this 40-row snapshot aside,
    // well inside the second after which an unserved core checks anyway.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        snapshot.exists() && !aside.exists(),
        "checked before serving"
    );

    db.core.serving();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !aside.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the damaged snapshot was not moved aside within 10 s of serving"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!snapshot.exists());
    assert_eq!(db.metric("sluice_snapshots_damaged_total").await, 1.0);
    db.close().await;
}
