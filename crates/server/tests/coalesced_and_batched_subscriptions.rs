//! `coalesce_ms` and `subscribe_many` over real sockets: a hot row written ten times within
//! a window reaches a coalescing WebSocket subscriber as one `change` at the burst's last seq
//! (a plain subscriber of the same view gets all ten), resume from that seq is exact, SSE
//! takes `?coalesce_ms=`; one `subscribe_many` frame subscribes many views (a refused entry
//! gets its own error, a malformed frame subscribes nothing); a coalescing topic watch still
//! delivers every record once, in order; out-of-range windows are refused by name.

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_log::Durability;
use sluice_server::Core;
use tokio_tungstenite::tungstenite::Message;

/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(20);

const ROOM: &str = "SELECT id, room, n FROM msg WHERE room = $1";

async fn start(name: &str) -> (Core, SocketAddr, TempDir) {
    let dir = TempDir::new(name);
    let (core, addr) = common::serve(
        dir.path(),
        |config| config.durability = Durability::Disk,
        "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT NOT NULL, n INTEGER NOT NULL)",
    )
    .await;
    (core, addr, dir)
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Client {
    ws: Ws,
    events: HashMap<String, VecDeque<Value>>,
    replies: HashMap<String, VecDeque<Value>>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some("sluice.json.v1"));
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Client {
            ws,
            events: HashMap::new(),
            replies: HashMap::new(),
        }
    }

    async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    /// Files one message: replies by `id`, events (and records, by topic) by `qid`.
    async fn pump(&mut self) {
        let msg = tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("a message within the safety bound")
            .expect("open")
            .unwrap();
        let Message::Text(t) = msg else {
            panic!("unexpected {msg:?}")
        };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        let key = match (v.get("id"), v.get("qid"), v.get("topic")) {
            (Some(id), _, _) if v["type"] != "watching" => {
                self.replies.entry(id.to_string()).or_default().push_back(v);
                return;
            }
            (_, Some(qid), _) => qid.to_string(),
            (_, _, Some(topic)) => topic.to_string(),
            _ => panic!("unfiled {v}"),
        };
        self.events.entry(key).or_default().push_back(v);
    }

    async fn reply(&mut self, id: &Value) -> Value {
        loop {
            if let Some(v) = self
                .replies
                .get_mut(&id.to_string())
                .and_then(VecDeque::pop_front)
            {
                return v;
            }
            self.pump().await;
        }
    }

    async fn event(&mut self, key: &Value) -> Value {
        loop {
            if let Some(v) = self
                .events
                .get_mut(&key.to_string())
                .and_then(VecDeque::pop_front)
            {
                return v;
            }
            self.pump().await;
        }
    }

    /// Pipelines one mutate per ops list; returns each commit's seq.
    async fn mutates(&mut self, first_id: u64, ops: &[Value]) -> Vec<u64> {
        for (i, o) in ops.iter().enumerate() {
            self.send(json!({"id": first_id + i as u64, "type": "mutate", "ops": o}))
                .await;
        }
        let mut seqs = Vec::new();
        for i in 0..ops.len() {
            let r = self.reply(&json!(first_id + i as u64)).await;
            assert_eq!(r["type"], "result", "{r}");
            seqs.push(r["seq"].as_u64().unwrap());
        }
        seqs
    }
}

fn upsert(id: i64, room: &str, n: i64) -> Value {
    json!([{"op": "upsert", "table": "msg", "row": {"id": id, "room": room, "n": n}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_row_burst_is_one_change_for_a_coalescing_subscriber_and_resume_is_exact() {
    let (_core, addr, _dir) = start("coalesce-ws").await;
    let mut ws = Client::connect(addr).await;
    ws.mutates(1, &[upsert(1, "a", 0), upsert(2, "a", 0)]).await;
    let (plain, folded) = (json!("plain"), json!("folded"));
    ws.send(json!({"type": "subscribe", "qid": plain, "sql": ROOM, "params": ["a"]}))
        .await;
    // A window long enough that the burst below falls in it on a busy machine.
    ws.send(json!({"type": "subscribe", "qid": folded, "sql": ROOM, "params": ["a"], "coalesce_ms": 1500}))
        .await;
    assert_eq!(ws.event(&plain).await["type"], "snapshot");
    assert_eq!(ws.event(&folded).await["type"], "snapshot");

    let burst: Vec<Value> = (1..=10).map(|n| upsert(1, "a", n)).collect();
    let seqs = ws.mutates(100, &burst).await;
    for (i, seq) in seqs.iter().enumerate() {
        let d = ws.event(&plain).await;
        assert_eq!(
            (d["type"].as_str(), d["seq"].as_u64()),
            (Some("diff"), Some(*seq)),
            "{i}: {d}"
        );
    }
    let d = ws.event(&folded).await;
    assert_eq!(d["type"], "diff", "{d}");
    assert_eq!(
        d["seq"],
        json!(seqs[9]),
        "labelled with the window's last seq: {d}"
    );
    assert_eq!(
        d["changes"],
        json!([{"op": "change", "key": 1, "row": {"id": 1, "room": "a", "n": 10}}])
    );
    let folded_seq = seqs[9];

    // Resume a coalescing subscription from the folded seq: exactly the later diffs.
    ws.send(json!({"id": "u", "type": "unsubscribe", "qid": folded}))
        .await;
    assert_eq!(ws.reply(&json!("u")).await["type"], "unsubscribed");
    let later = ws
        .mutates(200, &[upsert(3, "a", 1), upsert(9, "b", 1)])
        .await;
    let again = json!("again");
    ws.send(json!({"type": "subscribe", "qid": again, "sql": ROOM, "params": ["a"], "since": folded_seq, "coalesce_ms": 10}))
        .await;
    let d = ws.event(&again).await;
    assert_eq!(
        (d["type"].as_str(), d["seq"].as_u64()),
        (Some("diff"), Some(later[0])),
        "{d}"
    );
    assert_eq!(d["changes"][0]["op"], "add");

    // Out of range: refused by name, nothing subscribed.
    ws.send(json!({"id": "big", "type": "subscribe", "qid": "x", "sql": ROOM, "params": ["a"], "coalesce_ms": 10_001}))
        .await;
    let r = ws.reply(&json!("big")).await;
    assert_eq!(r["error"]["code"], "limit", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("coalesce_ms_max"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_many_subscribes_a_batch_and_refuses_a_malformed_one_whole() {
    let (core, addr, _dir) = start("subscribe-many").await;
    let mut ws = Client::connect(addr).await;
    ws.mutates(1, &[upsert(1, "r7", 5)]).await;
    let n = 500;
    let mut subs: Vec<Value> = (0..n)
        .map(|i| json!({"qid": i, "sql": ROOM, "params": [format!("r{i}")]}))
        .collect();
    subs.push(json!({"qid": "bad", "sql": "SELECT nope FROM msg"}));
    ws.send(json!({"id": 1, "type": "subscribe_many", "subs": subs}))
        .await;
    let e = ws.reply(&json!(1)).await;
    assert_eq!(
        (e["type"].as_str(), &e["qid"]),
        (Some("error"), &json!("bad")),
        "{e}"
    );
    let r = ws.reply(&json!(1)).await;
    assert_eq!(
        r,
        json!({"type": "subscribed_many", "id": 1, "subscribed": n, "failed": 1})
    );
    for i in 0..n {
        let s = ws.event(&json!(i)).await;
        assert_eq!(s["type"], "snapshot", "{s}");
        let rows = if i == 7 { 1 } else { 0 };
        assert_eq!(s["rows"].as_array().unwrap().len(), rows, "{s}");
    }
    assert_eq!(core.live().stats().subscribers, n as usize);

    // A write reaches its one view.
    ws.mutates(10, &[upsert(2, "r42", 1)]).await;
    assert_eq!(ws.event(&json!(42)).await["changes"][0]["op"], "add");

    // Malformed (a qid already taken; an entry without sql; too many): nothing subscribed.
    let taken = json!({"id": 2, "type": "subscribe_many", "subs": [{"qid": "new", "sql": ROOM, "params": ["z"]}, {"qid": 3, "sql": ROOM, "params": ["z"]}]});
    let no_sql = json!({"id": 3, "type": "subscribe_many", "subs": [{"qid": "new", "sql": ROOM, "params": ["z"]}, {"qid": "n2"}]});
    let many: Vec<Value> = (0..10_001)
        .map(|i| json!({"qid": format!("m{i}"), "sql": ROOM}))
        .collect();
    let too_many = json!({"id": 4, "type": "subscribe_many", "subs": many});
    for (id, frame, code, named) in [
        (2, taken, "bad_request", "subs[1]"),
        (3, no_sql, "bad_request", "subs[1]"),
        (4, too_many, "limit", "subscribe_many_max"),
    ] {
        ws.send(frame).await;
        let r = ws.reply(&json!(id)).await;
        assert_eq!(r["error"]["code"], code, "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(named),
            "{r}"
        );
    }
    // Still exactly the first batch.
    ws.send(json!({"id": 5, "type": "ping"})).await;
    ws.reply(&json!(5)).await;
    assert_eq!(core.live().stats().subscribers, n as usize);
}

/// Reads `event:`/`data:` pairs off an SSE response.
struct Sse {
    response: reqwest::Response,
    buf: String,
}

impl Sse {
    async fn event(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event:") {
                        event = e.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if event.is_empty() {
                    continue; // a heartbeat
                }
                return (event, serde_json::from_str(&data).unwrap());
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("within the safety bound")
                .unwrap()
                .expect("open");
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_takes_coalesce_ms_and_topic_watches_deliver_every_record_in_batches() {
    let (_core, addr, _dir) = start("coalesce-sse").await;
    let http = common::http_client();
    let mut ws = Client::connect(addr).await;
    ws.mutates(1, &[upsert(1, "a", 0)]).await;
    let url = |extra: &str| {
        format!(
            "http://{addr}/v1/live?sql={}&params=%5B%22a%22%5D{extra}",
            urlencode(ROOM)
        )
    };
    let refused = http.get(url("&coalesce_ms=99999")).send().await.unwrap();
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("coalesce_ms_max"),
        "{body}"
    );

    let response = http.get(url("&coalesce_ms=1500")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut sse = Sse {
        response,
        buf: String::new(),
    };
    assert_eq!(sse.event().await.0, "snapshot");
    let burst: Vec<Value> = (1..=10).map(|n| upsert(1, "a", n)).collect();
    let seqs = ws.mutates(100, &burst).await;
    let (kind, d) = sse.event().await;
    assert_eq!(kind, "diff");
    assert_eq!(d["seq"], json!(seqs[9]), "{d}");
    assert_eq!(d["changes"].as_array().unwrap().len(), 1, "{d}");

    // A coalescing watch: every record once, in order.
    let put = http
        .put(format!("http://{addr}/v1/topics/chat"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{:?}", put.text().await);
    ws.send(json!({"id": "w", "type": "watch", "qid": "w", "topic": "chat", "coalesce_ms": 200}))
        .await;
    ws.send(json!({"id": "w2", "type": "watch", "qid": "w2", "topic": "other", "coalesce_ms": -1}))
        .await;
    let r = ws.reply(&json!("w2")).await;
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    let watching = ws.event(&json!("w")).await;
    assert_eq!(watching["type"], "watching", "{watching}");
    for i in 0..30 {
        ws.send(json!({"id": format!("a{i}"), "type": "append", "topic": "chat", "records": [{"data": i}]}))
            .await;
    }
    for i in 0..30 {
        let r = ws.reply(&json!(format!("a{i}"))).await;
        assert_eq!(r["type"], "result", "{r}");
    }
    for i in 0..30 {
        let rec = ws.event(&json!("chat")).await;
        assert_eq!(
            (rec["offset"].as_u64(), &rec["data"]),
            (Some(i), &json!(i)),
            "{rec}"
        );
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
