//! The writer raises its priority to `Config::writer_nice` (`--writer-nice`) only while it
//! has a backlog, and goes back to the process's own once the queue is short; `/metrics`
//! says what it runs at (`sluice_writer_nice`) and how often it was raised.
//!
//! The backlog is real: a server function spins until its time limit holds the writer while
//! hundreds of mutates queue behind it. Going below 0 needs privilege: where this process
//! may not (checked by trying on a scratch thread), the writer must never be raised and
//! must still commit every one of them.

mod common;

use common::{TempDir, TestDb};
use serde_json::json;
use sluice_server::config::WRITER_NICE_DEFAULT;

// The default raises the writer (what the first half of the test checks).
const _: () = assert!(WRITER_NICE_DEFAULT < 0);

/// Mutates queued behind the spinning call: well above the raising bound (256).
const QUEUED: i64 = 600;

const APP: &str = r#"
export function spin(tx, args) {
  for (;;) {}
}
"#;

/// Whether this process may set a thread's nice to `nice` (tried on a thread of its own,
/// which ends right after).
fn may_set_nice_to(nice: i32) -> bool {
    std::thread::spawn(move || sluice_sched::set_nice(nice).is_ok())
        .join()
        .expect("the probe thread")
}

/// The nice value of the one thread named `name`. A new thread names itself as it starts
/// (until then it shows its creator's name), so this waits, up to 10 s, until exactly one
/// thread has the name.
fn nice_of_the_thread_named(name: &str) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let tids = sluice_sched::own_threads_named(&[name]).expect("list this process's threads");
        if let [tid] = tids[..] {
            return sluice_sched::nice(tid).expect("read a thread's nice");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} threads named {name}, not one",
            tids.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Holds the writer in a spinning call while `QUEUED` mutates queue behind it, then waits
/// for all of them and for one more commit on a short queue.
async fn backlog(db: &std::sync::Arc<TestDb>) {
    let spinner = {
        let db = db.clone();
        tokio::spawn(async move { db.post("/v1/call/spin", r#"{"args":{}}"#).await })
    };
    // Let the call reach the writer before the flood (it spins for the whole time limit).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let mut writes = Vec::new();
    for id in 0..QUEUED {
        let db = db.clone();
        writes.push(tokio::spawn(async move {
            let body = json!({"ops": [{"op": "insert", "table": "t", "row": {"id": id}}],
                "durability": "memory"});
            db.post_ok("/v1/mutate", &body.to_string()).await;
        }));
    }
    let spun = spinner.await.expect("the spinning call");
    assert_ne!(
        spun.status, 200,
        "the spinning call ends at its time limit: {}",
        spun.text
    );
    for w in writes {
        w.await.expect("a queued mutate");
    }
    // A round on a short queue: the writer lowers its priority again.
    let body = json!({"ops": [{"op": "insert", "table": "t", "row": {"id": -1}}]});
    db.post_ok("/v1/mutate", &body.to_string()).await;
}

async fn open(name: &str, writer_nice: i32) -> (TempDir, std::sync::Arc<TestDb>) {
    let dir = TempDir::new(name);
    let db = TestDb::open(dir.path(), |c| {
        c.writer_nice = writer_nice;
        c.functions_source = Some(APP.into());
        c.function_limits.time_max = std::time::Duration::from_millis(300);
    });
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY)"}).to_string(),
    )
    .await;
    (dir, std::sync::Arc::new(db))
}

async fn rows(db: &TestDb) -> usize {
    let rows = db.get_ok("/v1/tables/t/rows?limit=10000").await["rows"].clone();
    rows.as_array().expect("rows").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_is_raised_for_a_backlog_and_lowered_after_it() {
    let own = sluice_sched::nice(0).expect("this thread's nice");
    // The default: raised for the backlog where the system allows it.
    let (_dir, db) = open("writer-nice", WRITER_NICE_DEFAULT).await;
    assert_eq!(db.metric("sluice_writer_nice").await, f64::from(own));
    assert_eq!(nice_of_the_thread_named("sluice-writer"), own);
    backlog(&db).await;
    let raised = db.metric("sluice_writer_boosts_total").await;
    if may_set_nice_to(WRITER_NICE_DEFAULT) {
        assert!(
            raised >= 1.0,
            "a backlog of {QUEUED} raised the writer {raised} times"
        );
    } else {
        assert_eq!(
            raised, 0.0,
            "the system refuses the raise, so it never happened"
        );
    }
    assert_eq!(db.metric("sluice_writer_nice").await, f64::from(own));
    assert_eq!(nice_of_the_thread_named("sluice-writer"), own);
    // The drop and snapshot threads, started by the writer, never share its raise.
    for helper in ["sluice-drop", "sluice-snapshot"] {
        let nice = nice_of_the_thread_named(helper);
        assert!(nice >= own, "{helper} runs at nice {nice} (own {own})");
    }
    assert_eq!(
        rows(&db).await,
        QUEUED as usize + 1,
        "every queued mutate committed"
    );
    drop(db);

    // Equal to the process's own: never asked for.
    let (_dir, db) = open("writer-nice-off", own).await;
    backlog(&db).await;
    assert_eq!(db.metric("sluice_writer_boosts_total").await, 0.0);
    assert_eq!(rows(&db).await, QUEUED as usize + 1);
}
