//! The WebSocket `get` request: a point read by primary key or through an index
//! ([`crate::point`]), answered from the row's typed values without going through the
//! writer. Specified in `docs/protocol.md` ("get").
//!
//! A `get` frame is read straight into its fields ([`GetFrame`], strings borrowed from the
//! frame where it allows); a frame that reader is unsure of (a field twice, a field of an
//! unexpected type, a MessagePack `bin`) is parsed by the generic path, which hands its
//! fields to the same [`answer`] — so both paths decide and refuse alike. A read whose
//! state is already confirmed is answered on the spot (a ready reply, no task, no waiting
//! machinery); one that must wait joins the connection's replies in flight like any other
//! request, so many gets (and other requests) are in flight at once and replies keep the
//! order of requests.
//!
//! A get by `keys` reads a batch of primary keys under one hold of the read lock and
//! answers them in one reply (one entry per key, in order): one frame, one request decode
//! and one reply encode for up to [`crate::point::GET_KEYS_MAX`] reads instead of one each
//! — per-frame work on both ends is what caps pipelined single-key gets.

use std::sync::Arc;

use axum::extract::ws::Message;
use serde_json::{Map, Value};

use super::{contains, encode_parts, error_reply, note_refusal, Encoding, Outgoing, ReplyFuture};
use crate::api::ApiError;
use crate::auth::Caller;
use crate::core::Core;
use crate::decode::{KeyStr, MSGPACK_DEPTH_MAX};
use crate::error::CoreError;
use crate::point::{
    Found, Given, Got, GotMany, IndexBy, IndexLookup, PointRow, RowSer, VersionedRowSer,
};

/// The fields of a `get` request.
#[derive(Default)]
pub(super) struct GetFrame<'a> {
    id: Option<Value>,
    table: Option<KeyStr<'a>>,
    key: Option<Value>,
    /// A batched read by primary key: one entry per key in the reply, in this order.
    keys: Option<Vec<Value>>,
    index: Option<KeyStr<'a>>,
    column: Option<KeyStr<'a>>,
    value: Option<Value>,
    after: Option<Value>,
    limit: Option<u64>,
}

impl<'a> GetFrame<'a> {
    /// The get in `message`, if it is one this reader takes (see the module doc).
    fn read(message: &'a Message, body_max: usize) -> Option<GetFrame<'a>> {
        match message {
            Message::Text(text) if text.len() <= body_max && text.contains("\"get\"") => {
                serde_json::from_str::<GetFrame>(text.as_str()).ok()
            }
            Message::Binary(bytes) if bytes.len() <= body_max && contains(bytes, b"\xa3get") => {
                let mut de = rmp_serde::Deserializer::from_read_ref(&bytes[..]);
                de.set_max_depth(MSGPACK_DEPTH_MAX);
                serde::Deserialize::deserialize(&mut de).ok()
            }
            _ => None,
        }
    }

    /// The fields of a request the generic path parsed (`"type": "get"`); a field of the
    /// wrong type is refused here, naming it.
    fn from_map(request: &'a Map<String, Value>) -> Result<GetFrame<'a>, ApiError> {
        let text = |name: &str| -> Result<Option<KeyStr<'a>>, ApiError> {
            match request.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(KeyStr::Borrowed(s.as_str()))),
                Some(_) => Err(ApiError::bad_request(format!(
                    "\"{name}\" of a get must be a string"
                ))),
            }
        };
        let limit = match request.get("limit") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                ApiError::bad_request("\"limit\" of a get must be an integer ≥ 1")
            })?),
        };
        let field = |name: &str| request.get(name).filter(|v| !v.is_null()).cloned();
        let keys = match request.get("keys") {
            None | Some(Value::Null) => None,
            Some(Value::Array(keys)) => Some(keys.clone()),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "\"keys\" of a get must be an array of primary keys",
                ))
            }
        };
        Ok(GetFrame {
            id: request.get("id").cloned(),
            table: text("table")?,
            key: field("key"),
            keys,
            index: text("index")?,
            column: text("column")?,
            value: field("value"),
            after: field("after"),
            limit,
        })
    }
}

impl<'de> serde::Deserialize<'de> for GetFrame<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(GetFrameVisitor)
    }
}

struct GetFrameVisitor;

impl<'de> serde::de::Visitor<'de> for GetFrameVisitor {
    type Value = GetFrame<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a get request")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<GetFrame<'de>, A::Error> {
        use serde::de::Error;
        fn once<T, E: Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(E::custom("a field twice")),
            }
        }
        // A JSON null reads as an absent field, as the generic path reads it.
        fn some<T>(slot: &mut Option<T>, value: Option<T>, seen: &mut bool) -> bool {
            let twice = std::mem::replace(seen, true);
            if let Some(v) = value {
                *slot = Some(v);
            }
            twice
        }
        let mut frame = GetFrame::default();
        let mut is_get = false;
        let mut seen = [false; 8];
        while let Some(key) = map.next_key::<KeyStr<'de>>()? {
            let twice = match key.as_str() {
                "type" => {
                    let kind: KeyStr<'de> = map.next_value()?;
                    if is_get || kind.as_str() != "get" {
                        return Err(A::Error::custom("not a get"));
                    }
                    is_get = true;
                    false
                }
                "id" => {
                    once(&mut frame.id, map.next_value::<Value>()?)?;
                    false
                }
                "table" => some(&mut frame.table, map.next_value()?, &mut seen[0]),
                "key" => some(&mut frame.key, map.next_value()?, &mut seen[1]),
                "index" => some(&mut frame.index, map.next_value()?, &mut seen[2]),
                "column" => some(&mut frame.column, map.next_value()?, &mut seen[3]),
                "value" => some(&mut frame.value, map.next_value()?, &mut seen[4]),
                "after" => some(&mut frame.after, map.next_value()?, &mut seen[5]),
                "limit" => some(&mut frame.limit, map.next_value()?, &mut seen[6]),
                "keys" => some(&mut frame.keys, map.next_value()?, &mut seen[7]),
                // Read as the generic path reads it: a value it could not hold is its
                // refusal to make.
                _ => {
                    map.next_value::<Value>()?;
                    false
                }
            };
            if twice {
                return Err(A::Error::custom("a field twice"));
            }
        }
        if !is_get {
            return Err(A::Error::custom("not a get"));
        }
        Ok(frame)
    }
}

/// A `get` read straight from `message` and answered, or `None` when the frame is not
/// one [`GetFrame::read`] takes (then the generic path answers it, refusals included).
pub(super) fn fast(
    core: &Arc<Core>,
    caller: &Caller,
    message: &Result<Message, axum::Error>,
    body_max: usize,
    encoding: Encoding,
) -> Option<ReplyFuture> {
    let Ok(message) = message else {
        return None;
    };
    let frame = GetFrame::read(message, body_max)?;
    Some(answer(core, caller, frame, encoding))
}

/// A `get` the generic path parsed.
pub(super) fn generic(
    core: &Arc<Core>,
    caller: &Caller,
    request: &Map<String, Value>,
    encoding: Encoding,
) -> ReplyFuture {
    match GetFrame::from_map(request) {
        Ok(frame) => answer(core, caller, frame, encoding),
        Err(e) => {
            let id = request.get("id").cloned().unwrap_or(Value::Null);
            refused(core, &id, e)
        }
    }
}

fn refused(core: &Core, id: &Value, e: ApiError) -> ReplyFuture {
    note_refusal(core, &e);
    ready(Outgoing::Value(error_reply(id, e)))
}

fn ready(reply: Outgoing) -> ReplyFuture {
    Box::pin(std::future::ready(reply))
}

/// Decides a get: reads under the lock now, and replies now if the state it read is
/// confirmed, else once it is.
fn answer(
    core: &Arc<Core>,
    caller: &Caller,
    frame: GetFrame<'_>,
    encoding: Encoding,
) -> ReplyFuture {
    let id = frame.id.unwrap_or(Value::Null);
    let Some(table) = frame.table else {
        return refused(core, &id, ApiError::bad_request("a get needs \"table\""));
    };
    if let Some(keys) = frame.keys {
        let alone = frame.key.is_none()
            && frame.index.is_none()
            && frame.column.is_none()
            && frame.value.is_none()
            && frame.after.is_none()
            && frame.limit.is_none();
        if !alone {
            return refused(
                core,
                &id,
                ApiError::bad_request(
                    "a get by \"keys\" takes only \"table\" and \"keys\" (not \"key\", \"index\", \"column\", \"value\", \"after\" or \"limit\")",
                ),
            );
        }
        return answer_many(core, caller, id, table.as_str(), keys, encoding);
    }
    let by = match (&frame.index, &frame.column) {
        (None, None) => None,
        (Some(name), None) => Some(IndexBy::Name(name.as_str())),
        (None, Some(column)) => Some(IndexBy::Column(column.as_str())),
        (Some(_), Some(_)) => {
            return refused(
                core,
                &id,
                ApiError::bad_request("a get takes \"index\" or \"column\", not both"),
            )
        }
    };
    match (frame.key, by) {
        (Some(key), None) => {
            if frame.after.is_some() || frame.limit.is_some() {
                return refused(
                    core,
                    &id,
                    ApiError::bad_request(
                        "\"after\" and \"limit\" page a lookup by \"index\"/\"column\"; a get by \"key\" reads one row",
                    ),
                );
            }
            let read = core.get_row(caller, table.as_str(), Given::Json(&key));
            match read.now() {
                Ok(outcome) => ready(got_reply(core, id, outcome, encoding)),
                Err(read) => {
                    let core = core.clone();
                    Box::pin(async move {
                        let outcome = read.confirmed(&core).await;
                        got_reply(&core, id, outcome, encoding)
                    })
                }
            }
        }
        (None, Some(by)) => {
            let Some(value) = frame.value else {
                return refused(
                    core,
                    &id,
                    ApiError::bad_request("a get by \"index\" or \"column\" needs \"value\""),
                );
            };
            let limit = match frame.limit {
                Some(limit) => usize::try_from(limit).unwrap_or(usize::MAX),
                None => 100.min(core.config().page_rows_max),
            };
            let lookup = IndexLookup {
                by,
                value: Given::Json(&value),
                after: frame.after.as_ref().map(Given::Json),
                limit,
            };
            let read = core.find_rows(caller, table.as_str(), lookup);
            match read.now() {
                Ok(outcome) => ready(found_reply(core, id, outcome, encoding)),
                Err(read) => {
                    let core = core.clone();
                    Box::pin(async move {
                        let outcome = read.confirmed(&core).await;
                        found_reply(&core, id, outcome, encoding)
                    })
                }
            }
        }
        (Some(_), Some(_)) => refused(
            core,
            &id,
            ApiError::bad_request(
                "a get takes \"key\", or \"index\"/\"column\" with \"value\", not both",
            ),
        ),
        (None, None) => refused(
            core,
            &id,
            ApiError::bad_request(
                "a get needs \"key\" (by primary key), \"keys\" (a batch of them), or \"index\" or \"column\" with \"value\"",
            ),
        ),
    }
}

/// A batched get by primary key: every key read under one hold of the read lock
/// ([`Core::get_rows`]), one reply with an entry per key in request order.
fn answer_many(
    core: &Arc<Core>,
    caller: &Caller,
    id: Value,
    table: &str,
    keys: Vec<Value>,
    encoding: Encoding,
) -> ReplyFuture {
    let read = core.get_rows(caller, table, keys.iter().map(Given::Json));
    match read.now() {
        Ok(outcome) => ready(many_reply(core, id, outcome, encoding)),
        Err(read) => {
            let core = core.clone();
            Box::pin(async move {
                let outcome = read.confirmed(&core).await;
                many_reply(&core, id, outcome, encoding)
            })
        }
    }
}

/// `{"type": "result", "seq", "rows": [{"row", "version"} | null, …], "id"}`: one entry
/// per key asked, in order; `null` for a missing row (or one the caller may not read).
#[derive(serde::Serialize)]
struct ManyReply<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    rows: ManySer<'a>,
    id: &'a Value,
}

struct ManySer<'a> {
    schema: &'a sluice_engine::TableSchema,
    rows: &'a [Option<PointRow>],
}

impl serde::Serialize for ManySer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let schema = self.schema;
        s.collect_seq(
            self.rows
                .iter()
                .map(|r| r.as_ref().map(|row| VersionedRowSer { schema, row })),
        )
    }
}

fn many_reply(
    core: &Core,
    id: Value,
    outcome: Result<GotMany, CoreError>,
    encoding: Encoding,
) -> Outgoing {
    match outcome {
        Ok(got) => {
            let reply = ManyReply {
                kind: "result",
                seq: got.seq,
                rows: ManySer {
                    schema: &got.schema,
                    rows: &got.rows,
                },
                id: &id,
            };
            Outgoing::Encoded(encode_parts(encoding, &reply))
        }
        Err(e) => failed(core, &id, e),
    }
}

/// `{"type": "result", "seq", "row": {…} | null, "version": n | null, "id"}`.
#[derive(serde::Serialize)]
struct RowReply<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    row: Option<RowSer<'a>>,
    version: Option<u64>,
    id: &'a Value,
}

/// `{"type": "result", "seq", "rows": [{"row", "version"}, …], "next": key | null, "id"}`.
#[derive(serde::Serialize)]
struct RowsReply<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    rows: RowsSer<'a>,
    next: Option<Value>,
    id: &'a Value,
}

struct RowsSer<'a> {
    schema: &'a sluice_engine::TableSchema,
    rows: &'a [PointRow],
}

impl serde::Serialize for RowsSer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let schema = self.schema;
        s.collect_seq(self.rows.iter().map(|row| VersionedRowSer { schema, row }))
    }
}

fn got_reply(
    core: &Core,
    id: Value,
    outcome: Result<Got, CoreError>,
    encoding: Encoding,
) -> Outgoing {
    match outcome {
        Ok(got) => {
            let reply = RowReply {
                kind: "result",
                seq: got.seq,
                row: got.row.as_ref().map(|r| RowSer {
                    schema: &got.schema,
                    values: &r.values,
                }),
                version: got.row.as_ref().map(|r| r.version),
                id: &id,
            };
            Outgoing::Encoded(encode_parts(encoding, &reply))
        }
        Err(e) => failed(core, &id, e),
    }
}

fn found_reply(
    core: &Core,
    id: Value,
    outcome: Result<Found, CoreError>,
    encoding: Encoding,
) -> Outgoing {
    match outcome {
        Ok(found) => {
            let reply = RowsReply {
                kind: "result",
                seq: found.seq,
                rows: RowsSer {
                    schema: &found.schema,
                    rows: &found.rows,
                },
                next: found.next.as_ref().map(sluice_engine::Key::to_json),
                id: &id,
            };
            Outgoing::Encoded(encode_parts(encoding, &reply))
        }
        Err(e) => failed(core, &id, e),
    }
}

fn failed(core: &Core, id: &Value, e: CoreError) -> Outgoing {
    let e = ApiError::from(e);
    note_refusal(core, &e);
    Outgoing::Value(error_reply(id, e))
}
