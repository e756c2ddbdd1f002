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
    /// The stream no longer holds the commits a follower needs next.
    #[error("this node applied up to seq {applied}, but the cluster's stream keeps commits from seq {first} on (its retention, --cluster-retain-commits, dropped the rest): start the node from a snapshot — an empty data directory fetches one from the leader")]
    TooFarBehind { applied: u64, first: u64 },
    /// This node holds commits the cluster's stream does not: its state diverged.
    #[error("this node's data holds seq {local} but the cluster's stream ends at seq {stream}: its state diverged (a deposed leader's unreplicated commits); start it with an empty data directory")]
    Ahead { local: u64, stream: u64 },
    /// A commit the node holds differs from the stream's at the same seq.
    #[error("this node's commit {seq} differs from the cluster's: its state diverged (a deposed leader's unreplicated commits); start it with an empty data directory")]
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

impl ClusterError {
    pub(crate) fn js(what: &'static str, e: impl std::fmt::Display) -> Self {
        ClusterError::JetStream {
            what,
            reason: e.to_string(),
        }
    }
}
