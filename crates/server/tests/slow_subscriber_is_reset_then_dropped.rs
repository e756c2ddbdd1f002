//! A live subscriber that stops reading is first reset, then disconnected with
//! `slow_subscriber`; the writer and a healthy subscriber of the same view carry on untouched,
//! and the stalled subscribers' queues are let go.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_log::Durability;
use sluice_server::{Core, Op};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(20);
/// Events a subscriber may have waiting before it is reset.
const QUEUE_MAX: usize = 8;
/// Writes run: at least this many, and more (up to the cap) until both stalled subscribers
/// were dropped. Each diff carries a ~4 KB row, so the minimum is ~12 MB per subscriber —
/// far more than the loopback socket buffers hide (about 1 MB when this was written).
const WRITES_MIN: usize = 3000;
const WRITES_MAX: usize = 12_000;
/// The writer keeps at most this many commits ahead of the healthy subscriber, below
/// QUEUE_MAX, so the healthy one is never the slow one even on a loaded machine.
const AHEAD_MAX: usize = QUEUE_MAX / 2;
/// Rows the writes cycle through (each write makes one of them the newest).
const ROWS: i64 = 4;

const SQL: &str = "SELECT id, ts, body FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 2";

async fn start(dir: &TempDir) -> (Core, SocketAddr) {
    common::serve(
        dir.path(),
        |config| {
            config.durability = Durability::Memory;
            config.live.subscriber_queue_max = QUEUE_MAX;
        },
        "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT NOT NULL, ts INTEGER NOT NULL, body TEXT)",
    )
    .await
}

fn upsert(id: i64, ts: i64, body: &str) -> Op {
    Op::Upsert {
        table: "msg".into(),
        row: json!({"id": id, "room": "a", "ts": ts, "body": body})
            .as_object()
            .unwrap()
            .clone(),
        if_version: None,
    }
}

fn live_path(since: Option<u64>) -> String {
    let mut url = reqwest::Url::parse("http://127.0.0.1/v1/live").unwrap();
    url.query_pairs_mut()
        .append_pair("sql", SQL)
        .append_pair("params", r#"["a"]"#);
    if let Some(s) = since {
        url.query_pairs_mut().append_pair("since", &s.to_string());
    }
    format!("{}?{}", url.path(), url.query().unwrap())
}

/// Sends `GET /v1/live` over a raw socket and reads only the response head.
async fn stalled_sse(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n\r\n",
        live_path(None),
        common::bearer()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, stream.read(&mut byte))
            .await
            .expect("response head in time")
            .unwrap();
        assert_eq!(n, 1, "the server answers");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    stream
}

type StalledWs = tokio_tungstenite::WebSocketStream<TcpStream>;

/// Opens `/v1/ws` and sends one subscribe; the socket is then left unread.
async fn stalled_ws(addr: SocketAddr) -> StalledWs {
    let stream = TcpStream::connect(addr).await.unwrap();
    let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some("sluice.json.v1"));
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    ws.send(Message::Text(
        json!({"type": "subscribe", "qid": "stuck", "sql": SQL, "params": ["a"]})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    ws
}

// ---------------------------------------------------------------------------------------------
// The healthy subscriber: an HTTP client reading the SSE stream and materialising it
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Healthy {
    seq: u64,
    keys: Vec<Value>,
    rows: Vec<Value>,
    snapshots: usize,
    resets: usize,
    diffs: usize,
}

impl Healthy {
    fn apply(&mut self, event: &str, data: &Value) {
        match event {
            "snapshot" => {
                self.snapshots += 1;
                if data["reset"] == true {
                    self.resets += 1;
                }
                self.keys = data["keys"].as_array().unwrap().clone();
                self.rows = data["rows"].as_array().unwrap().clone();
            }
            "diff" => {
                self.diffs += 1;
                for c in data["changes"].as_array().unwrap() {
                    let key = &c["key"];
                    let index = c.get("index").map(|i| i.as_u64().unwrap() as usize);
                    if c["op"] != "add" {
                        let at = self.keys.iter().position(|k| k == key).expect("present");
                        self.keys.remove(at);
                        self.rows.remove(at);
                    }
                    if c["op"] != "remove" {
                        let at = index.expect("an ordered view sends indexes");
                        self.keys.insert(at, key.clone());
                        self.rows.insert(at, c["row"].clone());
                    }
                }
            }
            other => panic!("the healthy subscriber got {other}: {data}"),
        }
        let seq = data["seq"].as_u64().unwrap();
        assert!(seq > self.seq, "seqs increase: {data}");
        self.seq = seq;
    }
}

async fn healthy_subscriber(
    addr: SocketAddr,
    state: Arc<Mutex<Healthy>>,
    seen: watch::Sender<u64>,
) {
    let client = common::http_client();
    let mut response = client
        .get(format!("http://{addr}{}", live_path(None)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = response.chunk().await.expect("read the stream") {
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8(block).unwrap();
            let (mut event, mut id, mut data) = (None, None, None);
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    event = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse::<u64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(v).unwrap());
                }
            }
            let (Some(event), Some(data)) = (event, data) else {
                continue; // a heartbeat
            };
            assert_eq!(id, data["seq"].as_u64(), "{data}");
            let seq = {
                let mut s = state.lock().unwrap();
                s.apply(&event, &data);
                s.seq
            };
            seen.send_replace(seq);
        }
    }
    panic!("the healthy stream ended");
}

// ---------------------------------------------------------------------------------------------

async fn wait_for_stats(
    core: &Core,
    what: &str,
    ok: impl Fn(&sluice_live::LiveStats) -> bool,
) -> sluice_live::LiveStats {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stats = core.live().stats();
        if ok(&stats) {
            return stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_reset_then_dropped() {
    let dir = TempDir::new("live-slow");
    let (core, addr) = start(&dir).await;
    let body = "x".repeat(4000);
    let seed: Vec<Op> = (0..ROWS).map(|id| upsert(id, id, &body)).collect();
    core.mutate(seed, None).await.unwrap();

    // Two subscribers that never read again, and one that does.
    let mut stalled_sse = stalled_sse(addr).await;
    let mut stalled_ws = stalled_ws(addr).await;
    let state = Arc::new(Mutex::new(Healthy::default()));
    let (seen_tx, mut seen) = watch::channel(0u64);
    let healthy = tokio::spawn(healthy_subscriber(addr, state.clone(), seen_tx));
    tokio::time::timeout(WAIT, seen.wait_for(|&s| s > 0))
        .await
        .expect("the healthy snapshot")
        .unwrap();
    let before = wait_for_stats(&core, "three subscribers", |s| s.subscribers == 3).await;
    assert_eq!(before.views, 1, "one shared view");
    assert_eq!((before.resets, before.slow_closed), (0, 0));

    // The writer: every write makes one row the newest, so every write changes the view.
    let commits_before = core.commits();
    let mut seqs: Vec<u64> = Vec::new();
    let mut n = 0usize;
    while n < WRITES_MIN || (n < WRITES_MAX && core.live().stats().slow_closed < 2) {
        if n >= AHEAD_MAX {
            let behind = seqs[n - AHEAD_MAX];
            tokio::time::timeout(WAIT, seen.wait_for(|&s| s >= behind))
                .await
                .expect("the healthy subscriber keeps up")
                .unwrap();
        }
        let id = n as i64 % ROWS;
        let ok = core
            .mutate(
                vec![upsert(id, 1000 + n as i64, &body)],
                Some(Durability::Memory),
            )
            .await
            .expect("every write is acknowledged");
        assert!(seqs.last().is_none_or(|&last| ok.seq > last));
        seqs.push(ok.seq);
        n += 1;
    }
    // (a) Every write was acknowledged and committed: the stalled subscribers never held the
    // writer up (only this test paces it, by the healthy reader, with a bounded wait).
    assert_eq!(core.commits() - commits_before, n as u64, "{n} commits");
    let last = *seqs.last().unwrap();

    // (b) The healthy subscriber saw every diff, with no reset, and holds the result.
    tokio::time::timeout(WAIT, seen.wait_for(|&s| s >= last))
        .await
        .expect("the healthy subscriber reaches the last write")
        .unwrap();
    let reply = common::http_client()
        .post(format!("http://{addr}/v1/query"))
        .json(&json!({"sql": SQL, "params": ["a"]}))
        .send()
        .await
        .unwrap();
    let expected: Value = reply.json().await.unwrap();
    {
        let h = state.lock().unwrap();
        assert_eq!(h.seq, last);
        assert_eq!(&h.rows, expected["rows"].as_array().unwrap());
        assert_eq!(h.rows.len(), 2);
        assert_eq!((h.snapshots, h.resets), (1, 0), "never reset");
        assert_eq!(h.diffs, n, "a diff per write");
    }

    // (c), (d) Each stalled subscriber was reset once it was QUEUE_MAX behind, then closed when
    // it fell that far behind again; the live engine forgot them (and their queues), keeping
    // the one healthy subscriber and the one view.
    let after = wait_for_stats(&core, "the stalled subscribers dropped", |s| {
        s.subscribers == 1 && s.slow_closed >= 2
    })
    .await;
    assert!(
        after.resets >= 2,
        "each stalled subscriber was reset first: {after:?}"
    );
    assert_eq!(after.slow_closed, 2, "only the stalled ones: {after:?}");
    assert_eq!(after.views, 1);
    assert!(after.diffs >= n as u64, "{after:?}");

    // When the stalled clients read at last, what the sockets held ends with the
    // slow_subscriber error (the reset snapshot that preceded it was coalesced away).
    let mut received = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let needle = b"slow_subscriber";
    loop {
        let n = tokio::time::timeout(WAIT, stalled_sse.read(&mut buf))
            .await
            .expect("the stalled SSE stream drains")
            .unwrap();
        received.extend_from_slice(&buf[..n]);
        if n == 0 || received.windows(needle.len()).any(|w| w == needle) {
            break;
        }
        // Keep only a tail long enough to find the needle across reads.
        if received.len() > 1 << 20 {
            received.drain(..received.len() - 4096);
        }
    }
    let text = String::from_utf8_lossy(&received);
    let at = text.find("slow_subscriber").expect("the SSE error event");
    assert!(
        text[..at].contains("event: error"),
        "an error event: {}",
        &text[at.saturating_sub(200)..]
    );
    let error = loop {
        let msg = tokio::time::timeout(WAIT, stalled_ws.next())
            .await
            .expect("the stalled WebSocket drains")
            .expect("the connection is open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            assert_eq!(v["qid"], "stuck", "{v}");
            if v["type"] == "error" {
                break v;
            }
            assert!(v["type"] == "snapshot" || v["type"] == "diff", "{v}");
        }
    };
    assert_eq!(error["error"]["code"], "slow_subscriber", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subscriber_queue_max"),
        "{error}"
    );
    // The connection itself stays usable.
    stalled_ws
        .send(Message::Text(
            json!({"type": "ping", "id": 1}).to_string().into(),
        ))
        .await
        .unwrap();
    loop {
        let msg = tokio::time::timeout(WAIT, stalled_ws.next())
            .await
            .expect("a pong")
            .expect("open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] == "pong" {
                break;
            }
            panic!("nothing but the pong after the error: {v}");
        }
    }

    // The qid is free again: subscribing anew starts over with a snapshot.
    stalled_ws
        .send(Message::Text(
            json!({"type": "subscribe", "qid": "stuck", "sql": SQL, "params": ["a"]})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let msg = tokio::time::timeout(WAIT, stalled_ws.next())
        .await
        .expect("a snapshot")
        .expect("open")
        .unwrap();
    let v: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
    assert_eq!(
        (&v["type"], &v["qid"], &v["seq"]),
        (&json!("snapshot"), &json!("stuck"), &json!(last)),
        "{v}"
    );
    assert_eq!(&v["rows"], &expected["rows"]);

    healthy.abort();
    core.shutdown().await.unwrap();
}
