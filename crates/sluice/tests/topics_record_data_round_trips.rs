//! A record's `data` is any JSON value, sent as JSON text over HTTP. Unusual but valid (or
//! borderline) JSON — huge and tiny numbers, escapes, deep nesting, duplicate keys, odd
//! whitespace — must either be refused with `bad_request` (nothing appended) or be accepted
//! and then served as the same value everywhere: reads, SSE, WebSocket JSON and MessagePack
//! watches — and survive `kill -9` and recovery unchanged (an accepted record must never
//! make the log unreadable). The same for MessagePack-only values (binary, integer map keys,
//! NaN, infinity, extensions, float32, invalid UTF-8) appended over a MessagePack WebSocket.

mod common;

use common::topics::assert_no_panic;

use common::topics::{Enc, Ws};
use common::{Server, TempDir};
use serde_json::{json, Value};

/// (name, the data's JSON text as sent).
fn cases() -> Vec<(&'static str, String)> {
    vec![
        ("spaces and tabs", "{ \"a\" :\t[ 1 , 2 ] }".into()),
        ("line breaks", "{\n  \"a\": [1,\r\n 2]\n}".into()),
        ("u64 max", "18446744073709551615".into()),
        ("i64 min", "-9223372036854775808".into()),
        ("beyond u64", "18446744073709551616".into()),
        ("beyond f64", "1e400".into()),
        ("tiny", "1e-400".into()),
        ("negative zero", "-0".into()),
        ("exponent", "2.5E+3".into()),
        ("escaped unicode", "\"\\u00e9\\u65e5\\ud83d\\ude00\"".into()),
        (
            "escaped slash and controls",
            "\"a\\/b\\n\\t\\u0000\"".into(),
        ),
        ("a lone surrogate escape", "\"\\ud800\"".into()),
        ("duplicate keys", "{\"a\":1,\"a\":2}".into()),
        (
            "deep nesting (100)",
            format!("{}1{}", "[".repeat(100), "]".repeat(100)),
        ),
        ("raw non-ASCII", "\"é日😀\"".into()),
        ("null", "null".into()),
        ("empty object", "{}".into()),
        ("a line separator", "\"\u{2028}\"".into()),
    ]
}

/// (name, a MessagePack value as bytes) for values JSON has no exact form for.
fn msgpack_cases() -> Vec<(&'static str, Vec<u8>)> {
    let f64_bytes = |x: f64| {
        let mut v = vec![0xcb];
        v.extend_from_slice(&x.to_bits().to_be_bytes());
        v
    };
    vec![
        ("binary", vec![0xc4, 3, b'a', b'b', 0xff]),
        ("an integer map key", vec![0x81, 0x01, 0xa1, b'a']),
        ("NaN", f64_bytes(f64::NAN)),
        ("infinity", f64_bytes(f64::INFINITY)),
        (
            "u64 max",
            vec![0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
        ("i64 min", vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ("an extension", vec![0xd4, 0x01, 0x00]),
        ("a float32", vec![0xca, 0x3f, 0xc0, 0x00, 0x00]),
        ("invalid UTF-8 in a string", vec![0xa2, 0xc3, 0x28]),
    ]
}

/// Starts the server; `None` with the reason if it exits instead of listening.
fn start_or_why(data: &std::path::Path, logs: &std::path::Path) -> (Option<Server>, String) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Server::start(data, logs, &[])
    })) {
        Ok(server) => (Some(server), String::new()),
        Err(payload) => {
            let why = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            (None, why)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_record_data_round_trips() {
    let dir = TempDir::new("topics-data");
    let data_dir = dir.join("data");
    let server = Server::start(&data_dir, dir.path(), &[]);
    let api = server.api();
    let (status, body) = api.put_topic("d", None).await;
    assert_eq!(status, 200, "{body}");

    // Watchers over every transport, from the start.
    let mut sse = api.watch_sse("d", None, &[], None).await.expect("a watch");
    assert_eq!(sse.event().await.event, "watching");
    let mut wss = Vec::new();
    for enc in [Enc::Json, Enc::MsgPack] {
        let mut ws = Ws::connect(server.addr, enc).await;
        ws.send(json!({"id": 1, "type": "watch", "qid": "w", "topic": "d"}))
            .await;
        let (reply, _) = ws.until_reply(1).await;
        assert_eq!(reply["type"], "watching", "{reply}");
        wss.push((ws, false));
    }

    // offset → (case, the value as first read back)
    let mut accepted: Vec<(u64, &str, Value)> = Vec::new();
    for (name, text) in cases() {
        let body = format!("{{\"records\": [{{\"tags\": [\"t\"], \"data\": {text}}}]}}");
        let resp = api
            .client
            .post(api.url("/v1/topics/d/records"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let reply: Value = resp.json().await.expect("a JSON reply");
        if status != 200 {
            assert_eq!(status, 400, "{name}: {reply}");
            assert_eq!(reply["error"]["code"], "bad_request", "{name}: {reply}");
            eprintln!("{name}: refused: {}", reply["error"]["message"]);
            continue;
        }
        let offset = reply["first"].as_u64().unwrap();
        let (status, page) = api
            .read_records("d", &[("from", &offset.to_string()), ("limit", "1")])
            .await;
        assert_eq!(status, 200, "{name}: {page}");
        let read = page["records"][0]["data"].clone();
        // When the test's own parser reads the text, the value read back must equal it.
        if let Ok(sent) = serde_json::from_str::<Value>(&text) {
            assert_eq!(read, sent, "{name}: read back vs sent {text:?}");
        }
        eprintln!("{name}: accepted at {offset}, reads back as {read}");
        accepted.push((offset, name, read));
    }

    // MessagePack has values JSON has not: over a MessagePack connection they are refused
    // with bad_request or accepted as some JSON value that then reads back like any other
    // (today NaN and infinity become null, as for any MessagePack request).
    let mut mp = Ws::connect(server.addr, Enc::MsgPack).await;
    for (k, (name, data)) in msgpack_cases().into_iter().enumerate() {
        let id = 100 + k as u8;
        // {"id": id, "type": "append", "topic": "d", "records": [{"data": <data>}]}
        let mut frame = vec![0x84, 0xa2, b'i', b'd', id];
        frame.extend_from_slice(&[0xa4, b't', b'y', b'p', b'e', 0xa6]);
        frame.extend_from_slice(b"append");
        frame.extend_from_slice(&[0xa5, b't', b'o', b'p', b'i', b'c', 0xa1, b'd']);
        frame.extend_from_slice(&[0xa7]);
        frame.extend_from_slice(b"records");
        frame.extend_from_slice(&[0x91, 0x81, 0xa4, b'd', b'a', b't', b'a']);
        frame.extend_from_slice(&data);
        mp.send_binary(frame).await;
        // A frame that does not decode gets its error with "id": null (docs/protocol.md).
        let reply = mp.next().await.expect("a reply");
        assert!(
            reply["id"] == json!(id) || (reply["id"].is_null() && reply["type"] == "error"),
            "MessagePack {name}: {reply}"
        );
        match reply["type"].as_str() {
            Some("result") => {
                let offset = reply["first"].as_u64().unwrap();
                let (status, page) = api
                    .read_records("d", &[("from", &offset.to_string()), ("limit", "1")])
                    .await;
                assert_eq!(status, 200, "{name}: {page}");
                let read = page["records"][0]["data"].clone();
                eprintln!("MessagePack {name}: accepted at {offset}, reads back as {read}");
                accepted.push((offset, name, read));
            }
            Some("error") => {
                assert_eq!(
                    reply["error"]["code"], "bad_request",
                    "MessagePack {name}: {reply}"
                );
                eprintln!("MessagePack {name}: refused: {}", reply["error"]["message"]);
            }
            _ => panic!("MessagePack {name}: {reply}"),
        }
    }
    mp.close().await;

    // Every accepted record reaches every watcher with the same value, in order. Failures
    // are collected so the restart below is checked too.
    let mut failures: Vec<String> = Vec::new();
    for (offset, name, read) in &accepted {
        let (event, _, text) = sse.next_raw_event().await.expect("an SSE record");
        assert_eq!(event, "record", "{name}: {text}");
        match serde_json::from_str::<Value>(&text) {
            Ok(ev) => {
                assert_eq!(ev["offset"], json!(offset), "{name}: {ev}");
                if &ev["data"] != read {
                    failures.push(format!(
                        "{name}: SSE sent {} but a read gives {read}",
                        ev["data"]
                    ));
                }
            }
            Err(e) => failures.push(format!(
                "{name}: SSE sent data a JSON parser refuses ({e}): {text}; a read gives {read}"
            )),
        }
        for (ws, dead) in &mut wss {
            if *dead {
                continue;
            }
            let m = match tokio::time::timeout(std::time::Duration::from_secs(20), ws.next()).await
            {
                Ok(Some(m)) => m,
                outcome => {
                    failures.push(format!(
                        "{name}: the WebSocket {:?} watch got no record {offset} ({}); it is \
                         not checked further",
                        ws.enc,
                        if outcome.is_ok() {
                            "the connection ended"
                        } else {
                            "nothing within 20 s"
                        }
                    ));
                    *dead = true;
                    continue;
                }
            };
            if m.get("undecodable").is_some() {
                failures.push(format!(
                    "{name}: WebSocket {:?} sent a message its client cannot decode: {m}; a read gives {read}",
                    ws.enc
                ));
                continue;
            }
            assert_eq!(
                (&m["type"], &m["offset"]),
                (&json!("record"), &json!(offset)),
                "{name}: {:?}: {m}",
                ws.enc
            );
            if &m["data"] != read {
                failures.push(format!(
                    "{name}: WebSocket {:?} sent {} but a read gives {read}",
                    ws.enc, m["data"]
                ));
            }
        }
    }

    // And survives kill -9: the server restarts and serves the same values.
    let before = api.read_records("d", &[("limit", "1000")]).await;
    assert_no_panic(&server);
    server.kill9();
    let (status, stderr) = start_or_why(&data_dir, dir.path());
    match status {
        Some(server) => {
            let after = server.api().read_records("d", &[("limit", "1000")]).await;
            if after != before {
                failures.push(format!("after kill -9: {after:?}\n  before: {before:?}"));
            }
        }
        None => failures.push(format!(
            "the server does not start after kill -9 with these records in its log:\n{stderr}"
        )),
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
