//! The writer holds the database lock for a whole round, and a round can last as long as a
//! server function's time limit. A mutate decoded on its request task reads table schemas
//! from a cache; when the cache misses (the first mutate after a `CREATE TABLE`), it must not
//! wait for the lock on the runtime's worker thread, or a few such mutates stop every other
//! request (`/health` included) until the function ends. It takes the general path instead
//! and queues behind the function like any write. A point read cannot go around the round
//! (it reads the state), but it waits for it off the runtime's workers (`Core::db`), so the
//! same goes for reads.

mod common;

use common::{TempDir, TestDb};
use serde_json::json;
use std::time::{Duration, Instant};

const APP: &str = r#"
export function spin(tx, args) {
  for (;;) {}
}
"#;

/// How long the spinning call holds the writer (its time limit).
const SPIN: Duration = Duration::from_millis(2000);

type Db = std::sync::Arc<TestDb>;

/// A server with the spinning function and an empty table `t`.
async fn open(dir: &TempDir) -> Db {
    let db = std::sync::Arc::new(TestDb::open(dir.path(), |c| {
        c.functions_source = Some(APP.into());
        c.function_limits.time_max = SPIN;
    }));
    db.post_ok(
        "/v1/sql",
        &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY)"}).to_string(),
    )
    .await;
    db
}

/// Starts the spinning call, then 8 requests made by `request` (more than the runtime's
/// worker threads), then `/health` from a worker thread as a client's request is: `/health`
/// must answer while the call still runs. Returns the 8 requests' tasks.
async fn health_answers_behind<T, F>(
    db: &Db,
    request: impl Fn(Db, i64) -> F,
) -> Vec<tokio::task::JoinHandle<T>>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let started = Instant::now();
    let spinner = {
        let db = db.clone();
        tokio::spawn(async move { db.post("/v1/call/spin", r#"{"args":{}}"#).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting: Vec<_> = (0..8)
        .map(|i| tokio::spawn(request(db.clone(), i)))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let health = {
        let db = db.clone();
        tokio::spawn(async move { db.get("/health").await })
    };
    let health = health.await.expect("the health request");
    let answered_after = started.elapsed();
    assert_eq!(health.status, 200, "{}", health.text);
    assert!(
        !spinner.is_finished() && answered_after < SPIN * 3 / 4,
        "/health answered {answered_after:?} after a {SPIN:?} call started, not while it ran"
    );
    let spun = spinner.await.expect("the spinning call");
    assert_eq!(spun.status, 413, "{}", spun.text);
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_mutates_on_a_new_table_queue_behind_a_spinning_call() {
    let dir = TempDir::new("request-threads");
    // No mutate runs before the spin: the schema cache does not know the table yet, so
    // every mutate below is a cache miss.
    let db = open(&dir).await;
    let writes = health_answers_behind(&db, |db, id| async move {
        let body = json!({"ops": [{"op": "insert", "table": "t", "row": {"id": id}}]});
        db.post_ok("/v1/mutate", &body.to_string()).await;
    })
    .await;
    for w in writes {
        w.await.expect("a queued mutate");
    }
    let rows = db.get_ok("/v1/tables/t/rows").await["rows"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(8), "{rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_point_reads_wait_for_a_spinning_call() {
    let dir = TempDir::new("request-threads-reads");
    let db = open(&dir).await;
    let body = json!({"ops": [{"op": "insert", "table": "t", "row": {"id": 1}}]});
    db.post_ok("/v1/mutate", &body.to_string()).await;
    // Each waits for the writer's round.
    let reads = health_answers_behind(&db, |db, _| async move {
        db.get_ok("/v1/tables/t/rows/1").await
    })
    .await;
    for r in reads {
        let row = r.await.expect("a point read");
        assert_eq!(row["row"]["id"], 1, "{row}");
    }
}
