//! Shared by the cluster tests over real processes (included with `#[path]` beside `mod
//! common;`): the `sluice serve --cluster` arguments,
//! a WebSocket client holding live views (materialised with the bench's independent
//! implementation of the documented checksum, `sluice_bench::live::client::Mat`), writers
//! over HTTP and WebSocket, and the comparisons of one node with another — rows, schema,
//! the changelog through `/v1/changes`, and each live view against the leader's and against
//! a one-shot query.
//!
//! Every wait is bounded; every client carries the admin token, as a real client does.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_bench::live::client::{result_checksum, Mat};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::common::{ws_request, Api, Rng};

/// How long a node may take to reach a seq, or a view to show it.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// `--cluster <urls> --cluster-database <db> --lease-ms <ms>` and `--follower` when asked.
pub fn cluster_args(urls: &str, database: &str, follower: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "--cluster",
        urls,
        "--cluster-database",
        database,
        "--lease-ms",
        "3000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if follower {
        // A read replica: these tests kill followers, never the leader, so none may take over.
        v.push("--follower".into());
        v.push("--no-takeover".into());
    }
    v
}

pub fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `/health`'s seq, or `None` while the node does not answer.
pub async fn try_seq(api: &Api) -> Option<u64> {
    let resp = api.client.get(api.url("/health")).send().await.ok()?;
    let v: Value = resp.json().await.ok()?;
    v["seq"].as_u64()
}

/// Waits (bounded) until the node confirmed exactly `seq` (and not more: nothing is written
/// after the seq the tests wait for).
pub async fn wait_node_seq(api: &Api, seq: u64, what: &str) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let at = try_seq(api).await;
        if at == Some(seq) {
            return;
        }
        assert!(
            at.is_none_or(|s| s < seq),
            "{what} ({}) is at seq {at:?}, past the leader's {seq}",
            api.base
        );
        assert!(
            Instant::now() < deadline,
            "{what} ({}) stayed at seq {at:?} below {seq}",
            api.base
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Writers

/// One random write: 1–3 ops on `items` (ids 0..60, rooms 0..4), in a random durability
/// class; `tag` is set once the schema change added the column.
pub fn random_write(rng: &mut Rng, n: u64, tagged: bool) -> Value {
    const CLASSES: [&str; 4] = ["memory", "disk", "fsync", "replicated"];
    let ops: Vec<Value> = (0..1 + rng.below(3))
        .map(|_| {
            let id = rng.below(60);
            let mut row = json!({"id": id, "room": rng.below(4), "qty": rng.below(1000),
                                 "note": format!("w{n}")});
            if tagged && rng.chance(50) {
                row["tag"] = json!(format!("t{}", rng.below(5)));
            }
            match rng.below(4) {
                0 => json!({"op": "upsert", "table": "items", "row": row}),
                1 => json!({"op": "insert", "table": "items", "row": row}),
                2 => json!({"op": "patch", "table": "items", "id": id,
                            "set": {"qty": rng.below(1000)}}),
                _ => json!({"op": "delete", "table": "items", "id": id}),
            }
        })
        .collect();
    json!({"ops": ops, "durability": CLASSES[rng.below(4) as usize]})
}

/// Whether a refused write is one the random workload expects — an insert of a key that
/// exists (`already_exists`), a patch or delete of one that does not (`not_found`) — and
/// never a server fault, a refused token or `not_leader`.
pub fn expected_refusal(status: u16, body: &Value) -> bool {
    (400..500).contains(&status)
        && matches!(
            body["error"]["code"].as_str(),
            Some("already_exists" | "not_found")
        )
}

/// A `/v1/ws` connection that sends `mutate`s one at a time and waits for each reply.
pub struct WsWriter {
    sink: SplitSink<Ws, Message>,
    stream: futures_util::stream::SplitStream<Ws>,
    next_id: u64,
}

impl WsWriter {
    pub async fn connect(base: &str) -> WsWriter {
        let (sink, stream) = connect(base).await.split();
        WsWriter {
            sink,
            stream,
            next_id: 1,
        }
    }

    /// Sends `{"type": "mutate", "ops", "durability"}` from a `/v1/mutate` body; returns
    /// the reply (a `result` or an `error`).
    pub async fn mutate(&mut self, body: &Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let frame = json!({"id": id, "type": "mutate", "ops": body["ops"],
                           "durability": body["durability"]});
        self.sink
            .send(Message::Text(frame.to_string().into()))
            .await
            .expect("send a mutate");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = tokio::time::timeout(left, self.stream.next())
                .await
                .expect("a mutate's reply within 30 s")
                .expect("the connection stays open")
                .expect("a frame");
            if let Message::Text(t) = m {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Live views over WebSocket

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(base: &str) -> Ws {
    let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
    let (ws, _) = tokio_tungstenite::connect_async(ws_request(&url, Some("sluice.json.v1")))
        .await
        .unwrap_or_else(|e| panic!("WebSocket to {url}: {e}"));
    ws
}

/// One event a view received.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    pub seq: u64,
    pub snapshot: bool,
    pub reset: bool,
}

/// What one subscription received: the materialised view (its checksum recomputed and
/// compared with the server's at every event) and every event's seq.
#[derive(Debug, Default)]
pub struct ViewLog {
    pub mat: Mat,
    pub events: Vec<Event>,
    pub errors: Vec<String>,
}

#[derive(Default)]
struct Shared {
    views: HashMap<u64, ViewLog>,
    closed: bool,
}

/// A `/v1/ws` connection holding live views by numeric qid, read by a task.
pub struct Views {
    pub base: String,
    sink: SplitSink<Ws, Message>,
    shared: Arc<Mutex<Shared>>,
    changed: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
    sqls: HashMap<u64, String>,
}

impl Views {
    pub async fn connect(base: &str) -> Views {
        let (sink, mut stream) = connect(base).await.split();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, changed) = watch::channel(0u64);
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let text = match stream.next().await {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                let v: Value = serde_json::from_str(text.as_str()).expect("a JSON frame");
                let Some(qid) = v["qid"].as_u64() else {
                    continue;
                };
                let mut g = s.lock().unwrap();
                let log = g.views.entry(qid).or_default();
                let seq = v["seq"].as_u64().unwrap_or(0);
                match v["type"].as_str() {
                    Some("snapshot") => {
                        if log.mat.snapshot(&v).expect("a well-formed snapshot") {
                            log.events.push(Event {
                                seq,
                                snapshot: true,
                                reset: v["reset"] == true,
                            });
                        }
                    }
                    Some("diff") => {
                        log.mat.diff(&v).expect("a well-formed diff");
                        log.events.push(Event {
                            seq,
                            snapshot: false,
                            reset: false,
                        });
                    }
                    Some("error") => log.errors.push(v.to_string()),
                    _ => continue,
                }
                drop(g);
                tx.send_modify(|n| *n += 1);
            }
            s.lock().unwrap().closed = true;
            tx.send_modify(|n| *n += 1);
        });
        Views {
            base: base.to_string(),
            sink,
            shared,
            changed,
            task,
            sqls: HashMap::new(),
        }
    }

    /// Subscribes `qid` to `sql`, resuming after `since` when given.
    pub async fn subscribe(&mut self, qid: u64, sql: &str, since: Option<u64>) {
        let mut frame = json!({"id": qid, "type": "subscribe", "qid": qid, "sql": sql});
        if let Some(s) = since {
            frame["since"] = json!(s);
        }
        self.sink
            .send(Message::Text(frame.to_string().into()))
            .await
            .expect("send a subscribe");
        self.sqls.insert(qid, sql.to_string());
    }

    pub fn sql(&self, qid: u64) -> &str {
        &self.sqls[&qid]
    }

    pub fn qids(&self) -> Vec<u64> {
        let mut q: Vec<u64> = self.sqls.keys().copied().collect();
        q.sort_unstable();
        q
    }

    /// Reads one view's log.
    pub fn with<R>(&self, qid: u64, f: impl FnOnce(&ViewLog) -> R) -> R {
        let g = self.shared.lock().unwrap();
        f(g.views.get(&qid).unwrap_or(&ViewLog::default()))
    }

    /// The seq of the newest event of `qid` (0 before its snapshot).
    pub fn seq(&self, qid: u64) -> u64 {
        self.with(qid, |l| l.events.last().map_or(0, |e| e.seq))
    }

    /// Waits until `done` holds for the connection's views; panics with `what` after
    /// [`CONVERGE_TIMEOUT`] or if the connection closed first.
    pub async fn wait(&mut self, what: &str, done: impl Fn(&HashMap<u64, ViewLog>) -> bool) {
        let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
        loop {
            {
                let g = self.shared.lock().unwrap();
                if done(&g.views) {
                    return;
                }
                assert!(!g.closed, "{what}: the connection to {} closed", self.base);
            }
            let waited = tokio::time::timeout_at(deadline, self.changed.changed()).await;
            assert!(waited.is_ok(), "{what}: not within {CONVERGE_TIMEOUT:?}");
        }
    }

    /// Waits until every subscribed view's newest event is `seq`.
    pub async fn wait_all_at(&mut self, seq: u64, what: &str) {
        let qids = self.qids();
        self.wait(what, |views| {
            qids.iter().all(|q| {
                views
                    .get(q)
                    .and_then(|l| l.events.last())
                    .is_some_and(|e| e.seq >= seq)
            })
        })
        .await;
        for q in qids {
            assert_eq!(self.seq(q), seq, "{what}: view {q} skipped past seq {seq}");
        }
    }

    /// Waits until the server closed the connection (its process died).
    pub async fn wait_closed(&mut self, what: &str) {
        let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
        while !self.shared.lock().unwrap().closed {
            let waited = tokio::time::timeout_at(deadline, self.changed.changed()).await;
            assert!(waited.is_ok(), "{what}: the connection stayed open");
        }
    }

    /// Checks every view of this connection: no error, its checksum recomputed here agreed
    /// with the server's at every event, its seqs strictly increase (no event twice), and
    /// it equals a one-shot query of the same SQL on `node` (at the same seq). Returns
    /// each view's checksum by qid.
    pub async fn check(&self, node: &Api, what: &str) -> HashMap<u64, u64> {
        let mut sums = HashMap::new();
        for qid in self.qids() {
            let sql = self.sql(qid).to_string();
            let (sum, seq) = self.with(qid, |l| {
                assert!(l.errors.is_empty(), "{what}: {sql}: errors {:?}", l.errors);
                assert_eq!(l.mat.mismatches, 0, "{what}: {sql}: checksum mismatches");
                assert!(l.mat.checked > 0, "{what}: {sql}: nothing checked");
                for w in l.events.windows(2) {
                    assert!(
                        w[1].seq > w[0].seq,
                        "{what}: {sql}: seq {} after {} (duplicate or out of order)",
                        w[1].seq,
                        w[0].seq
                    );
                }
                (l.mat.sum, l.mat.seq)
            });
            let (status, result) = node.post("/v1/query", &json!({ "sql": sql })).await;
            assert_eq!(status, 200, "{what}: {sql}: {result}");
            assert_eq!(result["seq"].as_u64(), Some(seq), "{what}: the query's seq");
            let (_, want) = result_checksum(&result).unwrap();
            assert_eq!(
                sum, want,
                "{what}: {sql}: the view differs from a one-shot query"
            );
            sums.insert(qid, sum);
        }
        sums
    }
}

impl Drop for Views {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------
// Node state

/// What a node's state is compared by: every table's rows (key order), the schema, and
/// the whole changelog from `/v1/changes?since=0`.
#[derive(Debug, PartialEq)]
pub struct State {
    pub seq: u64,
    pub tables: Value,
    pub rows: Vec<(String, Value)>,
    pub changes: Vec<Value>,
}

pub async fn state(api: &Api, tables: &[&str]) -> State {
    let seq = try_seq(api).await.expect("the node answers");
    let (status, mut schema) = api.get("/v1/tables").await;
    assert_eq!(status, 200, "{schema}");
    schema["seq"] = Value::Null;
    let mut rows = Vec::new();
    for t in tables {
        let (status, r) = api
            .post(
                "/v1/query",
                &json!({"sql": format!("SELECT * FROM {t} ORDER BY id")}),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["seq"].as_u64(), Some(seq), "{t} read at another seq");
        rows.push((t.to_string(), r["rows"].clone()));
    }
    let mut changes = Vec::new();
    let mut since = 0u64;
    for _ in 0..100_000 {
        let (status, page) = api
            .get_with(
                "/v1/changes",
                &[("since", &since.to_string()), ("limit", "1000")],
            )
            .await;
        assert_eq!(status, 200, "{page}");
        let got = page["changes"].as_array().unwrap();
        changes.extend(got.iter().cloned());
        let next = page["next"].as_u64().unwrap();
        if got.is_empty() || next >= seq {
            break;
        }
        since = next;
    }
    assert_eq!(
        changes.last().and_then(|c| c["seq"].as_u64()),
        Some(seq),
        "{}: the changelog ends at the node's seq",
        api.base
    );
    State {
        seq,
        tables: schema,
        rows,
        changes,
    }
}

/// Asserts that two nodes' states are equal, naming the first difference.
pub fn assert_same_state(want: &State, got: &State, what: &str) {
    assert_eq!(got.seq, want.seq, "{what}: seq");
    assert_eq!(got.tables, want.tables, "{what}: schema");
    assert_eq!(got.rows, want.rows, "{what}: rows");
    assert_eq!(
        got.changes.len(),
        want.changes.len(),
        "{what}: changelog length"
    );
    for (a, b) in want.changes.iter().zip(&got.changes) {
        assert_eq!(b, a, "{what}: changelog entry");
    }
}
