//! Events and the bounded per-subscriber queue ([`Sink`]) between the live thread and a
//! subscriber's connection.
//!
//! The live thread pushes; the connection's task pops with [`Sink::recv`]. A push never
//! blocks: when a subscriber falls [`Limits::subscriber_queue_max`] events (or
//! [`Limits::subscriber_queue_bytes_max`] bytes) behind, its pending diffs are dropped and
//! replaced by one `reset` snapshot (they are coalesced into it); if it is still that far
//! behind while that reset is undelivered, it is closed with a `slow_subscriber` error.
//! Either way the writer and every other subscriber carry on untouched.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::Limits;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Snapshot,
    Diff,
    Error,
}

impl EventKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Snapshot => "snapshot",
            EventKind::Diff => "diff",
            EventKind::Error => "error",
        }
    }
}

/// One message for subscribers of a view: rendered once, shared by all of them.
#[derive(Debug)]
pub struct Event {
    /// The seq the view reflects after this event: deliver once it is confirmed.
    pub seq: u64,
    pub kind: EventKind,
    /// The message body: a JSON object (see `docs/protocol.md`); empty when `chunked`.
    pub json: String,
    /// A snapshot too large for one message: the transport sends it in chunks
    /// ([`crate::chunked`]), encoding each from these frozen rows as the socket takes them.
    pub chunked: Option<Arc<crate::chunked::ChunkedSnapshot>>,
}

impl Event {
    /// The body with `"type"` and `"qid"` members first (the WebSocket form).
    pub fn with_qid(&self, qid: &serde_json::Value) -> String {
        self.with_qid_text(&qid.to_string())
    }

    /// [`Event::with_qid`] with the qid as JSON text.
    pub fn with_qid_text(&self, qid: &str) -> String {
        let rest = self.json.strip_prefix('{').unwrap_or(&self.json);
        let sep = if rest.starts_with('}') { "" } else { "," };
        format!(
            "{{\"type\":\"{}\",\"qid\":{}{sep}{rest}",
            self.kind.as_str(),
            qid
        )
    }
}

/// A FIFO queue that keeps its first item inline and allocates only for a backlog (freed
/// again once the queue is empty): an idle subscriber's queue costs 16 bytes, not a
/// `VecDeque`'s 32 plus the buffer it keeps after its first event.
///
/// Invariant: `rest` is `None` or non-empty whenever `head` is `None` — so the queue is
/// empty exactly when `head` is.
struct Queue<T> {
    head: Option<T>,
    #[allow(clippy::box_collection)] // boxed: `None` for every subscriber without a backlog
    rest: Option<Box<VecDeque<T>>>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            head: None,
            rest: None,
        }
    }
}

impl<T> Queue<T> {
    fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.as_ref().map_or(0, |r| r.len())
    }

    fn push_back(&mut self, item: T) {
        if self.head.is_none() {
            self.head = Some(item);
        } else {
            self.rest
                .get_or_insert_with(Default::default)
                .push_back(item);
        }
    }

    fn pop_front(&mut self) -> Option<T> {
        let item = self.head.take()?;
        self.head = self.rest.as_mut().and_then(|r| r.pop_front());
        if self.head.is_none() {
            self.rest = None;
        }
        Some(item)
    }

    fn clear(&mut self) {
        self.head = None;
        self.rest = None;
    }
}

#[derive(Default)]
struct State {
    queue: Queue<Arc<Event>>,
    bytes: usize,
    /// A reset snapshot replaced this subscriber's backlog and is not delivered yet.
    resetting: bool,
    closed: bool,
    /// The sink's token is on its [`Ready`] list and not yet taken.
    marked: bool,
    /// The subscriber's coalescing window (`coalesce_ms`, 0 = a diff per commit), read by
    /// the live thread when it registers the subscriber (see [`crate::fold`]); here, in the
    /// state's padding, it costs the sink nothing.
    coalesce_ms: u32,
}

/// The subscriptions of one connection that have events waiting: one forwarding task per
/// connection waits on this instead of one task per subscription waiting on its sink (a
/// task and its suspended future cost more than the rest of an idle subscription).
#[derive(Default)]
pub struct Ready {
    tokens: Mutex<Vec<u64>>,
    notify: Notify,
}

impl Ready {
    /// Waits until a token may be waiting (a notification before this wait left a permit).
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// The tokens of the sinks that had events queued since the last take.
    pub fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.tokens.lock())
    }
}

/// What became of a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// The backlog was over its limit: the caller must push a reset snapshot next.
    Overflow,
    /// The sink is closed (the subscriber left, or was too slow): forget it.
    Gone,
}

/// How a sink's consumer learns that events are waiting.
enum Wake {
    /// Its own consumer waits in [`Sink::recv`] (boxed: few sinks have one, see below).
    Notify(Box<Notify>),
    /// A consumer serving many sinks waits on their [`Ready`] list, where this sink puts its
    /// token (once until the consumer calls [`Sink::unmark`]).
    Ready(Arc<Ready>, u64),
}

/// One subscriber's bounded queue of events. 64 bytes and no other allocation while idle
/// (a million idle WebSocket subscriptions are a million of these).
pub struct Sink {
    state: Mutex<State>,
    wake: Wake,
    /// [`Limits::subscriber_queue_max`] and [`Limits::subscriber_queue_bytes_max`], capped
    /// at `u32::MAX`.
    queue_max: u32,
    bytes_max: u32,
}

impl Sink {
    pub fn new(limits: &Limits) -> Arc<Sink> {
        Sink::coalescing(limits, 0)
    }

    /// A sink whose subscriber receives at most one (folded) diff per `coalesce_ms`
    /// milliseconds; at most [`crate::fold::COALESCE_MS_MAX`] (the caller checks, this
    /// clamps).
    pub fn coalescing(limits: &Limits, coalesce_ms: u32) -> Arc<Sink> {
        Arc::new(Sink::build(limits, coalesce_ms, None))
    }

    /// A sink whose arrivals also put `token` on `ready` (once until the consumer calls
    /// [`Sink::unmark`]), for a consumer that serves many sinks.
    pub fn forwarded(
        limits: &Limits,
        coalesce_ms: u32,
        ready: Arc<Ready>,
        token: u64,
    ) -> Arc<Sink> {
        Arc::new(Sink::build(limits, coalesce_ms, Some((ready, token))))
    }

    fn build(limits: &Limits, coalesce_ms: u32, ready: Option<(Arc<Ready>, u64)>) -> Sink {
        let cap = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Sink {
            state: Mutex::new(State {
                coalesce_ms: coalesce_ms.min(crate::fold::COALESCE_MS_MAX),
                ..State::default()
            }),
            wake: match ready {
                Some((ready, token)) => Wake::Ready(ready, token),
                None => Wake::Notify(Box::new(Notify::new())),
            },
            queue_max: cap(limits.subscriber_queue_max),
            bytes_max: cap(limits.subscriber_queue_bytes_max),
        }
    }

    /// Whether this change must put the sink's token on its ready list (call with the state
    /// locked).
    fn mark(&self, s: &mut State) -> bool {
        matches!(self.wake, Wake::Ready(..)) && !std::mem::replace(&mut s.marked, true)
    }

    /// Wakes the consumer (after the state lock is released).
    fn wake(&self, marked: bool) {
        match &self.wake {
            Wake::Notify(notify) => notify.notify_one(),
            Wake::Ready(ready, token) => {
                if marked {
                    ready.tokens.lock().push(*token);
                    ready.notify.notify_one();
                }
            }
        }
    }

    /// Takes the sink off its ready list: the consumer is about to drain it, and any later
    /// arrival puts it back.
    pub fn unmark(&self) {
        self.state.lock().marked = false;
    }

    /// The token this sink puts on its [`Ready`] list, for a [`Sink::forwarded`] one.
    pub fn token(&self) -> Option<u64> {
        match &self.wake {
            Wake::Ready(_, token) => Some(*token),
            Wake::Notify(_) => None,
        }
    }

    /// The subscriber's coalescing window in milliseconds (0: none).
    pub fn coalesce_ms(&self) -> u32 {
        self.state.lock().coalesce_ms
    }

    /// Queues `event` unless that would exceed the sink's limits (then nothing is queued
    /// and the backlog is dropped: see [`Pushed::Overflow`]).
    pub(crate) fn push(&self, event: Arc<Event>) -> Pushed {
        let mut s = self.state.lock();
        if s.closed {
            return Pushed::Gone;
        }
        if s.queue.len() >= self.queue_max as usize
            || s.bytes + event.json.len() > self.bytes_max as usize
        {
            if s.resetting {
                drop(s);
                self.fail(
                    "slow_subscriber",
                    &format!(
                        "the subscriber fell behind again before its reset snapshot was delivered (subscriber_queue_max {} events, subscriber_queue_bytes_max {} bytes)",
                        self.queue_max, self.bytes_max
                    ),
                );
                return Pushed::Gone;
            }
            s.queue.clear();
            s.bytes = 0;
            s.resetting = true;
            return Pushed::Overflow;
        }
        s.bytes += event.json.len();
        s.queue.push_back(event);
        let marked = self.mark(&mut s);
        drop(s);
        self.wake(marked);
        Pushed::Queued
    }

    /// Queues a reset snapshot after an [`Pushed::Overflow`], whatever its size.
    pub(crate) fn push_reset(&self, event: Arc<Event>) {
        let mut s = self.state.lock();
        if s.closed {
            return;
        }
        s.bytes += event.json.len();
        s.queue.push_back(event);
        let marked = self.mark(&mut s);
        drop(s);
        self.wake(marked);
    }

    /// Replaces the backlog with one error event and closes the sink.
    pub fn fail(&self, code: &str, message: &str) {
        let mut s = self.state.lock();
        if s.closed {
            return;
        }
        s.queue.clear();
        let json = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
        s.bytes = json.len();
        s.queue.push_back(Arc::new(Event {
            seq: 0,
            kind: EventKind::Error,
            json,
            chunked: None,
        }));
        s.closed = true;
        let marked = self.mark(&mut s);
        drop(s);
        self.wake(marked);
    }

    /// The subscriber is gone: the live thread forgets the sink at its next event.
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        let marked = self.mark(&mut s);
        drop(s);
        self.wake(marked);
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Events queued and not yet taken.
    pub fn pending(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Takes the next event without waiting.
    pub fn try_recv(&self) -> Option<Arc<Event>> {
        let mut s = self.state.lock();
        let event = s.queue.pop_front()?;
        s.bytes -= event.json.len();
        if event.kind == EventKind::Snapshot {
            s.resetting = false;
        }
        Some(event)
    }

    /// The next event; `None` once the sink is closed and drained. For a sink made with
    /// [`Sink::new`] or [`Sink::coalescing`]; a [`Sink::forwarded`] one is drained with
    /// [`Sink::try_recv`] by its [`Ready`] list's consumer (here it would wait on that list).
    pub async fn recv(&self) -> Option<Arc<Event>> {
        loop {
            if let Some(e) = self.try_recv() {
                return Some(e);
            }
            if self.state.lock().closed {
                return None;
            }
            // One consumer per sink: a notification that came before this wait left a permit.
            match &self.wake {
                Wake::Notify(notify) => notify.notified().await,
                Wake::Ready(ready, _) => ready.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue against `VecDeque` over random pushes, pops and clears, with bursts long
    /// enough to use the backlog.
    #[test]
    fn queue_matches_a_vecdeque() {
        let mut q: Queue<u64> = Queue::default();
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..50_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 16 {
                0..=6 => {
                    q.push_back(i);
                    model.push_back(i);
                }
                7..=14 => assert_eq!(q.pop_front(), model.pop_front(), "step {i}"),
                _ if x % 64 == 15 => {
                    q.clear();
                    model.clear();
                }
                _ => {}
            }
            assert_eq!(q.len(), model.len(), "step {i}");
            assert_eq!(q.head.is_none(), model.is_empty());
            assert!(
                q.head.is_some() || q.rest.is_none(),
                "an empty queue holds no backlog"
            );
        }
    }

    #[test]
    fn an_idle_sink_is_small() {
        let limits = Limits::default();
        let ready = Arc::new(Ready::default());
        let sink = Sink::forwarded(&limits, 0, ready.clone(), 7);
        assert!(
            std::mem::size_of::<Sink>() <= 64,
            "{} bytes",
            std::mem::size_of::<Sink>()
        );
        // Events in and out leave no allocation behind.
        for seq in 1..=3 {
            assert_eq!(
                sink.push(Arc::new(Event {
                    seq,
                    kind: EventKind::Diff,
                    json: "{}".into(),
                    chunked: None,
                })),
                Pushed::Queued
            );
        }
        assert_eq!(ready.take(), [7], "one token until the consumer unmarks");
        sink.unmark();
        let seqs: Vec<u64> = std::iter::from_fn(|| sink.try_recv())
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        let s = sink.state.lock();
        assert!(s.queue.head.is_none() && s.queue.rest.is_none());
        assert_eq!(s.bytes, 0);
    }
}
