//! The real `sluice serve` binary as a child process on a free loopback port.
//!
//! The bench runs inside the `sluice` binary, so by default it starts itself
//! (`std::env::current_exe()`); `--sluice-bin` or `SLUICE_BIN` point elsewhere. The child
//! is killed by its own pid when the handle is dropped.
//!
//! Every server this process starts gets the same admin token, generated once per bench
//! run ([`admin_token`]) and passed as `--admin-token`; every bench client sends it as
//! `Authorization: Bearer` ([`auth_headers`], [`ws_request`]), as a real client would.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::sys::{free_port, kill_and_reap, tail};

/// How long a start (including recovery) may take before the bench gives up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between two `/health` probes while waiting for readiness.
const HEALTH_POLL: Duration = Duration::from_millis(2);

/// Has this process back its memory with 4 KiB pages, as `serve` does once it has recovered
/// (`sluice_sched::set_transparent_huge_pages`); every suite starts with it.
///
/// *Clients.* With huge pages, a client thread that first touches a fresh 2 MiB page stalls
/// while the kernel clears it: on this kind of VM, 20–35 ms once or twice per live-load run,
/// counted against the server's write→diff.
///
/// *In-process cores* (`ingest`, `reads`) run as `serve` runs its own, so what they measure
/// is the server's engine. Heap growth is where the two differ: in-process `events` ingest
/// (1 000-row mutates, 16 tasks, disk class) ran 1.74–1.95 M rows/s with huge pages and
/// 2.38–2.46 M on 4 KiB pages in three alternating pairs; in-process point reads over 1 M
/// rows pay more TLB misses on 4 KiB pages (1.80 M against 1.89 M reads/s, one pair).
///
/// Best effort: where the kernel refuses, the process keeps what it has. A child inherits
/// the setting: a server sets its own (huge pages while it recovers), and the peers
/// (PostgreSQL, Redis, NATS) never ask for huge pages under the usual `madvise` system
/// setting.
pub fn pages_as_serve() {
    // A refusal only leaves the kernel's setting (and its stalls) in place.
    let _ = sluice_sched::set_transparent_huge_pages(false);
}

/// The admin token of every server this bench process starts: `sluice_admin_bench_` and
/// 16 random bytes in hex, generated on first use.
pub fn admin_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| format!("sluice_admin_bench_{}", random_hex(16)))
}

/// `bytes` random bytes in hex, from /dev/urandom (else from the clock, the pid and a
/// counter, which still makes a value no other run shares).
pub fn random_hex(bytes: usize) -> String {
    use std::io::Read;
    let mut random = vec![0u8; bytes];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut random));
    if read.is_err() {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut x = (nanos ^ (u64::from(std::process::id()) << 32) ^ (n << 48)) | 1;
        for b in random.iter_mut() {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            *b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
        }
    }
    random.iter().map(|b| format!("{b:02x}")).collect()
}

/// `Bearer <token>`: the `Authorization` header value for `token`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Default headers for a bench HTTP client: `Authorization: Bearer <admin token>`.
pub fn auth_headers() -> reqwest::header::HeaderMap {
    token_headers(admin_token())
}

/// Default headers for an HTTP client that sends `token`.
pub fn token_headers(token: &str) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    let value =
        reqwest::header::HeaderValue::from_str(&bearer(token)).expect("a token is printable ASCII");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    headers
}

/// A WebSocket upgrade request for `url` with `Authorization: Bearer <token>` and, when
/// given, the subprotocol `protocol`.
pub fn ws_request(
    url: &str,
    token: &str,
    protocol: Option<&str>,
) -> anyhow::Result<tokio_tungstenite::tungstenite::handshake::client::Request> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request()?;
    let headers = request.headers_mut();
    headers.insert("Authorization", bearer(token).parse()?);
    if let Some(protocol) = protocol {
        headers.insert("Sec-WebSocket-Protocol", protocol.parse()?);
    }
    Ok(request)
}

/// Bytes a bench client's WebSocket reads at once, as the server reads: tungstenite
/// zero-fills the free part of its read buffer before every read (128 KiB by default), which
/// with frames of a few KiB per read was most of a client's `memset` time, on the CPUs the
/// server shares.
const WS_READ_BUFFER_BYTES: usize = 16 << 10;

/// The WebSocket settings of every bench client ([`WS_READ_BUFFER_BYTES`]).
pub fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// Which binary to start: `--sluice-bin`, else `$SLUICE_BIN`, else this executable.
pub fn sluice_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match flag {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("SLUICE_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe().context("cannot find the running executable")?,
        },
    };
    anyhow::ensure!(
        bin.is_file(),
        "the sluice binary {} does not exist (set --sluice-bin or SLUICE_BIN)",
        bin.display()
    );
    Ok(bin)
}

/// Extra `serve` flags for every Sluice server a bench starts, from `$SLUICE_BENCH_SERVE_ARGS`
/// (split on whitespace; e.g. `--log-sync-threads 3`), for trying a setting without a
/// rebuild. Each suite's `run.json` records them (`serve_args_from_env`).
pub fn serve_args_from_env() -> Vec<String> {
    std::env::var("SLUICE_BENCH_SERVE_ARGS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A running `sluice serve`.
#[derive(Debug)]
pub struct SluiceServer {
    child: Child,
    pub base_url: String,
    log_path: PathBuf,
    http: reqwest::Client,
}

/// Parsed `/metrics`: series name (with labels, as printed) to value.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub HashMap<String, f64>);

use sluice_log::latency::LATENCY_BUCKETS;

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (name, value) = l.rsplit_once(' ')?;
                    Some((name.trim().to_string(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The value of `name`, 0 when the server does not expose it.
    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// The cumulative buckets of the server's log2-µs histogram `name`: the counts at
    /// `le` = 1, 2, 4 … µs, then at `+Inf` (all of them).
    pub fn histogram(&self, name: &str) -> [u64; LATENCY_BUCKETS] {
        std::array::from_fn(|i| {
            let le = if i + 1 == LATENCY_BUCKETS {
                "+Inf".to_string()
            } else {
                format!("{}", (1u64 << i) as f64 / 1e6)
            };
            self.get(&format!("{name}_bucket{{le=\"{le}\"}}")) as u64
        })
    }
}

impl SluiceServer {
    /// Starts `bin serve --data data_dir --admin-token <admin_token()>` plus `extra` flags on
    /// a free loopback port and waits until `/health` answers 200. Returns the server and the time from spawn to
    /// the first successful `/health` (time-to-ready).
    pub async fn start(
        bin: &Path,
        data_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<(SluiceServer, Duration)> {
        let port = free_port()?;
        let log_path = data_dir.with_extension("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .default_headers(auth_headers())
            .timeout(Duration::from_secs(60))
            .build()?;
        let base_url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let child = Command::new(bin)
            .arg("serve")
            .arg("--data")
            .arg(data_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-token")
            .arg(admin_token())
            .args(extra)
            .args(serve_args_from_env())
            .env_remove("SLUICE_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut server = SluiceServer {
            child,
            base_url,
            log_path,
            http,
        };
        let probe = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()?;
        let health = server.url("/health");
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                anyhow::bail!(
                    "sluice serve exited with {status} before it was ready; its log ends with:\n{}",
                    tail(&server.log_path, 20)
                );
            }
            if let Ok(resp) = probe.get(&health).send().await {
                if resp.status().is_success() {
                    return Ok((server, started.elapsed()));
                }
            }
            anyhow::ensure!(
                started.elapsed() < READY_TIMEOUT,
                "sluice serve was not ready after {READY_TIMEOUT:?}; its log ends with:\n{}",
                tail(&server.log_path, 20)
            );
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The admin token this server was started with.
    pub fn admin_token(&self) -> &'static str {
        admin_token()
    }

    async fn post_json(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    /// `PUT path` with a JSON body (topics are created this way); the answer as JSON.
    pub async fn http_put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send_json(reqwest::Method::PUT, path, body).await
    }

    async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<Value> {
        let resp = self
            .http
            .request(method.clone(), self.url(path))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body)?)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{method} {path}: {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }

    /// Runs DDL through `POST /v1/sql`.
    pub async fn sql(&self, sql: &str) -> anyhow::Result<Value> {
        self.post_json("/v1/sql", &serde_json::json!({ "sql": sql }))
            .await
    }

    /// `POST /v1/admin/snapshot`; returns the seq of the snapshot.
    pub async fn snapshot(&self) -> anyhow::Result<u64> {
        let v = self
            .post_json("/v1/admin/snapshot", &serde_json::json!({}))
            .await?;
        v["seq"]
            .as_u64()
            .with_context(|| format!("snapshot answer without a seq: {v}"))
    }

    /// `GET /health` → the confirmed seq.
    pub async fn health_seq(&self) -> anyhow::Result<u64> {
        let v: Value = self
            .http
            .get(self.url("/health"))
            .send()
            .await?
            .json()
            .await?;
        v["seq"]
            .as_u64()
            .with_context(|| format!("/health answer without a seq: {v}"))
    }

    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        let resp = self.http.get(self.url("/metrics")).send().await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "GET /metrics: {}",
            resp.status()
        );
        Ok(Metrics::parse(&resp.text().await?))
    }

    /// `kill -9` (the crash the recovery suite measures), then reap the process.
    pub fn kill9(mut self) {
        self.kill9_in_place();
    }

    /// `kill -9` and reap, keeping the handle (its URL no longer answers).
    pub fn kill9_in_place(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

impl Drop for SluiceServer {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_is_parsed() {
        let m = Metrics::parse(
            "# HELP sluice_commits_total x\n# TYPE sluice_commits_total counter\nsluice_commits_total 42\nsluice_recovery_seconds 0.25\nsluice_log_sync_seconds_bucket{le=\"+Inf\"} 7\n",
        );
        assert_eq!(m.get("sluice_commits_total"), 42.0);
        assert_eq!(m.get("sluice_recovery_seconds"), 0.25);
        assert_eq!(m.get("sluice_log_sync_seconds_bucket{le=\"+Inf\"}"), 7.0);
        assert_eq!(m.get("missing"), 0.0);
    }

    #[test]
    fn histogram_buckets_are_read_by_their_bounds() {
        let m = Metrics::parse(
            "h_bucket{le=\"0.000001\"} 1\nh_bucket{le=\"0.000002\"} 3\nh_bucket{le=\"0.004096\"} 9\nh_bucket{le=\"+Inf\"} 10\n",
        );
        let h = m.histogram("h");
        assert_eq!((h[0], h[1], h[2], h[12]), (1, 3, 0, 9));
        assert_eq!(h[LATENCY_BUCKETS - 1], 10);
    }
}
