//! SIGTERM with live streams open: every SSE stream ends with a final `shutting_down` error
//! event, every WebSocket gets a close frame (1001, going away) with a reason, the process
//! writes its final snapshot and exits 0 within `--shutdown-grace-ms`, and the restart
//! replays nothing.

mod common;

use std::time::{Duration, Instant};

use common::{Server, TempDir};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const GRACE_MS: u64 = 3_000;
/// Bound on the whole shutdown on a loaded CI machine (the streams end at once; the grace
/// only matters for connections that do not close).
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// Waits for the signalled server to exit; asserts status 0 and returns its stderr.
fn clean_exit(server: &mut Server) -> String {
    let status = server
        .wait_exit(EXIT_WITHIN)
        .unwrap_or_else(|| panic!("still running after SIGTERM:\n{}", server.stderr()));
    assert!(
        status.success(),
        "exit status {status}:\n{}",
        server.stderr()
    );
    server.stderr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_sse_streams_and_websockets_writes_the_snapshot_and_exits_0() {
    let dir = TempDir::new("sigterm-streams");
    let data = dir.join("data");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let grace = GRACE_MS.to_string();
    let mut server = Server::start(&data, &logs, &["--shutdown-grace-ms", &grace]);
    let api = server.api();
    api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        .await;
    api.mutate(json!([{"op":"insert","table":"t","row":{"id":1,"v":"a"}}]))
        .await;

    // Two SSE streams and one WebSocket with a live subscription and a request in flight.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let response = api
            .client
            .get(api.url("/v1/live?sql=SELECT%20id%2C%20v%20FROM%20t"))
            .send()
            .await
            .expect("open the SSE stream");
        assert_eq!(response.status(), 200);
        streams.push(response);
    }
    let url = format!("ws://{}/v1/ws", server.addr);
    let request = common::ws_request(&url, Some("sluice.json.v1"));
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("open the WebSocket");
    ws.send(Message::Text(
        json!({"type":"subscribe","qid":"q","sql":"SELECT id FROM t"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    // The subscription's snapshot arrives first: the connection is fully up.
    let first = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the snapshot arrives")
        .expect("the socket is open")
        .expect("a message");
    assert!(first.to_text().unwrap().contains("snapshot"), "{first:?}");
    // Each SSE stream got its snapshot too.
    for s in &mut streams {
        let chunk = tokio::time::timeout(Duration::from_secs(10), s.chunk())
            .await
            .expect("the snapshot arrives")
            .expect("read the stream")
            .expect("a chunk");
        assert!(String::from_utf8_lossy(&chunk).contains("event: snapshot"));
    }

    let signalled = Instant::now();
    server.signal_term();

    // Every SSE stream ends with a final shutting_down event, then closes.
    for s in &mut streams {
        let mut text = String::new();
        loop {
            let chunk = tokio::time::timeout(EXIT_WITHIN, s.chunk())
                .await
                .expect("the stream ends within the bound");
            match chunk {
                Ok(Some(bytes)) => text.push_str(&String::from_utf8_lossy(bytes.as_ref())),
                Ok(None) | Err(_) => break,
            }
        }
        assert!(
            text.contains("event: error") && text.contains("shutting_down"),
            "the stream's last event names the shutdown: {text:?}"
        );
    }
    // The WebSocket gets a close frame with 1001 and a reason.
    let mut close = None;
    while let Ok(Some(message)) = tokio::time::timeout(EXIT_WITHIN, ws.next()).await {
        match message {
            Ok(Message::Close(frame)) => {
                close = frame;
                break;
            }
            Ok(_) => continue,
            Err(e) => panic!("the WebSocket broke instead of closing: {e}"),
        }
    }
    let close = close.expect("a close frame with a reason");
    assert_eq!(close.code, CloseCode::Away);
    assert!(close.reason.contains("shutting down"), "{close:?}");

    let stderr = clean_exit(&mut server);
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    assert!(
        !stderr.contains("grace period"),
        "every connection closed by itself, before the grace ran out ({:?} after SIGTERM):\n{stderr}",
        signalled.elapsed()
    );
    let snapshots: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .collect();
    assert!(!snapshots.is_empty(), "a final snapshot was written");
    drop(server);

    let server = Server::start(&data, &logs, &[]);
    let api = server.api();
    assert_eq!(api.metric("sluice_recovery_replayed").await, 0.0);
    let (status, row) = api.get("/v1/tables/t/rows/1").await;
    assert_eq!(status, 200, "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_closes_is_cut_after_the_grace_period() {
    let dir = TempDir::new("sigterm-grace");
    let data = dir.join("data");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut server = Server::start(&data, &logs, &["--shutdown-grace-ms", "500"]);
    let api = server.api();
    api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    // A raw TCP connection that sends half a request and then nothing: hyper keeps waiting
    // for the rest, so only the grace period ends it.
    let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut raw,
        format!(
            "POST /v1/mutate HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: 100\r\n\r\n{{",
            common::bearer()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.signal_term();
    let stderr = clean_exit(&mut server);
    assert!(
        stderr.contains("grace period") && stderr.contains("stopped cleanly"),
        "{stderr}"
    );
    drop(raw);
}
