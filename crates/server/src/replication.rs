//! The cluster's hook into the core: where a leader's writer hands each round's log frames
//! to a replicated log, and where a follower's commits come in.
//!
//! The core knows no backbone (`sluice-cluster` brings NATS JetStream); it only knows a
//! node's [`Role`]:
//! - `Standalone`: one node, as before; `replicated` is refused.
//! - `Leader`: the writer applies requests as usual and, after each round, hands the
//!   round's frames (the log's own bytes, one frame per commit, in seq order) to the
//!   [`Replicator`]. A `replicated` commit is acknowledged once both halves are done: the
//!   local log wrote it (`disk`) and the replicator reported a quorum holds it
//!   ([`Core::replicated`](crate::Core::replicated)).
//! - `Follower`: client writes are refused with `not_leader` (naming the leader's address
//!   when known); commits arrive through [`Core::apply_replicated`](crate::Core::apply_replicated)
//!   as frames, are replayed on the writer thread (`Db::replay_commit`, the path recovery
//!   takes), written to the follower's own log, and fed to its live views and watchers.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::CoreError;

/// The frames of one writer round, in seq order, continuing the previous round.
pub struct Round {
    /// Whole log frames (header + payload), back to back.
    pub frames: bytes::Bytes,
    /// Each commit's seq and the range of its frame in `frames`, ascending.
    pub commits: Vec<(u64, Range<usize>)>,
}

/// Ships a leader's commits to the cluster.
pub trait Replicator: Send + Sync + 'static {
    /// Takes the frames of one round. Called on the writer thread after the round's frames
    /// went to the local log; it **may** block to push back on the writer (a bounded
    /// queue), and **must** eventually report every seq through
    /// [`Core::replicated`](crate::Core::replicated) or fail them through
    /// [`Core::replication_failed`](crate::Core::replication_failed).
    fn submit(&self, round: Round);
}

/// What a node is in its cluster.
#[derive(Clone, Default)]
pub enum Role {
    /// No cluster.
    #[default]
    Standalone,
    /// The single writer: commits go to the local log and to the replicator.
    Leader(Arc<dyn Replicator>),
    /// Applies the leader's commits; refuses client writes.
    Follower {
        /// The leader's client address (`http://host:port`), when known.
        leader: Option<String>,
    },
}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Standalone => f.write_str("standalone"),
            Role::Leader(_) => f.write_str("leader"),
            Role::Follower { leader } => write!(f, "follower (leader: {leader:?})"),
        }
    }
}

/// A `replicated` commit's acknowledgement, sent once both of its halves are done (the
/// local write and the quorum), or at the first half that failed.
pub(crate) struct PairAck {
    reply: Mutex<Option<crate::writer::AckReply>>,
    halves_left: AtomicU8,
}

impl PairAck {
    pub fn new(reply: crate::writer::AckReply) -> Arc<Self> {
        Arc::new(PairAck {
            reply: Mutex::new(Some(reply)),
            halves_left: AtomicU8::new(2),
        })
    }

    pub fn half_done(&self, result: Result<(), CoreError>) {
        let send = match &result {
            Err(_) => true,
            Ok(()) => self.halves_left.fetch_sub(1, Ordering::AcqRel) == 1,
        };
        if send {
            let reply = self.reply.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(reply) = reply {
                reply.send(result);
            }
        }
    }
}

/// The node's role and the `replicated` commits waiting for the quorum.
#[derive(Default)]
pub(crate) struct ClusterState {
    pub role: parking_lot::RwLock<Role>,
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// Every seq up to this one was reported replicated.
    replicated_seq: u64,
    /// Seqs of `replicated` commits and their acknowledgement, ascending.
    pairs: VecDeque<(u64, Arc<PairAck>)>,
}

impl ClusterState {
    pub fn role(&self) -> Role {
        self.role.read().clone()
    }

    /// Registers a `replicated` commit's quorum half (the writer, before the round reaches
    /// the replicator, so a quick report finds it).
    pub fn wait_for_quorum(&self, seq: u64, pair: Arc<PairAck>) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if seq <= w.replicated_seq {
            drop(w);
            pair.half_done(Ok(()));
        } else {
            w.pairs.push_back((seq, pair));
        }
    }

    /// Completes the quorum half of every commit up to `seq`.
    pub fn replicated(&self, seq: u64) {
        let done: Vec<_> = {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            w.replicated_seq = w.replicated_seq.max(seq);
            let n = w.pairs.iter().take_while(|(s, _)| *s <= seq).count();
            w.pairs.drain(..n).collect()
        };
        for (_, pair) in done {
            pair.half_done(Ok(()));
        }
    }

    /// Fails every commit still waiting for the quorum.
    pub fn fail_waiting(&self, error: &CoreError) {
        let failed: Vec<_> = {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            w.pairs.drain(..).collect()
        };
        for (_, pair) in failed {
            pair.half_done(Err(error.clone()));
        }
    }
}
