//! In-process harness for HTTP tests: a [`Core`] on a temp data directory and its
//! [`router`](sluice_server::api::router), driven with `tower::ServiceExt::oneshot`.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{Method, Request};
use axum::Router;
use serde_json::Value;
use sluice_server::{Config, Core};
use tower::ServiceExt;

/// The admin token every test server is started with; every request the tests make
/// carries it as `Authorization: Bearer` (docs/security.md), as a real client does.
pub const ADMIN_TOKEN: &str = "sluice_admin_test_0123456789abcdef";

/// The `Authorization` header value for [`ADMIN_TOKEN`].
pub fn bearer() -> String {
    format!("Bearer {ADMIN_TOKEN}")
}

/// A loopback HTTP client that sends the admin token with every request.
pub fn http_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        bearer().parse().expect("a valid header value"),
    );
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}

/// A WebSocket upgrade request for `url` carrying the admin token and, when given, the
/// subprotocol `protocol`.
pub fn ws_request(
    url: &str,
    protocol: Option<&str>,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("a WebSocket URL");
    let headers = request.headers_mut();
    headers.insert("Authorization", bearer().parse().expect("a valid header"));
    if let Some(protocol) = protocol {
        headers.insert(
            "Sec-WebSocket-Protocol",
            protocol.parse().expect("a valid subprotocol"),
        );
    }
    request
}

/// Opens a database in `dir` with the config `configure` makes of the defaults, serves its
/// router on a loopback port (with TCP_NODELAY, as `sluice serve` does: live events are
/// small writes that must not wait for delayed ACKs) and applies the DDL `sql`.
pub async fn serve(
    dir: &Path,
    configure: impl FnOnce(&mut Config),
    sql: &str,
) -> (Core, std::net::SocketAddr) {
    let mut config = Config::new(dir);
    config.auth.admin_token = Some(ADMIN_TOKEN.into());
    configure(&mut config);
    let core = tokio::task::spawn_blocking(move || Core::open(config))
        .await
        .expect("the open task")
        .expect("open the database");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let router = sluice_server::api::router(core.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let changes = sluice_sql::parse_ddl(sql)
        .expect("the DDL parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    core.ddl(changes, sql.into(), None)
        .await
        .expect("the DDL applies");
    (core, addr)
}

/// A response as the tests look at it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// The body parsed as JSON (`Value::String` if it is not JSON, `Null` if empty).
    pub json: Value,
    pub text: String,
}

/// An open database: its core and the router over it.
pub struct TestDb {
    pub core: Core,
    pub router: Router,
}

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("sluice-st-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

impl TestDb {
    /// Opens a database in `dir` with the config `configure` makes of the defaults.
    pub fn open(dir: &Path, configure: impl FnOnce(&mut Config)) -> TestDb {
        let mut config = Config::new(dir);
        config.auth.admin_token = Some(ADMIN_TOKEN.into());
        configure(&mut config);
        let core = Core::open(config).expect("open the database");
        TestDb {
            router: sluice_server::api::router(core.clone()),
            core,
        }
    }

    /// Sends one request with the admin token.
    pub async fn request(&self, method: Method, uri: &str, body: impl Into<Body>) -> Reply {
        self.request_as(Some(ADMIN_TOKEN), method, uri, body).await
    }

    /// Sends one request with `token` as its bearer token, or with no `Authorization`
    /// header when `None`.
    pub async fn request_as(
        &self,
        token: Option<&str>,
        method: Method,
        uri: &str,
        body: impl Into<Body>,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(body.into()).expect("a valid request");
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("read the response body");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()))
        };
        Reply { status, json, text }
    }

    pub async fn get(&self, uri: &str) -> Reply {
        self.request(Method::GET, uri, Body::empty()).await
    }

    pub async fn post(&self, uri: &str, body: impl Into<Body>) -> Reply {
        self.request(Method::POST, uri, body).await
    }

    /// POSTs and panics unless the answer is 200; returns the JSON body.
    pub async fn post_ok(&self, uri: &str, body: &str) -> Value {
        let reply = self.post(uri, body.to_string()).await;
        assert_eq!(reply.status, 200, "POST {uri} {body}: {}", reply.text);
        reply.json
    }

    pub async fn get_ok(&self, uri: &str) -> Value {
        let reply = self.get(uri).await;
        assert_eq!(reply.status, 200, "GET {uri}: {}", reply.text);
        reply.json
    }

    /// The value of one metric line `name <value>` from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let reply = self.get("/metrics").await;
        reply
            .text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.trim().parse::<f64>().expect("a number"))
            })
            .unwrap_or_else(|| panic!("no metric {name} in /metrics:\n{}", reply.text))
    }

    /// Stops the writer (which writes a final snapshot) and lets go of the database.
    pub async fn close(self) {
        self.core.shutdown().await.expect("clean shutdown");
    }
}
