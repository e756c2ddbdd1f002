//! [`Backbone`]: the narrow interface Sluice needs from a replicated log. JetStream
//! ([`crate::jetstream`]) implements it; another backbone (Raft through openraft, say)
//! would implement the same few calls.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use bytes::Bytes;

use crate::ClusterError;

/// A future of a quorum's acknowledgement of one appended entry.
pub type AckFuture = Pin<Box<dyn Future<Output = Result<(), ClusterError>> + Send>>;
/// Entries from a seq on, in order, as long as the log has them (and then as they come).
pub type Entries = Pin<Box<dyn futures_util::Stream<Item = Result<Entry, ClusterError>> + Send>>;

/// One entry of the replicated log: a commit's log frame.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The entry's position, which is the commit's seq.
    pub seq: u64,
    /// The term of the leader that appended it.
    pub term: u64,
    /// The whole log frame (header + payload), as the leader's own log holds it.
    pub frame: Bytes,
}

/// What the replicated log holds: entries `first_seq..=last_seq` (empty when `first_seq >
/// last_seq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogState {
    pub first_seq: u64,
    pub last_seq: u64,
}

/// Who holds the leader lease.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    /// Raised by every new leader; each entry carries its appender's term (fencing).
    pub term: u64,
    /// The leader's client address (`http://host:port`), for followers to name.
    pub address: String,
}

/// A held leader lease (renewed before it lapses).
#[derive(Clone, Debug)]
pub struct Lease {
    pub holder: Holder,
    /// The lease's version in the backbone (a renewal must name the latest).
    pub revision: u64,
}

/// The replicated log and the leader lease.
pub trait Backbone: Send + Sync + 'static {
    /// Appends `frame` as entry `seq` of `term`. The backbone **must** refuse it unless
    /// its last entry is `seq - 1` (so a stale leader cannot write over a newer one), and
    /// **must** take a repeated append of the same `(seq, term)` as the first (retries).
    /// The returned future resolves once a quorum holds the entry.
    fn append(
        &self,
        seq: u64,
        term: u64,
        frame: Bytes,
    ) -> impl Future<Output = Result<AckFuture, ClusterError>> + Send;

    /// The entries held now.
    fn state(&self) -> impl Future<Output = Result<LogState, ClusterError>> + Send;

    /// Makes a log that was never appended to start after `seq`: its first entry will be
    /// `seq + 1` (a cluster started from a leader that holds commits `1..=seq`). Refused
    /// once the log holds an entry; a no-op if it already starts there.
    fn start_after(&self, seq: u64) -> impl Future<Output = Result<(), ClusterError>> + Send;

    /// Entry `seq`.
    fn entry(&self, seq: u64) -> impl Future<Output = Result<Entry, ClusterError>> + Send;

    /// Entries from `seq` on, then new ones as they are appended.
    fn read_from(&self, seq: u64) -> impl Future<Output = Result<Entries, ClusterError>> + Send;

    /// Takes the lease if nobody holds it; its term is above every earlier leader's.
    fn acquire_lease(
        &self,
        address: &str,
    ) -> impl Future<Output = Result<Lease, ClusterError>> + Send;

    /// Renews a held lease; fails if it lapsed and another node took it.
    fn renew_lease(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<Lease, ClusterError>> + Send;

    /// The lease's holder, if any.
    fn holder(&self) -> impl Future<Output = Result<Option<Holder>, ClusterError>> + Send;

    /// Stores the snapshot file at `path` (the engine's snapshot format, the state after
    /// commit `seq`) under `seq`, then drops stored snapshots older than the newest
    /// [`SNAPSHOTS_STORED`]. The caller **must** only store a state the log's entries
    /// `1..=seq` produce.
    fn put_snapshot(
        &self,
        seq: u64,
        path: &Path,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;

    /// The seqs of the stored snapshots, ascending.
    fn snapshots(&self) -> impl Future<Output = Result<Vec<u64>, ClusterError>> + Send;

    /// Writes stored snapshot `seq` to the file `dest` (created or truncated), checked
    /// against the digest it was stored with.
    fn fetch_snapshot(
        &self,
        seq: u64,
        dest: &Path,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// Snapshots the backbone keeps (the newest; the one before is there for a follower that
/// started fetching it just before a newer one was stored).
pub const SNAPSHOTS_STORED: usize = 2;
