//! A transaction whose commit would not fit the log is refused while it is built — over
//! HTTP, over the WebSocket and as one huge mutate — with code `limit` naming
//! `--max-commit-bytes`; nothing changes, and the writer goes on serving writes and reads.
//! (Before this limit existed, the issue's reproduction panicked the writer thread.)

mod common;

use common::{TempDir, TestDb};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const APP: &str = r#"
export function big(tx, a) {
  const s = "x".repeat(a.n);
  for (let i = 0; i < a.rows; i++) tx.upsert("t", {id: i, body: s});
}
// Catches the refusal and carries on: the call must still fail, and write nothing.
export function sneaky(tx, a) {
  const s = "x".repeat(a.n);
  let refused = 0;
  for (let i = 0; i < a.rows; i++) {
    try { tx.upsert("t", {id: i, body: s}); } catch (e) { refused++; }
  }
  return refused;
}
"#;

fn assert_names_the_limit(error: &Value) {
    assert_eq!(error["code"], "limit", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("--max-commit-bytes"), "{message}");
}

async fn state(db: &TestDb) -> (Value, Value) {
    let seq = db.get_ok("/health").await["seq"].clone();
    let rows = db.get_ok("/v1/tables/t/rows?limit=1000").await["rows"].clone();
    (seq, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issue_reproduction_is_refused_and_the_writer_carries_on() {
    let dir = TempDir::new("commit-limit-repro");
    let db = TestDb::open(dir.path(), |c| c.functions_source = Some(APP.into()));
    db.post_ok(
        "/v1/sql",
        r#"{"sql":"CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"}"#,
    )
    .await;
    let before = state(&db).await;
    // 90 rows of 900 000 bytes: 81 MB, beyond the 16 MiB default and the 64 MiB frame.
    for name in ["big", "sneaky"] {
        let reply = db
            .post(
                &format!("/v1/call/{name}"),
                r#"{"args":{"n":900000,"rows":90}}"#,
            )
            .await;
        assert_eq!(reply.status, 413, "{name}: {}", reply.text);
        assert_names_the_limit(&reply.json["error"]);
        assert_eq!(state(&db).await, before, "{name} changed nothing");
    }
    // The writer still writes and reads.
    let ok = db
        .post_ok("/v1/call/big", r#"{"args":{"n":10,"rows":3}}"#)
        .await;
    assert!(ok["seq"].as_u64().unwrap() > before.0.as_u64().unwrap());
    let row = db.get_ok("/v1/tables/t/rows/2").await;
    assert_eq!(row["row"]["body"], "xxxxxxxxxx");
    assert_eq!(db.get_ok("/health").await["status"], "ok");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_mutate_and_a_websocket_call_are_refused_naming_the_flag() {
    let dir = TempDir::new("commit-limit-ws");
    let (core, addr) = common::serve(
        dir.path(),
        |c| {
            c.functions_source = Some(APP.into());
            c.limits.commit_bytes_max = 64 << 10;
        },
        "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)",
    )
    .await;
    let client = common::http_client();
    let base = format!("http://{addr}");
    let seq_before = core.confirmed_seq();

    // One mutate of 40 rows of 4 000 bytes: ~160 KB of commit, under the body limit.
    let ops: Vec<Value> = (0..40)
        .map(|i| json!({"op":"insert","table":"t","row":{"id":i,"body":"y".repeat(4000)}}))
        .collect();
    let reply = client
        .post(format!("{base}/v1/mutate"))
        .json(&json!({ "ops": ops }))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 413);
    let body: Value = reply.json().await.unwrap();
    assert_names_the_limit(&body["error"]);
    assert!(
        body["error"].get("op").is_some(),
        "the op that crossed it: {body}"
    );

    // Over the WebSocket, in both encodings; the connection stays usable.
    for protocol in ["sluice.json.v1", "sluice.msgpack.v1"] {
        let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some(protocol));
        let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let send = |v: Value| {
            if protocol == "sluice.json.v1" {
                Message::Text(v.to_string().into())
            } else {
                Message::Binary(rmp_serde::to_vec_named(&v).unwrap().into())
            }
        };
        ws.send(send(
            json!({"id":1,"type":"call","name":"big","args":{"n":10000,"rows":20}}),
        ))
        .await
        .unwrap();
        ws.send(send(
            json!({"id":2,"type":"call","name":"big","args":{"n":10,"rows":2}}),
        ))
        .await
        .unwrap();
        let mut replies = Vec::new();
        while replies.len() < 2 {
            let message = ws.next().await.unwrap().unwrap();
            let value: Value = match message {
                Message::Text(t) => serde_json::from_str(&t).unwrap(),
                Message::Binary(b) => rmp_serde::from_slice(&b).unwrap(),
                _ => continue,
            };
            replies.push(value);
        }
        assert_eq!(replies[0]["id"], 1);
        assert_eq!(replies[0]["type"], "error", "{}", replies[0]);
        assert_names_the_limit(&replies[0]["error"]);
        assert_eq!(replies[1]["id"], 2);
        assert_eq!(replies[1]["type"], "result", "{}", replies[1]);
    }
    // Only the two small calls committed (one per protocol); the rows are the small ones.
    assert_eq!(core.confirmed_seq(), seq_before + 2);
    let row: Value = client
        .get(format!("{base}/v1/tables/t/rows/1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(row["row"]["body"], "xxxxxxxxxx", "{row}");
    core.shutdown().await.unwrap();
}
