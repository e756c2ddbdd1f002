//! A snapshot too large for one message arrives in chunks while writes go on, and the
//! subscriber still ends exactly where a one-shot query at its seq is: every chunk but the
//! last says `more`, the chunks add up to the checksum of the last, and the diffs after the
//! snapshot come one per commit, seq after seq, with no gap and no duplicate — over the
//! WebSocket in JSON and in MessagePack and over SSE (where only the last chunk has an `id:`).
//! Each transport subscribes while a writer commits (inserts, updates, deletes) every
//! millisecond; one of them joins a view built just before, the others build theirs.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_engine::Value as V;
use sluice_live::checksum::{render, row_hash};
use sluice_server::Core;
use tokio_tungstenite::tungstenite::Message;

/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(30);
/// Rows loaded before subscribing: several chunks' worth.
const ROWS: i64 = 30_000;

/// A client's copy of an unordered view, checked as the protocol says to apply it.
#[derive(Default)]
struct Copy {
    rows: HashMap<i64, Value>,
    sum: u64,
    seq: u64,
}

fn hash(row: &Value) -> u64 {
    let values = [
        V::Integer(row["id"].as_i64().unwrap()),
        V::Text(row["room"].as_str().unwrap().into()),
        V::Integer(row["n"].as_i64().unwrap()),
    ];
    row_hash(&values)
}

impl Copy {
    fn snapshot(&mut self, seq: u64, keys: &[Value], rows: &[Value], checksum: &Value) {
        assert_eq!(keys.len(), rows.len());
        self.rows.clear();
        self.sum = 0;
        for (k, r) in keys.iter().zip(rows) {
            assert_eq!(k, &r["id"], "keys[i] is the key of rows[i]");
            assert!(
                self.rows.insert(k.as_i64().unwrap(), r.clone()).is_none(),
                "a key twice in one snapshot"
            );
            self.sum = self.sum.wrapping_add(hash(r));
        }
        assert_eq!(
            checksum,
            &Value::from(render(self.sum)),
            "snapshot checksum"
        );
        self.seq = seq;
    }

    fn diff(&mut self, d: &Value) {
        let seq = d["seq"].as_u64().unwrap();
        assert_eq!(
            seq,
            self.seq + 1,
            "every commit changes the view, so its diffs come seq after seq (no gap, no duplicate): {d}"
        );
        for c in d["changes"].as_array().unwrap() {
            let key = c["key"].as_i64().unwrap();
            match c["op"].as_str().unwrap() {
                "add" => {
                    let row = c["row"].clone();
                    self.sum = self.sum.wrapping_add(hash(&row));
                    assert!(self.rows.insert(key, row).is_none(), "add of a held key");
                }
                "change" => {
                    let row = c["row"].clone();
                    self.sum = self.sum.wrapping_add(hash(&row));
                    let old = self.rows.insert(key, row).expect("change of a missing key");
                    self.sum = self.sum.wrapping_sub(hash(&old));
                }
                "remove" => {
                    let old = self.rows.remove(&key).expect("remove of a missing key");
                    self.sum = self.sum.wrapping_sub(hash(&old));
                }
                other => panic!("unknown op {other}"),
            }
        }
        assert_eq!(
            d["checksum"],
            Value::from(render(self.sum)),
            "diff checksum"
        );
        self.seq = seq;
    }
}

/// Collects one snapshot's chunks: the whole snapshot at the last.
#[derive(Default)]
struct Chunks {
    seq: Option<u64>,
    keys: Vec<Value>,
    rows: Vec<Value>,
    count: usize,
}

impl Chunks {
    fn take(&mut self, m: &Value) -> Option<Whole> {
        let seq = m["seq"].as_u64().unwrap();
        if let Some(s) = self.seq {
            assert_eq!(s, seq, "every chunk of a snapshot has its seq");
        }
        self.seq = Some(seq);
        assert_eq!(m["columns"], json!(["id", "room", "n"]));
        self.keys
            .extend(m["keys"].as_array().unwrap().iter().cloned());
        self.rows
            .extend(m["rows"].as_array().unwrap().iter().cloned());
        self.count += 1;
        if m.get("more") == Some(&Value::Bool(true)) {
            assert!(
                m.get("checksum").is_none(),
                "only the last chunk has the checksum"
            );
            return None;
        }
        let done = std::mem::take(self);
        Some(Whole {
            seq,
            keys: done.keys,
            rows: done.rows,
            checksum: m["checksum"].clone(),
            chunks: done.count,
        })
    }
}

/// A whole snapshot, from its chunks.
struct Whole {
    seq: u64,
    keys: Vec<Value>,
    rows: Vec<Value>,
    checksum: Value,
    chunks: usize,
}

/// A writer committing every millisecond until stopped: an insert, an update, a delete of
/// the row inserted two commits before, and so on — each commit changes `SELECT *`.
/// `base` keeps each writer's rows and values apart from the previous ones' (an upsert of
/// the values a row already holds would change nothing). Returns the seq of its last commit.
fn writer(core: Core, stop: Arc<AtomicBool>, base: i64) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut last = 0;
        let mut k: i64 = 0;
        while !stop.load(Ordering::Relaxed) || k % 3 != 0 {
            let op = match k % 3 {
                0 => {
                    json!({"op": "insert", "table": "t", "row": {"id": base + k, "room": "w", "n": k}})
                }
                1 => {
                    json!({"op": "upsert", "table": "t", "row": {"id": (k * 7919) % ROWS, "room": "u", "n": -(base + k)}})
                }
                _ => json!({"op": "delete", "table": "t", "id": base + k - 2}),
            };
            let mut body = json!({ "ops": [op] }).as_object().unwrap().clone();
            let ops = sluice_server::api::parse_ops(&mut body, 10).unwrap();
            last = core.mutate(ops, None).await.expect("committed").seq;
            k += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        last
    })
}

async fn load(core: &Core) {
    for from in (0..ROWS).step_by(1_000) {
        let ops: Vec<Value> = (from..from + 1_000)
            .map(|id| json!({"op": "insert", "table": "t", "row": {"id": id, "room": format!("room {id} \"quoted\" ✓"), "n": id * 3}}))
            .collect();
        let mut body = json!({ "ops": ops }).as_object().unwrap().clone();
        let ops = sluice_server::api::parse_ops(&mut body, 1_000).unwrap();
        core.mutate(ops, None).await.expect("loaded");
    }
}

/// `POST /v1/query`: its seq and rows by id.
async fn one_shot(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    sql: &str,
) -> (u64, HashMap<i64, Value>) {
    let reply = http
        .post(format!("http://{addr}/v1/query"))
        .json(&json!({ "sql": sql }))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    let rows = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r.clone()))
        .collect();
    (body["seq"].as_u64().unwrap(), rows)
}

/// What a transport hands the test: one live message at a time (a snapshot chunk, a diff).
enum Feed {
    Ws(
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    ),
    Sse {
        resp: reqwest::Response,
        buf: Vec<u8>,
    },
}

impl Feed {
    async fn next(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.next_inner())
            .await
            .expect("a live message in time")
    }

    async fn next_inner(&mut self) -> Value {
        match self {
            Feed::Ws(ws) => loop {
                let m = match ws.next().await.expect("open").expect("a frame") {
                    Message::Text(t) => serde_json::from_str::<Value>(t.as_str()).unwrap(),
                    Message::Binary(b) => rmp_serde::from_slice::<Value>(&b).unwrap(),
                    _ => continue,
                };
                assert_ne!(m["type"], "error", "{m}");
                return m;
            },
            Feed::Sse { resp, buf } => loop {
                if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let block = String::from_utf8(buf[..end].to_vec()).unwrap();
                    buf.drain(..end + 2);
                    let mut event = "";
                    let mut id = None;
                    let mut data = "";
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("event: ") {
                            event = v;
                        } else if let Some(v) = line.strip_prefix("id: ") {
                            id = Some(v.to_string());
                        } else if let Some(v) = line.strip_prefix("data: ") {
                            data = v;
                        }
                    }
                    if event.is_empty() {
                        continue; // a heartbeat
                    }
                    assert_ne!(event, "error", "{data}");
                    let mut m: Value = serde_json::from_str(data).unwrap();
                    let more = m.get("more") == Some(&Value::Bool(true));
                    assert_eq!(
                        id.is_some(),
                        !more,
                        "only a whole snapshot (its last chunk) or a diff carries an id"
                    );
                    if let Some(id) = id {
                        assert_eq!(id, m["seq"].to_string());
                    }
                    m["type"] = Value::from(event);
                    return m;
                }
                let chunk = resp.chunk().await.unwrap().expect("the stream goes on");
                buf.extend_from_slice(&chunk);
            },
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chunked_snapshot_then_diffs_equal_a_one_shot_query() {
    let dir = TempDir::new("chunked-snapshot");
    let (core, addr) = common::serve(
        dir.path(),
        |_| {},
        "CREATE TABLE t (id INTEGER PRIMARY KEY, room TEXT NOT NULL, n INTEGER NOT NULL)",
    )
    .await;
    load(&core).await;
    let http = common::http_client();
    // (transport, query): the JSON subscriber joins the view the MessagePack one built
    // (whose snapshot is encoded from the frozen table; the joiner's from the view's rows).
    let cases = [
        ("ws-msgpack", "SELECT * FROM t"),
        ("ws-json", "SELECT * FROM t"),
        ("sse", "SELECT id, room, n FROM t WHERE n > -1000000000"),
    ];
    for (case, (transport, sql)) in cases.into_iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let base = 1_000_000 * (case as i64 + 1);
        let writes = writer(core.clone(), stop.clone(), base);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut feed = match transport {
            "sse" => {
                let mut url = reqwest::Url::parse(&format!("http://{addr}/v1/live")).unwrap();
                url.query_pairs_mut().append_pair("sql", sql);
                let resp = http.get(url).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                Feed::Sse {
                    resp,
                    buf: Vec::new(),
                }
            }
            _ => {
                let protocol = if transport == "ws-json" {
                    "sluice.json.v1"
                } else {
                    "sluice.msgpack.v1"
                };
                let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some(protocol));
                let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
                let subscribe = json!({"type": "subscribe", "id": 1, "qid": "big", "sql": sql});
                let frame = if transport == "ws-json" {
                    Message::Text(subscribe.to_string().into())
                } else {
                    Message::Binary(rmp_serde::to_vec_named(&subscribe).unwrap().into())
                };
                ws.send(frame).await.unwrap();
                Feed::Ws(ws)
            }
        };
        let mut copy = Copy::default();
        let mut chunks = Chunks::default();
        // The snapshot, chunk by chunk.
        loop {
            let m = feed.next().await;
            assert_eq!(m["type"], "snapshot", "no diff inside a snapshot: {m}");
            if let Some(w) = chunks.take(&m) {
                assert!(
                    w.chunks >= 3,
                    "{transport}: {} chunk(s) for {} rows",
                    w.chunks,
                    w.rows.len()
                );
                copy.snapshot(w.seq, &w.keys, &w.rows, &w.checksum);
                break;
            }
        }
        // Diffs while the writer goes on, then until its last commit.
        for _ in 0..20 {
            let m = feed.next().await;
            assert_eq!(m["type"], "diff", "{transport}: {m}");
            copy.diff(&m);
        }
        stop.store(true, Ordering::Relaxed);
        let last = writes.await.unwrap();
        while copy.seq < last {
            let m = feed.next().await;
            assert_eq!(m["type"], "diff", "{transport}: {m}");
            copy.diff(&m);
        }
        let (seq, rows) = one_shot(&http, addr, sql).await;
        assert_eq!(
            seq, copy.seq,
            "{transport}: nothing was written after the writer stopped"
        );
        assert_eq!(rows.len(), copy.rows.len(), "{transport}");
        assert!(
            rows == copy.rows,
            "{transport}: the copy differs from the one-shot query"
        );
    }
}
