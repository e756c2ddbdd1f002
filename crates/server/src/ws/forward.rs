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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::extract::ws::Message;
use parking_lot::Mutex;
use serde_json::Value;
use sluice_live::{EventKind, Limits, Ready, Sink, Subscribe};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{encode, Encoding};
use crate::api::ApiError;
use crate::core::Core;
use crate::live::Subscription;

enum Cmd {
    Add(u64, Value, Subscription),
    Remove(u64),
}

/// The connection's forwarding task and what the reader needs to hand it subscriptions.
pub(super) struct Forwarder {
    cmds: mpsc::UnboundedSender<Cmd>,
    ready: Arc<Ready>,
    /// Tokens of subscriptions that ended by themselves (their final event was sent).
    ended: Arc<Mutex<HashSet<u64>>>,
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
    cmds: mpsc::UnboundedSender<Cmd>,
    ended: Arc<Mutex<HashSet<u64>>>,
}

impl Forwarded {
    /// Whether the subscription ended by itself (an `error` event was its last).
    pub(super) fn is_finished(&self) -> bool {
        self.ended.lock().contains(&self.token)
    }

    /// Ends the subscription (unsubscribe).
    pub(super) fn abort(&self) {
        let _ = self.cmds.send(Cmd::Remove(self.token));
    }
}

impl Drop for Forwarded {
    fn drop(&mut self) {
        self.abort();
    }
}

impl Forwarder {
    pub(super) fn new(core: &Core, events: mpsc::Sender<Message>, encoding: Encoding) -> Forwarder {
        let (cmds, rx) = mpsc::unbounded_channel();
        let ready = Arc::new(Ready::default());
        let ended = Arc::new(Mutex::new(HashSet::new()));
        let task = tokio::spawn(run(
            core.clone(),
            ready.clone(),
            rx,
            ended.clone(),
            events,
            encoding,
        ));
        Forwarder {
            cmds,
            ready,
            ended,
            next_token: 0,
            task,
        }
    }

    /// A sink for a new subscription of this connection, and its token.
    pub(super) fn sink(&mut self, limits: &Limits, coalesce_ms: u32) -> (Arc<Sink>, u64) {
        let token = self.next_token;
        self.next_token += 1;
        (
            Sink::forwarded(limits, coalesce_ms, self.ready.clone(), token),
            token,
        )
    }

    /// Hands a subscription registered with a sink from [`Forwarder::sink`] to the task.
    pub(super) fn add(&self, token: u64, qid: Value, subscription: Subscription) -> Forwarded {
        let _ = self.cmds.send(Cmd::Add(token, qid, subscription));
        Forwarded {
            token,
            cmds: self.cmds.clone(),
            ended: self.ended.clone(),
        }
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
        let sub = core.live().subscribe(req, sink.clone()).await?;
        Ok(self.add(token, qid, Subscription::opened(core, sub, sink)))
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
    qid: &Value,
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
        if let Some(snapshot) = &event.chunked {
            // A large snapshot: its chunks are encoded as the outbound queue takes them.
            let msgpack = encoding == Encoding::Msgpack;
            if !crate::live_chunks::send_ws(snapshot, qid, msgpack, events).await {
                return Drained::Stop;
            }
            continue;
        }
        let text = event.with_qid(qid);
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
    ended: Arc<Mutex<HashSet<u64>>>,
    events: mpsc::Sender<Message>,
    encoding: Encoding,
) {
    let mut subs: HashMap<u64, (Value, Subscription)> = HashMap::new();
    let mut closing = core.closing();
    loop {
        let mut due: Vec<u64> = Vec::new();
        let mut shutdown = false;
        tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                // Its first events may have been marked before it was here: drain it now.
                Some(Cmd::Add(token, qid, sub)) => {
                    subs.insert(token, (qid, sub));
                    due.push(token);
                }
                Some(Cmd::Remove(token)) => {
                    subs.remove(&token);
                    ended.lock().remove(&token);
                }
                None => return,
            },
            _ = ready.notified() => {}
            _ = closing.wait_for(|&c| c) => shutdown = true,
        }
        if shutdown {
            // Graceful shutdown: every stream ends with a reason instead of hanging on.
            for (qid, sub) in subs.values() {
                sub.sink.fail(
                    "shutting_down",
                    "the server is shutting down; reconnect and resume from your last seq",
                );
                if let Drained::Stop = drain(&core, qid, &sub.sink, &events, encoding, false).await
                {
                    return;
                }
            }
            return;
        }
        due.extend(ready.take());
        for token in due {
            let Some((qid, sub)) = subs.get(&token) else {
                continue; // added later (then drained on arrival) or removed
            };
            match drain(&core, qid, &sub.sink, &events, encoding, true).await {
                Drained::Open => {}
                Drained::Ended => {
                    subs.remove(&token);
                    ended.lock().insert(token);
                }
                Drained::Stop => return,
            }
        }
    }
}
