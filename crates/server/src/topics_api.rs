//! Topics over HTTP: `PUT/DELETE/GET /v1/topics/{name}`, `GET /v1/topics`, appends and
//! paged reads of `/v1/topics/{name}/records`, and the SSE watch
//! `GET /v1/topics/{name}/watch`. Specified in `docs/api.md` ("Topics").
//!
//! A watch's stream writes each record's shared SSE bytes ([`WireRecord::sse`]) as they are;
//! records that are ready together go out in one chunk.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::{Json, Router};
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use sluice_engine::topic::record_from_json;
use sluice_engine::TagFilter;

use crate::api::{durability_of, ApiError};
use crate::auth::Caller;
use crate::core::Core;
use crate::error::CoreError;
use crate::topics::{NewRecord, TopicSpec, Watch, WireRecord};

type St = State<Arc<Core>>;
type ApiResult = Result<Json<Value>, ApiError>;

/// Records or bytes gathered into one SSE chunk when they are ready together.
const SSE_CHUNK_RECORDS_MAX: usize = 256;
const SSE_CHUNK_BYTES_MAX: usize = 256 << 10;

pub(crate) fn routes(router: Router<Arc<Core>>) -> Router<Arc<Core>> {
    router
        .route("/v1/topics", get(list))
        .route("/v1/topics/{name}", get(info).put(put).delete(drop_topic))
        .route("/v1/topics/{name}/records", get(read).post(append))
        .route("/v1/topics/{name}/watch", get(watch_sse))
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request(format!("bad path: {e}"))
}

async fn list(State(core): St, Extension(caller): Extension<Caller>) -> ApiResult {
    let (topics, seq) = core.topics_as(&caller).await?;
    Ok(Json(json!({"seq": seq, "topics": topics})))
}

async fn info(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(name) = path.map_err(path_error)?;
    Ok(Json(json!(core.topic_as(&caller, &name).await?)))
}

async fn put(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> ApiResult {
    caller.require_admin("PUT /v1/topics/{name}")?;
    let Path(name) = path.map_err(path_error)?;
    let bytes = crate::api::read_body(&core, body).await?;
    let (spec, durability) = topic_spec(&bytes)?;
    let ok = core.put_topic(name, spec, durability).await?;
    Ok(Json(
        json!({"seq": ok.seq, "created": ok.created, "topic": ok.topic}),
    ))
}

/// The retention fields and durability of a `PUT /v1/topics/{name}` body (may be empty).
fn topic_spec(bytes: &[u8]) -> Result<(TopicSpec, Option<sluice_log::Durability>), ApiError> {
    let body: Map<String, Value> = if bytes.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice(bytes) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(ApiError::bad_request(
                    "the request body must be a JSON object",
                ))
            }
            Err(e) => return Err(ApiError::bad_request(format!("malformed JSON: {e}"))),
        }
    };
    if let Some(extra) = body.keys().find(|k| {
        ![
            "retain_records",
            "retain_bytes",
            "retain_secs",
            "read",
            "append",
            "durability",
        ]
        .contains(&k.as_str())
    }) {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?}: a topic takes retain_records, retain_bytes, retain_secs, read, append, durability"
        )));
    }
    let rules = |k: &str| -> Result<Option<Vec<String>>, ApiError> {
        match body.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "{k:?} must be an array of tag patterns (strings)"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(ApiError::bad_request(format!(
                "{k:?} must be an array of tag patterns (strings)"
            ))),
        }
    };
    let field = |k: &str| -> Result<Option<u64>, ApiError> {
        match body.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                ApiError::bad_request(format!("{k:?} must be a non-negative integer, got {v}"))
            }),
        }
    };
    let spec = TopicSpec {
        retain_records: field("retain_records")?,
        retain_bytes: field("retain_bytes")?,
        retain_secs: field("retain_secs")?,
        read: rules("read")?,
        append: rules("append")?,
    };
    Ok((spec, durability_of(&body)?))
}

async fn drop_topic(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult {
    caller.require_admin("DELETE /v1/topics/{name}")?;
    let Path(name) = path.map_err(path_error)?;
    let seq = core.drop_topic(name, None).await?;
    Ok(Json(json!({"seq": seq})))
}

/// The `records` of an append (HTTP body or WebSocket message), checked for shape and count.
pub(crate) fn parse_records(
    body: &mut Map<String, Value>,
    records_max: usize,
) -> Result<Vec<NewRecord>, ApiError> {
    let Some(Value::Array(items)) = body.remove("records") else {
        return Err(ApiError::bad_request(
            "an append needs \"records\": [{\"tags\": [...], \"data\": ...}, ...]",
        ));
    };
    check_count(items.len(), records_max)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let (tags, data) = record_from_json(item).map_err(|e| ApiError::from(e.at_op(i)))?;
            Ok(NewRecord::new(tags, &data))
        })
        .collect()
}

async fn append(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> ApiResult {
    let Path(name) = path.map_err(path_error)?;
    let bytes = crate::api::read_body(&core, body).await?;
    let (records, durability) = append_body(&bytes, core.config().append_records_max)?;
    let ok = core.append_as(&caller, name, records, durability).await?;
    Ok(Json(
        json!({"seq": ok.seq, "first": ok.first, "last": ok.last}),
    ))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendBody<'a> {
    #[serde(borrow)]
    records: Option<Vec<RecordIn<'a>>>,
    durability: Option<Value>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn<'a> {
    tags: Option<Vec<String>>,
    #[serde(borrow)]
    data: Option<&'a serde_json::value::RawValue>,
}

/// An append's body, parsed without turning each record's data into values: the data's
/// text is kept (see [`NewRecord::from_raw`]).
fn append_body(
    bytes: &[u8],
    records_max: usize,
) -> Result<(Vec<NewRecord>, Option<sluice_log::Durability>), ApiError> {
    let body: AppendBody<'_> = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "an append is {{\"records\": [{{\"tags\": [strings], \"data\": any}}, …], \"durability\"?}}: {e}"
        ))
    })?;
    let mut durability = Map::new();
    if let Some(d) = body.durability {
        durability.insert("durability".into(), d);
    }
    let durability = durability_of(&durability)?;
    let items = body.records.ok_or_else(|| {
        ApiError::bad_request(
            "an append needs \"records\": [{\"tags\": [...], \"data\": ...}, ...]",
        )
    })?;
    Ok((records_from_raw(items, records_max)?, durability))
}

/// The records of an append whose `records` array is still JSON text (an HTTP body, or a
/// WebSocket text frame): each record's data keeps its text.
pub(crate) fn parse_raw_records(
    records: &serde_json::value::RawValue,
    records_max: usize,
) -> Result<Vec<NewRecord>, ApiError> {
    let items: Vec<RecordIn<'_>> = serde_json::from_str(records.get()).map_err(|e| {
        ApiError::bad_request(format!(
            "\"records\" is [{{\"tags\": [strings], \"data\": any}}, …]: {e}"
        ))
    })?;
    records_from_raw(items, records_max)
}

fn records_from_raw(
    items: Vec<RecordIn<'_>>,
    records_max: usize,
) -> Result<Vec<NewRecord>, ApiError> {
    check_count(items.len(), records_max)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r.data {
            Some(data) => NewRecord::from_raw(r.tags.unwrap_or_default(), data).map_err(|e| {
                ApiError::bad_request(format!(
                    "the data of record {i} is not a JSON value Sluice can keep: {e}"
                ))
                .with("op", i)
            }),
            None => Ok(NewRecord::new(r.tags.unwrap_or_default(), &Value::Null)),
        })
        .collect()
}

fn check_count(n: usize, records_max: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::bad_request(
            "\"records\" is empty: append at least one record",
        ));
    }
    if n > records_max {
        return Err(ApiError::limit(format!(
            "an append of {n} records exceeds append_records_max (--max-append-records) of {records_max}"
        )));
    }
    Ok(())
}

/// `from`, `limit` and the repeated `tag` of a read or watch query string.
struct ReadParams {
    from: Option<u64>,
    limit: Option<u64>,
    filter: TagFilter,
}

fn read_params(pairs: Vec<(String, String)>) -> Result<ReadParams, ApiError> {
    let mut from = None;
    let mut limit = None;
    let mut tags = Vec::new();
    let number = |k: &str, v: &str| {
        v.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "query parameter {k:?} must be a non-negative integer, got {v:?}"
            ))
        })
    };
    for (k, v) in pairs {
        match k.as_str() {
            "from" => from = Some(number(&k, &v)?),
            "limit" => limit = Some(number(&k, &v)?),
            "tag" => tags.push(v),
            // Read by the authentication layer (watch URLs only; see docs/security.md).
            "access_token" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?} (expected from, limit, tag)"
                )))
            }
        }
    }
    let filter = TagFilter::parse(&tags)?;
    Ok(ReadParams {
        from,
        limit,
        filter,
    })
}

async fn read(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(path_error)?;
    let Query(pairs) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let p = read_params(pairs)?;
    let max = core.config().page_rows_max;
    let limit = p.limit.unwrap_or(100.min(max) as u64) as usize;
    if limit == 0 {
        return Err(ApiError::bad_request("\"limit\" must be at least 1"));
    }
    if limit > max {
        return Err(ApiError::limit(format!(
            "limit {limit} exceeds page_rows_max (--max-page-rows) of {max}"
        )));
    }
    let page = core
        .read_records_as(&caller, &name, p.from, limit, &p.filter)
        .await?;
    // The page is written as text around each record's stored JSON (no parse and print).
    let mut out = String::with_capacity(
        64 + page
            .records
            .iter()
            .map(|r| r.data.len() + 96)
            .sum::<usize>(),
    );
    out.push_str("{\"records\":[");
    for (i, r) in page.records.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        WireRecord::json_text(r, &mut out);
    }
    out.push_str(&format!(
        "],\"next\":{},\"first\":{}}}",
        page.next, page.first
    ));
    Ok(([(header::CONTENT_TYPE, "application/json")], out).into_response())
}

async fn watch_sse(
    State(core): St,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(path_error)?;
    let Query(mut pairs) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    // A watch's own parameter: records come in batches, at most one per window.
    let coalesce = pairs
        .iter()
        .position(|(k, _)| k == "coalesce_ms")
        .map(|i| pairs.remove(i).1);
    let coalesce_ms = crate::coalesce::coalesce_ms_text(coalesce.as_deref())?;
    let p = read_params(pairs)?;
    if p.limit.is_some() {
        return Err(ApiError::bad_request("a watch takes no \"limit\""));
    }
    let from = match headers.get("last-event-id") {
        Some(v) => {
            let last = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("the Last-Event-ID header must be a record offset")
                })?;
            Some(last + 1)
        }
        None => p.from,
    };
    let guard = core.authenticator().connect(&caller)?;
    let mut watch = core.watch_as(&caller, &name, from, p.filter).await?;
    watch.coalesce(crate::coalesce::window(coalesce_ms));
    let first = Bytes::from(format!(
        "event: watching\ndata: {}\n\n",
        json!({"topic": watch.topic(), "next": watch.start()})
    ));
    let heartbeat = core.config().live_heartbeat;
    let state = SseWatch {
        watch,
        closing: core.closing(),
        heartbeat,
        idle: Box::pin(tokio::time::sleep(heartbeat)),
        sent: false,
        first: Some(first),
        done: false,
    };
    // The guard counts this stream against the caller's connections while it is open.
    let stream = futures_util::stream::unfold((state, guard), |(mut s, g)| async move {
        let chunk = s.step().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), (s, g)))
    });
    let response = (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response();
    Ok(crate::static_files::compress_event_stream(
        &headers, response,
    ))
}

struct SseWatch {
    watch: Watch,
    closing: tokio::sync::watch::Receiver<bool>,
    heartbeat: Duration,
    /// Fires once per heartbeat period; a period in which something was sent needs no
    /// heartbeat (so a busy stream touches its timer once per period, not per record).
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    sent: bool,
    first: Option<Bytes>,
    done: bool,
}

impl SseWatch {
    /// The next chunk of the stream, `None` once it ended.
    async fn step(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        let next = loop {
            tokio::select! {
                biased;
                _ = self.closing.wait_for(|&c| c) => break Err(CoreError::ShuttingDown),
                r = self.watch.next() => break r,
                _ = self.idle.as_mut() => {
                    let deadline = tokio::time::Instant::now() + self.heartbeat;
                    self.idle.as_mut().reset(deadline);
                    if !std::mem::take(&mut self.sent) {
                        return Some(Bytes::from_static(b":\n\n"));
                    }
                }
            }
        };
        self.sent = true;
        let record = match next {
            Ok(r) => r,
            Err(e) => {
                self.done = true;
                return Some(error_event(e));
            }
        };
        // Whatever else is ready goes in the same chunk (one write for many records).
        let Some(Ok(second)) = self.watch.next().now_or_never() else {
            return Some(record.sse().clone());
        };
        let mut buf = Vec::with_capacity(record.sse().len() * 4);
        buf.extend_from_slice(record.sse());
        buf.extend_from_slice(second.sse());
        for _ in 2..SSE_CHUNK_RECORDS_MAX {
            if buf.len() >= SSE_CHUNK_BYTES_MAX {
                break;
            }
            match self.watch.next().now_or_never() {
                Some(Ok(r)) => buf.extend_from_slice(r.sse()),
                // An error is noticed again on the next step.
                _ => break,
            }
        }
        Some(Bytes::from(buf))
    }
}

/// The final `event: error` of a watch that the server ended.
fn error_event(e: CoreError) -> Bytes {
    let e = ApiError::from(e);
    let mut error = Map::new();
    error.insert("code".into(), Value::from(e.code));
    error.insert("message".into(), Value::from(e.message));
    error.extend(e.details);
    Bytes::from(format!(
        "event: error\ndata: {}\n\n",
        json!({ "error": error })
    ))
}
