//! Live queries over HTTP: `GET /v1/live` (Server-Sent Events), and the subscription plumbing
//! the WebSocket endpoint shares. Events come from the live thread already rendered; a
//! subscriber's task only waits for each event's seq to be confirmed (so nothing is shown
//! before it reached its durability class) and writes it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sluice_live::{Event, EventKind, Sink, SubId, Subscribe};
use sluice_query::Params;

use crate::api::ApiError;
use crate::core::Core;
use crate::live_chunks::SseChunks;

#[derive(Deserialize)]
pub(crate) struct LiveQuery {
    sql: Option<String>,
    /// JSON text: an array (`$1…`) or an object (`:name`).
    params: Option<String>,
    since: Option<String>,
    /// At most one (folded) diff per this many milliseconds (see `crate::coalesce`).
    coalesce_ms: Option<String>,
}

/// A subscription that unsubscribes when dropped (the client went away).
pub(crate) struct Subscription {
    core: Core,
    pub sub: SubId,
    pub sink: Arc<Sink>,
    /// Flips at graceful shutdown (taken once here, not per event).
    closing: tokio::sync::watch::Receiver<bool>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.sink.close();
        self.core.live().unsubscribe(self.sub);
    }
}

impl Subscription {
    #[allow(dead_code)] // the plain form; the transports pass their `coalesce_ms`
    pub(crate) async fn open(core: &Core, req: Subscribe) -> Result<Subscription, ApiError> {
        Subscription::open_coalescing(core, req, 0).await
    }

    /// [`Subscription::open`] for a subscriber that receives at most one folded diff per
    /// `coalesce_ms` milliseconds (0: one per commit, as `open`).
    pub(crate) async fn open_coalescing(
        core: &Core,
        req: Subscribe,
        coalesce_ms: u32,
    ) -> Result<Subscription, ApiError> {
        let sink = Sink::coalescing(core.live().limits(), coalesce_ms);
        let sub = core.live().subscribe(req, sink.clone()).await?;
        Ok(Subscription::opened(core, sub, sink))
    }

    /// A subscription the live thread already registered (`subscribe_many`).
    pub(crate) fn opened(core: &Core, sub: SubId, sink: Arc<Sink>) -> Subscription {
        Subscription {
            core: core.clone(),
            sub,
            sink,
            closing: core.closing(),
        }
    }

    /// The next event, once its seq is confirmed; `None` when the subscription ended.
    pub(crate) async fn next(&mut self) -> Option<Arc<Event>> {
        let received = tokio::select! {
            event = self.sink.recv() => Some(event),
            _ = self.closing.wait_for(|&c| c) => None,
        };
        let event = match received {
            Some(event) => event?,
            None => {
                // Graceful shutdown: the stream ends with a reason instead of hanging on.
                self.sink.fail(
                    "shutting_down",
                    "the server is shutting down; reconnect and resume from your last seq",
                );
                self.sink.recv().await?
            }
        };
        if event.kind != EventKind::Error && self.core.wait_confirmed(event.seq).await.is_err() {
            return None;
        }
        Some(event)
    }
}

pub(crate) fn parse_since(text: &str, what: &str) -> Result<u64, ApiError> {
    text.trim()
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{what} must be a seq (an integer ≥ 0)")))
}

/// `GET /v1/live?sql=…&params=<json>&since=S`: a snapshot, then a diff per commit that
/// changes the result; `id:` is the seq, so `Last-Event-ID` resumes.
pub(crate) async fn sse(
    State(core): State<Arc<Core>>,
    axum::Extension(caller): axum::Extension<crate::auth::Caller>,
    headers: HeaderMap,
    query: Result<Query<LiveQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let sql = q
        .sql
        .ok_or_else(|| ApiError::bad_request("expected ?sql=SELECT …"))?;
    let params_json = match &q.params {
        Some(text) => Some(
            serde_json::from_str::<Value>(text)
                .map_err(|e| ApiError::bad_request(format!("params is not JSON: {e}")))?,
        ),
        None => None,
    };
    let params = Params::from_json(params_json.as_ref())?;
    let since = match headers.get("last-event-id") {
        Some(v) => Some(parse_since(
            v.to_str().unwrap_or_default(),
            "the Last-Event-ID header",
        )?),
        None => q
            .since
            .as_deref()
            .map(|s| parse_since(s, "since"))
            .transpose()?,
    };
    let coalesce_ms = crate::coalesce::coalesce_ms_text(q.coalesce_ms.as_deref())?;
    let guard = core.authenticator().connect(&caller)?;
    let claims = caller.claims().map(|c| c.all.clone());
    let subscription = Subscription::open_coalescing(
        &core,
        Subscribe {
            sql,
            params,
            since,
            claims,
        },
        coalesce_ms,
    )
    .await?;
    // The guard counts this stream against the caller's connections while it is open.
    // A large snapshot goes out as several SSE events, each encoded when hyper asks for it.
    let encoder = core.shared.encoder.clone();
    let stream = futures_util::stream::unfold(
        (subscription, guard, None::<SseChunks>, encoder),
        |(mut s, g, mut chunks, encoder)| async move {
            if let Some(c) = chunks.as_mut() {
                c.ready().await;
                if let Some(sse) = c.next_event(&encoder).await {
                    return Some((Ok::<_, Infallible>(sse), (s, g, chunks, encoder)));
                }
            }
            let mut next = SseChunks::new(s.next().await?);
            let sse = next.next_event(&encoder).await?;
            Some((Ok(sse), (s, g, Some(next), encoder)))
        },
    );
    let response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(core.config().live_heartbeat))
        .into_response();
    Ok(crate::static_files::compress_event_stream(
        &headers, response,
    ))
}
