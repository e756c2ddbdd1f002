//! The HTTP side: JSON requests to the server and Server-Sent Event streams.

use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::Value;

/// How long the shell waits to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of one SSE event the shell buffers (a live snapshot can be large; the
/// server bounds it by `view_rows_max`). A bigger event ends the stream with an error.
const SSE_EVENT_BYTES_MAX: usize = 256 * 1024 * 1024;

/// What can go wrong talking to the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request: `{"error": {"code", "message", …}}`.
    #[error("ERROR ({code}): {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        /// The failing statement's index within its request, when the server names it.
        statement: Option<u64>,
        /// Why a token was refused (`missing`, `expired`, …), for `unauthorized`.
        reason: Option<String>,
    },
    /// The server could not be reached, or the connection broke.
    #[error("ERROR (connection): {0}")]
    Transport(String),
    /// The server answered something the shell does not understand.
    #[error("ERROR (protocol): {0}")]
    Protocol(String),
    /// Ctrl-C stopped the request (the shell returns to its prompt).
    #[error("cancelled")]
    Cancelled,
}

impl Error {
    /// The error's code (`not_found`, `connection`, …).
    pub fn code(&self) -> &str {
        match self {
            Error::Api { code, .. } => code,
            Error::Transport(_) => "connection",
            Error::Protocol(_) => "protocol",
            Error::Cancelled => "cancelled",
        }
    }

    /// A client-side error in the server's shape.
    pub fn api(code: &str, message: impl Into<String>) -> Error {
        Error::Api {
            status: 0,
            code: code.to_string(),
            message: message.into(),
            statement: None,
            reason: None,
        }
    }
}

fn transport(base: &Url, e: reqwest::Error) -> Error {
    // The innermost cause says what happened ("Connection refused (os error 111)").
    let mut root: &dyn std::error::Error = &e;
    while let Some(s) = root.source() {
        root = s;
    }
    if e.is_connect() {
        Error::Transport(format!(
            "cannot reach {base}: {root}; is `sluice serve` running there? (--url or SLUICE_URL)"
        ))
    } else if e.is_timeout() {
        Error::Transport(format!("{base}: timed out: {root}"))
    } else {
        Error::Transport(format!("{e}: {root}"))
    }
}

/// A client for one server with one token.
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Client {
    pub fn new(base: Url, token: Option<String>) -> Result<Client, Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // A write whose fate is unknown must stay unknown: never send it twice.
            .retry(reqwest::retry::never())
            .build()
            .map_err(|e| Error::Transport(e.to_string()))?;
        Ok(Client { http, base, token })
    }

    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The URL of `path` (which starts with `/`) with the query `params`.
    pub fn url(&self, path: &str, params: &[(&str, &str)]) -> Result<Url, Error> {
        let mut url = self
            .base
            .join(path.trim_start_matches('/'))
            .map_err(|e| Error::Protocol(format!("bad URL for {path}: {e}")))?;
        if !params.is_empty() {
            url.query_pairs_mut().extend_pairs(params);
        }
        Ok(url)
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, Error> {
        let url = self.url(path, &[])?;
        let response = self
            .request(Method::GET, url)
            .send()
            .await
            .map_err(|e| transport(&self.base, e))?;
        self.json(response).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, Error> {
        let url = self.url(path, &[])?;
        let response = self
            .request(Method::POST, url)
            .json(body)
            .send()
            .await
            .map_err(|e| transport(&self.base, e))?;
        self.json(response).await
    }

    /// The reply's JSON, or the server's error.
    async fn json(&self, response: reqwest::Response) -> Result<Value, Error> {
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport(&self.base, e))?;
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        if status.is_success() {
            return value.ok_or_else(|| {
                Error::Protocol(format!(
                    "the server's reply is not JSON: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ))
            });
        }
        Err(api_error(status.as_u16(), value.as_ref(), &bytes))
    }

    /// Opens an event stream (`GET` of `url`), or the server's error.
    pub async fn events(&self, url: Url) -> Result<Events, Error> {
        let response = self
            .request(Method::GET, url)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| transport(&self.base, e))?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.unwrap_or_default();
            let value: Option<Value> = serde_json::from_slice(&bytes).ok();
            return Err(api_error(status.as_u16(), value.as_ref(), &bytes));
        }
        Ok(Events {
            response,
            base: self.base.clone(),
            buffer: Vec::new(),
            event: Event::default(),
        })
    }
}

fn api_error(status: u16, value: Option<&Value>, bytes: &[u8]) -> Error {
    let error = value.and_then(|v| v.get("error"));
    match error {
        Some(e) => {
            let statement = e["statement"].as_u64();
            let mut message = e["message"].as_str().unwrap_or("").to_string();
            // The shell sends one statement per request and numbers them itself: the
            // server's "statement 0: " prefix would only confuse.
            if let Some(i) = statement {
                if let Some(rest) = message.strip_prefix(&format!("statement {i}: ")) {
                    message = rest.to_string();
                }
            }
            Error::Api {
                status,
                code: e["code"].as_str().unwrap_or("unknown").to_string(),
                message,
                statement,
                reason: e["reason"].as_str().map(str::to_string),
            }
        }
        None => Error::Api {
            status,
            code: format!("http_{status}"),
            message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            statement: None,
            reason: None,
        },
    }
}

/// One Server-Sent Event.
#[derive(Debug, Default, Clone)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// A stream of Server-Sent Events.
pub struct Events {
    response: reqwest::Response,
    base: Url,
    buffer: Vec<u8>,
    event: Event,
}

impl Events {
    /// The next event, or `None` when the server ended the stream. Heartbeats (`:` lines)
    /// are skipped.
    pub async fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if !self.event.data.is_empty() || !self.event.event.is_empty() {
                        let mut event = std::mem::take(&mut self.event);
                        if event.event.is_empty() {
                            event.event = "message".to_string();
                        }
                        if event.data.ends_with('\n') {
                            event.data.pop();
                        }
                        return Ok(Some(event));
                    }
                    continue;
                }
                if line.starts_with(':') {
                    continue;
                }
                let (field, value) = match line.split_once(':') {
                    Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                    None => (line, ""),
                };
                match field {
                    "event" => self.event.event = value.to_string(),
                    "id" => self.event.id = Some(value.to_string()),
                    "data" => {
                        self.event.data.push_str(value);
                        self.event.data.push('\n');
                    }
                    _ => {}
                }
                if self.event.data.len() > SSE_EVENT_BYTES_MAX {
                    return Err(Error::Protocol(format!(
                        "an event is larger than {SSE_EVENT_BYTES_MAX} bytes (SSE_EVENT_BYTES_MAX)"
                    )));
                }
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => return Ok(None),
                Err(e) => return Err(transport(&self.base, e)),
            }
        }
    }
}
