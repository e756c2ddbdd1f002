//! The live thread: owns a [`Live`] beside a server's writer. The writer hands it each
//! round's commits after applying them ([`LiveHandle::publish`], never blocking); subscribe
//! requests read the current `Db` under its read lock, so a new view starts from one exact
//! seq and ignores the commits up to it that are still queued.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use sluice_engine::{Commit, Db};
use sluice_query::QueryError;
use tokio::sync::oneshot;

use crate::{Limits, Live, LiveStats, Sink, SubId, Subscribe};

/// Subscriptions of a `subscribe_many` between two looks at the clock (a few µs each).
const SUBSCRIBES_PER_CLOCK_CHECK: u32 = 16;

enum Input {
    Commits(Vec<Arc<Commit>>),
    Subscribe {
        req: Subscribe,
        sink: Arc<Sink>,
        reply: oneshot::Sender<Result<SubId, QueryError>>,
    },
    /// Many subscriptions in one round trip (`subscribe_many`): answered in order.
    SubscribeMany {
        reqs: Vec<(Subscribe, Arc<Sink>)>,
        reply: oneshot::Sender<Vec<Result<SubId, QueryError>>>,
    },
    Unsubscribe(SubId),
}

/// The handle the server keeps; dropping the last one stops the thread.
pub struct LiveHandle {
    tx: mpsc::Sender<Input>,
    stats: Arc<Mutex<LiveStats>>,
    limits: Limits,
    handoff: Arc<Handoff>,
}

/// The writer → live thread hand-off's bound: commits handed over and not yet applied.
#[derive(Default)]
struct Handoff {
    queued: Mutex<HandoffState>,
    applied: Condvar,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct HandoffState {
    /// Commits handed over and not yet applied, now and at most so far.
    pub queued_commits: usize,
    pub queued_commits_peak: usize,
    /// Hand-overs that waited for the live thread (back-pressure on the writer).
    pub waits: u64,
}

impl LiveHandle {
    pub fn spawn(db: Arc<RwLock<Db>>, limits: Limits) -> std::io::Result<LiveHandle> {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(LiveStats::default()));
        let shared = stats.clone();
        let mut live = Live::new(limits.clone());
        let handoff = Arc::new(Handoff::default());
        let thread_handoff = handoff.clone();
        sluice_engine::critical::spawn("live", move || {
            run(&mut live, &db, &rx, &shared, &thread_handoff)
        })?;
        Ok(LiveHandle {
            tx,
            stats,
            limits,
            handoff,
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Hands over one writer round's commits, in seq order.
    /// Waits while more than `handoff_commits_max` commits are queued (one round larger
    /// than the bound still goes in once the queue is empty).
    pub fn publish(&self, commits: Vec<Arc<Commit>>) {
        if commits.is_empty() {
            return;
        }
        let n = commits.len();
        let max = self.limits.handoff_commits_max;
        let mut state = self.handoff.queued.lock();
        if state.queued_commits > 0 && state.queued_commits + n > max {
            state.waits += 1;
            // The live thread is critical: if it stopped, the process has exited.
            while state.queued_commits > 0 && state.queued_commits + n > max {
                self.handoff.applied.wait(&mut state);
            }
        }
        state.queued_commits += n;
        state.queued_commits_peak = state.queued_commits_peak.max(state.queued_commits);
        drop(state);
        if self.tx.send(Input::Commits(commits)).is_err() {
            self.handoff.queued.lock().queued_commits -= n;
        }
    }

    /// The hand-off's queue and counters.
    pub fn handoff(&self) -> HandoffState {
        *self.handoff.queued.lock()
    }

    pub async fn subscribe(&self, req: Subscribe, sink: Arc<Sink>) -> Result<SubId, QueryError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Input::Subscribe { req, sink, reply })
            .map_err(|_| QueryError::BadRequest("the server is shutting down".into()))?;
        rx.await
            .unwrap_or_else(|_| Err(QueryError::BadRequest("the server is shutting down".into())))
    }

    /// Subscribes each `(request, sink)` in order, in one round trip to the live thread (the
    /// thread takes the `Db`'s read lock once per subscription, as [`LiveHandle::subscribe`]
    /// does, so a large batch does not hold the writer off for its whole length).
    pub async fn subscribe_many(
        &self,
        reqs: Vec<(Subscribe, Arc<Sink>)>,
    ) -> Vec<Result<SubId, QueryError>> {
        let n = reqs.len();
        let down = || QueryError::BadRequest("the server is shutting down".into());
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Input::SubscribeMany { reqs, reply }).is_err() {
            return (0..n).map(|_| Err(down())).collect();
        }
        rx.await
            .unwrap_or_else(|_| (0..n).map(|_| Err(down())).collect())
    }

    pub fn unsubscribe(&self, sub: SubId) {
        let _ = self.tx.send(Input::Unsubscribe(sub));
    }

    /// Counters as of the live thread's last round.
    pub fn stats(&self) -> LiveStats {
        *self.stats.lock()
    }
}

fn run(
    live: &mut Live,
    db: &RwLock<Db>,
    rx: &mpsc::Receiver<Input>,
    stats: &Mutex<LiveStats>,
    handoff: &Handoff,
) {
    let tick = Duration::from_millis(500);
    let mut last_expiry = Instant::now();
    // When the next coalescing window is due (see `crate::fold`).
    let mut fold_due: Option<Instant> = None;
    loop {
        let wait = fold_due.map_or(tick, |due| {
            due.saturating_duration_since(Instant::now()).min(tick)
        });
        let first = match rx.recv_timeout(wait) {
            Ok(input) => Some(input),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        for input in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match input {
                Input::Commits(commits) => {
                    sluice_engine::critical::injected_panic_point("live");
                    for c in &commits {
                        live.apply(c, || db.read());
                    }
                    handoff.queued.lock().queued_commits -= commits.len();
                    handoff.applied.notify_all();
                }
                // The counters count a subscription before its subscriber hears of it.
                Input::Subscribe { req, sink, reply } => {
                    let result = live.subscribe_streaming(|| db.read(), &req, sink);
                    *stats.lock() = live.stats();
                    let _ = reply.send(result);
                    // A large snapshot streamed from the frozen table goes out while its
                    // view is built here, before the next input.
                    live.finish_pending();
                }
                Input::SubscribeMany { reqs, reply } => {
                    // Thousands of subscriptions in one input: the CPU is offered between
                    // them (never under the read lock, which each takes and releases).
                    let mut pacer = sluice_sched::Pacer::check_every(SUBSCRIBES_PER_CLOCK_CHECK);
                    let results = reqs
                        .into_iter()
                        .map(|(req, sink)| {
                            pacer.step();
                            live.subscribe_with(|| db.read(), &req, sink)
                        })
                        .collect();
                    *stats.lock() = live.stats();
                    let _ = reply.send(results);
                }
                Input::Unsubscribe(sub) => live.unsubscribe(sub),
            }
            // Under a steady stream of input this loop may not end for a while: windows
            // that fall due meanwhile are flushed here.
            if live
                .next_fold_due()
                .is_some_and(|due| due <= Instant::now())
            {
                live.flush_folds(Instant::now());
            }
        }
        fold_due = live.flush_folds(Instant::now());
        if last_expiry.elapsed() >= tick {
            live.expire(Instant::now(), false);
            last_expiry = Instant::now();
        }
        *stats.lock() = live.stats();
    }
}
