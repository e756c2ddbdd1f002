//! An HTTP connection must deliver a whole request head within `--http-idle-timeout-ms` of
//! connecting and of each response, or it is closed (crates/server/src/serve.rs); open SSE
//! streams and WebSockets are not idle and stay.
//!
//! Against the real binary with `--http-idle-timeout-ms 300`: a socket that sends nothing,
//! one that trickles a request head a byte every 50 ms (slowloris), and a keep-alive
//! connection left idle after one response are all closed by the server (read sees the
//! end); a request body that stops arriving is answered 408 naming the flag, while one that
//! arrives slowly but steadily is applied; an SSE live stream and a WebSocket, both opened
//! before and left quiet for four times the timeout, still deliver: the stream the insert
//! made after the wait, the WebSocket the reply to a request sent after it.

mod common;

use std::time::{Duration, Instant};

use common::{Server, TempDir};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const IDLE_MS: u64 = 300;
/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(30);

/// Reads until the server closes the socket (EOF or reset); returns what arrived. Panics if
/// it stays open for [`WAIT`].
async fn read_until_closed(socket: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    loop {
        let left = WAIT.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Err(_) => panic!("{what}: the server kept the connection open for {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads from `socket` until `needle` has arrived; panics if the socket ends first.
async fn read_until(socket: &mut TcpStream, got: &mut Vec<u8>, needle: &str, what: &str) {
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    while !String::from_utf8_lossy(got).contains(needle) {
        let left = WAIT.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Err(_) => panic!("{what}: {needle:?} did not arrive within {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => panic!(
                "{what}: the connection ended before {needle:?}: {}",
                String::from_utf8_lossy(got)
            ),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_connections_are_closed() {
    let dir = TempDir::new("idle-http");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &["--http-idle-timeout-ms", &IDLE_MS.to_string()],
    );
    let api = server.api();
    api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, note TEXT)")
        .await;
    let idle = Duration::from_millis(IDLE_MS);

    // Opened first, so that they have been quiet the longest when checked.
    let mut sse = TcpStream::connect(server.addr).await.unwrap();
    sse.write_all(
        format!(
            "GET /v1/live?sql=SELECT%20*%20FROM%20t HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n\r\n",
            server.addr,
            common::bearer()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut sse_got = Vec::new();
    read_until(
        &mut sse,
        &mut sse_got,
        "snapshot",
        "the SSE stream's snapshot",
    )
    .await;
    let url = format!("ws://{}/v1/ws", server.addr);
    let (mut ws, _) =
        tokio_tungstenite::connect_async(common::ws_request(&url, Some("sluice.json.v1")))
            .await
            .expect("open the WebSocket");

    // Sends nothing at all.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    // Trickles a head that never ends.
    let mut trickle = TcpStream::connect(server.addr).await.unwrap();
    trickle
        .write_all(b"GET /health HTTP/1.1\r\n")
        .await
        .unwrap();
    let trickler = tokio::spawn(async move {
        let started = Instant::now();
        let mut sent = 0u64;
        // Until the server closes it (a write fails) or the bound, whichever comes first.
        while started.elapsed() < WAIT {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if trickle.write_all(b"X").await.is_err() {
                return (true, started.elapsed(), sent);
            }
            sent += 1;
        }
        (false, started.elapsed(), sent)
    });
    // One request answered, then idle on keep-alive.
    let mut kept = TcpStream::connect(server.addr).await.unwrap();
    kept.write_all(format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).as_bytes())
        .await
        .unwrap();
    let mut kept_got = Vec::new();
    read_until(
        &mut kept,
        &mut kept_got,
        "\"status\"",
        "the keep-alive response",
    )
    .await;

    let started = Instant::now();
    let got = read_until_closed(&mut silent, "a connection that sent nothing").await;
    assert!(started.elapsed() >= idle / 2, "closed before the timeout");
    assert!(
        !String::from_utf8_lossy(&got).contains("200 OK"),
        "nothing was asked, nothing is answered"
    );
    read_until_closed(&mut kept, "an idle keep-alive connection").await;
    let (cut, after, sent) = trickler.await.expect("trickler");
    assert!(
        cut,
        "a head trickled for {after:?} ({sent} bytes) was never cut off"
    );

    // A body that stops arriving: 408 naming the flag, and the connection ends.
    let body = json!({"ops": [{"op": "insert", "table": "t", "row": {"id": 9, "note": "slow"}}]})
        .to_string();
    let head = format!(
        "POST /v1/mutate HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.addr,
        common::bearer(),
        body.len()
    );
    let mut stalled_body = TcpStream::connect(server.addr).await.unwrap();
    stalled_body
        .write_all(format!("{head}{}", &body[..5]).as_bytes())
        .await
        .unwrap();
    let got = read_until_closed(&mut stalled_body, "a request body that stopped").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("--http-idle-timeout-ms"), "{text}");
    // A body that arrives slowly but steadily (a piece every sixth of the limit) is read
    // whole and applied.
    let mut slow_body = TcpStream::connect(server.addr).await.unwrap();
    slow_body.write_all(head.as_bytes()).await.unwrap();
    for piece in body.as_bytes().chunks(8) {
        tokio::time::sleep(idle / 6).await;
        slow_body.write_all(piece).await.unwrap();
    }
    let mut slow_got = Vec::new();
    read_until(
        &mut slow_body,
        &mut slow_got,
        "\"seq\"",
        "the slow body's reply",
    )
    .await;
    let text = String::from_utf8_lossy(&slow_got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(
        api.get_ok("/v1/tables/t/rows/9").await["row"]["note"],
        "slow",
        "the slow body was applied"
    );

    // The quiet streams are still open: wait four timeouts, then use them.
    tokio::time::sleep(idle * 4).await;
    api.mutate(json!([{"op": "insert", "table": "t", "row": {"id": 7, "note": "after the wait"}}]))
        .await;
    read_until(
        &mut sse,
        &mut sse_got,
        "after the wait",
        "the SSE stream after the wait",
    )
    .await;
    ws.send(Message::Text(
        json!({"id": 1, "type": "get", "table": "t", "key": 7})
            .to_string()
            .into(),
    ))
    .await
    .expect("the WebSocket still takes requests");
    let reply = loop {
        match tokio::time::timeout(WAIT, ws.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                let v: Value = serde_json::from_str(text.as_str()).expect("JSON");
                if v["id"] == 1 {
                    break v;
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("the WebSocket ended after the wait: {other:?}"),
        }
    };
    assert_eq!(reply["row"]["note"], "after the wait", "{reply}");
    // And a new connection is served as ever.
    assert!(
        api.health_seq().await >= 2,
        "the DDL and the insert are committed"
    );
}

#[test]
fn an_idle_timeout_out_of_range_is_refused_by_name() {
    let dir = TempDir::new("idle-flag");
    Server::assert_flag_refused(
        &dir,
        "--http-idle-timeout-ms",
        &["0", "99", "3600001"],
        "100..=3600000",
    );
}
