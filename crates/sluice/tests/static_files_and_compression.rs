//! The console, `--public DIR` and compression against the real binary (docs/api.md,
//! "Console, static files and compression"): static paths need no token while every `/v1/`
//! path and `/metrics` still do; `..`, encoded `..` and symlinks out of the directory are 404;
//! single-page-app fallback; content types; ETag and 304; a missing `--public` directory stops
//! the server with a clear error; gzip and zstd replies decode to the identity reply; an SSE
//! stream compressed with gzip or zstd delivers its snapshot while the stream stays open,
//! then a diff after a write (a topic watch too); the WebSocket upgrade is never compressed;
//! `sluice bench live --families compression` measures every encoding and verifies each
//! snapshot.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Server, TempDir, ADMIN_TOKEN};
use serde_json::{json, Value};

/// How long any one step waits for the server.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// A client that follows no redirect, sends no token, and asks for no compression.
fn plain() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(STEP_TIMEOUT)
        .build()
        .expect("build an HTTP client")
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap_or("<not text>").to_string())
        .unwrap_or_default()
}

/// Sends `GET <target>` as written (no client-side normalisation of `..`), returns the
/// status and the body.
fn raw_get(server: &Server, target: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(server.addr).expect("connect");
    stream.set_read_timeout(Some(STEP_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        server.addr
    )
    .unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).expect("read the reply");
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_without_a_token_and_the_api_still_needs_one() {
    let dir = TempDir::new("web-console");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let base = server.base_url();
    let http = plain();

    let r = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(header(&r, "location"), "/console/");
    let r = http.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(header(&r, "location"), "/console/");

    let r = http.get(format!("{base}/console/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&r, "cache-control"), "no-cache");
    let etag = header(&r, "etag");
    assert!(etag.starts_with('"') && etag.len() > 2, "etag {etag:?}");
    let page = r.text().await.unwrap();
    assert!(page.contains("<html"), "{page}");

    // 304 on a matching If-None-Match (also inside a list, also weak).
    for inm in [etag.clone(), format!("\"x\", W/{etag}")] {
        let r = http
            .get(format!("{base}/console/"))
            .header("If-None-Match", inm)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 304);
        assert_eq!(header(&r, "etag"), etag);
        assert!(r.bytes().await.unwrap().is_empty());
    }
    let r = http
        .get(format!("{base}/console/"))
        .header("If-None-Match", "\"stale\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    for (path, ty) in [
        ("console.js", "text/javascript; charset=utf-8"),
        ("console.css", "text/css; charset=utf-8"),
        ("index.html", "text/html; charset=utf-8"),
        // A client-side route of the console gets its page.
        ("tables/users", "text/html; charset=utf-8"),
    ] {
        let r = http
            .get(format!("{base}/console/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "/console/{path}");
        assert_eq!(header(&r, "content-type"), ty, "/console/{path}");
        assert!(!r.bytes().await.unwrap().is_empty());
    }
    let r = http
        .get(format!("{base}/console/nope.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // The API and /metrics still need a token; other paths too without --public.
    for path in ["/v1/tables", "/v1/nope", "/metrics", "/index.html", "/app"] {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a token");
    }
    let r = http.post(format!("{base}/console/")).send().await.unwrap();
    assert_eq!(r.status(), 401, "only GET and HEAD are public");
    let (status, _) = server.api().get("/v1/tables").await;
    assert_eq!(status, 200);
    let (status, body) = server.api().get("/index.html").await;
    assert_eq!(status, 404, "{body}");
}

/// The public directory of the `--public` test, and a secret next to it.
fn public_fixture(dir: &TempDir) -> std::path::PathBuf {
    let public = dir.join("public");
    let outside = dir.join("outside");
    std::fs::create_dir_all(public.join("sub")).unwrap();
    std::fs::create_dir_all(public.join("assets")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(
        public.join("index.html"),
        "<!doctype html><title>app</title>ROOT-INDEX",
    )
    .unwrap();
    std::fs::write(public.join("sub/index.html"), "SUB-INDEX").unwrap();
    for ext in [
        "html", "js", "mjs", "css", "json", "svg", "png", "jpg", "ico", "wasm", "txt", "map",
        "woff2", "bin",
    ] {
        std::fs::write(
            public.join(format!("assets/f.{ext}")),
            format!("file {ext}"),
        )
        .unwrap();
    }
    std::fs::write(outside.join("secret.txt"), "TOP-SECRET").unwrap();
    std::fs::write(dir.join("secret.txt"), "TOP-SECRET").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), public.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, public.join("leakdir")).unwrap();
    std::os::unix::fs::symlink(public.join("sub/index.html"), public.join("inside.html")).unwrap();
    public
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_files_are_served_and_nothing_outside_the_directory_is() {
    let dir = TempDir::new("web-public");
    let public = public_fixture(&dir);
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &["--public", public.to_str().unwrap()],
    );
    let base = server.base_url();
    let http = plain();
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    let r = get("/").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
    assert!(r.text().await.unwrap().contains("ROOT-INDEX"));

    for (ext, ty) in [
        ("html", "text/html; charset=utf-8"),
        ("js", "text/javascript; charset=utf-8"),
        ("mjs", "text/javascript; charset=utf-8"),
        ("css", "text/css; charset=utf-8"),
        ("json", "application/json"),
        ("svg", "image/svg+xml"),
        ("png", "image/png"),
        ("jpg", "image/jpeg"),
        ("ico", "image/x-icon"),
        ("wasm", "application/wasm"),
        ("txt", "text/plain; charset=utf-8"),
        ("map", "application/json"),
        ("woff2", "font/woff2"),
        ("bin", "application/octet-stream"),
    ] {
        let r = get(&format!("/assets/f.{ext}")).await.unwrap();
        assert_eq!(r.status(), 200, ".{ext}");
        assert_eq!(header(&r, "content-type"), ty, ".{ext}");
        assert_eq!(header(&r, "cache-control"), "no-cache");
        assert_eq!(r.text().await.unwrap(), format!("file {ext}"));
    }

    // Directories serve their index.html (after a redirect that adds the slash).
    let r = get("/sub").await.unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(header(&r, "location"), "/sub/");
    let r = get("/sub/").await.unwrap();
    assert_eq!(r.text().await.unwrap(), "SUB-INDEX");
    // Single-page apps: a path with no extension that names no file gets the index.
    for path in ["/rooms/general", "/login", "/a/b/c"] {
        let r = get(path).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.text().await.unwrap().contains("ROOT-INDEX"), "{path}");
    }
    let r = get("/missing.js").await.unwrap();
    assert_eq!(r.status(), 404, "a missing file with an extension is 404");
    // A symlink that stays inside the directory is followed.
    let r = get("/inside.html").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "SUB-INDEX");

    // Nothing outside the directory, however the path is spelled.
    for target in [
        "/../secret.txt",
        "/../outside/secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/outside/secret.txt",
        "/sub/..%2f..%2fsecret.txt",
        "/sub%2f..%2f..%2fsecret.txt",
        "/..%5csecret.txt",
        "/leak.txt",
        "/leakdir/secret.txt",
        "/leakdir/",
        "/%00.txt",
    ] {
        let (status, body) = raw_get(&server, target);
        assert_eq!(status, 404, "{target}: {body}");
        assert!(!body.contains("TOP-SECRET"), "{target} leaked: {body}");
    }

    // ETag and 304; HEAD has the headers and no body.
    let r = get("/assets/f.js").await.unwrap();
    let etag = header(&r, "etag");
    assert!(!etag.is_empty());
    let r = http
        .get(format!("{base}/assets/f.js"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    std::fs::write(public.join("assets/f.js"), "changed content").unwrap();
    let r = http
        .get(format!("{base}/assets/f.js"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a changed file has a new ETag");
    assert_eq!(r.text().await.unwrap(), "changed content");
    let r = http
        .head(format!("{base}/assets/f.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-length"), "8");
    assert_eq!(header(&r, "content-type"), "text/css; charset=utf-8");
    assert!(r.bytes().await.unwrap().is_empty());

    // Reserved paths keep their meaning: the API and /metrics need a token, the console and
    // /health are the server's own.
    for path in ["/v1/tables", "/v1/nope", "/v1", "/metrics"] {
        let r = get(path).await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a token");
    }
    let r = get("/console/").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.text().await.unwrap().contains("ROOT-INDEX"));
    let r = get("/health").await.unwrap();
    assert_eq!(r.status(), 200);
    let health: Value = r.json().await.unwrap();
    assert_eq!(health["status"], "ok");
    // Only GET and HEAD are files; a POST is the API's (and needs a token).
    let r = http
        .post(format!("{base}/index.html"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[test]
fn a_public_directory_that_is_missing_or_a_file_stops_the_server() {
    let dir = TempDir::new("web-public-missing");
    let missing = dir.join("no-such-dir");
    let (status, stderr) = Server::start_expecting_failure(
        &dir.join("data"),
        dir.path(),
        &["--public", missing.to_str().unwrap()],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--public") && stderr.contains("no such directory"),
        "{stderr}"
    );
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let (status, stderr) = Server::start_expecting_failure(
        &dir.join("data"),
        dir.path(),
        &["--public", file.to_str().unwrap()],
    );
    assert!(!status.success());
    assert!(stderr.contains("not a directory"), "{stderr}");
}

#[test]
fn sluice_public_env_names_the_directory() {
    let dir = TempDir::new("web-public-env");
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/index.html"), "FROM-ENV").unwrap();
    let server = Server::start_with_env(
        &dir.join("data"),
        dir.path(),
        &[],
        &[("SLUICE_PUBLIC", dir.join("site").to_str().unwrap())],
    );
    let (status, body) = raw_get(&server, "/");
    assert_eq!(status, 200);
    assert!(body.contains("FROM-ENV"), "{body}");
}

// ---------------------------------------------------------------------------------------
// Compression

/// Incremental decoding of a compressed body, chunk by chunk as it arrives.
enum Decoder {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl Decoder {
    fn new(coding: &str) -> Decoder {
        match coding {
            "gzip" => Decoder::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            "zstd" => Decoder::Zstd(zstd::stream::write::Decoder::new(Vec::new()).unwrap()),
            other => panic!("unexpected coding {other}"),
        }
    }

    /// Feeds compressed bytes; returns everything decoded so far.
    fn push(&mut self, bytes: &[u8]) -> String {
        match self {
            Decoder::Gzip(d) => {
                d.write_all(bytes).unwrap();
                d.flush().unwrap();
                String::from_utf8_lossy(d.get_ref()).into_owned()
            }
            Decoder::Zstd(d) => {
                d.write_all(bytes).unwrap();
                d.flush().unwrap();
                String::from_utf8_lossy(d.get_ref()).into_owned()
            }
        }
    }
}

fn decode_all(coding: &str, bytes: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(bytes)
                .read_to_end(&mut out)
                .unwrap();
            out
        }
        "zstd" => zstd::stream::decode_all(bytes).unwrap(),
        "" => bytes.to_vec(),
        other => panic!("unexpected coding {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_replies_decode_to_the_same_json_under_gzip_and_zstd() {
    let dir = TempDir::new("web-compress-json");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let api = server.api();
    api.sql("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .await;
    let ops: Vec<Value> = (0..300)
        .map(|i| json!({"op": "insert", "table": "items", "row": {"id": i, "name": format!("item number {i}")}}))
        .collect();
    api.mutate(Value::Array(ops)).await;
    let http = plain();
    let query = json!({"sql": "SELECT * FROM items ORDER BY id"});
    let fetch = |accept: &'static str| {
        let req = http
            .post(format!("{}/v1/query", server.base_url()))
            .bearer_auth(ADMIN_TOKEN)
            .json(&query);
        let req = if accept.is_empty() {
            req
        } else {
            req.header("Accept-Encoding", accept)
        };
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let coding = header(&r, "content-encoding");
            let vary = header(&r, "vary");
            let bytes = r.bytes().await.unwrap();
            let decoded = decode_all(&coding, &bytes);
            (coding, vary, bytes.len(), decoded)
        }
    };
    let (coding, vary, plain_len, plain_body) = fetch("").await;
    assert_eq!(coding, "");
    // A request that accepts no coding passes the compression layer by: nothing varies for it.
    assert_eq!(vary, "", "a reply to a request without Accept-Encoding");
    let expected: Value = serde_json::from_slice(&plain_body).unwrap();
    assert_eq!(expected["rows"].as_array().unwrap().len(), 300);
    for (accept, want) in [
        ("gzip", "gzip"),
        ("zstd", "zstd"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("zstd;q=0.1, gzip", "gzip"),
        ("br", ""),
        ("identity", ""),
    ] {
        let (coding, vary, len, body) = fetch(accept).await;
        assert_eq!(coding, want, "Accept-Encoding: {accept}");
        // Negotiated when a coding the server has is accepted (caches must then key on the
        // header); passed by, like no header, when none is (`br`).
        let negotiated = if want.is_empty() {
            ""
        } else {
            "accept-encoding"
        };
        assert_eq!(
            vary.to_ascii_lowercase(),
            negotiated,
            "Accept-Encoding: {accept}"
        );
        let got: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, expected, "Accept-Encoding: {accept}");
        if !want.is_empty() {
            assert!(len < plain_len, "{want}: {len} bytes vs {plain_len}");
        }
    }
    // Small replies are sent as they are.
    let r = http
        .get(format!("{}/health", server.base_url()))
        .header("Accept-Encoding", "gzip, zstd")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "content-encoding"), "");

    // The WebSocket upgrade is not compressed, and the socket works.
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut request = common::ws_request(&format!("ws://{}/v1/ws", server.addr), None);
    request
        .headers_mut()
        .insert("Accept-Encoding", "gzip, zstd".parse().unwrap());
    let (mut ws, response) =
        tokio::time::timeout(STEP_TIMEOUT, tokio_tungstenite::connect_async(request))
            .await
            .expect("the upgrade in time")
            .expect("the upgrade");
    assert_eq!(response.status(), 101);
    assert!(response.headers().get("content-encoding").is_none());
    ws.send(Message::text(
        json!({"id": 1, "type": "query", "sql": "SELECT COUNT(*) AS n FROM items"}).to_string(),
    ))
    .await
    .unwrap();
    let reply = tokio::time::timeout(STEP_TIMEOUT, ws.next())
        .await
        .expect("a reply in time")
        .expect("a message")
        .unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["id"], 1, "{reply}");
}

/// Reads the compressed stream until the decoded text contains `needle` followed by the
/// blank line that ends an event. Panics if the stream ends first or nothing comes in time.
async fn read_until(r: &mut reqwest::Response, decoder: &mut Decoder, needle: &str) -> String {
    loop {
        let decoded = decoder.push(&[]);
        if let Some(at) = decoded.find(needle) {
            if decoded[at..].contains("\n\n") {
                return decoded;
            }
        }
        let chunk = tokio::time::timeout(STEP_TIMEOUT, r.chunk())
            .await
            .unwrap_or_else(|_| {
                panic!("no {needle:?} within {STEP_TIMEOUT:?}; decoded so far: {decoded:?}")
            })
            .expect("read the stream");
        match chunk {
            Some(bytes) => {
                decoder.push(&bytes);
            }
            None => panic!("the stream ended before {needle:?}; decoded: {decoded:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_compressed_with_gzip_or_zstd_deliver_each_event_while_open() {
    let dir = TempDir::new("web-compress-sse");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let api = server.api();
    api.sql("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .await;
    api.mutate(json!([{"op": "insert", "table": "items", "row": {"id": 1, "name": "one"}}]))
        .await;
    // No overall timeout: the stream stays open; every read is bounded instead.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (next_id, coding) in [(100, "gzip"), (101, "zstd")] {
        let mut r = http
            .get(format!(
                "{}/v1/live?sql=SELECT%20*%20FROM%20items",
                server.base_url()
            ))
            .bearer_auth(ADMIN_TOKEN)
            .header("Accept-Encoding", coding)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "content-encoding"), coding);
        assert!(header(&r, "content-type").starts_with("text/event-stream"));
        let mut decoder = Decoder::new(coding);
        // The snapshot arrives, decodable, while the stream is still open.
        let text = read_until(&mut r, &mut decoder, "event: snapshot").await;
        assert!(text.contains("\"one\""), "{text}");
        // Then a write's diff.
        api.mutate(json!([{"op": "insert", "table": "items", "row": {"id": next_id, "name": format!("new {coding}")}}]))
            .await;
        let text = read_until(&mut r, &mut decoder, "event: diff").await;
        assert!(text.contains(&format!("new {coding}")), "{text}");
    }

    // A topic watch is an event stream too: `event: watching` first, then each record.
    let r = api
        .client
        .put(api.url("/v1/topics/chat"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "create a topic: {}", r.status());
    let mut r = http
        .get(format!("{}/v1/topics/chat/watch", server.base_url()))
        .bearer_auth(ADMIN_TOKEN)
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-encoding"), "gzip");
    let mut decoder = Decoder::new("gzip");
    read_until(&mut r, &mut decoder, "event: watching").await;
    let (status, body) = api
        .post(
            "/v1/topics/chat/records",
            &json!({"records": [{"data": {"text": "hello compressed"}}]}),
        )
        .await;
    assert!(status < 300, "{status} {body}");
    let text = read_until(&mut r, &mut decoder, "event: record").await;
    assert!(text.contains("hello compressed"), "{text}");
}

#[test]
fn the_compression_bench_measures_and_verifies_every_encoding() {
    let out = TempDir::new("web-bench-compression");
    let status = std::process::Command::new(common::BIN)
        .args([
            "bench",
            "live",
            "--families",
            "compression",
            "--quick",
            "--compression-rows",
            "2000",
            "--out",
        ])
        .arg(out.path())
        .env("SLUICE_BIN", common::BIN)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run sluice bench live");
    assert!(
        status.success(),
        "sluice bench live --families compression: {status}"
    );
    let samples: Value = serde_json::from_slice(
        &std::fs::read(out.path().join("live-compression/samples.json")).expect("samples.json"),
    )
    .expect("samples.json is JSON");
    let cases = samples["cases"].as_array().expect("cases");
    let bytes = |transport: &str, encoding: &str| {
        let case = cases
            .iter()
            .find(|c| c["transport"] == transport && c["encoding"] == encoding)
            .unwrap_or_else(|| panic!("no {transport} {encoding} case: {samples}"));
        assert!(case["error"].is_null(), "{case}");
        assert_eq!(case["verified"], true, "{case}");
        assert_eq!(case["rows"], 2000, "{case}");
        case["bytes_p50"].as_u64().expect("bytes")
    };
    let identity = bytes("sse", "identity");
    assert!(bytes("sse", "gzip") < identity);
    assert!(bytes("sse", "zstd") < identity);
    assert!(bytes("ws", "json") > 0);
    assert!(bytes("ws", "msgpack") < bytes("ws", "json"));
    assert!(out.path().join("live-compression/summary.md").is_file());
}
