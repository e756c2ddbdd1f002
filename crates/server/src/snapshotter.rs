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
#[derive(Default)]
pub(crate) struct StartupCheck {
    pending: Mutex<bool>,
    done: parking_lot::Condvar,
    /// Snapshots found damaged (0 or 1): `sluice_snapshots_damaged_total`.
    damaged: AtomicU64,
}

/// What a damaged snapshot is renamed to (`list_snapshots` no longer sees it; kept for a
/// post-mortem, as nothing else refers to it).
const DAMAGED_SUFFIX: &str = ".damaged";

impl StartupCheck {
    /// Starts checking `unchecked` (a snapshot in `data_dir`) on a thread of its own, which
    /// holds nothing of the server but this: a server closed meanwhile is not kept open.
    pub fn start(
        check: &Arc<StartupCheck>,
        data_dir: std::path::PathBuf,
        unchecked: sluice_engine::recovery::UncheckedSnapshot,
    ) -> std::io::Result<()> {
        *check.pending.lock() = true;
        let thread_check = check.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-snapcheck".into())
            .spawn(move || {
                // The verdict is given even if the check panicked: the snapshotter waits.
                let done = Done(&thread_check);
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

    fn finish(&self) {
        *self.pending.lock() = false;
        self.done.notify_all();
    }

    pub fn is_pending(&self) -> bool {
        *self.pending.lock()
    }

    /// Snapshots the check found damaged (and moved aside): 0 or 1.
    pub fn damaged(&self) -> u64 {
        self.damaged.load(Ordering::Relaxed)
    }

    /// Returns once the check (if any) has given its verdict.
    pub fn wait(&self) {
        let mut pending = self.pending.lock();
        while *pending {
            self.done.wait(&mut pending);
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
