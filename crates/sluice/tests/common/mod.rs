//! Helpers shared by the integration tests of the real `sluice` binary.
//!
//! - [`TempDir`]: a directory under `std::env::temp_dir()` removed on drop.
//! - [`Server`]: a `sluice serve` child on `127.0.0.1:<free port>`, killed by its pid on
//!   drop (so a panicking test leaves no process behind).
//! - [`Api`]: a small JSON client over the HTTP API.
//! - [`ADMIN_TOKEN`]: every server is started with it (`--admin-token`) and every request
//!   the helpers make carries it (`Authorization: Bearer`), as a real client does.
//! - [`Rng`]: a seeded PRNG; [`seed`] prints the seed so a failure can be replayed.
//!
//! Every wait here is bounded in time and in iterations.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod bench;
pub mod topics;

/// The binary under test, built by cargo for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// How long a server may take to recover and start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to exit after SIGTERM, or to fail at startup.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts to start a server when the free port we picked was taken in the meantime.
const START_ATTEMPTS_MAX: usize = 5;

/// The admin token of every test server ([`Server::start`] passes `--admin-token`).
pub const ADMIN_TOKEN: &str = "sluice_admin_test_0123456789abcdef";

/// The `Authorization` header value for [`ADMIN_TOKEN`].
pub fn bearer() -> String {
    format!("Bearer {ADMIN_TOKEN}")
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

// ---------------------------------------------------------------------------------------
// Files

/// A fresh directory under the system temp dir; removed (with its contents) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("sluice-it-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, part: &str) -> PathBuf {
        self.path.join(part)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Copies the files of a (flat) data directory.
pub fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// XORs one byte of a file with 0xFF.
pub fn flip_byte(path: &Path, pos: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[pos as usize] ^= 0xFF;
    std::fs::write(path, bytes).unwrap();
}

pub fn truncate_file(path: &Path, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(len).unwrap();
}

pub fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Runs `sluice check --data <data>`.
pub fn check(data: &Path) -> Output {
    Command::new(BIN)
        .args(["check", "--data"])
        .arg(data)
        .env("RUST_LOG", "info")
        .output()
        .expect("run sluice check")
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---------------------------------------------------------------------------------------
// The server process

/// A port that was free a moment ago, below the ephemeral range, so that no test's outgoing
/// connection takes it before the server binds it ([`sluice_cluster::testkit::free_ports`]).
pub fn free_port() -> u16 {
    sluice_cluster::testkit::free_ports(1).expect("a free loopback port")[0]
}

/// A running `sluice serve`. Dropping it kills the process (by its pid) and reaps it.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub data: PathBuf,
    pub stderr_path: PathBuf,
}

/// Whether [`spawn_serve`] passes `--admin-token` [`ADMIN_TOKEN`]: not when the test
/// names an admin token itself, nor when it wants the server to generate one.
#[derive(Clone, Copy, PartialEq)]
enum AdminToken {
    Test,
    Generated,
}

fn spawn_serve(
    data: &Path,
    addr: SocketAddr,
    stderr_path: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    admin: AdminToken,
) -> Child {
    let stderr = std::fs::File::create(stderr_path).expect("create the server's stderr file");
    let named = extra.iter().any(|a| a.starts_with("--admin-token"))
        || env.iter().any(|(k, _)| *k == "SLUICE_ADMIN_TOKEN");
    let token: &[&str] = if admin == AdminToken::Test && !named {
        &["--admin-token", ADMIN_TOKEN]
    } else {
        &[]
    };
    Command::new(BIN)
        .arg("serve")
        .arg("--data")
        .arg(data)
        .arg("--listen")
        .arg(addr.to_string())
        .args(token)
        .args(extra)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn sluice serve")
}

fn stderr_file(logs: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    logs.join(format!(
        "serve-{}.stderr",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Server {
    /// Starts `sluice serve --data <data> --listen 127.0.0.1:<free port> --admin-token
    /// <ADMIN_TOKEN> <extra…>` and waits until it accepts connections (it binds only after
    /// recovery). Its stderr goes to a file under `logs` (which must not be `data`).
    pub fn start(data: &Path, logs: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(data, logs, extra, &[])
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_with_env(
        data: &Path,
        logs: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        Server::start_inner(data, logs, extra, env, AdminToken::Test)
    }

    /// [`Server::start`] without `--admin-token` (nor `SLUICE_ADMIN_TOKEN`): the server reads
    /// or generates `<data>/admin-token`.
    pub fn start_with_stored_admin_token(data: &Path, logs: &Path, extra: &[&str]) -> Server {
        Server::start_inner(data, logs, extra, &[], AdminToken::Generated)
    }

    fn start_inner(
        data: &Path,
        logs: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        admin: AdminToken,
    ) -> Server {
        for attempt in 1..=START_ATTEMPTS_MAX {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let stderr_path = stderr_file(logs);
            let child = spawn_serve(data, addr, &stderr_path, extra, env, admin);
            let mut server = Server {
                child,
                addr,
                data: data.to_path_buf(),
                stderr_path,
            };
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                if let Some(status) = server.child.try_wait().unwrap() {
                    let stderr = server.stderr();
                    if stderr.contains("cannot listen") && attempt < START_ATTEMPTS_MAX {
                        break; // the port was taken in the meantime; try another one
                    }
                    panic!("sluice serve exited with {status} before listening:\n{stderr}");
                }
                if server.says_it_listens() {
                    return server;
                }
                assert!(
                    Instant::now() < deadline,
                    "sluice serve did not listen within {START_TIMEOUT:?}:\n{}",
                    server.stderr()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Runs `sluice serve` on a data directory that must be refused, and returns its exit
    /// status and stderr. Panics if it starts listening instead.
    pub fn start_expecting_failure(
        data: &Path,
        logs: &Path,
        extra: &[&str],
    ) -> (ExitStatus, String) {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let stderr_path = stderr_file(logs);
        let child = spawn_serve(data, addr, &stderr_path, extra, &[], AdminToken::Test);
        let mut server = Server {
            child,
            addr,
            data: data.to_path_buf(),
            stderr_path,
        };
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                return (status, server.stderr());
            }
            if server.says_it_listens() {
                panic!(
                    "sluice serve started on a data directory it must refuse:\n{}",
                    server.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sluice serve neither failed nor listened within {EXIT_TIMEOUT:?}:\n{}",
                server.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `sluice serve` with `flag` set to each of `bad` and asserts that every start
    /// fails saying the value is outside `range` (as `"--flag V is outside RANGE"`).
    pub fn assert_flag_refused(dir: &TempDir, flag: &str, bad: &[&str], range: &str) {
        for value in bad {
            let (status, stderr) =
                Server::start_expecting_failure(&dir.join("data"), dir.path(), &[flag, value]);
            assert!(!status.success(), "{flag} {value} was accepted");
            assert!(
                stderr.contains(&format!("{flag} {value} is outside {range}")),
                "{stderr}"
            );
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client with the admin token.
    pub fn api(&self) -> Api {
        Api::new(&self.base_url())
    }

    /// A client with `token` as its bearer token, or none at all.
    pub fn api_as(&self, token: Option<&str>) -> Api {
        Api::with_token(&self.base_url(), token)
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Whether this process logged that it bound `addr`. A TCP connect is not proof: with
    /// tests running in parallel, two may pick the same free port, and a connect then reaches
    /// the other test's server while this one fails to bind (and exits), or the other server
    /// is killed a moment later and the first request finds nobody listening.
    fn says_it_listens(&self) -> bool {
        let said = format!("://{}", self.addr);
        self.stderr()
            .lines()
            .any(|l| l.contains("sluice listening on") && l.contains(&said))
    }

    /// `kill -9`: no chance to flush, snapshot or say goodbye.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }

    /// Waits up to `within` for the process to exit by itself; `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet (so it cannot have
        // been reused) and a valid signal number; it touches no memory of ours.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        self.signal_term();
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "sluice serve did not exit within {EXIT_TIMEOUT:?} of SIGTERM:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Kills by the child's pid; a no-op if it was already reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

/// A JSON client for one server.
#[derive(Clone)]
pub struct Api {
    /// Sends `Authorization: Bearer <token>` with every request (default headers).
    pub client: reqwest::Client,
    pub base: String,
    /// The bearer token `client` sends, for clients built elsewhere (streams).
    pub token: Option<String>,
}

/// A request that got no HTTP response (connection refused or cut).
#[derive(Debug)]
pub struct NoResponse(pub String);

impl Api {
    /// A client that sends [`ADMIN_TOKEN`] with every request.
    pub fn new(base: &str) -> Api {
        Api::with_token(base, Some(ADMIN_TOKEN))
    }

    /// A client that sends `token` as `Authorization: Bearer` with every request (or no
    /// `Authorization` header for `None`).
    pub fn with_token(base: &str, token: Option<&str>) -> Api {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}")
                    .parse()
                    .expect("a valid header value"),
            );
        }
        let client = reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .timeout(Duration::from_secs(30))
            // A request whose fate is unknown must stay unknown: never replay it.
            .retry(reqwest::retry::never())
            .build()
            .expect("build an HTTP client");
        Api {
            client,
            base: base.to_string(),
            token: token.map(str::to_string),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn finish(resp: reqwest::RequestBuilder) -> Result<(u16, Value), NoResponse> {
        let resp = resp
            .send()
            .await
            .map_err(|e| NoResponse(format!("{e:?}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| NoResponse(format!("{e:?}")))?;
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, value))
    }

    /// `POST path` with a JSON body; `Err` if no response arrived.
    pub async fn try_post(&self, path: &str, body: &Value) -> Result<(u16, Value), NoResponse> {
        Self::finish(self.client.post(self.url(path)).json(body)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.try_post(path, body)
            .await
            .unwrap_or_else(|e| panic!("POST {path} {body}: no response: {e:?}"))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        Self::finish(self.client.get(self.url(path)))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: no response: {e:?}"))
    }

    /// `GET path?name=value&…` with the values percent-encoded.
    pub async fn get_with(&self, path: &str, params: &[(&str, &str)]) -> (u16, Value) {
        let url = reqwest::Url::parse_with_params(&self.url(path), params).unwrap();
        Self::finish(self.client.get(url))
            .await
            .unwrap_or_else(|e| panic!("GET {path} {params:?}: no response: {e:?}"))
    }

    pub async fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Runs DDL; panics unless it succeeds.
    pub async fn sql(&self, sql: &str) -> Value {
        let (status, body) = self.post("/v1/sql", &json!({ "sql": sql })).await;
        assert_eq!(status, 200, "{sql}: {body}");
        body
    }

    /// Runs a mutate; panics unless it succeeds. Returns the response body.
    pub async fn mutate(&self, ops: Value) -> Value {
        let body = json!({ "ops": ops });
        let (status, resp) = self.post("/v1/mutate", &body).await;
        assert_eq!(status, 200, "mutate {body}: {resp}");
        resp
    }

    /// `POST /v1/call/{name}` with `{"args": args}`; `Err` if no response arrived.
    pub async fn try_call(&self, name: &str, args: &Value) -> Result<(u16, Value), NoResponse> {
        self.try_post(&format!("/v1/call/{name}"), &json!({ "args": args }))
            .await
    }

    /// `POST /v1/call/{name}`; panics if no response arrived.
    pub async fn call(&self, name: &str, args: &Value) -> (u16, Value) {
        self.try_call(name, args)
            .await
            .unwrap_or_else(|e| panic!("call {name}({args}): no response: {e:?}"))
    }

    /// `PUT /v1/functions` with the module source as the raw body.
    pub async fn put_functions(&self, source: &str) -> (u16, Value) {
        Self::finish(
            self.client
                .put(self.url("/v1/functions"))
                .header("content-type", "text/javascript")
                .body(source.to_string()),
        )
        .await
        .unwrap_or_else(|e| panic!("PUT /v1/functions: no response: {e:?}"))
    }

    pub async fn health_seq(&self) -> u64 {
        let body = self.get_ok("/health").await;
        body["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("/health: {body}"))
    }

    /// The value of one metric line `name <value>` from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("read /metrics");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.trim().parse::<f64>().expect("a number"))
            })
            .unwrap_or_else(|| panic!("no metric {name} in /metrics:\n{text}"))
    }

    /// Every row of `table` in key order, following `next` with pages of `limit`; each item
    /// is `{"row": {…}, "version": n}`. Asserts that pages do not overlap.
    pub async fn scan_all(&self, table: &str, limit: usize) -> Vec<Value> {
        let path = format!("/v1/tables/{table}/rows");
        let mut rows = Vec::new();
        let mut after: Option<String> = None;
        let limit = limit.to_string();
        for _ in 0..1_000_000 {
            let mut params = vec![("limit", limit.as_str())];
            if let Some(a) = &after {
                params.push(("after", a.as_str()));
            }
            let (status, body) = self.get_with(&path, &params).await;
            assert_eq!(status, 200, "scan {table} after {after:?}: {body}");
            let page = body["rows"].as_array().expect("rows").clone();
            rows.extend(page);
            match &body["next"] {
                Value::Null => return rows,
                Value::String(s) => after = Some(s.clone()),
                other => after = Some(other.to_string()),
            }
        }
        panic!("scan of {table} did not end");
    }
}

/// A file of this repository, by its path from the workspace root (e.g. `examples/bank.js`).
pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

// ---------------------------------------------------------------------------------------
// Randomness

/// Reads `SLUICE_TEST_SEED` or makes a seed from the clock, and prints it (test output is
/// shown on failure) so the run can be repeated.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("SLUICE_TEST_SEED") {
        Ok(s) => s.parse().expect("SLUICE_TEST_SEED must be a u64"),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            nanos ^ (u64::from(std::process::id()) << 32)
        }
    };
    eprintln!("{test}: seed {seed} (repeat with SLUICE_TEST_SEED={seed})");
    seed
}

/// SplitMix64: small, fast, good enough for workloads.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}
