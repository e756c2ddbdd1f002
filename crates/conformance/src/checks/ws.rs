//! The WebSocket protocol (`/v1/ws`): every request and reply type, in both encodings.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::live::View;
use super::topics::{append, topic};
use super::{arr, has, same, table, uint};
use crate::client::{reply_type, ws_error, Auth, Enc, Frame};
use crate::{ensure, fail, show, Ctx, R};

pub async fn upgrade_without_token_is_unauthorized(c: Arc<Ctx>) -> R {
    match c.ws_handshake(Some(Enc::Json), &Auth::None, "").await? {
        Ok(_) => fail!("the upgrade without a token was accepted"),
        Err((status, body)) => {
            ensure!(status == 401, "expected 401, got {status}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            same("code", &v["error"]["code"], &json!("unauthorized"))?;
            same("reason", &v["error"]["reason"], &json!("missing"))
        }
    }
}

pub async fn default_subprotocol_is_json(c: Arc<Ctx>) -> R {
    let mut ws = match c.ws_handshake(None, &Auth::Admin, "").await? {
        Ok(ws) => ws,
        Err((status, body)) => fail!("upgrade refused with {status}: {body}"),
    };
    ws.send_raw(Message::text(
        json!({"id": "p", "type": "ping"}).to_string(),
    ))
    .await?;
    match ws.frame().await? {
        Frame::Msg { value, text: true } => reply_type(&value, "pong"),
        other => fail!("expected a JSON text frame, got {other:?}"),
    }
}

pub async fn access_token_parameter_authenticates_the_upgrade(c: Arc<Ctx>) -> R {
    let token = match super::client(&c, None, json!({})) {
        Ok((t, _)) => t,
        Err(_) => c.opts.token.clone(),
    };
    let mut ws = c
        .ws_as(Enc::Json, &Auth::None, &format!("?access_token={token}"))
        .await?;
    let v = ws.request(json!({"id": 1, "type": "ping"})).await?;
    reply_type(&v, "pong")
}

pub async fn negotiates_the_subprotocol(c: Arc<Ctx>, enc: Enc) -> R {
    let ws = c.ws(enc).await?;
    same(
        "Sec-WebSocket-Protocol",
        &json!(ws.negotiated),
        &json!(enc.subprotocol()),
    )
}

pub async fn ping_answers_pong_with_seq(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let v = ws.request(json!({"id": 3, "type": "ping"})).await?;
    reply_type(&v, "pong")?;
    uint(&v, "seq")?;
    Ok(())
}

async fn items(c: &Ctx) -> R<String> {
    table(
        c,
        "wsitems",
        "id INTEGER PRIMARY KEY, label TEXT, n INTEGER",
    )
    .await
}

pub async fn query_answers_result_with_columns_types_rows(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "label": "a", "n": 5}}]))
        .await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 4, "type": "query", "sql": format!("SELECT id, label FROM {t} WHERE n = $1"), "params": [5]}))
        .await?;
    reply_type(&v, "result")?;
    uint(&v, "seq")?;
    same("columns", &v["columns"], &json!(["id", "label"]))?;
    same("rows", &v["rows"], &json!([{"id": 1, "label": "a"}]))?;
    same("types", &v["types"], &json!(["integer", "text"]))
}

pub async fn mutate_answers_results(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 2, "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": 1}}], "durability": "disk"}))
        .await?;
    reply_type(&v, "result")?;
    let s = uint(&v, "seq")?;
    same(
        "results",
        &v["results"],
        &json!([{"table": t, "id": 1, "version": s}]),
    )
}

pub async fn mutate_error_carries_code_and_op(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1}}]))
        .await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": "m", "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": 2}}, {"op": "insert", "table": t, "row": {"id": 1}}]}))
        .await?;
    let e = ws_error(&v, "already_exists")?;
    same("op", &e["op"], &json!(1))?;
    let v = ws
        .request(json!({"id": "s", "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": 3, "nope": 1}}]}))
        .await?;
    ws_error(&v, "schema")?;
    let v = ws
        .request(
            json!({"id": "n", "type": "mutate", "ops": [{"op": "delete", "table": t, "id": 99}]}),
        )
        .await?;
    ws_error(&v, "not_found")?;
    let v = ws
        .request(json!({"id": "b", "type": "mutate", "ops": "none"}))
        .await?;
    ws_error(&v, "bad_request")?;
    Ok(())
}

pub async fn call_answers_result(c: Arc<Ctx>, enc: Enc) -> R {
    super::sql::load_module(&c).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 1, "type": "call", "name": format!("{}_echo", c.prefix), "args": {"k": 1}}))
        .await?;
    reply_type(&v, "result")?;
    uint(&v, "seq")?;
    same("result", &v["result"], &json!({"got": {"k": 1}}))?;
    let t = items(&c).await?;
    let v = ws
        .request(json!({"id": 2, "type": "call", "name": format!("{}_write_then_throw", c.prefix), "args": {"table": t, "id": 1}}))
        .await?;
    let e = ws_error(&v, "function_error")?;
    same("message", &e["message"], &json!("conformance says no"))
}

pub async fn call_of_unknown_function_is_not_found(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(
            json!({"id": 1, "type": "call", "name": format!("{}_missing", c.prefix), "args": null}),
        )
        .await?;
    ws_error(&v, "not_found")?;
    Ok(())
}

fn is_event(v: &Value, kind: &str, qid: &Value) -> bool {
    v["type"] == json!(kind) && v.get("qid") == Some(qid)
}

pub async fn subscribe_sends_snapshot_then_diffs(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "label": "a", "n": 1}}]))
        .await?;
    let mut ws = c.ws(enc).await?;
    let qid = json!("inbox");
    ws.send(&json!({"id": 5, "type": "subscribe", "qid": qid, "sql": format!("SELECT id, label FROM {t} ORDER BY id")}))
        .await?;
    let snap = ws
        .until("the snapshot", |v| v["type"] != json!("pong"))
        .await?;
    ensure!(
        is_event(&snap, "snapshot", &qid),
        "expected a snapshot for qid inbox, got {}",
        show(&snap)
    );
    let mut view = View::default();
    view.snapshot(&snap)?;
    same(
        "snapshot types",
        &snap["types"],
        &json!(["integer", "text"]),
    )?;
    let v = c
        .mutate(json!([{"op": "insert", "table": t, "row": {"id": 0, "label": "z", "n": 1}}]))
        .await?;
    let diff = ws.until("a diff", |v| is_event(v, "diff", &qid)).await?;
    same("diff seq", &diff["seq"], &v["seq"])?;
    same(
        "changes",
        &diff["changes"],
        &json!([{"op": "add", "key": 0, "row": {"id": 0, "label": "z"}, "index": 0}]),
    )?;
    view.diff(&diff)
}

pub async fn subscribe_resumes_with_since(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    let sql = format!("SELECT id, label FROM {t}");
    let mut ws = c.ws(enc).await?;
    let qid = json!(7);
    ws.send(&json!({"id": 1, "type": "subscribe", "qid": qid, "sql": sql}))
        .await?;
    ws.until("the snapshot", |v| is_event(v, "snapshot", &qid))
        .await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "label": "a"}}]))
        .await?;
    let d = ws.until("a diff", |v| is_event(v, "diff", &qid)).await?;
    let last = uint(&d, "seq")?;
    ws.close().await;
    let missed = c
        .mutate(json!([{"op": "insert", "table": t, "row": {"id": 2, "label": "b"}}]))
        .await?;
    let mut ws = c.ws(enc).await?;
    ws.send(&json!({"id": 2, "type": "subscribe", "qid": qid, "sql": sql, "since": last}))
        .await?;
    let e = ws
        .until("the resumed events", |v| v.get("qid") == Some(&qid))
        .await?;
    ensure!(
        e["type"] == json!("diff"),
        "expected exactly the missed diff, got {}",
        show(&e)
    );
    same("resumed seq", &e["seq"], &missed["seq"])?;
    same(
        "changes",
        &e["changes"],
        &json!([{"op": "add", "key": 2, "row": {"id": 2, "label": "b"}}]),
    )
}

pub async fn refused_subscribe_carries_id_and_qid(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 9, "type": "subscribe", "qid": "q", "sql": format!("SELECT id FROM {}", c.name("missing"))}))
        .await?;
    ws_error(&v, "not_found")?;
    same("qid", &v["qid"], &json!("q"))
}

pub async fn unsubscribe_answers_unsubscribed_and_stops_events(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    let mut ws = c.ws(enc).await?;
    let qid = json!("u");
    ws.send(
        &json!({"id": 1, "type": "subscribe", "qid": qid, "sql": format!("SELECT id FROM {t}")}),
    )
    .await?;
    ws.until("the snapshot", |v| is_event(v, "snapshot", &qid))
        .await?;
    let v = ws
        .request(json!({"id": 6, "type": "unsubscribe", "qid": qid}))
        .await?;
    reply_type(&v, "unsubscribed")?;
    same("qid", &v["qid"], &qid)?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1}}]))
        .await?;
    // No event of the ended subscription may arrive (checked up to the pong of a ping).
    ws.send(&json!({"id": "after", "type": "ping"})).await?;
    loop {
        let v = ws.recv().await?;
        ensure!(
            v.get("qid") != Some(&qid),
            "an event after unsubscribed: {}",
            show(&v)
        );
        if v["id"] == json!("after") {
            return reply_type(&v, "pong");
        }
    }
}

pub async fn client_watch_without_rules_is_forbidden(c: Arc<Ctx>, enc: Enc) -> R {
    let (token, _) = super::client(&c, None, json!({}))?;
    let t = topic(&c, json!({})).await?;
    let mut ws = c.ws_as(enc, &Auth::Bearer(token), "").await?;
    let v = ws
        .request(json!({"id": 1, "type": "watch", "qid": "w", "topic": t}))
        .await?;
    ws_error(&v, "forbidden")?;
    let v = ws
        .request(json!({"id": 2, "type": "append", "topic": t, "records": [{"data": 1}]}))
        .await?;
    ws_error(&v, "forbidden")?;
    Ok(())
}

pub async fn append_answers_first_and_last(c: Arc<Ctx>, enc: Enc) -> R {
    let t = topic(&c, json!({})).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 7, "type": "append", "topic": t, "records": [{"tags": ["room:7"], "data": {"text": "hi"}}, {"data": 2}], "durability": "fsync"}))
        .await?;
    reply_type(&v, "result")?;
    uint(&v, "seq")?;
    same("first", &v["first"], &json!(0))?;
    same("last", &v["last"], &json!(1))
}

pub async fn watch_answers_watching_then_records(c: Arc<Ctx>, enc: Enc) -> R {
    let t = topic(&c, json!({})).await?;
    append(
        &c,
        &t,
        json!([{"tags": ["user:42"], "data": 0}, {"tags": ["other"], "data": 1}]),
    )
    .await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 8, "type": "watch", "qid": "w1", "topic": t, "from": 0, "tags": ["user:42", "room:*"]}))
        .await?;
    reply_type(&v, "watching")?;
    same(
        "watching",
        &json!({"qid": v["qid"], "topic": v["topic"], "next": v["next"]}),
        &json!({"qid": "w1", "topic": t, "next": 0}),
    )?;
    let r = ws
        .until("a record", |v| v["type"] == json!("record"))
        .await?;
    has(&r, &["topic", "offset", "ts", "tags", "data"])?;
    same(
        "record",
        &json!([r["topic"].clone(), r["offset"].clone(), r["data"].clone()]),
        &json!([t, 0, 0]),
    )?;
    append(
        &c,
        &t,
        json!([{"tags": ["other"], "data": 2}, {"tags": ["room:1"], "data": 3}]),
    )
    .await?;
    let r = ws
        .until("a record", |v| v["type"] == json!("record"))
        .await?;
    same("next matching offset", &r["offset"], &json!(3))
}

pub async fn second_watch_of_a_topic_is_already_exists(c: Arc<Ctx>, enc: Enc) -> R {
    let t = topic(&c, json!({})).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 1, "type": "watch", "qid": "a", "topic": t}))
        .await?;
    reply_type(&v, "watching")?;
    let v = ws
        .request(json!({"id": 2, "type": "watch", "qid": "b", "topic": t}))
        .await?;
    ws_error(&v, "already_exists")?;
    Ok(())
}

pub async fn unwatch_answers_unwatched(c: Arc<Ctx>, enc: Enc) -> R {
    let t = topic(&c, json!({})).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 1, "type": "watch", "qid": "w", "topic": t}))
        .await?;
    reply_type(&v, "watching")?;
    let v = ws
        .request(json!({"id": 9, "type": "unwatch", "qid": "w"}))
        .await?;
    reply_type(&v, "unwatched")?;
    same("qid", &v["qid"], &json!("w"))?;
    // The topic may be watched again on this connection.
    let v = ws
        .request(json!({"id": 2, "type": "watch", "qid": "w2", "topic": t}))
        .await?;
    reply_type(&v, "watching")
}

pub async fn watch_of_unknown_topic_is_not_found(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 1, "type": "watch", "qid": "w", "topic": c.name("missing")}))
        .await?;
    ws_error(&v, "not_found")?;
    Ok(())
}

pub async fn pipelined_requests_are_answered_by_id(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    let mut ws = c.ws(enc).await?;
    let mut ids = Vec::new();
    for i in 0..30 {
        let id = match i % 3 {
            0 => json!(i),
            1 => json!(format!("req-{i}")),
            _ => json!(i as f64 + 0.5),
        };
        let req = match i % 3 {
            0 => json!({"id": id, "type": "ping"}),
            1 => {
                json!({"id": id, "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": i}}]})
            }
            _ => {
                json!({"id": id, "type": "query", "sql": format!("SELECT COUNT(*) AS k FROM {t}")})
            }
        };
        ws.send(&req).await?;
        ids.push(id);
    }
    let mut answered = Vec::new();
    while answered.len() < ids.len() {
        let v = ws.recv().await?;
        let id = v["id"].clone();
        ensure!(
            ids.contains(&id),
            "a reply with an id nobody sent: {}",
            show(&v)
        );
        ensure!(!answered.contains(&id), "two replies to id {id}");
        ensure!(v["type"] != json!("error"), "an error: {}", show(&v));
        answered.push(id);
    }
    // Writes from one connection apply in request order.
    let q = c
        .post(
            "/v1/query",
            json!({"sql": format!("SELECT COUNT(*) AS k FROM {t}")}),
        )
        .await?;
    same("rows written", &q["rows"], &json!([{"k": 10}]))
}

pub async fn undecodable_frame_is_error_with_null_id_and_connection_stays(
    c: Arc<Ctx>,
    enc: Enc,
) -> R {
    let mut ws = c.ws(enc).await?;
    let garbage = match enc {
        Enc::Json => Message::text("{\"id\": 1, \"type\": "),
        Enc::Msgpack => Message::binary(vec![0xc1u8, 0x00, 0x01]),
    };
    ws.send_raw(garbage).await?;
    let v = ws.recv().await?;
    ws_error(&v, "bad_request")?;
    same("id", v.get("id").unwrap_or(&json!("missing")), &Value::Null)?;
    let v = ws.request(json!({"id": 2, "type": "ping"})).await?;
    reply_type(&v, "pong")
}

pub async fn other_encoding_frame_is_decoded_too(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let other = match enc {
        Enc::Json => Enc::Msgpack,
        Enc::Msgpack => Enc::Json,
    };
    ws.send_raw(other.encode(&json!({"id": "x", "type": "ping"})))
        .await?;
    // The answer comes in the negotiated encoding (recv checks the frame kind).
    let v = ws.reply(&json!("x")).await?;
    reply_type(&v, "pong")
}

pub async fn unknown_type_is_bad_request(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let v = ws.request(json!({"id": 1, "type": "teleport"})).await?;
    ws_error(&v, "bad_request")?;
    Ok(())
}

pub async fn missing_type_is_bad_request(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    ws.send(&json!({"id": 1, "sql": "SELECT 1"})).await?;
    let v = ws.recv().await?;
    ws_error(&v, "bad_request")?;
    ensure!(
        v["id"] == json!(1) || v["id"].is_null(),
        "the error answers id {}",
        v["id"]
    );
    Ok(())
}

pub async fn nesting_deeper_than_128_is_bad_request(c: Arc<Ctx>, enc: Enc) -> R {
    let mut ws = c.ws(enc).await?;
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    ws.send(&json!({"id": 1, "type": "query", "sql": "SELECT 1", "params": deep}))
        .await?;
    let v = ws.recv().await?;
    ws_error(&v, "bad_request")?;
    let v = ws.request(json!({"id": 2, "type": "ping"})).await?;
    reply_type(&v, "pong")
}

pub async fn unsupported_query_is_unsupported(c: Arc<Ctx>, enc: Enc) -> R {
    let t = items(&c).await?;
    let mut ws = c.ws(enc).await?;
    let v = ws
        .request(json!({"id": 1, "type": "query", "sql": format!("SELECT id FROM {t} UNION SELECT id FROM {t}")}))
        .await?;
    let e = ws_error(&v, "unsupported")?;
    ensure!(
        e["message"]
            .as_str()
            .unwrap_or("")
            .to_uppercase()
            .contains("UNION"),
        "the message does not name UNION: {}",
        show(&e)
    );
    let _ = arr;
    Ok(())
}

pub async fn client_mutate_refused_is_forbidden(c: Arc<Ctx>, enc: Enc) -> R {
    let (token, sub) = super::client(&c, None, json!({}))?;
    let t = table(&c, "own", "id INTEGER PRIMARY KEY, owner TEXT").await?;
    c.sql(&format!("CREATE POLICY write_own ON {t} FOR ALL USING (owner = auth.sub) WITH CHECK (owner = auth.sub)")).await?;
    let mut ws = c.ws_as(enc, &Auth::Bearer(token), "").await?;
    let v = ws
        .request(json!({"id": 1, "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": 1, "owner": sub}}]}))
        .await?;
    reply_type(&v, "result")?;
    let v = ws
        .request(json!({"id": 2, "type": "mutate", "ops": [{"op": "insert", "table": t, "row": {"id": 2, "owner": "someone-else"}}]}))
        .await?;
    let e = ws_error(&v, "forbidden")?;
    same("table", &e["table"], &json!(t))?;
    same("policies", &e["policies"], &json!(["write_own"]))
}

pub async fn frame_over_max_body_bytes_is_limit_and_connection_stays(c: Arc<Ctx>) -> R {
    let Some(max) = c.opts.server.max_body_bytes else {
        crate::skip!("needs the server's --max-body-bytes, passed to the suite");
    };
    let mut ws = c.ws(Enc::Json).await?;
    let pad = "x".repeat(max as usize + 1024);
    ws.send(&json!({"id": 1, "type": "ping", "pad": pad}))
        .await?;
    let v = ws.recv().await?;
    let e = ws_error(&v, "limit")?;
    super::names(&e, &["max-body-bytes"])?;
    let v = ws.request(json!({"id": 2, "type": "ping"})).await?;
    reply_type(&v, "pong")
}

pub async fn frame_over_twice_max_body_bytes_closes_the_connection(c: Arc<Ctx>) -> R {
    let Some(max) = c.opts.server.max_body_bytes else {
        crate::skip!("needs the server's --max-body-bytes, passed to the suite");
    };
    let size = (2 * max).max(1 << 20) as usize + 1024;
    if size > 40 << 20 {
        crate::skip!("--max-body-bytes is large: a {size}-byte frame is too much to send");
    }
    let ws = c.ws(Enc::Json).await?;
    let frame = Enc::Json.encode(&json!({"id": 1, "type": "ping", "pad": "x".repeat(size)}));
    // Write and read at once: the server may close while the frame is still being written.
    use futures_util::{SinkExt, StreamExt};
    let (mut sink, mut stream) = ws.stream.split();
    let writer = tokio::spawn(async move {
        let _ = sink.send(frame).await;
        sink
    });
    let mut outcome = None;
    while let Ok(Some(next)) =
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await
    {
        match next {
            Ok(Message::Close(Some(close))) => {
                outcome = Some((u16::from(close.code), close.reason.to_string()));
                break;
            }
            Ok(Message::Close(None)) => fail!("a close frame without a code or reason"),
            Ok(Message::Text(t)) => fail!("expected a close frame, got {t}"),
            Ok(_) => continue,
            Err(e) => fail!("expected a close frame, the connection broke: {e}"),
        }
    }
    writer.abort();
    match outcome {
        Some((code, reason)) => {
            ensure!(
                !reason.is_empty(),
                "the close frame (code {code}) says no reason"
            );
            Ok(())
        }
        None => fail!("the connection ended without a close frame"),
    }
}

pub async fn subscriptions_over_the_per_connection_limit_are_limit(c: Arc<Ctx>) -> R {
    let n = match c.opts.server.live_subscriptions_per_connection {
        Some(n) if n <= 64 => n,
        _ => crate::skip!(
            "needs a small --live-subscriptions-per-connection (≤ 64), passed to the suite"
        ),
    };
    let t = items(&c).await?;
    let mut ws = c.ws(Enc::Json).await?;
    for i in 0..n {
        ws.send(&json!({"id": i, "type": "subscribe", "qid": i, "sql": format!("SELECT id FROM {t} WHERE n = {i}")}))
            .await?;
        ws.until("a snapshot", |v| {
            v["type"] == json!("snapshot") && v["qid"] == json!(i)
        })
        .await?;
    }
    let v = ws
        .request(json!({"id": "over", "type": "subscribe", "qid": "over", "sql": format!("SELECT id FROM {t}")}))
        .await?;
    let e = ws_error(&v, "limit")?;
    super::names(&e, &["live-subscriptions-per-connection"])
}

pub async fn client_subscription_ends_with_rules_changed(c: Arc<Ctx>, enc: Enc) -> R {
    let (token, sub) = super::client(&c, None, json!({}))?;
    let t = table(&c, "own", "id INTEGER PRIMARY KEY, owner TEXT, body TEXT").await?;
    c.sql(&format!(
        "CREATE POLICY mine ON {t} FOR SELECT USING (owner = auth.sub)"
    ))
    .await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "owner": sub}}]))
        .await?;
    let mut ws = c.ws_as(enc, &Auth::Bearer(token), "").await?;
    let qid = json!("mine");
    ws.send(
        &json!({"id": 1, "type": "subscribe", "qid": qid, "sql": format!("SELECT id FROM {t}")}),
    )
    .await?;
    let snap = ws
        .until("the snapshot", |v| v.get("qid") == Some(&qid))
        .await?;
    reply_type(&snap, "snapshot")?;
    same("rows", &snap["rows"], &json!([{"id": 1}]))?;
    // A policy reading a claim the old ones did not read: the view cannot follow.
    c.sql(&format!(
        "CREATE POLICY by_nick ON {t} FOR SELECT USING (body = auth.nick)"
    ))
    .await?;
    let e = ws
        .until("the rules_changed error", |v| v.get("qid") == Some(&qid))
        .await?;
    ws_error(&e, "rules_changed")?;
    Ok(())
}
