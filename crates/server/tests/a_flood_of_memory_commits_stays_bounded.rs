//! A writer flooded with `memory`-class commits (acknowledged before they are logged)
//! faster than a slow disk takes them: the log's pending bytes stay under
//! `--log-pending-bytes` (the writer waits — back-pressure — instead of buffering without
//! bound), `/metrics` shows it, and every acknowledged commit is still logged.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{TempDir, TestDb};
use sluice_log::io::{LogFile, LogFileFactory};

/// Real files whose every append takes a while: a disk slower than the writer.
struct SlowFiles(Duration);
struct SlowFile(std::fs::File, Duration);

impl LogFile for SlowFile {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        std::thread::sleep(self.1);
        std::io::Write::write_all(&mut self.0, bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

impl LogFileFactory for SlowFiles {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
        let file = sluice_log::io::open_append_file(path)?;
        Ok(Box::new(SlowFile(file, self.0)))
    }
}

const PENDING_MAX: usize = 16 << 10;
const CLIENTS: usize = 16;
const COMMITS_PER_CLIENT: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_commits_faster_than_the_disk_wait_for_it_and_are_all_logged() {
    let dir = TempDir::new("flood");
    let configure = |c: &mut sluice_server::Config| {
        c.log_pending_bytes_max = PENDING_MAX;
        c.log_files =
            sluice_server::config::LogFiles(Arc::new(SlowFiles(Duration::from_millis(10))));
        c.live.handoff_commits_max = 8;
    };
    let db = Arc::new(TestDb::open(dir.path(), configure));
    db.post_ok(
        "/v1/sql",
        r#"{"sql":"CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"}"#,
    )
    .await;
    let body = "z".repeat(200);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (db, body) = (db.clone(), body.clone());
            tokio::spawn(async move {
                for i in 0..COMMITS_PER_CLIENT {
                    let id = c * COMMITS_PER_CLIENT + i;
                    let request = format!(
                        r#"{{"ops":[{{"op":"insert","table":"t","row":{{"id":{id},"body":"{body}"}}}}],"durability":"memory"}}"#
                    );
                    db.post_ok("/v1/mutate", &request).await;
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let peak = db.metric("sluice_log_pending_bytes_peak").await as usize;
    let waits = db.metric("sluice_log_submit_waits").await;
    assert_eq!(
        db.metric("sluice_log_pending_bytes_max").await as usize,
        PENDING_MAX
    );
    assert!(
        peak <= PENDING_MAX,
        "pending bytes peaked at {peak}, above the bound of {PENDING_MAX}"
    );
    assert!(
        waits > 0.0,
        "the writer never had to wait for the slow disk (peak {peak} bytes)"
    );
    // The live hand-off's bound holds too: at most one writer round above it.
    let handoff_peak = db.metric("sluice_live_handoff_commits_peak").await;
    assert!(handoff_peak >= 1.0);
    assert_eq!(db.metric("sluice_live_handoff_commits_max").await, 8.0);

    // Every acknowledged commit is in the log: reopen (replaying it) and count.
    let db = Arc::try_unwrap(db).ok().expect("one owner");
    db.close().await;
    let db = TestDb::open(dir.path(), configure);
    let total = CLIENTS * COMMITS_PER_CLIENT;
    let mut seen = 0;
    let mut after = None::<u64>;
    loop {
        let uri = match after {
            Some(a) => format!("/v1/tables/t/rows?limit=1000&after={a}"),
            None => "/v1/tables/t/rows?limit=1000".to_string(),
        };
        let page = db.get_ok(&uri).await;
        seen += page["rows"].as_array().unwrap().len();
        match page["next"].as_u64() {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(
        seen, total,
        "every acknowledged commit survived the restart"
    );
    db.close().await;
}
