//! Topic clients for the tests of the real binary (docs/api.md and docs/protocol.md,
//! "Topics"): the HTTP calls, an SSE watch client, a WebSocket client in JSON or
//! MessagePack, and an independent tag-filter matcher to compute what a watcher must get.
//!
//! Every wait is bounded by [`WAIT`] (a safety bound, never an assertion about speed).

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::{Api, NoResponse};

/// Safety bound on every wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// One record as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    pub offset: u64,
    pub ts: i64,
    pub tags: Vec<String>,
    pub data: Value,
}

impl Rec {
    /// A record object `{offset, ts, tags, data}` (extra fields such as `type` and `topic`
    /// are ignored here; callers check them).
    pub fn from_json(v: &Value) -> Rec {
        Rec {
            offset: v["offset"]
                .as_u64()
                .unwrap_or_else(|| panic!("a record without an offset: {v}")),
            ts: v["ts"]
                .as_i64()
                .unwrap_or_else(|| panic!("a record without a ts: {v}")),
            tags: v["tags"]
                .as_array()
                .unwrap_or_else(|| panic!("a record without tags: {v}"))
                .iter()
                .map(|t| t.as_str().expect("a string tag").to_string())
                .collect(),
            data: v["data"].clone(),
        }
    }
}

/// Does a record with `tags` match the filter `patterns` (docs/api.md "Names and tags")?
/// Written from the contract, independently of the server: no patterns or a lone `*` =
/// every record; `p*` = any tag starting with `p`; otherwise the exact tag.
pub fn filter_matches(patterns: &[&str], tags: &[String]) -> bool {
    if patterns.is_empty() || patterns.contains(&"*") {
        return true;
    }
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => tags.iter().any(|t| t.starts_with(prefix)),
        None => tags.iter().any(|t| t == p),
    })
}

impl Api {
    async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self.client.request(method.clone(), self.url(path));
        if let Some(b) = body {
            req = req.json(b);
        }
        Self::finish(req)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: no response: {e:?}"))
    }

    /// `PUT /v1/topics/{name}` with an optional body.
    pub async fn put_topic(&self, name: &str, body: Option<&Value>) -> (u16, Value) {
        self.send_json(reqwest::Method::PUT, &format!("/v1/topics/{name}"), body)
            .await
    }

    pub async fn delete_topic(&self, name: &str) -> (u16, Value) {
        self.send_json(reqwest::Method::DELETE, &format!("/v1/topics/{name}"), None)
            .await
    }

    /// `POST /v1/topics/{name}/records`; `Err` if no response arrived.
    pub async fn try_append(
        &self,
        topic: &str,
        records: &Value,
        durability: Option<&str>,
    ) -> Result<(u16, Value), NoResponse> {
        let mut body = json!({ "records": records });
        if let Some(d) = durability {
            body["durability"] = json!(d);
        }
        self.try_post(&format!("/v1/topics/{topic}/records"), &body)
            .await
    }

    pub async fn append(
        &self,
        topic: &str,
        records: &Value,
        durability: Option<&str>,
    ) -> (u16, Value) {
        self.try_append(topic, records, durability)
            .await
            .unwrap_or_else(|e| panic!("append to {topic}: no response: {e:?}"))
    }

    /// Appends and panics unless it succeeds; returns (first, last) offsets.
    pub async fn append_ok(
        &self,
        topic: &str,
        records: &Value,
        durability: Option<&str>,
    ) -> (u64, u64) {
        let (status, body) = self.append(topic, records, durability).await;
        assert_eq!(status, 200, "append to {topic} {records}: {body}");
        let first = body["first"].as_u64().unwrap_or_else(|| panic!("{body}"));
        let last = body["last"].as_u64().unwrap_or_else(|| panic!("{body}"));
        assert!(
            body["seq"].as_u64().is_some(),
            "an append has a seq: {body}"
        );
        (first, last)
    }

    /// `GET /v1/topics/{name}/records` with raw query pairs.
    pub async fn read_records(&self, topic: &str, params: &[(&str, &str)]) -> (u16, Value) {
        self.get_with(&format!("/v1/topics/{topic}/records"), params)
            .await
    }

    /// `GET /v1/topics`: the topic objects by name.
    pub async fn topics(&self) -> std::collections::BTreeMap<String, Value> {
        let body = self.get_ok("/v1/topics").await;
        body["topics"]
            .as_array()
            .unwrap_or_else(|| panic!("GET /v1/topics: {body}"))
            .iter()
            .map(|t| (t["name"].as_str().expect("a name").to_string(), t.clone()))
            .collect()
    }

    /// `GET /v1/topics/{name}/watch`. `Ok` with the stream once the response is a
    /// `text/event-stream`; `Err((status, body))` for an error before the stream.
    pub async fn watch_sse(
        &self,
        topic: &str,
        from: Option<u64>,
        tags: &[&str],
        last_event_id: Option<u64>,
    ) -> Result<Sse, (u16, Value)> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(f) = from {
            params.push(("from", f.to_string()));
        }
        for t in tags {
            params.push(("tag", t.to_string()));
        }
        self.watch_sse_raw(topic, &params, last_event_id).await
    }

    /// [`Api::watch_sse`] with raw query pairs (for bad input).
    pub async fn watch_sse_raw(
        &self,
        topic: &str,
        params: &[(&str, String)],
        last_event_id: Option<u64>,
    ) -> Result<Sse, (u16, Value)> {
        let url = reqwest::Url::parse_with_params(
            &self.url(&format!("/v1/topics/{topic}/watch")),
            params,
        )
        .unwrap();
        // The shared client has a whole-request timeout; a watch outlives it.
        let client = reqwest::Client::builder()
            .no_proxy()
            .retry(reqwest::retry::never())
            .build()
            .expect("build an HTTP client");
        let mut req = client.get(url);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let response = tokio::time::timeout(WAIT, req.send())
            .await
            .expect("watch response headers within the safety bound")
            .expect("a watch response");
        let status = response.status().as_u16();
        let ct = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default();
        if status == 200 && ct.starts_with("text/event-stream") {
            return Ok(Sse {
                response,
                buf: Vec::new(),
            });
        }
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err((status, body))
    }
}

/// One SSE event: (event name, id, data as JSON).
#[derive(Debug)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// An open SSE stream.
pub struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next event (heartbeats skipped), or `None` when the stream ends.
    pub async fn next_event(&mut self) -> Option<Event> {
        let (event, id, data) = self.next_raw_event().await?;
        Some(Event {
            event,
            id,
            data: serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data:?}")),
        })
    }

    /// The next event with its data as text: (event, id, data).
    pub async fn next_raw_event(&mut self) -> Option<(String, Option<String>, String)> {
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
                    continue; // a heartbeat
                }
                return Some((
                    event.unwrap_or_else(|| "message".into()),
                    id,
                    data.join("\n"),
                ));
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("the stream moves within the safety bound");
            match chunk {
                Ok(Some(bytes)) => self.buf.extend_from_slice(&bytes),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next event; panics at the end of the stream.
    pub async fn event(&mut self) -> Event {
        self.next_event().await.expect("the stream ended early")
    }
}

/// The two WebSocket encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enc {
    Json,
    MsgPack,
}

/// A WebSocket client speaking one encoding.
pub struct Ws {
    pub enc: Enc,
    stream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Ws {
    /// Connects with the admin token.
    pub async fn connect(addr: SocketAddr, enc: Enc) -> Ws {
        Ws::connect_as(addr, enc, Some(super::ADMIN_TOKEN)).await
    }

    /// Connects with `token` as the bearer token (or no `Authorization` header).
    pub async fn connect_as(addr: SocketAddr, enc: Enc, token: Option<&str>) -> Ws {
        let protocol = match enc {
            Enc::Json => "sluice.json.v1",
            Enc::MsgPack => "sluice.msgpack.v1",
        };
        let mut request = format!("ws://{addr}/v1/ws").into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
        if let Some(token) = token {
            headers.insert("Authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (stream, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect within the safety bound")
            .expect("a WebSocket connection");
        Ws { enc, stream }
    }

    /// Sends raw bytes as a binary frame (hand-made MessagePack).
    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        self.stream
            .send(Message::Binary(bytes.into()))
            .await
            .expect("send a frame");
    }

    pub async fn send(&mut self, v: Value) {
        let message = match self.enc {
            Enc::Json => Message::Text(v.to_string().into()),
            Enc::MsgPack => Message::Binary(rmp_serde::to_vec_named(&v).unwrap().into()),
        };
        self.stream.send(message).await.expect("send a frame");
    }

    /// The next message, or `None` when the connection ends.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("a WebSocket message within the safety bound");
            let message = match message {
                Some(Ok(m)) => m,
                Some(Err(_)) | None => return None,
            };
            match (message, self.enc) {
                // A message the client cannot decode comes back as `{"undecodable": …}`, so
                // a test can report it beside its other findings.
                (Message::Text(t), Enc::Json) => {
                    return Some(serde_json::from_str(&t).unwrap_or_else(
                        |e| json!({"undecodable": format!("{e}: {}", t.as_str())}),
                    ))
                }
                (Message::Binary(b), Enc::MsgPack) => {
                    return Some(
                        rmp_serde::from_slice(&b)
                            .unwrap_or_else(|e| json!({"undecodable": format!("{e}: {b:?}")})),
                    )
                }
                (Message::Close(_), _) => return None,
                (Message::Ping(_) | Message::Pong(_) | Message::Frame(_), _) => continue,
                (other, enc) => panic!("a {other:?} frame on a {enc:?} connection"),
            }
        }
    }

    /// The reply to request `id` (messages without that id before it are returned too).
    pub async fn until_reply(&mut self, id: u64) -> (Value, Vec<Value>) {
        let mut others = Vec::new();
        loop {
            let m = self.next().await.expect("the connection ended early");
            if m.get("id").and_then(Value::as_u64) == Some(id) {
                return (m, others);
            }
            others.push(m);
        }
    }

    pub async fn close(mut self) {
        let _ = self.stream.close(None).await;
    }
}

/// No thread or task of the server panicked (a panicking connection task can go unnoticed
/// by the client: its watch just stops).
pub fn assert_no_panic(server: &super::Server) {
    let stderr = server.stderr();
    assert!(
        !stderr.contains("panicked"),
        "the server logged a panic:\n{stderr}"
    );
}
