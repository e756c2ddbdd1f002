//! The compression family (`sluice bench live --families compression`): what the encodings
//! cost and save on one big snapshot — a live query over a table of `--compression-rows`
//! (10 000) rows, subscribed over SSE with `Accept-Encoding` identity, gzip and zstd, and over
//! the WebSocket in JSON and MessagePack (which has no compression: tungstenite offers no
//! `permessage-deflate`).
//!
//! Each run opens a fresh stream on an already-open connection (the SSE client's connection is
//! warmed by a `/health` request; the WebSocket is connected before the clock starts) and
//! measures, from the request sent to the moment the whole snapshot can be decoded:
//! - **bytes**: the response body as received (compressed; without HTTP headers and chunk
//!   framing) for SSE, the message payloads for the WebSocket;
//! - **time to the last snapshot byte**.
//!
//! The view is kept warm by a subscriber held open for the whole family, so every run
//! measures the snapshot's encoding and transfer, not the view's build. Each decoded
//! snapshot is checked against a one-shot `POST /v1/query` (row count and checksum).
//! Results go to `bench-results/live-compression/`.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::client::{http_client, result_checksum, Api};
use super::{Dist, Params};
use crate::progress::Progress;
use crate::report::{Report, Table, Target};
use crate::server::SluiceServer;
use crate::sys::TempDir;

/// How long one snapshot may take to arrive.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// Rows per preload mutate.
const PRELOAD_BATCH: usize = 5_000;
/// The measured query.
const SQL: &str = "SELECT * FROM items";

/// One transport × encoding, over every run.
#[derive(Clone, Debug, Serialize)]
pub struct CompressionCase {
    /// `sse` or `ws`.
    pub transport: &'static str,
    /// SSE: the `Content-Encoding` (`identity`, `gzip`, `zstd`); WebSocket: the subprotocol's
    /// encoding (`json`, `msgpack`).
    pub encoding: &'static str,
    pub rows: usize,
    /// Bytes of each run (body or message payloads up to the end of the snapshot).
    pub bytes: Vec<usize>,
    /// Median of `bytes`.
    pub bytes_p50: usize,
    /// Uncompressed SSE JSON bytes / these bytes.
    pub ratio: f64,
    /// Request sent → whole snapshot decodable, per run, in µs.
    pub time_us: Vec<f64>,
    pub time: Dist,
    /// Every decoded snapshot held the one-shot query's rows (count and checksum).
    pub verified: bool,
    pub error: Option<String>,
}

/// One measured snapshot.
struct Got {
    bytes: usize,
    elapsed: Duration,
    /// The snapshot's `columns` and `rows`, as decoded.
    snapshot: Value,
}

/// The incremental decoder of an SSE body.
enum BodyDecoder {
    Identity(Vec<u8>),
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl BodyDecoder {
    fn new(encoding: &str) -> anyhow::Result<BodyDecoder> {
        Ok(match encoding {
            "identity" => BodyDecoder::Identity(Vec::new()),
            "gzip" => BodyDecoder::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            "zstd" => BodyDecoder::Zstd(zstd::stream::write::Decoder::new(Vec::new())?),
            other => anyhow::bail!("unknown encoding {other}"),
        })
    }

    /// Feeds received bytes; returns everything decoded so far.
    fn push(&mut self, bytes: &[u8]) -> anyhow::Result<&[u8]> {
        Ok(match self {
            BodyDecoder::Identity(v) => {
                v.extend_from_slice(bytes);
                v
            }
            BodyDecoder::Gzip(d) => {
                d.write_all(bytes)?;
                d.flush()?;
                d.get_ref()
            }
            BodyDecoder::Zstd(d) => {
                d.write_all(bytes)?;
                d.flush()?;
                d.get_ref()
            }
        })
    }
}

/// The JSON of the first complete `snapshot` event in `text`, if one is complete.
fn complete_snapshot(text: &[u8]) -> Option<&[u8]> {
    let start = find(text, b"event: snapshot\n")?;
    let rest = &text[start..];
    let end = find(rest, b"\n\n")?;
    let event = &rest[..end];
    let data = find(event, b"data: ")?;
    let line = &event[data + 6..];
    let line_end = find(line, b"\n").unwrap_or(line.len());
    Some(&line[..line_end])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn sse_snapshot(http: &reqwest::Client, base: &str, encoding: &str) -> anyhow::Result<Got> {
    // Warm the pooled connection, so the run measures the stream, not the TCP handshake.
    http.get(format!("{base}/health"))
        .send()
        .await?
        .bytes()
        .await?;
    let mut url = reqwest::Url::parse(&format!("{base}/v1/live"))?;
    url.query_pairs_mut().append_pair("sql", SQL);
    let started = Instant::now();
    let mut resp = http
        .get(url)
        .header("accept", "text/event-stream")
        .header("accept-encoding", encoding)
        .send()
        .await
        .context("GET /v1/live")?;
    anyhow::ensure!(
        resp.status().is_success(),
        "GET /v1/live: {}",
        resp.status()
    );
    let got = resp
        .headers()
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_string();
    anyhow::ensure!(
        got == encoding,
        "asked for {encoding}, the stream came as {got}"
    );
    let mut decoder = BodyDecoder::new(encoding)?;
    let mut bytes = 0;
    loop {
        let chunk = tokio::time::timeout(SNAPSHOT_TIMEOUT, resp.chunk())
            .await
            .context("no snapshot in time")??
            .context("the stream ended before its snapshot")?;
        bytes += chunk.len();
        let decoded = decoder.push(&chunk)?;
        if let Some(json) = complete_snapshot(decoded) {
            let elapsed = started.elapsed();
            let snapshot: Value = serde_json::from_slice(json).context("the snapshot's data")?;
            return Ok(Got {
                bytes,
                elapsed,
                snapshot,
            });
        }
    }
}

async fn ws_snapshot(base: &str, encoding: &str) -> anyhow::Result<Got> {
    let protocol = match encoding {
        "json" => "sluice.json.v1",
        _ => "sluice.msgpack.v1",
    };
    let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
    let mut ws =
        crate::transfer::clients::connect_ws_as(&url, protocol, crate::server::admin_token())
            .await?;
    let subscribe = json!({"type": "subscribe", "qid": 1, "sql": SQL});
    let frame = match encoding {
        "json" => Message::Text(subscribe.to_string().into()),
        _ => Message::Binary(rmp_serde::to_vec_named(&subscribe)?.into()),
    };
    let started = Instant::now();
    ws.send(frame).await?;
    let mut bytes = 0;
    loop {
        let message = tokio::time::timeout(SNAPSHOT_TIMEOUT, ws.next())
            .await
            .context("no snapshot in time")?
            .context("the WebSocket closed before the snapshot")??;
        let value: Value = match message {
            Message::Text(t) => {
                bytes += t.len();
                serde_json::from_str(t.as_str())?
            }
            Message::Binary(b) => {
                bytes += b.len();
                rmp_serde::from_slice(&b)?
            }
            _ => continue,
        };
        match value["type"].as_str() {
            Some("snapshot") => {
                let elapsed = started.elapsed();
                let _ = ws.close(None).await;
                return Ok(Got {
                    bytes,
                    elapsed,
                    snapshot: value,
                });
            }
            Some("error") => anyhow::bail!("the subscription failed: {}", value["error"]),
            _ => {}
        }
    }
}

/// The measured variants, in run order.
const VARIANTS: [(&str, &str); 5] = [
    ("sse", "identity"),
    ("sse", "gzip"),
    ("sse", "zstd"),
    ("ws", "json"),
    ("ws", "msgpack"),
];

/// Runs the family and writes its report under `<out>/live-compression/`. Returns whether
/// every variant ran and verified.
pub fn run(params: &Params, bin: &Path, out: &Path) -> anyhow::Result<bool> {
    let runtime = crate::harness::runtime()?;
    let mut report = Report::new("live-compression", serde_json::to_value(params)?);
    let cases = runtime.block_on(measure(params, bin))?;
    write_report(&mut report, params, &cases);
    let dir = report.write(out)?;
    report.print();
    eprintln!("results in {}", dir.display());
    drop(runtime);
    Ok(cases.iter().all(|c| c.error.is_none() && c.verified))
}

async fn measure(params: &Params, bin: &Path) -> anyhow::Result<Vec<CompressionCase>> {
    let progress = Progress::new("live-compression");
    let rows = params.compression_rows;
    let runs = params.compression_runs;
    let dir = TempDir::new("live-compression")?;
    let flags: Vec<String> = ["--durability", "memory", "--max-ops", "100000"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (server, _) = SluiceServer::start(bin, &dir.path().join("data"), &flags).await?;
    let api = Api::new(&server.base_url)?;
    progress.say(format!(
        "sluice serve on {} (pid {}); loading {rows} rows",
        server.base_url,
        server.pid()
    ));
    api.sql("CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL, grp integer NOT NULL, score real NOT NULL, note text)")
        .await?;
    // Rows like an app's: names, small integers, a float, a sentence that varies.
    api.preload(
        "items",
        (0..rows).map(|id| {
            json!({
                "id": id,
                "name": format!("user-{id:05}"),
                "grp": id % 17,
                "score": (id as f64 * 0.37).sin() * 100.0,
                "note": format!("order {} shipped to warehouse {} on day {}", id * 7919 % 100_003, id % 23, id % 365),
            })
            .to_string()
        }),
        PRELOAD_BATCH,
    )
    .await?;
    let expected = result_checksum(&api.query(SQL, &Value::Null).await?)?;
    anyhow::ensure!(
        expected.0 == rows,
        "the one-shot query returned {} rows, not {rows}",
        expected.0
    );
    // Keeps the view built while the runs come and go (the stream's headers come once the
    // view is built; it is never read, and no write happens to fill its queue).
    let http = http_client(None)?;
    let mut keep_url = reqwest::Url::parse(&server.url("/v1/live"))?;
    keep_url.query_pairs_mut().append_pair("sql", SQL);
    let keeper = http.get(keep_url).send().await?;
    anyhow::ensure!(
        keeper.status().is_success(),
        "GET /v1/live: {}",
        keeper.status()
    );

    let mut cases: Vec<CompressionCase> = VARIANTS
        .iter()
        .map(|&(transport, encoding)| CompressionCase {
            transport,
            encoding,
            rows,
            bytes: Vec::new(),
            bytes_p50: 0,
            ratio: 0.0,
            time_us: Vec::new(),
            time: Dist::default(),
            verified: true,
            error: None,
        })
        .collect();
    for run in 0..runs {
        for case in cases.iter_mut().filter(|c| c.error.is_none()) {
            let got = match case.transport {
                "sse" => sse_snapshot(&http, &server.base_url, case.encoding).await,
                _ => ws_snapshot(&server.base_url, case.encoding).await,
            };
            match got {
                Ok(got) => {
                    let seen = result_checksum(&got.snapshot)?;
                    if seen != expected {
                        case.verified = false;
                    }
                    case.bytes.push(got.bytes);
                    case.time_us.push(got.elapsed.as_secs_f64() * 1e6);
                }
                Err(e) => case.error = Some(format!("{e:#}")),
            }
        }
        progress.say(format!("run {}/{runs} done", run + 1));
    }
    let median = |v: &[usize]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    };
    for c in &mut cases {
        c.bytes_p50 = median(&c.bytes);
        c.time = Dist::of(&c.time_us);
    }
    let identity = cases[0].bytes_p50.max(1) as f64;
    for c in &mut cases {
        c.ratio = if c.bytes_p50 == 0 {
            0.0
        } else {
            identity / c.bytes_p50 as f64
        };
        progress.say(format!(
            "  {} {}: {} bytes ({:.1}×), snapshot in {:.1} ms p50{}",
            c.transport,
            c.encoding,
            c.bytes_p50,
            c.ratio,
            c.time.p50_us / 1e3,
            match (&c.error, c.verified) {
                (Some(e), _) => format!(", FAILED: {e}"),
                (None, false) => ", VERIFICATION FAILED".to_string(),
                (None, true) => ", verified".to_string(),
            }
        ));
    }
    drop(keeper);
    drop(server);
    Ok(cases)
}

fn write_report(report: &mut Report, params: &Params, cases: &[CompressionCase]) {
    report.intro.push(format!(
        "One live query (`{SQL}`) over {} rows, subscribed {} times per variant on a warm \
         view: over SSE with each `Accept-Encoding`, and over the WebSocket in JSON and \
         MessagePack. Bytes are the response body as received (compressed, without HTTP \
         headers and chunk framing) or the WebSocket message payloads, up to the end of the \
         snapshot; time runs from the request sent to the whole snapshot decodable. Every \
         decoded snapshot is checked against a one-shot query (row count and checksum).",
        params.compression_rows, params.compression_runs
    ));
    let mut t = Table::new(
        format!("{}-row snapshot", params.compression_rows),
        &[
            "transport",
            "encoding",
            "bytes",
            "vs SSE identity",
            "time p50",
            "time min",
            "time max",
            "verified",
        ],
    );
    for c in cases {
        if let Some(e) = &c.error {
            t.failed_row(vec![c.transport.into(), c.encoding.into(), e.clone()]);
            continue;
        }
        t.row(vec![
            c.transport.to_string(),
            c.encoding.to_string(),
            c.bytes_p50.to_string(),
            format!("{:.2}×", c.ratio),
            format!("{:.1} ms", c.time.p50_us / 1e3),
            format!("{:.1} ms", c.time.min_us / 1e3),
            format!("{:.1} ms", c.time.max_us / 1e3),
            if c.verified { "yes" } else { "**no**" }.to_string(),
        ]);
    }
    t.note = Some(
        "Loopback: time is mostly encoding and decoding, not transfer; on a real network the \
         smaller bodies arrive sooner by bytes ÷ bandwidth."
            .into(),
    );
    report.tables.push(t);
    let by = |e: &str| cases.iter().find(|c| c.encoding == e);
    if let (Some(id), Some(z)) = (by("identity"), by("zstd")) {
        report.targets.push(Target {
            what: "SSE snapshot bytes, zstd vs identity".into(),
            goal: "smaller".into(),
            measured: format!("{} vs {} bytes", z.bytes_p50, id.bytes_p50),
            met: Some(z.error.is_none() && z.bytes_p50 > 0 && z.bytes_p50 < id.bytes_p50),
        });
    }
    report.samples = json!({ "cases": cases });
}
