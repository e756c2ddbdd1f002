//! The leader's side: every writer round's frames are appended to the replicated log in
//! seq order, pipelined (many appends in flight on one connection, their acks awaited in
//! order), and each quorum ack is reported to the core (`Core::replicated`), which
//! acknowledges `replicated` commits once their local write is done too.
//!
//! A failed append or ack (a NATS node going away, a stream leader election) is not the
//! end: the publisher reads where the log ends, counts the entries of its own term
//! there as acknowledged, and appends the rest again — for up to
//! [`RECOVER_WINDOW`]. An entry of another term where this leader expected its own means
//! a newer leader took over ([`ClusterError::Fenced`]): the core stops taking writes and
//! every `replicated` commit still waiting fails (its outcome is the new leader's to tell).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use sluice_server::replication::{Replicator, Round};
use sluice_server::Core;
use tokio::sync::mpsc;

use crate::backbone::{AckFuture, Backbone};
use crate::ClusterError;

/// Writer rounds queued for the publisher before the writer waits (back-pressure).
pub const ROUNDS_QUEUED_MAX: usize = 64;
/// Appends in flight (sent, not yet acknowledged by a quorum).
pub const APPENDS_INFLIGHT_MAX: usize = 4096;
/// How long the publisher keeps retrying after a failed append before it gives up.
pub const RECOVER_WINDOW: Duration = Duration::from_secs(15);

/// The core's end: `submit` queues a round for the publisher task.
pub struct Feed {
    tx: mpsc::Sender<Round>,
}

impl Replicator for Feed {
    fn submit(&self, round: Round) {
        // On the writer thread (no runtime): waits while the queue is full. A closed queue
        // means the publisher failed, and it already failed the waiting commits.
        let _ = self.tx.blocking_send(round);
    }
}

/// Makes `core` the leader of term `term` on `backbone`: returns once the core's writer
/// hands its rounds to a publisher task. The cluster's log **must** end at the core's
/// applied seq (see `node::lead`).
pub fn start<B: Backbone>(backbone: Arc<B>, core: Core, term: u64) -> u64 {
    let (tx, rx) = mpsc::channel(ROUNDS_QUEUED_MAX);
    let seq = core.set_leader(Arc::new(Feed { tx }));
    let publisher = Publisher {
        backbone,
        core: core.clone(),
        term,
        next_seq: seq + 1,
        inflight: VecDeque::new(),
    };
    tokio::spawn(async move {
        let mut publisher = publisher;
        if let Err(e) = publisher.run(rx).await {
            tracing::error!("replication stopped: {e}");
            publisher.core.replication_failed(e.to_string());
        }
    });
    seq
}

struct Publisher<B> {
    backbone: Arc<B>,
    core: Core,
    term: u64,
    /// The seq the next frame must have.
    next_seq: u64,
    /// Appended (or to append again), oldest first; `None`: not sent since the last failure.
    inflight: VecDeque<(u64, Bytes, Option<AckFuture>)>,
}

impl<B: Backbone> Publisher<B> {
    async fn run(&mut self, mut rx: mpsc::Receiver<Round>) -> Result<(), ClusterError> {
        loop {
            let has_inflight = !self.inflight.is_empty();
            let room = self.inflight.len() < APPENDS_INFLIGHT_MAX;
            tokio::select! {
                biased;
                acked = async {
                    match self.inflight.front_mut().and_then(|(_, _, ack)| ack.as_mut()) {
                        Some(ack) => ack.await,
                        None => std::future::pending().await,
                    }
                }, if has_inflight => match acked {
                    Ok(()) => {
                        let (seq, ..) = self.inflight.pop_front().expect("non-empty");
                        // Acks resolve in order; report the prefix once per ready run.
                        let mut last = seq;
                        while let Some((s, _, Some(ack))) = self.inflight.front_mut() {
                            let s = *s;
                            match ack.as_mut().now_or_never() {
                                Some(Ok(())) => {
                                    self.inflight.pop_front();
                                    last = s;
                                }
                                Some(Err(e)) => {
                                    self.core.replicated(last);
                                    tracing::warn!("append of commit {s} failed: {e}; recovering");
                                    self.recover().await?;
                                    break;
                                }
                                None => break,
                            }
                        }
                        self.core.replicated(last);
                    }
                    Err(e) => {
                        tracing::warn!("append failed: {e}; recovering");
                        self.recover().await?;
                    }
                },
                round = rx.recv(), if room => {
                    let Some(round) = round else { return Ok(()) };
                    for (seq, range) in round.commits {
                        if seq != self.next_seq {
                            return Err(ClusterError::Core(format!(
                                "the writer handed commit {seq} where {} was next", self.next_seq
                            )));
                        }
                        self.next_seq += 1;
                        let frame = round.frames.slice(range);
                        let sent = self.backbone.append(seq, self.term, frame.clone()).await;
                        match sent {
                            Ok(ack) => self.inflight.push_back((seq, frame, Some(ack))),
                            Err(e) => {
                                self.inflight.push_back((seq, frame, None));
                                tracing::warn!("append of commit {seq} failed: {e}; recovering");
                                self.recover().await?;
                            }
                        }
                    }
                }
            }
        }
    }

    /// After a failed append: learns where the log ends, takes this term's entries there
    /// as acknowledged, and appends the rest again. Gives up after [`RECOVER_WINDOW`].
    async fn recover(&mut self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + RECOVER_WINDOW;
        let mut last_error;
        loop {
            match self.try_recover().await {
                Ok(()) => return Ok(()),
                Err(e @ ClusterError::Fenced { .. }) => return Err(e),
                Err(e) => last_error = e,
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::JetStream {
                    what: "replication",
                    reason: format!(
                        "appends kept failing for {RECOVER_WINDOW:?}; last: {last_error}"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_recover(&mut self) -> Result<(), ClusterError> {
        let Some(&(first, ..)) = self.inflight.front() else {
            return Ok(());
        };
        let state = self.backbone.state().await?;
        if state.last_seq + 1 < first {
            return Err(ClusterError::JetStream {
                what: "replication",
                reason: format!(
                    "the stream ends at seq {} but this leader's commits up to {} were acknowledged",
                    state.last_seq,
                    first - 1
                ),
            });
        }
        // Entries this leader appended before the failure: ours, or a newer leader's.
        let mut acked = None;
        while let Some(&(seq, ..)) = self.inflight.front() {
            if seq > state.last_seq {
                break;
            }
            let entry = self.backbone.entry(seq).await?;
            if entry.term != self.term {
                return Err(ClusterError::Fenced {
                    seq,
                    term: self.term,
                    found: entry.term,
                });
            }
            self.inflight.pop_front();
            acked = Some(seq);
        }
        if let Some(seq) = acked {
            self.core.replicated(seq);
        }
        for (seq, frame, ack) in self.inflight.iter_mut() {
            *ack = None;
            *ack = Some(self.backbone.append(*seq, self.term, frame.clone()).await?);
        }
        Ok(())
    }
}
