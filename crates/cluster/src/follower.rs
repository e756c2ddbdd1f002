//! The follower's side: reads the replicated log from the entry after its applied seq and
//! hands the frames, in batches of what has arrived, to the core
//! (`Core::apply_replicated`), which replays them on the writer thread, writes them to the
//! node's own log and feeds its live views and watchers.
//!
//! Before it starts it checks that the node can follow at all: its applied seq must be
//! inside what the log holds ([`ClusterError::TooFarBehind`], [`ClusterError::Ahead`]) and
//! its last commit must be the log's ([`ClusterError::Diverged`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sluice_server::Core;
use tokio::sync::watch;

use crate::backbone::Backbone;
use crate::ClusterError;

/// Frames handed to the core in one writer request, at most.
pub const APPLY_BATCH_MAX: usize = 1024;
/// How long a follower keeps re-opening its read after failures before it gives up.
pub const READ_RETRY_WINDOW: Duration = Duration::from_secs(30);
/// How long a read may bring nothing while the log has entries this node lacks before it
/// is opened again.
const READ_STALL: Duration = Duration::from_secs(2);
/// How often a follower looks up the leader's address (for `not_leader` errors).
const HOLDER_POLL: Duration = Duration::from_millis(500);

/// The node's applied seq and (when the changelog still holds it) its last commit's payload.
fn last_commit(core: &Core) -> (u64, Option<Vec<u8>>) {
    let db = core.db();
    let seq = db.seq;
    let payload = seq.checked_sub(1).and_then(|before| {
        let mut commits = db.changelog.since(before).ok()?;
        let commit = commits.next()?;
        let mut out = Vec::new();
        sluice_engine::codec::encode_commit(commit, &mut out);
        Some(out)
    });
    (seq, payload)
}

/// Checks that a node at its applied seq can continue the log (as a follower, or as the
/// leader when `leading`): inside the retained entries, and its last commit the log's.
pub async fn check_position<B: Backbone>(
    backbone: &B,
    core: &Core,
    leading: bool,
) -> Result<u64, ClusterError> {
    let (applied, payload) = last_commit(core);
    let state = backbone.state().await?;
    if applied > state.last_seq {
        return Err(ClusterError::Ahead {
            local: applied,
            stream: state.last_seq,
        });
    }
    if leading && applied < state.last_seq {
        return Err(ClusterError::Config(format!(
            "this node applied up to seq {applied} but the cluster's stream ends at seq {}: start it with --follower to catch up first",
            state.last_seq
        )));
    }
    if applied + 1 < state.first_seq {
        return Err(ClusterError::TooFarBehind {
            applied,
            first: state.first_seq,
        });
    }
    if applied >= state.first_seq && applied > 0 {
        if let Some(payload) = payload {
            let entry = backbone.entry(applied).await?;
            let theirs = entry
                .frame
                .get(sluice_log::frame::FRAME_HEADER_BYTES..)
                .unwrap_or_default();
            if theirs != payload.as_slice() {
                return Err(ClusterError::Diverged { seq: applied });
            }
        }
    }
    Ok(applied)
}

/// Why [`follow`] returned.
pub enum Followed {
    /// Asked to stop.
    Stopped,
    /// The leader lease had lapsed while this node was at the log's end, and this node
    /// took it: it is to lead from here.
    TookLease(crate::backbone::Lease),
}

/// Follows the log until `stop` turns true, or — when `address` is given — until the
/// leader lease lapses while this node holds every entry and it takes the lease (the most
/// up-to-date follower is the one that can: the others are still reading). Err: the node
/// cannot follow.
pub async fn follow<B: Backbone>(
    backbone: Arc<B>,
    core: Core,
    mut stop: watch::Receiver<bool>,
    address: Option<String>,
) -> Result<Followed, ClusterError> {
    let mut expected = core.db().seq + 1;
    let mut failing_since: Option<Instant> = None;
    let mut holder_poll = tokio::time::interval(HOLDER_POLL);
    let mut leader: Option<String> = None;
    loop {
        let opened = backbone.read_from(expected).await;
        let mut progressed = Instant::now();
        let mut entries = match opened {
            Ok(entries) => entries.ready_chunks(APPLY_BATCH_MAX),
            Err(e) => {
                retry_or_fail(&mut failing_since, e).await?;
                continue;
            }
        };
        loop {
            let batch = tokio::select! {
                batch = entries.next() => batch,
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return Ok(Followed::Stopped);
                    }
                    continue;
                }
                _ = holder_poll.tick() => {
                    if progressed.elapsed() > READ_STALL {
                        // Nothing arrived for a while: if the log has entries this node
                        // lacks, the read is stuck (its consumer lived on a NATS node that
                        // went away): open it again.
                        if let Ok(state) = backbone.state().await {
                            if state.last_seq >= expected {
                                tracing::warn!(expected, last = state.last_seq, "the read of the cluster's log stalled; reopening it");
                                break;
                            }
                        }
                        progressed = Instant::now();
                    }
                    let free = poll_leader(&*backbone, &core, &mut leader).await;
                    if let (true, Some(address)) = (free, &address) {
                        if let Some(lease) = try_take_lease(&*backbone, &core, address).await {
                            return Ok(Followed::TookLease(lease));
                        }
                    }
                    continue;
                }
            };
            let Some(batch) = batch else {
                break;
            };
            let mut frames = Vec::with_capacity(batch.len());
            let mut failed = None;
            for entry in batch {
                match entry {
                    Ok(entry) if entry.seq < expected => {}
                    Ok(entry) if entry.seq == expected => {
                        expected += 1;
                        frames.push(entry.frame);
                    }
                    Ok(entry) => {
                        return Err(ClusterError::Gap {
                            expected,
                            found: entry.seq,
                        })
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if !frames.is_empty() {
                progressed = Instant::now();
                core.apply_replicated(frames)
                    .await
                    .map_err(|e| ClusterError::Core(e.to_string()))?;
                failing_since = None;
            }
            if let Some(e) = failed {
                retry_or_fail(&mut failing_since, e).await?;
                break;
            }
        }
    }
}

/// Names the lease holder in this node's `not_leader` errors; true when nobody holds it.
async fn poll_leader<B: Backbone>(backbone: &B, core: &Core, leader: &mut Option<String>) -> bool {
    match backbone.holder().await {
        Ok(Some(holder)) => {
            if leader.as_deref() != Some(holder.address.as_str()) {
                *leader = Some(holder.address.clone());
                core.set_follower(leader.clone());
            }
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Takes the lapsed lease if this node holds every entry of the log (so nothing the old
/// leader had replicated is missing here).
async fn try_take_lease<B: Backbone>(
    backbone: &B,
    core: &Core,
    address: &str,
) -> Option<crate::backbone::Lease> {
    let state = backbone.state().await.ok()?;
    if core.db().seq != state.last_seq {
        return None;
    }
    let lease = backbone.acquire_lease(address).await.ok()?;
    // Entries the old leader appended between the look and the lease would be missed:
    // look again, and give the lease back to the next try if so.
    match backbone.state().await {
        Ok(after) if after.last_seq == core.db().seq => Some(lease),
        _ => {
            tracing::warn!("the log moved while taking the lease; following on");
            None
        }
    }
}

async fn retry_or_fail(
    failing_since: &mut Option<Instant>,
    e: ClusterError,
) -> Result<(), ClusterError> {
    let since = *failing_since.get_or_insert_with(Instant::now);
    if since.elapsed() > READ_RETRY_WINDOW {
        return Err(e);
    }
    tracing::warn!("reading the cluster's log failed: {e}; retrying");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}
