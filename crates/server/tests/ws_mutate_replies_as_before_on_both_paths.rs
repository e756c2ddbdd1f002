//! A WebSocket `mutate` over a real socket, in both encodings: one the typed decoder takes,
//! one it leaves to the general path (an extra top-level field, which the protocol
//! ignores) and one refused. Replies must be byte for byte what the protocol sent before
//! the typed decoder (`{"type": "result", "seq", "results": [{"table", "id", "version"}],
//! "id"}`, serialised from a JSON object in that order), and the rows must be written.

mod common;

use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, protocol: &str) -> Ws {
    let request = common::ws_request(url, Some(protocol));
    let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws
}

async fn next(ws: &mut Ws) -> Message {
    tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a reply within 10 s")
        .unwrap()
        .unwrap()
}

/// The reply the protocol built before the typed decoder: a JSON object, `id` last.
fn expected(seq: u64, results: &[(&str, Value, u64)], id: &Value) -> Value {
    let results: Vec<Value> = results
        .iter()
        .map(|(t, k, v)| json!({"table": t, "id": k, "version": v}))
        .collect();
    let mut reply = json!({"type": "result", "seq": seq, "results": results});
    reply["id"] = id.clone();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_mutate_replies_as_before_on_both_paths() {
    let dir = TempDir::new("ws-mutate");
    let (core, addr) = common::serve(
        dir.path(),
        |_| {},
        "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER DEFAULT 3); \
         CREATE TABLE s (k TEXT PRIMARY KEY, v REAL)",
    )
    .await;
    let url = format!("ws://{addr}/v1/ws");
    let mut next_id = 0i64;
    for msgpack in [false, true] {
        let protocol = if msgpack {
            "sluice.msgpack.v1"
        } else {
            "sluice.json.v1"
        };
        let mut ws = connect(&url, protocol).await;
        for extra_field in [false, true] {
            next_id += 1;
            let id = if extra_field {
                json!({"n": next_id})
            } else {
                json!(next_id)
            };
            let mut request = json!({"type": "mutate", "id": id, "ops": [
                {"op": "insert", "table": "t", "row": {"id": next_id, "name": "a"}},
                {"op": "upsert", "table": "s", "row": {"k": format!("k{next_id}"), "v": 1.5}},
                {"op": "patch", "table": "t", "id": next_id, "set": {"n": 9}},
            ]});
            if extra_field {
                request["note"] = json!("ignored");
            }
            let frame = if msgpack {
                Message::Binary(rmp_serde::to_vec_named(&request).unwrap().into())
            } else {
                Message::Text(request.to_string().into())
            };
            ws.send(frame).await.unwrap();
            let reply = next(&mut ws).await;
            let seq = core.confirmed_seq();
            let want = expected(
                seq,
                &[
                    ("t", json!(next_id), seq),
                    ("s", json!(format!("k{next_id}")), seq),
                    ("t", json!(next_id), seq),
                ],
                &id,
            );
            match reply {
                Message::Text(text) => {
                    assert!(!msgpack);
                    assert_eq!(text.as_str(), want.to_string(), "the reply's bytes");
                }
                Message::Binary(bytes) => {
                    assert!(msgpack);
                    assert_eq!(
                        &bytes[..],
                        &rmp_serde::to_vec_named(&want).unwrap()[..],
                        "the reply's bytes"
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
            let db = core.db();
            let row = db.tables["t"]
                .rows
                .get(&sluice_engine::Key::Int(next_id))
                .expect("the row was written");
            assert_eq!(
                row.values[..],
                [
                    sluice_engine::Value::Integer(next_id),
                    sluice_engine::Value::Text("a".into()),
                    sluice_engine::Value::Integer(9),
                ]
            );
        }
        // Refused (the row exists): an error reply with the op's index, nothing written.
        let seq = core.confirmed_seq();
        let request = json!({"type": "mutate", "id": "dup", "ops": [
            {"op": "insert", "table": "s", "row": {"k": "new", "v": 1}},
            {"op": "insert", "table": "t", "row": {"id": 1, "name": "b"}},
        ]});
        let frame = if msgpack {
            Message::Binary(rmp_serde::to_vec_named(&request).unwrap().into())
        } else {
            Message::Text(request.to_string().into())
        };
        ws.send(frame).await.unwrap();
        let reply: Value = match next(&mut ws).await {
            Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
            Message::Binary(b) => rmp_serde::from_slice(&b).unwrap(),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(reply["id"], "dup", "{reply}");
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["code"], "already_exists", "{reply}");
        assert_eq!(reply["error"]["op"], 1, "{reply}");
        assert_eq!(core.confirmed_seq(), seq, "nothing was written");
        assert!(!core.db().tables["s"]
            .rows
            .contains_key(&sluice_engine::Key::Text("new".into())));
    }
}
