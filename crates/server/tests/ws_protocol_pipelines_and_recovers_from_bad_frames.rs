//! `/v1/ws`: pipelined requests matched by id, both encodings, bad frames answered with a
//! structured error on a connection that stays usable.

mod common;

use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_server::Core;
use tokio_tungstenite::tungstenite::Message;

const BANK: &str = r#"
export function transfer(tx, { from, to, amount }) {
  if (from === to) throw new Error("same account");
  const a = tx.get("accounts", from), b = tx.get("accounts", to);
  if (a.balance < amount) throw new Error("insufficient funds");
  tx.patch("accounts", from, { balance: a.balance - amount });
  tx.patch("accounts", to, { balance: b.balance + amount });
  return a.balance - amount;
}
"#;

async fn start(dir: &TempDir, body_max: usize) -> (Core, String) {
    let (core, addr) = common::serve(
        dir.path(),
        |config| {
            config.body_bytes_max = body_max;
            config.functions_source = Some(BANK.to_string());
        },
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    )
    .await;
    let ops = (0..10)
        .map(|id| sluice_server::Op::Insert {
            table: "accounts".into(),
            row: json!({"id": id, "balance": 1000})
                .as_object()
                .unwrap()
                .clone(),
            if_version: None,
        })
        .collect();
    core.mutate(ops, None).await.unwrap();
    (core, format!("ws://{addr}/v1/ws"))
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, protocol: &str) -> Ws {
    let request = common::ws_request(url, Some(protocol));
    let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers().get("Sec-WebSocket-Protocol").unwrap(),
        protocol
    );
    ws
}

fn encode(msgpack: bool, v: &Value) -> Message {
    if msgpack {
        Message::Binary(rmp_serde::to_vec_named(v).unwrap().into())
    } else {
        Message::Text(v.to_string().into())
    }
}

async fn next(ws: &mut Ws) -> Value {
    let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a reply within 10 s")
        .unwrap()
        .unwrap();
    match msg {
        Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        Message::Binary(b) => rmp_serde::from_slice(&b).unwrap(),
        other => panic!("unexpected {other:?}"),
    }
}

async fn pipelined_transfers(msgpack: bool) {
    let dir = TempDir::new(if msgpack { "ws-mp" } else { "ws-json" });
    let (core, url) = start(&dir, 1 << 20).await;
    let protocol = if msgpack {
        "sluice.msgpack.v1"
    } else {
        "sluice.json.v1"
    };
    let mut ws = connect(&url, protocol).await;
    let n = 500;
    for i in 0..n {
        let from = i % 10;
        let to = (i + 1) % 10;
        let request = json!({"id": i, "type": "call", "name": "transfer",
                             "args": {"from": from, "to": to, "amount": 1}});
        ws.feed(encode(msgpack, &request)).await.unwrap();
    }
    ws.flush().await.unwrap();
    let mut seen = vec![false; n];
    let mut seqs = Vec::new();
    for _ in 0..n {
        let reply = next(&mut ws).await;
        assert_eq!(reply["type"], "result", "{reply}");
        let id = reply["id"].as_u64().unwrap() as usize;
        assert!(!seen[id], "reply for id {id} twice");
        seen[id] = true;
        seqs.push(reply["seq"].as_u64().unwrap());
    }
    assert!(seen.iter().all(|s| *s));
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "every transfer is its own commit");
    // The sum of balances is unchanged and each account moved exactly as sent.
    let db = core.db();
    let t = db.table("accounts").unwrap();
    let balances: Vec<i64> = t
        .rows
        .values()
        .map(|r| match r.values[1] {
            sluice_engine::Value::Integer(b) => b,
            _ => panic!(),
        })
        .collect();
    assert_eq!(balances.iter().sum::<i64>(), 10_000);
    assert!(
        balances.iter().all(|&b| b == 1000),
        "each account sent and received 50"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_json_requests_all_get_their_replies_by_id() {
    pipelined_transfers(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_msgpack_requests_all_get_their_replies_by_id() {
    pipelined_transfers(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_structured_errors_and_the_connection_stays_usable() {
    let dir = TempDir::new("ws-bad");
    let (core, url) = start(&dir, 4096).await;
    let seq = core.confirmed_seq();
    let mut ws = connect(&url, "sluice.json.v1").await;
    let cases: Vec<(Message, &str)> = vec![
        (Message::Text("{not json".into()), "bad_request"),
        (Message::Text("[1,2]".into()), "bad_request"),
        (Message::Binary(vec![0xc1, 0x00].into()), "bad_request"),
        (Message::Text(json!({"id": 7, "type": "nope"}).to_string().into()), "bad_request"),
        (Message::Text(json!({"id": 8}).to_string().into()), "bad_request"),
        (Message::Text(json!({"id": 9, "type": "call", "name": "missing"}).to_string().into()), "not_found"),
        (Message::Text(json!({"id": 10, "type": "call", "name": "transfer", "args": {"from": 1, "to": 1, "amount": 1}}).to_string().into()), "function_error"),
        (Message::Text(json!({"id": 11, "type": "mutate", "ops": []}).to_string().into()), "bad_request"),
        (Message::Text(json!({"id": 12, "type": "mutate", "ops": [{"op": "insert", "table": "accounts", "row": {"id": 1, "balance": 5}}]}).to_string().into()), "already_exists"),
        (Message::Text(json!({"id": 13, "type": "subscribe", "sql": "SELECT 1"}).to_string().into()), "bad_request"),
        (Message::Text(json!({"id": 15, "type": "subscribe", "qid": "q", "sql": "SELECT DISTINCT balance FROM accounts"}).to_string().into()), "unsupported"),
        (Message::Text(json!({"id": 16, "type": "unsubscribe", "qid": "never"}).to_string().into()), "not_found"),
        (Message::Text(json!({"id": 14, "type": "call", "name": "transfer", "pad": "x".repeat(5000)}).to_string().into()), "limit"),
    ];
    for (message, code) in cases {
        ws.send(message).await.unwrap();
        let reply = next(&mut ws).await;
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["code"], code, "{reply}");
        assert!(!reply["error"]["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(core.confirmed_seq(), seq, "nothing changed");
    // Still usable: a good request works.
    ws.send(Message::Text(
        json!({"id": "ok", "type": "mutate", "durability": "disk",
        "ops": [{"op": "patch", "table": "accounts", "id": 3, "set": {"balance": 7}}]})
        .to_string()
        .into(),
    ))
    .await
    .unwrap();
    let reply = next(&mut ws).await;
    assert_eq!(reply["id"], "ok");
    assert_eq!(reply["seq"], seq + 1);
    // A row's version is the seq of the commit that last wrote it.
    assert_eq!(reply["results"][0]["version"], seq + 1);
}
