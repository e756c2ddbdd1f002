//! A panic in a critical thread (writer, log, live, snapshot, topics) must never leave a process that
//! answers `/health` ok while it cannot write or read: the process logs the reason and exits
//! with status 70, and a restart recovers every acknowledged commit.
//!
//! Each case starts the real binary with the test-only hook `SLUICE_TEST_PANIC=<thread>`,
//! which makes that thread panic at its first unit of work, makes the thread do some work,
//! and checks the exit, the log line, and — after a restart without the hook — the data.

mod common;

use std::time::Duration;

use common::{Server, TempDir};
use serde_json::json;

const EXIT_THREAD_PANIC: i32 = 70;
/// Generous for a loaded CI machine; the exit itself is immediate.
const EXIT_WITHIN: Duration = Duration::from_secs(20);

async fn panicking_thread_exits(thread: &str) {
    let dir = TempDir::new(&format!("panic-{thread}"));
    let data = dir.join("data");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // Before the hook: a table and an acknowledged row that must survive.
    {
        let server = Server::start(&data, &logs, &[]);
        let api = server.api();
        api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
            .await;
        api.mutate(json!([{"op":"insert","table":"t","row":{"id":1,"v":"before"}}]))
            .await;
        let created = api
            .client
            .put(api.url("/v1/topics/events"))
            .send()
            .await
            .expect("PUT a topic");
        assert_eq!(created.status().as_u16(), 200);
        server.kill9();
    }
    let mut server = Server::start_with_env(&data, &logs, &[], &[("SLUICE_TEST_PANIC", thread)]);
    let api = server.api();
    // Work for every thread: a write (writer, log, live) and a snapshot (snapshot thread).
    let write = api
        .try_post(
            "/v1/mutate",
            &json!({"ops":[{"op":"insert","table":"t","row":{"id":2,"v":"during"}}]}),
        )
        .await;
    // The topics thread's work: an append to route.
    let append = if thread == "topics" {
        Some(
            api.try_post(
                "/v1/topics/events/records",
                &json!({"records": [{"data": "during"}]}),
            )
            .await,
        )
    } else {
        None
    };
    let snapshot = if thread == "snapshot" {
        Some(api.try_post("/v1/admin/snapshot", &json!({})).await)
    } else {
        None
    };
    let status = server.wait_exit(EXIT_WITHIN).unwrap_or_else(|| {
        panic!(
            "the process still runs {EXIT_WITHIN:?} after the {thread} thread panicked (write: {write:?}, append: {append:?}, snapshot: {snapshot:?}):\n{}",
            server.stderr()
        )
    });
    assert_eq!(
        status.code(),
        Some(EXIT_THREAD_PANIC),
        "exit status after a {thread} panic:\n{}",
        server.stderr()
    );
    let stderr = server.stderr();
    assert!(
        stderr.contains(&format!("the {thread} thread panicked")),
        "the reason is logged:\n{stderr}"
    );
    // A successful reply before the exit is an acknowledgement: it must survive.
    let acked_during = matches!(&write, Ok((200, _)));
    drop(server);
    let server = Server::start(&data, &logs, &[]);
    let api = server.api();
    let (status, row) = api.get("/v1/tables/t/rows/1").await;
    assert_eq!(status, 200, "the row acknowledged before the panic: {row}");
    assert_eq!(row["row"]["v"], "before");
    if acked_during {
        let (status, row) = api.get("/v1/tables/t/rows/2").await;
        assert_eq!(status, 200, "the write acknowledged before the exit: {row}");
    }
    if let Some(Ok((200, ok))) = &append {
        let (status, page) = api.get("/v1/topics/events/records").await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            page["records"][0]["data"], "during",
            "the append acknowledged before the exit ({ok}) survives: {page}"
        );
    }
    // And the restarted server works.
    api.mutate(json!([{"op":"upsert","table":"t","row":{"id":3,"v":"after"}}]))
        .await;
    let (status, _) = api.get("/v1/tables/t/rows/3").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_panic_exits_with_status_70_and_loses_nothing_acknowledged() {
    panicking_thread_exits("writer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_thread_panic_exits_with_status_70_and_loses_nothing_acknowledged() {
    panicking_thread_exits("log").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_thread_panic_exits_with_status_70_and_loses_nothing_acknowledged() {
    panicking_thread_exits("live").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_thread_panic_exits_with_status_70_and_loses_nothing_acknowledged() {
    panicking_thread_exits("snapshot").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topics_thread_panic_exits_with_status_70_and_loses_nothing_acknowledged() {
    panicking_thread_exits("topics").await;
}
