//! The writer thread: the only code that mutates the [`Db`].
//!
//! It drains every queued request (up to [`WRITER_BATCH_MAX`]), applies them one after
//! another under one write lock — each transaction gets the next seq — encodes their log
//! frames, and hands the lot to the log in one submit. `memory` commits are acknowledged
//! right away; `disk` and `fsync` ones when the log thread gets there. The writer never
//! waits for a sync: while the log syncs one batch, the writer applies the next.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::lock_api::ArcRwLockWriteGuard;
use parking_lot::RawRwLock;
use sluice_engine::codec::{encode_commit, FrozenState};
use sluice_engine::{Commit, Db, SchemaChange, TxError, TxRef, TxState, WriteResult};
use sluice_functions::{Functions, TxAccess};
use sluice_log::{frame, Durability, LogError, Waiter};
use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::core::{CallOk, MutateOk, MutateOps, Op, OpenError, Shared};
use crate::error::{CoreError, Refusal, WriterResult};
use crate::prefetch::{KeyHints, Stage};
use crate::topics::{apply_topic_op, AppendOk, NewRecord, PutTopicOk, TopicOp};

type DbGuard = ArcRwLockWriteGuard<RawRwLock, Db>;

/// The transaction lent to a JavaScript call: the writer's own write guard, so no reader
/// sees the call's uncommitted writes.
struct Lent {
    db: DbGuard,
    st: TxState,
    now_us: i64,
}

impl TxAccess for Lent {
    fn tx(&mut self) -> TxRef<'_> {
        let db: &mut Db = &mut self.db;
        db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        self.now_us
    }
    fn seed(&self) -> u64 {
        self.st.seq().wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}
use crate::replication::PairAck;
use crate::snapshotter::{Job, Snapshotter};

/// Most requests applied in one writer round (one write lock, one log submit). The rest wait
/// in the channel, first come first served: under pipelined load (`sluice bench transfer`,
/// `sluice-ws`, 64 × 40 calls in flight) an uncapped round took ~800 calls and 4–8 ms, and a
/// call that arrived just after one started waited for it and then for its own — p99 1.7× p50.
/// Measured at α = 0 / 1.5 (20 s cases): 4096 → 254 K / 343 K TPS, p99 16.7 / 12.8 ms; 512 →
/// 269 K / 368 K, p99 14.9 / 11.7 ms; 256 → 262 K, 14.2 ms; 128 → 231 K, 17.3 ms (more rounds,
/// more hand-offs to the log and the network threads per call).
pub(crate) const WRITER_BATCH_MAX: usize = 512;

/// Frame bytes after which a writer round stops taking requests: half the log's pending
/// bound (so a submit fits beside what is pending), at most 8 MiB. One commit may exceed it.
pub(crate) fn round_frame_bytes_max(log_pending_bytes_max: usize) -> usize {
    (log_pending_bytes_max / 2).min(8 << 20)
}

type Reply<T> = oneshot::Sender<WriterResult<T>>;

pub(crate) enum Request {
    Mutate {
        ops: MutateOps,
        /// A client's claims (its changes are checked against the write policies); `None`
        /// for the admin.
        claims: Option<Arc<crate::auth::Claims>>,
        durability: Durability,
        reply: Reply<MutateOk>,
    },
    /// A `POST /v1/sql` script of data statements, as one transaction.
    Sql {
        script: Arc<sluice_query::script::Script>,
        params: sluice_query::Params,
        claims: Option<Arc<crate::auth::Claims>>,
        durability: Durability,
        reply: Reply<crate::core::SqlOk>,
    },
    Schema {
        changes: Vec<SchemaChange>,
        sql: String,
        durability: Durability,
        reply: Reply<Option<u64>>,
    },
    Call {
        name: String,
        args: sluice_functions::Args,
        /// The calling client's claims; `None` for the admin.
        claims: Option<Arc<crate::auth::Claims>>,
        durability: Durability,
        reply: Reply<CallOk>,
    },
    Topic {
        op: TopicOp,
        durability: Durability,
        reply: Reply<PutTopicOk>,
    },
    Append {
        topic: String,
        records: Vec<NewRecord>,
        /// The appending client's claims (checked against the topic's append rules);
        /// `None` for the admin.
        claims: Option<Arc<crate::auth::Claims>>,
        durability: Durability,
        reply: Reply<AppendOk>,
    },
    LoadFunctions {
        source: String,
        reply: Reply<Vec<String>>,
    },
    ListFunctions {
        reply: Reply<Vec<String>>,
    },
    Snapshot {
        reply: Reply<u64>,
    },
    /// From the snapshot thread: it finished a job and can take the next one.
    SnapshotIdle,
    /// From the ticker: nothing to do but the round's periodic work (topics' age limits),
    /// so an idle writer still drops expired records.
    Tick,
    Shutdown {
        reply: Reply<()>,
    },
    /// A follower's commits from the cluster: whole log frames, in seq order (frames at
    /// or below the applied seq are skipped). Replies with the applied seq.
    Replicate {
        frames: Vec<bytes::Bytes>,
        reply: Reply<u64>,
    },
}

impl Request {
    /// Whether this request writes (refused on a follower).
    fn writes(&self) -> bool {
        matches!(
            self,
            Request::Mutate { .. }
                | Request::Schema { .. }
                | Request::Sql { .. }
                | Request::Call { .. }
                | Request::Topic { .. }
                | Request::Append { .. }
        )
    }

    fn durability(&self) -> Option<Durability> {
        match self {
            Request::Mutate { durability, .. }
            | Request::Schema { durability, .. }
            | Request::Sql { durability, .. }
            | Request::Call { durability, .. }
            | Request::Topic { durability, .. }
            | Request::Append { durability, .. } => Some(*durability),
            _ => None,
        }
    }
}

/// A commit waiting for the log, with the reply to send when it gets there.
pub(crate) struct Ack {
    durability: Durability,
    reply: AckReply,
}

pub(crate) enum AckReply {
    Mutate(Reply<MutateOk>, MutateOk),
    Schema(Reply<Option<u64>>, u64),
    Call(Reply<CallOk>, CallOk),
    Topic(Reply<PutTopicOk>, PutTopicOk),
    Append(Reply<AppendOk>, AppendOk),
    Sql(Reply<crate::core::SqlOk>, crate::core::SqlOk),
    /// One half of a `replicated` commit's acknowledgement (the other is the quorum's).
    Pair(Arc<PairAck>),
}

impl AckReply {
    pub(crate) fn send(self, result: Result<(), CoreError>) {
        let err = Refusal::now;
        // A dropped receiver means the client went away; the commit stands regardless.
        match self {
            AckReply::Mutate(reply, ok) => {
                let _ = reply.send(result.map(|_| ok).map_err(err));
            }
            AckReply::Schema(reply, seq) => {
                let _ = reply.send(result.map(|_| Some(seq)).map_err(err));
            }
            AckReply::Call(reply, ok) => {
                let _ = reply.send(result.map(|_| ok).map_err(err));
            }
            AckReply::Topic(reply, ok) => {
                let _ = reply.send(result.map(|_| ok).map_err(err));
            }
            AckReply::Append(reply, ok) => {
                let _ = reply.send(result.map(|_| ok).map_err(err));
            }
            AckReply::Sql(reply, ok) => {
                let _ = reply.send(result.map(|_| ok).map_err(err));
            }
            AckReply::Pair(pair) => pair.half_done(result),
        }
    }
}

impl Waiter for Ack {
    fn durability(&self) -> Durability {
        self.durability
    }
    fn complete(self, result: Result<(), &LogError>) {
        self.reply.send(result.map_err(CoreError::from_log));
    }
}

/// The commits of one writer round and how each is to be acknowledged.
#[derive(Default)]
struct Committed {
    /// Frames (= commits) encoded this round.
    frames: u64,
    /// `memory` commits: acknowledged once the round is applied.
    immediate: Vec<AckReply>,
    /// `(seq, class)` of commits that wait for the log.
    waiting: Vec<(u64, Durability)>,
    /// Their acknowledgements, completed by the log thread.
    acks: Vec<Ack>,
    /// `replicated` commits' quorum halves (their local halves are among `acks`).
    quorum: Vec<(u64, Arc<PairAck>)>,
}

impl Committed {
    /// Room for a round of `requests` durable commits, so that the lists do not grow (and
    /// copy themselves) as the round goes.
    fn with_capacity(requests: usize) -> Committed {
        Committed {
            waiting: Vec::with_capacity(requests),
            acks: Vec::with_capacity(requests),
            ..Committed::default()
        }
    }

    fn add(&mut self, seq: u64, durability: Durability, reply: AckReply) {
        self.frames += 1;
        if durability == Durability::Memory {
            self.immediate.push(reply);
        } else if durability == Durability::Replicated {
            let pair = PairAck::new(reply);
            self.waiting.push((seq, durability));
            self.acks.push(Ack {
                durability: Durability::Disk,
                reply: AckReply::Pair(pair.clone()),
            });
            self.quorum.push((seq, pair));
        } else {
            self.waiting.push((seq, durability));
            self.acks.push(Ack { durability, reply });
        }
    }
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    functions: Functions,
    snapshotter: Snapshotter,
    log_bytes_since_snapshot: u64,
    frames: Vec<u8>,
    /// Each commit's seq and frame in `frames` (for the cluster's replicator).
    frame_ranges: Vec<(u64, std::ops::Range<usize>)>,
    /// This round's commits, for the live-query thread.
    published: Vec<Arc<Commit>>,
    /// Snapshot requests that arrived while the snapshot thread was busy; served by the
    /// first round after it is idle again.
    snapshot_waiting: Vec<Reply<u64>>,
    /// When topics were last trimmed by age.
    topics_trimmed: std::time::Instant,
    /// Where commits the changelog evicted go to be dropped (`None`: dropped here).
    dropper: Option<std::sync::mpsc::SyncSender<Vec<Arc<Commit>>>>,
    /// The last function call's transaction state, renewed for the next call (its undo
    /// list keeps its room).
    spare_st: Option<TxState>,
    /// Which arguments of each function name the rows it writes (see [`crate::prefetch`]).
    key_hints: KeyHints,
}

/// Evicted commits handed to the drop thread at once: they wait in the changelog
/// ([`sluice_engine::changelog::Changelog::evicted_len`]) until there are this many.
/// Handing over every round's (one or two commits each under a steady stream of small
/// writes) woke the thread once per round: on a 2-core machine that wake-up competed with
/// the live thread and the runtime for a core, and the write→diff p99 at 50 000 writes/s
/// over 100 000 views went from ~10 to ~15 ms once the changelog was full.
const DROP_BATCH_COMMITS: usize = 1024;
// The changelog keeps at most DEFERRED_MAX waiting (it drops the rest itself).
const _: () = assert!(DROP_BATCH_COMMITS <= sluice_engine::changelog::DEFERRED_MAX);

/// Evicted-commit batches that may wait for the drop thread; beyond that the writer drops
/// a batch itself.
const DROP_BATCHES_MAX: usize = 16;
/// Evicted commits dropped between two looks at the clock (a transfer's commit frees in
/// well under a microsecond, an ingest batch's in tens).
const COMMITS_DROPPED_PER_CLOCK_CHECK: u32 = 4;

/// Evicted commits whose memory the drop thread reads ahead of dropping them
/// ([`read_ahead`]).
const DROP_READ_AHEAD_COMMITS: usize = 16;

/// Reads the reference counts that dropping `commits` decrements (each commit's, and its
/// changes' row images'), and returns their sum (for `black_box`). All of it is cold by the
/// time a commit is evicted, and a drop's decrements are locked instructions, which on x86
/// wait for every earlier load: dropped one after another, each cache miss waited for the
/// one before (the `sluice-drop` thread was 7.3 % of the server's samples under the uniform
/// transfer workload, all but a few percent of it on the decrements). Plain loads run ahead
/// of one another, so this pass takes its misses side by side, and the drops that follow find
/// their lines in cache.
fn read_ahead(commits: &[Arc<Commit>]) -> usize {
    let mut sum = 0;
    for commit in commits {
        sum += Arc::strong_count(commit);
        if let sluice_engine::CommitBody::Rows(changes) = &commit.body {
            for change in changes {
                sum += change.row.as_ref().map_or(0, Arc::strong_count);
                sum += change.old.as_ref().map_or(0, Arc::strong_count);
            }
        }
    }
    sum
}

/// Drops `batch` in order, [`DROP_READ_AHEAD_COMMITS`] at a time after reading them ahead;
/// `step` after each commit (the pacer).
fn drop_commits(batch: Vec<Arc<Commit>>, mut step: impl FnMut()) {
    let mut commits = batch.into_iter();
    while !commits.as_slice().is_empty() {
        let ahead = commits.as_slice();
        std::hint::black_box(read_ahead(
            &ahead[..ahead.len().min(DROP_READ_AHEAD_COMMITS)],
        ));
        for commit in commits.by_ref().take(DROP_READ_AHEAD_COMMITS) {
            drop(commit);
            step();
        }
    }
}

/// Starts the thread that drops the commits the changelog evicts. An evicted commit is
/// usually the last reference to its changes and row images, all cold in cache by then:
/// freeing them was 6–7 % of the writer's time in the uniform transfer workload, time the
/// single writer spends on no transaction. `None` if the thread cannot start (the writer
/// then drops them itself, as before).
fn spawn_dropper() -> Option<std::sync::mpsc::SyncSender<Vec<Arc<Commit>>>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Arc<Commit>>>(DROP_BATCHES_MAX);
    std::thread::Builder::new()
        .name("sluice-drop".into())
        .spawn(move || {
            // Ends when the writer (the only sender) is gone. A batch of ingest commits
            // frees a hundred thousand rows or more: paced, so that the threads a write's
            // acknowledgement waits on never queue behind it for a scheduler tick.
            let mut pacer = sluice_sched::Pacer::check_every(COMMITS_DROPPED_PER_CLOCK_CHECK);
            while let Ok(batch) = rx.recv() {
                pacer.restart();
                drop_commits(batch, || pacer.step());
            }
        })
        .ok()?;
    Some(tx)
}

/// A round that starts with at least this many requests queued raises the writer's
/// priority to `--writer-nice` ([`Boost`]).
const BOOST_FROM_REQUESTS: usize = 256;
/// A round that starts with fewer than this many requests queued lowers it again.
const BOOST_UNTIL_REQUESTS: usize = 32;

/// The writer's priority, raised to `--writer-nice` ([`crate::config::WRITER_NICE_DEFAULT`])
/// only while it has a backlog.
///
/// *Why only then.* On saturated CPUs the one writer's share of a core is the write
/// throughput, and the scheduler shares the cores evenly among every runnable thread: in
/// `sluice bench transfer` (`sluice-ws`, 2 cores) the writer waited runnable 8–17 % of the
/// time, and at nice −5 throughout pipelined transfers ran 4–13 % faster. But with one
/// request in flight per client (`sluice-http`) a writer at −5 preempts whoever runs the
/// moment a request arrives and takes it alone: commits per sync fell from 19–22 to 10–11
/// and TPS by 10–30 %, as every extra round costs a log write, a sync and a live hand-off.
/// A backlog of hundreds of requests is when the writer is the bottleneck and there is
/// nothing left to batch; a short queue is when waiting a little batches more.
struct Boost {
    /// The nice asked for while backlogged; `None`: never (equal to `base`, or refused).
    raised: Option<i32>,
    /// The nice the thread started with, and returns to.
    base: i32,
    on: bool,
}

impl Boost {
    fn new(raised: i32, base: i32) -> Boost {
        Boost {
            raised: (raised != base).then_some(raised),
            base,
            on: false,
        }
    }

    /// A round starts with `queued` requests: sets the nice through `set` when the backlog
    /// crossed a bound; returns the nice the thread runs at after that.
    fn observe(
        &mut self,
        queued: usize,
        set: impl FnOnce(i32) -> std::io::Result<()>,
    ) -> Option<i32> {
        let raised = self.raised?;
        let want = if self.on {
            queued >= BOOST_UNTIL_REQUESTS
        } else {
            queued >= BOOST_FROM_REQUESTS
        };
        if want == self.on {
            return None;
        }
        let nice = if want { raised } else { self.base };
        match set(nice) {
            Ok(()) => {
                self.on = want;
                Some(nice)
            }
            Err(e) => {
                tracing::info!(
                    nice,
                    error = %e,
                    "could not change the writer thread's priority (below the process's own \
                     needs root, CAP_SYS_NICE or RLIMIT_NICE); it stays at {}",
                    if self.on { raised } else { self.base }
                );
                // Lowering it back never fails; a refused raise is not tried again.
                self.raised = None;
                None
            }
        }
    }
}

impl Writer {
    /// Starts the writer; `log_bytes_since_snapshot` is the log a restart replayed, so a
    /// process that keeps being killed still snapshots on schedule. The functions module
    /// (if configured) is loaded on the writer thread, which owns the JavaScript engine;
    /// a module that does not load fails startup.
    pub fn spawn(
        shared: Arc<Shared>,
        rx: mpsc::Receiver<Request>,
        wake: mpsc::WeakSender<Request>,
        log_bytes_since_snapshot: u64,
    ) -> Result<std::thread::JoinHandle<()>, OpenError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = sluice_log::critical::spawn("writer", move || {
            let mut functions = match Functions::new(shared.config.function_limits) {
                Ok(f) => f,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            if let Some(source) = &shared.config.functions_source {
                if let Err(e) = functions.load(source) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            }
            let _ = ready_tx.send(Ok(()));
            let snapshotter = Snapshotter::spawn(shared.clone(), wake);
            let dropper = spawn_dropper();
            if dropper.is_some() {
                shared.db.write().changelog.defer_drops();
            }
            Writer {
                shared,
                functions,
                snapshotter,
                log_bytes_since_snapshot,
                frames: Vec::new(),
                frame_ranges: Vec::new(),
                published: Vec::new(),
                snapshot_waiting: Vec::new(),
                // Due at once: the first tick after a restart expires what aged meanwhile.
                topics_trimmed: std::time::Instant::now()
                    .checked_sub(TOPIC_TRIM_INTERVAL)
                    .unwrap_or_else(std::time::Instant::now),
                dropper,
                spare_st: None,
                key_hints: KeyHints::default(),
            }
            .run(rx)
        })
        .expect("spawn the writer thread");
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => Err(OpenError::Functions(e)),
            Err(_) => Err(OpenError::Functions(
                sluice_functions::FunctionError::Value(
                    "the writer thread stopped during startup".into(),
                ),
            )),
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = VecDeque::with_capacity(WRITER_BATCH_MAX);
        let base = sluice_sched::nice(0).unwrap_or(0);
        self.shared
            .counters
            .writer_nice
            .store(base, Ordering::Relaxed);
        let mut boost = Boost::new(self.shared.config.writer_nice, base);
        loop {
            if batch.is_empty() {
                match rx.blocking_recv() {
                    Some(first) => batch.push_back(first),
                    None => return,
                }
            }
            while batch.len() < WRITER_BATCH_MAX {
                match rx.try_recv() {
                    Ok(r) => batch.push_back(r),
                    Err(_) => break,
                }
            }
            if let Some(nice) = boost.observe(batch.len(), sluice_sched::set_nice) {
                let counters = &self.shared.counters;
                counters.writer_nice.store(nice, Ordering::Relaxed);
                if nice != base {
                    counters.writer_boosts.fetch_add(1, Ordering::Relaxed);
                }
            }
            let started = std::time::Instant::now();
            let stop = self.round(&mut batch);
            let counters = &self.shared.counters;
            counters.writer_round_latency.record(started.elapsed());
            if let Some(reply) = stop {
                rx.close();
                // Whatever was queued behind the shutdown is refused.
                for r in batch.drain(..) {
                    refuse(r, CoreError::ShuttingDown);
                }
                while let Ok(r) = rx.try_recv() {
                    refuse(r, CoreError::ShuttingDown);
                }
                let result = self.snapshot_now();
                let _ = reply.send(result.map(|_| ()).map_err(Refusal::now));
                return;
            }
        }
    }

    /// Applies one batch; returns the shutdown reply if the batch asked to stop.
    /// Brings into the cache the rows the queued calls behind the one about to run are
    /// expected to read: the entries of the second, the values of the first
    /// ([`crate::prefetch`]).
    fn prefetch_ahead(&self, db: &Db, batch: &VecDeque<Request>) {
        for (at, stage) in [(1, Stage::Entry), (0, Stage::Values)] {
            if let Some(Request::Call { name, args, .. }) = batch.get(at) {
                self.key_hints.prefetch(db, name, args, stage);
            }
        }
    }

    fn round(&mut self, batch: &mut VecDeque<Request>) -> Option<Reply<()>> {
        let shared = self.shared.clone();
        if batch.iter().all(|r| matches!(r, Request::Tick)) {
            // An idle writer's tick: a round only if some topic has records to expire.
            let due = self.topics_trimmed.elapsed() >= TOPIC_TRIM_INTERVAL;
            if !due || !shared.db.read().topics_expired(now_us()) {
                batch.clear();
                return None;
            }
        }
        let poisoned = shared.log.poisoned();
        let mut done = Committed::with_capacity(batch.len());
        let mut snapshot_replies = std::mem::take(&mut self.snapshot_waiting);
        let mut shutdown = None;
        let role;
        let evicted;
        let applied = {
            let mut guard: Option<DbGuard> = Some(shared.db.write_arc());
            // Read under the write lock: `Core::set_leader` switches roles under it, so a
            // round's commits are all published or all not.
            role = shared.cluster.role();
            // A round ends early once its frames reach the bound, so what one submit hands
            // the log stays bounded too (the rest of the batch goes to the next round).
            let round_bytes_max = round_frame_bytes_max(shared.config.log_pending_bytes_max);
            while let Some(req) = batch.pop_front() {
                if self.frames.len() >= round_bytes_max || shutdown.is_some() {
                    batch.push_front(req);
                    break;
                }
                if let (
                    Some(reason),
                    Request::Mutate { .. }
                    | Request::Schema { .. }
                    | Request::Sql { .. }
                    | Request::Call { .. }
                    | Request::Topic { .. }
                    | Request::Append { .. },
                ) = (&poisoned, &req)
                {
                    refuse(req, CoreError::Poisoned(reason.clone()));
                    continue;
                }
                if let Some(refusal) = cluster_refusal(&role, &req) {
                    refuse(req, refusal);
                    continue;
                }
                if matches!(
                    req,
                    Request::Mutate { .. } | Request::Call { .. } | Request::Append { .. }
                ) {
                    sluice_log::critical::injected_panic_point("writer");
                }
                let db: &mut Db = guard.as_mut().expect("the writer holds the lock");
                self.prefetch_ahead(db, batch);
                match req {
                    Request::Mutate {
                        ops,
                        claims,
                        durability,
                        reply,
                    } => match apply_mutate(db, ops, claims.as_deref(), &shared) {
                        Err(e) => {
                            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = reply.send(Err(refused(e, db)));
                        }
                        Ok((commit, results)) => {
                            self.log_commit(&commit);
                            let ok = MutateOk {
                                seq: commit.seq,
                                results,
                            };
                            done.add(commit.seq, durability, AckReply::Mutate(reply, ok));
                        }
                    },
                    Request::Sql {
                        script,
                        params,
                        claims,
                        durability,
                        reply,
                    } => match run_script(db, &script, &params, claims.as_deref(), &shared) {
                        Err(e) => {
                            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = reply.send(Err(refused(e, db)));
                        }
                        Ok((None, ok)) => {
                            let _ = reply.send(Ok(ok));
                        }
                        Ok((Some(commit), ok)) => {
                            self.log_commit(&commit);
                            done.add(commit.seq, durability, AckReply::Sql(reply, ok));
                        }
                    },
                    Request::Schema {
                        changes,
                        sql,
                        durability,
                        reply,
                    } => match db.apply_schema_checked(changes, sql, &|db, table, policy| {
                        sluice_query::rules::check_policy(db, table, policy).map_err(|e| {
                            TxError::new(
                                sluice_engine::ErrorCode::Schema,
                                format!("policy {:?} on {table:?}: {e}", policy.name),
                            )
                        })
                    }) {
                        Err(e) => {
                            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = reply.send(Err(refused(e.into(), db)));
                        }
                        Ok(None) => {
                            let _ = reply.send(Ok(None));
                        }
                        Ok(Some(commit)) => {
                            self.log_commit(&commit);
                            let reply = AckReply::Schema(reply, commit.seq);
                            done.add(commit.seq, durability, reply);
                        }
                    },
                    Request::Call {
                        name,
                        args,
                        claims,
                        durability,
                        reply,
                    } => {
                        let held = guard.take().expect("the writer holds the lock");
                        let (held, outcome) = self.call(held, &name, &args, claims.as_deref());
                        guard = Some(held);
                        match outcome {
                            Err(e) => {
                                shared
                                    .counters
                                    .call_failures
                                    .fetch_add(1, Ordering::Relaxed);
                                let db = guard.as_ref().expect("the writer holds the lock");
                                let _ = reply.send(Err(refused(e, db)));
                            }
                            Ok((None, ok)) => {
                                let _ = reply.send(Ok(ok));
                            }
                            Ok((Some(commit), ok)) => {
                                self.key_hints.learn(&name, &args, &commit);
                                self.log_commit(&commit);
                                done.add(commit.seq, durability, AckReply::Call(reply, ok));
                            }
                        }
                    }
                    Request::Topic {
                        op,
                        durability,
                        reply,
                    } => match apply_topic_op(db, op) {
                        Err(e) => {
                            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = reply.send(Err(refused(e.into(), db)));
                        }
                        Ok((commits, ok)) => match commits.last().map(|c| c.seq) {
                            None => {
                                let _ = reply.send(Ok(ok));
                            }
                            Some(seq) => {
                                for commit in &commits {
                                    self.log_commit(commit);
                                }
                                done.frames += commits.len() as u64 - 1;
                                done.add(seq, durability, AckReply::Topic(reply, ok));
                            }
                        },
                    },
                    Request::Append {
                        topic,
                        records,
                        claims,
                        durability,
                        reply,
                    } => match append(db, &topic, records, claims.as_deref(), now_us()) {
                        Err(e) => {
                            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = reply.send(Err(refused(e, db)));
                        }
                        Ok((commit, ok)) => {
                            self.log_commit(&commit);
                            done.add(commit.seq, durability, AckReply::Append(reply, ok));
                        }
                    },
                    Request::LoadFunctions { source, reply } => {
                        let loaded = self.functions.load(&source).map(<[String]>::to_vec);
                        self.key_hints.clear();
                        let _ = reply.send(loaded.map_err(|e| Refusal::now(e.into())));
                    }
                    Request::ListFunctions { reply } => {
                        let _ = reply.send(Ok(self.functions.exports().to_vec()));
                    }
                    Request::Snapshot { reply } => snapshot_replies.push(reply),
                    Request::SnapshotIdle | Request::Tick => {}
                    Request::Shutdown { reply } => shutdown = Some(reply),
                    Request::Replicate { frames, reply } => {
                        let result = match &role {
                            crate::replication::Role::Follower { .. } => {
                                self.replay_frames(db, &frames, &mut done)
                            }
                            other => Err(CoreError::Replication(format!(
                                "commits from the cluster reached a node that is not a follower ({other:?})"
                            ))),
                        };
                        let _ = reply.send(result.map_err(Refusal::now));
                    }
                }
            }
            let db = guard.as_mut().expect("the writer holds the lock");
            let due = self.topics_trimmed.elapsed() >= TOPIC_TRIM_INTERVAL;
            // A follower's topics are trimmed by the leader's `Trim` commits, never its clock.
            let follower = matches!(role, crate::replication::Role::Follower { .. });
            if due && poisoned.is_none() && shutdown.is_none() && !follower {
                self.topics_trimmed = std::time::Instant::now();
                // Age limits drop records by the clock, so each drop is a logged commit
                // (acknowledged to nobody, like a `memory` commit).
                for commit in db.expire_topics(now_us()) {
                    self.log_commit(&commit);
                    done.frames += 1;
                }
            }
            evicted = if db.changelog.evicted_len() >= DROP_BATCH_COMMITS {
                db.changelog.take_evicted()
            } else {
                Vec::new()
            };
            db.seq
        };
        if let (Some(dropper), false) = (&self.dropper, evicted.is_empty()) {
            // A full queue (or a gone thread) hands the batch back, dropped here.
            let _ = dropper.try_send(evicted);
        }
        shared
            .counters
            .commits
            .fetch_add(done.frames, Ordering::Relaxed);
        shared
            .counters
            .writer_batches
            .fetch_add(1, Ordering::Relaxed);
        shared.confirm.applied(applied, &done.waiting);
        // After the write lock is released: a view the live thread builds meanwhile starts
        // from a state that already has these commits and skips them.
        shared.hub_feed.publish(&self.published);
        // The next round is likely about this one's size: room for it, so the list need not
        // grow (and copy itself) as it goes.
        let room = self.published.len();
        let published = std::mem::replace(&mut self.published, Vec::with_capacity(room));
        shared.live.publish(published);
        if !self.frames.is_empty() {
            self.log_bytes_since_snapshot += self.frames.len() as u64;
            // On failure the log has already failed the acks with the reason.
            let _ = shared
                .log
                .submit(&self.frames, done.frames, applied, done.acks);
            if let crate::replication::Role::Leader(replicator) = &role {
                for (seq, pair) in done.quorum {
                    shared.cluster.wait_for_quorum(seq, pair);
                }
                replicator.submit(crate::replication::Round {
                    frames: bytes::Bytes::copy_from_slice(&self.frames),
                    commits: std::mem::take(&mut self.frame_ranges),
                });
            } else {
                // Only a leader takes `replicated` commits (`cluster_refusal`).
                debug_assert!(done.quorum.is_empty());
            }
            self.frames.clear();
            self.frame_ranges.clear();
        }
        for reply in done.immediate {
            reply.send(Ok(()));
        }
        if shutdown.is_some() {
            for reply in snapshot_replies {
                let _ = reply.send(Err(Refusal::now(CoreError::ShuttingDown)));
            }
            return shutdown;
        }
        let due = snapshot_due(
            self.log_bytes_since_snapshot,
            shared.counters.snapshot_bytes.load(Ordering::Relaxed),
            &shared.config,
        );
        if (!snapshot_replies.is_empty() || due) && !self.snapshotter.busy() {
            let job = self.snapshot_job(snapshot_replies);
            match self.snapshotter.offer(job) {
                Ok(()) => self.log_bytes_since_snapshot = 0,
                // Not busy, so the slot was free: the thread itself is gone.
                Err(job) => {
                    for reply in job.replies {
                        let busy = CoreError::Busy("the snapshot thread has stopped".into());
                        let _ = reply.send(Err(Refusal::now(busy)));
                    }
                }
            }
        } else {
            // Busy: requesters wait for the `SnapshotIdle` the thread sends when it is done.
            self.snapshot_waiting = snapshot_replies;
        }
        None
    }

    /// Runs one function call as a transaction over the held lock; commits on success.
    #[allow(clippy::type_complexity)]
    fn call(
        &mut self,
        db: DbGuard,
        name: &str,
        args: &sluice_functions::Args,
        claims: Option<&crate::auth::Claims>,
    ) -> (DbGuard, Result<(Option<Arc<Commit>>, CallOk), CoreError>) {
        self.shared.counters.calls.fetch_add(1, Ordering::Relaxed);
        let now_us = now_us();
        let st = db.begin_with(self.spare_st.take());
        // `tx.auth`: `null` for the admin, `{sub, claims}` for a client.
        let auth = claims.map(|c| serde_json::json!({"sub": c.sub, "claims": c.all}));
        let (mut lent, result) =
            self.functions
                .call_args(name, args, auth.as_ref(), Lent { db, st, now_us });
        // A call that met the commit-size limit is refused even if it caught the error.
        let result = match lent.st.over_limit() {
            Some(e) => Err(CoreError::Tx(e.clone())),
            None => result.map_err(CoreError::from),
        };
        let outcome = match result {
            Ok(value) => {
                let commit = lent.db.commit_state(&mut lent.st);
                let ok = CallOk {
                    seq: lent.db.seq,
                    wrote: commit.is_some(),
                    result: value,
                };
                Ok((commit, ok))
            }
            Err(e) => {
                lent.db.rollback_state(&mut lent.st);
                Err(e)
            }
        };
        self.spare_st = Some(lent.st);
        (lent.db, outcome)
    }

    fn log_commit(&mut self, commit: &Arc<Commit>) {
        self.published.push(commit.clone());
        let start = self.frames.len();
        // Encoded straight into the round's frame buffer (no payload buffer copied in).
        // Every transaction is bounded by `commit_bytes_max` (≤ COMMIT_BYTES_MAX_CEILING, well
        // inside a frame) while it is built, and DDL by the request body limit.
        frame::encode_with(&mut self.frames, |out| encode_commit(commit, out))
            .expect("commit_bytes_max keeps every commit inside one log frame");
        self.frame_ranges
            .push((commit.seq, start..self.frames.len()));
    }

    /// Replays a follower's frames from the cluster (the path recovery takes), writes them
    /// to this node's log and hands them on like commits of its own. Frames at or below
    /// the applied seq are skipped (a redelivery). Any frame that does not check or apply
    /// is an error: the follower's state and the leader's have diverged.
    fn replay_frames(
        &mut self,
        db: &mut Db,
        frames: &[bytes::Bytes],
        done: &mut Committed,
    ) -> Result<u64, CoreError> {
        for f in frames {
            let payload = match frame::decode(f, 0) {
                frame::Decoded::Frame { payload, next } if next == f.len() => payload,
                other => {
                    return Err(CoreError::Replication(format!(
                        "a frame from the cluster does not check ({other:?}) after seq {}",
                        db.seq
                    )))
                }
            };
            let (seq, body) = sluice_engine::codec::decode_commit(payload).map_err(|e| {
                CoreError::Replication(format!(
                    "a commit after seq {} does not decode: {e}",
                    db.seq
                ))
            })?;
            if seq <= db.seq {
                continue;
            }
            let commit = db.replay_commit(seq, body).map_err(|e| {
                CoreError::Replication(format!("a commit from the cluster does not apply: {e}"))
            })?;
            self.published.push(commit);
            let start = self.frames.len();
            self.frames.extend_from_slice(f);
            self.frame_ranges.push((seq, start..self.frames.len()));
            done.frames += 1;
            // A follower shows a commit once its own log wrote it: the cluster's quorum
            // holds it already (JetStream delivers only what it committed).
            done.waiting.push((seq, Durability::Disk));
        }
        Ok(db.seq)
    }

    /// Freezes the state for a snapshot: O(tables + row chunks + topic records) under the
    /// read lock (copy-on-write row maps); the encoding happens where the job is written.
    fn snapshot_job(&self, replies: Vec<Reply<u64>>) -> Job {
        let db = self.shared.db.read();
        Job {
            seq: db.seq,
            horizon: db.changelog.horizon(),
            state: FrozenState::of(&db),
            replies,
        }
    }

    fn snapshot_now(&mut self) -> Result<u64, CoreError> {
        let job = self.snapshot_job(Vec::new());
        self.snapshotter.run_inline(job)
    }
}

/// A refusal decided on `db`'s applied state: the client hears it only once that state is
/// confirmed, so a refusal never contradicts what recovery will show.
fn refused(error: CoreError, db: &Db) -> Refusal {
    Refusal {
        error,
        read_seq: db.seq,
    }
}

fn refuse(req: Request, err: CoreError) {
    let err = Refusal::now(err);
    match req {
        Request::Mutate { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::Sql { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::Schema { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::Call { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::Topic { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::Append { reply, .. } => {
            let _ = reply.send(Err(err));
        }
        Request::LoadFunctions { reply, .. } | Request::ListFunctions { reply } => {
            let _ = reply.send(Err(err));
        }
        Request::Snapshot { reply } => {
            let _ = reply.send(Err(err));
        }
        Request::SnapshotIdle | Request::Tick => {}
        Request::Shutdown { reply } => {
            let _ = reply.send(Err(err));
        }
        Request::Replicate { reply, .. } => {
            let _ = reply.send(Err(err));
        }
    }
}

/// Why the cluster role refuses `req`, if it does: a follower takes no writes, and only a
/// leader takes `replicated` ones.
fn cluster_refusal(role: &crate::replication::Role, req: &Request) -> Option<CoreError> {
    use crate::replication::Role;
    match role {
        Role::Follower { leader } if req.writes() => Some(CoreError::NotLeader {
            leader: leader.clone(),
        }),
        Role::Standalone if req.durability() == Some(Durability::Replicated) => {
            Some(CoreError::Tx(TxError::new(
                sluice_engine::ErrorCode::BadRequest,
                "durability \"replicated\" needs a cluster (sluice serve --cluster nats://…); this node runs alone",
            )))
        }
        _ => None,
    }
}

/// How often the writer drops records past their topic's age limit.
pub(crate) const TOPIC_TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the ticker: a thread that wakes an idle writer once per [`TOPIC_TRIM_INTERVAL`]
/// (never waiting: a full queue means a busy writer, which trims in its rounds anyway). It
/// ends when the writer's queue is gone.
pub(crate) fn spawn_ticker(requests: mpsc::WeakSender<Request>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("sluice-ticker".into())
        .spawn(move || loop {
            let Some(tx) = requests.upgrade() else {
                return;
            };
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Request::Tick) {
                return;
            }
            drop(tx);
            std::thread::sleep(TOPIC_TRIM_INTERVAL);
        })?;
    Ok(())
}

pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Appends all `records` to `topic` in one transaction, or none of them.
fn append(
    db: &mut Db,
    topic: &str,
    records: Vec<NewRecord>,
    claims: Option<&crate::auth::Claims>,
    ts_us: i64,
) -> Result<(Arc<Commit>, AppendOk), CoreError> {
    if let Some(claims) = claims {
        let t = db.topics.get(topic).ok_or_else(|| {
            TxError::new(
                sluice_engine::ErrorCode::NotFound,
                format!("no topic named {topic:?}"),
            )
        })?;
        crate::rules::check_topic_append(t, &records, &claims.all)?;
    }
    if records.is_empty() {
        return Err(TxError::new(
            sluice_engine::ErrorCode::BadRequest,
            "an append needs at least one record",
        )
        .into());
    }
    let mut tx = db.transaction();
    let mut first = None;
    let mut last = 0;
    for (i, r) in records.into_iter().enumerate() {
        let offset = tx
            .append_json_text(topic, r.tags, r.data, ts_us)
            .map_err(|e| e.at_op(i))?;
        first.get_or_insert(offset);
        last = offset;
    }
    let seq = tx.seq();
    let commit = tx.commit().expect("an append of at least one record");
    Ok((
        commit,
        AppendOk {
            seq,
            first: first.expect("at least one record"),
            last,
        },
    ))
}

/// Runs a script's data statements as one transaction; for a client (`claims`), every row
/// change must pass the table's write policies, or nothing is applied.
#[allow(clippy::type_complexity)]
fn run_script(
    db: &mut Db,
    script: &sluice_query::script::Script,
    params: &sluice_query::Params,
    claims: Option<&crate::auth::Claims>,
    shared: &crate::core::Shared,
) -> Result<(Option<Arc<Commit>>, crate::core::SqlOk), CoreError> {
    let mut tx = db.transaction();
    let rules = &shared.rules;
    let mut check = |db: &Db, change: &sluice_engine::Change, _statement: usize| {
        let Some(claims) = claims else {
            return Ok(());
        };
        let table_rules = rules.get(db, &change.table.name)?;
        crate::rules::check_change(db, &table_rules, change, &claims.all, None)
    };
    let outcomes = script
        .run::<CoreError>(
            &mut tx,
            params,
            claims.map(|c| &c.all),
            shared.config.ops_per_mutate_max,
            &mut check,
        )
        .map_err(|f| CoreError::Statement {
            statement: f.statement,
            error: Box::new(f.error),
        })?;
    let commit = tx.commit();
    let ok = crate::core::SqlOk {
        seq: commit.as_ref().map_or(db.seq, |c| c.seq),
        wrote: commit.is_some(),
        outcomes,
    };
    Ok((commit, ok))
}

/// Applies a mutate's ops as one transaction (see [`apply_ops`]). Typed ops apply as
/// decoded if every op's schema is still its table's; otherwise (DDL since they were
/// decoded) the body is parsed again the general way, so the result is the same as if it
/// had never been decoded early.
fn apply_mutate(
    db: &mut Db,
    ops: MutateOps,
    claims: Option<&crate::auth::Claims>,
    shared: &Shared,
) -> Result<(Arc<Commit>, Vec<WriteResult>), CoreError> {
    let decoded = match ops {
        MutateOps::Json(ops) => return apply_ops(db, &ops, claims, &shared.rules),
        MutateOps::Typed(decoded) => decoded,
    };
    let mut last: Option<&Arc<sluice_engine::TableSchema>> = None;
    let mut current = true;
    for op in &decoded.ops {
        let schema = op.schema();
        if last.is_some_and(|l| Arc::ptr_eq(l, schema)) {
            continue;
        }
        match db.tables.get(&schema.name) {
            Some(t) if Arc::ptr_eq(&t.schema, schema) => last = Some(schema),
            _ => {
                current = false;
                break;
            }
        }
    }
    if !current {
        shared.schemas.refresh(db);
        let Some(body) = &decoded.body else {
            return Err(CoreError::Tx(TxError::new(
                sluice_engine::ErrorCode::Schema,
                "a table's schema changed since these rows were built; nothing was written",
            )));
        };
        let ops = body.parse_ops().map_err(|e| {
            CoreError::Tx(TxError::new(
                sluice_engine::ErrorCode::BadRequest,
                format!("a decoded mutate does not parse again: {}", e.message),
            ))
        })?;
        return apply_ops(db, &ops, claims, &shared.rules);
    }
    apply_typed(db, decoded.ops, claims, &shared.rules)
}

/// Applies decoded ops (each op's schema is its table's current one) in one transaction.
fn apply_typed(
    db: &mut Db,
    ops: Vec<crate::decode::TypedOp>,
    claims: Option<&crate::auth::Claims>,
    rules: &crate::rules::RulesCache,
) -> Result<(Arc<Commit>, Vec<WriteResult>), CoreError> {
    use crate::decode::TypedOp;
    let mut tx = db.transaction();
    // One row write per op.
    tx.reserve_writes(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    for (i, op) in ops.into_iter().enumerate() {
        let before = tx.changes().len();
        let mut w = tx.ops();
        let r = match op {
            TypedOp::Put {
                schema,
                key,
                values,
                if_version,
                replace,
            } => w.put_decoded(&schema, key, values, if_version, replace),
            TypedOp::Patch {
                schema,
                key,
                mut set,
                if_version,
            } => w.patch_decoded(&schema, key, &mut set, if_version),
            TypedOp::Delete {
                schema,
                key,
                if_version,
            } => w.delete_decoded(&schema, key, if_version),
        };
        results.push(r.map_err(|e| e.at_op(i))?);
        if let Some(claims) = claims {
            for change in &tx.changes()[before..] {
                let table_rules = rules.get(tx.db(), &change.table.name)?;
                crate::rules::check_change(tx.db(), &table_rules, change, &claims.all, Some(i))?;
            }
        }
    }
    let commit = tx.commit().expect("every successful op writes a row");
    Ok((commit, results))
}

/// Applies a mutate's ops as one transaction; for a client (`claims`), each op's changes
/// must pass the table's write policies, or nothing is applied.
fn apply_ops(
    db: &mut Db,
    ops: &[Op],
    claims: Option<&crate::auth::Claims>,
    rules: &crate::rules::RulesCache,
) -> Result<(Arc<Commit>, Vec<WriteResult>), CoreError> {
    let mut tx = db.transaction();
    // One row write per op.
    tx.reserve_writes(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let before = tx.changes().len();
        let r = match op {
            Op::Insert {
                table,
                row,
                if_version,
            } => tx.insert(table, row, *if_version),
            Op::Upsert {
                table,
                row,
                if_version,
            } => tx.upsert(table, row, *if_version),
            Op::Patch {
                table,
                id,
                set,
                if_version,
            } => tx.patch(table, id, set, *if_version),
            Op::Delete {
                table,
                id,
                if_version,
            } => tx.delete(table, id, *if_version),
        };
        results.push(r.map_err(|e| e.at_op(i))?);
        if let Some(claims) = claims {
            for change in &tx.changes()[before..] {
                let table_rules = rules.get(tx.db(), &change.table.name)?;
                crate::rules::check_change(tx.db(), &table_rules, change, &claims.all, Some(i))?;
            }
        }
    }
    let commit = tx.commit().expect("every successful op writes a row");
    Ok((commit, results))
}

/// Whether an automatic snapshot is due after `log_bytes` of log since the last one, whose
/// size was `last_snapshot_bytes` (0: none): at least `snapshot_log_bytes`, and at least
/// `snapshot_log_percent` of the last snapshot ([`Config::snapshot_log_percent`]).
fn snapshot_due(log_bytes: u64, last_snapshot_bytes: u64, config: &Config) -> bool {
    let in_proportion = (u128::from(last_snapshot_bytes) * u128::from(config.snapshot_log_percent)
        / 100)
        .min(u128::from(u64::MAX)) as u64;
    log_bytes >= config.snapshot_log_bytes.max(in_proportion)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every commit of a batch is dropped, in order, whatever the batch's size against the
    /// read-ahead window, and the read-ahead counts each commit's and row image's references.
    #[test]
    fn the_drop_thread_drops_every_commit_it_is_handed_in_order() {
        use sluice_engine::{Change, ChangeOp, CommitBody, Key, TableSchema, Value};
        let schema = Arc::new(TableSchema {
            name: "t".into(),
            columns: Vec::new(),
            pk: 0,
            indexes: Vec::new(),
        });
        let row: Arc<[Value]> = Arc::new([Value::Integer(1)]);
        let commit = |seq: u64| {
            Arc::new(Commit {
                seq,
                body: CommitBody::Rows(vec![Change {
                    table: schema.clone(),
                    op: ChangeOp::Update,
                    key: Key::Int(1),
                    row: Some(row.clone()),
                    old: Some(row.clone()),
                    version: seq,
                }]),
                appends: Vec::new(),
            })
        };
        for n in [
            0,
            1,
            DROP_READ_AHEAD_COMMITS - 1,
            DROP_READ_AHEAD_COMMITS,
            3 * DROP_READ_AHEAD_COMMITS + 5,
        ] {
            let batch: Vec<Arc<Commit>> = (1..=n as u64).map(commit).collect();
            let weak: Vec<_> = batch.iter().map(Arc::downgrade).collect();
            // Per commit: its own count, and the row image's twice (`row` and `old`),
            // which every commit and this test share.
            let shared = 1 + 2 * n;
            assert_eq!(read_ahead(&batch), n * (1 + 2 * shared));
            let mut dropped = Vec::new();
            drop_commits(batch, || {
                let gone = weak.iter().take_while(|w| w.upgrade().is_none()).count();
                dropped.push(gone);
            });
            // After the k-th step exactly the first k commits are gone.
            assert_eq!(dropped, (1..=n).collect::<Vec<_>>(), "batch of {n}");
            assert!(weak.iter().all(|w| w.upgrade().is_none()));
            assert_eq!(Arc::strong_count(&row), 1);
        }
    }

    fn config(bytes: u64, percent: u64) -> Config {
        Config {
            snapshot_log_bytes: bytes,
            snapshot_log_percent: percent,
            ..Config::new("unused")
        }
    }

    #[test]
    fn a_snapshot_is_due_after_the_larger_of_the_byte_count_and_the_share_of_the_last() {
        let c = config(100, 100);
        // No snapshot yet, or a small one: the byte count decides.
        assert!(!snapshot_due(99, 0, &c));
        assert!(snapshot_due(100, 0, &c));
        assert!(snapshot_due(100, 60, &c));
        // A large last snapshot: a log as large as it.
        assert!(!snapshot_due(999, 1000, &c));
        assert!(snapshot_due(1000, 1000, &c));
        // Half of it at 50 %, twice it at 200 %.
        assert!(snapshot_due(500, 1000, &config(100, 50)));
        assert!(!snapshot_due(1999, 1000, &config(100, 200)));
        assert!(snapshot_due(2000, 1000, &config(100, 200)));
    }

    #[test]
    fn percent_zero_keeps_the_fixed_interval_and_huge_values_do_not_overflow() {
        assert!(snapshot_due(100, u64::MAX, &config(100, 0)));
        assert!(!snapshot_due(u64::MAX - 1, u64::MAX, &config(100, 1000)));
        assert!(snapshot_due(u64::MAX, u64::MAX, &config(100, 1000)));
    }

    /// Runs `observe` for each queue length, recording every nice it asked for.
    fn drive(boost: &mut Boost, queued: &[usize], refuse: bool) -> Vec<i32> {
        let mut asked = Vec::new();
        for &n in queued {
            boost.observe(n, |nice| {
                asked.push(nice);
                if refuse && nice < 0 {
                    Err(std::io::ErrorKind::PermissionDenied.into())
                } else {
                    Ok(())
                }
            });
        }
        asked
    }

    #[test]
    fn the_writer_is_raised_only_while_backlogged_with_hysteresis() {
        let mut boost = Boost::new(-5, 0);
        let queue = [
            1,
            BOOST_FROM_REQUESTS - 1,
            BOOST_FROM_REQUESTS, // raise
            BOOST_FROM_REQUESTS * 4,
            BOOST_UNTIL_REQUESTS,     // still backlogged enough
            BOOST_UNTIL_REQUESTS - 1, // lower
            BOOST_FROM_REQUESTS - 1,
            BOOST_FROM_REQUESTS, // raise again
        ];
        assert_eq!(drive(&mut boost, &queue, false), vec![-5, 0, -5]);
        assert!(boost.on);
    }

    #[test]
    fn observe_reports_each_change_and_nothing_else() {
        let mut boost = Boost::new(-5, 0);
        assert_eq!(boost.observe(1, |_| Ok(())), None);
        assert_eq!(boost.observe(BOOST_FROM_REQUESTS, |_| Ok(())), Some(-5));
        assert_eq!(boost.observe(BOOST_FROM_REQUESTS, |_| Ok(())), None);
        assert_eq!(boost.observe(0, |_| Ok(())), Some(0));
    }

    #[test]
    fn a_refused_raise_is_not_tried_again() {
        let mut boost = Boost::new(-5, 0);
        let queue = [
            BOOST_FROM_REQUESTS,
            0,
            BOOST_FROM_REQUESTS,
            BOOST_FROM_REQUESTS,
        ];
        assert_eq!(drive(&mut boost, &queue, true), vec![-5]);
        assert!(!boost.on);
    }

    #[test]
    fn a_writer_nice_equal_to_its_own_changes_nothing() {
        let mut boost = Boost::new(0, 0);
        let queue = [BOOST_FROM_REQUESTS * 8, 0, BOOST_FROM_REQUESTS * 8];
        assert!(drive(&mut boost, &queue, false).is_empty());
    }
}
