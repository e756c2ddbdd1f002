//! A function that runs too long or allocates too much is stopped with a `limit` error
//! naming the flag that bounds it, and keeps none of its writes; the server keeps serving.
//! A throw reaches the caller as `function_error` with the thrown message; an unknown
//! function is `not_found`. All over HTTP, against the real binary.

mod common;

use std::time::{Duration, Instant};

use common::{Api, Server, TempDir};
use serde_json::{json, Value};

const TIME_MS: &str = "100";
const MEMORY_BYTES: &str = "4194304";
/// A stopped call must be answered within this long (the limit is 100 ms; this is slack
/// for a debug build on a busy machine, not a tolerance of the limit).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

const CREATE: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, note TEXT)";

/// Every function writes a row first, so a kept write would show.
const MODULE: &str = r#"
export function spin(tx, { id }) {
  tx.insert("t", { id, note: "spin" });
  for (;;) {}
}
export function spin_in_host(tx, { id }) {
  tx.insert("t", { id, note: "spin_in_host" });
  for (;;) tx.get("t", id);
}
export function hog(tx, { id }) {
  tx.insert("t", { id, note: "hog" });
  const a = [];
  for (;;) a.push(new Array(100000).fill(1));
}
export function hog_string(tx, { id }) {
  tx.insert("t", { id, note: "hog_string" });
  const a = [];
  for (let i = 0; ; i++) a.push("x".repeat(1000) + i);
}
export function hog_objects(tx, { id }) {
  tx.insert("t", { id, note: "hog_objects" });
  const a = [];
  for (let i = 0; ; i++) a.push({ i, s: "y" + i });
}
export function fail(tx, { id }) {
  tx.insert("t", { id, note: "fail" });
  throw new Error(`refused on purpose: custom message ${id}`);
}
export function put(tx, { id }) {
  tx.insert("t", { id, note: "put" });
  return { stored: id };
}
"#;

struct Fixture {
    _root: TempDir,
    _server: Server,
    api: Api,
}

async fn start() -> Fixture {
    let root = TempDir::new("limits");
    let module = root.join("app.js");
    std::fs::write(&module, MODULE).unwrap();
    let server = Server::start(
        &root.join("data"),
        root.path(),
        &[
            "--functions",
            module.to_str().unwrap(),
            "--function-time-ms",
            TIME_MS,
            "--function-memory-bytes",
            MEMORY_BYTES,
        ],
    );
    let api = server.api();
    api.sql(CREATE).await;
    Fixture {
        _root: root,
        _server: server,
        api,
    }
}

/// Calls `name` (which inserts row `id` first) expecting `status`/`code`, a message that
/// contains `needle`, no row `id` afterwards and an unchanged seq. Returns the reply and
/// how long the call took.
async fn refused(
    api: &Api,
    name: &str,
    id: u64,
    status: u16,
    code: &str,
    needle: &str,
) -> (Value, Duration) {
    let seq = api.health_seq().await;
    let started = Instant::now();
    let (got_status, body) = api.call(name, &json!({"id": id})).await;
    let took = started.elapsed();
    assert_eq!(
        (got_status, body["error"]["code"].as_str()),
        (status, Some(code)),
        "{name}: {body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(needle),
        "{name}: the message should contain {needle:?}: {body}"
    );
    assert!(took < ANSWER_WITHIN, "{name} was answered after {took:?}");
    let (row_status, row) = api.get(&format!("/v1/tables/t/rows/{id}")).await;
    assert_eq!(row_status, 404, "{name} kept its write: {row}");
    assert_eq!(api.health_seq().await, seq, "{name} moved the seq");
    (body, took)
}

async fn works(api: &Api, id: u64) {
    let (status, body) = api.call("put", &json!({"id": id})).await;
    assert_eq!(status, 200, "put {id}: {body}");
    assert_eq!(body["result"], json!({"stored": id}), "{body}");
    let row = api.get_ok(&format!("/v1/tables/t/rows/{id}")).await;
    assert_eq!(row["row"]["note"], "put", "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_over_its_time_limit_is_stopped_and_named() {
    let f = start().await;
    for (i, name) in ["spin", "spin_in_host", "spin"].iter().enumerate() {
        let (body, took) =
            refused(&f.api, name, i as u64, 413, "limit", "--function-time-ms").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(TIME_MS),
            "{name}: the limit's value: {body}"
        );
        // It ran for its whole allowance before it was stopped.
        assert!(
            took >= Duration::from_millis(100),
            "{name} was stopped after only {took:?}"
        );
        works(&f.api, 100 + i as u64).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_over_its_memory_limit_is_stopped_and_named() {
    refused_for_memory(&["hog", "hog", "hog"]).await;
}

/// Calls each function in turn: each must be refused naming `--function-memory-bytes` and
/// its value, and the next ordinary call must still work.
async fn refused_for_memory(names: &[&str]) {
    let f = start().await;
    for (i, name) in names.iter().enumerate() {
        let (body, _) = refused(
            &f.api,
            name,
            i as u64,
            413,
            "limit",
            "--function-memory-bytes",
        )
        .await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(MEMORY_BYTES),
            "{name}: the limit's value: {body}"
        );
        works(&f.api, 100 + i as u64).await;
    }
}

/// Heaps exhausted by many small allocations (objects, short strings) rather than a few big
/// arrays: QuickJS then cannot even allocate its "out of memory" error, and what is thrown
/// is `null`. That is still the memory limit, and must be named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known limitation: QuickJS throws a bare null when it cannot allocate its out-of-memory \
            error, indistinguishable from `throw null`, and the heap is freed before the runtime can \
            be asked; reported as function_error \"null\" today"]
async fn many_small_allocations_over_the_memory_limit_are_named_too() {
    refused_for_memory(&[
        "hog_objects",
        "hog_string",
        "hog",
        "hog_string",
        "hog_objects",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throw_is_a_function_error_and_an_unknown_function_is_not_found() {
    let f = start().await;
    let (body, _) = refused(
        &f.api,
        "fail",
        42,
        400,
        "function_error",
        "refused on purpose: custom message 42",
    )
    .await;
    assert_eq!(
        body["error"]["message"], "refused on purpose: custom message 42",
        "the message is the thrown message: {body}"
    );
    let seq = f.api.health_seq().await;
    let (status, body) = f.api.call("no_such_function", &json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no_such_function"),
        "the message names the function: {body}"
    );
    assert_eq!(f.api.health_seq().await, seq);
    works(&f.api, 1).await;
}
