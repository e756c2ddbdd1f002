//! `/v1/ws`: the WebSocket protocol — request ids, many requests in flight per connection,
//! replies matched by id, JSON or MessagePack. Specified in `docs/protocol.md`.
//!
//! The reader queues each request for the writer in the order it arrived (so a client's
//! pipelined writes apply in its order) and hands the reply-to-be to the connection's sender,
//! which holds at most `ws_inflight_max` (`--ws-inflight-requests`) of them and writes replies in request
//! order as they complete; when it is full the reader stops reading, which pushes back on a
//! client that sends faster than replies drain.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use std::future::Future;
use std::pin::Pin;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use std::collections::HashMap;

use sluice_live::Subscribe;

use crate::api::{durability_of, parse_ops, query_json, ApiError};
use crate::auth::Caller;
use crate::core::{CallOk, Core, MutateOk};
use crate::error::{CoreError, WriterResult};
use crate::writer::Request;
use sluice_live::chunked::mp;

pub const JSON_PROTOCOL: &str = "sluice.json.v1";
pub const MSGPACK_PROTOCOL: &str = "sluice.msgpack.v1";

use crate::decode::{msgpack_value, KeptBody, KeyStr};

mod forward;
/// `get`: point reads by key or through an index.
mod get;
mod many;

/// A `call` request read straight into its fields, without a `Map` of the whole request
/// (the calls of `sluice bench transfer` are most frames a busy connection reads). Only
/// accepts: a frame this reader is unsure of — not an object, no `"type": "call"`, a field
/// twice, a non-string key or `name`, a `durability` that is not a known class — is read
/// again by the generic path, which decides it (and any refusal) exactly as before.
///
/// A MessagePack call keeps its `args` as the frame's bytes ([`sluice_functions::Msgpack`]:
/// checked here, built into JavaScript on the writer), when they are of the kinds that
/// decode to JSON one way; otherwise the generic path reads the frame.
#[derive(Debug, PartialEq)]
struct CallFrame {
    id: Value,
    name: String,
    args: sluice_functions::Args,
    durability: Option<sluice_log::Durability>,
}

impl CallFrame {
    /// The call in `message`, if it is one this reader takes (see [`CallFrame`]).
    fn read(message: &Message, body_max: usize) -> Option<CallFrame> {
        match message {
            Message::Text(text) if text.len() <= body_max => {
                serde_json::from_str::<CallFrame>(text.as_str()).ok()
            }
            Message::Binary(bytes) if bytes.len() <= body_max => CallFrame::read_msgpack(bytes),
            _ => None,
        }
    }

    /// A MessagePack call, as [`CallFrameVisitor`] reads one, its `args` kept as bytes.
    /// Every value is checked as [`sluice_functions::Msgpack::read`] checks `args` (a subset of
    /// what `rmp_serde` decodes into JSON, decoded the same way; only `args` is copied out):
    /// the rest is left to the generic path. So is a frame with bytes after its map.
    fn read_msgpack(frame: &[u8]) -> Option<CallFrame> {
        use sluice_functions::msgpack::{Reader, Token};
        use sluice_functions::{Args, Msgpack};
        let mut r = Reader::new(frame);
        let Token::Map(fields) = r.token()? else {
            return None;
        };
        let (mut call, mut id, mut name, mut args, mut durability) =
            (false, None, None, None, None);
        fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
            slot.replace(value).is_none().then_some(())
        }

        for _ in 0..fields {
            let Token::Str(key) = r.token()? else {
                return None;
            };
            match key {
                b"type" => {
                    if call || r.token()? != Token::Str(b"call") {
                        return None;
                    }
                    call = true;
                }
                b"id" => {
                    let mut again = r.clone();
                    r.check_value()?;
                    once(&mut id, again.json_value()?)?
                }
                b"name" => match r.token()? {
                    Token::Str(text) => {
                        once(&mut name, std::str::from_utf8(text).ok()?.to_owned())?
                    }
                    _ => return None,
                },
                b"args" => {
                    let (kept, end) = Msgpack::read(frame, r.position())?;
                    r.seek(end);
                    once(&mut args, Args::Msgpack(kept))?
                }
                b"durability" => {
                    let class = match r.token()? {
                        Token::Nil => None,
                        Token::Str(class) => Some(
                            std::str::from_utf8(class)
                                .ok()?
                                .parse::<sluice_log::Durability>()
                                .ok()?,
                        ),
                        _ => return None,
                    };
                    once(&mut durability, class)?;
                }
                _ => r.check_value()?,
            }
        }
        if r.position() != frame.len() || !call {
            return None;
        }
        Some(CallFrame {
            id: id.unwrap_or(Value::Null),
            name: name?,
            args: args.unwrap_or(Args::Json(Value::Null)),
            durability: durability.flatten(),
        })
    }
}

impl<'de> serde::Deserialize<'de> for CallFrame {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(CallFrameVisitor)
    }
}

struct CallFrameVisitor;

impl<'de> serde::de::Visitor<'de> for CallFrameVisitor {
    type Value = CallFrame;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a call request")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<CallFrame, A::Error> {
        use serde::de::Error;
        let (mut call, mut id, mut name, mut args, mut durability) =
            (false, None, None, None, None);
        fn once<T, E: Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(E::custom("a field twice")),
            }
        }
        while let Some(key) = map.next_key::<KeyStr<'de>>()? {
            match key.as_str() {
                "type" => {
                    let kind: KeyStr<'de> = map.next_value()?;
                    if call || kind.as_str() != "call" {
                        return Err(A::Error::custom("not a call"));
                    }
                    call = true;
                }
                "id" => once(&mut id, map.next_value::<Value>()?)?,
                "name" => once(&mut name, map.next_value::<KeyStr<'de>>()?.into_string())?,
                "args" => once(&mut args, map.next_value::<Value>()?)?,
                "durability" => {
                    let class = match map.next_value::<Option<KeyStr<'de>>>()? {
                        None => None,
                        Some(class) => Some(
                            class
                                .as_str()
                                .parse::<sluice_log::Durability>()
                                .map_err(A::Error::custom)?,
                        ),
                    };
                    once(&mut durability, class)?;
                }
                // Read as the generic path reads it: a value it could not hold is its
                // refusal to make.
                _ => {
                    map.next_value::<Value>()?;
                }
            }
        }
        match (call, name) {
            (true, Some(name)) => Ok(CallFrame {
                id: id.unwrap_or(Value::Null),
                name,
                args: sluice_functions::Args::Json(args.unwrap_or(Value::Null)),
                durability: durability.flatten(),
            }),
            _ => Err(A::Error::custom("not a whole call")),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Json,
    Msgpack,
}

/// Bytes a WebSocket connection reads at once (and reserves for it).
const WS_READ_BUFFER_BYTES: usize = 16 << 10;

pub(crate) async fn upgrade(
    State(core): State<Arc<Core>>,
    axum::Extension(caller): axum::Extension<Caller>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    // A plain GET (or a broken handshake) gets a JSON error like every other route.
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return axum::response::IntoResponse::into_response(ApiError::bad_request(format!(
                "/v1/ws needs a WebSocket upgrade request: {}",
                e.body_text()
            )))
        }
    };
    let guard = match core.authenticator().connect(&caller) {
        Ok(guard) => guard,
        Err(e) => return axum::response::IntoResponse::into_response(e),
    };
    // Frames above the body limit get a structured error; far above it, the frame is a
    // protocol violation and the connection is closed with a reason.
    let hard_max = core.config().body_bytes_max.saturating_mul(2).max(1 << 20);
    let ws = ws
        .protocols([MSGPACK_PROTOCOL, JSON_PROTOCOL])
        .max_message_size(hard_max)
        .max_frame_size(hard_max)
        // tungstenite reserves its read buffer up front (128 KiB by default): with one
        // WebSocket per browser tab, 10 000 clients would hold 1.3 GB of empty buffers.
        // Larger frames are still read, in more chunks.
        .read_buffer_size(WS_READ_BUFFER_BYTES);
    let encoding = match ws.selected_protocol() {
        Some(p) if p.as_bytes() == MSGPACK_PROTOCOL.as_bytes() => Encoding::Msgpack,
        _ => Encoding::Json,
    };
    ws.on_upgrade(move |socket| async move {
        // The guard counts this connection against the caller's while it is open.
        connection(core, socket, encoding, caller).await;
        drop(guard);
    })
}

/// A reply as the connection's sender writes it: a JSON value, or a call's result, which is
/// encoded straight from its parts (no JSON object is built for it).
enum Outgoing {
    Value(Value),
    CallResult {
        id: Value,
        seq: u64,
        result: Value,
    },
    /// A mutate's success: `{"type": "result", "seq", "results", "id"}`.
    MutateResult {
        id: Value,
        ok: MutateOk,
    },
    /// Encoded already (a `get`'s reply, from the row's typed values).
    Encoded(Message),
}

/// The fields of a mutate's result reply, in the order (and so with the bytes) of the JSON
/// object it replaces: the reference the hand-written replies are tested against.
#[cfg(test)]
#[derive(serde::Serialize)]
struct MutateResult<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    results: crate::api::ResultsSer<'a>,
    id: &'a Value,
}

/// The fields of a call's result reply, in the order (and so with the bytes) of the JSON
/// object it replaces: `{"type": "result", "seq", "result", "id"}`. The reference
/// [`call_result`] is tested against.
#[cfg(test)]
#[derive(serde::Serialize)]
struct CallResult<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    result: &'a Value,
    id: &'a Value,
}

fn encode_reply(encoding: Encoding, reply: Outgoing) -> Message {
    let reply = match reply {
        Outgoing::Encoded(message) => return message,
        other => other,
    };
    let (id, seq, result) = match &reply {
        Outgoing::Value(value) => return encode(encoding, value),
        Outgoing::Encoded(_) => unreachable!("returned above"),
        Outgoing::CallResult { id, seq, result } => (id, *seq, result),
        Outgoing::MutateResult { id, ok } if encoding == Encoding::Json => {
            return Message::Text(mutate_result_json(id, ok.seq, &ok.results).into());
        }
        Outgoing::MutateResult { id, ok } => {
            return Message::Binary(mutate_result_msgpack(id, ok.seq, &ok.results).into());
        }
    };
    call_result(encoding, id, seq, result)
}

/// A call's result reply, `{"type": "result", "seq", "result", "id"}`, written by hand around
/// its two values: the bytes `serde_json` and `rmp_serde` make of [`CallResult`] (a test
/// holds them equal). Through `rmp_serde`'s struct serializer the reply to a `transfer`
/// call cost ~1 500 instructions, 15 % of a call's work on the connection's task
/// (callgrind, `sluice bench transfer`'s `sluice-ws` under valgrind).
fn call_result(encoding: Encoding, id: &Value, seq: u64, result: &Value) -> Message {
    match encoding {
        Encoding::Json => {
            let mut out = Vec::with_capacity(64);
            out.extend_from_slice(b"{\"type\":\"result\",\"seq\":");
            out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
            out.extend_from_slice(b",\"result\":");
            crate::api::json_value(&mut out, result);
            out.extend_from_slice(b",\"id\":");
            crate::api::json_value(&mut out, id);
            out.push(b'}');
            Message::Text(String::from_utf8(out).expect("JSON text is UTF-8").into())
        }
        Encoding::Msgpack => {
            // A map of four (`fixmap`), its keys as `fixstr`s, as `to_vec_named` writes them.
            let mut out = Vec::with_capacity(48);
            out.extend_from_slice(b"\x84\xa4type\xa6result\xa3seq");
            mp::uint(seq, &mut out);
            out.extend_from_slice(b"\xa6result");
            mp::json(result, &mut out);
            out.extend_from_slice(b"\xa2id");
            mp::json(id, &mut out);
            Message::Binary(out.into())
        }
    }
}

/// A mutate's result reply in JSON, `{"type": "result", "seq", "results", "id"}`: the text
/// `serde_json` makes of [`MutateResult`], with the results written by hand (see
/// [`crate::api::mutate_reply_json`]).
fn mutate_result_json(id: &Value, seq: u64, results: &[sluice_engine::WriteResult]) -> String {
    let mut out = Vec::with_capacity(64 + results.len() * 48);
    out.extend_from_slice(b"{\"type\":\"result\",\"seq\":");
    out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
    out.extend_from_slice(b",\"results\":");
    crate::api::write_results_json(results, &mut out);
    out.extend_from_slice(b",\"id\":");
    crate::api::json_value(&mut out, id);
    out.push(b'}');
    String::from_utf8(out).expect("JSON text is UTF-8")
}

/// A mutate's result reply in MessagePack: the bytes `rmp_serde::to_vec_named` makes of
/// [`MutateResult`] (a test holds them equal), written with the chunks' MessagePack writers
/// (`sluice_live::chunked::mp`, shortest forms as `rmp` picks them); a run of one table's
/// results encodes the name once and copies it after that.
fn mutate_result_msgpack(id: &Value, seq: u64, results: &[sluice_engine::WriteResult]) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + results.len() * 32);
    out.extend_from_slice(b"\x84\xa4type\xa6result\xa3seq");
    mp::uint(seq, &mut out);
    out.extend_from_slice(b"\xa7results");
    mp::array_len(results.len(), &mut out);
    let mut last = None;
    for r in results {
        out.extend_from_slice(b"\x83\xa5table");
        crate::api::push_table_name(&mut out, &mut last, &r.table, |out, name| {
            mp::str(name, out)
        });
        out.extend_from_slice(b"\xa2id");
        match &r.key {
            sluice_engine::Key::Int(i) => mp::int(*i, &mut out),
            sluice_engine::Key::Text(t) => mp::str(t, &mut out),
        }
        out.extend_from_slice(b"\xa7version");
        mp::uint(r.version, &mut out);
    }
    out.extend_from_slice(b"\xa2id");
    mp::json(id, &mut out);
    out
}

/// A reply serialised straight from its parts.
fn encode_parts(encoding: Encoding, reply: &impl serde::Serialize) -> Message {
    match encoding {
        Encoding::Json => match serde_json::to_string(reply) {
            Ok(text) => Message::Text(text.into()),
            Err(e) => encode_failed(e.to_string()),
        },
        Encoding::Msgpack => match rmp_serde::to_vec_named(reply) {
            Ok(bytes) => Message::Binary(bytes.into()),
            Err(e) => encode_failed(e.to_string()),
        },
    }
}

fn encode_failed(message: String) -> Message {
    Message::Text(
        json!({"type": "error", "id": null, "error": {"code": "internal", "message": message}})
            .to_string()
            .into(),
    )
}

fn encode(encoding: Encoding, value: &Value) -> Message {
    match encoding {
        Encoding::Json => Message::Text(value.to_string().into()),
        Encoding::Msgpack => match rmp_serde::to_vec_named(value) {
            Ok(bytes) => Message::Binary(bytes.into()),
            Err(e) => Message::Text(
                json!({"type": "error", "id": null, "error": {"code": "internal", "message": e.to_string()}})
                    .to_string()
                    .into(),
            ),
        },
    }
}

/// The close frame for a frame the connection could not read: 1009 (too big) naming the
/// limit, or 1002 (protocol error) with the reason, cut to what a close frame holds.
fn violation_frame(error: &str, body_max: usize) -> CloseFrame {
    let too_big = ["Space limit", "too long", "too big", "Capacity"]
        .iter()
        .any(|s| error.contains(s));
    let (code, reason) = if too_big {
        let hard_max = body_max.saturating_mul(2).max(1 << 20);
        (
            close_code::SIZE,
            format!("frame over {hard_max} bytes (twice --max-body-bytes, at least 1 MiB)"),
        )
    } else {
        (close_code::PROTOCOL, format!("protocol violation: {error}"))
    };
    // A close frame's reason is at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code,
        reason: reason[..end].to_string().into(),
    }
}

fn error_reply(id: &Value, e: ApiError) -> Value {
    let mut error = Map::new();
    error.insert("code".into(), Value::from(e.code));
    error.insert("message".into(), Value::from(e.message));
    error.extend(e.details);
    json!({"id": id, "type": "error", "error": error})
}

/// A reply still to come, or already there.
type ReplyFuture = Pin<Box<dyn Future<Output = Outgoing> + Send>>;

/// A topic watch's messages (`watching`, records, a final `error`), polled by the
/// connection's sender itself: a record goes from the watch's queue to the socket with no
/// task in between.
type WatchStream = futures_util::stream::BoxStream<'static, Message>;

async fn connection(core: Arc<Core>, socket: WebSocket, encoding: Encoding, caller: Caller) {
    let (mut sink, mut stream) = socket.split();
    // The reader hands each request's reply-to-be to the sender in arrival order; the sender
    // keeps at most `ws_inflight_max` of them and writes replies in that order
    // (the writer applies a connection's requests in that order anyway), flushing once per
    // batch of ready replies. No task per request.
    let inflight_max = core.config().ws_inflight_max;
    let outbound_max = core.config().ws_outbound_max;
    let counters = core.clone();
    counters
        .counters()
        .ws_connections
        .fetch_add(1, Ordering::Relaxed);
    let (pending_tx, mut pending_rx) = mpsc::channel::<ReplyFuture>(outbound_max);
    // Live-query events, from one forwarding task per subscription.
    let (events_tx, mut events_rx) = mpsc::channel::<Message>(outbound_max);
    // New topic watches, handed to the sender (which polls them all).
    let (watches_tx, mut watches_rx) = mpsc::unbounded_channel::<WatchStream>();
    let sender_closing = core.closing();
    // A frame the reader cannot take (over twice --max-body-bytes) ends the connection with
    // a close frame saying why, sent by the sender after the replies in flight.
    let (violation_tx, mut violation_rx) = tokio::sync::oneshot::channel::<CloseFrame>();
    let sender = tokio::spawn(async move {
        let mut inflight = Inflight {
            replies: FuturesOrdered::new(),
            core: counters,
        };
        let mut open = true;
        let mut watching = futures_util::stream::SelectAll::<WatchStream>::new();
        loop {
            tokio::select! {
                biased;
                Some(watch) = watches_rx.recv() => watching.push(watch),
                Some(reply) = inflight.replies.next(), if !inflight.replies.is_empty() => {
                    let mut answered = 1;
                    let mut fed = sink.feed(encode_reply(encoding, reply)).await.is_ok();
                    while fed {
                        let Some(Some(reply)) = inflight.replies.next().now_or_never() else {
                            break;
                        };
                        answered += 1;
                        fed = sink.feed(encode_reply(encoding, reply)).await.is_ok();
                    }
                    // One update of the shared gauge per batch of replies, not per reply.
                    inflight.answered(answered);
                    if !fed {
                        return;
                    }
                    if sink.flush().await.is_err() {
                        return;
                    }
                }
                Some(event) = events_rx.recv() => {
                    if sink.feed(event).await.is_err() {
                        return;
                    }
                    while let Ok(event) = events_rx.try_recv() {
                        if sink.feed(event).await.is_err() {
                            return;
                        }
                    }
                    if sink.flush().await.is_err() {
                        return;
                    }
                }
                Some(record) = watching.next(), if !watching.is_empty() => {
                    // Records ready together go out in one flush.
                    let mut fed = sink.feed(record).await.is_ok();
                    let mut n = 1;
                    while fed && n < WATCH_BATCH_MESSAGES_MAX {
                        let Some(Some(record)) = watching.next().now_or_never() else {
                            break;
                        };
                        fed = sink.feed(record).await.is_ok();
                        n += 1;
                    }
                    if !fed || sink.flush().await.is_err() {
                        return;
                    }
                }
                next = pending_rx.recv(), if open && inflight.replies.len() < inflight_max => {
                    match next {
                        Some(reply) => {
                            inflight.push(reply);
                            // Every request the reader handed over already joins now, so
                            // the replies ready together go out in one batch and one flush
                            // (one send syscall), not one flush per reply.
                            while inflight.replies.len() < inflight_max {
                                let Ok(reply) = pending_rx.try_recv() else {
                                    break;
                                };
                                inflight.push(reply);
                            }
                        }
                        None => open = false,
                    }
                }
                else => break,
            }
        }
        if let Ok(frame) = violation_rx.try_recv() {
            let _ = sink.send(Message::Close(Some(frame))).await;
        } else if *sender_closing.borrow() {
            let frame = CloseFrame {
                code: close_code::AWAY,
                reason: "the server is shutting down".into(),
            };
            let _ = sink.send(Message::Close(Some(frame))).await;
        }
        let _ = sink.close().await;
    });
    let body_max = core.config().body_bytes_max;
    let mut subs = Subscriptions::default();
    let mut watches = Watches::default();
    let ready = |v: Value| -> ReplyFuture { Box::pin(std::future::ready(Outgoing::Value(v))) };
    let mut closing = core.closing();
    loop {
        let message = tokio::select! {
            message = stream.next() => match message {
                Some(message) => message,
                None => break,
            },
            // Graceful shutdown: stop reading, finish the replies in flight, then close
            // with 1001 (going away) and a reason.
            _ = closing.wait_for(|&c| c) => break,
        };
        // A point read is answered from the read lock, without the writer.
        if let Some(reply) = get::fast(&core, &caller, &message, body_max, encoding) {
            if pending_tx.send(reply).await.is_err() {
                break;
            }
            continue;
        }
        // A call is read straight into its fields (the generic path reads what it does not
        // take).
        if let Ok(message) = &message {
            if let Some(call) = CallFrame::read(message, body_max) {
                let reply = enqueue_call(&core, &caller, call).await;
                if pending_tx.send(reply).await.is_err() {
                    break;
                }
                continue;
            }
        }
        // A mutate (text or MessagePack) is decoded straight into typed rows, as over
        // HTTP; anything the decoder is unsure of takes the general path below.
        if let Some(reply) = fast_mutate(&core, &caller, &message, body_max).await {
            if pending_tx.send(reply).await.is_err() {
                break;
            }
            continue;
        }
        // An append in a text frame skips the generic parse: its records keep their JSON
        // text (as over HTTP) instead of becoming values and being printed again.
        if let Ok(Message::Text(text)) = &message {
            if text.len() <= body_max {
                if let Some(reply) = fast_append(&core, &caller, text.as_str()).await {
                    if pending_tx.send(reply).await.is_err() {
                        break;
                    }
                    continue;
                }
            }
        }
        let parsed = match message {
            Ok(Message::Text(text)) => {
                if text.len() > body_max {
                    Err(too_big(text.len(), body_max))
                } else {
                    serde_json::from_str::<Value>(text.as_str())
                        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
                }
            }
            Ok(Message::Binary(bytes)) => {
                if bytes.len() > body_max {
                    Err(too_big(bytes.len(), body_max))
                } else {
                    msgpack_value(&bytes)
                        .map_err(|e| ApiError::bad_request(format!("malformed MessagePack: {e}")))
                }
            }
            Ok(Message::Close(_)) => break,
            Err(e) => {
                let _ = violation_tx.send(violation_frame(&e.to_string(), body_max));
                break;
            }
            Ok(_) => continue,
        };
        let reply = match parsed {
            Ok(Value::Object(mut request)) => {
                let id = request.get("id").cloned().unwrap_or(Value::Null);
                let kind = request.get("type").and_then(Value::as_str);
                if matches!(kind, Some("watch" | "unwatch")) {
                    let qid = request.get("qid").cloned().unwrap_or(Value::Null);
                    let outcome = if kind == Some("watch") {
                        let taken = subs.by_qid.contains_key(&qid.to_string());
                        watches
                            .watch(
                                &core,
                                &caller,
                                &request,
                                &watches_tx,
                                encoding,
                                subs.by_qid.len(),
                                taken,
                            )
                            .await
                            .map(|()| None)
                    } else {
                        watches.unwatch(&qid).map(Some)
                    };
                    // `watching` follows as an event
                    if let Err(e) = &outcome {
                        note_refusal(&core, e);
                    }
                    match qid_reply(outcome, id, qid) {
                        Some(reply) => ready(reply),
                        None => continue,
                    }
                } else if kind == Some("subscribe_many") {
                    // Each refused entry gets its own error (with its qid), then one
                    // `subscribed_many` reply; the snapshots follow as events.
                    let replies = subs
                        .subscribe_many(&core, &caller, &request, &events_tx, encoding, &watches)
                        .await
                        .unwrap_or_else(|e| {
                            note_refusal(&core, &e);
                            vec![error_reply(&id, e)]
                        });
                    for reply in replies {
                        if pending_tx.send(ready(reply)).await.is_err() {
                            break;
                        }
                    }
                    continue;
                } else if matches!(kind, Some("subscribe" | "unsubscribe")) {
                    let qid = request.get("qid").cloned().unwrap_or(Value::Null);
                    let outcome = if kind == Some("subscribe") {
                        subs.subscribe(&core, &caller, &request, &events_tx, encoding, &watches)
                            .await
                            .map(|()| None)
                    } else {
                        subs.unsubscribe(&qid).map(Some)
                    };
                    // the snapshot follows as an event
                    if let Err(e) = &outcome {
                        note_refusal(&core, e);
                    }
                    match qid_reply(outcome, id, qid) {
                        Some(reply) => ready(reply),
                        None => continue,
                    }
                } else if kind == Some("get") {
                    get::generic(&core, &caller, &request, encoding)
                } else {
                    match dispatch(&core, &caller, &mut request).await {
                        Ok(Pending::Now(mut reply)) => {
                            reply["id"] = id;
                            ready(reply)
                        }
                        Ok(pending) => {
                            let core = core.clone();
                            Box::pin(async move { pending.reply(&core, id).await })
                        }
                        Err(e) => {
                            note_refusal(&core, &e);
                            ready(error_reply(&id, e))
                        }
                    }
                }
            }
            Ok(_) => ready(error_reply(
                &Value::Null,
                ApiError::bad_request("a request must be an object"),
            )),
            Err(e) => ready(error_reply(&Value::Null, e)),
        };
        if pending_tx.send(reply).await.is_err() {
            break;
        }
    }
    subs.close_all();
    watches.close_all();
    drop(watches_tx);
    drop(events_tx);
    drop(pending_tx);
    let _ = sender.await;
}

/// Counts a refusal in `/metrics` as the HTTP middleware does for responses.
fn note_refusal(core: &Core, e: &ApiError) {
    match e.code {
        "forbidden" => core.authenticator().note_forbidden(),
        "limit" => {
            if let Some(flag) = crate::auth::limit_flag(&e.message) {
                core.authenticator().note_limit(flag);
            }
        }
        _ => {}
    }
}

/// The reply to a (un)subscribe or (un)watch: none when its first event is the answer, else
/// the reply or error carrying the request's `id` and `qid`.
fn qid_reply(outcome: Result<Option<Value>, ApiError>, id: Value, qid: Value) -> Option<Value> {
    match outcome {
        Ok(None) => None,
        Ok(Some(mut reply)) => {
            reply["id"] = id;
            Some(reply)
        }
        Err(e) => {
            let mut reply = error_reply(&id, e);
            reply["qid"] = qid;
            Some(reply)
        }
    }
}

/// A connection's replies in flight, counted in `/metrics` (`sluice_ws_inflight_requests`).
struct Inflight {
    replies: FuturesOrdered<ReplyFuture>,
    core: Arc<Core>,
}

impl Inflight {
    fn push(&mut self, reply: ReplyFuture) {
        self.core
            .counters()
            .ws_inflight
            .fetch_add(1, Ordering::Relaxed);
        self.replies.push_back(reply);
    }
    fn answered(&self, n: u64) {
        self.core
            .counters()
            .ws_inflight
            .fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.answered(self.replies.len() as u64);
        self.core
            .counters()
            .ws_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The live subscriptions of one connection, by `qid`.
#[derive(Default)]
struct Subscriptions {
    by_qid: HashMap<String, forward::Forwarded>,
    /// The connection's one forwarding task, started with its first subscription.
    forwarder: Option<forward::Forwarder>,
}

impl Subscriptions {
    async fn subscribe(
        &mut self,
        core: &Core,
        caller: &Caller,
        request: &Map<String, Value>,
        events: &mpsc::Sender<Message>,
        encoding: Encoding,
        watches: &Watches,
    ) -> Result<(), ApiError> {
        let qid = request
            .get("qid")
            .filter(|q| q.is_string() || q.is_number())
            .ok_or_else(|| ApiError::bad_request("a subscribe needs \"qid\" (a string or number)"))?
            .clone();
        let name = qid.to_string();
        self.prune_finished();
        if self.by_qid.contains_key(&name) || watches.has_qid(&name) {
            return Err(ApiError::bad_request(format!(
                "qid {name} is already subscribed on this connection; unsubscribe it first"
            )));
        }
        let max = core.config().live_subscriptions_per_connection_max;
        let held = self.by_qid.len() + watches.len();
        if held >= max {
            return Err(ApiError::limit(format!(
                "this connection has {held} live subscriptions and watches; subscriptions_per_connection_max (--live-subscriptions-per-connection) is {max}"
            )));
        }
        let Some(Value::String(sql)) = request.get("sql") else {
            return Err(ApiError::bad_request("a subscribe needs \"sql\""));
        };
        let params = sluice_query::Params::from_json(request.get("params"))?;
        let since = match request.get("since") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                ApiError::bad_request("\"since\" must be a seq (an integer ≥ 0)")
            })?),
        };
        let coalesce_ms = crate::coalesce::coalesce_ms(request.get("coalesce_ms"))?;
        let req = Subscribe {
            sql: sql.clone(),
            params,
            since,
            claims: caller.claims().map(|c| c.all.clone()),
        };
        let task = self
            .forwarder(core, events, encoding)
            .open(core, req, coalesce_ms, qid)
            .await?;
        self.by_qid.insert(name, task);
        Ok(())
    }

    fn forwarder(
        &mut self,
        core: &Core,
        events: &mpsc::Sender<Message>,
        encoding: Encoding,
    ) -> &mut forward::Forwarder {
        self.forwarder
            .get_or_insert_with(|| forward::Forwarder::new(core, events.clone(), encoding))
    }

    fn unsubscribe(&mut self, qid: &Value) -> Result<Value, ApiError> {
        match self.by_qid.remove(&qid.to_string()) {
            Some(task) => {
                // Dropping the task's subscription unsubscribes it from its view.
                task.abort();
                Ok(json!({"type": "unsubscribed", "qid": qid}))
            }
            None => Err(ApiError::not_found(format!(
                "no live subscription with qid {qid} on this connection"
            ))),
        }
    }

    fn close_all(&mut self) {
        for (_, task) in self.by_qid.drain() {
            task.abort();
        }
    }
}

/// The topic watches of one connection: at most one per topic, so a record's shared bytes
/// (which name the topic, not the qid) say which watch they belong to.
#[derive(Default)]
struct Watches {
    /// topic → its watch
    by_topic: HashMap<String, WatchEntry>,
}

struct WatchEntry {
    qid: String,
    /// Ends the watch's stream (`unwatch`, connection closed).
    abort: futures_util::stream::AbortHandle,
    /// Set when the stream ended by itself (its final error was sent).
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl WatchEntry {
    fn is_finished(&self) -> bool {
        self.done.load(Ordering::Relaxed) || self.abort.is_aborted()
    }
}

impl Watches {
    fn len(&self) -> usize {
        self.by_topic.len()
    }

    fn has_qid(&self, qid: &str) -> bool {
        self.by_topic
            .values()
            .any(|w| w.qid == qid && !w.is_finished())
    }

    #[allow(clippy::too_many_arguments)]
    async fn watch(
        &mut self,
        core: &Core,
        caller: &Caller,
        request: &Map<String, Value>,
        streams: &mpsc::UnboundedSender<WatchStream>,
        encoding: Encoding,
        subscriptions: usize,
        qid_taken: bool,
    ) -> Result<(), ApiError> {
        let qid = request
            .get("qid")
            .filter(|q| q.is_string() || q.is_number())
            .ok_or_else(|| ApiError::bad_request("a watch needs \"qid\" (a string or number)"))?
            .clone();
        let name = qid.to_string();
        let Some(Value::String(topic)) = request.get("topic") else {
            return Err(ApiError::bad_request("a watch needs \"topic\""));
        };
        self.by_topic.retain(|_, w| !w.is_finished());
        if qid_taken || self.has_qid(&name) {
            return Err(ApiError::bad_request(format!(
                "qid {name} is already in use on this connection; unwatch or unsubscribe it first"
            )));
        }
        if let Some(WatchEntry { qid: other, .. }) = self.by_topic.get(topic) {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "already_exists",
                format!("topic {topic:?} is already watched on this connection (qid {other}): one watch per topic per connection"),
            ));
        }
        let max = core.config().live_subscriptions_per_connection_max;
        let held = subscriptions + self.by_topic.len();
        if held >= max {
            return Err(ApiError::limit(format!(
                "this connection has {held} live subscriptions and watches; subscriptions_per_connection_max (--live-subscriptions-per-connection) is {max}"
            )));
        }
        let from = match request.get("from") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                ApiError::bad_request("\"from\" must be a record offset (an integer ≥ 0)")
            })?),
        };
        let tags: Vec<String> = match request.get("tags") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|t| {
                    t.as_str().map(str::to_string).ok_or_else(|| {
                        ApiError::bad_request("\"tags\" must be an array of strings")
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "\"tags\" must be an array of strings",
                ))
            }
        };
        let filter = sluice_engine::TagFilter::parse(&tags)?;
        let coalesce_ms = crate::coalesce::coalesce_ms(request.get("coalesce_ms"))?;
        let mut watch = core.watch_as(caller, topic, from, filter).await?;
        watch.coalesce(crate::coalesce::window(coalesce_ms));
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stream = watch_stream(watch, id, qid, encoding, done.clone());
        let (stream, abort) = futures_util::stream::abortable(stream);
        if streams.send(Box::pin(stream)).is_err() {
            return Err(ApiError::shutting_down());
        }
        self.by_topic.insert(
            topic.clone(),
            WatchEntry {
                qid: name,
                abort,
                done,
            },
        );
        Ok(())
    }

    fn unwatch(&mut self, qid: &Value) -> Result<Value, ApiError> {
        let name = qid.to_string();
        let topic = self
            .by_topic
            .iter()
            .find(|(_, w)| w.qid == name)
            .map(|(t, _)| t.clone())
            .ok_or_else(|| {
                ApiError::not_found(format!("no topic watch with qid {qid} on this connection"))
            })?;
        let entry = self.by_topic.remove(&topic).expect("found above");
        // The sender drops the aborted stream, and with it the watch (which unregisters).
        entry.abort.abort();
        Ok(json!({"type": "unwatched", "qid": qid}))
    }

    fn close_all(&mut self) {
        for (_, w) in self.by_topic.drain() {
            w.abort.abort();
        }
    }
}

/// Most watch messages written per flush.
const WATCH_BATCH_MESSAGES_MAX: usize = 256;

/// A watch as the messages its connection sends: `watching`, then each record's shared
/// bytes, then — if the server ends it — one `error`.
fn watch_stream(
    watch: crate::topics::Watch,
    id: Value,
    qid: Value,
    encoding: Encoding,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> WatchStream {
    let watching = json!({"id": id, "type": "watching", "qid": qid, "topic": watch.topic(), "next": watch.start()});
    let first = encode(encoding, &watching);
    let state = (watch, Some(first), qid, done, false);
    Box::pin(futures_util::stream::unfold(
        state,
        move |(mut watch, first, qid, done, ended)| async move {
            if ended {
                return None;
            }
            if let Some(first) = first {
                return Some((first, (watch, None, qid, done, false)));
            }
            match watch.next().await {
                Ok(record) => {
                    let message = match encoding {
                        Encoding::Json => Message::Text(record.ws_json().clone()),
                        Encoding::Msgpack => Message::Binary(record.ws_msgpack().clone()),
                    };
                    Some((message, (watch, None, qid, done, false)))
                }
                Err(e) => {
                    let mut reply = error_reply(&Value::Null, e.into());
                    if let Some(m) = reply.as_object_mut() {
                        m.remove("id");
                    }
                    reply["qid"] = qid.clone();
                    done.store(true, Ordering::Relaxed);
                    Some((encode(encoding, &reply), (watch, None, qid, done, true)))
                }
            }
        },
    ))
}

fn too_big(len: usize, max: usize) -> ApiError {
    ApiError::limit(format!(
        "message of {len} bytes exceeds body_bytes_max (--max-body-bytes) of {max} bytes"
    ))
}

/// An `append` request read from JSON text without parsing its records into values; `None`
/// when the text is not an append this path takes (then the generic path answers it).
async fn fast_append(core: &Arc<Core>, caller: &Caller, text: &str) -> Option<ReplyFuture> {
    use serde_json::value::RawValue;
    let fields: HashMap<&str, &RawValue> = serde_json::from_str(text).ok()?;
    if fields.get("type")?.get() != "\"append\"" {
        return None;
    }
    let id: Value = match fields.get("id") {
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
        None => Value::Null,
    };
    let pending = async {
        let topic: String = fields
            .get("topic")
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .ok_or_else(|| ApiError::bad_request("an append needs \"topic\""))?;
        let mut class = Map::new();
        if let Some(raw) = fields.get("durability") {
            let d: Value = serde_json::from_str(raw.get())
                .map_err(|e| ApiError::bad_request(format!("bad durability: {e}")))?;
            class.insert("durability".into(), d);
        }
        let class = durability_of(&class)?.unwrap_or(core.config().durability);
        let records = fields.get("records").ok_or_else(|| {
            ApiError::bad_request(
                "an append needs \"records\": [{\"tags\": [...], \"data\": ...}, ...]",
            )
        })?;
        let records =
            crate::topics_api::parse_raw_records(records, core.config().append_records_max)?;
        enqueue_append(core, caller, topic, records, class).await
    }
    .await;
    Some(match pending {
        Ok(pending) => {
            let core = core.clone();
            Box::pin(async move { pending.reply(&core, id).await })
        }
        Err(e) => Box::pin(std::future::ready(Outgoing::Value(error_reply(&id, e)))),
    })
}

/// A `mutate` request decoded by the typed decoder and queued for the writer; `None` when
/// the frame is not one the decoder takes (then the general path answers it, refusals
/// included).
async fn fast_mutate(
    core: &Arc<Core>,
    caller: &Caller,
    message: &Result<Message, axum::Error>,
    body_max: usize,
) -> Option<ReplyFuture> {
    // Other requests do not get near the decoder (which may read the schemas again when
    // it gives up): a mutate names its type, as a JSON string or a MessagePack fixstr.
    let frame = match message {
        Ok(Message::Text(text)) if text.len() <= body_max && text.contains("\"mutate\"") => {
            KeptBody::Json(axum::body::Bytes::from(text.clone()))
        }
        Ok(Message::Binary(bytes)) if bytes.len() <= body_max && contains(bytes, b"\xa6mutate") => {
            KeptBody::Msgpack(bytes.clone())
        }
        _ => return None,
    };
    let (id, decoded) = core.decode_ws_mutate(frame)?;
    let durability = decoded.durability.unwrap_or(core.config().durability);
    let queued = core
        .enqueue(|reply| Request::Mutate {
            ops: crate::core::MutateOps::Typed(decoded),
            claims: caller.claims().cloned(),
            durability,
            reply,
        })
        .await;
    Some(match queued {
        Ok(rx) => {
            let core = core.clone();
            Box::pin(async move { Pending::Mutate(rx).reply(&core, id).await })
        }
        Err(e) => {
            let e = ApiError::from(e);
            note_refusal(core, &e);
            Box::pin(std::future::ready(Outgoing::Value(error_reply(&id, e))))
        }
    })
}

/// Whether `needle` occurs in `haystack`: every binary frame is searched so before it is
/// read. Its first byte is found with `memchr` (SIMD; in most frames it does not occur at
/// all), the rest compared where it does. Callgrind of the server under `sluice bench
/// transfer`: a byte loop took 554 instructions per `transfer` call, `memmem::find` (which
/// builds its searcher on every call) 427; with this the connection task spends 333 fewer
/// per call than with `memmem`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    memchr::memchr_iter(first, haystack).any(|i| haystack[i + 1..].starts_with(rest))
}

async fn enqueue_append(
    core: &Core,
    caller: &Caller,
    topic: String,
    records: Vec<crate::topics::NewRecord>,
    durability: sluice_log::Durability,
) -> Result<Pending, ApiError> {
    let rx = core
        .enqueue(|reply| Request::Append {
            topic,
            records,
            claims: caller.claims().cloned(),
            durability,
            reply,
        })
        .await?;
    Ok(Pending::Append(rx))
}

/// Queues a call read by [`CallFrame::read`], as [`dispatch`] queues one read by the generic
/// path.
async fn enqueue_call(core: &Arc<Core>, caller: &Caller, call: CallFrame) -> ReplyFuture {
    let CallFrame {
        id,
        name,
        args,
        durability,
    } = call;
    let queued = core
        .enqueue(|reply| Request::Call {
            name,
            args,
            claims: caller.claims().cloned(),
            durability: durability.unwrap_or(core.config().durability),
            reply,
        })
        .await;
    match queued {
        Ok(rx) => {
            let core = core.clone();
            Box::pin(async move { Pending::Call(rx).reply(&core, id).await })
        }
        Err(e) => {
            let e = ApiError::from(e);
            note_refusal(core, &e);
            Box::pin(std::future::ready(Outgoing::Value(error_reply(&id, e))))
        }
    }
}

/// A queued request whose reply is still to come.
enum Pending {
    Now(Value),
    Call(oneshot::Receiver<WriterResult<CallOk>>),
    Mutate(oneshot::Receiver<WriterResult<MutateOk>>),
    Append(oneshot::Receiver<WriterResult<crate::topics::AppendOk>>),
}

impl Pending {
    /// The reply to send for this request: a call's success as its parts, encoded by the
    /// sender without a JSON object in between; anything else as [`Pending::finish`] makes it.
    async fn reply(self, core: &Core, id: Value) -> Outgoing {
        let rx = match self {
            Pending::Call(rx) => rx,
            Pending::Mutate(rx) => {
                return match core.settle(rx).await {
                    Ok(ok) => Outgoing::MutateResult { id, ok },
                    Err(e) => {
                        let e = ApiError::from(e);
                        note_refusal(core, &e);
                        Outgoing::Value(error_reply(&id, e))
                    }
                };
            }
            other => return Outgoing::Value(other.finish(core, &id).await),
        };
        let outcome = match core.settle(rx).await {
            Ok(ok) => {
                let confirmed = if ok.wrote {
                    Ok(())
                } else {
                    core.wait_confirmed(ok.seq).await
                };
                confirmed.map(|_| ok)
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ok) => Outgoing::CallResult {
                id,
                seq: ok.seq,
                result: ok.result,
            },
            Err(e) => {
                let e = ApiError::from(e);
                note_refusal(core, &e);
                Outgoing::Value(error_reply(&id, e))
            }
        }
    }

    async fn finish(self, core: &Core, id: &Value) -> Value {
        let result: Result<Value, CoreError> = match self {
            Pending::Now(v) => Ok(v),
            Pending::Call(rx) => match core.settle(rx).await {
                Ok(ok) => {
                    let confirmed = if ok.wrote {
                        Ok(())
                    } else {
                        core.wait_confirmed(ok.seq).await
                    };
                    confirmed.map(|_| json!({"type": "result", "seq": ok.seq, "result": ok.result}))
                }
                Err(e) => Err(e),
            },
            Pending::Mutate(rx) => core.settle(rx).await.map(|ok| {
                json!({"type": "result", "seq": ok.seq, "results": crate::api::results_json(&ok.results)})
            }),
            Pending::Append(rx) => core.settle(rx).await.map(
                |ok| json!({"type": "result", "seq": ok.seq, "first": ok.first, "last": ok.last}),
            ),
        };
        match result {
            Ok(mut v) => {
                v["id"] = id.clone();
                v
            }
            Err(e) => {
                let e = ApiError::from(e);
                note_refusal(core, &e);
                error_reply(id, e)
            }
        }
    }
}

async fn dispatch(
    core: &Core,
    caller: &Caller,
    request: &mut Map<String, Value>,
) -> Result<Pending, ApiError> {
    let kind = request
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("a request needs \"type\""))?;
    let class = durability_of(request)?.unwrap_or(core.config().durability);
    match kind {
        "ping" => Ok(Pending::Now(json!({"type": "pong", "seq": core.confirmed_seq()}))),
        "call" => {
            let name = request
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("a call needs \"name\""))?
                .to_string();
            let args = request.remove("args").unwrap_or(Value::Null);
            let rx = core
                .enqueue(|reply| Request::Call {
                    name,
                    args: args.into(),
                    claims: caller.claims().cloned(),
                    durability: class,
                    reply,
                })
                .await?;
            Ok(Pending::Call(rx))
        }
        "mutate" => {
            let ops = parse_ops(request, core.config().ops_per_mutate_max)?;
            let rx = core
                .enqueue(|reply| Request::Mutate {
                    ops: crate::core::MutateOps::Json(ops),
                    claims: caller.claims().cloned(),
                    durability: class,
                    reply,
                })
                .await?;
            Ok(Pending::Mutate(rx))
        }
        "append" => {
            let Some(Value::String(topic)) = request.get("topic") else {
                return Err(ApiError::bad_request("an append needs \"topic\""));
            };
            let topic = topic.clone();
            let records =
                crate::topics_api::parse_records(request, core.config().append_records_max)?;
            enqueue_append(core, caller, topic, records, class).await
        }
        "query" => {
            let Some(Value::String(sql)) = request.get("sql") else {
                return Err(ApiError::bad_request("a query needs \"sql\""));
            };
            let params = sluice_query::Params::from_json(request.get("params"))?;
            let (result, seq) = core.query_as(caller, sql, &params).await?;
            let mut reply = query_json(&result, seq);
            reply["type"] = Value::from("result");
            Ok(Pending::Now(reply))
        }
        other => Err(ApiError::bad_request(format!(
            "unknown request type {other:?}: expected call, mutate, query, get, subscribe, subscribe_many, unsubscribe, append, watch, unwatch or ping"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ResultsSer;

    /// The frame-kind search finds a needle wherever a window of the haystack equals it
    /// (held to a windows scan over random bytes from a small alphabet, so that partial
    /// matches and repeated first bytes are common).
    #[test]
    fn contains_finds_what_a_windows_scan_finds() {
        let mut rng = sluice_fuzzkit::Rng::new(0xc0_7a1e);
        let alphabet = [0xa3u8, b'g', b'e', b't', 0];
        let pick = |rng: &mut sluice_fuzzkit::Rng| alphabet[rng.below(alphabet.len())];
        for _ in 0..20_000 {
            let haystack: Vec<u8> = (0..rng.below(24)).map(|_| pick(&mut rng)).collect();
            let needle: Vec<u8> = (0..1 + rng.below(4)).map(|_| pick(&mut rng)).collect();
            let scan = haystack
                .windows(needle.len())
                .any(|w| w == needle.as_slice());
            assert_eq!(
                contains(&haystack, &needle),
                scan,
                "{haystack:?} {needle:?}"
            );
        }
        assert!(contains(b"\x84\xa3get", b"\xa3get"));
        assert!(!contains(b"\x84\xa3ge", b"\xa3get"));
    }

    /// A call's result reply written by hand is what `serde_json` and `rmp_serde` make of
    /// [`CallResult`], whatever the call's id and result.
    #[test]
    fn a_hand_written_call_result_is_what_serde_writes() {
        let mut rng = sluice_fuzzkit::Rng::new(0x0ca1_1e5d);
        let values = [
            Value::Null,
            json!(true),
            json!(0),
            json!(127),
            json!(128),
            json!(-33),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(0.5),
            json!("req-\"1\" ✓"),
            json!([1, "two", null, {"x": -1.25}]),
            json!({"z": 1, "a": [true, null], "": {}}),
        ];
        for _ in 0..2_000 {
            let (id, result) = (rng.pick(&values), rng.pick(&values));
            let seq = rng.next_u64() >> rng.below(64);
            let reply = CallResult {
                kind: "result",
                seq,
                result,
                id,
            };
            let text = serde_json::to_string(&reply).expect("serialises");
            assert_eq!(
                call_result(Encoding::Json, id, seq, result),
                Message::Text(text.into())
            );
            let bytes = rmp_serde::to_vec_named(&reply).expect("serialises");
            assert_eq!(
                call_result(Encoding::Msgpack, id, seq, result),
                Message::Binary(bytes.into())
            );
        }
    }

    /// A mutate's MessagePack result reply written by hand is the bytes `rmp_serde` makes of
    /// [`MutateResult`], whatever the results (up to past the 15 a `fixarray` holds) and id.
    #[test]
    fn a_hand_written_msgpack_mutate_result_is_the_bytes_rmp_serde_writes() {
        let mut rng = sluice_fuzzkit::Rng::new(0x4e91_0b1e);
        let ids = [
            Value::Null,
            json!(7),
            json!(-40),
            json!("req-1"),
            json!({"a": [1]}),
        ];
        for _ in 0..2_000 {
            let mut results = crate::api::reply_tests::random_results(&mut rng);
            if rng.one_in(10) {
                // Past a `fixarray`: 16 and more results.
                while results.len() < 16 + rng.below(10) {
                    results.extend(crate::api::reply_tests::random_results(&mut rng));
                }
            }
            let (id, seq) = (rng.pick(&ids), rng.next_u64() >> rng.below(64));
            let want = rmp_serde::to_vec_named(&MutateResult {
                kind: "result",
                seq,
                results: ResultsSer(&results),
                id,
            })
            .expect("serialises");
            assert_eq!(mutate_result_msgpack(id, seq, &results), want);
        }
    }

    /// A mutate's JSON result reply written by hand is the text `serde_json` makes of
    /// [`MutateResult`], whatever the request's id.
    #[test]
    fn a_hand_written_mutate_result_is_the_text_serde_json_writes() {
        let mut rng = sluice_fuzzkit::Rng::new(0x01d5_4e91);
        let ids = [
            Value::Null,
            json!(7),
            json!(-1.5),
            json!("req-\"1\""),
            json!({"z": 1, "a": [true, null]}),
        ];
        for _ in 0..2_000 {
            let results = crate::api::reply_tests::random_results(&mut rng);
            let (id, seq) = (rng.pick(&ids), rng.next_u64() >> rng.below(64));
            let want = serde_json::to_string(&MutateResult {
                kind: "result",
                seq,
                results: ResultsSer(&results),
                id,
            })
            .expect("serialises");
            assert_eq!(mutate_result_json(id, seq, &results), want);
        }
    }

    /// What the generic path makes of `message` when it is a call it would queue: the same
    /// fields `dispatch` reads.
    fn generic_call(message: &Message) -> Option<CallFrame> {
        let parsed = match message {
            Message::Text(text) => serde_json::from_str::<Value>(text.as_str()).ok()?,
            Message::Binary(bytes) => msgpack_value(bytes).ok()?,
            _ => return None,
        };
        let Value::Object(mut request) = parsed else {
            return None;
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        if request.get("type").and_then(Value::as_str) != Some("call") {
            return None;
        }
        let durability = durability_of(&request).ok()?;
        let name = request.get("name").and_then(Value::as_str)?.to_string();
        let args = request.remove("args").unwrap_or(Value::Null);
        Some(CallFrame {
            id,
            name,
            args: sluice_functions::Args::Json(args),
            durability,
        })
    }

    /// `frame` with its arguments as the JSON they decode to (kept MessagePack bytes and
    /// the generic path's JSON compare equal when the function sees the same value).
    fn as_json(frame: Option<CallFrame>) -> Option<CallFrame> {
        frame.map(|f| CallFrame {
            args: sluice_functions::Args::Json(f.args.to_json()),
            ..f
        })
    }

    #[test]
    fn messagepack_arguments_the_kept_bytes_cannot_hold_go_the_generic_way() {
        let head = |args: &[u8]| {
            let mut frame = vec![0x83, 0xa4];
            frame.extend_from_slice(b"type");
            frame.extend_from_slice(&[0xa4, b'c', b'a', b'l', b'l', 0xa4]);
            frame.extend_from_slice(b"name");
            frame.extend_from_slice(&[0xa1, b'f', 0xa4]);
            frame.extend_from_slice(b"args");
            frame.extend_from_slice(args);
            Message::Binary(frame.into())
        };
        let nan = [vec![0xcb], f64::NAN.to_be_bytes().to_vec()].concat();
        let odd: Vec<Vec<u8>> = vec![
            vec![0xc4, 1, 7],                         // bin
            vec![0xd4, 1, 0],                         // fixext
            nan,                                      // NaN: JSON null the generic way
            vec![0x81, 0x01, 0x02],                   // an integer key
            vec![0x82, 0xa1, b'a', 1, 0xa1, b'a', 2], // a key twice
            [vec![0x91; 100], vec![0xc0]].concat(),   // deeper than the kept bytes take
        ];
        for args in odd {
            let message = head(&args);
            assert_eq!(CallFrame::read(&message, 1 << 20), None, "{args:?}");
        }
        // What it takes, it keeps as bytes, and they are the generic path's JSON.
        let message = head(&[
            0x82, 0xa4, b'f', b'r', b'o', b'm', 0x01, 0xa2, b't', b'o', 0xcd, 1, 0,
        ]);
        let taken = CallFrame::read(&message, 1 << 20).unwrap();
        assert!(matches!(taken.args, sluice_functions::Args::Msgpack(_)));
        assert_eq!(as_json(Some(taken)), generic_call(&message));
        assert_eq!(
            generic_call(&message).unwrap().args.to_json(),
            json!({"from": 1, "to": 256})
        );
        // Bytes after the frame's map: left to the generic path.
        let Message::Binary(bytes) = message else {
            unreachable!()
        };
        let trailing = Message::Binary([&bytes[..], &[0xc0]].concat().into());
        assert_eq!(CallFrame::read(&trailing, 1 << 20), None);
    }

    #[test]
    fn a_call_frame_is_read_as_the_generic_path_reads_it() {
        let fields: &[(&str, &[&str])] = &[
            ("type", &["\"call\"", "\"mutate\"", "5", "null"]),
            ("id", &["1", "\"x\"", "null", "{\"a\": [1]}", "-2.5"]),
            ("name", &["\"transfer\"", "\"\"", "5", "null"]),
            (
                "args",
                &[
                    "{\"from\": 1, \"to\": 2, \"amount\": 1}",
                    "[1]",
                    "null",
                    "\"s\"",
                ],
            ),
            (
                "durability",
                &[
                    "\"fsync\"",
                    "\"disk\"",
                    "\"memory\"",
                    "\"bogus\"",
                    "null",
                    "3",
                ],
            ),
            ("qid", &["1", "{\"deep\": {\"er\": [null]}}"]),
        ];
        let mut rng: u64 = 0x9e37_79b9;
        let mut below = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let (mut taken, mut frames) = (0, 0);
        for _ in 0..4000 {
            let mut parts = Vec::new();
            let mut twice = false;
            let mut names = Vec::new();
            for &(name, values) in fields {
                // Usually there, sometimes absent, rarely twice.
                let times = match below(10) {
                    0 => 0,
                    1 if name != "qid" => 2,
                    _ => 1,
                };
                twice |= times == 2;
                for _ in 0..times {
                    // The first value (the one a call has) half the time.
                    let value = match below(2) {
                        0 => values[0],
                        _ => values[below(values.len())],
                    };
                    parts.push(format!("\"{name}\": {value}"));
                    names.push(name);
                }
            }
            // Shuffle the order of the fields.
            for i in (1..parts.len()).rev() {
                parts.swap(i, below(i + 1));
            }
            let text = format!("{{{}}}", parts.join(", "));
            let mut messages = vec![Message::Text(text.clone().into())];
            if !twice {
                let value: Value = serde_json::from_str(&text).unwrap();
                messages.push(Message::Binary(
                    rmp_serde::to_vec_named(&value).unwrap().into(),
                ));
            }
            for message in messages {
                frames += 1;
                let typed = CallFrame::read(&message, 1 << 20);
                let generic = generic_call(&message);
                taken += usize::from(typed.is_some());
                if twice {
                    assert_eq!(
                        typed, None,
                        "{text}: a field twice is left to the generic path"
                    );
                } else {
                    assert_eq!(as_json(typed), generic, "{text} ({message:?})");
                }
            }
        }
        assert!(taken > frames / 20, "only {taken} of {frames} frames taken");
    }

    #[test]
    fn odd_frames_are_left_to_the_generic_path() {
        // A MessagePack `bin` key or name, which `serde_json::Value` refuses.
        let bin_key = vec![
            0x82, 0xc4, 4, b't', b'y', b'p', b'e', 0xa4, b'c', b'a', b'l', b'l', 0xa4, b'n', b'a',
            b'm', b'e', 0xa1, b'f',
        ];
        let bin_name = vec![
            0x82, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'c', b'a', b'l', b'l', 0xa4, b'n', b'a',
            b'm', b'e', 0xc4, 1, b'f',
        ];
        for bytes in [bin_key, bin_name] {
            let message = Message::Binary(bytes.into());
            assert_eq!(generic_call(&message), None);
            assert_eq!(CallFrame::read(&message, 1 << 20), None);
        }
        let call = Message::Text(r#"{"type": "call", "name": "f", "id": 7}"#.into());
        assert!(CallFrame::read(&call, 1 << 20).is_some());
        // Over the body limit: the generic path refuses it with its size error.
        assert_eq!(CallFrame::read(&call, 10), None);
        assert_eq!(
            CallFrame::read(&Message::Text("[1, 2]".into()), 1 << 20),
            None
        );
    }
}
