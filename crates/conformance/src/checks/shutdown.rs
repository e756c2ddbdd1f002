//! Graceful shutdown, as a client sees it (needs a server the suite may stop, so only
//! through the library with `Options::stop_server`): live streams and watches end with a
//! final `event: error` whose code is `shutting_down`; WebSockets close with 1001 and the
//! reason "the server is shutting down".

use std::sync::Arc;

use serde_json::json;

use super::live::live_path;
use super::topics::topic;
use super::{same, table};
use crate::client::{reply_type, Auth, Enc, Frame, Sse, Ws};
use crate::{fail, Ctx, StopServer, Verdict, R};

/// The checks of this area, in order.
pub(crate) const NAMES: [&str; 3] = [
    "sse_live_stream_ends_with_shutting_down",
    "sse_watch_ends_with_shutting_down",
    "websocket_closes_with_1001_and_the_reason",
];

fn copy(v: &Verdict) -> Verdict {
    match v {
        Verdict::Fail(s) => Verdict::Fail(s.clone()),
        Verdict::Skip(s) => Verdict::Skip(s.clone()),
    }
}

async fn open(c: &Ctx) -> R<(Sse, Sse, Ws)> {
    let t = table(c, "shutdown", "id INTEGER PRIMARY KEY").await?;
    let tp = topic(c, json!({})).await?;
    let mut live = c
        .sse(
            &live_path(&format!("SELECT id FROM {t}"), ""),
            &Auth::Admin,
            &[],
        )
        .await?;
    live.expect("snapshot").await?;
    let mut watch = c
        .sse(&format!("/v1/topics/{tp}/watch"), &Auth::Admin, &[])
        .await?;
    watch.expect("watching").await?;
    let mut ws = c.ws(Enc::Json).await?;
    reply_type(&ws.request(json!({"id": 1, "type": "ping"})).await?, "pong")?;
    Ok((live, watch, ws))
}

async fn ends_with_shutting_down(mut sse: Sse) -> R {
    let e = sse.next().await?;
    if e.event != "error" {
        fail!("expected a final `event: error`, got {}", e.raw);
    }
    same("code", &e.data["error"]["code"], &json!("shutting_down"))?;
    match sse.next_any(std::time::Duration::from_secs(10)).await? {
        None => Ok(()),
        Some(e) if e.is_comment() => Ok(()),
        Some(e) => fail!("an event after the final error: {}", e.raw),
    }
}

async fn closes_going_away(mut ws: Ws) -> R {
    loop {
        match ws.frame().await? {
            Frame::Msg { .. } => continue,
            Frame::Closed(Some((code, reason))) => {
                same("close code", &json!(code), &json!(1001))?;
                same(
                    "close reason",
                    &json!(reason),
                    &json!("the server is shutting down"),
                )?;
                return Ok(());
            }
            Frame::Closed(None) => fail!("the connection ended without a close frame"),
        }
    }
}

/// Opens a live stream, a watch and a WebSocket, stops the server, and checks how each
/// ends; one result per entry of [`NAMES`].
pub(crate) async fn run(c: &Arc<Ctx>, stop: &StopServer) -> Vec<R> {
    let (live, watch, ws) = match open(c).await {
        Ok(open) => open,
        Err(e) => {
            let why = match &e {
                Verdict::Fail(s) => Verdict::Fail(format!("setup: {s}")),
                other => copy(other),
            };
            return NAMES.iter().map(|_| Err(copy(&why))).collect();
        }
    };
    (stop.0)();
    let (a, b, c) = tokio::join!(
        ends_with_shutting_down(live),
        ends_with_shutting_down(watch),
        closes_going_away(ws)
    );
    vec![a, b, c]
}
