//! Fuzz targets for everything a client sends: the JSON body of every HTTP endpoint, the
//! path and query string of the GET endpoints, function module source over `PUT
//! /v1/functions`, and WebSocket frames in JSON and MessagePack — through the real router
//! (in process) and a real WebSocket on a loopback port.
//!
//! Oracle, per reply: no panic (in the handler or any other thread), no 5xx but `503 busy`,
//! a JSON body that is an object, and every error `{"error": {"code", "message"}}` with a
//! documented code. After the whole run the server still takes a known-good write and
//! answers a read of it (the writer did not stop). `SLUICE_FUZZ_EXECS` / `SLUICE_FUZZ_SEED`
//! run a long mode; `--nocapture` shows executions and panics per target.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_fuzzkit::{corpus, mutate, Fuzzer, Kind};
use sluice_server::Core;
use tokio_tungstenite::tungstenite::Message;
use tower::ServiceExt;

/// Error codes `docs/api.md` documents.
const CODES: &[&str] = &[
    "bad_request",
    "schema",
    "unsupported",
    "not_found",
    "method_not_allowed",
    "already_exists",
    "conflict",
    "limit",
    "horizon",
    "function_error",
    "compile_error",
    "busy",
];

/// How long one request may take before the target calls it a hang.
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// Checks one error object; returns its code.
fn check_error(error: &Value, context: &str) -> String {
    let code = error["code"]
        .as_str()
        .unwrap_or_else(|| panic!("an error without a code: {context}"));
    assert!(
        error["message"].is_string(),
        "an error without a message: {context}"
    );
    assert!(
        CODES.contains(&code),
        "undocumented error code {code:?}: {context}"
    );
    code.to_string()
}

/// The first words of an error message: they name what was wrong, which tells the fuzzer
/// an input reached a different check.
fn first_words(message: &Value) -> String {
    let words: Vec<&str> = message
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .take(3)
        .collect();
    words.join(" ")
}

/// Checks an HTTP reply against the oracle; returns its outcome.
fn check_reply(status: u16, body: &[u8], context: &str) -> String {
    let text = String::from_utf8_lossy(body);
    let context = format!(
        "{context} -> {status} {}",
        text.chars().take(500).collect::<String>()
    );
    let json: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("a reply that is not JSON ({e}): {context}"));
    assert!(json.is_object(), "a reply that is not an object: {context}");
    if status >= 400 {
        let code = check_error(&json["error"], &context);
        assert!(
            status < 500 || code == "busy",
            "server error {status}: {context}"
        );
        format!("{status} {code} {}", first_words(&json["error"]["message"]))
    } else {
        assert_eq!(status, 200, "{context}");
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        format!("200 {}", keys.join(","))
    }
}

struct Server {
    core: Core,
    router: Router,
    ws_url: String,
    _dir: Scratch,
}

/// A data directory on a memory file system where there is one (the targets sync often).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let shm = std::path::Path::new("/dev/shm");
        let base = match shm.is_dir() {
            true => shm.to_path_buf(),
            false => std::env::temp_dir(),
        };
        let dir = base.join(format!("sluice-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start(name: &str) -> Server {
    let dir = Scratch::new(name);
    let module = [corpus::MODULES[0], corpus::MODULES[1], corpus::MODULES[2]].concat();
    let (core, addr) = common::serve(
        &dir.0,
        |config| {
            config.body_bytes_max = 1 << 20;
            config.functions_source = Some(module);
            config.function_limits.time_max = Duration::from_millis(50);
            config.function_limits.memory_bytes_max = 16 << 20;
            config.live_subscriptions_per_connection_max = 16;
        },
        corpus::SCHEMA,
    )
    .await;
    let router = sluice_server::api::router(core.clone());
    Server {
        core,
        router,
        ws_url: format!("ws://{addr}/v1/ws"),
        _dir: dir,
    }
}

/// Sends one request through the router; returns the status and body. A `text/event-stream`
/// reply (a live query) is read up to its first event, whose data stands for the body.
async fn send(router: &Router, method: Method, uri: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .header("authorization", common::bearer())
        .body(Body::from(body))
        .expect("a valid request");
    let reply = tokio::time::timeout(REPLY_WAIT, router.clone().oneshot(request))
        .await
        .unwrap_or_else(|_| panic!("{uri}: no reply within {REPLY_WAIT:?}"))
        .expect("the router is infallible");
    let status = reply.status().as_u16();
    let is_stream = reply
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = reply.into_body().into_data_stream();
    let mut bytes = Vec::new();
    loop {
        let next = tokio::time::timeout(REPLY_WAIT, body.next())
            .await
            .unwrap_or_else(|_| panic!("{uri}: body not finished within {REPLY_WAIT:?}"));
        let Some(chunk) = next else { break };
        bytes.extend_from_slice(&chunk.expect("a body chunk"));
        if is_stream {
            return (status, sse_data(&bytes));
        }
    }
    (status, bytes)
}

/// The `data:` of the first SSE event (`{}` for a heartbeat).
fn sse_data(chunk: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(chunk);
    text.lines()
        .find_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().as_bytes().to_vec())
        .unwrap_or_else(|| b"{}".to_vec())
}

/// One route's target: inputs are request bodies (or, with `uri_from_input`, whole
/// `path?query` strings for a GET).
struct Route<'a> {
    name: &'a str,
    method: Method,
    uri: &'a str,
    execs: u64,
    kind: Kind,
    seeds: Vec<String>,
    words: &'a [&'a str],
}

async fn fuzz_route(server: &Server, route: Route<'_>) {
    let mut fuzzer = Fuzzer::new(route.name, route.execs, route.kind)
        .panics_elsewhere_count()
        .seeds(route.seeds)
        .dictionary(route.words)
        .len_max(1 << 15);
    while let Some(input) = fuzzer.next_input() {
        let (uri, body) = match route.method {
            Method::GET => {
                let Ok(uri) = std::str::from_utf8(&input) else {
                    continue;
                };
                if uri.parse::<axum::http::Uri>().is_err() || !uri.starts_with('/') {
                    continue; // not a request a client could send
                }
                (uri.to_string(), Vec::new())
            }
            _ => (route.uri.to_string(), input.clone()),
        };
        let router = &server.router;
        let method = route.method.clone();
        let fut = async {
            let (status, reply) = send(router, method, &uri, body).await;
            let context = format!("{uri} {}", String::from_utf8_lossy(&input));
            // `/` and the console are not the JSON API (docs/api.md, "Console, static files
            // and compression"): a redirect or a page; a missing console asset is a JSON 404.
            // The path as the router sees it (`?query` and `#fragment` cut off).
            let parsed = uri.parse::<axum::http::Uri>().ok();
            let path = parsed.as_ref().map_or("", |u| u.path());
            let is_static = path == "/" || path == "/console" || path.starts_with("/console/");
            if is_static && status != 404 {
                assert!(
                    status == 302 || (status == 200 && !reply.is_empty()),
                    "a static path answered {status}: {context}"
                );
                return format!("static {status}");
            }
            check_reply(status, &reply, &context)
        };
        if let Some(outcome) = fuzzer.exec_async(&input, fut).await {
            fuzzer.outcome(&input, &outcome);
        }
    }
    fuzzer.finish();
}

fn strings(items: &[Value]) -> Vec<String> {
    items.iter().map(Value::to_string).collect()
}

// ---------------------------------------------------------------------------------------
// WebSocket

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, protocol: &str) -> Ws {
    let request = common::ws_request(url, Some(protocol));
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

/// Checks one server message; returns its type (`None` once the connection is closed).
fn check_ws_message(msg: Message, msgpack: bool, context: &str) -> Option<String> {
    let value: Value = match msg {
        Message::Text(t) => {
            assert!(
                !msgpack,
                "a text frame on a MessagePack connection: {context}"
            );
            serde_json::from_str(t.as_str())
                .unwrap_or_else(|e| panic!("a text frame that is not JSON ({e}): {context}"))
        }
        Message::Binary(b) => {
            assert!(msgpack, "a binary frame on a JSON connection: {context}");
            rmp_serde::from_slice(&b).unwrap_or_else(|e| {
                panic!("a binary frame that is not MessagePack ({e}): {context}")
            })
        }
        Message::Close(_) => return None,
        _ => return Some("control".into()),
    };
    let context = format!("{context} -> {value}");
    let kind = value["type"]
        .as_str()
        .unwrap_or_else(|| panic!("a message without a type: {context}"))
        .to_string();
    if kind == "error" {
        let code = check_error(&value["error"], &context);
        return Some(format!(
            "error {code} {}",
            first_words(&value["error"]["message"])
        ));
    }
    Some(kind)
}

/// Sends each input as one frame on one connection, then a ping, and reads (and checks)
/// every message up to that ping's pong. A closed connection is reopened.
async fn fuzz_ws(server: &Server, msgpack: bool, execs: u64) {
    let (name, protocol) = match msgpack {
        true => ("ws_msgpack", "sluice.msgpack.v1"),
        false => ("ws_json", "sluice.json.v1"),
    };
    let seeds = strings(&ws_seeds());
    let words = [
        "id",
        "type",
        "call",
        "mutate",
        "ping",
        "query",
        "subscribe",
        "unsubscribe",
        "qid",
        "sql",
        "params",
        "since",
        "ops",
        "durability",
        "args",
        "name",
    ];
    let mut fuzzer = Fuzzer::new(name, execs, Kind::Json)
        .panics_elsewhere_count()
        .seeds(seeds)
        .dictionary(&words)
        .len_max(1 << 15);
    let mut ws = connect(&server.ws_url, protocol).await;
    let mut probe = 0u64;
    while let Some(input) = fuzzer.next_input() {
        let frame = match msgpack {
            false => Message::Text(String::from_utf8_lossy(&input).into_owned().into()),
            true => {
                // Well-formed MessagePack of the JSON input, or raw bytes when it is not
                // JSON; sometimes with a byte mutation on top.
                let mut bytes = match serde_json::from_slice::<Value>(&input) {
                    Ok(v) => rmp_serde::to_vec_named(&v).expect("a Value encodes"),
                    Err(_) => input.clone(),
                };
                if fuzzer.rng().one_in(3) {
                    let other = bytes.clone();
                    mutate::bytes(fuzzer.rng(), &mut bytes, &other, &[], 1 << 15);
                }
                Message::Binary(bytes.into())
            }
        };
        probe += 1;
        let ping = json!({"id": format!("probe-{probe}"), "type": "ping"});
        let ping = match msgpack {
            true => Message::Binary(rmp_serde::to_vec_named(&ping).unwrap().into()),
            false => Message::Text(ping.to_string().into()),
        };
        let context = String::from_utf8_lossy(&input).into_owned();
        let fut = async {
            let mut outcome = String::new();
            if ws.send(frame).await.is_err() || ws.send(ping).await.is_err() {
                return (true, "closed on send".to_string());
            }
            loop {
                let next = tokio::time::timeout(REPLY_WAIT, ws.next())
                    .await
                    .unwrap_or_else(|_| panic!("no pong within {REPLY_WAIT:?}: {context}"));
                let Some(Ok(msg)) = next else {
                    return (true, format!("{outcome} closed"));
                };
                let pong = match &msg {
                    Message::Text(t) => t.as_str().contains(&format!("\"probe-{probe}\"")),
                    Message::Binary(b) => rmp_serde::from_slice::<Value>(b)
                        .is_ok_and(|v| v["id"] == format!("probe-{probe}")),
                    _ => false,
                };
                match check_ws_message(msg, msgpack, &context) {
                    None => return (true, format!("{outcome} closed")),
                    Some(_) if pong => return (false, outcome),
                    Some(kind) => {
                        if outcome.len() < 64 {
                            outcome.push_str(&kind);
                            outcome.push(' ');
                        }
                    }
                }
            }
        };
        match fuzzer.exec_async(&input, fut).await {
            Some((closed, outcome)) => {
                fuzzer.outcome(&input, &outcome);
                if closed {
                    ws = connect(&server.ws_url, protocol).await;
                }
            }
            None => ws = connect(&server.ws_url, protocol).await,
        }
    }
    fuzzer.finish();
}

/// Nesting far deeper than any decoder's recursion limit, over HTTP and both WebSocket
/// encodings, is an error reply — not a stack overflow that would take the process down.
/// Regression: a MessagePack frame of 100 000 nested one-element arrays (`0x91` × 100 000)
/// overflowed a runtime worker's stack (rmp_serde's depth limit of 1024 is too deep for a
/// 2 MiB stack in a debug build) and aborted the whole server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_requests_are_refused_not_a_stack_overflow() {
    let server = start("nesting").await;
    let depth = 100_000;
    let json_body = format!("{{\"sql\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
    for uri in ["/v1/sql", "/v1/query", "/v1/mutate", "/v1/call/transfer"] {
        let (status, reply) = send(
            &server.router,
            Method::POST,
            uri,
            json_body.clone().into_bytes(),
        )
        .await;
        assert_eq!(
            check_reply(status, &reply, uri).split(' ').nth(1),
            Some("bad_request")
        );
    }
    let sql = format!("SELECT {}1{} FROM t", "(".repeat(depth), ")".repeat(depth));
    let body = json!({"sql": sql}).to_string().into_bytes();
    let (status, reply) = send(&server.router, Method::POST, "/v1/query", body).await;
    check_reply(status, &reply, "deeply nested SQL");
    for (protocol, frame) in [
        ("sluice.json.v1", Message::Text(json_body.clone().into())),
        (
            "sluice.msgpack.v1",
            Message::Binary(vec![0x91; depth].into()),
        ),
    ] {
        let mut ws = connect(&server.ws_url, protocol).await;
        ws.send(frame).await.unwrap();
        let reply = tokio::time::timeout(REPLY_WAIT, ws.next())
            .await
            .expect("a reply to a deeply nested frame")
            .expect("the connection stays open")
            .unwrap();
        let kind = check_ws_message(reply, protocol.contains("msgpack"), protocol);
        assert_eq!(
            kind.as_deref().map(|k| k.starts_with("error bad_request")),
            Some(true)
        );
    }
    let (status, _) = send(&server.router, Method::GET, "/health", Vec::new()).await;
    assert_eq!(status, 200);
    server.core.shutdown().await.expect("a clean shutdown");
}

fn ws_seeds() -> Vec<Value> {
    vec![
        json!({"id": 1, "type": "call", "name": "transfer", "args": {"from": 1, "to": 2, "amount": 1}, "durability": "fsync"}),
        json!({"id": 2, "type": "mutate", "ops": [{"op": "insert", "table": "msgs", "row": {"id": 1, "room": "a"}}], "durability": "disk"}),
        json!({"id": 3, "type": "ping"}),
        json!({"id": 4, "type": "query", "sql": "SELECT id, room FROM msgs WHERE room = $1", "params": ["a"]}),
        json!({"id": 5, "type": "subscribe", "qid": "inbox", "sql": "SELECT id, n FROM msgs WHERE room = :r ORDER BY id LIMIT 5", "params": {"r": "a"}, "since": 0}),
        json!({"id": 6, "type": "unsubscribe", "qid": "inbox"}),
        json!({"id": "x", "type": "mutate", "ops": [{"op": "upsert", "table": "accounts", "row": {"id": 7, "balance": 1}, "if_version": 0}, {"op": "patch", "table": "accounts", "id": 7, "set": {"balance": 2}}, {"op": "delete", "table": "accounts", "id": 7}]}),
        json!([1, 2, 3]),
    ]
}

// ---------------------------------------------------------------------------------------
// The run

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_every_request_a_client_can_send() {
    let server = start("server").await;
    let panics_before = sluice_fuzzkit::panics_elsewhere();
    let selects: Vec<Value> = corpus::SELECTS
        .iter()
        .map(|s| json!({"sql": s, "params": [1, "a"]}))
        .collect();
    let ddl: Vec<Value> = corpus::DDL.iter().map(|s| json!({"sql": s})).collect();
    let mutate = vec![
        json!({"ops": [
            {"op": "insert", "table": "msgs", "row": {"id": 1, "room": "a", "n": 2}},
            {"op": "upsert", "table": "msgs", "row": {"id": 2, "room": "b"}, "if_version": 0},
            {"op": "patch", "table": "msgs", "id": 1, "set": {"n": 3}, "if_version": 1},
            {"op": "delete", "table": "msgs", "id": 2}], "durability": "memory"}),
        json!({"ops": [{"op": "upsert", "table": "kv", "row": {"id": "k", "body": {"a": [1, null]}, "data": "AAEC", "at": -1}}]}),
        json!({"ops": [{"op": "upsert", "table": "t", "row": {"id": 1, "a": 9223372036854775807i64, "b": 1e308, "c": "x", "d": true, "r": -1}}], "durability": "disk"}),
        json!({"ops": []}),
    ];
    let call = vec![
        json!({"args": {"from": 1, "to": 2, "amount": 1}}),
        json!({"args": {"id": 5, "balance": 10}, "durability": "fsync"}),
        json!({"args": null}),
        json!({"args": {"n": 3, "rows": 2}}),
    ];
    let sql_words = corpus::SQL_WORDS;
    let body_words = [
        "ops",
        "op",
        "insert",
        "upsert",
        "patch",
        "delete",
        "table",
        "row",
        "id",
        "set",
        "if_version",
        "durability",
        "memory",
        "disk",
        "fsync",
        "sql",
        "params",
        "args",
        "msgs",
        "accounts",
        "kv",
        "room",
        "balance",
    ];
    let gets = [
        "/health",
        "/v1/tables",
        "/v1/tables/msgs/rows?after=1&limit=2",
        "/v1/tables/kv/rows?after=k&limit=100",
        "/v1/tables/accounts/rows/1",
        "/v1/tables/kv/rows/k",
        "/v1/changes?since=0&tables=msgs,kv&limit=5",
        "/v1/changes?since=18446744073709551615",
        "/v1/functions",
        "/v1/live?sql=SELECT%20id%20FROM%20msgs%20WHERE%20room%20%3D%20%241&params=%5B%22a%22%5D&since=0",
        "/v1/live?sql=SELECT%20*%20FROM%20t&since=1",
        "/v1/nope?x=1",
    ];
    let routes = [
        Route {
            name: "http_sql",
            method: Method::POST,
            uri: "/v1/sql",
            execs: 3_000,
            kind: Kind::Json,
            seeds: strings(&ddl),
            words: sql_words,
        },
        Route {
            name: "http_mutate",
            method: Method::POST,
            uri: "/v1/mutate",
            execs: 5_000,
            kind: Kind::Json,
            seeds: strings(&mutate),
            words: &body_words,
        },
        Route {
            name: "http_query",
            method: Method::POST,
            uri: "/v1/query",
            execs: 5_000,
            kind: Kind::Json,
            seeds: strings(&selects),
            words: sql_words,
        },
        Route {
            name: "http_call",
            method: Method::POST,
            uri: "/v1/call/transfer",
            execs: 3_000,
            kind: Kind::Json,
            seeds: strings(&call),
            words: &body_words,
        },
        Route {
            name: "http_functions",
            method: Method::PUT,
            uri: "/v1/functions",
            execs: 1_000,
            kind: Kind::Text,
            seeds: corpus::MODULES.iter().map(|m| m.to_string()).collect(),
            words: corpus::JS_WORDS,
        },
        Route {
            name: "http_get",
            method: Method::GET,
            uri: "",
            execs: 4_000,
            kind: Kind::Text,
            seeds: gets.iter().map(|g| g.to_string()).collect(),
            words: &[
                "?",
                "&",
                "=",
                "%",
                "after",
                "limit",
                "since",
                "tables",
                "sql",
                "params",
                "/v1/tables/",
                "/rows/",
                "-1",
                "18446744073709551616",
            ],
        },
    ];
    for route in routes {
        fuzz_route(&server, route).await;
    }
    // Put the module back: the PUT target replaced it with whatever compiled last.
    let module = [corpus::MODULES[0], corpus::MODULES[1], corpus::MODULES[2]].concat();
    let (status, reply) = send(
        &server.router,
        Method::PUT,
        "/v1/functions",
        module.into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    fuzz_ws(&server, false, 4_000).await;
    fuzz_ws(&server, true, 4_000).await;

    // The server still works: a known-good DDL, write and reads.
    let ok = |(status, body): (u16, Vec<u8>)| {
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    let ddl = json!({"sql": "CREATE TABLE fuzz_after (id INTEGER PRIMARY KEY, v TEXT)"});
    ok(send(
        &server.router,
        Method::POST,
        "/v1/sql",
        ddl.to_string().into_bytes(),
    )
    .await);
    let write = json!({"ops": [{"op": "insert", "table": "fuzz_after", "row": {"id": 1, "v": "still here"}}], "durability": "fsync"});
    ok(send(
        &server.router,
        Method::POST,
        "/v1/mutate",
        write.to_string().into_bytes(),
    )
    .await);
    let row = ok(send(
        &server.router,
        Method::GET,
        "/v1/tables/fuzz_after/rows/1",
        Vec::new(),
    )
    .await);
    assert_eq!(row["row"]["v"], "still here");
    let read = json!({"sql": "SELECT v FROM fuzz_after WHERE id = $1", "params": [1]});
    let read = ok(send(
        &server.router,
        Method::POST,
        "/v1/query",
        read.to_string().into_bytes(),
    )
    .await);
    assert_eq!(read["rows"][0]["v"], "still here");
    let health = ok(send(&server.router, Method::GET, "/health", Vec::new()).await);
    assert_eq!(health["status"], "ok");
    assert_eq!(
        sluice_fuzzkit::panics_elsewhere(),
        panics_before,
        "a thread of the server panicked during the run (see its message above)"
    );
    server.core.shutdown().await.expect("a clean shutdown");
}
