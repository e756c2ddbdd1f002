//! The watcher side of the fan-out suite: one tokio task per connection, parsing only what
//! it needs — the record's offset (Sluice) or sequence number (Redis) — and stamping the
//! time it arrived.
//!
//! - SSE: a raw HTTP/1.1 `GET …/watch` on a TCP socket, chunked transfer decoded by hand,
//!   `id:` lines read; `event: watching` marks the watch registered.
//! - WebSocket: `/v1/ws` `watch`, then `"offset":` found in each `record` text frame.
//! - Redis pub/sub: `SUBSCRIBE`, each `message` payload is the sequence number.
//! - Redis Streams: `XREAD BLOCK 0` in a loop from the last id seen; field `n` of each entry.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::peers::resp;

/// How the watchers listen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    Sse,
    Ws,
    RedisPubSub,
    RedisStreams,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::Ws => "ws",
            Transport::RedisPubSub => "redis-pubsub",
            Transport::RedisStreams => "redis-streams",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Transport> {
        Ok(match s {
            "sse" => Transport::Sse,
            "ws" => Transport::Ws,
            "redis-pubsub" => Transport::RedisPubSub,
            "redis-streams" => Transport::RedisStreams,
            other => anyhow::bail!(
                "unknown transport {other:?} (--transports takes sse, ws, redis-pubsub, redis-streams)"
            ),
        })
    }

    pub fn is_redis(self) -> bool {
        matches!(self, Transport::RedisPubSub | Transport::RedisStreams)
    }
}

/// Lock-free log-linear histogram of µs values (about 1.6% resolution) that thousands of
/// watcher tasks record into at once.
#[derive(Debug)]
pub struct AtomicHist {
    buckets: Vec<AtomicU64>,
}

const SUB_BITS: u32 = 6;

impl Default for AtomicHist {
    fn default() -> Self {
        AtomicHist {
            buckets: (0..(64 << SUB_BITS)).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl AtomicHist {
    fn index(v: u64) -> usize {
        if v < (1 << SUB_BITS) {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros();
        let mantissa = (v >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        (((exp - SUB_BITS + 1) << SUB_BITS) as u64 + mantissa) as usize
    }

    /// The largest value of bucket `i`.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < (1 << SUB_BITS) {
            return i;
        }
        let exp = (i >> SUB_BITS) + u64::from(SUB_BITS) - 1;
        let mantissa = i & ((1 << SUB_BITS) - 1);
        let low = (1u64 << exp) | (mantissa << (exp - u64::from(SUB_BITS)));
        low + (1u64 << (exp - u64::from(SUB_BITS))) - 1
    }

    pub fn record(&self, us: u64) {
        self.buckets[Self::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Value at quantile `q` (upper edge of its bucket); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::upper(i);
            }
        }
        0
    }
}

/// What the publisher and every watcher share during one case.
#[derive(Debug)]
pub struct Shared {
    /// Time base: all stamps are µs since this instant.
    pub base: Instant,
    /// When record `n` was sent (µs since `base`, 0 = not yet).
    pub sent: Vec<AtomicU64>,
    /// When the last watcher got record `n` (max over watchers).
    pub last_recv: Vec<AtomicU64>,
    /// Per-delivery latency (recv − sent) of the latency phase.
    pub delivery: AtomicHist,
    /// Records below this number belong to the latency phase.
    pub latency_phase: u64,
    /// Deliveries so far, all phases.
    pub deliveries: AtomicU64,
    /// Watchers whose watch is registered.
    pub ready: AtomicU64,
}

impl Shared {
    pub fn new(capacity: usize, latency_phase: u64) -> Shared {
        Shared {
            base: Instant::now(),
            sent: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            last_recv: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            delivery: AtomicHist::default(),
            latency_phase,
            deliveries: AtomicU64::new(0),
            ready: AtomicU64::new(0),
        }
    }

    pub fn now_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }
}

/// One watcher's account of what it received.
#[derive(Debug, Default)]
pub struct WatcherState {
    pub count: AtomicU64,
    /// Order-sensitive hash of the numbers received ([`fold`]).
    pub hash: AtomicU64,
    /// Next number must be above this (`u64::MAX` = nothing yet).
    pub last: AtomicU64,
    pub out_of_order: AtomicBool,
    pub error: Mutex<Option<String>>,
}

/// The order-sensitive hash a watcher keeps of the numbers it received.
pub fn fold(hash: u64, n: u64) -> u64 {
    (hash ^ (n + 1)).wrapping_mul(0x100_0000_01b3)
}

impl WatcherState {
    pub fn new() -> Self {
        WatcherState {
            last: AtomicU64::new(u64::MAX),
            ..WatcherState::default()
        }
    }

    fn deliver(&self, n: u64, shared: &Shared) {
        let now = shared.now_us();
        // Only this watcher's task writes its own state: plain load/store suffices.
        let last = self.last.load(Ordering::Relaxed);
        if last != u64::MAX && n <= last {
            self.out_of_order.store(true, Ordering::Relaxed);
        }
        self.last.store(n, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let h = self.hash.load(Ordering::Relaxed);
        self.hash.store(fold(h, n), Ordering::Relaxed);
        if let Some(slot) = shared.last_recv.get(n as usize) {
            slot.fetch_max(now, Ordering::Relaxed);
        }
        if n < shared.latency_phase {
            let sent = shared.sent[n as usize].load(Ordering::Relaxed);
            shared.delivery.record(now.saturating_sub(sent).max(1));
        }
        shared.deliveries.fetch_add(1, Ordering::Relaxed);
    }

    fn fail(&self, e: impl std::fmt::Display) {
        let mut slot = self.error.lock().expect("watcher error lock");
        if slot.is_none() {
            *slot = Some(e.to_string());
        }
    }
}

/// Where and what one watcher watches.
#[derive(Clone, Debug)]
pub struct Target {
    pub transport: Transport,
    /// Sluice: `127.0.0.1:port`; Redis: the port is used.
    pub addr: String,
    pub port: u16,
    /// Sluice topic (or Redis channel / stream key when `tags` is empty).
    pub topic: String,
    /// Sluice tag filter (one tag), or the Redis channel / stream key.
    pub tag: Option<String>,
}

/// Runs one watcher until its task is aborted; its registration bumps `shared.ready`.
pub async fn run(target: Target, state: Arc<WatcherState>, shared: Arc<Shared>) {
    let r = match target.transport {
        Transport::Sse => sse(&target, &state, &shared).await,
        Transport::Ws => ws(&target, &state, &shared).await,
        Transport::RedisPubSub => redis_pubsub(&target, &state, &shared).await,
        Transport::RedisStreams => redis_streams(&target, &state, &shared).await,
    };
    if let Err(e) = r {
        state.fail(format!("{e:#}"));
    }
}

async fn sse(t: &Target, state: &WatcherState, shared: &Shared) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect(&t.addr)
        .await
        .with_context(|| format!("cannot connect to {}", t.addr))?;
    stream.set_nodelay(true)?;
    let query = t
        .tag
        .as_ref()
        .map(|tag| format!("?tag={}", tag.replace(':', "%3A").replace('*', "%2A")))
        .unwrap_or_default();
    let req = format!(
        "GET /v1/topics/{}/watch{query} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n\r\n",
        t.topic,
        t.addr,
        crate::server::bearer(crate::server::admin_token())
    );
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = vec![0u8; 16 << 10];
    // Response head.
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the server closed before answering the watch");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        anyhow::ensure!(buf.len() < 64 << 10, "response head too long");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    anyhow::ensure!(
        head.starts_with("http/1.1 200"),
        "watch refused: {}",
        String::from_utf8_lossy(&buf)
            .lines()
            .next()
            .unwrap_or_default()
    );
    let chunked = head.contains("transfer-encoding: chunked");
    let mut raw: Vec<u8> = buf[head_end..].to_vec();
    // De-chunked SSE text not yet parsed into lines.
    let mut text: Vec<u8> = Vec::with_capacity(8192);
    let mut event_is_record = false;
    let mut pending_id: Option<u64> = None;
    loop {
        // Move whole chunks from `raw` to `text`.
        if chunked {
            while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
                let size_str = std::str::from_utf8(&raw[..eol])?;
                let size =
                    usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                        .with_context(|| format!("bad chunk size {size_str:?}"))?;
                if raw.len() < eol + 2 + size + 2 {
                    break;
                }
                if size == 0 {
                    anyhow::bail!("the server ended the watch stream");
                }
                text.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
                raw.drain(..eol + 2 + size + 2);
            }
        } else {
            text.append(&mut raw);
        }
        // Parse complete lines.
        let mut start = 0;
        while let Some(rel) = text[start..].iter().position(|&b| b == b'\n') {
            let line = &text[start..start + rel];
            start += rel + 1;
            if line.is_empty() {
                if event_is_record {
                    let n = pending_id.context("a record event without an id: line")?;
                    state.deliver(n, shared);
                }
                event_is_record = false;
                pending_id = None;
            } else if let Some(ev) = line.strip_prefix(b"event: ") {
                match ev {
                    b"record" => event_is_record = true,
                    b"watching" => {
                        shared.ready.fetch_add(1, Ordering::Relaxed);
                    }
                    b"error" => {
                        let rest = String::from_utf8_lossy(&text[start..]).into_owned();
                        anyhow::bail!("the server ended the watch: {rest}");
                    }
                    _ => {}
                }
            } else if let Some(id) = line.strip_prefix(b"id: ") {
                pending_id = Some(parse_u64(id).context("a non-numeric id: line")?);
            }
        }
        text.drain(..start);
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the server closed the watch stream");
        raw.extend_from_slice(&chunk[..n]);
    }
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// The number after `key` in `text` (`"offset":17` → 17).
fn number_after(text: &[u8], key: &[u8]) -> Option<u64> {
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: &[u8] = &text[at..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    parse_u64(&digits[..end])
}

async fn ws(t: &Target, state: &WatcherState, shared: &Shared) -> anyhow::Result<()> {
    let url = format!("ws://{}/v1/ws", t.addr);
    let request = crate::server::ws_request(&url, crate::server::admin_token(), None)?;
    let (mut socket, _) = tokio_tungstenite::connect_async_with_config(
        request,
        Some(crate::server::ws_config()),
        false,
    )
    .await
    .with_context(|| format!("cannot connect to {url}"))?;
    let mut watch = serde_json::json!({"id": 1, "type": "watch", "qid": "w", "topic": t.topic});
    if let Some(tag) = &t.tag {
        watch["tags"] = serde_json::json!([tag]);
    }
    socket.send(Message::text(watch.to_string())).await?;
    while let Some(msg) = socket.next().await {
        let bytes = match msg? {
            Message::Text(t) => t,
            Message::Close(c) => anyhow::bail!("the server closed the connection: {c:?}"),
            _ => continue,
        };
        let b = bytes.as_bytes();
        if b.starts_with(b"{\"type\":\"record\"") || contains(b, b"\"type\":\"record\"") {
            let n = number_after(b, b"\"offset\":").context("a record without an offset")?;
            state.deliver(n, shared);
        } else if contains(b, b"\"type\":\"watching\"") {
            shared.ready.fetch_add(1, Ordering::Relaxed);
        } else if contains(b, b"\"type\":\"error\"") {
            anyhow::bail!("the server sent an error: {}", bytes.as_str());
        }
    }
    anyhow::bail!("the server closed the connection")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn redis_pubsub(t: &Target, state: &WatcherState, shared: &Shared) -> anyhow::Result<()> {
    let mut conn = resp::Conn::connect(t.port).await?;
    let channel = t.tag.as_deref().unwrap_or(&t.topic).as_bytes().to_vec();
    let mut cmd = Vec::new();
    resp::encode(&mut cmd, &[b"SUBSCRIBE", &channel]);
    conn.send(&cmd).await?;
    loop {
        let v = conn.read().await?;
        let items = v.items();
        match items.first().and_then(resp::Value::as_bytes) {
            Some(b"subscribe") => {
                shared.ready.fetch_add(1, Ordering::Relaxed);
            }
            Some(b"message") => {
                let payload = items
                    .get(2)
                    .and_then(resp::Value::as_bytes)
                    .context("a message without a payload")?;
                let n = parse_u64(payload).context("a non-numeric payload")?;
                state.deliver(n, shared);
            }
            _ => anyhow::bail!("unexpected pub/sub reply {v:?}"),
        }
    }
}

async fn redis_streams(t: &Target, state: &WatcherState, shared: &Shared) -> anyhow::Result<()> {
    let mut conn = resp::Conn::connect(t.port).await?;
    let key = t.tag.as_deref().unwrap_or(&t.topic).as_bytes().to_vec();
    // The stream is new for the case: read it from the start, then from the last id.
    let mut last_id = b"0".to_vec();
    let mut announced = false;
    loop {
        let mut cmd = Vec::new();
        resp::encode(
            &mut cmd,
            &[
                b"XREAD", b"COUNT", b"1000", b"BLOCK", b"0", b"STREAMS", &key, &last_id,
            ],
        );
        conn.send(&cmd).await?;
        if !announced {
            // Blocked (or about to be) on the stream: as ready as a Redis reader gets.
            shared.ready.fetch_add(1, Ordering::Relaxed);
            announced = true;
        }
        let v = conn.read().await?;
        if let resp::Value::Error(e) = &v {
            anyhow::bail!("XREAD: {e}");
        }
        for stream in v.items() {
            let Some(entries) = stream.items().get(1) else {
                continue;
            };
            for entry in entries.items() {
                let id = entry.items().first().and_then(resp::Value::as_bytes);
                let fields = entry.items().get(1).map(resp::Value::items).unwrap_or(&[]);
                let n = fields
                    .chunks(2)
                    .find(|kv| kv[0].as_bytes() == Some(b"n"))
                    .and_then(|kv| kv.get(1)?.as_bytes())
                    .and_then(parse_u64)
                    .context("a stream entry without a numeric field n")?;
                state.deliver(n, shared);
                if let Some(id) = id {
                    last_id = id.to_vec();
                }
            }
        }
    }
}

/// Starts `targets.len()` watchers, at most `concurrency` connecting at once, and waits
/// until all are registered (or one failed, or `timeout`). Returns their tasks and states.
pub async fn start_all(
    targets: Vec<Target>,
    shared: &Arc<Shared>,
    concurrency: usize,
    timeout: Duration,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Vec<Arc<WatcherState>>)> {
    let n = targets.len();
    let mut tasks = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    let started = Instant::now();
    for target in targets {
        // One more connecting only when fewer than `concurrency` are still unregistered.
        while tasks.len() as u64 >= shared.ready.load(Ordering::Relaxed) + concurrency as u64 {
            anyhow::ensure!(
                started.elapsed() < timeout,
                "only {} of {n} watchers registered within {timeout:?}",
                shared.ready.load(Ordering::Relaxed)
            );
            if let Some(e) = first_error(&states) {
                anyhow::bail!("a watcher failed while connecting: {e}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let state = Arc::new(WatcherState::new());
        states.push(state.clone());
        tasks.push(tokio::spawn(run(target, state, shared.clone())));
    }
    while shared.ready.load(Ordering::Relaxed) < n as u64 {
        if let Some(e) = first_error(&states) {
            for t in &tasks {
                t.abort();
            }
            anyhow::bail!("a watcher failed while connecting: {e}");
        }
        if started.elapsed() > timeout {
            for t in &tasks {
                t.abort();
            }
            anyhow::bail!(
                "only {} of {n} watchers registered within {timeout:?}",
                shared.ready.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((tasks, states))
}

pub fn first_error(states: &[Arc<WatcherState>]) -> Option<String> {
    states
        .iter()
        .find_map(|s| s.error.lock().expect("watcher error lock").clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_hist_quantiles_are_within_two_percent() {
        let h = AtomicHist::default();
        for v in 1..=10_000u64 {
            h.record(v);
        }
        for (q, want) in [(0.5, 5_000f64), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q {q}: {got} vs {want}");
        }
        assert_eq!(h.count(), 10_000);
        for v in [0u64, 1, 63, 64, 65, 1000, 123_456_789] {
            let i = AtomicHist::index(v);
            assert!(AtomicHist::upper(i) >= v, "{v}");
            assert!(i == 0 || AtomicHist::upper(i - 1) < v, "{v}");
        }
    }

    #[test]
    fn numbers_are_found_in_frames() {
        let f = br#"{"type":"record","topic":"t","offset":1234,"ts":5,"tags":[],"data":{}}"#;
        assert_eq!(number_after(f, b"\"offset\":"), Some(1234));
        assert_eq!(parse_u64(b"17"), Some(17));
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_u64(b""), None);
    }
}
