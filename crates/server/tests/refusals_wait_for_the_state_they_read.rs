//! A refusal (`already_exists`, `not_found`, `conflict`, a function's `throw`) decided on
//! state that is not yet durable is answered only once that state is confirmed — like a
//! success. Otherwise a client could be told "already exists" about a row that recovery
//! then does not have. The log's sync is held by a gate the test opens, or fails.

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::{TempDir, TestDb};
use serde_json::Value;
use sluice_log::io::{LogFile, LogFileFactory};

/// Real files whose syncs wait until the gate is opened, or fail once it is broken.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Clone, Copy, Default, PartialEq)]
enum GateState {
    #[default]
    Open,
    Closed,
    Broken,
}

impl Gate {
    fn set(&self, state: GateState) {
        *self.state.lock().unwrap() = state;
        self.changed.notify_all();
    }
}

struct GatedFiles(Arc<Gate>);
struct GatedFile(std::fs::File, Arc<Gate>);

impl LogFile for GatedFile {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(&mut self.0, bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        let mut state = self.1.state.lock().unwrap();
        while *state == GateState::Closed {
            state = self.1.changed.wait(state).unwrap();
        }
        if *state == GateState::Broken {
            return Err(std::io::Error::other("injected fdatasync failure"));
        }
        self.0.sync_data()
    }
}

impl LogFileFactory for GatedFiles {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
        let file = sluice_log::io::open_append_file(path)?;
        Ok(Box::new(GatedFile(file, self.0.clone())))
    }
}

const APP: &str = r#"
export function must_be_new(tx, a) {
  if (tx.get("t", a.id) !== null) throw new Error("taken");
  tx.insert("t", {id: a.id, v: "fn"});
}
"#;

fn open(dir: &TempDir, gate: &Arc<Gate>) -> Arc<TestDb> {
    let gate = gate.clone();
    let db = TestDb::open(dir.path(), move |c| {
        c.log_files = sluice_server::config::LogFiles(Arc::new(GatedFiles(gate)));
        c.functions_source = Some(APP.into());
    });
    Arc::new(db)
}

/// Requests whose refusals read the row that the pending fsync insert of id 1 wrote (and,
/// after these, `GET /v1/tables/t/rows/2` of the row it deleted: `not_found`).
const REFUSED: [(&str, &str, &str); 5] = [
    (
        "/v1/mutate",
        r#"{"ops":[{"op":"insert","table":"t","row":{"id":1,"v":"again"}}],"durability":"memory"}"#,
        "already_exists",
    ),
    (
        "/v1/mutate",
        r#"{"ops":[{"op":"patch","table":"t","id":1,"set":{"v":"x"},"if_version":999999}]}"#,
        "conflict",
    ),
    (
        "/v1/mutate",
        r#"{"ops":[{"op":"delete","table":"t","id":2}],"durability":"memory"}"#,
        "not_found",
    ),
    (
        "/v1/call/must_be_new",
        r#"{"args":{"id":1}}"#,
        "function_error",
    ),
    ("/v1/tables/t/rows/2", "", "not_found"),
];

async fn pending_insert_and_refusals(
    db: &Arc<TestDb>,
    gate: &Arc<Gate>,
) -> (
    tokio::task::JoinHandle<common::Reply>,
    Vec<tokio::task::JoinHandle<common::Reply>>,
) {
    gate.set(GateState::Closed);
    let insert = {
        let db = db.clone();
        tokio::spawn(async move {
            db.post(
                "/v1/mutate",
                r#"{"ops":[{"op":"insert","table":"t","row":{"id":1,"v":"first"}},{"op":"delete","table":"t","id":2}],"durability":"fsync"}"#,
            )
            .await
        })
    };
    // Let the insert apply (its sync now waits at the gate) before the refusals read it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refusals: Vec<_> = REFUSED
        .iter()
        .filter(|(_, body, _)| !body.is_empty())
        .map(|(uri, body, _)| {
            let db = db.clone();
            tokio::spawn(async move { db.post(uri, body.to_string()).await })
        })
        .collect();
    // A read's refusal too: row 2 is gone only in the pending commit.
    let reader = db.clone();
    refusals.push(tokio::spawn(async move {
        reader.get("/v1/tables/t/rows/2").await
    }));
    (insert, refusals)
}

async fn setup(db: &TestDb) {
    db.post_ok(
        "/v1/sql",
        r#"{"sql":"CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"}"#,
    )
    .await;
    db.post_ok(
        "/v1/mutate",
        r#"{"ops":[{"op":"insert","table":"t","row":{"id":2,"v":"old"}}]}"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_answered_only_after_the_state_they_read_is_durable() {
    let dir = TempDir::new("refusals-wait");
    let gate = Arc::new(Gate::default());
    let db = open(&dir, &gate);
    setup(&db).await;
    let (insert, refusals) = pending_insert_and_refusals(&db, &gate).await;
    // While the insert is not durable, no refusal that read it may be answered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!insert.is_finished(), "the fsync insert waits for its sync");
    for (r, (uri, body, _)) in refusals.iter().zip(REFUSED) {
        assert!(
            !r.is_finished(),
            "{uri} {body} was answered before the state it read was durable"
        );
    }
    gate.set(GateState::Open);
    let inserted = insert.await.unwrap();
    assert_eq!(inserted.status, 200, "{}", inserted.text);
    for (r, (uri, body, code)) in refusals.into_iter().zip(REFUSED) {
        let reply = r.await.unwrap();
        assert_eq!(
            reply.json["error"]["code"], code,
            "{uri} {body}: {}",
            reply.text
        );
    }
    let row: Value = db.get_ok("/v1/tables/t/rows/1").await;
    assert_eq!(row["row"]["v"], "first");
    Arc::try_unwrap(db).ok().expect("one owner").close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_that_state_never_becomes_durable_the_refusals_say_so_instead() {
    let dir = TempDir::new("refusals-poisoned");
    let gate = Arc::new(Gate::default());
    let db = open(&dir, &gate);
    setup(&db).await;
    let (insert, refusals) = pending_insert_and_refusals(&db, &gate).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The sync fails: the insert was never durable, so neither "already exists" nor "not
    // found" (both decided on it) may be told; every one of them hears the poisoning.
    gate.set(GateState::Broken);
    let inserted = insert.await.unwrap();
    assert_eq!(
        inserted.json["error"]["code"], "log_poisoned",
        "{}",
        inserted.text
    );
    for (r, (uri, body, _)) in refusals.into_iter().zip(REFUSED) {
        let reply = r.await.unwrap();
        assert_eq!(
            reply.json["error"]["code"], "log_poisoned",
            "{uri} {body}: {}",
            reply.text
        );
    }
}
