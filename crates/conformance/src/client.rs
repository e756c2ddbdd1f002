//! The three transports as a black-box client sees them: HTTP JSON calls, Server-Sent Event
//! streams and WebSocket connections (JSON text frames or MessagePack binary frames).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::{fail, show, Ctx, Verdict, R};

/// Who a request is sent as.
#[derive(Clone, Debug)]
pub enum Auth {
    Admin,
    /// `Authorization: Bearer <this>`.
    Bearer(String),
    /// This exact `Authorization` header value.
    Header(String),
    None,
}

/// An HTTP answer: status, headers and body (parsed as JSON when it is JSON, else `null`).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub text: String,
    pub content_type: String,
}

impl Resp {
    /// The body of a 200 answer that is a JSON object.
    pub fn ok(self) -> R<Value> {
        if self.status == 200 && !self.content_type.starts_with("application/json") {
            fail!(
                "a 200 answer of Content-Type {:?}, not application/json",
                self.content_type
            );
        }
        if self.status != 200 || !self.body.is_object() {
            fail!(
                "expected 200 with a JSON object, got {}: {}",
                self.status,
                cut(&self.text)
            );
        }
        Ok(self.body)
    }

    /// The `error` object of an error answer with this status and code; also checks that it
    /// has a non-empty `message`.
    pub fn err(self, status: u16, code: &str) -> R<Value> {
        let got = self.body.pointer("/error/code").and_then(Value::as_str);
        if self.status != status || got != Some(code) {
            fail!(
                "expected {status} {code}, got {}: {}",
                self.status,
                cut(&self.text)
            );
        }
        let error = self.body["error"].clone();
        match error.get("message").and_then(Value::as_str) {
            Some(m) if !m.is_empty() => Ok(error),
            _ => fail!("the error has no message: {}", cut(&self.text)),
        }
    }
}

pub fn cut(s: &str) -> String {
    if s.len() > 400 {
        let mut n = 400;
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        format!("{}…", &s[..n])
    } else {
        s.to_string()
    }
}

fn transport(what: &str, e: impl std::fmt::Display) -> Verdict {
    Verdict::Fail(format!("{what}: {e}"))
}

impl Ctx {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.opts.url)
    }

    fn authorize(&self, rb: reqwest::RequestBuilder, auth: &Auth) -> reqwest::RequestBuilder {
        match auth {
            Auth::Admin => rb.header("Authorization", format!("Bearer {}", self.opts.token)),
            Auth::Bearer(t) => rb.header("Authorization", format!("Bearer {t}")),
            Auth::Header(h) => rb.header("Authorization", h.as_str()),
            Auth::None => rb,
        }
    }

    /// Sends `method path` with `body` (raw bytes, sent as JSON unless `content_type` says
    /// otherwise) as `auth`.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        auth: &Auth,
        headers: &[(&str, &str)],
    ) -> R<Resp> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut rb = self.authorize(self.http.request(method.clone(), self.url(path)), auth);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(body) = body {
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            {
                rb = rb.header("Content-Type", "application/json");
            }
            rb = rb.body(body);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| transport(&format!("{method} {path}"), e))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let text = resp
            .text()
            .await
            .map_err(|e| transport(&format!("reading the body of {method} {path}"), e))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Resp {
            status,
            body,
            text,
            content_type,
        })
    }

    /// A JSON request as the admin.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> R<Resp> {
        self.call_as(method, path, body, &Auth::Admin).await
    }

    pub async fn call_as(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        auth: &Auth,
    ) -> R<Resp> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        self.raw(method, path, bytes, auth, &[]).await
    }

    pub async fn get(&self, path: &str) -> R<Value> {
        self.call("GET", path, None).await?.ok()
    }

    pub async fn post(&self, path: &str, body: Value) -> R<Value> {
        self.call("POST", path, Some(body)).await?.ok()
    }

    /// `POST /v1/sql` as the admin; must succeed.
    pub async fn sql(&self, sql: &str) -> R<Value> {
        self.post("/v1/sql", serde_json::json!({ "sql": sql }))
            .await
            .map_err(|v| match v {
                Verdict::Fail(why) => Verdict::Fail(format!("setup `{}`: {why}", cut(sql))),
                other => other,
            })
    }

    /// `POST /v1/mutate` as the admin; must succeed.
    pub async fn mutate(&self, ops: Value) -> R<Value> {
        self.post("/v1/mutate", serde_json::json!({ "ops": ops }))
            .await
    }

    /// Opens an SSE stream; the answer must be 200 `text/event-stream`.
    pub async fn sse(&self, path: &str, auth: &Auth, headers: &[(&str, &str)]) -> R<Sse> {
        match self.sse_or_error(path, auth, headers).await? {
            Ok(sse) => Ok(sse),
            Err(resp) => fail!(
                "expected an event stream from GET {path}, got {}: {}",
                resp.status,
                cut(&resp.text)
            ),
        }
    }

    /// Opens an SSE stream, or returns the JSON error answered instead.
    pub async fn sse_or_error(
        &self,
        path: &str,
        auth: &Auth,
        headers: &[(&str, &str)],
    ) -> R<Result<Sse, Resp>> {
        let mut rb = self.authorize(self.http.get(self.url(path)), auth);
        rb = rb.header("Accept", "text/event-stream");
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| transport(&format!("GET {path}"), e))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status == 200 && content_type.starts_with("text/event-stream") {
            return Ok(Ok(Sse {
                resp,
                buf: Vec::new(),
            }));
        }
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Err(Resp {
            status,
            body,
            text,
            content_type,
        }))
    }

    /// The WebSocket URL of the server.
    pub fn ws_url(&self, query: &str) -> String {
        let base = self
            .opts
            .url
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1);
        format!("{base}/v1/ws{query}")
    }

    /// Opens `/v1/ws` as the admin in this encoding.
    pub async fn ws(&self, enc: Enc) -> R<Ws> {
        self.ws_as(enc, &Auth::Admin, "").await
    }

    pub async fn ws_as(&self, enc: Enc, auth: &Auth, query: &str) -> R<Ws> {
        match self.ws_handshake(Some(enc), auth, query).await? {
            Ok(ws) => Ok(ws),
            Err((status, body)) => fail!(
                "the WebSocket upgrade was refused with {status}: {}",
                cut(&body)
            ),
        }
    }

    /// Opens `/v1/ws`, asking for `enc`'s subprotocol (none when `None`); the refusal's
    /// status and body when the upgrade is refused.
    pub async fn ws_handshake(
        &self,
        enc: Option<Enc>,
        auth: &Auth,
        query: &str,
    ) -> R<Result<Ws, (u16, String)>> {
        let mut request = self
            .ws_url(query)
            .into_client_request()
            .map_err(|e| transport("a WebSocket request", e))?;
        let headers = request.headers_mut();
        let value = match auth {
            Auth::Admin => Some(format!("Bearer {}", self.opts.token)),
            Auth::Bearer(t) => Some(format!("Bearer {t}")),
            Auth::Header(h) => Some(h.clone()),
            Auth::None => None,
        };
        if let Some(value) = value {
            headers.insert(
                "Authorization",
                value.parse().map_err(|e| transport("a header", e))?,
            );
        }
        if let Some(enc) = enc {
            headers.insert(
                "Sec-WebSocket-Protocol",
                enc.subprotocol()
                    .parse()
                    .map_err(|e| transport("a header", e))?,
            );
        }
        use tokio_tungstenite::tungstenite::Error as WsError;
        match tokio_tungstenite::connect_async(request).await {
            Ok((stream, response)) => {
                let negotiated = response
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                Ok(Ok(Ws {
                    stream,
                    enc: enc.unwrap_or(Enc::Json),
                    negotiated,
                }))
            }
            Err(WsError::Http(resp)) => {
                let status = resp.status().as_u16();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                Ok(Err((status, body)))
            }
            Err(e) => Err(transport("the WebSocket upgrade", e)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Server-Sent Events

/// One SSE event, or a comment line (`event == ":"`, a heartbeat).
#[derive(Clone, Debug)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
    pub raw: String,
}

impl Event {
    pub fn is_comment(&self) -> bool {
        self.event == ":"
    }
}

pub struct Sse {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next event or comment within `within`; `None` when the stream ended.
    pub async fn next_any(&mut self, within: Duration) -> R<Option<Event>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut event = String::new();
        let mut id = None;
        let mut data = String::new();
        let mut raw = String::new();
        loop {
            while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line[..line.len() - 1])
                    .trim_end_matches('\r')
                    .to_string();
                raw.push_str(&line);
                raw.push('\n');
                if line.is_empty() {
                    if event.is_empty() && data.is_empty() && id.is_none() {
                        raw.clear();
                        continue;
                    }
                    let parsed = serde_json::from_str(&data).unwrap_or(Value::Null);
                    return Ok(Some(Event {
                        event: if event.is_empty() {
                            "message".into()
                        } else {
                            event
                        },
                        id,
                        data: parsed,
                        raw,
                    }));
                }
                if let Some(comment) = line.strip_prefix(':') {
                    if event.is_empty() && data.is_empty() {
                        return Ok(Some(Event {
                            event: ":".into(),
                            id: None,
                            data: Value::String(comment.to_string()),
                            raw: line,
                        }));
                    }
                    continue;
                }
                let (field, value) = match line.split_once(':') {
                    Some((f, v)) => (f.to_string(), v.strip_prefix(' ').unwrap_or(v).to_string()),
                    None => (line.clone(), String::new()),
                };
                match field.as_str() {
                    "event" => event = value,
                    "id" => id = Some(value),
                    "data" => {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(&value);
                    }
                    _ => {}
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                fail!("no SSE event within {within:?}");
            }
            match tokio::time::timeout(deadline - now, self.resp.chunk()).await {
                Err(_) => fail!("no SSE event within {within:?}"),
                Ok(Err(e)) => fail!("the event stream broke: {e}"),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(bytes))) => self.buf.extend_from_slice(&bytes),
            }
        }
    }

    /// The next event (comments skipped); fails when the stream ends or nothing comes.
    pub async fn next(&mut self) -> R<Event> {
        loop {
            match self.next_any(Duration::from_secs(10)).await? {
                Some(e) if e.is_comment() => continue,
                Some(e) => return Ok(e),
                None => fail!("the event stream ended"),
            }
        }
    }

    /// The next event, which must be of this kind.
    pub async fn expect(&mut self, kind: &str) -> R<Event> {
        let e = self.next().await?;
        if e.event != kind {
            fail!(
                "expected `event: {kind}`, got `event: {}`: {}",
                e.event,
                cut(&e.raw)
            );
        }
        Ok(e)
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket

/// A WebSocket encoding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Enc {
    Json,
    Msgpack,
}

impl Enc {
    pub fn subprotocol(self) -> &'static str {
        match self {
            Enc::Json => "sluice.json.v1",
            Enc::Msgpack => "sluice.msgpack.v1",
        }
    }

    pub fn encode(self, v: &Value) -> Message {
        match self {
            Enc::Json => Message::text(v.to_string()),
            Enc::Msgpack => Message::binary(rmp_serde::to_vec_named(v).expect("encodable")),
        }
    }
}

pub struct Ws {
    pub stream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    pub enc: Enc,
    pub negotiated: Option<String>,
}

/// What a WebSocket read returned.
#[derive(Debug)]
pub enum Frame {
    /// A decoded message, with whether it came as a text frame.
    Msg { value: Value, text: bool },
    /// A close frame (code, reason) or the end of the stream.
    Closed(Option<(u16, String)>),
}

impl Ws {
    pub async fn send(&mut self, v: &Value) -> R {
        let msg = self.enc.encode(v);
        self.send_raw(msg).await
    }

    pub async fn send_raw(&mut self, msg: Message) -> R {
        self.stream
            .send(msg)
            .await
            .map_err(|e| transport("sending a WebSocket frame", e))
    }

    /// The next data frame within 10 s, decoded (text as JSON, binary as MessagePack).
    pub async fn frame(&mut self) -> R<Frame> {
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), self.stream.next())
                .await
                .map_err(|_| Verdict::Fail("no WebSocket message within 10s".into()))?;
            let msg = match next {
                None => return Ok(Frame::Closed(None)),
                Some(Err(e)) => fail!("the WebSocket broke: {e}"),
                Some(Ok(m)) => m,
            };
            match msg {
                Message::Text(t) => {
                    let value = serde_json::from_str(t.as_str())
                        .map_err(|e| format!("a text frame that is not JSON ({e}): {t}"))?;
                    return Ok(Frame::Msg { value, text: true });
                }
                Message::Binary(b) => {
                    let value: Value = rmp_serde::from_slice(&b)
                        .map_err(|e| format!("a binary frame that is not MessagePack: {e}"))?;
                    return Ok(Frame::Msg { value, text: false });
                }
                Message::Close(c) => {
                    return Ok(Frame::Closed(
                        c.map(|c| (u16::from(c.code), c.reason.to_string())),
                    ))
                }
                _ => continue,
            }
        }
    }

    /// The next message; fails on close, and when its frame kind does not match the
    /// negotiated encoding.
    pub async fn recv(&mut self) -> R<Value> {
        match self.frame().await? {
            Frame::Msg { value, text } => {
                let want_text = self.enc == Enc::Json;
                if text != want_text {
                    fail!(
                        "a {} frame on a {} connection: {}",
                        if text { "text" } else { "binary" },
                        self.enc.subprotocol(),
                        show(&value)
                    );
                }
                Ok(value)
            }
            Frame::Closed(c) => fail!("the WebSocket was closed: {c:?}"),
        }
    }

    /// The reply to request `id` (other messages — live events — are skipped).
    pub async fn reply(&mut self, id: &Value) -> R<Value> {
        for _ in 0..10_000 {
            let v = self.recv().await?;
            if v.get("id") == Some(id) {
                return Ok(v);
            }
        }
        fail!("no reply with id {id}")
    }

    /// Sends a request and waits for its reply.
    pub async fn request(&mut self, req: Value) -> R<Value> {
        let id = req["id"].clone();
        self.send(&req).await?;
        self.reply(&id).await
    }

    /// The next message for which `pred` holds (others skipped).
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> R<Value> {
        for _ in 0..10_000 {
            let v = self.recv().await.map_err(|e| match e {
                Verdict::Fail(why) => Verdict::Fail(format!("waiting for {what}: {why}")),
                other => other,
            })?;
            if pred(&v) {
                return Ok(v);
            }
        }
        fail!("never got {what}")
    }

    pub async fn close(mut self) {
        let _ = self.stream.close(None).await;
    }
}

/// The reply must be of this `type`.
pub fn reply_type(v: &Value, kind: &str) -> R<()> {
    if v.get("type").and_then(Value::as_str) != Some(kind) {
        fail!("expected a `{kind}` reply, got {}", show(v));
    }
    Ok(())
}

/// The reply must be an `error` with this code; returns the error object.
pub fn ws_error(v: &Value, code: &str) -> R<Value> {
    if v.get("type").and_then(Value::as_str) != Some("error")
        || v.pointer("/error/code").and_then(Value::as_str) != Some(code)
    {
        fail!("expected an `error` with code {code}, got {}", show(v));
    }
    match v.pointer("/error/message").and_then(Value::as_str) {
        Some(m) if !m.is_empty() => Ok(v["error"].clone()),
        _ => fail!("the error has no message: {}", show(v)),
    }
}
