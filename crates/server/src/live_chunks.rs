//! Sending a large snapshot in chunks, over SSE and the WebSocket.
//!
//! The live thread hands a snapshot of more than
//! [`SNAPSHOT_MESSAGE_ROWS_MAX`](sluice_live::chunked::SNAPSHOT_MESSAGE_ROWS_MAX) rows over
//! frozen ([`ChunkedSnapshot`]) instead of rendered; the subscriber's task encodes it here,
//! one chunk at a time, straight from the typed values into the form its transport speaks,
//! on an encoder thread ([`crate::encoder`]), not on the runtime's workers.
//! A chunk is encoded only when the transport asks for the next one — when hyper polls the
//! SSE stream again, or when the WebSocket connection's bounded outbound queue has room —
//! so a slow reader holds the frozen rows (pointers to the view's values) and a chunk or
//! the queue's worth, never the whole encoded snapshot.

use std::sync::Arc;

use axum::extract::ws::Message;
use axum::response::sse::Event as SseEvent;
use serde_json::Value;
use sluice_live::chunked::Cursor;
use sluice_live::{Event, EventKind};
use tokio::sync::mpsc;

use crate::encoder::Encoder;

/// The SSE events of one live event: itself, or a large snapshot's chunks, encoded lazily.
pub(crate) struct SseChunks {
    event: Arc<Event>,
    /// How far the chunks went (`None` once the event is sent whole).
    next: Option<Cursor>,
}

impl SseChunks {
    pub(crate) fn new(event: Arc<Event>) -> SseChunks {
        SseChunks {
            event,
            next: Some(Cursor::default()),
        }
    }
}

impl SseChunks {
    /// Waits until the next chunk can be encoded (a snapshot streamed while its view is
    /// built waits for the build's checksum before its last chunk); an abandoned snapshot
    /// is not sent on (the subscriber's error follows).
    pub(crate) async fn ready(&mut self) {
        if let (Some(snapshot), Some(cursor)) = (&self.event.chunked, &self.next) {
            if !snapshot.ready(cursor).await {
                self.next = None;
            }
        }
    }
}

impl SseChunks {
    /// The next SSE event: the event itself, or its snapshot's next chunk, encoded on an
    /// encoder thread ([`crate::encoder`]). `None` once everything is sent.
    pub(crate) async fn next_event(&mut self, encoder: &Encoder) -> Option<SseEvent> {
        let cursor = self.next.take()?;
        let event = self.event.clone();
        if event.chunked.is_none() {
            let mut sse = SseEvent::default()
                .event(event.kind.as_str())
                .data(&event.json);
            if event.kind != EventKind::Error {
                sse = sse.id(event.seq.to_string());
            }
            return Some(sse);
        }
        let (sse, cursor) = encoder
            .run(move || {
                let mut cursor = cursor;
                let snapshot = event.chunked.as_ref().expect("checked above");
                let text = snapshot.json_chunk(&mut cursor, None);
                let sse = SseEvent::default().event("snapshot").data(text);
                // Only the whole snapshot is a place to resume from: `Last-Event-ID` must
                // not name a seq whose rows the client holds only part of.
                let sse = if cursor.done() {
                    sse.id(event.seq.to_string())
                } else {
                    sse
                };
                (sse, cursor)
            })
            .await;
        if !cursor.done() {
            self.next = Some(cursor);
        }
        Some(sse)
    }
}

/// Sends a large snapshot's chunks to a WebSocket connection's outbound queue, each encoded
/// (on an encoder thread) once the queue has room for it. `false` if the connection is
/// gone. `event` must hold a chunked snapshot.
pub(crate) async fn send_ws(
    encoder: &Encoder,
    event: &Arc<Event>,
    qid: &Value,
    msgpack: bool,
    out: &mpsc::Sender<Message>,
) -> bool {
    let Some(snapshot) = &event.chunked else {
        return true;
    };
    let mut cursor = Cursor::default();
    loop {
        // A snapshot streamed while its view is built: the last chunk needs the build's
        // checksum. Abandoned (the build failed): the subscriber's error follows.
        if !snapshot.ready(&cursor).await {
            return true;
        }
        let Ok(permit) = out.reserve().await else {
            return false;
        };
        let (event, qid) = (event.clone(), qid.clone());
        let (message, next) = encoder
            .run(move || {
                let mut cursor = cursor;
                let snapshot = event.chunked.as_ref().expect("checked above");
                let message = if msgpack {
                    Message::Binary(snapshot.msgpack_chunk(&mut cursor, &qid).into())
                } else {
                    Message::Text(snapshot.json_chunk(&mut cursor, Some(&qid)).into())
                };
                (message, cursor)
            })
            .await;
        permit.send(message);
        if next.done() {
            return true;
        }
        cursor = next;
    }
}
