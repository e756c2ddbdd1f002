//! The console, static files and compression (api.md, "Console, static files and
//! compression").

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::live::live_path;
use super::table;
use crate::{ensure, fail, Ctx, R};

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

fn no_redirects() -> R<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("an HTTP client: {e}").into())
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

pub async fn root_redirects_to_the_console_or_serves_the_public_index(c: Arc<Ctx>) -> R {
    let resp = no_redirects()?
        .get(c.url("/"))
        .send()
        .await
        .map_err(|e| format!("GET /: {e}"))?;
    let status = resp.status().as_u16();
    let location = header(&resp, "location");
    let content_type = header(&resp, "content-type");
    match status {
        302 => ensure!(
            location.ends_with("/console/"),
            "302 to {location:?}, not /console/"
        ),
        // With --public DIR, `/` is DIR/index.html.
        200 => ensure!(
            content_type.starts_with("text/html"),
            "GET / answered 200 with {content_type:?}, not a page"
        ),
        other => fail!("GET / answered {other} (expected 302 to /console/, or the --public index)"),
    }
    Ok(())
}

pub async fn console_page_loads_without_a_token(c: Arc<Ctx>) -> R {
    let resp = no_redirects()?
        .get(c.url("/console/"))
        .send()
        .await
        .map_err(|e| format!("GET /console/: {e}"))?;
    let status = resp.status().as_u16();
    let content_type = header(&resp, "content-type");
    ensure!(
        status == 200 && content_type.starts_with("text/html"),
        "GET /console/ without a token answered {status} {content_type:?}"
    );
    Ok(())
}

/// A query whose JSON reply is well over 1 KiB.
async fn big_query(c: &Ctx) -> R<serde_json::Value> {
    let t = table(c, "web", "id INTEGER PRIMARY KEY, body TEXT").await?;
    let ops: Vec<_> = (0..40)
        .map(|i| json!({"op": "insert", "table": t, "row": {"id": i, "body": "compress me please, ".repeat(4)}}))
        .collect();
    c.mutate(json!(ops)).await?;
    Ok(json!({"sql": format!("SELECT id, body FROM {t}")}))
}

async fn query_with(
    c: &Ctx,
    body: &serde_json::Value,
    accept: Option<&str>,
) -> R<(String, Vec<u8>)> {
    let mut rb = c
        .http
        .post(c.url("/v1/query"))
        .header("Authorization", format!("Bearer {}", c.opts.token))
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(a) = accept {
        rb = rb.header("Accept-Encoding", a);
    }
    let resp = rb
        .send()
        .await
        .map_err(|e| format!("POST /v1/query: {e}"))?;
    ensure!(
        resp.status().as_u16() == 200,
        "POST /v1/query answered {}",
        resp.status()
    );
    let enc = header(&resp, "content-encoding");
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("reading the reply: {e}"))?;
    Ok((enc, bytes.to_vec()))
}

pub async fn json_reply_over_1_kib_is_compressed_when_accepted(c: Arc<Ctx>) -> R {
    let body = big_query(&c).await?;
    let (enc, bytes) = query_with(&c, &body, None).await?;
    ensure!(enc.is_empty(), "compressed ({enc}) without Accept-Encoding");
    ensure!(
        bytes.len() >= 1024,
        "the reply is only {} bytes",
        bytes.len()
    );
    let (enc, bytes) = query_with(&c, &body, Some("gzip")).await?;
    ensure!(
        enc == "gzip",
        "Accept-Encoding: gzip gave Content-Encoding {enc:?}"
    );
    ensure!(
        bytes.starts_with(GZIP_MAGIC),
        "the gzip body does not start with the gzip magic"
    );
    let (enc, bytes) = query_with(&c, &body, Some("gzip, zstd")).await?;
    ensure!(
        enc == "zstd",
        "Accept-Encoding: gzip, zstd gave Content-Encoding {enc:?} (zstd is preferred)"
    );
    ensure!(
        bytes.starts_with(ZSTD_MAGIC),
        "the zstd body does not start with the zstd magic"
    );
    Ok(())
}

pub async fn sse_stream_is_compressed_and_flushed_per_event(c: Arc<Ctx>) -> R {
    let t = table(&c, "websse", "id INTEGER PRIMARY KEY, body TEXT").await?;
    let mut resp = c
        .http
        .get(c.url(&live_path(&format!("SELECT id, body FROM {t}"), "")))
        .header("Authorization", format!("Bearer {}", c.opts.token))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .map_err(|e| format!("GET /v1/live: {e}"))?;
    ensure!(
        resp.status().as_u16() == 200,
        "GET /v1/live answered {}",
        resp.status()
    );
    let enc = header(&resp, "content-encoding");
    ensure!(
        enc == "gzip",
        "an SSE stream with Accept-Encoding: gzip has Content-Encoding {enc:?}"
    );
    let wait = Duration::from_secs(10);
    let first = tokio::time::timeout(wait, resp.chunk())
        .await
        .map_err(|_| "the compressed snapshot was not flushed within 10s")?
        .map_err(|e| format!("the stream broke: {e}"))?
        .ok_or("the stream ended")?;
    ensure!(
        first.starts_with(GZIP_MAGIC),
        "the stream does not start with the gzip magic"
    );
    // A write must reach the client at once: its diff is flushed, not held for more.
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "body": "x"}}]))
        .await?;
    let more = tokio::time::timeout(wait, resp.chunk())
        .await
        .map_err(|_| "the diff was not flushed within 10s")?
        .map_err(|e| format!("the stream broke: {e}"))?;
    ensure!(more.is_some_and(|b| !b.is_empty()), "no bytes for the diff");
    Ok(())
}

pub async fn websocket_offers_no_permessage_deflate(c: Arc<Ctx>) -> R {
    let mut request = c
        .ws_url("")
        .into_client_request()
        .map_err(|e| format!("a WebSocket request: {e}"))?;
    let headers = request.headers_mut();
    headers.insert(
        "Authorization",
        format!("Bearer {}", c.opts.token)
            .parse()
            .map_err(|e| format!("a header: {e}"))?,
    );
    headers.insert(
        "Sec-WebSocket-Extensions",
        "permessage-deflate; client_max_window_bits"
            .parse()
            .map_err(|e| format!("a header: {e}"))?,
    );
    let (_ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| format!("the upgrade: {e}"))?;
    let ext = response
        .headers()
        .get("sec-websocket-extensions")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    ensure!(ext.is_empty(), "the server accepted the extension {ext:?}");
    Ok(())
}
