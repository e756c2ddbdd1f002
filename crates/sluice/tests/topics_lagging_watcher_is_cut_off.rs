//! A watcher that stops reading is cut off with `lagging` while appends complete and another
//! watcher receives everything (docs/api.md "Watch", docs/protocol.md "Topics").
//!
//! Against the real binary with `--watch-queue-records 64`: a raw TCP socket opens an SSE
//! watch and then never reads, and a WebSocket client sends `watch` and then stops polling.
//! A well-behaved SSE watcher reads everything; the appender keeps it at most one batch
//! behind (so it can never lag) and appends 32 KiB records until `/metrics` says both
//! stuck watchers were cut off. Then: every append was answered, `sluice_topic_lagging_total`
//! is 2, `sluice_topic_watchers` is 1, `sluice_topic_deliveries_total` covers what the good
//! watcher got; the stuck SSE socket, read at last, holds records 0..n in order and then
//! `event: error` `lagging` with `next` = n + 1, then ends; the WebSocket likewise gets
//! `lagging` with `next`, and a new `watch` from `next` delivers the rest with no gap.

mod common;

use common::topics::assert_no_panic;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::topics::{Enc, Rec, Ws, WAIT};
use common::{Server, TempDir};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const QUEUE: u64 = 64;
const BATCH: usize = 8;
const RECORD_BYTES: usize = 32 << 10;
/// Upper bound on what the test appends waiting for the cut-offs (socket buffers are a few
/// MiB; this is far beyond them).
const RECORDS_MAX: u64 = 8_000;

/// De-chunks an HTTP/1.1 chunked body (as much of it as is complete).
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = std::str::from_utf8(&body[..eol]).expect("a chunk size line");
        let size_text = size_text.split(';').next().unwrap().trim();
        let size = usize::from_str_radix(size_text, 16)
            .unwrap_or_else(|_| panic!("a chunk size: {size_text:?}"));
        if size == 0 || body.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&body[eol + 2..eol + 2 + size]);
        body = &body[(eol + 4 + size).min(body.len())..];
    }
}

/// The SSE events (event name, data) of a stream's text, heartbeats skipped.
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            let event = event?;
            Some((event, serde_json::from_str(&data.join("\n")).ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_lagging_watcher_is_cut_off() {
    let dir = TempDir::new("topics-lag");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--watch-queue-records",
            &QUEUE.to_string(),
            "--live-heartbeat-ms",
            "200",
            // The stuck sockets are read at last, however long the appends took: this test
            // is about `lagging`, not about closing stalled connections (see
            // stalled_clients_are_disconnected.rs).
            "--write-timeout-ms",
            "3600000",
        ],
    );
    let api = server.api();
    let (status, body) = api.put_topic("t", None).await;
    assert_eq!(status, 200, "{body}");

    // The stuck SSE watcher: a raw socket that reads the greeting and then nothing.
    let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    raw.write_all(
        format!(
            "GET /v1/topics/t/watch HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n\r\n",
            server.addr,
            common::bearer()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw_buf = Vec::new();
    while !String::from_utf8_lossy(&raw_buf).contains("event: watching") {
        let mut chunk = [0u8; 512];
        let n = tokio::time::timeout(WAIT, raw.read(&mut chunk))
            .await
            .expect("the greeting within the safety bound")
            .unwrap();
        assert!(
            n > 0,
            "the raw watch ended: {}",
            String::from_utf8_lossy(&raw_buf)
        );
        raw_buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&raw_buf).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // The stuck WebSocket watcher: registers, then is not polled until the end.
    let mut stuck_ws = Ws::connect(server.addr, Enc::MsgPack).await;
    stuck_ws
        .send(json!({"id": 1, "type": "watch", "qid": "w", "topic": "t"}))
        .await;
    let (reply, _) = stuck_ws.until_reply(1).await;
    assert_eq!(
        (&reply["type"], &reply["next"]),
        (&json!("watching"), &json!(0)),
        "{reply}"
    );

    // The good watcher.
    let received = Arc::new(AtomicU64::new(0));
    let mut good = api.watch_sse("t", None, &[], None).await.expect("a watch");
    assert_eq!(good.event().await.event, "watching");
    let good_task = {
        let received = received.clone();
        tokio::spawn(async move {
            let mut got: Vec<u64> = Vec::new();
            loop {
                let ev = good.event().await;
                assert_eq!(ev.event, "record", "the good watcher: {ev:?}");
                let rec = Rec::from_json(&ev.data);
                got.push(rec.offset);
                received.store(got.len() as u64, Ordering::SeqCst);
                if rec.data == json!("end") {
                    // Still open: it counts as a watcher below.
                    return (got, good);
                }
            }
        })
    };
    assert_eq!(api.metric("sluice_topic_watchers").await, 3.0);

    let payload = "r".repeat(RECORD_BYTES);
    let mut appended = 0u64;
    let mut batches = 0u64;
    let cut_off = loop {
        let records: Vec<Value> = (0..BATCH)
            .map(|i| json!({"tags": [format!("k:{}", i % 3)], "data": {"p": payload}}))
            .collect();
        let (first, last) = api.append_ok("t", &json!(records), Some("disk")).await;
        assert_eq!((first, last), (appended, appended + BATCH as u64 - 1));
        appended += BATCH as u64;
        batches += 1;
        // Keep the good watcher within one batch: it can never fall QUEUE behind.
        for _ in 0..100_000 {
            if received.load(Ordering::SeqCst) >= appended {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            received.load(Ordering::SeqCst),
            appended,
            "the good watcher keeps up (bounded wait)"
        );
        let lagging = api.metric("sluice_topic_lagging_total").await;
        if lagging >= 2.0 {
            break true;
        }
        if appended >= RECORDS_MAX {
            break false;
        }
    };
    assert!(
        cut_off,
        "after {appended} records of {RECORD_BYTES} bytes the stuck watchers were not both cut off: \
         lagging_total {}, watchers {}",
        api.metric("sluice_topic_lagging_total").await,
        api.metric("sluice_topic_watchers").await
    );
    let (end, _) = api
        .append_ok("t", &json!([{"data": "end"}]), Some("disk"))
        .await;
    let (good_got, _good) = tokio::time::timeout(WAIT, good_task)
        .await
        .expect("the good watcher finishes")
        .expect("the good watcher");
    assert_eq!(
        good_got,
        (0..=end).collect::<Vec<_>>(),
        "the good watcher got everything in order"
    );
    assert_eq!(
        api.metric("sluice_topic_lagging_total").await,
        2.0,
        "only the stuck watchers lag"
    );
    assert_eq!(
        api.metric("sluice_topic_watchers").await,
        1.0,
        "the cut-off watchers are gone"
    );
    let deliveries = api.metric("sluice_topic_deliveries_total").await;
    assert!(
        deliveries >= (end + 1) as f64,
        "deliveries {deliveries} cover the good watcher's {}",
        end + 1
    );
    eprintln!("{appended} records in {batches} batches until both stuck watchers were cut off; deliveries {deliveries}");

    // The stuck SSE socket, read at last: records from 0 in order, then `lagging`, then the end.
    // The response ends with the connection or, kept alive, with the last chunk.
    let read_all = async {
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            match raw.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw_buf.extend_from_slice(&chunk[..n]),
            }
            if raw_buf.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
        }
    };
    let ended = tokio::time::timeout(WAIT, read_all).await.is_ok();
    if !ended {
        let text = String::from_utf8_lossy(&raw_buf);
        let tail: String = text
            .chars()
            .rev()
            .take(600)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        panic!(
            "the server did not end the lagging SSE watch within {WAIT:?}; {} bytes read, ending with:\n{tail}",
            raw_buf.len()
        );
    }
    let text = String::from_utf8_lossy(&raw_buf).to_string();
    let body_at = text.find("\r\n\r\n").expect("response headers") + 4;
    let headers = text[..body_at].to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        String::from_utf8(dechunk(&raw_buf[body_at..])).expect("UTF-8 events")
    } else {
        text[body_at..].to_string()
    };
    let events = sse_events(&body);
    let records: Vec<u64> = events
        .iter()
        .filter(|(e, _)| e == "record")
        .map(|(_, d)| d["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        records,
        (0..records.len() as u64).collect::<Vec<_>>(),
        "the stuck SSE records"
    );
    assert!(
        (records.len() as u64) < appended,
        "the stuck watcher did not get everything"
    );
    let (last_event, last_data) = events.last().expect("events");
    assert_eq!(
        last_event, "error",
        "the stuck SSE watch ends with an error: {last_data}"
    );
    assert_eq!(last_data["error"]["code"], "lagging", "{last_data}");
    let next = last_data["error"].get("next").or(last_data.get("next"));
    assert_eq!(
        next,
        Some(&json!(records.len())),
        "lagging says where to resume: {last_data}"
    );
    let message = last_data["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("--watch-queue-records"), "{last_data}");

    // The stuck WebSocket: records from 0, then `lagging` with `next`; resume from there.
    let mut ws_got: Vec<u64> = Vec::new();
    let next = loop {
        let m = stuck_ws.next().await.expect("the WebSocket stays open");
        match m["type"].as_str() {
            Some("record") => ws_got.push(m["offset"].as_u64().unwrap()),
            Some("error") => {
                assert_eq!(
                    (&m["qid"], &m["error"]["code"]),
                    (&json!("w"), &json!("lagging")),
                    "{m}"
                );
                let next = m["error"]
                    .get("next")
                    .or(m.get("next"))
                    .and_then(Value::as_u64);
                break next.unwrap_or_else(|| panic!("lagging names next: {m}"));
            }
            _ => panic!("the stuck WebSocket: {m}"),
        }
    };
    assert_eq!(ws_got, (0..ws_got.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        next,
        ws_got.len() as u64,
        "resume right after the last record received"
    );
    stuck_ws
        .send(json!({"id": 2, "type": "watch", "qid": "w", "topic": "t", "from": next}))
        .await;
    let (reply, _) = stuck_ws.until_reply(2).await;
    assert_eq!(
        (&reply["type"], &reply["next"]),
        (&json!("watching"), &json!(next)),
        "{reply}"
    );
    for want in next..=end {
        let m = stuck_ws.next().await.expect("the resumed watch");
        assert_eq!(
            (&m["type"], &m["offset"]),
            (&json!("record"), &json!(want)),
            "{m}"
        );
    }
    stuck_ws.close().await;
    assert_no_panic(&server);
    drop(server);
}
