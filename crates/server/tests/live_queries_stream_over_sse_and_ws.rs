//! Live queries over real sockets. SSE through an HTTP client: a scoped top-k follows the
//! one-shot query write by write (ids are seqs, heartbeats on an idle stream), a dropped stream
//! resumes with exactly the missed diffs (`Last-Event-ID` or `?since=`) or, past the view's
//! history, with a `reset` snapshot, and every unsupported construct is refused by name.
//! WebSocket: several subscriptions on one connection interleaved with writes, unsubscribe and
//! resume, the per-connection limit and bad subscribe requests.

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use common::TempDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_log::Durability;
use sluice_server::{Config, Core};
use tokio_tungstenite::tungstenite::Message;

/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(20);

const TOP3: &str = "SELECT id, room, ts, body FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 3";

// ---------------------------------------------------------------------------------------------
// Server harness
// ---------------------------------------------------------------------------------------------

struct Server {
    core: Core,
    addr: SocketAddr,
    http: reqwest::Client,
    _dir: TempDir,
}

async fn start(name: &str, configure: impl FnOnce(&mut Config)) -> Server {
    let dir = TempDir::new(name);
    let (core, addr) = common::serve(
        dir.path(),
        |config| {
            config.durability = Durability::Disk;
            configure(config);
        },
        "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT NOT NULL, ts INTEGER NOT NULL, body TEXT)",
    )
    .await;
    let http = common::http_client();
    Server {
        core,
        addr,
        http,
        _dir: dir,
    }
}

impl Server {
    /// Commits `ops` (the JSON ops of a mutate) through `core.mutate` or `POST /v1/mutate`;
    /// returns the commit's seq.
    async fn write(&self, ops: Value, via_http: bool) -> u64 {
        if via_http {
            let reply = self
                .http
                .post(format!("http://{}/v1/mutate", self.addr))
                .json(&json!({ "ops": ops }))
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status(), 200);
            let body: Value = reply.json().await.unwrap();
            body["seq"].as_u64().expect("a seq")
        } else {
            let mut body = json!({ "ops": ops }).as_object().unwrap().clone();
            let ops = sluice_server::api::parse_ops(&mut body, 1000).unwrap();
            self.core.mutate(ops, None).await.expect("committed").seq
        }
    }

    /// `POST /v1/query`: the seq it reflects and its rows.
    async fn query(&self, sql: &str, params: &Value) -> (u64, Vec<Value>) {
        let reply = self
            .http
            .post(format!("http://{}/v1/query", self.addr))
            .json(&json!({"sql": sql, "params": params}))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
        let body: Value = reply.json().await.unwrap();
        (
            body["seq"].as_u64().unwrap(),
            body["rows"].as_array().unwrap().clone(),
        )
    }

    fn live_url(&self, sql: &str, params: &Value, since: Option<&str>) -> reqwest::Url {
        let mut url = reqwest::Url::parse(&format!("http://{}/v1/live", self.addr)).unwrap();
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("sql", sql);
            if !params.is_null() {
                q.append_pair("params", &params.to_string());
            }
            if let Some(s) = since {
                q.append_pair("since", s);
            }
        }
        url
    }

    /// `GET /v1/live`, expecting a stream.
    async fn sse(
        &self,
        sql: &str,
        params: &Value,
        since: Option<&str>,
        last_event_id: Option<u64>,
    ) -> Sse {
        let mut request = self.http.get(self.live_url(sql, params, since));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = tokio::time::timeout(WAIT, request.send())
            .await
            .expect("response headers in time")
            .unwrap();
        assert_eq!(response.status(), 200, "GET /v1/live {sql}");
        let ct = response.headers()["content-type"].to_str().unwrap();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Sse {
            response,
            buf: Vec::new(),
        }
    }

    /// `GET /v1/live` expected to fail before streaming: status and JSON body.
    async fn sse_refused(&self, sql: &str, params: &Value, since: Option<&str>) -> (u16, Value) {
        let response = self
            .http
            .get(self.live_url(sql, params, since))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("a JSON error body");
        (status, body)
    }
}

fn insert(id: i64, room: &str, ts: i64, body: &str) -> Value {
    json!({"op": "insert", "table": "msg", "row": {"id": id, "room": room, "ts": ts, "body": body}})
}

fn patch(id: &Value, set: Value) -> Value {
    json!({"op": "patch", "table": "msg", "id": id, "set": set})
}

fn delete(id: &Value) -> Value {
    json!({"op": "delete", "table": "msg", "id": id})
}

/// Ten rows over rooms a, b, c with distinct timestamps.
async fn seed(srv: &Server) {
    let ops: Vec<Value> = (1..=10)
        .map(|i| insert(i, ["a", "b", "c"][i as usize % 3], i * 10, &format!("m{i}")))
        .collect();
    srv.write(Value::Array(ops), false).await;
}

// ---------------------------------------------------------------------------------------------
// SSE client
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum Block {
    /// Only comment lines: a heartbeat.
    Heartbeat,
    Event {
        event: String,
        id: Option<String>,
        data: String,
    },
}

struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next block of the stream, or `None` at its end.
    async fn block(&mut self) -> Option<Block> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8 events");
                let (mut event, mut id, mut data) = (None, None, Vec::new());
                for line in text.lines().filter(|l| !l.is_empty()) {
                    if line.starts_with(':') {
                        continue;
                    }
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                    match field {
                        "event" => event = Some(value),
                        "id" => id = Some(value),
                        "data" => data.push(value),
                        other => panic!("unexpected SSE field {other:?} in {text:?}"),
                    }
                }
                if event.is_none() && id.is_none() && data.is_empty() {
                    return Some(Block::Heartbeat);
                }
                return Some(Block::Event {
                    event: event.unwrap_or_else(|| "message".into()),
                    id,
                    data: data.join("\n"),
                });
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("the stream to move within the safety bound")
                .expect("read the stream");
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return None,
            }
        }
    }

    /// The next event, skipping heartbeats: (event, id, raw data, parsed data).
    async fn event(&mut self) -> (String, Option<u64>, String, Value) {
        loop {
            match self.block().await.expect("the stream ended early") {
                Block::Heartbeat => continue,
                Block::Event { event, id, data } => {
                    let parsed: Value = serde_json::from_str(&data).expect("JSON data");
                    let id = id.map(|i| i.parse::<u64>().expect("a numeric id"));
                    return (event, id, data, parsed);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client-side materialisation, as docs/protocol.md says to apply events
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct Mat {
    seq: u64,
    columns: Vec<String>,
    keys: Vec<Value>,
    rows: Vec<Value>,
    checksum: String,
}

fn json_to_value(v: &Value) -> sluice_engine::Value {
    use sluice_engine::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Bool(b) => V::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => V::Integer(i),
            None => V::Real(n.as_f64().unwrap()),
        },
        Value::String(s) => V::Text(s.as_str().into()),
        other => panic!("no column of this test holds {other}"),
    }
}

impl Mat {
    fn snapshot(body: &Value) -> Mat {
        let keys = body["keys"].as_array().expect("keys").clone();
        let rows = body["rows"].as_array().expect("rows").clone();
        assert_eq!(keys.len(), rows.len(), "a key per row: {body}");
        let mat = Mat {
            seq: body["seq"].as_u64().expect("seq"),
            columns: body["columns"]
                .as_array()
                .expect("columns")
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect(),
            keys,
            rows,
            checksum: body["checksum"].as_str().expect("checksum").to_string(),
        };
        mat.verify_checksum();
        mat
    }

    fn position(&self, key: &Value) -> Option<usize> {
        self.keys.iter().position(|k| k == key)
    }

    fn apply(&mut self, diff: &Value) {
        let seq = diff["seq"].as_u64().expect("seq");
        assert!(seq > self.seq, "diff {seq} after {}: {diff}", self.seq);
        let changes = diff["changes"].as_array().expect("changes");
        assert!(!changes.is_empty(), "a diff changes something: {diff}");
        for c in changes {
            let key = &c["key"];
            let index = c.get("index").map(|i| i.as_u64().unwrap() as usize);
            match c["op"].as_str().unwrap() {
                "remove" => {
                    let at = self
                        .position(key)
                        .unwrap_or_else(|| panic!("remove of absent {key}: {diff}"));
                    if let Some(i) = index {
                        assert_eq!(i, at, "remove index is where the row was: {diff}");
                    }
                    self.keys.remove(at);
                    self.rows.remove(at);
                }
                "add" => {
                    assert!(self.position(key).is_none(), "add of present {key}: {diff}");
                    let at = index.unwrap_or(self.keys.len());
                    assert!(at <= self.keys.len(), "add index {at} out of range: {diff}");
                    self.keys.insert(at, key.clone());
                    self.rows.insert(at, c["row"].clone());
                }
                "change" => {
                    let old = self
                        .position(key)
                        .unwrap_or_else(|| panic!("change of absent {key}: {diff}"));
                    self.keys.remove(old);
                    self.rows.remove(old);
                    let at = index.unwrap_or(old);
                    assert!(
                        at <= self.keys.len(),
                        "change index {at} out of range: {diff}"
                    );
                    self.keys.insert(at, key.clone());
                    self.rows.insert(at, c["row"].clone());
                }
                other => panic!("unknown op {other}: {diff}"),
            }
        }
        self.seq = seq;
        self.checksum = diff["checksum"].as_str().expect("checksum").to_string();
        self.verify_checksum();
    }

    /// The checksum the server sent is the documented hash of the rows held.
    fn verify_checksum(&self) {
        let rows: Vec<Vec<sluice_engine::Value>> = self
            .rows
            .iter()
            .map(|r| self.columns.iter().map(|c| json_to_value(&r[c])).collect())
            .collect();
        let sum = sluice_live::checksum::checksum(rows.iter().map(|r| &r[..]));
        assert_eq!(
            sluice_live::checksum::render(sum),
            self.checksum,
            "checksum of {:?}",
            self.rows
        );
    }

    /// Rows in a canonical order, for unordered views.
    fn sorted(rows: &[Value]) -> Vec<Value> {
        let mut v = rows.to_vec();
        v.sort_by_key(|r| r.to_string());
        v
    }
}

// ---------------------------------------------------------------------------------------------
// SSE: a scoped top-k follows the one-shot query
// ---------------------------------------------------------------------------------------------

/// One write; if it changed the one-shot result, the next event must be its diff (so a
/// write that changes nothing sends nothing), and the materialisation must equal the result.
async fn step(
    srv: &Server,
    sse: &mut Sse,
    mat: &mut Mat,
    last_id: &mut u64,
    ops: Value,
    via_http: bool,
) -> bool {
    let params = json!(["a"]);
    let (_, before) = srv.query(TOP3, &params).await;
    let seq = srv.write(ops.clone(), via_http).await;
    let (qseq, after) = srv.query(TOP3, &params).await;
    assert!(qseq >= seq);
    let changed = before != after;
    if changed {
        let (event, id, _, data) = sse.event().await;
        assert_eq!(event, "diff", "{data}");
        assert_eq!(id, Some(seq), "the id is the seq of the commit: {data}");
        assert_eq!(data["seq"], seq);
        assert!(seq > *last_id, "ids strictly increase");
        *last_id = seq;
        mat.apply(&data);
    }
    assert_eq!(mat.rows, after, "after {ops}");
    changed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_top_k_follows_the_one_shot_query_with_seq_ids_and_heartbeats() {
    let srv = start("live-sse-topk", |c| {
        c.live_heartbeat = Duration::from_millis(200);
    })
    .await;
    seed(&srv).await;
    let params = json!(["a"]);
    let mut sse = srv.sse(TOP3, &params, None, None).await;
    let (event, id, _, data) = sse.event().await;
    assert_eq!(event, "snapshot", "{data}");
    assert_eq!(id, data["seq"].as_u64(), "the id is the seq");
    assert!(data.get("reset").is_none(), "a first snapshot is no reset");
    assert_eq!(data["columns"], json!(["id", "room", "ts", "body"]));
    let mut mat = Mat::snapshot(&data);
    let mut last_id = mat.seq;
    assert_eq!(mat.rows, srv.query(TOP3, &params).await.1);
    assert_eq!(mat.rows.len(), 3);

    // (what, the write given the rows held, whether it changes the view)
    type Write = fn(&Mat) -> Value;
    let script: [(&str, Write, bool); 13] = [
        (
            "a newest message enters at the top, the oldest leaves",
            |_| json!([insert(100, "a", 1000, "hello")]),
            true,
        ),
        (
            "another room does not touch the view",
            |_| json!([insert(101, "b", 1010, "x")]),
            false,
        ),
        (
            "too old to enter the window",
            |_| json!([insert(102, "a", 5, "old")]),
            false,
        ),
        (
            "a visible row edited in place",
            |_| json!([patch(&json!(100), json!({"body": "edited"}))]),
            true,
        ),
        (
            "the same edit again changes no value: nothing is sent",
            |_| json!([patch(&json!(100), json!({"body": "edited"}))]),
            false,
        ),
        (
            "the last visible row moves to the top",
            |m| json!([patch(&m.keys[2], json!({"ts": 1020}))]),
            true,
        ),
        (
            "a visible row deleted: the next one refills the window",
            |m| json!([delete(&m.keys[1])]),
            true,
        ),
        (
            "a visible row moves to another room",
            |m| json!([patch(&m.keys[0], json!({"room": "b"}))]),
            true,
        ),
        (
            "several rows in one commit: one diff",
            |_| {
                json!([
                    insert(103, "a", 1030, "p"),
                    insert(104, "b", 1040, "q"),
                    insert(105, "a", 1050, "r")
                ])
            },
            true,
        ),
        (
            "a row outside the window deleted",
            |_| json!([delete(&json!(102))]),
            false,
        ),
        (
            "an upsert enters the window",
            |_| json!([{"op": "upsert", "table": "msg", "row": {"id": 106, "room": "a", "ts": 1060, "body": "u"}}]),
            true,
        ),
        (
            "another room again",
            |_| json!([insert(107, "c", 1070, "c")]),
            false,
        ),
        // The last write changes the view, so no event was sent for any write that did not.
        (
            "a row of room b moves into room a at the top",
            |_| json!([patch(&json!(104), json!({"room": "a"}))]),
            true,
        ),
    ];
    for (i, (what, write, changes)) in script.into_iter().enumerate() {
        let ops = write(&mat);
        let changed = step(&srv, &mut sse, &mut mat, &mut last_id, ops, i % 2 == 1).await;
        assert_eq!(changed, changes, "{what}");
    }

    // An idle stream carries heartbeat comments and nothing else.
    let mut heartbeats = 0;
    while heartbeats < 2 {
        match sse.block().await.expect("the stream stays open") {
            Block::Heartbeat => heartbeats += 1,
            other => panic!("no event without a write: {other:?}"),
        }
    }
    // And it still follows writes after a heartbeat.
    assert!(
        step(
            &srv,
            &mut sse,
            &mut mat,
            &mut last_id,
            json!([insert(108, "a", 1080, "z")]),
            true
        )
        .await
    );
    srv.core.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// SSE: resume
// ---------------------------------------------------------------------------------------------

/// Polls the live engine's counters until `ok` holds (the live thread updates them each round).
async fn live_stats_until(
    srv: &Server,
    what: &str,
    ok: impl Fn(&sluice_live::LiveStats) -> bool,
) -> sluice_live::LiveStats {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stats = srv.core.live().stats();
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

/// Writes `n` rows to room a, each the newest (so each changes the view); returns their seqs.
async fn newest_in_a(srv: &Server, next_id: &mut i64, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    for _ in 0..n {
        *next_id += 1;
        let id = *next_id;
        seqs.push(
            srv.write(json!([insert(id, "a", 10_000 + id, "new")]), id % 2 == 0)
                .await,
        );
    }
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sse_stream_resumes_with_exactly_the_missed_diffs() {
    let srv = start("live-sse-resume", |_| {}).await;
    seed(&srv).await;
    let params = json!(["a"]);
    let mut control = srv.sse(TOP3, &params, None, None).await;
    let mut client = srv.sse(TOP3, &params, None, None).await;
    let (_, _, _, snap) = control.event().await;
    let mut control_mat = Mat::snapshot(&snap);
    let (_, _, _, snap) = client.event().await;
    let mut mat = Mat::snapshot(&snap);
    assert_eq!(mat.seq, control_mat.seq, "one shared view");

    let mut next_id = 1000;
    for seq in newest_in_a(&srv, &mut next_id, 3).await {
        for (sse, m) in [(&mut control, &mut control_mat), (&mut client, &mut mat)] {
            let (event, id, _, data) = sse.event().await;
            assert_eq!((event.as_str(), id), ("diff", Some(seq)));
            m.apply(&data);
        }
    }
    let last = mat.seq;
    drop(client);
    // The server notices the client left and lets go of its subscription.
    live_stats_until(&srv, "the dropped client unsubscribed", |s| {
        s.subscribers == 1
    })
    .await;

    // Missed while away: four changing writes and two that change nothing.
    let mut missed = newest_in_a(&srv, &mut next_id, 1).await;
    srv.write(json!([insert(2000, "b", 1, "b")]), false).await;
    missed.extend(newest_in_a(&srv, &mut next_id, 1).await);
    srv.write(json!([insert(2001, "a", 2, "too old")]), true)
        .await;
    missed.extend(newest_in_a(&srv, &mut next_id, 2).await);
    let mut control_events = Vec::new();
    for &seq in &missed {
        let (event, id, raw, data) = control.event().await;
        assert_eq!((event.as_str(), id), ("diff", Some(seq)));
        control_mat.apply(&data);
        control_events.push((id, raw));
    }

    // Back with Last-Event-ID (which wins over a `since` that would mean a reset): exactly
    // the missed diffs, byte for byte what the control got, and no snapshot.
    let mut client = srv.sse(TOP3, &params, Some("0"), Some(last)).await;
    for (id, raw) in &control_events {
        let (event, got_id, got_raw, data) = client.event().await;
        assert_eq!(event, "diff", "no snapshot on an exact resume: {got_raw}");
        assert_eq!(&got_id, id);
        assert_eq!(&got_raw, raw);
        mat.apply(&data);
    }
    assert_eq!(mat.rows, control_mat.rows);
    assert_eq!(mat.checksum, control_mat.checksum);
    assert_eq!(mat.rows, srv.query(TOP3, &params).await.1);
    // Nothing else was queued: the next event of both is the next write's diff.
    let seq = newest_in_a(&srv, &mut next_id, 1).await[0];
    for (sse, m) in [(&mut control, &mut control_mat), (&mut client, &mut mat)] {
        let (event, id, _, data) = sse.event().await;
        assert_eq!((event.as_str(), id), ("diff", Some(seq)));
        m.apply(&data);
    }

    // Everyone leaves; the view stays warm (idle_ttl) and keeps following commits; `?since=`
    // resumes exactly like Last-Event-ID.
    let last = mat.seq;
    drop(client);
    drop(control);
    live_stats_until(&srv, "no subscribers, one warm view", |s| {
        s.subscribers == 0 && s.views == 1
    })
    .await;
    let missed = newest_in_a(&srv, &mut next_id, 3).await;
    let mut client = srv.sse(TOP3, &params, Some(&last.to_string()), None).await;
    for seq in missed {
        let (event, id, _, data) = client.event().await;
        assert_eq!((event.as_str(), id), ("diff", Some(seq)), "{data}");
        mat.apply(&data);
    }
    assert_eq!(mat.rows, srv.query(TOP3, &params).await.1);
    srv.core.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_past_the_view_history_gets_a_reset_snapshot() {
    let srv = start("live-sse-horizon", |c| {
        c.live.history_diffs_max = 4;
    })
    .await;
    seed(&srv).await;
    let params = json!(["a"]);
    // A control keeps the view subscribed throughout.
    let mut control = srv.sse(TOP3, &params, None, None).await;
    let (_, _, _, snap) = control.event().await;
    let mut control_mat = Mat::snapshot(&snap);
    let mut client = srv.sse(TOP3, &params, None, None).await;
    let (_, _, _, snap) = client.event().await;
    let mut mat = Mat::snapshot(&snap);
    let mut next_id = 1000;
    let seq = newest_in_a(&srv, &mut next_id, 1).await[0];
    for (sse, m) in [(&mut control, &mut control_mat), (&mut client, &mut mat)] {
        let (_, id, _, data) = sse.event().await;
        assert_eq!(id, Some(seq));
        m.apply(&data);
    }
    let last = mat.seq;
    drop(client);

    // Six changing commits: the view keeps only the last four diffs.
    let seqs = newest_in_a(&srv, &mut next_id, 6).await;
    for &seq in &seqs {
        let (_, id, _, data) = control.event().await;
        assert_eq!(id, Some(seq));
        control_mat.apply(&data);
    }
    let (_, expected) = srv.query(TOP3, &params).await;

    // From before the history, by Last-Event-ID and by ?since=: a reset snapshot of now.
    for (since, header) in [(None, Some(last)), (Some(last.to_string()), None)] {
        let mut client = srv.sse(TOP3, &params, since.as_deref(), header).await;
        let (event, id, _, data) = client.event().await;
        assert_eq!(event, "snapshot", "{data}");
        assert_eq!(data["reset"], true, "{data}");
        assert_eq!(id, Some(*seqs.last().unwrap()));
        let m = Mat::snapshot(&data);
        assert_eq!(m.rows, expected);
        assert_eq!(m.checksum, control_mat.checksum);
    }
    // Right at the horizon the history still has every diff after it.
    let mut client = srv.sse(TOP3, &params, None, Some(seqs[1])).await;
    for &seq in &seqs[2..] {
        let (event, id, _, data) = client.event().await;
        assert_eq!((event.as_str(), id), ("diff", Some(seq)), "{data}");
    }
    // One diff earlier is past it.
    let mut client = srv.sse(TOP3, &params, None, Some(seqs[0])).await;
    let (event, _, _, data) = client.event().await;
    assert_eq!(event, "snapshot");
    assert_eq!(data["reset"], true);
    // A seq the view never reached is not resumable either.
    let mut client = srv.sse(TOP3, &params, None, Some(u64::MAX / 2)).await;
    let (event, _, _, data) = client.event().await;
    assert_eq!(event, "snapshot");
    assert_eq!(data["reset"], true);
    assert_eq!(Mat::snapshot(&data).rows, expected);
    srv.core.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// SSE: refusals before streaming
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_refuses_unsupported_constructs_by_name_and_bad_requests() {
    let srv = start("live-sse-refuse", |_| {}).await;
    seed(&srv).await;
    let unsupported = [
        ("SELECT DISTINCT room FROM msg", "DISTINCT"),
        ("SELECT id FROM msg UNION SELECT id FROM msg", "UNION"),
        (
            "SELECT id FROM msg INTERSECT SELECT id FROM msg",
            "INTERSECT",
        ),
        (
            "SELECT id, ROW_NUMBER() OVER (ORDER BY ts) AS r FROM msg",
            "window function",
        ),
        (
            "SELECT id FROM msg m WHERE EXISTS (SELECT 1 FROM msg x WHERE x.room = m.room)",
            "EXISTS",
        ),
        (
            "SELECT id FROM msg m WHERE m.id IN (SELECT x.id FROM msg x WHERE x.ts > m.ts)",
            "correlated subquery",
        ),
        ("WITH r AS (SELECT id FROM msg) SELECT id FROM r", "WITH"),
        (
            "SELECT m.id FROM msg m FULL JOIN msg x ON m.id = x.id",
            "FULL JOIN",
        ),
        (
            "SELECT m.id FROM msg m RIGHT JOIN msg x ON m.id = x.id",
            "RIGHT JOIN",
        ),
        ("SELECT id FROM (SELECT id FROM msg) t", "subquery in FROM"),
    ];
    for (sql, name) in unsupported {
        let (status, body) = srv.sse_refused(sql, &Value::Null, None).await;
        assert_eq!(status, 400, "{sql}: {body}");
        assert_eq!(body["error"]["code"], "unsupported", "{sql}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(name), "{sql}: {message:?} names {name:?}");
    }
    let bad = [
        (
            "SELECT id FROM nowhere",
            Value::Null,
            None,
            404,
            "not_found",
        ),
        (
            "SELECT id FROM msg WHERE room = $1",
            Value::Null,
            None,
            400,
            "bad_request",
        ),
        (
            "SELECT id FROM msg WHERE room = $1",
            json!(["a", "b"]),
            None,
            400,
            "bad_request",
        ),
        (
            "SELECT id FROM msg WHERE room = $1",
            json!([["a"]]),
            None,
            400,
            "bad_request",
        ),
        ("SELECT nope FROM msg", Value::Null, None, 400, "schema"),
        (
            "SELECT id FROM msg",
            Value::Null,
            Some("soon"),
            400,
            "bad_request",
        ),
        ("SELEC id", Value::Null, None, 400, "bad_request"),
    ];
    for (sql, params, since, status, code) in bad {
        let (got, body) = srv.sse_refused(sql, &params, since).await;
        assert_eq!(got, status, "{sql}: {body}");
        assert_eq!(body["error"]["code"], code, "{sql}: {body}");
    }
    // Unparseable params text and a missing sql.
    let url = format!(
        "http://{}/v1/live?sql=SELECT%20id%20FROM%20msg&params=%5B",
        srv.addr
    );
    let reply = srv.http.get(url).send().await.unwrap();
    assert_eq!(reply.status(), 400);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_request");
    let reply = srv
        .http
        .get(format!("http://{}/v1/live", srv.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);
    assert_eq!(
        srv.core.live().stats().subscribers,
        0,
        "no refusal subscribed"
    );
    srv.core.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// WebSocket
// ---------------------------------------------------------------------------------------------

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket client that files live events by qid and replies by id.
struct WsClient {
    ws: Ws,
    events: HashMap<String, VecDeque<Value>>,
    replies: HashMap<String, Value>,
}

impl WsClient {
    async fn connect(addr: SocketAddr) -> WsClient {
        let request = common::ws_request(&format!("ws://{addr}/v1/ws"), Some("sluice.json.v1"));
        let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
        assert_eq!(
            response.headers().get("Sec-WebSocket-Protocol").unwrap(),
            "sluice.json.v1"
        );
        WsClient {
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

    /// Reads one message and files it: replies carry the request's `id`, events do not.
    async fn pump(&mut self) {
        let msg = tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("a message within the safety bound")
            .expect("the connection stays open")
            .unwrap();
        let v: Value = match msg {
            Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
            other => panic!("unexpected {other:?}"),
        };
        if let Some(id) = v.get("id") {
            let previous = self.replies.insert(id.to_string(), v.clone());
            assert!(previous.is_none(), "one reply per id: {v}");
        } else {
            let qid = v
                .get("qid")
                .unwrap_or_else(|| panic!("an event names its qid: {v}"));
            self.events.entry(qid.to_string()).or_default().push_back(v);
        }
    }

    async fn reply(&mut self, id: &Value) -> Value {
        loop {
            if let Some(v) = self.replies.remove(&id.to_string()) {
                return v;
            }
            self.pump().await;
        }
    }

    async fn event(&mut self, qid: &Value) -> Value {
        loop {
            if let Some(v) = self
                .events
                .get_mut(&qid.to_string())
                .and_then(VecDeque::pop_front)
            {
                return v;
            }
            self.pump().await;
        }
    }

    fn queued_events(&self, qid: &Value) -> usize {
        self.events.get(&qid.to_string()).map_or(0, VecDeque::len)
    }

    async fn mutate(&mut self, id: &Value, ops: Value) -> u64 {
        self.send(json!({"id": id, "type": "mutate", "ops": ops}))
            .await;
        let reply = self.reply(id).await;
        assert_eq!(reply["type"], "result", "{reply}");
        reply["seq"].as_u64().unwrap()
    }

    /// A subscribe expected to fail: the error reply.
    async fn refused(&mut self, id: &str, mut request: Value) -> Value {
        request["id"] = json!(id);
        request["type"] = json!("subscribe");
        self.send(request.clone()).await;
        let reply = self.reply(&json!(id)).await;
        assert_eq!(reply["type"], "error", "{request}: {reply}");
        assert_eq!(
            reply["qid"],
            request.get("qid").cloned().unwrap_or(Value::Null)
        );
        reply
    }
}

const ROOM: &str = "SELECT id, room, ts FROM msg WHERE room = $1";
const COUNTS: &str = "SELECT room, COUNT(*) AS n FROM msg GROUP BY room";

/// The events a write must cause: for each view whose one-shot result changed, one diff at
/// the write's seq; afterwards the materialisations equal the one-shot results.
async fn follow(
    srv: &Server,
    ws: &mut WsClient,
    views: &mut [(&Value, &str, &Value, &mut Mat, &mut Vec<Value>)],
    seq: u64,
) {
    for (qid, sql, params, mat, expected) in views.iter_mut() {
        let (_, now) = srv.query(sql, params).await;
        if Mat::sorted(&now) != Mat::sorted(expected) {
            let event = ws.event(qid).await;
            assert_eq!(event["type"], "diff", "{event}");
            assert_eq!(event["seq"], seq, "{event}");
            mat.apply(&event);
        }
        assert_eq!(Mat::sorted(&mat.rows), Mat::sorted(&now), "{sql}");
        **expected = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_subscriptions_follow_interleaved_writes_unsubscribe_and_resume() {
    let srv = start("live-ws", |_| {}).await;
    seed(&srv).await;
    let mut ws = WsClient::connect(srv.addr).await;
    let inbox = json!("inbox");
    let counts = json!(7);
    let room_b = json!(["b"]);
    ws.send(json!({"type": "subscribe", "qid": inbox, "sql": ROOM, "params": room_b}))
        .await;
    ws.send(json!({"type": "subscribe", "qid": counts, "sql": COUNTS}))
        .await;
    let snap = ws.event(&inbox).await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    let mut inbox_mat = Mat::snapshot(&snap);
    let snap = ws.event(&counts).await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    let mut counts_mat = Mat::snapshot(&snap);
    assert_eq!(
        snap["keys"].as_array().unwrap().len(),
        3,
        "three rooms: {snap}"
    );
    let mut inbox_rows = srv.query(ROOM, &room_b).await.1;
    let mut counts_rows = srv.query(COUNTS, &Value::Null).await.1;
    assert_eq!(Mat::sorted(&inbox_mat.rows), Mat::sorted(&inbox_rows));
    assert_eq!(Mat::sorted(&counts_mat.rows), Mat::sorted(&counts_rows));

    // Writes on the same connection, one at a time.
    let script = [
        json!([insert(200, "b", 2000, "1")]),              // both
        json!([insert(201, "d", 2010, "2")]),              // counts only (a new group)
        json!([patch(&json!(200), json!({"ts": 1}))]),     // inbox only
        json!([patch(&json!(200), json!({"body": "x"}))]), // neither (body is not selected)
        json!([delete(&json!(201))]),                      // counts only (the group goes)
        json!([patch(&json!(2), json!({"room": "b"}))]),   // both (c → b)
        json!([delete(&json!(200)), insert(202, "a", 2020, "3")]), // both
    ];
    for (i, ops) in script.into_iter().enumerate() {
        let seq = ws.mutate(&json!(i), ops).await;
        follow(
            &srv,
            &mut ws,
            &mut [
                (&inbox, ROOM, &room_b, &mut inbox_mat, &mut inbox_rows),
                (
                    &counts,
                    COUNTS,
                    &Value::Null,
                    &mut counts_mat,
                    &mut counts_rows,
                ),
            ],
            seq,
        )
        .await;
    }
    // A burst of pipelined writes: replies by id, each view's diffs in seq order, and both
    // materialisations end where the one-shot queries are.
    let mut ids = Vec::new();
    for i in 0..10 {
        let id = json!(format!("burst-{i}"));
        let room = ["a", "b"][i % 2];
        ws.send(json!({"id": id, "type": "mutate", "ops": [insert(300 + i as i64, room, 3000 + i as i64, "p")]}))
            .await;
        ids.push(id);
    }
    let mut seqs = Vec::new();
    for id in &ids {
        let reply = ws.reply(id).await;
        assert_eq!(reply["type"], "result", "{reply}");
        seqs.push(reply["seq"].as_u64().unwrap());
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "applied in order");
    for (i, &seq) in seqs.iter().enumerate() {
        let event = ws.event(&counts).await;
        assert_eq!(event["seq"], seq, "every write changes the counts");
        counts_mat.apply(&event);
        if i % 2 == 1 {
            let event = ws.event(&inbox).await;
            assert_eq!(event["seq"], seq, "room b writes change the inbox");
            inbox_mat.apply(&event);
        }
    }
    inbox_rows = srv.query(ROOM, &room_b).await.1;
    counts_rows = srv.query(COUNTS, &Value::Null).await.1;
    assert_eq!(Mat::sorted(&inbox_mat.rows), Mat::sorted(&inbox_rows));
    assert_eq!(Mat::sorted(&counts_mat.rows), Mat::sorted(&counts_rows));

    // Unsubscribe the inbox: acknowledged, and no more events for it.
    ws.send(json!({"type": "unsubscribe", "qid": inbox, "id": "u1"}))
        .await;
    let reply = ws.reply(&json!("u1")).await;
    live_stats_until(&srv, "the inbox unsubscribed", |s| s.subscribers == 1).await;
    assert_eq!(
        reply,
        json!({"type": "unsubscribed", "qid": "inbox", "id": "u1"})
    );
    let left_at = inbox_mat.clone();
    let mut missed = Vec::new();
    for i in 0..3 {
        let seq = ws
            .mutate(
                &json!(format!("away-{i}")),
                json!([insert(400 + i, "b", 4000 + i, "m")]),
            )
            .await;
        let event = ws.event(&counts).await;
        assert_eq!(event["seq"], seq);
        counts_mat.apply(&event);
        missed.push(seq);
    }
    ws.send(json!({"type": "ping", "id": "ping"})).await;
    assert_eq!(ws.reply(&json!("ping")).await["type"], "pong");
    assert_eq!(ws.queued_events(&inbox), 0, "no events after unsubscribe");
    // Unsubscribing again names the unknown qid.
    ws.send(json!({"type": "unsubscribe", "qid": inbox, "id": "u2"}))
        .await;
    let reply = ws.reply(&json!("u2")).await;
    assert_eq!(reply["error"]["code"], "not_found", "{reply}");

    // Resubscribe with since: exactly the missed diffs, no snapshot.
    ws.send(json!({"type": "subscribe", "qid": inbox, "sql": ROOM, "params": room_b, "since": left_at.seq}))
        .await;
    let mut mat = left_at;
    for seq in missed {
        let event = ws.event(&inbox).await;
        assert_eq!(event["type"], "diff", "{event}");
        assert_eq!(event["seq"], seq, "{event}");
        mat.apply(&event);
    }
    inbox_rows = srv.query(ROOM, &room_b).await.1;
    assert_eq!(Mat::sorted(&mat.rows), Mat::sorted(&inbox_rows));
    // Followed again from there.
    let seq = ws
        .mutate(&json!("again"), json!([insert(500, "b", 5000, "again")]))
        .await;
    let event = ws.event(&inbox).await;
    assert_eq!(event["seq"], seq, "{event}");
    mat.apply(&event);
    let event = ws.event(&counts).await;
    assert_eq!(event["seq"], seq, "{event}");
    counts_mat.apply(&event);
    assert_eq!(
        Mat::sorted(&mat.rows),
        Mat::sorted(&srv.query(ROOM, &room_b).await.1)
    );
    assert_eq!(
        Mat::sorted(&counts_mat.rows),
        Mat::sorted(&srv.query(COUNTS, &Value::Null).await.1)
    );

    // Bad subscribes on this connection, each answered with its qid.
    let cases = [
        (
            json!({"qid": "d1", "sql": "SELECT DISTINCT room FROM msg"}),
            "unsupported",
            "DISTINCT",
        ),
        (
            json!({"qid": "d2", "sql": "SELECT id FROM msg UNION SELECT id FROM msg"}),
            "unsupported",
            "UNION",
        ),
        (
            json!({"qid": "t", "sql": "SELECT id FROM nowhere"}),
            "not_found",
            "nowhere",
        ),
        (
            json!({"qid": "p1", "sql": ROOM}),
            "bad_request",
            "parameter",
        ),
        (
            json!({"qid": "p2", "sql": ROOM, "params": 5}),
            "bad_request",
            "params",
        ),
        (
            json!({"qid": "p3", "sql": ROOM, "params": [{"x": 1}]}),
            "bad_request",
            "parameter",
        ),
        (
            json!({"qid": "s", "sql": ROOM, "params": ["b"], "since": "soon"}),
            "bad_request",
            "since",
        ),
        (
            json!({"qid": inbox, "sql": COUNTS}),
            "bad_request",
            "already subscribed",
        ),
        (
            json!({"qid": counts, "sql": ROOM, "params": ["a"]}),
            "bad_request",
            "already subscribed",
        ),
        (json!({"sql": COUNTS}), "bad_request", "qid"),
        (
            json!({"qid": {"no": 1}, "sql": COUNTS}),
            "bad_request",
            "qid",
        ),
        (json!({"qid": "nosql"}), "bad_request", "sql"),
    ];
    for (i, (request, code, names)) in cases.into_iter().enumerate() {
        let reply = ws.refused(&format!("bad-{i}"), request.clone()).await;
        assert_eq!(reply["error"]["code"], code, "{request}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(names),
            "{request}: {message:?} names {names:?}"
        );
    }
    // Refusals left the live subscriptions untouched.
    assert_eq!(ws.queued_events(&inbox) + ws.queued_events(&counts), 0);
    let seq = ws
        .mutate(&json!("last"), json!([insert(501, "b", 5010, "last")]))
        .await;
    for (qid, m) in [(&inbox, &mut mat), (&counts, &mut counts_mat)] {
        let event = ws.event(qid).await;
        assert_eq!(event["seq"], seq, "{event}");
        m.apply(&event);
    }
    srv.core.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_subscriptions_per_connection_are_limited() {
    let srv = start("live-ws-limit", |c| {
        c.live_subscriptions_per_connection_max = 2;
    })
    .await;
    seed(&srv).await;
    let mut ws = WsClient::connect(srv.addr).await;
    ws.send(json!({"type": "subscribe", "qid": "q1", "sql": COUNTS}))
        .await;
    ws.send(json!({"type": "subscribe", "qid": "q2", "sql": ROOM, "params": ["a"]}))
        .await;
    assert_eq!(ws.event(&json!("q1")).await["type"], "snapshot");
    assert_eq!(ws.event(&json!("q2")).await["type"], "snapshot");
    let reply = ws
        .refused("third", json!({"qid": "q3", "sql": ROOM, "params": ["b"]}))
        .await;
    assert_eq!(reply["error"]["code"], "limit", "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("subscriptions_per_connection_max"),
        "{message}"
    );
    // A duplicate qid is a bad request even at the limit.
    let reply = ws.refused("dup", json!({"qid": "q1", "sql": COUNTS})).await;
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    // Another connection has its own allowance.
    let mut other = WsClient::connect(srv.addr).await;
    other
        .send(json!({"type": "subscribe", "qid": "q3", "sql": ROOM, "params": ["b"]}))
        .await;
    assert_eq!(other.event(&json!("q3")).await["type"], "snapshot");
    // Unsubscribing frees a slot.
    ws.send(json!({"type": "unsubscribe", "qid": "q2", "id": "u"}))
        .await;
    assert_eq!(ws.reply(&json!("u")).await["type"], "unsubscribed");
    ws.send(json!({"type": "subscribe", "qid": "q3", "sql": ROOM, "params": ["b"]}))
        .await;
    assert_eq!(ws.event(&json!("q3")).await["type"], "snapshot");
    let reply = ws
        .refused("fourth", json!({"qid": "q4", "sql": ROOM, "params": ["c"]}))
        .await;
    assert_eq!(reply["error"]["code"], "limit", "{reply}");
    // Both still follow writes.
    let seq = ws
        .mutate(&json!("w"), json!([insert(100, "b", 1000, "w")]))
        .await;
    for qid in ["q1", "q3"] {
        assert_eq!(ws.event(&json!(qid)).await["seq"], seq);
    }
    assert_eq!(other.event(&json!("q3")).await["seq"], seq);
    // Closing the connections ends their subscriptions.
    drop(ws);
    drop(other);
    live_stats_until(&srv, "closed connections unsubscribed", |s| {
        s.subscribers == 0
    })
    .await;
    srv.core.shutdown().await.unwrap();
}
