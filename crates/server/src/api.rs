//! The HTTP API under `/v1`, `/health` and `/metrics`.
//!
//! Every error is `{"error":{"code","message",...}}` with a fitting status; every limit is
//! named in the message of the error that enforces it. Handlers parse and check shape
//! here; schema-level checks happen in the writer against the current schema.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Map, Value};
use sluice_engine::db::row_to_json;
use sluice_engine::{ChangeOp, CommitBody, ErrorCode, Key, SchemaChange, TopicChange, TxError};
use sluice_log::Durability;

use crate::auth::Caller;
use crate::core::{Core, Op};
use crate::error::CoreError;

/// An error as the client sees it.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Extra fields of the error object (`op`, `statement`, `horizon`, …).
    pub details: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: Map::new(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "limit", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
    }
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }
    pub fn poisoned(reason: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "log_poisoned",
            format!("the log is poisoned after a failed write or sync ({reason}); writes are refused until restart"),
        )
    }
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::Tx(e) => e.into(),
            CoreError::Function(e) => e.into(),
            CoreError::Query(e) => e.into(),
            CoreError::Limit(message) => ApiError::limit(message),
            CoreError::ShuttingDown => ApiError::shutting_down(),
            CoreError::Poisoned(reason) => ApiError::poisoned(&reason),
            CoreError::Busy(message) => ApiError::busy(message),
            e @ CoreError::Horizon { first, .. } => {
                ApiError::new(StatusCode::GONE, "horizon", e.to_string()).with("first", first)
            }
            e @ CoreError::Lagging { next, .. } => {
                ApiError::new(StatusCode::CONFLICT, "lagging", e.to_string()).with("next", next)
            }
            CoreError::Internal(message) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
            e @ CoreError::NotLeader { .. } => {
                let message = e.to_string();
                let CoreError::NotLeader { leader } = e else {
                    unreachable!()
                };
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", message)
                    .with("leader", leader)
            }
            e @ CoreError::Replication(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "replication_failed",
                e.to_string(),
            ),
            CoreError::Statement { statement, error } => {
                let mut e = ApiError::from(*error).with("statement", statement);
                e.message = format!("statement {statement}: {}", e.message);
                e
            }
            CoreError::Forbidden {
                message,
                op,
                command,
                target,
                policies,
            } => {
                let mut e = ApiError::forbidden(message)
                    .with("command", command)
                    .with(
                        if command == "call" {
                            "function"
                        } else {
                            "table"
                        },
                        target,
                    )
                    .with("policies", policies);
                if let Some(op) = op {
                    e = e.with("op", op);
                }
                e
            }
        }
    }
}

impl From<TxError> for ApiError {
    fn from(e: TxError) -> Self {
        let status = match e.code {
            ErrorCode::Conflict | ErrorCode::AlreadyExists => StatusCode::CONFLICT,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::Schema | ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Limit => StatusCode::PAYLOAD_TOO_LARGE,
        };
        let mut err = ApiError::new(status, e.code.as_str(), e.message);
        if let Some(op) = e.op {
            err = err.with("op", op);
        }
        err
    }
}

impl From<sluice_sql::SqlError> for ApiError {
    fn from(e: sluice_sql::SqlError) -> Self {
        use sluice_sql::SqlError;
        match e {
            SqlError::Syntax(m) => ApiError::bad_request(format!("SQL syntax error: {m}")),
            SqlError::Unsupported(m) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "unsupported",
                format!("unsupported: {m}"),
            ),
            SqlError::Schema(m) => ApiError::new(StatusCode::BAD_REQUEST, "schema", m),
        }
    }
}

impl From<sluice_query::QueryError> for ApiError {
    fn from(e: sluice_query::QueryError) -> Self {
        use sluice_query::QueryError as Q;
        let message = e.to_string();
        match e {
            Q::Unsupported(_) => ApiError::new(StatusCode::BAD_REQUEST, "unsupported", message),
            Q::Schema(_) => ApiError::new(StatusCode::BAD_REQUEST, "schema", message),
            Q::NotFound(_) => ApiError::not_found(message),
            Q::Limit(_) => ApiError::limit(message),
            Q::RulesChanged(_) => ApiError::new(StatusCode::CONFLICT, "rules_changed", message),
            _ => ApiError::bad_request(message),
        }
    }
}

impl From<sluice_functions::FunctionError> for ApiError {
    fn from(e: sluice_functions::FunctionError) -> Self {
        use sluice_functions::FunctionError as F;
        let message = e.to_string();
        match e {
            F::Compile { line, .. } => {
                let err = ApiError::new(StatusCode::BAD_REQUEST, "compile_error", message);
                match line {
                    Some(line) => err.with("line", line),
                    None => err,
                }
            }
            F::NotFound(_) => ApiError::not_found(message),
            F::Forbidden(_) => ApiError::forbidden(message),
            F::Thrown(_) => ApiError::new(StatusCode::BAD_REQUEST, "function_error", message),
            F::Timeout(_) | F::OutOfMemory(_) => ApiError::limit(message),
            F::Value(_) => ApiError::bad_request(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let limit = (self.code == "limit")
            .then(|| crate::auth::limit_flag(&self.message))
            .flatten();
        let mut body = Map::new();
        body.insert("code".into(), Value::from(self.code));
        body.insert("message".into(), Value::from(self.message));
        body.extend(self.details);
        let mut response = (self.status, Json(json!({ "error": body }))).into_response();
        if let Some(flag) = limit {
            response
                .extensions_mut()
                .insert(crate::auth::LimitRefusal(flag));
        }
        response
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

/// The whole HTTP API over `core`.
pub fn router(core: Core) -> Router {
    let router = Router::new()
        .route("/", get(crate::static_files::root))
        .route("/console", get(crate::static_files::console_redirect))
        .route("/console/", get(crate::static_files::console_index))
        .route("/console/{*path}", get(crate::static_files::console_asset))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/sql", post(sql))
        .route("/v1/mutate", post(mutate))
        .route("/v1/query", post(query))
        .route("/v1/tables", get(tables))
        .route("/v1/tables/{table}/rows", get(scan))
        .route("/v1/tables/{table}/rows/{id}", get(get_row))
        .route("/v1/changes", get(changes))
        .route("/v1/admin/snapshot", post(snapshot))
        .route("/v1/call/{name}", post(call))
        .route("/v1/ws", get(crate::ws::upgrade))
        .route("/v1/live", get(crate::live::sse))
        .route("/v1/functions", get(list_functions).put(put_functions))
        .route("/v1/policies", get(policies));
    let core = Arc::new(core);
    let routes = crate::topics_api::routes(router)
        .fallback(crate::static_files::fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(core.clone());
    // The layers wrap the whole router once, not each route: `Router::layer` wraps every
    // route's boxed service, so a request cloned and boxed its way through each layer
    // (callgrind, `POST /v1/call`: seven boxed-service clones and five boxed futures per
    // request). Outermost, a browser's preflight carries no token and is answered by CORS.
    // Without `--cors-origin` there is no CORS layer at all: it would add no header to any
    // response (a preflight then meets the token check and is refused, which a browser
    // treats as the same "no"), and it cost ~6 K instructions per request.
    let authenticated = crate::static_files::compress_if_accepted(
        tower::ServiceBuilder::new()
            .layer(axum::middleware::from_fn_with_state(
                core.clone(),
                crate::auth::authenticate,
            ))
            .service(routes),
    );
    match cors(&core.config().cors_origins) {
        Some(cors) => Router::new().fallback_service(tower::Layer::layer(&cors, authenticated)),
        None => Router::new().fallback_service(authenticated),
    }
}

/// CORS for `--cors-origin`: none (same origin only) unless origins are named. Tokens travel
/// in `Authorization`, never in cookies, so no credentials mode is needed.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| axum::http::HeaderValue::from_str(o).ok()),
        )
    };
    let layer = CorsLayer::new()
        .allow_origin(origin)
        .allow_methods([
            axum::http::Method::GET,
            axum::http::Method::POST,
            axum::http::Method::PUT,
            axum::http::Method::DELETE,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("last-event-id"),
        ])
        .max_age(std::time::Duration::from_secs(600));
    Some(layer)
}

type St = State<Arc<Core>>;

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

pub(crate) async fn fallback(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

/// Reads the whole body, enforcing `body_bytes_max` and, while it waits, the idle limit
/// (`serve::IdleBody`).
pub(crate) async fn read_body(core: &Core, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let max = core.config().body_bytes_max;
    axum::body::to_bytes(body, max).await.map_err(|e| {
        let e = e.into_inner();
        if let Some(idle) = cause::<crate::serve::BodyIdle>(&*e) {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "timeout", idle.to_string())
        } else if cause::<http_body_util::LengthLimitError>(&*e).is_some() {
            ApiError::limit(format!(
                "request body exceeds body_bytes_max (--max-body-bytes) of {max} bytes"
            ))
        } else {
            ApiError::bad_request(format!("the request body could not be read: {e}"))
        }
    })
}

/// The first error of type `E` in `e`'s chain of sources.
fn cause<'e, E: std::error::Error + 'static>(
    mut e: &'e (dyn std::error::Error + 'static),
) -> Option<&'e E> {
    loop {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        e = e.source()?;
    }
}

/// Reads the whole body as a JSON object, enforcing `body_bytes_max`.
pub(crate) async fn json_body(core: &Core, body: Body) -> Result<Map<String, Value>, ApiError> {
    let bytes = read_body(core, body).await?;
    json_object(&bytes)
}

/// A body already read, as a JSON object.
fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
    }
}

/// The optional `"durability"` of a request (HTTP body or WebSocket message).
pub(crate) fn durability_of(body: &Map<String, Value>) -> Result<Option<Durability>, ApiError> {
    match body.get("durability") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(ApiError::bad_request),
        Some(_) => Err(ApiError::bad_request(
            "\"durability\" must be one of \"memory\", \"disk\", \"fsync\", \"replicated\"",
        )),
    }
}

async fn health(State(core): St) -> Response {
    match core.poisoned() {
        None => Json(json!({"status": "ok", "seq": core.confirmed_seq()})).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "poisoned", "seq": core.confirmed_seq(), "reason": reason})),
        )
            .into_response(),
    }
}

async fn metrics(State(core): St, Extension(caller): Extension<Caller>) -> Response {
    if let Err(e) = caller.require_admin("GET /metrics") {
        return e.into_response();
    }
    core.startup_checked().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(&core),
    )
        .into_response()
}

/// `POST /v1/sql`: schema statements (admin only) or a script of data statements, each as
/// one transaction (docs/api.md, "SQL").
async fn sql(State(core): St, Extension(caller): Extension<Caller>, body: Body) -> ApiResult {
    let body = json_body(&core, body).await?;
    if let Some(extra) = body
        .keys()
        .find(|k| !["sql", "params", "durability", "as"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?} in a SQL request"
        )));
    }
    let durability = durability_of(&body)?;
    let Some(Value::String(text)) = body.get("sql") else {
        return Err(ApiError::bad_request("expected {\"sql\": \"…\"}"));
    };
    let caller = run_as(caller, body.get("as"))?;
    let script = sluice_query::script::Script::parse(text)?;
    if script.is_ddl() {
        caller.require_admin("POST /v1/sql with schema statements (DDL and policies)")?;
        return ddl(&core, text, script.kinds().len(), durability).await;
    }
    if let Some(i) = script.mixed_ddl() {
        return Err(ApiError::from(sluice_query::QueryError::unsupported(
            "schema statements and data statements in one request; send them separately",
        ))
        .with("statement", i));
    }
    let params = sluice_query::Params::from_json(body.get("params"))?;
    let kinds = script.kinds().to_vec();
    let ok = core
        .sql_as(&caller, Arc::new(script), params, durability)
        .await?;
    let results: Vec<Value> = ok
        .outcomes
        .iter()
        .zip(kinds)
        .enumerate()
        .map(|(i, (outcome, kind))| match outcome {
            sluice_query::script::Outcome::Rows(result) => {
                let mut entry = Map::new();
                entry.insert("statement".into(), i.into());
                entry.insert("kind".into(), kind.as_str().into());
                entry.extend(result_fields(result));
                Value::Object(entry)
            }
            sluice_query::script::Outcome::Written { results, .. } => json!({
                "statement": i,
                "kind": kind.as_str(),
                "count": results.len(),
                "results": results_json(results),
            }),
        })
        .collect();
    Ok(Json(
        json!({"seq": ok.seq, "changed": false, "results": results}),
    ))
}

/// The caller a request runs as: the admin may name claims to act as a client holding them
/// (`"as": {claims}`, the console's preview); a client may not.
fn run_as(caller: Caller, claims: Option<&Value>) -> Result<Caller, ApiError> {
    let Some(claims) = claims else {
        return Ok(caller);
    };
    caller.require_admin("\"as\" (running a request as other claims)")?;
    let Value::Object(all) = claims else {
        return Err(ApiError::bad_request(
            "\"as\" must be an object of claims, e.g. {\"sub\": \"alice\"}",
        ));
    };
    let sub = match all.get("sub") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    Ok(Caller::Client(Arc::new(crate::auth::Claims {
        sub,
        all: all.clone(),
    })))
}

/// Schema statements, as one transaction.
async fn ddl(
    core: &Core,
    text: &str,
    statements: usize,
    durability: Option<Durability>,
) -> ApiResult {
    let ddl = sluice_sql::parse_ddl(text)?;
    let sql_text = ddl
        .iter()
        .map(|d| d.sql.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let changes = ddl.into_iter().map(|d| d.change).collect();
    let (seq, changed) = match core.ddl(changes, sql_text, durability).await {
        Ok(Some(seq)) => (seq, true),
        Ok(None) => (core.confirmed_seq(), false),
        Err(e) => {
            let mut e = ApiError::from(e);
            // For SQL, the failing op is a statement.
            if let Some(i) = e.details.remove("op") {
                e.details.insert("statement".into(), i);
            }
            return Err(e);
        }
    };
    let results: Vec<Value> = (0..statements)
        .map(|i| json!({"statement": i, "kind": "ddl", "changed": changed}))
        .collect();
    Ok(Json(
        json!({"seq": seq, "changed": changed, "results": results}),
    ))
}

/// `POST /v1/query` `{"sql", "params"}`: one `SELECT` over one confirmed seq.
async fn query(State(core): St, Extension(caller): Extension<Caller>, body: Body) -> ApiResult {
    let body = json_body(&core, body).await?;
    if let Some(extra) = body
        .keys()
        .find(|k| !["sql", "params", "as"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?} in a query"
        )));
    }
    let Some(Value::String(sql)) = body.get("sql") else {
        return Err(ApiError::bad_request("expected {\"sql\": \"SELECT …\"}"));
    };
    let caller = run_as(caller, body.get("as"))?;
    let params = sluice_query::Params::from_json(body.get("params"))?;
    let (result, seq) = core.query_as(&caller, sql, &params).await?;
    Ok(Json(query_json(&result, seq)))
}

/// The reply to a one-shot query: `{"seq", "columns", "types", "rows": [{…}, …]}`.
pub(crate) fn query_json(result: &sluice_query::QueryResult, seq: u64) -> Value {
    let mut reply = Map::new();
    reply.insert("seq".into(), seq.into());
    reply.extend(result_fields(result));
    Value::Object(reply)
}

/// A query result's `columns`, `types` and `rows` (as objects), for a query reply or a
/// `/v1/sql` `select` entry.
fn result_fields(result: &sluice_query::QueryResult) -> Map<String, Value> {
    let rows: Vec<Value> = result
        .rows
        .iter()
        .map(|row| {
            let mut object = Map::with_capacity(row.len());
            for (name, value) in result.columns.iter().zip(row) {
                object.insert(name.clone(), value.to_json());
            }
            Value::Object(object)
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("columns".into(), json!(result.columns));
    fields.insert(
        "types".into(),
        sluice_query::plan::types_json(&result.types),
    );
    fields.insert("rows".into(), Value::Array(rows));
    fields
}

/// Parses (and takes) the `ops` array of a mutate; rows move into the ops, uncopied.
pub fn parse_ops(body: &mut Map<String, Value>, ops_max: usize) -> Result<Vec<Op>, ApiError> {
    let Some(Value::Array(ops)) = body.remove("ops") else {
        return Err(ApiError::bad_request("expected {\"ops\": [ … ]}"));
    };
    if ops.is_empty() {
        return Err(ApiError::bad_request(
            "\"ops\" is empty; a mutate needs at least one op",
        ));
    }
    if ops.len() > ops_max {
        return Err(ApiError::limit(format!(
            "{} ops in one mutate; ops_per_mutate_max (--max-ops) is {ops_max}",
            ops.len()
        )));
    }
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| parse_op(op).map_err(|e| ApiError::bad_request(e).with("op", i)))
        .collect()
}

fn parse_op(op: Value) -> Result<Op, String> {
    let Value::Object(mut op) = op else {
        return Err("an op must be a JSON object".into());
    };
    let kind = match op.get("op").and_then(Value::as_str) {
        Some(k @ ("insert" | "upsert" | "patch" | "delete")) => k.to_string(),
        Some(other) => {
            return Err(format!(
                "unknown op {other:?}: expected insert, upsert, patch or delete"
            ))
        }
        None => {
            return Err(
                "an op needs \"op\": \"insert\" | \"upsert\" | \"patch\" | \"delete\"".into(),
            )
        }
    };
    let allowed: &[&str] = match kind.as_str() {
        "insert" | "upsert" => &["op", "table", "row", "if_version"],
        "patch" => &["op", "table", "id", "set", "if_version"],
        _ => &["op", "table", "id", "if_version"],
    };
    if let Some(extra) = op.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("unknown field {extra:?} in a {kind} op"));
    }
    let table = match op.remove("table") {
        Some(Value::String(t)) => t,
        _ => return Err("an op needs \"table\": \"name\"".into()),
    };
    let if_version = match op.remove("if_version") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or("\"if_version\" must be a non-negative integer")?,
        ),
    };
    let mut object = |field: &str| -> Result<Map<String, Value>, String> {
        match op.remove(field) {
            Some(Value::Object(m)) => Ok(m),
            _ => Err(format!("a {kind} op needs \"{field}\": {{ … }}")),
        }
    };
    Ok(match kind.as_str() {
        "insert" => Op::Insert {
            table,
            row: object("row")?,
            if_version,
        },
        "upsert" => Op::Upsert {
            table,
            row: object("row")?,
            if_version,
        },
        "patch" => {
            let set = object("set")?;
            Op::Patch {
                table,
                id: take_id(&mut op, &kind)?,
                set,
                if_version,
            }
        }
        _ => Op::Delete {
            table,
            id: take_id(&mut op, &kind)?,
            if_version,
        },
    })
}

fn take_id(op: &mut Map<String, Value>, kind: &str) -> Result<Value, String> {
    match op.remove("id") {
        None | Some(Value::Null) => Err(format!("a {kind} op needs \"id\"")),
        Some(v) => Ok(v),
    }
}

/// The ops of a mutate body's JSON text, parsed the general way (no limit on their count
/// when `ops_max` is `usize::MAX`).
pub fn parse_ops_json(body: &[u8], ops_max: usize) -> Result<Vec<Op>, ApiError> {
    parse_ops(&mut json_object(body)?, ops_max)
}

async fn mutate(
    State(core): St,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&core, body).await?;
    // The common case: decoded straight into rows here, off the writer thread. Anything
    // the decoder is unsure of (every refusal among it) takes the general path below.
    let ok = match core.decode_mutate(bytes.clone()) {
        Some(decoded) => core.mutate_decoded_as(&caller, decoded).await?,
        None => mutate_general(&core, &caller, &bytes).await?,
    };
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        mutate_reply_json(ok.seq, &ok.results),
    )
        .into_response())
}

/// A mutate body parsed into JSON values, checked for shape, and converted on the writer.
async fn mutate_general(
    core: &Core,
    caller: &Caller,
    bytes: &[u8],
) -> Result<crate::core::MutateOk, ApiError> {
    let mut body = json_object(bytes)?;
    let durability = durability_of(&body)?;
    if let Some(extra) = body
        .keys()
        .find(|k| !["ops", "durability"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?} in a mutate"
        )));
    }
    let ops = parse_ops(&mut body, core.config().ops_per_mutate_max)?;
    Ok(core.mutate_as(caller, ops, durability).await?)
}

/// A mutate's reply `{"seq", "results": [{"table", "id", "version"}, …]}` as JSON text,
/// written by hand: the bytes `serde_json` writes for [`MutateReply`] (a test holds the two
/// equal), at about a sixth of its instructions. Through `serde_json` the reply to a
/// 100-row mutate cost about half as much as decoding the body: each field went through
/// the serializer's escaping and the response buffer's writer a few bytes at a time.
pub(crate) fn mutate_reply_json(seq: u64, results: &[sluice_engine::WriteResult]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + results.len() * RESULT_JSON_BYTES_TYPICAL);
    out.extend_from_slice(b"{\"seq\":");
    out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
    out.extend_from_slice(b",\"results\":");
    write_results_json(results, &mut out);
    out.push(b'}');
    out
}

/// Bytes of one result object with a short table name and key (the reply's first guess).
const RESULT_JSON_BYTES_TYPICAL: usize = 48;

/// `results` as the JSON array [`ResultsSer`] serialises, appended to `out`. A run of
/// results of one table escapes its name once and copies it after that.
pub(crate) fn write_results_json(results: &[sluice_engine::WriteResult], out: &mut Vec<u8>) {
    let mut numbers = itoa::Buffer::new();
    let mut last = None;
    out.push(b'[');
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"table\":");
        push_table_name(out, &mut last, &r.table, json_value);
        out.extend_from_slice(b",\"id\":");
        match &r.key {
            Key::Int(id) => out.extend_from_slice(numbers.format(*id).as_bytes()),
            Key::Text(id) => json_value(out, &**id),
        }
        out.extend_from_slice(b",\"version\":");
        out.extend_from_slice(numbers.format(r.version).as_bytes());
        out.push(b'}');
    }
    out.push(b']');
}

/// The table of the result before and where its encoded name lies in the reply: what
/// [`push_table_name`] copies for the next result of the same table.
pub(crate) type LastTable<'t> =
    Option<(&'t Arc<sluice_engine::TableSchema>, std::ops::Range<usize>)>;

/// Appends `table`'s name to a reply as `encode` writes it, or, when the result before was
/// of the same table (`last`), copies the bytes written then: a mutate's results come in
/// runs of one table, whose name is encoded once per run.
pub(crate) fn push_table_name<'t>(
    out: &mut Vec<u8>,
    last: &mut LastTable<'t>,
    table: &'t Arc<sluice_engine::TableSchema>,
    encode: impl FnOnce(&mut Vec<u8>, &str),
) {
    match last {
        Some((before, name)) if Arc::ptr_eq(before, table) => {
            out.extend_from_within(name.clone());
        }
        _ => {
            let start = out.len();
            encode(out, &table.name);
            *last = Some((table, start..out.len()));
        }
    }
}

/// A mutate's reply `{"seq", "results": [{"table", "id", "version"}, …]}`, serialised
/// straight from the results (no JSON value per row). What [`mutate_reply_json`] writes
/// by hand, kept as the reference it is tested against.
#[cfg(test)]
pub(crate) struct MutateReply<'a> {
    pub seq: u64,
    pub results: &'a [sluice_engine::WriteResult],
}

#[cfg(test)]
impl serde::Serialize for MutateReply<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("seq", &self.seq)?;
        m.serialize_entry("results", &ResultsSer(self.results))?;
        m.end()
    }
}

/// `results` of a committed mutate, serialised in place: the reference the hand-written
/// replies ([`write_results_json`], `ws::mutate_result_msgpack`) are tested against.
#[cfg(test)]
pub(crate) struct ResultsSer<'a>(pub &'a [sluice_engine::WriteResult]);

#[cfg(test)]
impl serde::Serialize for ResultsSer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        struct One<'a>(&'a sluice_engine::WriteResult);
        impl serde::Serialize for One<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("table", &self.0.table.name)?;
                match &self.0.key {
                    Key::Int(i) => m.serialize_entry("id", i)?,
                    Key::Text(t) => m.serialize_entry("id", &**t)?,
                }
                m.serialize_entry("version", &self.0.version)?;
                m.end()
            }
        }
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for r in self.0 {
            seq.serialize_element(&One(r))?;
        }
        seq.end()
    }
}

/// The `results` of a committed mutate, as HTTP and WebSocket replies carry them.
pub(crate) fn results_json(results: &[sluice_engine::WriteResult]) -> Vec<Value> {
    results
        .iter()
        .map(|r| json!({"table": r.table.name, "id": r.key.to_json(), "version": r.version}))
        .collect()
}

/// `GET /v1/policies` (admin): every row policy.
async fn policies(State(core): St, Extension(caller): Extension<Caller>) -> ApiResult {
    caller.require_admin("GET /v1/policies")?;
    let (policies, seq) = core
        .read(|db| {
            Ok(db
                .tables
                .values()
                .flat_map(|t| t.policies.iter().map(|p| p.to_json(&t.schema.name)))
                .collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(json!({"policies": policies, "seq": seq})))
}

async fn tables(State(core): St) -> ApiResult {
    let (tables, seq) = core
        .read(|db| {
            Ok(db
                .tables
                .values()
                .map(|t| t.schema.to_json())
                .collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(json!({"tables": tables, "seq": seq})))
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request(format!("bad path: {e}"))
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::bad_request(format!("bad query string: {e}"))
}

async fn get_row(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((table, id)) = path.map_err(path_error)?;
    // A point read (`crate::point`): under the read lock, confirmed without waiting when
    // the row's own commit already is.
    let got = core
        .get(&caller, &table, crate::point::Given::Text(&id))
        .await?;
    let Some(row) = &got.row else {
        // Absent, or not readable by this client: the two read the same.
        let key = sluice_engine::Key::parse(got.schema.pk_column().ty, &id)
            .map(|k| k.to_string())
            .unwrap_or(id);
        return Err(ApiError::not_found(format!(
            "table {table:?} has no row with key {key}"
        )));
    };
    #[derive(serde::Serialize)]
    struct Reply<'a> {
        row: crate::point::RowSer<'a>,
        version: u64,
        seq: u64,
    }
    let reply = Reply {
        row: crate::point::RowSer {
            schema: &got.schema,
            values: &row.values,
        },
        version: row.version,
        seq: got.seq,
    };
    Ok(Json(reply).into_response())
}

/// `GET /v1/tables/{t}/rows?index=NAME&value=V` (or `column=C&value=V`): one page of the
/// rows holding `V` in an indexed column, in primary key order (`crate::point`).
async fn find_rows(
    core: &Core,
    caller: &Caller,
    table: &str,
    params: &HashMap<String, String>,
    limit: usize,
) -> ApiResult {
    let by = match (params.get("index"), params.get("column")) {
        (Some(name), None) => crate::point::IndexBy::Name(name),
        (None, Some(column)) => crate::point::IndexBy::Column(column),
        _ => {
            return Err(ApiError::bad_request(
                "a lookup by value takes \"index\" or \"column\" (one of them) and \"value\"",
            ))
        }
    };
    let value = params.get("value").ok_or_else(|| {
        ApiError::bad_request("a lookup by \"index\" or \"column\" needs \"value\"")
    })?;
    let lookup = crate::point::IndexLookup {
        by,
        value: crate::point::Given::Text(value),
        after: params
            .get("after")
            .map(|a| crate::point::Given::Text(a.as_str())),
        limit,
    };
    let found = core.find(caller, table, lookup).await?;
    let rows: Vec<Value> = found
        .rows
        .iter()
        .map(|r| {
            json!({"row": sluice_engine::db::row_to_json(&found.schema, &r.values), "version": r.version})
        })
        .collect();
    let next = found.next.as_ref().map(Key::to_json);
    Ok(Json(json!({"rows": rows, "next": next, "seq": found.seq})))
}

fn param_u64(params: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiError> {
    params
        .get(name)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "query parameter {name:?} must be a non-negative integer, got {v:?}"
                ))
            })
        })
        .transpose()
}

fn page_limit(core: &Core, params: &HashMap<String, String>) -> Result<usize, ApiError> {
    let max = core.config().page_rows_max;
    let limit = param_u64(params, "limit")?.unwrap_or(100.min(max) as u64) as usize;
    if limit == 0 {
        return Err(ApiError::bad_request("\"limit\" must be at least 1"));
    }
    if limit > max {
        return Err(ApiError::limit(format!(
            "limit {limit} exceeds page_rows_max (--max-page-rows) of {max}"
        )));
    }
    Ok(limit)
}

async fn scan(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> ApiResult {
    let Path(table) = path.map_err(path_error)?;
    let Query(params) = query.map_err(query_error)?;
    let limit = page_limit(&core, &params)?;
    if params.contains_key("index") || params.contains_key("column") || params.contains_key("value")
    {
        return find_rows(&core, &caller, &table, &params, limit).await;
    }
    let after = params.get("after").cloned();
    let ((rows, next), seq) = core
        .read(|db| {
            let t = db.table(&table)?;
            let range = match &after {
                Some(a) => {
                    let key = Key::parse(t.schema.pk_column().ty, a).map_err(TxError::schema)?;
                    t.rows
                        .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
                }
                None => t.rows.range(..),
            };
            // A client's read rule with its claims bound once for the whole page.
            let read = match caller.claims() {
                Some(claims) => {
                    let rules = core.rules(db, &table).map_err(core_to_tx)?;
                    let bound = rules
                        .read
                        .bind(db, &claims.all)
                        .map_err(|e| core_to_tx(e.into()))?;
                    Some((rules, bound))
                }
                None => None,
            };
            let mut rows = Vec::with_capacity(limit.min(1024));
            let mut last = None;
            // A client's page skips rows it may not read, examining a bounded number of rows
            // (the page then ends early with `next` set, like any page).
            for (examined, (key, row)) in range.enumerate() {
                if rows.len() >= limit || examined >= SCAN_EXAMINED_ROWS_MAX {
                    break;
                }
                last = Some(key);
                if let Some((rules, bound)) = &read {
                    if !rules.read.allows(&row.values, bound) {
                        continue;
                    }
                }
                rows.push(
                    json!({"row": row_to_json(&t.schema, &row.values), "version": row.version}),
                );
            }
            let more = last.is_some_and(|k| {
                t.rows
                    .range((
                        std::ops::Bound::Excluded(k.clone()),
                        std::ops::Bound::Unbounded,
                    ))
                    .next()
                    .is_some()
            });
            let next = if more { last.map(Key::to_json) } else { None };
            Ok((rows, next))
        })
        .await?;
    Ok(Json(json!({"rows": rows, "next": next, "seq": seq})))
}

/// Rows examined at most per scan page, however many a client's read rule skips.
const SCAN_EXAMINED_ROWS_MAX: usize = 100_000;

fn core_to_tx(e: CoreError) -> TxError {
    match e {
        CoreError::Tx(e) => e,
        other => TxError::new(ErrorCode::BadRequest, other.to_string()),
    }
}

/// Commits scanned at most per catch-up request, however many a table filter skips.
const CHANGES_SCAN_COMMITS_MAX: usize = 100_000;

async fn changes(
    State(core): St,
    Extension(caller): Extension<Caller>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> ApiResult {
    let Query(params) = query.map_err(query_error)?;
    let since = param_u64(&params, "since")?.unwrap_or(0);
    let limit = page_limit(&core, &params)?;
    let tables: Option<Vec<String>> = params
        .get("tables")
        .filter(|t| !t.is_empty())
        .map(|t| t.split(',').map(|s| s.trim().to_string()).collect());
    let confirmed = core.confirmed_seq();
    let db = core.db();
    let commits = db.changelog.since(since).map_err(|horizon| {
        ApiError::new(
            StatusCode::GONE,
            "horizon",
            format!("changes after seq {since} are no longer retained; the horizon is seq {horizon}: re-read the tables, then catch up from their seq"),
        )
        .with("horizon", horizon)
    })?;
    let wanted = |t: &str| tables.as_ref().is_none_or(|ts| ts.iter().any(|w| w == t));
    let mut sight = caller.claims().map(|c| Sight::new(&core, &db, c));
    let mut out = Vec::new();
    let mut next = since.max(db.changelog.horizon()).min(confirmed);
    for commit in commits.take(CHANGES_SCAN_COMMITS_MAX) {
        if commit.seq > confirmed || out.len() >= limit {
            break;
        }
        match &commit.body {
            CommitBody::Rows(changes) => {
                for c in changes.iter().filter(|c| wanted(&c.table.name)) {
                    let mut op = match c.op {
                        ChangeOp::Insert => "insert",
                        ChangeOp::Update => "update",
                        ChangeOp::Delete => "delete",
                    };
                    let mut row = c.row_json();
                    if let Some(sight) = &mut sight {
                        let was = c.old.as_deref().is_some_and(|r| sight.reads(c, r));
                        let is = c.row.as_deref().is_some_and(|r| sight.reads(c, r));
                        match (was, is) {
                            (_, true) => {}
                            // The row left the caller's sight.
                            (true, false) => {
                                op = "delete";
                                row = Value::Null;
                            }
                            (false, false) => continue,
                        }
                    }
                    out.push(json!({
                        "seq": commit.seq, "table": c.table.name, "op": op,
                        "id": c.key.to_json(), "row": row, "version": c.version,
                    }));
                }
            }
            CommitBody::Schema { changes, sql } => {
                for c in changes.iter().filter(|c| wanted(c.table())) {
                    out.push(match c {
                        SchemaChange::CreatePolicy { table, policy } => json!({
                            "seq": commit.seq, "table": table, "op": "create_policy",
                            "name": policy.name, "sql": sql,
                        }),
                        SchemaChange::DropPolicy { table, name, .. } => json!({
                            "seq": commit.seq, "table": table, "op": "drop_policy",
                            "name": name, "sql": sql,
                        }),
                        _ => json!({"seq": commit.seq, "table": c.table(), "op": "schema", "sql": sql}),
                    });
                }
            }
            CommitBody::Topic(change)
                if tables.is_none()
                    && sight
                        .as_ref()
                        .is_none_or(|s| s.reads_topic(topic_of(change))) =>
            {
                let (name, op) = match change {
                    TopicChange::Put {
                        name,
                        created: true,
                        ..
                    } => (name, "create_topic"),
                    TopicChange::Put { name, .. } => (name, "alter_topic"),
                    TopicChange::Drop { name } => (name, "drop_topic"),
                    TopicChange::Rules { name, .. } => (name, "alter_topic"),
                    TopicChange::Trim { name, first } => {
                        out.push(json!({"seq": commit.seq, "topic": name, "op": "trim_topic", "first": first}));
                        next = commit.seq;
                        continue;
                    }
                };
                out.push(json!({"seq": commit.seq, "topic": name, "op": op}));
            }
            CommitBody::Topic(_) => {}
        }
        if tables.is_none() {
            for a in &commit.appends {
                if sight.as_ref().is_some_and(|s| !s.reads_topic(&a.topic)) {
                    continue;
                }
                let (first, last) = (a.records[0].offset, a.records[a.records.len() - 1].offset);
                out.push(json!({"seq": commit.seq, "topic": &*a.topic, "op": "append", "first": first, "last": last}));
            }
        }
        next = commit.seq;
    }
    drop(db);
    Ok(Json(json!({"changes": out, "next": next})))
}

fn topic_of(change: &TopicChange) -> &str {
    match change {
        TopicChange::Put { name, .. }
        | TopicChange::Drop { name }
        | TopicChange::Rules { name, .. }
        | TopicChange::Trim { name, .. } => name,
    }
}

/// A table's read rule, bound to the client (claim values, subquery results).
type BoundRead = (
    Arc<sluice_query::rules::TableRules>,
    sluice_query::rules::Bound,
);

/// What a client may see of the changelog: rows its tables' read rules pass (under today's
/// policies), topics it may read whole.
struct Sight<'a> {
    core: &'a Core,
    db: &'a sluice_engine::Db,
    claims: &'a crate::auth::Claims,
    /// Compiled read rules by table with the client's claims bound (`None`: the table is
    /// gone, nothing of it is readable).
    tables: HashMap<String, Option<BoundRead>>,
}

impl<'a> Sight<'a> {
    fn new(core: &'a Core, db: &'a sluice_engine::Db, claims: &'a crate::auth::Claims) -> Self {
        Sight {
            core,
            db,
            claims,
            tables: HashMap::new(),
        }
    }

    /// Whether `row`, an image of change `c`'s row, is readable now.
    fn reads(&mut self, c: &sluice_engine::Change, row: &[sluice_engine::Value]) -> bool {
        let (core, db, claims) = (self.core, self.db, self.claims);
        let rules = self.tables.entry(c.table.name.clone()).or_insert_with(|| {
            let rules = core.rules(db, &c.table.name).ok()?;
            // A rule whose subqueries cannot be evaluated shows nothing (fails closed).
            let bound = rules.read.bind(db, &claims.all).ok()?;
            Some((rules, bound))
        });
        let Some((rules, bound)) = rules else {
            return false;
        };
        let Ok(t) = db.table(&c.table.name) else {
            return false;
        };
        // A row written before an ADD COLUMN is narrower: the new columns hold their default.
        let width = t.schema.columns.len();
        if row.len() > width {
            return false;
        }
        let mut padded;
        let row = if row.len() < width {
            padded = row.to_vec();
            padded.extend(
                t.schema.columns[row.len()..]
                    .iter()
                    .map(|col| col.default.clone().unwrap_or(sluice_engine::Value::Null)),
            );
            &padded[..]
        } else {
            row
        };
        rules.read.allows(row, bound)
    }

    /// Whether the client may read every record of `topic` (its read rules cover `*`).
    fn reads_topic(&self, topic: &str) -> bool {
        self.db.topics.get(topic).is_some_and(|t| {
            crate::rules::check_topic_read(t, &sluice_engine::TagFilter::all(), &self.claims.all)
                .is_ok()
        })
    }
}

async fn snapshot(State(core): St, Extension(caller): Extension<Caller>) -> ApiResult {
    caller.require_admin("POST /v1/admin/snapshot")?;
    let seq = core.snapshot().await?;
    Ok(Json(json!({"seq": seq})))
}

async fn call(
    State(core): St,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(path_error)?;
    let bytes = read_body(&core, body).await?;
    // The common case: read by hand, the arguments transcoded to the MessagePack a
    // WebSocket call carries (no `serde_json::Value` of the body or the arguments: ~8 K
    // instructions a call). Anything the reader is unsure of takes the general path, which
    // makes every refusal.
    let (args, durability) = match crate::decode::read_call_json(&bytes) {
        Some(read) => read,
        None => call_body_general(&bytes)?,
    };
    let ok = core
        .call_function_as(&caller, name, args, durability)
        .await?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        call_reply_json(ok.seq, &ok.result),
    )
        .into_response())
}

/// A call's reply `{"seq", "result"}`, written around its result (the bytes `serde_json`
/// makes of the object; a test holds them equal).
fn call_reply_json(seq: u64, result: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.extend_from_slice(b"{\"seq\":");
    out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
    out.extend_from_slice(b",\"result\":");
    json_value(&mut out, result);
    out.push(b'}');
    out
}

/// `value` as JSON text appended to `out` (writing into a `Vec` cannot fail).
pub(crate) fn json_value(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    serde_json::to_writer(&mut *out, value).expect("a JSON value serialises into a Vec");
}

/// A call's body read the general way: a JSON object of `args` (default `null`) and
/// `durability`, and nothing else.
fn call_body_general(
    bytes: &[u8],
) -> Result<(sluice_functions::Args, Option<Durability>), ApiError> {
    let mut body = json_object(bytes)?;
    let durability = durability_of(&body)?;
    if let Some(extra) = body
        .keys()
        .find(|k| !["args", "durability"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?} in a call"
        )));
    }
    let args = body.remove("args").unwrap_or(Value::Null);
    Ok((args.into(), durability))
}

async fn put_functions(
    State(core): St,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> ApiResult {
    caller.require_admin("PUT /v1/functions")?;
    let bytes = read_body(&core, body).await?;
    let source = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::bad_request("the module source must be UTF-8 text"))?;
    let exports = core.load_functions(source).await?;
    Ok(Json(json!({"exports": exports})))
}

async fn list_functions(State(core): St, Extension(caller): Extension<Caller>) -> ApiResult {
    caller.require_admin("GET /v1/functions")?;
    Ok(Json(json!({"exports": core.functions().await?})))
}

#[cfg(test)]
pub(crate) mod reply_tests {
    use super::*;
    use sluice_engine::{TableSchema, WriteResult};

    /// Random write results: tables whose names need escaping (and one name held by two
    /// schemas), integer keys of every size, text keys with quotes, controls and non-ASCII
    /// text, versions up to `u64::MAX`; runs of one table as a mutate makes them.
    pub(crate) fn random_results(rng: &mut sluice_fuzzkit::Rng) -> Vec<WriteResult> {
        const NAMES: [&str; 8] = [
            "events",
            "events",
            "a\"b",
            "tab\\le",
            "ünï/code",
            "ctl\u{1}\u{1f}x",
            "",
            "e😀",
        ];
        const TEXTS: [&str; 6] = ["user-1", "", "q\"uote", "line\nbreak\t\u{7f}", "ß→😀", "\\"];
        let table = |name: &str| {
            Arc::new(TableSchema {
                name: name.to_string(),
                columns: Vec::new(),
                pk: 0,
                indexes: Vec::new(),
            })
        };
        let tables: Vec<_> = NAMES.iter().map(|n| table(n)).collect();
        let mut current = tables[0].clone();
        (0..rng.below(12))
            .map(|_| {
                if rng.one_in(4) {
                    current = rng.pick(&tables).clone();
                }
                let key = match rng.below(5) {
                    0 => Key::Int(i64::MIN),
                    1 => Key::Int(rng.next_u64() as i64),
                    2 => Key::Int(rng.below(2000) as i64 - 1000),
                    _ => Key::Text((*rng.pick(&TEXTS)).into()),
                };
                let version = match rng.below(3) {
                    0 => u64::MAX,
                    1 => rng.next_u64() >> rng.below(64),
                    _ => rng.below(100) as u64,
                };
                WriteResult {
                    table: current.clone(),
                    key,
                    version,
                }
            })
            .collect()
    }

    /// A call's hand-written reply is the bytes `serde_json` writes for the object.
    #[test]
    fn a_hand_written_call_reply_is_the_bytes_serde_json_writes() {
        let mut rng = sluice_fuzzkit::Rng::new(0x0ca1_1ed0);
        let results = [
            Value::Null,
            json!(-7),
            json!(u64::MAX),
            json!(2.5),
            json!("q\"uote ✓"),
            json!({"z": [1, {"a": null}], "a": true}),
        ];
        for _ in 0..200 {
            let (seq, result) = (rng.next_u64() >> rng.below(64), rng.pick(&results));
            let want = serde_json::to_vec(&json!({"seq": seq, "result": result})).unwrap();
            assert_eq!(call_reply_json(seq, result), want);
        }
    }

    /// The hand-written reply is the bytes `serde_json` writes for [`MutateReply`].
    #[test]
    fn a_hand_written_mutate_reply_is_the_bytes_serde_json_writes() {
        let mut rng = sluice_fuzzkit::Rng::new(0x4e91_01e5);
        for _ in 0..5_000 {
            let results = random_results(&mut rng);
            let seq = rng.next_u64() >> rng.below(64);
            let want = serde_json::to_vec(&MutateReply {
                seq,
                results: &results,
            })
            .expect("serialises");
            let got = mutate_reply_json(seq, &results);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want)
            );
        }
    }
}
