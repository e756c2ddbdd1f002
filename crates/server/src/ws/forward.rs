//! One forwarding task per connection for all its live subscriptions. Each subscription's
//! [`Sink`] puts its token on the connection's [`Ready`] list when events arrive; the task
//! takes the list, drains those sinks, waits for each event's seq to be confirmed (so nothing
//! is shown before its commit reached its durability class) and hands the event, with its
//! `qid`, to the connection's sender.
//!
//! Why not a task per subscription (as before): an idle subscription's task — its header and
//! its suspended future — cost more than the rest of the subscription (the view's share, the
//! sink, the registry entries), and spawning one per `subscribe` capped the subscribe rate.
//! A subscription here costs its sink, an entry in the task's map and a [`Forwarded`] handle.
//!
//! The task's entry is lean ([`Entry`]: the qid's text, the live id and the sink — 32 bytes): the
//! connection's `Core` and shutdown signal are the task's, once, not a copy per
//! subscription (a `Subscription` in each entry was 104 bytes, ~220 with the map's slack, of
//! a million-view server's per-view budget). `subscribe_many` hands its whole batch over in
//! one command.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::ws::Message;
use parking_lot::Mutex;
use serde_json::Value;
use sluice_live::{EventKind, Limits, Ready, Sink, SubId, Subscribe};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{encode, Encoding};
use crate::api::ApiError;
use crate::core::Core;

/// One forwarded subscription as the task keeps it: 32 bytes.
pub(super) struct Entry {
    /// The qid as JSON text (what each event carries), not a 32-byte `Value`.
    qid: Box<str>,
    sub: SubId,
    sink: Arc<Sink>,
}

impl Entry {
    /// `qid`: the qid's JSON text.
    pub(super) fn new(qid: &str, sub: SubId, sink: Arc<Sink>) -> Entry {
        Entry {
            qid: qid.into(),
            sub,
            sink,
        }
    }

    /// The subscription is over: the live thread forgets it.
    fn end(self, core: &Core) {
        self.sink.close();
        core.live().unsubscribe(self.sub);
    }
}

/// New subscriptions with their tokens, on their way to the task; those it never takes are
/// ended when the batch is dropped.
struct Batch {
    core: Core,
    entries: Vec<(u64, Entry)>,
}

impl Drop for Batch {
    fn drop(&mut self) {
        for (_, e) in self.entries.drain(..) {
            e.end(&self.core);
        }
    }
}

/// A token is a slot (low 32 bits) and that slot's generation (high 32 bits): a slot is
/// reused for a new subscription once its handle is dropped, under the next generation, so a
/// late `Remove`, a ready mark or an "ended" note of the old one never touches the new one.
fn slot(token: u64) -> usize {
    (token & u64::from(u32::MAX)) as usize
}

/// The token for the next subscription in `old`'s slot.
fn next_generation(old: u64) -> u64 {
    old.wrapping_add(1 << 32)
}

/// The task's subscriptions by token slot — 32 bytes a subscription where a hash map (twice
/// its entries) cost ~85; the slots are as many as the connection held at once. An entry's
/// full token is its sink's. Dropping this (the task stopped, or was aborted with the
/// connection) ends every subscription left.
struct Slots {
    core: Core,
    slots: Vec<Option<Entry>>,
}

impl Slots {
    fn get(&self, token: u64) -> Option<&Entry> {
        self.slots
            .get(slot(token))?
            .as_ref()
            .filter(|e| e.sink.token() == Some(token))
    }

    fn insert(&mut self, token: u64, entry: Entry) {
        let at = slot(token);
        if at >= self.slots.len() {
            self.slots.resize_with(at + 1, || None);
        }
        if let Some(old) = self.slots[at].replace(entry) {
            old.end(&self.core); // not expected: a slot is reused only once removed
        }
    }

    fn remove(&mut self, token: u64) {
        if self.get(token).is_some() {
            if let Some(e) = self.slots[slot(token)].take() {
                e.end(&self.core);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for e in self.slots.drain(..).flatten() {
            e.end(&self.core);
        }
    }
}

enum Cmd {
    Add(Batch),
    Remove(u64),
}

/// What the reader's handles share.
struct Link {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Tokens of subscriptions that ended by themselves (their final event was sent).
    ended: Mutex<HashSet<u64>>,
    /// Tokens free for new subscriptions: a token returns here once its handle is dropped
    /// (after its `Remove` is queued, so the task frees the slot before it is reused) or its
    /// subscribe was refused.
    free: Mutex<Vec<u64>>,
}

/// The connection's forwarding task and what the reader needs to hand it subscriptions.
pub(super) struct Forwarder {
    core: Core,
    link: Arc<Link>,
    ready: Arc<Ready>,
    next_token: u64,
    task: JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        // Dropping the task's map unsubscribes every subscription left.
        self.task.abort();
    }
}

/// The reader's handle on one forwarded subscription (what a task's `JoinHandle` was).
pub(super) struct Forwarded {
    token: u64,
    link: Arc<Link>,
}

impl Forwarded {
    /// Whether the subscription ended by itself (an `error` event was its last).
    pub(super) fn is_finished(&self) -> bool {
        self.link.ended.lock().contains(&self.token)
    }

    /// Ends the subscription (unsubscribe).
    pub(super) fn abort(&self) {
        let _ = self.link.cmds.send(Cmd::Remove(self.token));
    }
}

impl Drop for Forwarded {
    fn drop(&mut self) {
        self.abort();
        self.link.free.lock().push(self.token);
    }
}

impl Forwarder {
    pub(super) fn new(core: &Core, events: mpsc::Sender<Message>, encoding: Encoding) -> Forwarder {
        let (cmds, rx) = mpsc::unbounded_channel();
        let ready = Arc::new(Ready::default());
        let link = Arc::new(Link {
            cmds,
            ended: Mutex::new(HashSet::new()),
            free: Mutex::new(Vec::new()),
        });
        let task = tokio::spawn(run(
            core.clone(),
            ready.clone(),
            rx,
            link.clone(),
            events,
            encoding,
        ));
        Forwarder {
            core: core.clone(),
            link,
            ready,
            next_token: 0,
            task,
        }
    }

    /// A sink for a new subscription of this connection, and its token.
    pub(super) fn sink(&mut self, limits: &Limits, coalesce_ms: u32) -> (Arc<Sink>, u64) {
        let reused = self.link.free.lock().pop();
        let token = reused.map_or_else(
            || {
                self.next_token += 1;
                self.next_token - 1
            },
            next_generation,
        );
        (
            Sink::forwarded(limits, coalesce_ms, self.ready.clone(), token),
            token,
        )
    }

    /// Whether any subscription ended by itself and its handle is still held.
    pub(super) fn any_ended(&self) -> bool {
        !self.link.ended.lock().is_empty()
    }

    /// Gives back the token of a sink whose subscribe was refused.
    pub(super) fn release(&self, token: u64) {
        self.link.free.lock().push(token);
    }

    /// Hands subscriptions registered with sinks from [`Forwarder::sink`] to the task, in
    /// one command; their handles, in order.
    pub(super) fn add(&self, entries: Vec<(u64, Entry)>) -> Vec<Forwarded> {
        let handles = entries
            .iter()
            .map(|&(token, _)| Forwarded {
                token,
                link: self.link.clone(),
            })
            .collect();
        let batch = Batch {
            core: self.core.clone(),
            entries,
        };
        // If the task is gone, the batch comes back in the error and its drop unsubscribes.
        let _ = self.link.cmds.send(Cmd::Add(batch));
        handles
    }

    /// Subscribes `req` and forwards its events.
    pub(super) async fn open(
        &mut self,
        core: &Core,
        req: Subscribe,
        coalesce_ms: u32,
        qid: Value,
    ) -> Result<Forwarded, ApiError> {
        let (sink, token) = self.sink(core.live().limits(), coalesce_ms);
        let sub = match core.live().subscribe(req, sink.clone()).await {
            Ok(sub) => sub,
            Err(e) => {
                self.release(token);
                return Err(e.into());
            }
        };
        let entry = Entry::new(&qid.to_string(), sub, sink);
        Ok(self
            .add(vec![(token, entry)])
            .pop()
            .expect("one handle per entry"))
    }
}

/// What became of draining one subscription.
enum Drained {
    Open,
    Ended,
    /// The connection's sender is gone.
    Stop,
}

async fn drain(
    core: &Core,
    qid: &str,
    sink: &Sink,
    events: &mpsc::Sender<Message>,
    encoding: Encoding,
    confirm: bool,
) -> Drained {
    sink.unmark();
    while let Some(event) = sink.try_recv() {
        let error = event.kind == EventKind::Error;
        if confirm && !error && core.wait_confirmed(event.seq).await.is_err() {
            return Drained::Ended;
        }
        if event.chunked.is_some() {
            // A large snapshot: its chunks are encoded as the outbound queue takes them.
            let msgpack = encoding == Encoding::Msgpack;
            // Rendered from a `Value`, so it parses back.
            let qid: Value = serde_json::from_str(qid).unwrap_or(Value::Null);
            if !crate::live_chunks::send_ws(&core.shared.encoder, &event, &qid, msgpack, events)
                .await
            {
                return Drained::Stop;
            }
            continue;
        }
        let text = event.with_qid_text(qid);
        let message = match encoding {
            Encoding::Json => Message::Text(text.into()),
            Encoding::Msgpack => match serde_json::from_str::<Value>(&text) {
                Ok(v) => encode(encoding, &v),
                Err(_) => return Drained::Ended,
            },
        };
        if events.send(message).await.is_err() {
            return Drained::Stop;
        }
        if error {
            return Drained::Ended;
        }
    }
    if sink.is_closed() && sink.pending() == 0 {
        return Drained::Ended;
    }
    Drained::Open
}

async fn run(
    core: Core,
    ready: Arc<Ready>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    link: Arc<Link>,
    events: mpsc::Sender<Message>,
    encoding: Encoding,
) {
    let ended = &link.ended;
    let mut subs = Slots {
        core: core.clone(),
        slots: Vec::new(),
    };
    let mut closing = core.closing();
    loop {
        let mut due: Vec<u64> = Vec::new();
        let mut shutdown = false;
        tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                // Their first events may have been marked before they were here: drain them now.
                Some(Cmd::Add(mut batch)) => {
                    for (token, e) in batch.entries.drain(..) {
                        subs.insert(token, e);
                        due.push(token);
                    }
                }
                Some(Cmd::Remove(token)) => {
                    subs.remove(token);
                    ended.lock().remove(&token);
                }
                None => return,
            },
            _ = ready.notified() => {}
            _ = closing.wait_for(|&c| c) => shutdown = true,
        }
        if shutdown {
            // Graceful shutdown: every stream ends with a reason instead of hanging on.
            for e in subs.iter() {
                e.sink.fail(
                    "shutting_down",
                    "the server is shutting down; reconnect and resume from your last seq",
                );
                if let Drained::Stop = drain(&core, &e.qid, &e.sink, &events, encoding, false).await
                {
                    return;
                }
            }
            return;
        }
        due.extend(ready.take());
        for token in due {
            let Some(e) = subs.get(token) else {
                continue; // added later (then drained on arrival) or removed
            };
            match drain(&core, &e.qid, &e.sink, &events, encoding, true).await {
                Drained::Open => {}
                Drained::Ended => {
                    subs.remove(token);
                    ended.lock().insert(token);
                }
                Drained::Stop => return,
            }
        }
    }
}
