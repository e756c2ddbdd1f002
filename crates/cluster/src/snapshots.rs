//! Where a node starts: snapshots stored beside the stream, so the stream's retention can
//! be bounded.
//!
//! - The **leader** stores a snapshot of its state in the backbone (JetStream's object
//!   store) when it starts leading and then whenever the stream has
//!   [`ClusterOptions::snapshot_interval`] commits past the newest stored one — or half its
//!   retained commits, if retention (by bytes, say) binds sooner — so a stored snapshot
//!   always covers the commits the stream has dropped. The snapshot is the node's own
//!   (`Core::snapshot`: the engine's snapshot file, which the node keeps anyway), stored
//!   only once the stream holds its seq and that seq's entry is this leader's (or the
//!   leader started from it): a deposed leader never stores a state the stream does not
//!   produce.
//! - A **follower** is [`prepare_on`]d (through `node::prepare`) before its core opens: if its data directory ends
//!   before the stream's first retained commit − 1 (new, empty, or stopped too long), it
//!   fetches the newest stored snapshot that covers at least that seq into the directory
//!   as its own snapshot file (moving the old log and snapshots aside into
//!   `displaced-<unix time>-seq-<applied>/`, never deleting them), so `Core::open`
//!   recovers from it the usual way; it then reads the stream's tail from the snapshot's
//!   seq + 1. With no such snapshot it fails with [`ClusterError::NoSnapshot`].
//! - A follower whose data does not continue the stream (a deposed leader's unreplicated
//!   tail: [`ClusterError::Ahead`], [`ClusterError::Diverged`]) is refused, its data left
//!   as it is — unless `discard_diverged` (`--discard-diverged`) asks to move that data
//!   aside and start as above.
//! - A leader that holds commits when the stream was never written starts the stream
//!   after them (`Backbone::start_after`, in `node`); the snapshot it stores when it starts
//!   leading is then where every follower starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_log::segment::{list_segments, scan};
use sluice_log::snapshot::{list_snapshots, snapshot_path, SnapshotFile};
use sluice_server::Core;
use tokio::sync::watch;

use crate::backbone::Backbone;
use crate::{ClusterError, ClusterOptions};

/// How often the leader looks at the stream to decide whether a snapshot is due.
const SNAPSHOT_POLL: Duration = Duration::from_millis(250);
/// How long the leader waits for the stream to hold a snapshot's seq before it gives up
/// on that snapshot (and tries again at the next due time).
const STORE_WAIT: Duration = Duration::from_secs(30);
/// How long the leader waits after a failed store before it takes another snapshot.
const STORE_RETRY: Duration = Duration::from_secs(5);

/// Where a prepared node starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// From its own data (the stream holds every commit after it).
    Local { applied: u64 },
    /// From the stored snapshot of `seq`, fetched into the data directory; the node's
    /// earlier log and snapshots (data up to `applied`) were moved to `displaced`.
    Snapshot {
        seq: u64,
        applied: u64,
        displaced: Option<PathBuf>,
    },
    /// From nothing (the stream still holds seq 1): its diverged data (up to `applied`)
    /// was moved to `displaced` (`discard_diverged`).
    Empty { applied: u64, displaced: PathBuf },
}

/// The seq of the last commit the data directory `dir` holds (its log's last frame, or
/// its newest snapshot), without opening it: 0 for a new or empty directory.
pub fn local_position(dir: &Path) -> Result<u64, ClusterError> {
    Ok(local_tail(dir)?.0)
}

/// [`local_position`], and the payload of that commit's log frame when the log holds it.
fn local_tail(dir: &Path) -> Result<(u64, Option<Vec<u8>>), ClusterError> {
    if !dir.exists() {
        return Ok((0, None));
    }
    let local =
        |e: sluice_log::LogError| ClusterError::Local(format!("reading {}: {e}", dir.display()));
    let newest_snapshot = list_snapshots(dir)
        .map_err(local)?
        .last()
        .map_or(0, |(seq, _)| *seq);
    let segments = list_segments(dir).map_err(local)?;
    let mut last = None;
    // The newest segment may have just been opened, still empty.
    for segment in segments.iter().rev().take(2) {
        let bytes = sluice_log::segment::read_file(&segment.path).map_err(local)?;
        scan::<sluice_log::LogError>(&segment.path, &bytes, true, |_, payload| {
            // A commit record: its kind byte, then its seq (u64, little-endian).
            if let Some(seq) = payload.get(1..9) {
                last = Some((
                    u64::from_le_bytes(seq.try_into().expect("8 bytes")),
                    payload.to_vec(),
                ));
            }
            Ok(())
        })
        .map_err(local)?;
        if last.is_some() {
            break;
        }
    }
    Ok(match last {
        Some((seq, payload)) if seq >= newest_snapshot => (seq, Some(payload)),
        _ => (newest_snapshot, None),
    })
}

/// Whether data ending at `applied` (with that commit's `payload`) fails to continue the
/// stream: past its end, or its last commit not the stream's at that seq.
async fn diverged<B: Backbone>(
    backbone: &B,
    state: crate::backbone::LogState,
    applied: u64,
    payload: Option<&[u8]>,
) -> Result<Option<ClusterError>, ClusterError> {
    if applied > state.last_seq {
        return Ok(Some(ClusterError::Ahead {
            local: applied,
            stream: state.last_seq,
        }));
    }
    if let (true, Some(payload)) = (applied >= state.first_seq && applied > 0, payload) {
        let entry = backbone.entry(applied).await?;
        let theirs = entry
            .frame
            .get(sluice_log::frame::FRAME_HEADER_BYTES..)
            .unwrap_or_default();
        if theirs != payload {
            return Ok(Some(ClusterError::Diverged { seq: applied }));
        }
    }
    Ok(None)
}

/// Prepares the data directory `dir` of a follower of `backbone` (see the module
/// docs). Call it before the node's core opens `dir`. With `discard_diverged`, data that
/// does not continue the stream is moved aside too (the node then starts from the newest
/// stored snapshot, or with none stored from nothing while the stream holds seq 1); without it, such data fails
/// with [`ClusterError::Ahead`] or [`ClusterError::Diverged`] and stays as it is.
pub async fn prepare_on<B: Backbone>(
    backbone: &B,
    dir: &Path,
    discard_diverged: bool,
) -> Result<Start, ClusterError> {
    let (applied, payload) = local_tail(dir)?;
    let state = backbone.state().await?;
    match diverged(backbone, state, applied, payload.as_deref()).await? {
        None if applied + 1 >= state.first_seq => return Ok(Start::Local { applied }),
        None => {}
        Some(e) if !discard_diverged => return Err(e),
        Some(e) => tracing::warn!("{e}: discarding this node's data (--discard-diverged)"),
    }
    let needed = state.first_seq - 1;
    let stored = backbone.snapshots().await?;
    let Some(&seq) = stored
        .iter()
        .rev()
        .find(|&&s| s >= needed && s <= state.last_seq)
    else {
        if state.first_seq == 1 {
            // Discarding, with no snapshot stored: the stream holds everything.
            let displaced = displace(dir, applied)?.ok_or_else(|| {
                ClusterError::Local(format!("{} holds no log to move aside", dir.display()))
            })?;
            return Ok(Start::Empty { applied, displaced });
        }
        return Err(ClusterError::NoSnapshot {
            applied,
            first: state.first_seq,
            newest: stored.last().copied(),
        });
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| ClusterError::Local(format!("create {}: {e}", dir.display())))?;
    let fetching = dir.join(format!("snapshot-{seq:020}.fetch.tmp"));
    let fetched = backbone.fetch_snapshot(seq, &fetching).await;
    let checked = fetched.and_then(|()| {
        let file = SnapshotFile::read(&fetching)
            .map_err(|e| ClusterError::Local(format!("the fetched snapshot {seq}: {e}")))?;
        if file.seq != seq {
            return Err(ClusterError::Local(format!(
                "the object store's snapshot {seq} holds the state of seq {}",
                file.seq
            )));
        }
        Ok(())
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&fetching);
        return Err(e);
    }
    let displaced = displace(dir, applied)?;
    let path = snapshot_path(dir, seq);
    std::fs::rename(&fetching, &path)
        .map_err(|e| ClusterError::Local(format!("rename to {}: {e}", path.display())))?;
    sync_dir(dir)?;
    tracing::info!(
        seq,
        applied,
        first = state.first_seq,
        ?displaced,
        "starting from the cluster's stored snapshot"
    );
    Ok(Start::Snapshot {
        seq,
        applied,
        displaced,
    })
}

/// Moves the log segments and snapshots of `dir` into a new `displaced-…` directory
/// inside it (none: nothing to move).
fn displace(dir: &Path, applied: u64) -> Result<Option<PathBuf>, ClusterError> {
    let local = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        ClusterError::Local(format!("{what} {}: {e}", p.display()))
    };
    let segments = list_segments(dir).map_err(|e| local("list", dir, &e))?;
    let snapshots = list_snapshots(dir).map_err(|e| local("list", dir, &e))?;
    let files: Vec<PathBuf> = segments
        .into_iter()
        .map(|s| s.path)
        .chain(snapshots.into_iter().map(|(_, p)| p))
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("displaced-{secs}-seq-{applied}"));
    std::fs::create_dir_all(&aside).map_err(|e| local("create", &aside, &e))?;
    for file in files {
        let to = aside.join(file.file_name().expect("a file name"));
        std::fs::rename(&file, &to).map_err(|e| local("move aside", &file, &e))?;
    }
    sync_dir(&aside)?;
    sync_dir(dir)?;
    tracing::warn!(
        applied,
        to = %aside.display(),
        "this node's data ends before the cluster's stream begins: moved its log and snapshots aside"
    );
    Ok(Some(aside))
}

fn sync_dir(dir: &Path) -> Result<(), ClusterError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ClusterError::Local(format!("sync {}: {e}", dir.display())))
}

/// The leader's snapshot keeper: stores one when leading starts (if the newest stored is
/// older than `started_at`) and whenever one is due, until `stop` or until the node stops
/// leading. `started_at`: the applied seq when this node started leading term `term` (the
/// stream held it then).
pub async fn keep_storing<B: Backbone>(
    backbone: Arc<B>,
    core: Core,
    term: u64,
    started_at: u64,
    opts: ClusterOptions,
    mut stop: watch::Receiver<bool>,
) {
    let interval = opts.snapshot_interval();
    if interval == 0 {
        return;
    }
    let leading = |core: &Core| matches!(core.role(), sluice_server::replication::Role::Leader(_));
    let mut newest = loop {
        match backbone.snapshots().await {
            Ok(stored) => break stored.last().copied().unwrap_or(0),
            Err(e) => tracing::warn!("listing the stored snapshots failed: {e}; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(SNAPSHOT_POLL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    };
    let mut due = started_at > newest;
    let mut tick = tokio::time::interval(SNAPSHOT_POLL);
    let mut retry_at = Instant::now();
    loop {
        if due && Instant::now() >= retry_at {
            let started = Instant::now();
            match store_one(&*backbone, &core, term, started_at).await {
                Ok(seq) => {
                    tracing::info!(
                        seq,
                        term,
                        ms = started.elapsed().as_millis() as u64,
                        "stored a snapshot in the cluster's object store"
                    );
                    newest = newest.max(seq);
                }
                Err(e) => {
                    tracing::warn!(
                        "storing a snapshot failed: {e}; trying again in {STORE_RETRY:?}"
                    );
                    retry_at = Instant::now() + STORE_RETRY;
                }
            }
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !leading(&core) {
            return;
        }
        due = match backbone.state().await {
            Ok(state) => snapshot_due(state, newest, interval),
            Err(_) => false,
        };
    }
}

/// Whether the leader should store a snapshot: the stream has `interval` commits past
/// the newest stored one, or — once retention has dropped commits — half of what it
/// retains (so whichever limit binds, a new snapshot is stored before the stream drops
/// the commits after the previous one).
pub fn snapshot_due(state: crate::backbone::LogState, newest: u64, interval: u64) -> bool {
    if state.last_seq <= newest {
        return false;
    }
    let past = state.last_seq - newest;
    let retained = (state.last_seq + 1).saturating_sub(state.first_seq);
    past >= interval || (state.first_seq > 1 && past >= (retained / 2).max(1))
}

/// Takes a snapshot on `core` and stores it once the stream holds its seq. Returns its seq.
async fn store_one<B: Backbone>(
    backbone: &B,
    core: &Core,
    term: u64,
    started_at: u64,
) -> Result<u64, ClusterError> {
    let taken = core
        .snapshot()
        .await
        .map_err(|e| ClusterError::Core(format!("the local snapshot: {e}")))?;
    let dir = core.config().data_dir.clone();
    // The snapshot just written, or a newer one the node's own schedule wrote meanwhile.
    let (seq, path) = list_snapshots(&dir)
        .map_err(|e| ClusterError::Local(format!("reading {}: {e}", dir.display())))?
        .into_iter()
        .rev()
        .find(|(s, _)| *s >= taken)
        .ok_or_else(|| {
            ClusterError::Local(format!(
                "the snapshot of seq {taken} is not in {}",
                dir.display()
            ))
        })?;
    // The node keeps its two newest snapshots: should it write two more before this one
    // is stored, the store fails and is tried again at the next poll.
    let deadline = Instant::now() + STORE_WAIT;
    loop {
        let state = backbone.state().await?;
        if state.last_seq >= seq {
            break;
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::JetStream {
                what: "snapshot store",
                reason: format!(
                    "the stream did not reach the snapshot's seq {seq} within {STORE_WAIT:?} (it ends at {})",
                    state.last_seq
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if seq > started_at {
        let entry = backbone.entry(seq).await?;
        if entry.term != term {
            return Err(ClusterError::Fenced {
                seq,
                term,
                found: entry.term,
            });
        }
    }
    backbone.put_snapshot(seq, &path).await?;
    Ok(seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backbone::LogState;

    fn state(first_seq: u64, last_seq: u64) -> LogState {
        LogState {
            first_seq,
            last_seq,
        }
    }

    #[test]
    fn a_snapshot_is_due_every_interval_or_before_retention_passes_the_newest() {
        // Nothing new since the newest stored snapshot.
        assert!(!snapshot_due(state(1, 0), 0, 10));
        assert!(!snapshot_due(state(1, 50), 50, 10));
        // By the interval, while the stream still holds seq 1.
        assert!(!snapshot_due(state(1, 9), 0, 10));
        assert!(snapshot_due(state(1, 10), 0, 10));
        // Retention (by bytes, say) binds first: 20 commits retained, 10 past the newest.
        assert!(!snapshot_due(state(81, 100), 91, 1000));
        assert!(snapshot_due(state(81, 100), 90, 1000));
        // A stream holding one commit.
        assert!(snapshot_due(state(100, 100), 99, 1000));
    }

    #[test]
    fn the_local_position_is_the_last_logged_commit_or_the_newest_snapshot() {
        let dir = std::env::temp_dir().join(format!("sluice-cluster-pos-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(local_position(&dir).unwrap(), 0, "no directory");
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(local_position(&dir).unwrap(), 0, "an empty directory");
        // A snapshot of seq 7 and a segment from seq 8 holding commits 8 and 9.
        sluice_log::snapshot::write_snapshot(&dir, 7, &[] as &[&[u8]]).unwrap();
        assert_eq!(local_position(&dir).unwrap(), 7);
        let mut bytes = Vec::new();
        for seq in [8u64, 9] {
            let mut payload = vec![sluice_engine::codec::RECORD_ROWS];
            payload.extend_from_slice(&seq.to_le_bytes());
            sluice_log::frame::encode_into(&mut bytes, &payload).unwrap();
        }
        let segment = sluice_log::segment::segment_path(&dir, 8);
        std::fs::write(&segment, &bytes).unwrap();
        assert_eq!(local_position(&dir).unwrap(), 9);
        // A segment just opened, still empty.
        std::fs::write(sluice_log::segment::segment_path(&dir, 10), b"").unwrap();
        assert_eq!(local_position(&dir).unwrap(), 9);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
