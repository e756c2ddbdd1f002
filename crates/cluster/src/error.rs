//! [`ClusterError`]: why the cluster could not be joined, fed or followed.

/// Errors of the replicated log and of the roles built on it. Each names what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// No NATS server answered at the given URLs.
    #[error("cannot reach the NATS cluster at {urls}: {reason}")]
    Unreachable { urls: String, reason: String },
    /// The JetStream API refused or failed a request.
    #[error("JetStream {what} failed: {reason}")]
    JetStream { what: &'static str, reason: String },
    /// The replicated log holds another leader's commit where this leader expected its
    /// own: a newer leader took over, and this one must stop writing.
    #[error("fenced: the replicated log's seq {seq} was written by term {found}, not this leader's term {term}; a newer leader took over")]
    Fenced { seq: u64, term: u64, found: u64 },
    /// Another node holds the leader lease.
    #[error("another leader holds the lease of database {database:?} (term {term}, at {address}); start this node with --follower, or wait for the lease (--lease-ms) to lapse")]
    SecondLeader {
        database: String,
        term: u64,
        address: String,
    },
    /// The stream no longer holds the commits a follower needs next (it was joined
    /// without [`crate::node::prepare`], which starts it from a stored snapshot).
    #[error("this node applied up to seq {applied}, but the cluster's stream keeps commits from seq {first} on (its retention, --cluster-retain-commits / --cluster-retain-bytes, dropped the rest): restart it with `sluice serve --follower`, which starts it from the newest snapshot in the cluster's object store")]
    TooFarBehind { applied: u64, first: u64 },
    /// Neither the stream nor a stored snapshot covers the commits a follower needs next.
    #[error("this node applied up to seq {applied}, the cluster's stream keeps commits from seq {first} on (--cluster-retain-commits / --cluster-retain-bytes), and no snapshot in the object store covers seq {}: the newest stored is {}; start the leader with snapshots on (--cluster-snapshot-commits above 0) and retry once it has stored one, or raise the retention", .first.saturating_sub(1), newest_text(.newest))]
    NoSnapshot {
        applied: u64,
        first: u64,
        /// The newest stored snapshot's seq, if any.
        newest: Option<u64>,
    },
    /// The node's data directory could not be read or prepared.
    #[error("{0}")]
    Local(String),
    /// This node holds commits the cluster's stream does not: its state diverged.
    #[error("this node's data holds seq {local} but the cluster's stream ends at seq {stream}: its state diverged (a deposed leader's unreplicated commits); start it with --follower --discard-diverged (its log and snapshots are moved aside and it starts from the cluster's snapshot) or with an empty data directory")]
    Ahead { local: u64, stream: u64 },
    /// A commit the node holds differs from the stream's at the same seq.
    #[error("this node's commit {seq} differs from the cluster's: its state diverged (a deposed leader's unreplicated commits); start it with --follower --discard-diverged (its log and snapshots are moved aside and it starts from the cluster's snapshot) or with an empty data directory")]
    Diverged { seq: u64 },
    /// The stream skipped a seq (it must be dense: the stream sequence is the commit seq).
    #[error("the cluster's stream went from seq {expected} to {found}: a gap in the changelog")]
    Gap { expected: u64, found: u64 },
    /// The local core refused (shutting down, poisoned, a commit that does not apply).
    #[error("{0}")]
    Core(String),
    /// A bad option.
    #[error("{0}")]
    Config(String),
}

fn newest_text(newest: &Option<u64>) -> String {
    match newest {
        Some(seq) => format!("seq {seq}"),
        None => "none (no snapshot stored)".into(),
    }
}

impl ClusterError {
    /// Whether retrying the same request later may succeed: a JetStream request that
    /// failed or timed out (while NATS elects a stream's leader after losing a node, it
    /// answers late or "no stream found" for a few seconds). Every other error needs an
    /// operator.
    pub fn is_transient(&self) -> bool {
        matches!(self, ClusterError::JetStream { .. })
    }

    pub(crate) fn js(what: &'static str, e: impl std::fmt::Display) -> Self {
        ClusterError::JetStream {
            what,
            reason: e.to_string(),
        }
    }
}
