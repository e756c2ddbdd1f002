//! The WebSocket `get` request (docs/protocol.md "get"): a row by primary key, the rows of
//! one value of an indexed column, in JSON and MessagePack, pipelined, through row
//! policies for clients, read-your-writes after a `disk` mutate, and confirmation — a row
//! whose commit is not yet durable is not shown, while rows already durable are read
//! without waiting for it. Also `GET /v1/tables/{t}/rows?column=…&value=…`, and the
//! batched `get` by `keys` (order, missing keys, duplicates, the `get_keys_max` limit,
//! policies and confirmation per row).

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_log::io::{LogFile, LogFileFactory};
use sluice_server::point::{Given, IndexBy, IndexLookup};
use sluice_server::{Caller, Core};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "ws-get-secret";
const DDL: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, \
    name TEXT, price REAL, n INTEGER, ok BOOLEAN, j JSON, b BLOB);
CREATE INDEX items_owner ON items (owner);
CREATE TABLE tags (k TEXT PRIMARY KEY, v INTEGER);
CREATE POLICY own_items ON items FOR SELECT USING (owner = auth.sub)";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn protocol(msgpack: bool) -> &'static str {
    if msgpack {
        "sluice.msgpack.v1"
    } else {
        "sluice.json.v1"
    }
}

async fn connect(addr: std::net::SocketAddr, msgpack: bool) -> Ws {
    let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some(protocol(msgpack)));
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

/// A connection with a client token for `sub`.
async fn connect_as(addr: std::net::SocketAddr, sub: &str, msgpack: bool) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let token = sluice_server::auth::mint_hs256(
        SECRET,
        sub,
        &serde_json::Map::new(),
        Duration::from_secs(600),
    );
    let mut request = format!("ws://{addr}/v1/ws?access_token={token}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol(msgpack).parse().unwrap());
    tokio_tungstenite::connect_async(request).await.unwrap().0
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

async fn ask(ws: &mut Ws, msgpack: bool, request: Value) -> Value {
    ws.send(encode(msgpack, &request)).await.unwrap();
    next(ws).await
}

/// A server with the items schema and 50 rows: owners `u0` … `u4` by `id % 5`.
async fn start(dir: &TempDir) -> (Core, std::net::SocketAddr) {
    let (core, addr) =
        common::serve(dir.path(), |c| c.auth.jwt_secret = Some(SECRET.into()), DDL).await;
    let ops = (0..50)
        .map(|id| sluice_server::Op::Insert {
            table: "items".into(),
            row: json!({"id": id, "owner": format!("u{}", id % 5), "name": format!("item {id}"),
                        "price": id as f64 + 0.5, "n": -id, "ok": id % 2 == 0,
                        "j": {"a": [id, null]}, "b": "AAEC"})
            .as_object()
            .unwrap()
            .clone(),
            if_version: None,
        })
        .chain((0..3).map(|i| {
            sluice_server::Op::Insert {
                table: "tags".into(),
                row: json!({"k": format!("t{i}"), "v": i})
                    .as_object()
                    .unwrap()
                    .clone(),
                if_version: None,
            }
        }))
        .collect();
    core.mutate(ops, None).await.unwrap();
    (core, addr)
}

async fn by_key_and_index(msgpack: bool) {
    let dir = TempDir::new(if msgpack { "get-mp" } else { "get-json" });
    let (_core, addr) = start(&dir).await;
    let mut ws = connect(addr, msgpack).await;

    // Found: the row is the one `query` returns for the same key, value for value.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 1, "type": "get", "table": "items", "key": 7}),
    )
    .await;
    assert_eq!(reply["type"], "result", "{reply}");
    assert_eq!(reply["id"], 1);
    assert!(reply["version"].as_u64().unwrap() <= reply["seq"].as_u64().unwrap());
    let query = ask(
        &mut ws,
        msgpack,
        json!({"id": 2, "type": "query", "sql": "SELECT * FROM items WHERE id = 7"}),
    )
    .await;
    assert_eq!(reply["row"], query["rows"][0], "{reply} vs {query}");
    assert_eq!(reply["row"]["j"], json!({"a": [7, null]}));
    assert_eq!(reply["row"]["n"], -7);
    assert!(reply["seq"].as_u64().unwrap() >= 1);

    // A text key.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": "t", "type": "get", "table": "tags", "key": "t2"}),
    )
    .await;
    assert_eq!(reply["row"], json!({"k": "t2", "v": 2}), "{reply}");
    assert_eq!(reply["id"], "t");

    // Not found: an answer, not an error.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 3, "type": "get", "table": "items", "key": 999}),
    )
    .await;
    assert_eq!(reply["type"], "result", "{reply}");
    assert_eq!(reply["row"], Value::Null);
    assert_eq!(reply["version"], Value::Null);

    // Refusals, each naming what is wrong.
    let cases = [
        (
            json!({"id": 4, "type": "get", "table": "nope", "key": 1}),
            "not_found",
            "nope",
        ),
        (
            json!({"id": 5, "type": "get", "table": "items", "key": "seven"}),
            "schema",
            "INTEGER",
        ),
        (
            json!({"id": 6, "type": "get", "table": "tags", "key": 3}),
            "schema",
            "TEXT",
        ),
        (
            json!({"id": 7, "type": "get", "table": "items"}),
            "bad_request",
            "\"key\"",
        ),
        (
            json!({"id": 8, "type": "get", "key": 1}),
            "bad_request",
            "\"table\"",
        ),
        (
            json!({"id": 9, "type": "get", "table": 5, "key": 1}),
            "bad_request",
            "\"table\"",
        ),
        (
            json!({"id": 10, "type": "get", "table": "items", "key": 1, "column": "owner", "value": "u1"}),
            "bad_request",
            "not both",
        ),
        (
            json!({"id": 11, "type": "get", "table": "items", "column": "name", "value": "x"}),
            "bad_request",
            "CREATE INDEX",
        ),
        (
            json!({"id": 12, "type": "get", "table": "items", "index": "nope", "value": "x"}),
            "not_found",
            "items_owner",
        ),
        (
            json!({"id": 13, "type": "get", "table": "items", "column": "owner", "value": "u1", "limit": 20000}),
            "limit",
            "--max-page-rows",
        ),
        (
            json!({"id": 14, "type": "get", "table": "items", "column": "owner", "value": 3}),
            "schema",
            "owner",
        ),
        (
            json!({"id": 15, "type": "get", "table": "items", "column": "owner"}),
            "bad_request",
            "\"value\"",
        ),
    ];
    for (request, code, names) in cases {
        let reply = ask(&mut ws, msgpack, request.clone()).await;
        assert_eq!(reply["type"], "error", "{request}: {reply}");
        assert_eq!(reply["id"], request["id"], "{request}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{request}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{request}: {message}");
    }
    // A field twice (JSON text only) is left to the generic path, which still answers.
    if !msgpack {
        ws.send(Message::Text(
            r#"{"id": 16, "type": "get", "table": "tags", "table": "items", "key": 1}"#.into(),
        ))
        .await
        .unwrap();
        let reply = next(&mut ws).await;
        assert_eq!(reply["id"], 16, "{reply}");
        assert_eq!(
            reply["row"]["id"], 1,
            "the last of the two wins, as serde_json reads it"
        );
    }

    // Through the index, in primary key order, paged with `next` / `after`.
    let mut ids = Vec::new();
    let mut after = Value::Null;
    let mut pages = 0;
    loop {
        let reply = ask(
            &mut ws,
            msgpack,
            json!({"id": 20, "type": "get", "table": "items", "index": "items_owner",
                   "value": "u3", "limit": 4, "after": after}),
        )
        .await;
        assert_eq!(reply["type"], "result", "{reply}");
        pages += 1;
        for r in reply["rows"].as_array().unwrap() {
            assert_eq!(r["row"]["owner"], "u3");
            assert!(r["version"].as_u64().unwrap() >= 1);
            ids.push(r["row"]["id"].as_i64().unwrap());
        }
        if reply["next"].is_null() {
            break;
        }
        after = reply["next"].clone();
        assert!(pages < 10, "paging ends");
    }
    assert_eq!(ids, (0..50).filter(|i| i % 5 == 3).collect::<Vec<_>>());
    assert_eq!(pages, 3, "10 rows in pages of 4");
    // By column, and a value nobody has.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 21, "type": "get", "table": "items", "column": "owner", "value": "u0"}),
    )
    .await;
    assert_eq!(reply["rows"].as_array().unwrap().len(), 10, "{reply}");
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 22, "type": "get", "table": "items", "column": "owner", "value": "zz"}),
    )
    .await;
    assert_eq!(reply["rows"], json!([]), "{reply}");
    assert_eq!(reply["next"], Value::Null);
    // The primary key column reads by key.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 23, "type": "get", "table": "items", "column": "id", "value": 9}),
    )
    .await;
    assert_eq!(reply["rows"][0]["row"]["id"], 9, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_rows_by_key_and_index_in_json() {
    by_key_and_index(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_rows_by_key_and_index_in_msgpack() {
    by_key_and_index(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gets_only_rows_its_policy_lets_it_read() {
    let dir = TempDir::new("get-policy");
    let (_core, addr) = start(&dir).await;
    for msgpack in [false, true] {
        let mut ws = connect_as(addr, "u2", msgpack).await;
        let own = ask(
            &mut ws,
            msgpack,
            json!({"id": 1, "type": "get", "table": "items", "key": 7}),
        )
        .await;
        assert_eq!(own["row"]["owner"], "u2", "{own}");
        // Someone else's row reads as absent, exactly like a missing one.
        let other = ask(
            &mut ws,
            msgpack,
            json!({"id": 2, "type": "get", "table": "items", "key": 8}),
        )
        .await;
        let missing = ask(
            &mut ws,
            msgpack,
            json!({"id": 2, "type": "get", "table": "items", "key": 999}),
        )
        .await;
        assert_eq!(other["row"], Value::Null, "{other}");
        assert_eq!(other["type"], missing["type"]);
        assert_eq!(other["row"], missing["row"]);
        // Through the index: only own rows, even when asking for another owner's value.
        let mine = ask(
            &mut ws,
            msgpack,
            json!({"id": 3, "type": "get", "table": "items", "column": "owner", "value": "u2"}),
        )
        .await;
        assert_eq!(mine["rows"].as_array().unwrap().len(), 10, "{mine}");
        let theirs = ask(
            &mut ws,
            msgpack,
            json!({"id": 4, "type": "get", "table": "items", "column": "owner", "value": "u1"}),
        )
        .await;
        assert_eq!(theirs["rows"], json!([]), "{theirs}");
        // A table without a SELECT policy is closed to clients (deny by default).
        let closed = ask(
            &mut ws,
            msgpack,
            json!({"id": 5, "type": "get", "table": "tags", "key": "t1"}),
        )
        .await;
        assert_eq!(closed["row"], Value::Null, "{closed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_gets_all_get_their_rows_in_order_between_writes() {
    let dir = TempDir::new("get-pipelined");
    let (_core, addr) = start(&dir).await;
    for msgpack in [false, true] {
        let base: u64 = if msgpack { 1_000_000 } else { 0 };
        let mut ws = connect(addr, msgpack).await;
        let n = 3000u64;
        for i in 0..n {
            let request = if i % 100 == 50 {
                json!({"id": i, "type": "mutate", "durability": "memory",
                       "ops": [{"op": "patch", "table": "items", "id": 49, "set": {"n": base + i}}]})
            } else if i % 10 == 5 {
                json!({"id": i, "type": "get", "table": "items", "column": "owner",
                       "value": format!("u{}", i % 5), "limit": 3})
            } else {
                json!({"id": i, "type": "get", "table": "items", "key": i % 60})
            };
            ws.feed(encode(msgpack, &request)).await.unwrap();
        }
        ws.flush().await.unwrap();
        let mut written = 0;
        for i in 0..n {
            let reply = next(&mut ws).await;
            assert_eq!(reply["id"], i, "replies keep the order of requests");
            assert_eq!(reply["type"], "result", "{reply}");
            if i % 100 == 50 {
                written = i;
                continue;
            }
            if i % 60 == 49 {
                // Row 49 is patched by the writes in between: a get never shows a write
                // sent after it (the server reads the frames of a connection in order).
                let n = reply["row"]["n"].as_i64().unwrap();
                let n = u64::try_from(n).unwrap_or(0);
                assert!(n < base || n - base <= written, "{reply}");
            }
            if i % 10 == 5 {
                let rows = reply["rows"].as_array().unwrap();
                assert_eq!(rows.len(), 3);
                assert!(rows
                    .iter()
                    .all(|r| r["row"]["owner"] == format!("u{}", i % 5)));
            } else if i % 60 < 50 {
                assert_eq!(reply["row"]["id"], i % 60, "{reply}");
            } else {
                assert_eq!(reply["row"], Value::Null, "{reply}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_a_disk_mutate_reads_the_write() {
    let dir = TempDir::new("get-ryw");
    let (_core, addr) = start(&dir).await;
    for msgpack in [false, true] {
        let mut ws = connect(addr, msgpack).await;
        for round in 0..50 {
            let name = format!("renamed {msgpack} {round}");
            let written = ask(
                &mut ws,
                msgpack,
                json!({"id": 1, "type": "mutate", "durability": "disk",
                       "ops": [{"op": "upsert", "table": "items",
                                "row": {"id": 100 + round, "owner": "u1", "name": name}}]}),
            )
            .await;
            assert_eq!(written["type"], "result", "{written}");
            let version = written["results"][0]["version"].as_u64().unwrap();
            let read = ask(
                &mut ws,
                msgpack,
                json!({"id": 2, "type": "get", "table": "items", "key": 100 + round}),
            )
            .await;
            assert_eq!(read["row"]["name"], name.as_str(), "{read}");
            assert_eq!(read["version"].as_u64().unwrap(), version);
            assert!(read["seq"].as_u64().unwrap() >= written["seq"].as_u64().unwrap());
            let found = ask(
                &mut ws,
                msgpack,
                json!({"id": 3, "type": "get", "table": "items", "column": "owner", "value": "u1", "after": 99 + round}),
            )
            .await;
            assert_eq!(found["rows"][0]["row"]["name"], name.as_str(), "{found}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_read_by_value_over_http() {
    let dir = TempDir::new("get-http");
    let (_core, addr) = start(&dir).await;
    let http = common::http_client();
    let base = format!("http://{addr}/v1/tables/items/rows");
    let page: Value = http
        .get(format!("{base}?column=owner&value=u4&limit=3"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<_> = page["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [4, 9, 14], "{page}");
    assert_eq!(page["next"], 14);
    let page: Value = http
        .get(format!("{base}?index=items_owner&value=u4&after=44"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["rows"][0]["row"]["id"], 49, "{page}");
    assert_eq!(page["next"], Value::Null);
    let bad = http
        .get(format!("{base}?column=name&value=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    // The row read by key answers as before.
    let row: Value = http
        .get(format!("{base}/7"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(row["row"]["name"], "item 7", "{row}");
    assert_eq!(row["row"]["j"], json!({"a": [7, null]}));
    let missing = http.get(format!("{base}/999")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

/// Real files whose syncs wait while the gate is closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
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
        let mut closed = self.1.closed.lock().unwrap();
        while *closed {
            closed = self.1.changed.wait(closed).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_shows_once_durable_and_durable_rows_do_not_wait_for_it() {
    let dir = TempDir::new("get-confirm");
    let gate = Arc::new(Gate::default());
    let files = GatedFiles(gate.clone());
    let (core, addr) = common::serve(
        dir.path(),
        move |c| c.log_files = sluice_server::config::LogFiles(Arc::new(files)),
        DDL,
    )
    .await;
    let row = |id: i64, owner: &str, name: &str| {
        json!({"id": id, "owner": owner, "name": name})
            .as_object()
            .unwrap()
            .clone()
    };
    let ops = [(1, "u1"), (2, "u1"), (3, "u3"), (4, "u5"), (5, "u6")]
        .into_iter()
        .map(|(id, owner)| sluice_server::Op::Insert {
            table: "items".into(),
            row: row(id, owner, "old"),
            if_version: None,
        })
        .collect();
    core.mutate(ops, Some(sluice_log::Durability::Fsync))
        .await
        .unwrap();
    let durable = core.confirmed_seq();
    // An fsync write applies, and waits at the closed gate for its sync: row 1 renamed,
    // row 3 moved from owner u3 to u4, row 5 deleted.
    gate.set(true);
    let write = {
        let core = core.clone();
        let ops = vec![
            sluice_server::Op::Upsert {
                table: "items".into(),
                row: row(1, "u1", "new"),
                if_version: None,
            },
            sluice_server::Op::Upsert {
                table: "items".into(),
                row: row(3, "u4", "moved"),
                if_version: None,
            },
            sluice_server::Op::Delete {
                table: "items".into(),
                id: json!(5),
                if_version: None,
            },
        ];
        tokio::spawn(async move { core.mutate(ops, Some(sluice_log::Durability::Fsync)).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while core.db().seq == durable {
        assert!(tokio::time::Instant::now() < deadline, "the write applies");
        tokio::task::yield_now().await;
    }
    let pending = core.db().seq;
    let admin = Caller::Admin;
    // Row 2 was last written by a durable commit: read at once, at the confirmed seq.
    let two = sluice_engine::Key::Int(2);
    let read = core.get_row(&admin, "items", Given::Typed(&two));
    assert_eq!(read.waits_for(), None);
    let got = read.now().ok().expect("no waiting").unwrap();
    assert_eq!(got.seq, durable);
    assert!(got.row.is_some());
    // Row 1 (and any lookup through the index) waits for the pending commit.
    let one = sluice_engine::Key::Int(1);
    assert_eq!(
        core.get_row(&admin, "items", Given::Typed(&one))
            .waits_for(),
        Some(pending)
    );
    let lookup = IndexLookup {
        by: IndexBy::Column("owner"),
        value: Given::Typed(&sluice_engine::Value::Text("u1".into())),
        after: None,
        limit: 10,
    };
    assert_eq!(
        core.find_rows(&admin, "items", lookup).waits_for(),
        Some(pending)
    );
    let owners: Vec<sluice_engine::Value> = ["u3", "u4", "u5", "u6"]
        .map(|o| sluice_engine::Value::Text(o.into()))
        .into();
    let by_owner = |i: usize| IndexLookup {
        by: IndexBy::Column("owner"),
        value: Given::Typed(&owners[i]),
        after: None,
        limit: 10,
    };
    // Row 3 left u3 in the pending commit, and row 5 (u6) was deleted: "nobody" is not
    // yet a durable answer for either. u5 was not touched since: answered at once.
    assert_eq!(
        core.find_rows(&admin, "items", by_owner(0)).waits_for(),
        Some(pending)
    );
    assert_eq!(
        core.find_rows(&admin, "items", by_owner(3)).waits_for(),
        Some(pending)
    );
    let untouched = core.find_rows(&admin, "items", by_owner(2));
    assert_eq!(untouched.waits_for(), None);
    let found = untouched.now().ok().expect("no waiting").unwrap();
    assert_eq!(found.rows.len(), 1);
    assert_eq!(found.seq, durable);
    // An absent key nobody touched since answers at once; one deleted since waits.
    let (absent, deleted) = (sluice_engine::Key::Int(99), sluice_engine::Key::Int(5));
    let read = core.get_row(&admin, "items", Given::Typed(&absent));
    assert_eq!(read.waits_for(), None);
    let read = core.get_row(&admin, "items", Given::Typed(&deleted));
    assert_eq!(read.waits_for(), Some(pending));
    // A batch waits only if one of its rows (or absences) does: rows 2 and 4 and absent 99
    // answer at once at the confirmed seq; adding row 1, or deleted row 5, waits for the
    // pending commit.
    let keys = |ids: &[i64]| -> Vec<sluice_engine::Key> {
        ids.iter().map(|&i| sluice_engine::Key::Int(i)).collect()
    };
    let settled = keys(&[2, 4, 99]);
    let read = core.get_rows(&admin, "items", settled.iter().map(Given::Typed));
    assert_eq!(read.waits_for(), None);
    let got = read.now().ok().expect("no waiting").unwrap();
    assert_eq!(got.seq, durable);
    assert_eq!(
        got.rows.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, true, false]
    );
    for held in [keys(&[2, 1, 4]), keys(&[4, 5])] {
        let read = core.get_rows(&admin, "items", held.iter().map(Given::Typed));
        assert_eq!(read.waits_for(), Some(pending), "{held:?}");
    }
    // Over the WebSocket: row 2 answers while the sync is held; row 1 does not.
    let mut ws = connect(addr, false).await;
    let reply = ask(
        &mut ws,
        false,
        json!({"id": 0, "type": "get", "table": "items", "keys": [2, 4, 99]}),
    )
    .await;
    assert_eq!(reply["seq"], durable, "{reply}");
    assert_eq!(reply["rows"][0]["row"]["name"], "old", "{reply}");
    assert_eq!(reply["rows"][2], Value::Null, "{reply}");
    let reply = ask(
        &mut ws,
        false,
        json!({"id": 1, "type": "get", "table": "items", "key": 2}),
    )
    .await;
    assert_eq!(reply["row"]["name"], "old", "{reply}");
    assert_eq!(reply["seq"], durable);
    ws.send(encode(
        false,
        &json!({"id": 2, "type": "get", "table": "items", "key": 1}),
    ))
    .await
    .unwrap();
    ws.send(encode(
        false,
        &json!({"id": 3, "type": "get", "table": "items", "keys": [2, 1, 5, 99]}),
    ))
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), ws.next())
            .await
            .is_err(),
        "a row is not shown before its commit is durable"
    );
    gate.set(false);
    let reply = next(&mut ws).await;
    assert_eq!(reply["id"], 2);
    assert_eq!(reply["row"]["name"], "new", "{reply}");
    assert!(reply["seq"].as_u64().unwrap() >= pending);
    // The batch holding row 1 and deleted row 5 came once the commit was durable, every
    // entry as of one state.
    let reply = next(&mut ws).await;
    assert_eq!(reply["id"], 3, "{reply}");
    assert!(reply["seq"].as_u64().unwrap() >= pending);
    let names: Vec<&Value> = reply["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["row"]["name"])
        .collect();
    assert_eq!(
        names,
        [&json!("old"), &json!("new"), &Value::Null, &Value::Null],
        "{reply}"
    );
    assert_eq!(
        reply["rows"][2],
        Value::Null,
        "deleted row 5 reads as absent: {reply}"
    );
    write.await.unwrap().unwrap();
    // In-process, confirmed.
    let got = core.get(&admin, "items", Given::Typed(&one)).await.unwrap();
    assert!(got.seq >= pending);
    let found = core.find(&admin, "items", lookup).await.unwrap();
    assert_eq!(found.rows.len(), 2);
    let found = core.find(&admin, "items", by_owner(1)).await.unwrap();
    assert_eq!(found.rows.len(), 1);
}

async fn batched_by_keys(msgpack: bool) {
    let dir = TempDir::new(if msgpack {
        "get-many-mp"
    } else {
        "get-many-json"
    });
    let (core, addr) = start(&dir).await;
    let mut ws = connect(addr, msgpack).await;
    // One entry per key, in the order asked: missing keys are null, a key twice is
    // answered twice, each row as a single get answers it.
    let keys = json!([7, 999, 3, 7, -1, 49, 0]);
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 1, "type": "get", "table": "items", "keys": keys}),
    )
    .await;
    assert_eq!(reply["type"], "result", "{reply}");
    assert_eq!(reply["id"], 1);
    let rows = reply["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "{reply}");
    for (i, key) in keys.as_array().unwrap().iter().enumerate() {
        let single = ask(
            &mut ws,
            msgpack,
            json!({"id": 2, "type": "get", "table": "items", "key": key}),
        )
        .await;
        if single["row"].is_null() {
            assert_eq!(rows[i], Value::Null, "key {key}: {reply}");
        } else {
            assert_eq!(rows[i]["row"], single["row"], "key {key}");
            assert_eq!(rows[i]["version"], single["version"], "key {key}");
        }
    }
    assert_eq!(rows[0], rows[3], "a key twice reads the same row twice");
    assert_eq!(rows[1], Value::Null);
    assert_eq!(rows[4], Value::Null);
    assert!(reply["seq"].as_u64().unwrap() >= 1);
    // Text keys; no keys at all is an empty batch of a table that exists.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 3, "type": "get", "table": "tags", "keys": ["t2", "zz", "t0"]}),
    )
    .await;
    assert_eq!(
        reply["rows"],
        json!([{"row": {"k": "t2", "v": 2}, "version": reply["rows"][0]["version"]}, null,
               {"row": {"k": "t0", "v": 0}, "version": reply["rows"][2]["version"]}]),
        "{reply}"
    );
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 4, "type": "get", "table": "items", "keys": []}),
    )
    .await;
    assert_eq!(reply["rows"], json!([]), "{reply}");
    // Refused whole, naming what is wrong: no partial answer.
    let max = sluice_server::point::GET_KEYS_MAX;
    let too_many: Vec<u64> = (0..=max as u64).collect();
    let just_enough: Vec<u64> = (0..max as u64).collect();
    let cases = [
        (
            json!({"id": 5, "type": "get", "table": "items", "keys": too_many}),
            "limit",
            "get_keys_max is 1000",
        ),
        (
            json!({"id": 6, "type": "get", "table": "items", "keys": [1, "two", 3]}),
            "schema",
            "INTEGER",
        ),
        (
            json!({"id": 7, "type": "get", "table": "nope", "keys": []}),
            "not_found",
            "nope",
        ),
        (
            json!({"id": 8, "type": "get", "table": "items", "keys": [1], "key": 1}),
            "bad_request",
            "\"keys\"",
        ),
        (
            json!({"id": 9, "type": "get", "table": "items", "keys": [1], "column": "owner", "value": "u1"}),
            "bad_request",
            "\"keys\"",
        ),
        (
            json!({"id": 10, "type": "get", "table": "items", "keys": 1}),
            "bad_request",
            "\"keys\"",
        ),
    ];
    for (request, code, names) in cases {
        let reply = ask(&mut ws, msgpack, request.clone()).await;
        assert_eq!(reply["type"], "error", "{request}: {reply}");
        assert_eq!(reply["id"], request["id"], "{request}: {reply}");
        assert!(reply.get("rows").is_none(), "nothing partial: {reply}");
        assert_eq!(reply["error"]["code"], code, "{request}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{request}: {message}");
    }
    // At the limit: answered, every entry in order.
    let reply = ask(
        &mut ws,
        msgpack,
        json!({"id": 11, "type": "get", "table": "items", "keys": just_enough}),
    )
    .await;
    let rows = reply["rows"].as_array().unwrap();
    assert_eq!(rows.len(), max, "{}", reply["type"]);
    for (i, r) in rows.iter().enumerate() {
        if i < 50 {
            assert_eq!(r["row"]["id"], i, "entry {i}");
        } else {
            assert_eq!(*r, Value::Null, "entry {i}");
        }
    }
    // In-process, the same call.
    let keys: Vec<sluice_engine::Key> = [4, 70, 4].map(sluice_engine::Key::Int).into();
    let got = core
        .get_rows(&Caller::Admin, "items", keys.iter().map(Given::Typed))
        .confirmed(&core)
        .await
        .unwrap();
    let found: Vec<bool> = got.rows.iter().map(Option::is_some).collect();
    assert_eq!(found, [true, false, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_keys_is_answered_in_order_in_json() {
    batched_by_keys(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_keys_is_answered_in_order_in_msgpack() {
    batched_by_keys(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_batch_applies_its_policy_to_every_row() {
    let dir = TempDir::new("get-many-policy");
    let (_core, addr) = start(&dir).await;
    for msgpack in [false, true] {
        let mut ws = connect_as(addr, "u2", msgpack).await;
        // u2 owns ids 2, 7, 12, …: another owner's row reads as null, like a missing one.
        let reply = ask(
            &mut ws,
            msgpack,
            json!({"id": 1, "type": "get", "table": "items", "keys": [7, 8, 999, 12, 7, 3]}),
        )
        .await;
        assert_eq!(reply["type"], "result", "{reply}");
        let ids: Vec<Value> = reply["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["row"]["id"].clone())
            .collect();
        assert_eq!(
            ids,
            [
                json!(7),
                Value::Null,
                Value::Null,
                json!(12),
                json!(7),
                Value::Null
            ],
            "{reply}"
        );
        // A table without a SELECT policy: every entry null.
        let closed = ask(
            &mut ws,
            msgpack,
            json!({"id": 2, "type": "get", "table": "tags", "keys": ["t1", "t2"]}),
        )
        .await;
        assert_eq!(closed["rows"], json!([null, null]), "{closed}");
    }
}
