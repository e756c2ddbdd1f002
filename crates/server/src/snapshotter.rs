//! The snapshot thread: makes an encoded snapshot durable, then retires what it covers.
//!
//! Order matters for the invariant "the log is a dense prefix of history": a snapshot of
//! seq S is only written once the log itself is synced through S, so a crash can never
//! leave a snapshot that is ahead of the log it continues.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use sluice_engine::codec::{encode_frozen_to, FrozenState};
use sluice_log::snapshot::{list_snapshots, SnapshotWriter};
use tokio::sync::{mpsc as request_mpsc, oneshot};

use crate::core::Shared;
use crate::error::{CoreError, Refusal, WriterResult};
use crate::writer::Request;

/// Snapshots kept on disk: the newest, and one older as a fallback if the newest fails
/// its checks at startup.
pub(crate) const SNAPSHOTS_KEPT: usize = 2;

pub(crate) struct Job {
    pub seq: u64,
    /// The changelog horizon when the snapshot was taken; segments after it stay.
    pub horizon: u64,
    /// The state at `seq`, encoded by whoever writes the job (the snapshot thread, or the
    /// writer thread at shutdown), never under the database lock.
    pub state: FrozenState,
    pub replies: Vec<oneshot::Sender<WriterResult<u64>>>,
}

pub(crate) struct Snapshotter {
    shared: Arc<Shared>,
    jobs: mpsc::SyncSender<Job>,
    /// One snapshot write at a time: the shutdown snapshot (on the writer thread) may start
    /// while the snapshot thread is still writing one for the same seq.
    gate: Arc<Mutex<()>>,
    /// Set from the moment a job is handed over until the thread has finished it: the
    /// writer does not freeze a snapshot it could not hand over.
    busy: Arc<AtomicBool>,
}

impl Snapshotter {
    /// Starts the snapshot thread. After each job it wakes the writer through `wake` (a
    /// weak sender: it does not keep the request channel open) with
    /// [`Request::SnapshotIdle`], so snapshot requests that found it busy are served next.
    pub fn spawn(shared: Arc<Shared>, wake: request_mpsc::WeakSender<Request>) -> Snapshotter {
        // One slot: `busy` (set by `offer`, cleared by the thread once the job is done)
        // keeps it to one job at a time, so the slot is always free when `offer` sends.
        let (jobs, rx) = mpsc::sync_channel::<Job>(1);
        let thread_shared = shared.clone();
        let gate = Arc::new(Mutex::new(()));
        let thread_gate = gate.clone();
        let busy = Arc::new(AtomicBool::new(false));
        let thread_busy = busy.clone();
        sluice_log::critical::spawn("snapshot", move || {
            // Best effort: a refusal only costs latency, never correctness.
            if let Err(e) = sluice_sched::set_nice(SNAPSHOT_NICE) {
                tracing::debug!(error = %e, "could not lower the snapshot thread's priority");
            }
            while let Ok(job) = rx.recv() {
                sluice_log::critical::injected_panic_point("snapshot");
                {
                    let _one_at_a_time = thread_gate.lock();
                    run(&thread_shared, job);
                }
                thread_busy.store(false, Ordering::Release);
                if let Some(requests) = wake.upgrade() {
                    // A full queue means the writer has rounds to run anyway.
                    let _ = requests.try_send(Request::SnapshotIdle);
                }
            }
        })
        .expect("spawn the snapshot thread");
        Snapshotter {
            shared,
            jobs,
            gate,
            busy,
        }
    }

    /// Whether the snapshot thread has a job it has not finished.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Hands `job` to the snapshot thread if it is idle; gives it back otherwise.
    pub fn offer(&self, job: Job) -> Result<(), Job> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(job);
        }
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(job)) | Err(mpsc::TrySendError::Disconnected(job)) => {
                self.busy.store(false, Ordering::Release);
                Err(job)
            }
        }
    }

    /// Writes `job` on the calling thread (graceful shutdown).
    pub fn run_inline(&self, job: Job) -> Result<u64, CoreError> {
        let _one_at_a_time = self.gate.lock();
        write(&self.shared, &job)
    }
}

/// The check of the snapshot startup's whole-log replay stood in for
/// ([`sluice_engine::recovery::recover_checking_snapshot_later`]), run on a thread of its own
/// once the server is up rather than beside the replay, where it took CPU from time-to-ready.
/// The state does not depend on it (the whole log built it); what the server *keeps* does: a
/// damaged snapshot must not count as one of the [`SNAPSHOTS_KEPT`] that the log's segments
/// are retired against, nor as the newest one already on disk. So [`write`] waits for the
/// verdict before it lists the snapshots, and a damaged one is moved aside first.
///
/// *When it runs.* The thread is started with the core but reads nothing until the server
/// listens ([`StartupCheck::go`], from `Core::serving`), someone waits for the verdict
/// ([`StartupCheck::wait`]: the snapshotter, `/metrics`), or [`CHECK_UNSERVED_AFTER`]
/// passed (a core no listener serves: an embedding program, a test); and it runs at the
/// snapshot thread's nice value. Started at once (before session 41), it read and hashed the
/// snapshot beside the rest of startup (building the router, binding the port) on a 2-core
/// machine. The check only ever runs for a log short enough to replay whole, so it is small
/// (13.6 MiB, ~2.5 ms of CPU at 100 K records): five alternating pairs of `sluice bench
/// recovery --records 100000` runs showed no difference beyond their noise (±3 ms).
#[derive(Default)]
pub(crate) struct StartupCheck {
    state: Mutex<CheckState>,
    changed: parking_lot::Condvar,
    /// Snapshots found damaged (0 or 1): `sluice_snapshots_damaged_total`.
    damaged: AtomicU64,
}

#[derive(Default)]
struct CheckState {
    /// A check was started and has not given its verdict.
    pending: bool,
    /// The check may read the snapshot now.
    go: bool,
}

/// How long the check waits for the server to listen before it starts anyway.
const CHECK_UNSERVED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// What a damaged snapshot is renamed to (`list_snapshots` no longer sees it; kept for a
/// post-mortem, as nothing else refers to it).
const DAMAGED_SUFFIX: &str = ".damaged";

impl StartupCheck {
    /// Starts the thread that checks `unchecked` (a snapshot in `data_dir`) once it may (see
    /// the type's doc). It holds nothing of the server but this: a server closed meanwhile
    /// is not kept open.
    pub fn start(
        check: &Arc<StartupCheck>,
        data_dir: std::path::PathBuf,
        unchecked: sluice_engine::recovery::UncheckedSnapshot,
    ) -> std::io::Result<()> {
        check.state.lock().pending = true;
        let thread_check = check.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-snapcheck".into())
            .spawn(move || {
                // The verdict is given even if the check panicked: the snapshotter waits.
                let done = Done(&thread_check);
                thread_check.wait_for_go(CHECK_UNSERVED_AFTER);
                // Best effort, as for the snapshot thread.
                if let Err(e) = sluice_sched::set_nice(SNAPSHOT_NICE) {
                    tracing::debug!(error = %e, "could not lower the snapshot check's priority");
                }
                if !unchecked.is_intact() {
                    let mut aside = unchecked.path.clone().into_os_string();
                    aside.push(DAMAGED_SUFFIX);
                    let (path, aside_path) = (&unchecked.path, std::path::Path::new(&aside));
                    match std::fs::rename(path, aside_path)
                        .and_then(|()| sluice_log::io::sync_dir(&data_dir))
                    {
                        Ok(()) => tracing::warn!(
                            seq = unchecked.seq,
                            path = %path.display(),
                            moved_to = %aside_path.display(),
                            "the snapshot the whole log was replayed in place of fails its \
                             checks; the data is whole (the log built it), the snapshot is \
                             moved aside"
                        ),
                        Err(e) => tracing::error!(
                            seq = unchecked.seq,
                            path = %path.display(),
                            error = %e,
                            "the snapshot the whole log was replayed in place of fails its \
                             checks, and moving it aside failed: remove it by hand"
                        ),
                    }
                    done.0.damaged.fetch_add(1, Ordering::Relaxed);
                }
            });
        if let Err(e) = spawned {
            check.finish();
            return Err(e);
        }
        Ok(())
    }

    /// Lets the check read the snapshot (the server listens).
    pub fn go(&self) {
        self.state.lock().go = true;
        self.changed.notify_all();
    }

    /// Blocks until [`StartupCheck::go`] or for `at_most`.
    fn wait_for_go(&self, at_most: std::time::Duration) {
        let deadline = std::time::Instant::now() + at_most;
        let mut state = self.state.lock();
        while !state.go {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
    }

    fn finish(&self) {
        self.state.lock().pending = false;
        self.changed.notify_all();
    }

    pub fn is_pending(&self) -> bool {
        self.state.lock().pending
    }

    /// Snapshots the check found damaged (and moved aside): 0 or 1.
    pub fn damaged(&self) -> u64 {
        self.damaged.load(Ordering::Relaxed)
    }

    /// Returns once the check (if any) has given its verdict, starting it now if it has not
    /// started.
    pub fn wait(&self) {
        let mut state = self.state.lock();
        if state.pending && !state.go {
            state.go = true;
            self.changed.notify_all();
        }
        while state.pending {
            self.changed.wait(&mut state);
        }
    }
}

struct Done<'a>(&'a StartupCheck);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// Nice value of the snapshot thread: encoding a large state takes a core for a second or
/// so, and on a small machine it would otherwise take turns with the threads a write's
/// acknowledgement passes through (HTTP tasks, the writer, the log). At nice 10 the
/// scheduler gives it about a tenth of a contended core and the whole of an idle one.
const SNAPSHOT_NICE: i32 = 10;

fn run(shared: &Shared, job: Job) {
    let result = write(shared, &job);
    for reply in job.replies {
        let _ = reply.send(result.clone().map_err(Refusal::now));
    }
}

fn write(shared: &Shared, job: &Job) -> Result<u64, CoreError> {
    let mut bytes = 0usize;
    let result = (|| {
        shared.log.sync_barrier(job.seq)?;
        shared.startup_check.wait();
        let dir = &shared.config.data_dir;
        let newest = list_snapshots(dir)?.last().map(|(seq, _)| *seq);
        if newest.is_some_and(|n| n >= job.seq) {
            return Ok(job.seq); // already on disk (the snapshot thread just wrote it)
        }
        // Streamed: each frame is written as it is encoded (the encoded state is never in
        // memory whole) and the file is synced in pieces, so the log's syncs never queue
        // behind the whole snapshot's dirty pages.
        let mut out = SnapshotWriter::create(dir, job.seq)?;
        encode_frozen_to(&job.state, |frame| {
            bytes += frame.len();
            out.write_framed(frame)
        })?;
        out.finish()?;
        let snapshots = list_snapshots(dir)?;
        let excess = snapshots.len().saturating_sub(SNAPSHOTS_KEPT);
        // The newest retired snapshot becomes the spare the next one is written over.
        for (i, (_, path)) in snapshots[..excess].iter().enumerate().rev() {
            if i + 1 == excess && sluice_log::snapshot::keep_as_spare(path)? {
                continue;
            }
            sluice_log::io::remove_file_gradually(path).map_err(|e| sluice_log::LogError::Io {
                path: path.clone(),
                source: e,
            })?;
        }
        let oldest_kept = snapshots[excess].0;
        shared
            .log
            .retire_segments_before(oldest_kept.min(job.horizon) + 1)?;
        Ok::<u64, sluice_log::LogError>(job.seq)
    })();
    match &result {
        Ok(seq) => {
            shared.counters.snapshots.fetch_add(1, Ordering::Relaxed);
            // 0 bytes: the snapshot was already on disk, and its size is known.
            if bytes > 0 {
                shared
                    .counters
                    .snapshot_bytes
                    .store(bytes as u64, Ordering::Relaxed);
            }
            tracing::info!(seq, bytes, rows = job.state.row_count(), "snapshot written");
        }
        Err(e) => {
            shared
                .counters
                .snapshot_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "snapshot failed");
        }
    }
    result.map_err(|e| CoreError::from_log(&e))
}
