//! The bench's live-query clients: an SSE subscriber (`GET /v1/live`), a WebSocket
//! connection holding many subscriptions (`/v1/ws`, JSON subprotocol), the writer
//! (`POST /v1/mutate`), and the client-side materialisation every subscriber keeps.
//!
//! Each subscriber stamps an event with the time its last byte arrived, tells the
//! measuring loop (a [`Note`]) and only then parses and applies it, so parsing and
//! checksumming are not part of the latency. The materialisation ([`Mat`]) keeps every
//! visible row's hash by result key and recomputes the view checksum the way
//! `docs/protocol.md` documents it (XXH3-64 of each row's canonical bytes, summed mod
//! 2^64) — an independent implementation — and compares it with the server's after every
//! snapshot and diff.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::transfer::clients::connect_ws_as;

/// The JSON subprotocol of `/v1/ws`.
pub const JSON_PROTOCOL: &str = "sluice.json.v1";
/// The qid the SSE subscriber reports under (SSE has one subscription per stream).
pub const SSE_QID: u64 = 0;
/// How long one request of the writer may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// What a subscriber tells the measuring loop.
#[derive(Debug)]
pub enum Note {
    Snapshot {
        qid: u64,
        seq: u64,
        rows: usize,
        reset: bool,
        at: Instant,
    },
    Diff {
        qid: u64,
        seq: u64,
        at: Instant,
    },
    Failed {
        qid: Option<u64>,
        message: String,
    },
}

// ---------------------------------------------------------------------------------------
// The client-side materialisation and the documented checksum.

/// Appends the canonical bytes of one JSON value (see `crates/live/src/checksum.rs` and
/// `docs/protocol.md`). The bench's schemas use only INTEGER, BOOLEAN and TEXT columns,
/// which JSON carries without loss; REAL is told from INTEGER by the number's form.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    let mut var = |tag: u8, bytes: &[u8]| {
        out.push(tag);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    match v {
        Value::Null => out.push(0x00),
        Value::Bool(b) => {
            out.push(0x03);
            out.push(u8::from(*b));
        }
        Value::Number(n) => match n.as_i64() {
            Some(i) => {
                out.push(0x01);
                out.extend_from_slice(&i.to_le_bytes());
            }
            None => {
                out.push(0x02);
                out.extend_from_slice(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
            }
        },
        Value::String(s) => var(0x04, s.as_bytes()),
        other => var(0x06, other.to_string().as_bytes()),
    }
}

/// The hash of one result row (a JSON object) over `columns`, in order.
pub fn row_hash(columns: &[String], row: &Value) -> u64 {
    let mut buf = Vec::with_capacity(64);
    for c in columns {
        canonical(row.get(c.as_str()).unwrap_or(&Value::Null), &mut buf);
    }
    xxhash_rust::xxh3::xxh3_64(&buf)
}

/// The checksum of a one-shot query result (`{"columns", "rows"}`).
pub fn result_checksum(result: &Value) -> anyhow::Result<(usize, u64)> {
    let columns = string_list(&result["columns"])?;
    let rows = result["rows"]
        .as_array()
        .context("a query result without rows")?;
    let sum = rows
        .iter()
        .fold(0u64, |acc, r| acc.wrapping_add(row_hash(&columns, r)));
    Ok((rows.len(), sum))
}

fn string_list(v: &Value) -> anyhow::Result<Vec<String>> {
    v.as_array()
        .context("expected an array of column names")?
        .iter()
        .map(|c| {
            c.as_str()
                .map(str::to_string)
                .context("a non-string column")
        })
        .collect()
}

fn parse_checksum(v: &Value) -> anyhow::Result<u64> {
    let s = v.as_str().context("an event without a checksum")?;
    u64::from_str_radix(s, 16).with_context(|| format!("checksum {s:?} is not hex"))
}

/// One view as the subscriber sees it: row hashes by result key, and checks.
#[derive(Debug, Default)]
pub struct Mat {
    columns: Vec<String>,
    rows: HashMap<String, u64>,
    /// The checksum recomputed here.
    pub sum: u64,
    pub seq: u64,
    pub snapshots: u64,
    pub resets: u64,
    pub diffs: u64,
    /// Events whose checksum was compared, and how many disagreed.
    pub checked: u64,
    pub mismatches: u64,
    /// The seq of a large snapshot whose chunks are arriving (`"more": true`), if any.
    loading: Option<u64>,
}

impl Mat {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Loads a snapshot body: a whole snapshot, or one chunk of a large one (docs/protocol.md
    /// "Large snapshots": every chunk but the last carries `"more": true`, only the last the
    /// checksum). `Ok(true)` once the snapshot is whole; a chunk of another seq starts over.
    pub fn snapshot(&mut self, body: &Value) -> anyhow::Result<bool> {
        let seq = body["seq"].as_u64().unwrap_or(0);
        let more = body["more"].as_bool() == Some(true);
        let keys = body["keys"].as_array().context("a snapshot without keys")?;
        let rows = body["rows"].as_array().context("a snapshot without rows")?;
        anyhow::ensure!(keys.len() == rows.len(), "snapshot keys and rows differ");
        if self.loading != Some(seq) {
            self.columns = string_list(&body["columns"])?;
            self.rows.clear();
            self.sum = 0;
        }
        self.loading = more.then_some(seq);
        self.rows.reserve(rows.len());
        for (k, r) in keys.iter().zip(rows) {
            let h = row_hash(&self.columns, r);
            self.sum = self.sum.wrapping_add(h);
            if let Some(old) = self.rows.insert(k.to_string(), h) {
                self.sum = self.sum.wrapping_sub(old);
            }
        }
        if more {
            return Ok(false);
        }
        self.seq = seq;
        self.snapshots += 1;
        if body["reset"].as_bool() == Some(true) {
            self.resets += 1;
        }
        self.check(&body["checksum"])?;
        Ok(true)
    }

    /// Applies a diff body.
    pub fn diff(&mut self, body: &Value) -> anyhow::Result<()> {
        let changes = body["changes"]
            .as_array()
            .context("a diff without changes")?;
        for c in changes {
            let key = c["key"].to_string();
            match c["op"].as_str() {
                Some("add" | "change") => {
                    let h = row_hash(&self.columns, &c["row"]);
                    self.sum = self.sum.wrapping_add(h);
                    if let Some(old) = self.rows.insert(key, h) {
                        self.sum = self.sum.wrapping_sub(old);
                    }
                }
                Some("remove") => {
                    if let Some(old) = self.rows.remove(&key) {
                        self.sum = self.sum.wrapping_sub(old);
                    }
                }
                other => anyhow::bail!("a diff change with op {other:?}"),
            }
        }
        self.seq = body["seq"].as_u64().unwrap_or(self.seq);
        self.diffs += 1;
        self.check(&body["checksum"])
    }

    fn check(&mut self, checksum: &Value) -> anyhow::Result<()> {
        let theirs = parse_checksum(checksum)?;
        self.checked += 1;
        if theirs != self.sum {
            self.mismatches += 1;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// HTTP: the writer and one-shot queries.

/// A keep-alive HTTP client with Nagle off that sends the admin token.
pub fn http_client(timeout: Option<Duration>) -> anyhow::Result<reqwest::Client> {
    http_client_as(timeout, crate::server::admin_token())
}

/// A keep-alive HTTP client with Nagle off that sends `token`.
pub fn http_client_as(timeout: Option<Duration>, token: &str) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .default_headers(crate::server::token_headers(token))
        .tcp_nodelay(true);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    Ok(b.build()?)
}

/// POSTs the JSON `body` to `url` and returns the answer's text; an answer other than 2xx
/// is an error carrying its status and text.
pub async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> anyhow::Result<String> {
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "POST {url} answered {status}: {text}");
    Ok(text)
}

/// Writes and one-shot reads against one server.
#[derive(Clone, Debug)]
pub struct Api {
    pub base: String,
    http: reqwest::Client,
}

impl Api {
    /// A client with the admin token.
    pub fn new(base: &str) -> anyhow::Result<Api> {
        Api::with_token(base, crate::server::admin_token())
    }

    /// A client with `token` (a client token, say).
    pub fn with_token(base: &str, token: &str) -> anyhow::Result<Api> {
        Ok(Api {
            base: base.to_string(),
            http: http_client_as(Some(HTTP_TIMEOUT), token)?,
        })
    }

    async fn post(&self, path: &str, body: String) -> anyhow::Result<(Value, Instant)> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let at = Instant::now();
        anyhow::ensure!(
            status.is_success(),
            "POST {path}: {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
        );
        Ok((serde_json::from_slice(&bytes)?, at))
    }

    /// `POST /v1/mutate` with a pre-rendered body; returns the commit's seq and the time the
    /// whole reply was read.
    pub async fn mutate(&self, body: String) -> anyhow::Result<(u64, Instant)> {
        let (v, at) = self.post("/v1/mutate", body).await?;
        let seq = v["seq"]
            .as_u64()
            .with_context(|| format!("a mutate reply without a seq: {v}"))?;
        Ok((seq, at))
    }

    pub async fn sql(&self, sql: &str) -> anyhow::Result<Value> {
        Ok(self
            .post("/v1/sql", serde_json::json!({ "sql": sql }).to_string())
            .await?
            .0)
    }

    /// `POST /v1/query`.
    pub async fn query(&self, sql: &str, params: &Value) -> anyhow::Result<Value> {
        Ok(self
            .post(
                "/v1/query",
                serde_json::json!({ "sql": sql, "params": params }).to_string(),
            )
            .await?
            .0)
    }

    /// The single integer of a `SELECT COUNT(*) AS n …` query.
    pub async fn count(&self, sql: &str, params: &Value) -> anyhow::Result<usize> {
        let v = self.query(sql, params).await?;
        v["rows"][0]["n"]
            .as_u64()
            .map(|n| n as usize)
            .with_context(|| format!("{sql}: no count in {v}"))
    }

    /// Inserts `rows` (JSON objects rendered as text) into `table`, `batch` rows per mutate.
    pub async fn preload(
        &self,
        table: &str,
        rows: impl Iterator<Item = String>,
        batch: usize,
    ) -> anyhow::Result<usize> {
        let mut n = 0;
        let mut body = String::new();
        let mut in_batch = 0;
        let prefix = format!("{{\"op\":\"insert\",\"table\":\"{table}\",\"row\":");
        for row in rows {
            body.push_str(if in_batch == 0 { "{\"ops\":[" } else { "," });
            body.push_str(&prefix);
            body.push_str(&row);
            body.push('}');
            in_batch += 1;
            n += 1;
            if in_batch == batch {
                body.push_str("]}");
                self.mutate(std::mem::take(&mut body)).await?;
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            body.push_str("]}");
            self.mutate(body).await?;
        }
        Ok(n)
    }

    /// `/metrics` value of `name`; `None` when the server does not expose it.
    pub async fn metric_opt(&self, name: &str) -> anyhow::Result<Option<f64>> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        Ok(crate::server::Metrics::parse(&text).0.get(name).copied())
    }

    /// `/metrics` value of `name` (0 when absent).
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        Ok(crate::server::Metrics::parse(&text).get(name))
    }
}

// ---------------------------------------------------------------------------------------
// SSE.

/// Splits a byte stream into Server-Sent Events.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
    scanned: usize,
}

struct SseEvent {
    kind: String,
    id: Option<String>,
    data: String,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let from = self.scanned.saturating_sub(1);
            let Some(at) = self.buf[from..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|p| p + from)
            else {
                self.scanned = self.buf.len();
                return None;
            };
            let text = String::from_utf8_lossy(&self.buf[..at]).into_owned();
            self.buf.drain(..at + 2);
            self.scanned = 0;
            let mut event = SseEvent {
                kind: "message".into(),
                id: None,
                data: String::new(),
            };
            let mut any = false;
            for line in text.split('\n') {
                if line.starts_with(':') || line.is_empty() {
                    continue; // a heartbeat comment
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                any = true;
                match field {
                    "event" => event.kind = value.to_string(),
                    "id" => event.id = Some(value.to_string()),
                    "data" => {
                        if !event.data.is_empty() {
                            event.data.push('\n');
                        }
                        event.data.push_str(value);
                    }
                    _ => {}
                }
            }
            if any {
                return Some(event);
            }
        }
    }
}

/// One `GET /v1/live` stream, read by its own task.
pub struct SseSub {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<Mat>>,
}

impl SseSub {
    /// Opens the stream (returns once the response headers arrived); events go to `notes`.
    pub async fn open(
        base: &str,
        sql: &str,
        params: &Value,
        notes: mpsc::UnboundedSender<Note>,
    ) -> anyhow::Result<SseSub> {
        let mut url = reqwest::Url::parse(&format!("{base}/v1/live"))?;
        url.query_pairs_mut()
            .append_pair("sql", sql)
            .append_pair("params", &params.to_string());
        // No overall timeout: the stream lives as long as the case.
        let http = http_client(None)?;
        let mut resp = http
            .get(url)
            .header("accept", "text/event-stream")
            .send()
            .await
            .context("GET /v1/live")?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            anyhow::bail!("GET /v1/live: {status}: {text}");
        }
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut mat = Mat::default();
            let mut parser = SseParser::default();
            loop {
                let chunk = tokio::select! {
                    _ = &mut stopped => break,
                    chunk = resp.chunk() => chunk,
                };
                let Some(bytes) = chunk.context("reading the SSE stream")? else {
                    let _ = notes.send(Note::Failed {
                        qid: Some(SSE_QID),
                        message: "the server ended the SSE stream".into(),
                    });
                    break;
                };
                let at = Instant::now();
                parser.push(&bytes);
                while let Some(event) = parser.next_event() {
                    handle_sse(&mut mat, event, at, &notes)?;
                }
            }
            Ok(mat)
        });
        Ok(SseSub {
            stop: Some(stop),
            task,
        })
    }

    /// Ends the stream (the server unsubscribes) and returns what the subscriber saw.
    pub async fn close(mut self) -> anyhow::Result<Mat> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.context("the SSE reader panicked")?
    }
}

impl Drop for SseSub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn handle_sse(
    mat: &mut Mat,
    event: SseEvent,
    at: Instant,
    notes: &mpsc::UnboundedSender<Note>,
) -> anyhow::Result<()> {
    match event.kind.as_str() {
        "diff" => {
            // The seq is the event id: tell the loop before parsing the body.
            let seq = event.id.as_deref().and_then(|s| s.parse().ok());
            if let Some(seq) = seq {
                let _ = notes.send(Note::Diff {
                    qid: SSE_QID,
                    seq,
                    at,
                });
            }
            let body: Value = serde_json::from_str(&event.data).context("a diff body")?;
            if seq.is_none() {
                let _ = notes.send(Note::Diff {
                    qid: SSE_QID,
                    seq: body["seq"].as_u64().unwrap_or(0),
                    at,
                });
            }
            mat.diff(&body)
        }
        "snapshot" => {
            let body: Value = serde_json::from_str(&event.data).context("a snapshot body")?;
            if !mat.snapshot(&body)? {
                return Ok(()); // a chunk of a large snapshot; the last one completes it
            }
            let _ = notes.send(Note::Snapshot {
                qid: SSE_QID,
                seq: mat.seq,
                rows: mat.len(),
                reset: body["reset"].as_bool() == Some(true),
                at,
            });
            Ok(())
        }
        "error" => {
            let _ = notes.send(Note::Failed {
                qid: Some(SSE_QID),
                message: event.data,
            });
            Ok(())
        }
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket.

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One `/v1/ws` connection carrying many subscriptions (by numeric qid); a task reads it.
pub struct WsConn {
    sink: SplitSink<Ws, Message>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<HashMap<u64, Mat>>>,
}

impl WsConn {
    /// Connects with the admin token and the JSON subprotocol; events go to `notes`.
    pub async fn connect(base: &str, notes: mpsc::UnboundedSender<Note>) -> anyhow::Result<WsConn> {
        WsConn::connect_as(base, crate::server::admin_token(), notes).await
    }

    /// [`WsConn::connect`] with `token` as the bearer token.
    pub async fn connect_as(
        base: &str,
        token: &str,
        notes: mpsc::UnboundedSender<Note>,
    ) -> anyhow::Result<WsConn> {
        let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
        let ws = connect_ws_as(&url, JSON_PROTOCOL, token).await?;
        let (sink, stream) = ws.split();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(read_ws(stream, stopped, notes));
        Ok(WsConn {
            sink,
            stop: Some(stop),
            task,
        })
    }

    /// Sends one subscribe per `(qid, params)` for `sql`, without waiting for any snapshot
    /// (they arrive as notes); flushes every few hundred frames.
    pub async fn subscribe_many(
        &mut self,
        sql: &str,
        subs: impl Iterator<Item = (u64, Value)>,
    ) -> anyhow::Result<()> {
        for (i, (qid, params)) in subs.enumerate() {
            let frame = serde_json::json!({
                "type": "subscribe", "qid": qid, "sql": sql, "params": params,
            });
            self.sink
                .feed(Message::Text(frame.to_string().into()))
                .await?;
            if i % 256 == 255 {
                self.sink.flush().await?;
            }
        }
        self.sink.flush().await?;
        Ok(())
    }

    /// Closes the connection (the server drops its subscriptions) and returns every view
    /// the reader materialised, by qid.
    pub async fn close(mut self) -> anyhow::Result<HashMap<u64, Mat>> {
        let _ = self.sink.send(Message::Close(None)).await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .context("the WebSocket reader panicked")?
    }
}

impl Drop for WsConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_ws(
    mut stream: SplitStream<Ws>,
    mut stopped: oneshot::Receiver<()>,
    notes: mpsc::UnboundedSender<Note>,
) -> anyhow::Result<HashMap<u64, Mat>> {
    let mut mats: HashMap<u64, Mat> = HashMap::new();
    loop {
        let message = tokio::select! {
            _ = &mut stopped => break,
            m = stream.next() => m,
        };
        let text = match message {
            None | Some(Ok(Message::Close(_))) => break,
            Some(Err(e)) => return Err(anyhow::Error::from(e).context("reading the WebSocket")),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(_)) => continue,
        };
        let at = Instant::now();
        let v: Value = serde_json::from_str(text.as_str()).context("a WebSocket frame")?;
        let qid = v["qid"].as_u64();
        match (v["type"].as_str(), qid) {
            (Some("diff"), Some(qid)) => {
                let seq = v["seq"].as_u64().unwrap_or(0);
                let _ = notes.send(Note::Diff { qid, seq, at });
                mats.entry(qid).or_default().diff(&v)?;
            }
            (Some("snapshot"), Some(qid)) => {
                let mat = mats.entry(qid).or_default();
                if !mat.snapshot(&v)? {
                    continue; // a chunk of a large snapshot; the last one completes it
                }
                let _ = notes.send(Note::Snapshot {
                    qid,
                    seq: mat.seq,
                    rows: mat.len(),
                    reset: v["reset"].as_bool() == Some(true),
                    at,
                });
            }
            (Some("error"), _) => {
                let _ = notes.send(Note::Failed {
                    qid,
                    message: v["error"].to_string(),
                });
            }
            _ => {}
        }
    }
    Ok(mats)
}

/// Server RSS in bytes from `/proc/<pid>/status` (`VmRSS`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut p = SseParser::default();
        p.push(b": heartbeat\n\nevent: snap");
        assert!(p.next_event().is_none(), "a comment alone is not an event");
        p.push(b"shot\ndata: {\"a\":1}\nid: 7\n");
        assert!(p.next_event().is_none());
        p.push(b"\nevent: diff\ndata: x\n\n");
        let e = p.next_event().unwrap();
        assert_eq!(
            (e.kind.as_str(), e.id.as_deref(), e.data.as_str()),
            ("snapshot", Some("7"), "{\"a\":1}")
        );
        let e = p.next_event().unwrap();
        assert_eq!((e.kind.as_str(), e.data.as_str()), ("diff", "x"));
        assert!(p.next_event().is_none());
    }

    #[test]
    fn the_checksum_follows_snapshots_and_diffs() {
        let cols = ["id".to_string(), "name".to_string()];
        let a = serde_json::json!({"id": 1, "name": "a"});
        let b = serde_json::json!({"id": 2, "name": null});
        let sum = |rows: &[&Value]| {
            rows.iter()
                .fold(0u64, |s, r| s.wrapping_add(row_hash(&cols, r)))
        };
        let mut m = Mat::default();
        m.snapshot(&serde_json::json!({
            "seq": 3, "columns": cols, "keys": [1], "rows": [a],
            "checksum": format!("{:016x}", sum(&[&a])),
        }))
        .unwrap();
        m.diff(&serde_json::json!({
            "seq": 4, "changes": [{"op": "add", "key": 2, "row": b}, {"op": "remove", "key": 1}],
            "checksum": format!("{:016x}", sum(&[&b])),
        }))
        .unwrap();
        assert_eq!((m.len(), m.seq, m.checked, m.mismatches), (1, 4, 2, 0));
        // A large snapshot in two chunks: only the last carries the checksum and completes it.
        let first = serde_json::json!({
            "seq": 9, "columns": cols, "keys": [1], "rows": [a], "more": true,
        });
        assert!(!m.snapshot(&first).unwrap());
        assert_eq!(m.snapshots, 1, "a chunk is not a snapshot yet");
        let last = serde_json::json!({
            "seq": 9, "columns": cols, "keys": [2], "rows": [b],
            "checksum": format!("{:016x}", sum(&[&a, &b])),
        });
        assert!(m.snapshot(&last).unwrap());
        assert_eq!((m.len(), m.seq, m.snapshots, m.mismatches), (2, 9, 2, 0));
        // Integer 1 and text "1" hash differently, as the documented tags say.
        assert_ne!(
            row_hash(&cols[..1], &serde_json::json!({"id": 1})),
            row_hash(&cols[..1], &serde_json::json!({"id": "1"}))
        );
    }

    #[test]
    fn the_row_hash_matches_the_documented_bytes() {
        // TEXT "ab" then INTEGER -1, as in the live crate's own test of canonical bytes.
        let mut out = Vec::new();
        canonical(&Value::from("ab"), &mut out);
        canonical(&Value::from(-1), &mut out);
        assert_eq!(
            out,
            [&[4u8, 2, 0, 0, 0, b'a', b'b', 1][..], &[0xff; 8][..]].concat()
        );
    }
}
