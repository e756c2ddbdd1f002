//! The writer thread asks for `Config::writer_nice` (`--writer-nice`) and `/metrics`
//! reports what it got; the threads it starts (snapshot, drop) do not inherit a raised
//! priority. By default it leaves the priority alone.
//!
//! Going below 0 needs privilege: where this process may not (checked by trying on a
//! scratch thread), the writer must run at the process's own nice and the server must
//! still serve. Going above 0 is always allowed.

mod common;

use common::{TempDir, TestDb};
use serde_json::json;
use sluice_server::config::WRITER_NICE_DEFAULT;

/// The raised priority asked for (what the pipelined transfer bench was measured with).
const RAISED: i32 = -5;

/// Whether this process may lower a thread's nice below its own to `nice` (tried on a
/// thread of its own, which ends right after).
fn may_lower_nice_to(nice: i32) -> bool {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_runs_at_its_nice_and_its_helpers_do_not_inherit_it() {
    let own = sluice_sched::nice(0).expect("this thread's nice");
    let expected = if may_lower_nice_to(RAISED) {
        RAISED
    } else {
        own
    };

    let dir = TempDir::new("writer-nice");
    let db = TestDb::open(dir.path(), |c| c.writer_nice = RAISED);
    assert_eq!(db.metric("sluice_writer_nice").await, f64::from(expected));
    assert_eq!(nice_of_the_thread_named("sluice-writer"), expected);
    // Started by the writer thread before it asked: background work stays below it.
    for helper in ["sluice-drop", "sluice-snapshot"] {
        let nice = nice_of_the_thread_named(helper);
        assert!(nice >= own, "{helper} runs at nice {nice} (own {own})");
    }
    // It still commits, whatever it was allowed.
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY)"}).to_string(),
    )
    .await;
    db.post_ok(
        "/v1/mutate",
        &json!({"ops": [{"op": "insert", "table": "t", "row": {"id": 1}}], "durability": "fsync"})
            .to_string(),
    )
    .await;
    db.close().await;

    // By default the writer keeps the process's nice.
    let dir = TempDir::new("writer-nice-default");
    let db = TestDb::open(dir.path(), |_| {});
    assert_eq!(WRITER_NICE_DEFAULT, 0);
    assert_eq!(db.metric("sluice_writer_nice").await, f64::from(own));
    assert_eq!(nice_of_the_thread_named("sluice-writer"), own);
    db.close().await;

    // A nice above the process's own is always granted.
    let dir = TempDir::new("writer-nice-low");
    let db = TestDb::open(dir.path(), |c| c.writer_nice = own + 3);
    assert_eq!(db.metric("sluice_writer_nice").await, f64::from(own + 3));
    assert_eq!(nice_of_the_thread_named("sluice-writer"), own + 3);
    db.close().await;
}
