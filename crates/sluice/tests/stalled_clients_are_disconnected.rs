//! A client that keeps its connection open but stops reading is disconnected once a write
//! to it has taken no byte for `--write-timeout-ms` (crates/server/src/stall.rs), over HTTP
//! and over WebSocket alike; the server goes on serving everyone else.
//!
//! Against the real binary with `--write-timeout-ms 500`: a row of 256 KiB; a raw TCP
//! client pipelines 200 `GET`s of it and a WebSocket client sends 200 `get`s (50 MiB of
//! replies each, far beyond any socket buffers), and neither reads. Then, within a bounded
//! wait: `sluice_stalled_connections_total` is 2 and `sluice_ws_connections` 0; each stuck
//! socket, read at last, holds fewer than 200 replies and then ends (the server let go of
//! it); a fresh client reads the row.

mod common;

use std::time::Duration;

use common::{Server, TempDir};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// Replies each stuck client asks for.
const REQUESTS: usize = 200;
/// Bytes of the row's text: REQUESTS of them are ~50 MiB per client.
const TEXT_BYTES: usize = 256 << 10;
/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_are_disconnected() {
    let dir = TempDir::new("stalled");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &["--write-timeout-ms", "500"],
    );
    let api = server.api();
    api.sql("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .await;
    let text = "x".repeat(TEXT_BYTES);
    api.mutate(json!([{"op": "insert", "table": "blobs", "row": {"id": 1, "body": text}}]))
        .await;
    assert_eq!(api.metric("sluice_stalled_connections_total").await, 0.0);

    // HTTP: pipelined requests, no reads.
    let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /v1/tables/blobs/rows/1 HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\n\r\n",
        server.addr,
        common::bearer()
    );
    raw.write_all(request.repeat(REQUESTS).as_bytes())
        .await
        .unwrap();

    // WebSocket: requests sent, the stream never polled.
    let url = format!("ws://{}/v1/ws", server.addr);
    let (mut ws, _) =
        tokio_tungstenite::connect_async(common::ws_request(&url, Some("sluice.json.v1")))
            .await
            .expect("open the WebSocket");
    for id in 0..REQUESTS {
        let get = json!({"id": id, "type": "get", "table": "blobs", "key": 1});
        ws.send(Message::Text(get.to_string().into()))
            .await
            .expect("send a get");
    }

    // Both are closed by the server: counted, and the WebSocket gauge drops to zero.
    let waited = std::time::Instant::now();
    loop {
        let stalled = api.metric("sluice_stalled_connections_total").await;
        let open = api.metric("sluice_ws_connections").await;
        if stalled >= 2.0 && open == 0.0 {
            assert_eq!(stalled, 2.0, "only the two stuck clients were cut");
            break;
        }
        assert!(
            waited.elapsed() < WAIT,
            "stuck clients still connected after {WAIT:?}: stalled {stalled}, ws open {open}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The HTTP socket, read at last: some whole responses, then the end.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(WAIT, raw.read(&mut buf)).await {
            Err(_) => panic!("the stuck HTTP connection was not closed"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let responses = got.windows(12).filter(|w| w == b"HTTP/1.1 200").count();
    assert!(
        responses < REQUESTS,
        "all {responses} responses arrived: the connection was not cut"
    );

    // The WebSocket, read at last: fewer replies than requests, then the end.
    let mut replies = 0;
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await {
            Err(_) => panic!("the stuck WebSocket was not closed"),
            Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(Message::Text(_)))) => replies += 1,
            Ok(Some(Ok(_))) => {}
        }
    }
    assert!(
        replies < REQUESTS,
        "all {replies} replies arrived: the connection was not cut"
    );

    // Everyone else is served as before.
    let row = api.get_ok("/v1/tables/blobs/rows/1").await;
    assert_eq!(row["row"]["body"].as_str().map(str::len), Some(TEXT_BYTES));
    assert_eq!(api.metric("sluice_stalled_connections_total").await, 2.0);
}

#[test]
fn a_write_timeout_out_of_range_is_refused_by_name() {
    let dir = TempDir::new("stalled-flag");
    Server::assert_flag_refused(
        &dir,
        "--write-timeout-ms",
        &["0", "99", "3600001"],
        "100..=3600000",
    );
}
