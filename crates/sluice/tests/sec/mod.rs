//! Clients with tokens for the security tests of the real binary (docs/security.md): a
//! server started with a known admin token and a JWT secret, client tokens minted with
//! `sluice_server::auth::mint_hs256`, and HTTP, SSE and WebSocket clients that send a
//! bearer token.
//!
//! Every wait is bounded by [`WAIT`] (a safety bound, never an assertion about speed).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::common::Server;

/// The admin token the servers of these tests run with.
pub const ADMIN: &str = "sluice_admin_security_tests_0123456789";
/// The HS256 secret client tokens are signed with.
pub const SECRET: &str = "security-tests-jwt-secret";
/// Safety bound on every wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// `sluice serve` with [`ADMIN`] and [`SECRET`] and `extra` flags.
pub fn start(data: &Path, logs: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--admin-token", ADMIN, "--jwt-secret", SECRET];
    args.extend_from_slice(extra);
    Server::start(data, logs, &args)
}

/// A client token for `sub` with the extra claims of `claims` (a JSON object), valid for an
/// hour.
pub fn token(sub: &str, claims: Value) -> String {
    let claims: Map<String, Value> = match claims {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        other => panic!("claims must be an object: {other}"),
    };
    sluice_server::auth::mint_hs256(SECRET, sub, &claims, Duration::from_secs(3600))
}

/// HTTP, SSE and WebSocket requests to one server with one token.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub addr: std::net::SocketAddr,
    pub token: String,
}

impl Client {
    pub fn new(server: &Server, token: &str) -> Client {
        Client {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(WAIT)
                .retry(reqwest::retry::never())
                .build()
                .unwrap(),
            addr: server.addr,
            token: token.to_string(),
        }
    }

    pub fn admin(server: &Server) -> Client {
        Client::new(server, ADMIN)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("no answer: {e:?}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(self.url(path))).await
    }

    /// `GET path?k=v&…` with the values percent-encoded.
    pub async fn get_with(&self, path: &str, params: &[(&str, &str)]) -> (u16, Value) {
        let url = reqwest::Url::parse_with_params(&self.url(path), params).unwrap();
        self.send(self.http.get(url)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.http.put(self.url(path)).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(self.http.delete(self.url(path))).await
    }

    /// `POST /v1/sql`; panics unless 200.
    pub async fn sql(&self, sql: &str) -> Value {
        let (status, body) = self.post("/v1/sql", &json!({ "sql": sql })).await;
        assert_eq!(status, 200, "{sql}: {body}");
        body
    }

    pub async fn mutate(&self, ops: Value) -> (u16, Value) {
        self.post("/v1/mutate", &json!({ "ops": ops })).await
    }

    /// `POST /v1/mutate`; panics unless 200; returns the seq.
    pub async fn mutate_ok(&self, ops: Value) -> u64 {
        let (status, body) = self.mutate(ops.clone()).await;
        assert_eq!(status, 200, "mutate {ops}: {body}");
        body["seq"].as_u64().expect("a seq")
    }

    /// `POST /v1/query`; panics unless 200; returns the rows.
    pub async fn query(&self, sql: &str) -> Vec<Value> {
        let (status, body) = self.post("/v1/query", &json!({ "sql": sql })).await;
        assert_eq!(status, 200, "{sql}: {body}");
        body["rows"].as_array().expect("rows").clone()
    }

    /// `GET /health` (no token needed): the seq.
    pub async fn health_seq(&self) -> u64 {
        let resp = self.http.get(self.url("/health")).send().await.unwrap();
        let body: Value = resp.json().await.unwrap();
        body["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("/health: {body}"))
    }

    /// Opens an SSE stream at `path?params` with the token in the header; `Err` with the
    /// status and JSON body if it was refused before streaming.
    pub async fn sse(&self, path: &str, params: &[(&str, &str)]) -> Result<Sse, (u16, Value)> {
        let url = reqwest::Url::parse_with_params(&self.url(path), params).unwrap();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let resp = tokio::time::timeout(WAIT, client.get(url).bearer_auth(&self.token).send())
            .await
            .expect("response headers in time")
            .expect("an HTTP answer");
        let status = resp.status().as_u16();
        if status != 200 {
            let text = resp.text().await.unwrap_or_default();
            return Err((
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            ));
        }
        Ok(Sse {
            response: resp,
            buf: Vec::new(),
        })
    }

    /// A WebSocket (JSON) with the token in the upgrade's header.
    pub async fn ws(&self) -> Ws {
        let mut request = format!("ws://{}/v1/ws", self.addr)
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {}", self.token).parse().unwrap(),
        );
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("the upgrade in time")
            .expect("the upgrade succeeds");
        Ws {
            ws,
            queued: VecDeque::new(),
        }
    }
}

/// An SSE stream.
pub struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next event `(name, data)`, skipping heartbeats; `None` when the stream ends or
    /// nothing arrives within `within`.
    pub async fn event_within(&mut self, within: Duration) -> Option<(String, Value)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8 events");
                let (mut event, mut data) = (None, Vec::new());
                for line in text
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with(':'))
                {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                    match field {
                        "event" => event = Some(value),
                        "data" => data.push(value),
                        _ => {}
                    }
                }
                let Some(event) = event else { continue };
                let data = serde_json::from_str(&data.join("\n")).expect("JSON data");
                return Some((event, data));
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .ok()?
                .ok()?;
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return None,
            }
        }
    }

    /// Whether the stream ends (the server closes it) within `within`, with no event before.
    pub async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.buf.windows(2).any(|w| w == b"\n\n") {
                match self.event_within(within).await {
                    Some(e) => panic!("an event where the stream should end: {e:?}"),
                    None => continue,
                }
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return false,
                Ok(Ok(None)) | Ok(Err(_)) => return true,
                Ok(Ok(Some(bytes))) => self.buf.extend_from_slice(&bytes),
            }
        }
    }

    /// The next event; panics if none arrives within [`WAIT`].
    pub async fn event(&mut self) -> (String, Value) {
        self.event_within(WAIT)
            .await
            .expect("an event within the safety bound")
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A JSON WebSocket; messages that are not the reply awaited are queued.
pub struct Ws {
    ws: Socket,
    queued: VecDeque<Value>,
}

impl Ws {
    pub async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    async fn read(&mut self, within: Duration) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(within, self.ws.next())
                .await
                .ok()??
                .ok()?;
            match msg {
                Message::Text(t) => return Some(serde_json::from_str(t.as_str()).unwrap()),
                Message::Close(_) => return None,
                _ => continue,
            }
        }
    }

    /// The next message (queued first); `None` if nothing arrives within `within`.
    pub async fn next_within(&mut self, within: Duration) -> Option<Value> {
        match self.queued.pop_front() {
            Some(v) => Some(v),
            None => self.read(within).await,
        }
    }

    /// The next message; panics if none arrives within [`WAIT`].
    pub async fn next(&mut self) -> Value {
        self.next_within(WAIT)
            .await
            .expect("a message within the safety bound")
    }

    /// Sends `request` with `"id": id` and returns the message carrying that id; other
    /// messages are queued.
    pub async fn request(&mut self, id: u64, mut request: Value) -> Value {
        request["id"] = json!(id);
        self.send(request).await;
        let mut skipped = VecDeque::new();
        loop {
            let v = self
                .read(WAIT)
                .await
                .unwrap_or_else(|| panic!("a reply to request {id} within the safety bound"));
            if v.get("id") == Some(&json!(id)) {
                self.queued.extend(skipped);
                return v;
            }
            skipped.push_back(v);
        }
    }
}

/// Asserts a 403 `forbidden` and returns its error object.
pub fn assert_forbidden(status: u16, body: &Value, what: &str) -> Map<String, Value> {
    assert_eq!(status, 403, "{what}: {body}");
    let err = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{what}: an error object: {body}"));
    assert_eq!(err["code"], "forbidden", "{what}: {body}");
    err.clone()
}
