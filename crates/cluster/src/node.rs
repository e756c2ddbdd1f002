//! A node of the cluster: starts it as the leader or a follower and keeps it there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_server::Core;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backbone::Backbone;
use crate::follower::Followed;
use crate::jetstream::{ClusterOptions, JetStream};
use crate::ClusterError;

/// How a node joins its cluster.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub cluster: ClusterOptions,
    /// Follow (`--follower`) rather than lead.
    pub follower: bool,
    /// This node's client address as followers should name it (`--advertise`).
    pub address: String,
    /// A follower takes the leader lease when it lapses (failover); off with
    /// `--no-takeover` (a read replica that never leads).
    pub takeover: bool,
}

/// A running node's cluster task (following, or renewing the lease); dropping it stops
/// the task, as [`Node::stop`] does.
pub struct Node {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ClusterError>>,
}

impl Node {
    /// Asks the node's task to stop and waits for it.
    pub async fn stop(self) -> Result<(), ClusterError> {
        self.stop.send_replace(true);
        self.task
            .await
            .unwrap_or_else(|e| Err(ClusterError::Core(format!("the cluster task failed: {e}"))))
    }

    /// Waits until the node's task ends by itself (a follower that cannot follow, a
    /// leader that lost its lease).
    pub async fn finished(&mut self) -> Result<(), ClusterError> {
        (&mut self.task)
            .await
            .unwrap_or_else(|e| Err(ClusterError::Core(format!("the cluster task failed: {e}"))))
    }
}

/// Prepares the data directory `dir` of a node about to join the cluster, before its core
/// opens it: a follower whose data ends before the stream's retained commits starts from
/// the newest stored snapshot that covers them (see [`crate::snapshots`]); with
/// `discard_diverged`, so does one whose data does not continue the stream (its log and
/// snapshots moved aside). A leader's directory is left as it is. Fails with [`ClusterError::NoSnapshot`] when neither the
/// stream nor a stored snapshot covers what the follower lacks.
pub async fn prepare(
    dir: &std::path::Path,
    opts: &NodeOptions,
) -> Result<crate::snapshots::Start, ClusterError> {
    if !opts.follower {
        return Ok(crate::snapshots::Start::Local {
            applied: crate::snapshots::local_position(dir)?,
        });
    }
    let backbone = JetStream::connect(&opts.cluster).await?;
    joining("preparing the data directory", || {
        crate::snapshots::prepare_on(&backbone, dir, opts.cluster.discard_diverged)
    })
    .await
}

/// How long a joining node retries JetStream requests that fail or time out before it
/// gives up (NATS needs a few seconds to elect new stream leaders after losing a node).
pub const JOIN_RETRY_WINDOW: Duration = Duration::from_secs(30);

/// Runs one step of joining, again after transient JetStream failures (see
/// [`ClusterError::is_transient`]) for up to [`JOIN_RETRY_WINDOW`]. Each step retried must
/// change nothing before its JetStream requests succeed.
async fn joining<T, F, Fut>(what: &str, mut step: F) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClusterError>>,
{
    let since = Instant::now();
    loop {
        match step().await {
            Err(e) if e.is_transient() && since.elapsed() < JOIN_RETRY_WINDOW => {
                tracing::warn!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done => return done,
        }
    }
}

/// Joins `core` to the cluster. Returns once it leads (its writer's rounds go to the log)
/// or follows (its position checked, the reading started); startup errors are returned
/// here.
pub async fn start(core: Core, opts: NodeOptions) -> Result<Node, ClusterError> {
    let backbone = Arc::new(JetStream::connect(&opts.cluster).await?);
    start_on(backbone, core, opts).await
}

/// [`start`] on any backbone.
pub async fn start_on<B: Backbone>(
    backbone: Arc<B>,
    core: Core,
    opts: NodeOptions,
) -> Result<Node, ClusterError> {
    let (stop, stop_rx) = watch::channel(false);
    let ttl = opts.cluster.lease_ttl;
    let cluster = opts.cluster.clone();
    if opts.follower {
        let holder = joining("looking up the leader", || backbone.holder()).await?;
        core.set_follower(holder.map(|h| h.address));
        joining("checking this node's position", || {
            crate::follower::check_position(&*backbone, &core, false)
        })
        .await?;
        let address = opts.takeover.then_some(opts.address);
        let task = tokio::spawn(async move {
            let followed =
                crate::follower::follow(backbone.clone(), core.clone(), stop_rx.clone(), address)
                    .await?;
            match followed {
                Followed::Stopped => Ok(()),
                Followed::TookLease(lease) => {
                    let seq =
                        crate::leader::start(backbone.clone(), core.clone(), lease.holder.term);
                    tracing::info!(
                        term = lease.holder.term,
                        seq,
                        "took the leader lease: leading"
                    );
                    lead(backbone, core, lease, seq, cluster, ttl, stop_rx).await
                }
            }
        });
        return Ok(Node { stop, task });
    }
    let lease = joining("taking the leader lease", || {
        backbone.acquire_lease(&opts.address)
    })
    .await?;
    if let Err(e) = start_stream_after_local_data(&*backbone, &core).await {
        core.set_follower(None);
        return Err(e);
    }
    let applied = match crate::follower::check_position(&*backbone, &core, true).await {
        Ok(applied) => applied,
        Err(e) => {
            core.set_follower(None);
            return Err(e);
        }
    };
    let seq = crate::leader::start(backbone.clone(), core.clone(), lease.holder.term);
    if seq != applied {
        let reason = format!(
            "the node committed seqs {}..={seq} of its own while joining the cluster; restart it",
            applied + 1
        );
        core.replication_failed(reason.clone());
        return Err(ClusterError::Core(reason));
    }
    let task = tokio::spawn(lead(backbone, core, lease, seq, cluster, ttl, stop_rx));
    Ok(Node { stop, task })
}

/// Leads from `seq` on: stores snapshots in the background and holds the lease until
/// stopped or lost.
async fn lead<B: Backbone>(
    backbone: Arc<B>,
    core: Core,
    lease: crate::backbone::Lease,
    seq: u64,
    cluster: ClusterOptions,
    ttl: std::time::Duration,
    stop_rx: watch::Receiver<bool>,
) -> Result<(), ClusterError> {
    tokio::spawn(crate::snapshots::keep_storing(
        backbone.clone(),
        core.clone(),
        lease.holder.term,
        seq,
        cluster,
        stop_rx.clone(),
    ));
    hold_lease(backbone, core, lease, ttl, stop_rx).await
}

/// A leader that holds commits when the cluster's log was never written (a database
/// moving into a cluster): the log starts after them, and the leader's snapshot of them,
/// stored when it starts leading, is where every follower starts.
async fn start_stream_after_local_data<B: Backbone>(
    backbone: &B,
    core: &Core,
) -> Result<(), ClusterError> {
    let applied = core.db().seq;
    let state = backbone.state().await?;
    if applied > 0 && state.last_seq == 0 {
        backbone.start_after(applied).await?;
        tracing::info!(
            applied,
            "the cluster's log was new: it starts after this leader's commits"
        );
    }
    Ok(())
}

/// Renews the leader lease every third of its time to live until stopped; a renewal that
/// keeps failing for three quarters of the lease ends the leadership
/// (`Core::replication_failed`: no more writes here).
async fn hold_lease<B: Backbone>(
    backbone: Arc<B>,
    core: Core,
    mut lease: crate::backbone::Lease,
    ttl: std::time::Duration,
    mut stop_rx: watch::Receiver<bool>,
) -> Result<(), ClusterError> {
    let mut tick = tokio::time::interval(ttl / 3);
    let mut renewed_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop_rx.wait_for(|s| *s) => return Ok(()),
        }
        if !matches!(core.role(), sluice_server::replication::Role::Leader(_)) {
            // Replication failed (fenced, or the log unreachable for too long): let the
            // lease lapse so a follower takes over.
            return Err(ClusterError::Core(
                "stopped leading after replication failed; the lease lapses".into(),
            ));
        }
        // A failed renewal is tried again every tenth of the lease (the log may be
        // electing a new stream leader after losing a node) until three quarters of the
        // lease have passed since the last renewal: then it steps down, before the lease
        // can lapse and another node take it.
        loop {
            match backbone.renew_lease(&lease).await {
                Ok(renewed) => {
                    lease = renewed;
                    renewed_at = tokio::time::Instant::now();
                    break;
                }
                Err(e) if renewed_at.elapsed() < ttl * 3 / 4 => {
                    tracing::warn!("renewing the leader lease failed: {e}; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(ttl / 10) => {}
                        _ = stop_rx.wait_for(|s| *s) => return Ok(()),
                    }
                }
                Err(e) => {
                    let reason = format!("lost the leader lease: {e}");
                    core.replication_failed(reason.clone());
                    return Err(ClusterError::Core(reason));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn joining_retries_jetstream_failures_and_not_others() {
        let tries = AtomicU32::new(0);
        let joined = joining("listing", || async {
            match tries.fetch_add(1, Ordering::Relaxed) {
                0 | 1 => Err(ClusterError::js("snapshot list", "timed out")),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(joined.unwrap(), 2, "two timeouts, then the answer");

        let tries = AtomicU32::new(0);
        let refused: Result<(), _> = joining("checking", || async {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(ClusterError::Diverged { seq: 7 })
        })
        .await;
        assert!(matches!(refused, Err(ClusterError::Diverged { seq: 7 })));
        assert_eq!(
            tries.load(Ordering::Relaxed),
            1,
            "a diverged node is not retried"
        );
    }
}
