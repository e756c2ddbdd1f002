//! [`Log`]: the group-commit thread.
//!
//! The single writer (in the server) applies transactions and hands their encoded frames to
//! [`Log::submit`] together with one [`Waiter`] per commit. The log thread takes *everything*
//! submitted since its last round, writes it with one `write`, completes the `disk` waiters,
//! and — if any waiter asked for `fsync` — hands one `fdatasync` for the lot to a sync thread
//! and goes on to the next round. The writer never waits on a sync, and concurrent commits
//! share syncs (group commit).
//!
//! The grouping is adaptive: the thread starts a round as soon as anything is pending and
//! never sleeps to wait for company, so a lone writer pays one sync and no timer.
//!
//! **Overlapping syncs.** Up to [`LogConfig::sync_threads`] syncs run at once, each through a
//! file description of its own ([`LogFile::sync_handle`]): while one `fdatasync` is in the
//! device, the next round is written and its sync started, so a commit waits for about one
//! sync instead of the rest of the one in flight plus its own (on this kind of virtual disk
//! that halves fsync-class latency under load; see ARCHITECTURE "Log"). While recent syncs
//! were fast ([`LogConfig::sync_inline_below`]) the log thread runs each round's sync itself
//! instead: the overlap saves little there, and more, smaller syncs cost CPU. Results are
//! *applied in the order the syncs were started*: a sync's waiters are completed only once it
//! and every sync started before it returned `Ok`, so a sync that returns early never
//! acknowledges a commit whose pages an earlier, failing sync lost.
//!
//! A failed write or sync poisons the log: every pending and later waiter fails with
//! [`LogError::Poisoned`] and [`Log::submit`] refuses new frames until the process restarts.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::io::{remove_file_gradually, sync_dir, LogFile, LogFileFactory, RealFiles, SyncHandle};
use crate::latency::LatencyHistogram;
use crate::segment::{list_segments, segment_path};
use crate::{Durability, LogError};

/// One commit waiting for its durability class.
pub trait Waiter: Send + 'static {
    fn durability(&self) -> Durability;
    /// Called once: `Ok` when the commit reached its class, `Err` if the log was poisoned
    /// (or shut down) first.
    fn complete(self, result: Result<(), &LogError>);
}

/// How far the log has come. Both are "every seq up to and including this one".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Written to the segment file (in the OS page cache).
    pub written_seq: u64,
    /// On stable storage.
    pub synced_seq: u64,
}

pub struct LogConfig {
    pub dir: PathBuf,
    /// A new segment is started once the active one reaches this size.
    pub segment_bytes_max: u64,
    /// Frames of `memory`/`disk` commits are synced at least this often in the background,
    /// bounding what a power loss can take.
    pub background_sync_interval: Duration,
    pub files: Arc<dyn LogFileFactory>,
    /// Bytes submitted and not yet taken by the log thread before [`Log::submit`] waits
    /// (`--log-pending-bytes`): back-pressure on the writer when commits (`memory`/`disk`
    /// classes above all, which nobody waits for) arrive faster than the disk takes them.
    pub pending_bytes_max: usize,
    /// Syncs that may run at once (each on a thread of its own, see the module docs); 0:
    /// none beside the log thread, which then syncs each round itself before the next one
    /// (no overlap, but no hand-off either: less CPU per sync where the disk is fast).
    pub sync_threads: usize,
    /// While the recent sync latency (a moving average) is below this, the log thread syncs
    /// each round itself even with sync threads: on a fast disk every `fdatasync` costs tens
    /// of µs of CPU, and overlapping syncs take more of them (smaller groups) to save a wait
    /// that is short anyway. Above it, syncs are handed off and overlap. `Duration::ZERO`:
    /// always hand off.
    pub sync_inline_below: Duration,
    /// Prepare the next segment in the background ([`PREPARED_FILE_NAME`], zeros written and
    /// synced) and write segments over prepared files, when [`LogFileFactory::prepares`]:
    /// an `fdatasync` of a file that does not grow flushes no file-system metadata (see
    /// [`crate::io::PreparedFile`]). The server turns it on; off by default so that library
    /// users and tests that edit segment files by hand see plain appended files.
    pub prepare_segments: bool,
    /// The newest segment's frames end at this byte and only zeros follow (recovery kept a
    /// prepared segment's unwritten end, `RecoveryOptions::keep_zero_tail`): the log writes
    /// over them from there instead of appending after them. Needs a factory that
    /// [`LogFileFactory::prepares`].
    pub resume_newest_at: Option<u64>,
}

/// The file the next segment is prepared in (a name [`list_segments`] never lists).
pub const PREPARED_FILE_NAME: &str = "next-segment.prepared";

/// Retired segments kept to prepare the next segments over (see
/// [`Log::retire_segments_before`]): at most this many, named `next-segment.spare-<i>`.
/// Four 64 MiB segments are the log between two snapshots at the default interval. They
/// outlive the process (a restart prepares over them; removing them would cost the start
/// their blocks' discards), unless a log opens without preparing, which removes them.
pub const SPARES_MAX: usize = 4;

/// The path of spare `i` (< [`SPARES_MAX`]) in `dir`.
pub fn spare_path(dir: &std::path::Path, i: usize) -> PathBuf {
    dir.join(format!("next-segment.spare-{i}"))
}

/// The most bytes prepared for one segment (a larger `segment_bytes_max` grows past it).
pub const PREPARED_BYTES_MAX: u64 = 256 << 20;

/// Default [`LogConfig::sync_threads`]: a second sync in flight hides most of the first's
/// wait; a third added nothing measurable on the machines we run on.
pub const SYNC_THREADS_DEFAULT: usize = 2;

/// Default [`LogConfig::sync_inline_below`]. On the 2-core virtual machines we measure on,
/// an idle disk syncs in 150–300 µs and a busy one in 3–4 ms: below 1 ms inline syncing gave
/// `sluice-http` transfers 6–8 % more TPS at half the log CPU; above it overlapping gave the
/// bare log 2–6× (ARCHITECTURE "Why syncs overlap").
pub const SYNC_INLINE_BELOW_DEFAULT: Duration = Duration::from_millis(1);

impl LogConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LogConfig {
            dir: dir.into(),
            segment_bytes_max: 64 << 20,
            background_sync_interval: Duration::from_secs(1),
            files: Arc::new(RealFiles),
            pending_bytes_max: 64 << 20,
            sync_threads: SYNC_THREADS_DEFAULT,
            sync_inline_below: SYNC_INLINE_BELOW_DEFAULT,
            prepare_segments: false,
            resume_newest_at: None,
        }
    }
}

/// Number of log2-microsecond buckets in the sync latency histogram.
pub const SYNC_LATENCY_BUCKETS: usize = 24;

/// Counters for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct LogStats {
    pub frames_written: u64,
    pub bytes_written: u64,
    pub writes: u64,
    pub syncs: u64,
    /// Of `syncs`, those the log thread ran itself (the rest were handed to sync threads).
    pub inline_syncs: u64,
    /// Moving average of recent sync latencies, µs: what chooses inline or handed-off
    /// syncs ([`LogConfig::sync_inline_below`]).
    pub sync_recent_us: u64,
    /// Commits whose waiters were completed by a sync (fsync class), for commits-per-sync.
    pub synced_commits: u64,
    /// `sync_latency_us_buckets[i]` counts syncs that took < 2^i µs (the last is +Inf).
    pub sync_latency_us_buckets: [u64; SYNC_LATENCY_BUCKETS],
    pub sync_latency_us_sum: u64,
    pub segments_created: u64,
    /// Of `segments_created`, those written over a prepared file.
    pub segments_prepared: u64,
    pub segments_retired: u64,
    /// Bytes submitted and not yet taken by the log thread, now and at most so far.
    pub pending_bytes: u64,
    pub pending_bytes_peak: u64,
    pub pending_bytes_max: u64,
    /// Submits that waited for the log thread to take pending bytes (back-pressure).
    pub submit_waits: u64,
}

struct Pending<W> {
    buf: Vec<u8>,
    /// The most `buf` held, and how many submits waited for the log thread to take it
    /// (kept here, under the lock `submit` holds anyway, not in the stats).
    buf_peak: usize,
    submit_waits: u64,
    frames: u64,
    last_seq: u64,
    waiters: Vec<W>,
    /// Sync everything submitted up to this seq even if no waiter asks for it.
    sync_requested_seq: u64,
    shutdown: bool,
}

struct Shared<W> {
    pending: Mutex<Pending<W>>,
    work: Condvar,
    /// Signalled when the log thread takes the pending bytes (wakes a waiting submit).
    taken: Condvar,
    pending_bytes_max: usize,
    progress: Mutex<Progress>,
    progress_changed: Condvar,
    /// `progress.synced_seq`, readable without the lock (the log thread checks it each
    /// round; the sync threads advance it).
    synced_seq: AtomicU64,
    /// Held while progress is merged and handed to `on_progress`: several threads publish
    /// (the log thread and the sync threads), and the callback must see it in order.
    publishing: Mutex<()>,
    syncs: Mutex<Syncs<W>>,
    /// Signalled when a sync job is queued (or the sync threads are told to stop).
    sync_work: Condvar,
    /// Syncs started and whose result is not applied yet (the log thread starts one only
    /// while this is below [`LogConfig::sync_threads`]).
    syncs_in_flight: AtomicUsize,
    /// Moving average of successful sync latencies in µs (1/8 weight to each new one), which
    /// decides whether the log thread syncs inline ([`LogConfig::sync_inline_below`]).
    sync_recent_us: AtomicU64,
    poison: Mutex<Option<String>>,
    stats: Mutex<LogStats>,
    active_first_seq: AtomicU64,
    /// Time of each `write` to the active segment (a segment roll, which syncs the old
    /// segment and creates and syncs the new one, included).
    append_latency: LatencyHistogram,
    /// Time of each round: from taking what is pending to its last waiter completed.
    round_latency: LatencyHistogram,
    on_progress: Box<dyn Fn(Progress) + Send + Sync>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug elsewhere; the data is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The write-ahead log: an appending group-commit thread over segment files.
pub struct Log<W: Waiter> {
    shared: Arc<Shared<W>>,
    thread: Option<JoinHandle<()>>,
    /// The preparing thread and its state, with [`LogConfig::prepare_segments`].
    prep: Option<(Arc<Prep>, JoinHandle<()>)>,
    dir: PathBuf,
}

impl<W: Waiter> Log<W> {
    /// Opens the log for appending after recovery. `last_seq` is the seq of the last frame
    /// already on disk (0 for none): new frames continue the newest segment, or start one
    /// named `last_seq + 1`. Recovery **must** have truncated any torn tail first.
    pub fn open(
        config: LogConfig,
        last_seq: u64,
        on_progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<Self, LogError> {
        std::fs::create_dir_all(&config.dir).map_err(|e| LogError::io(&config.dir, e))?;
        let existing = list_segments(&config.dir)?;
        let (first_seq, path) = match existing.last() {
            Some(seg) => (seg.first_seq, seg.path.clone()),
            None => (last_seq + 1, segment_path(&config.dir, last_seq + 1)),
        };
        let resume_at = config.resume_newest_at.filter(|_| !existing.is_empty());
        let (file, size) = match resume_at {
            Some(at) => (config.files.open_prepared(&path, at), at),
            None => (
                config.files.open_append(&path),
                std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            ),
        };
        let file = file.map_err(|e| LogError::io(&path, e))?;
        if existing.is_empty() {
            config
                .files
                .sync_dir(&config.dir)
                .map_err(|e| LogError::io(&config.dir, e))?;
        }
        let progress = Progress {
            written_seq: last_seq,
            synced_seq: last_seq,
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                buf_peak: 0,
                submit_waits: 0,
                frames: 0,
                last_seq,
                waiters: Vec::new(),
                sync_requested_seq: 0,
                shutdown: false,
            }),
            work: Condvar::new(),
            taken: Condvar::new(),
            pending_bytes_max: config.pending_bytes_max,
            progress: Mutex::new(progress),
            progress_changed: Condvar::new(),
            synced_seq: AtomicU64::new(last_seq),
            publishing: Mutex::new(()),
            syncs: Mutex::new(Syncs {
                queue: VecDeque::new(),
                finished: BTreeMap::new(),
                next_applied: 0,
                applied_upto: last_seq,
                waiting: VecDeque::new(),
                stop: false,
            }),
            sync_work: Condvar::new(),
            syncs_in_flight: AtomicUsize::new(0),
            // Undecided until a sync was measured: hand off (the safe choice on a slow disk).
            sync_recent_us: AtomicU64::new(config.sync_inline_below.as_micros() as u64),
            poison: Mutex::new(None),
            stats: Mutex::new(LogStats::default()),
            active_first_seq: AtomicU64::new(first_seq),
            append_latency: LatencyHistogram::default(),
            round_latency: LatencyHistogram::default(),
            on_progress: Box::new(on_progress),
        });
        let dir = config.dir.clone();
        let prepares = config.prepare_segments && config.files.prepares();
        if !prepares {
            // Spares an earlier run kept, which nothing would use.
            for i in 0..SPARES_MAX {
                let _ = std::fs::remove_file(spare_path(&dir, i));
            }
        }
        let prep = if prepares {
            let prep = Arc::new(Prep {
                path: config.dir.join(PREPARED_FILE_NAME),
                spares: (0..SPARES_MAX)
                    .map(|i| spare_path(&config.dir, i))
                    .collect(),
                bytes: config.segment_bytes_max.clamp(1, PREPARED_BYTES_MAX),
                // Nothing is prepared before the first write (`Prep::want`): a restart's
                // startup does not compete with 64 MiB of zeros, nor a server nobody writes
                // to. A file left by an earlier run is never `ready`: it is written over.
                state: Mutex::new(PrepState::default()),
                changed: Condvar::new(),
            });
            let (p, files) = (prep.clone(), config.files.clone());
            let thread = std::thread::Builder::new()
                .name("sluice-log-prep".into())
                .spawn(move || prepare_thread(p, files))
                .map_err(|e| LogError::io(&dir, e))?;
            Some((prep, thread))
        } else {
            None
        };
        let thread_shared = shared.clone();
        let thread_prep = prep.as_ref().map(|(p, _)| p.clone());
        let thread = crate::critical::spawn("log", move || {
            LogThread {
                shared: thread_shared,
                config,
                file,
                prep: thread_prep,
                // Written over from `resume_at`, it is sealed at its roll like a prepared one.
                prepared_active: resume_at.is_some(),
                prep_asked: false,
                segment_bytes: size,
                progress,
                last_sync: Instant::now(),
                handed_upto: last_seq,
                fsync_wanted_upto: last_seq,
                next_job: 0,
            }
            .run()
        })
        .map_err(|e| LogError::io(&dir, e))?;
        Ok(Log {
            shared,
            thread: Some(thread),
            prep,
            dir,
        })
    }

    /// Hands the log the frames of commits `..=last_seq` (already encoded, in seq order) and
    /// their waiters. Never blocks on I/O. If the log is poisoned or closed, the waiters are
    /// completed with that error here and it is returned.
    pub fn submit(
        &self,
        frames: &[u8],
        frame_count: u64,
        last_seq: u64,
        waiters: impl IntoIterator<Item = W>,
    ) -> Result<(), LogError> {
        let refuse = |err: LogError, waiters: &mut dyn Iterator<Item = W>| {
            for w in waiters {
                w.complete(Err(&err));
            }
            Err(err)
        };
        if let Some(reason) = lock(&self.shared.poison).clone() {
            return refuse(LogError::Poisoned(reason), &mut waiters.into_iter());
        }
        let mut pending = lock(&self.shared.pending);
        if pending.shutdown {
            drop(pending);
            return refuse(LogError::Closed, &mut waiters.into_iter());
        }
        assert!(
            last_seq >= pending.last_seq,
            "frames must be submitted in seq order"
        );
        // Back-pressure: wait while the log thread has not taken enough of what is pending.
        // A submission larger than the bound alone still goes in, once nothing is pending.
        let max = self.shared.pending_bytes_max;
        if !pending.buf.is_empty() && pending.buf.len() + frames.len() > max {
            pending.submit_waits += 1;
            while !pending.buf.is_empty() && pending.buf.len() + frames.len() > max {
                if let Some(reason) = lock(&self.shared.poison).clone() {
                    drop(pending);
                    return refuse(LogError::Poisoned(reason), &mut waiters.into_iter());
                }
                pending = self
                    .shared
                    .taken
                    .wait_timeout(pending, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        pending.buf.extend_from_slice(frames);
        pending.buf_peak = pending.buf_peak.max(pending.buf.len());
        pending.frames += frame_count;
        pending.last_seq = last_seq;
        pending.waiters.extend(waiters);
        drop(pending);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Blocks until every frame up to `seq` is on stable storage (syncing if need be).
    pub fn sync_barrier(&self, seq: u64) -> Result<(), LogError> {
        {
            let mut pending = lock(&self.shared.pending);
            pending.sync_requested_seq = pending.sync_requested_seq.max(seq);
        }
        self.shared.work.notify_one();
        let mut progress = lock(&self.shared.progress);
        loop {
            if progress.synced_seq >= seq {
                return Ok(());
            }
            if let Some(reason) = lock(&self.shared.poison).clone() {
                return Err(LogError::Poisoned(reason));
            }
            progress = self
                .shared
                .progress_changed
                .wait_timeout(progress, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Latency of the log thread's appends (segment rolls included).
    pub fn append_latency(&self) -> &LatencyHistogram {
        &self.shared.append_latency
    }

    /// Latency of the log thread's rounds (take, append, sync, complete the waiters).
    pub fn round_latency(&self) -> &LatencyHistogram {
        &self.shared.round_latency
    }

    pub fn progress(&self) -> Progress {
        *lock(&self.shared.progress)
    }

    pub fn poisoned(&self) -> Option<String> {
        lock(&self.shared.poison).clone()
    }

    pub fn stats(&self) -> LogStats {
        let (bytes, peak, waits) = {
            let p = lock(&self.shared.pending);
            (p.buf.len(), p.buf_peak, p.submit_waits)
        };
        let mut stats = lock(&self.shared.stats).clone();
        stats.pending_bytes = bytes as u64;
        stats.pending_bytes_peak = peak as u64;
        stats.pending_bytes_max = self.shared.pending_bytes_max as u64;
        stats.submit_waits = waits;
        stats.sync_recent_us = self.shared.sync_recent_us.load(Ordering::Relaxed);
        stats
    }

    /// Deletes every segment whose frames all have seq < `keep_from_seq`, except the active
    /// one. Callers **must** hold a durable snapshot covering those seqs.
    pub fn retire_segments_before(&self, keep_from_seq: u64) -> Result<usize, LogError> {
        let segments = list_segments(&self.dir)?;
        let active = self.shared.active_first_seq.load(Ordering::Acquire);
        let mut removed = 0;
        for pair in segments.windows(2) {
            let (seg, next) = (&pair[0], &pair[1]);
            if seg.first_seq >= active || next.first_seq > keep_from_seq {
                break;
            }
            removed += 1;
            // Kept, while fewer than `SPARES_MAX` are, for a next segment to be prepared over:
            // no fresh page cache to fill with zeros, no blocks to free and allocate again.
            if let Some((prep, _)) = &self.prep {
                if prep.keep_spare(&seg.path)? {
                    continue;
                }
            }
            // Off the writer's path (the snapshot thread calls this), in steps: a whole
            // segment's blocks freed at once would hold the log's next sync up.
            remove_file_gradually(&seg.path).map_err(|e| LogError::io(&seg.path, e))?;
        }
        if removed > 0 {
            sync_dir(&self.dir).map_err(|e| LogError::io(&self.dir, e))?;
            lock(&self.shared.stats).segments_retired += removed as u64;
        }
        Ok(removed)
    }

    /// Writes and syncs everything submitted, then stops the log thread.
    pub fn shutdown(mut self) -> Result<(), LogError> {
        self.stop();
        match lock(&self.shared.poison).clone() {
            Some(reason) => Err(LogError::Poisoned(reason)),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        lock(&self.shared.pending).shutdown = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some((prep, thread)) = self.prep.take() {
            prep.stop();
            let _ = thread.join();
            // Not a segment; the next open would start it over anyway. The spares stay for
            // the next open to prepare over.
            let _ = std::fs::remove_file(&prep.path);
        }
    }
}

impl<W: Waiter> Drop for Log<W> {
    fn drop(&mut self) {
        self.stop();
    }
}

struct LogThread<W> {
    shared: Arc<Shared<W>>,
    config: LogConfig,
    file: Box<dyn LogFile>,
    /// The next segment's prepared file, with [`LogConfig::prepare_segments`].
    prep: Option<Arc<Prep>>,
    /// The active segment was a prepared file (its end is zeros until sealed).
    prepared_active: bool,
    /// The next segment was asked for since the last roll.
    prep_asked: bool,
    segment_bytes: u64,
    progress: Progress,
    /// When a sync was last started (or the log opened): background syncs are due from here.
    last_sync: Instant,
    /// The highest seq a started sync covers (every frame written before it started).
    handed_upto: u64,
    /// The last seq of the newest round with `fsync` waiters.
    fsync_wanted_upto: u64,
    /// The number of the next sync started: results are applied in this order.
    next_job: u64,
}

/// The syncs started and not yet applied, and the `fsync` waiters they will complete.
struct Syncs<W> {
    /// Started syncs no sync thread has taken yet.
    queue: VecDeque<SyncJob>,
    /// Results of syncs that returned before an earlier one did, by job number.
    finished: BTreeMap<u64, SyncResult>,
    /// The job number whose result is applied next.
    next_applied: u64,
    /// Every frame up to this seq is durable (the highest `upto` applied `Ok`).
    applied_upto: u64,
    /// `fsync` waiters of written rounds, by the last seq of their round, oldest first.
    waiting: VecDeque<(u64, Vec<W>)>,
    /// The sync threads exit once the queue is empty.
    stop: bool,
}

struct SyncJob {
    no: u64,
    upto: u64,
    handle: SyncHandle,
}

struct SyncResult {
    upto: u64,
    /// Run by the log thread itself (not handed to a sync thread).
    inline: bool,
    /// How long the sync took, or why it failed.
    took: Result<Duration, String>,
}

/// The next segment's file, prepared by a thread of its own ([`LogConfig::prepare_segments`]).
struct Prep {
    /// `<dir>/`[`PREPARED_FILE_NAME`].
    path: PathBuf,
    /// [`spare_path`]s: retired segments the next files are prepared over.
    spares: Vec<PathBuf>,
    bytes: u64,
    state: Mutex<PrepState>,
    changed: Condvar,
}

#[derive(Default)]
struct PrepState {
    /// A prepared file is wanted and not ready yet.
    wanted: bool,
    /// `path` holds a whole prepared file, synced.
    ready: bool,
    /// The log is stopping: the preparing thread gives up.
    stop: bool,
    /// Preparing failed and stopped for good (no spare is kept for it).
    gave_up: bool,
    /// Sealed segments whose cached pages the preparing thread drops
    /// ([`LogFile::release_cache`]) before it prepares the next file, off the log thread.
    sealed: Vec<Box<dyn LogFile>>,
}

impl Prep {
    fn is_ready(&self) -> bool {
        lock(&self.state).ready
    }

    /// Asks for a prepared file if none is ready or being written.
    fn want(&self) {
        let mut state = lock(&self.state);
        if !state.ready && !state.wanted {
            state.wanted = true;
            self.changed.notify_all();
        }
    }

    /// Renames the prepared file to `segment` if one is ready (and `segment` does not exist
    /// yet): whether it did. Under the state lock, so the preparing thread cannot start the
    /// next file at `path` before the rename. The next is asked for later (`Prep::want`).
    fn take_into(&self, segment: &std::path::Path) -> std::io::Result<bool> {
        let mut state = lock(&self.state);
        if !state.ready || segment.exists() {
            return Ok(false);
        }
        std::fs::rename(&self.path, segment)?;
        state.ready = false;
        Ok(true)
    }

    fn stop(&self) {
        lock(&self.state).stop = true;
        self.changed.notify_all();
    }

    /// Hands a sealed segment to the preparing thread, which drops its cached pages (a few
    /// ms for a 64 MiB segment) and closes it; if that thread has ended, that happens here.
    fn release_sealed(&self, file: Box<dyn LogFile>) {
        let mut state = lock(&self.state);
        if state.stop || state.gave_up {
            drop(state);
            file.release_cache();
            return;
        }
        state.sealed.push(file);
        self.changed.notify_all();
    }

    /// Renames the retired `segment` to a free spare name if there is one: whether it did.
    /// The directory is synced, as for a segment deleted in steps, so a crash never brings a
    /// retired segment back after a later one is gone.
    fn keep_spare(&self, segment: &std::path::Path) -> Result<bool, LogError> {
        let spare = {
            // Held for the rename only (the log thread takes this lock at every roll).
            let state = lock(&self.state);
            let free = self.spares.iter().find(|s| !s.exists());
            let Some(spare) = free.filter(|_| !state.stop && !state.gave_up) else {
                return Ok(false);
            };
            std::fs::rename(segment, spare).map_err(|e| LogError::io(segment, e))?;
            spare
        };
        let dir = spare.parent().expect("spares are in the log's directory");
        sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
        Ok(true)
    }

    /// Moves a spare (if any) to `path`, where the next file is prepared over it.
    fn use_spare(&self) {
        let _state = lock(&self.state);
        if self.path.exists() {
            return;
        }
        if let Some(spare) = self.spares.iter().find(|s| s.exists()) {
            if let Err(e) = std::fs::rename(spare, &self.path) {
                tracing::debug!(error = %e, "a spare log segment is not used");
            }
        }
    }

    fn remove_spares(&self) {
        for spare in &self.spares {
            let _ = std::fs::remove_file(spare);
        }
    }
}

/// The preparing thread: writes a prepared file whenever one is wanted. A failure (a full
/// disk, say) is logged and ends the preparing — segments are then plain appended files, as
/// before; nothing else depends on it.
fn prepare_thread(prep: Arc<Prep>, files: Arc<dyn LogFileFactory>) {
    loop {
        let sealed = {
            let mut state = lock(&prep.state);
            // Sleeps until a file is wanted (and none is ready), a sealed segment is
            // handed over, or the log stops.
            while !state.stop && state.sealed.is_empty() && (!state.wanted || state.ready) {
                state = prep.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            if state.stop {
                return;
            }
            std::mem::take(&mut state.sealed)
        };
        // First, so the zeros below land in the pages these free.
        for file in sealed {
            file.release_cache();
        }
        {
            let state = lock(&prep.state);
            if !state.wanted || state.ready {
                continue;
            }
        }
        let stopping = || lock(&prep.state).stop;
        prep.use_spare();
        match files.prepare(&prep.path, prep.bytes, &stopping) {
            Ok(()) => {
                let mut state = lock(&prep.state);
                state.ready = true;
                state.wanted = false;
            }
            Err(e) => {
                lock(&prep.state).gave_up = true;
                let _ = std::fs::remove_file(&prep.path);
                prep.remove_spares();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!(
                        path = %prep.path.display(),
                        error = %e,
                        "could not prepare the next log segment; segments are appended files from now on"
                    );
                }
                return;
            }
        }
    }
}

/// Merges `p` into the published progress (each field only moves forward) and hands the
/// result to `on_progress`, in order across the threads that publish.
fn publish_progress<W>(shared: &Shared<W>, p: Progress) {
    let ordered = lock(&shared.publishing);
    let merged = {
        let mut cur = lock(&shared.progress);
        cur.written_seq = cur.written_seq.max(p.written_seq);
        cur.synced_seq = cur.synced_seq.max(p.synced_seq);
        *cur
    };
    shared
        .synced_seq
        .fetch_max(merged.synced_seq, Ordering::AcqRel);
    (shared.on_progress)(merged);
    drop(ordered);
    shared.progress_changed.notify_all();
}

/// Records a successful sync that took `took` (on the log thread itself if `inline`) in the
/// stats and the recent-latency average.
fn count_sync<W>(shared: &Shared<W>, took: Duration, inline: bool, commits: u64) {
    let took_us = took.as_micros() as u64;
    let mut stats = lock(&shared.stats);
    stats.syncs += 1;
    stats.inline_syncs += u64::from(inline);
    stats.synced_commits += commits;
    let bucket = (64 - took_us.leading_zeros() as usize).min(SYNC_LATENCY_BUCKETS - 1);
    stats.sync_latency_us_buckets[bucket] += 1;
    stats.sync_latency_us_sum += took_us;
    // Updated under the stats lock, so concurrent syncs do not lose each other's samples.
    let recent = shared.sync_recent_us.load(Ordering::Relaxed);
    let next = (recent * 7 + took_us) / 8;
    shared.sync_recent_us.store(next, Ordering::Relaxed);
}

/// Takes the result of sync `no` and applies, in job order, every result now in sequence:
/// an `Ok` publishes its seq as synced and completes the waiters it covers; an `Err` poisons
/// the log and fails every waiter still waiting (whatever later syncs return).
fn apply_sync<W: Waiter>(shared: &Shared<W>, no: u64, result: SyncResult) {
    let mut completed: Vec<(Duration, bool, Vec<W>)> = Vec::new();
    let mut failed: Vec<W> = Vec::new();
    let mut synced_upto = None;
    {
        let mut syncs = lock(&shared.syncs);
        syncs.finished.insert(no, result);
        loop {
            let next = syncs.next_applied;
            let Some(r) = syncs.finished.remove(&next) else {
                break;
            };
            syncs.next_applied += 1;
            shared.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
            match r.took {
                Ok(took) if lock(&shared.poison).is_none() => {
                    syncs.applied_upto = syncs.applied_upto.max(r.upto);
                    synced_upto = Some(syncs.applied_upto);
                    let mut covered = Vec::new();
                    while syncs.waiting.front().is_some_and(|(seq, _)| *seq <= r.upto) {
                        covered.extend(
                            syncs
                                .waiting
                                .pop_front()
                                .map(|(_, w)| w)
                                .into_iter()
                                .flatten(),
                        );
                    }
                    completed.push((took, r.inline, covered));
                }
                Ok(_) => failed.extend(syncs.waiting.drain(..).flat_map(|(_, w)| w)),
                Err(reason) => {
                    tracing::error!(%reason, "log poisoned (sync): refusing writes until restart");
                    lock(&shared.poison).get_or_insert(reason);
                    failed.extend(syncs.waiting.drain(..).flat_map(|(_, w)| w));
                }
            }
        }
    }
    for (took, inline, waiters) in &completed {
        count_sync(shared, *took, *inline, waiters.len() as u64);
    }
    if let Some(upto) = synced_upto {
        publish_progress(
            shared,
            Progress {
                written_seq: 0,
                synced_seq: upto,
            },
        );
    }
    for w in completed.into_iter().flat_map(|(_, _, w)| w) {
        w.complete(Ok(()));
    }
    if !failed.is_empty() {
        let err = LogError::Poisoned(lock(&shared.poison).clone().unwrap_or_default());
        for w in failed {
            w.complete(Err(&err));
        }
    }
    shared.progress_changed.notify_all();
}

/// A sync thread: runs the syncs the log thread starts until told to stop (and the queue is
/// empty, so that every started sync is applied).
fn sync_thread<W: Waiter>(shared: Arc<Shared<W>>) {
    loop {
        let mut job = {
            let mut syncs = lock(&shared.syncs);
            loop {
                if let Some(job) = syncs.queue.pop_front() {
                    break job;
                }
                if syncs.stop {
                    return;
                }
                syncs = shared
                    .sync_work
                    .wait(syncs)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        let started = Instant::now();
        let took = (job.handle)()
            .map(|()| started.elapsed())
            .map_err(|e| e.to_string());
        apply_sync(
            &shared,
            job.no,
            SyncResult {
                upto: job.upto,
                inline: false,
                took,
            },
        );
        // Wake the log thread (taking its lock orders this after its check): a slot is free,
        // and what was written meanwhile can be synced now.
        drop(lock(&shared.pending));
        shared.work.notify_one();
    }
}

impl<W: Waiter> LogThread<W> {
    fn run(self) {
        let shared = self.shared.clone();
        let threads: Vec<_> = (0..self.config.sync_threads)
            .filter_map(|_| {
                let shared = shared.clone();
                crate::critical::spawn("log-sync", move || sync_thread(shared)).ok()
            })
            .collect();
        self.rounds();
        lock(&shared.syncs).stop = true;
        shared.sync_work.notify_all();
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// The seq a sync should cover now: what a waiter, a barrier or the background interval
    /// asks for, of what is written.
    fn sync_wanted(&self, sync_requested_seq: u64) -> u64 {
        sync_requested_seq
            .max(self.fsync_wanted_upto)
            .min(self.progress.written_seq)
    }

    /// Whether another sync may start now.
    fn sync_slot_free(&self) -> bool {
        self.shared.syncs_in_flight.load(Ordering::Acquire) < self.config.sync_threads.max(1)
    }

    fn rounds(mut self) {
        let mut buf = Vec::new();
        let mut waiters = Vec::new();
        loop {
            let (frames, last_seq, sync_requested, shutdown) = {
                let mut pending = lock(&self.shared.pending);
                loop {
                    self.progress.synced_seq = self
                        .progress
                        .synced_seq
                        .max(self.shared.synced_seq.load(Ordering::Acquire));
                    let interval = self.config.background_sync_interval;
                    let unsynced = self.progress.written_seq > self.progress.synced_seq;
                    if unsynced && self.last_sync.elapsed() >= interval {
                        // Bound what `memory`/`disk` commits can lose to a power cut, also
                        // (especially) under steady load.
                        pending.sync_requested_seq =
                            pending.sync_requested_seq.max(self.progress.written_seq);
                    }
                    // A sync is work once a slot is free: a sync thread that finishes wakes
                    // this one.
                    let sync_due = self.sync_wanted(pending.sync_requested_seq) > self.handed_upto
                        && self.sync_slot_free();
                    if !pending.buf.is_empty() || sync_due || pending.shutdown {
                        break;
                    }
                    let wait = if unsynced {
                        interval
                            .saturating_sub(self.last_sync.elapsed())
                            .max(Duration::from_millis(1))
                    } else {
                        interval
                    };
                    pending = self
                        .shared
                        .work
                        .wait_timeout(pending, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                std::mem::swap(&mut buf, &mut pending.buf);
                std::mem::swap(&mut waiters, &mut pending.waiters);
                self.shared.taken.notify_all();
                let frames = std::mem::take(&mut pending.frames);
                (
                    frames,
                    pending.last_seq,
                    pending.sync_requested_seq,
                    pending.shutdown,
                )
            };
            let started = Instant::now();
            self.round(
                &buf,
                frames,
                last_seq,
                &mut waiters,
                sync_requested,
                shutdown,
            );
            self.shared.round_latency.record(started.elapsed());
            buf.clear();
            if shutdown {
                let pending = lock(&self.shared.pending);
                if pending.buf.is_empty() {
                    return;
                }
            }
        }
    }

    fn round(
        &mut self,
        buf: &[u8],
        frames: u64,
        last_seq: u64,
        waiters: &mut Vec<W>,
        sync_requested_seq: u64,
        shutdown: bool,
    ) {
        if let Some(reason) = lock(&self.shared.poison).clone() {
            let err = LogError::Poisoned(reason);
            for w in waiters.drain(..) {
                w.complete(Err(&err));
            }
            return;
        }
        if !buf.is_empty() {
            crate::critical::injected_panic_point("log");
            let started = Instant::now();
            // A segment that grows by appends (the first after opening the log) gives way to
            // a prepared one as soon as it is ready.
            let prepared_ready = !self.prepared_active
                && self.segment_bytes > 0
                && self.prep.as_ref().is_some_and(|p| p.is_ready());
            if self.segment_bytes >= self.config.segment_bytes_max || prepared_ready {
                let first_seq = self.progress.written_seq + 1;
                if let Err(err) = self.roll(first_seq) {
                    return self.poison(err, waiters);
                }
            }
            if let Err(e) = self.file.append(buf) {
                return self.poison(e.to_string(), waiters);
            }
            self.segment_bytes += buf.len() as u64;
            // The next segment is prepared once this one is half written (or at once if this
            // one grows by appends): in time for the roll, without writing a segment's worth
            // of zeros right after every roll — in a short-lived server (a test, a bench
            // case) that burst was still in the kernel's write-back when it was killed, and
            // slowed the next start.
            if !self.prep_asked {
                if let Some(prep) = &self.prep {
                    if !self.prepared_active || self.segment_bytes >= prep.bytes / 2 {
                        prep.want();
                        self.prep_asked = true;
                    }
                }
            }
            self.shared.append_latency.record(started.elapsed());
            {
                let mut stats = lock(&self.shared.stats);
                stats.frames_written += frames;
                stats.bytes_written += buf.len() as u64;
                stats.writes += 1;
            }
            self.progress.written_seq = last_seq;
            self.publish();
        }
        // `disk` (and `replicated`, whose other half is the cluster's ack, waited for
        // elsewhere) need the write only; `fsync` waits for a sync that covers the round.
        let mut durable = Vec::new();
        for w in waiters.drain(..) {
            if w.durability() == Durability::Fsync {
                durable.push(w);
            } else {
                w.complete(Ok(()));
            }
        }
        if !durable.is_empty() {
            let upto = self.progress.written_seq;
            self.fsync_wanted_upto = upto;
            let mut syncs = lock(&self.shared.syncs);
            if syncs.applied_upto >= upto {
                // Already durable (a round of waiters without frames of their own).
                drop(syncs);
                for w in durable {
                    w.complete(Ok(()));
                }
            } else {
                syncs.waiting.push_back((upto, durable));
            }
        }
        if shutdown {
            // Everything written is synced before the thread stops.
            if self.progress.written_seq > self.handed_upto {
                if let Err(e) = self.sync_inline() {
                    return self.poison(e, waiters);
                }
            }
            if self.prepared_active {
                // A clean stop leaves no zeros for recovery to read and cut.
                if let Err(e) = self.file.seal(self.segment_bytes) {
                    tracing::warn!(error = %e, "could not seal the active log segment at shutdown");
                }
            }
            return;
        }
        if self.sync_wanted(sync_requested_seq) > self.handed_upto && self.sync_slot_free() {
            let handle = if self.inline_sync_chosen() {
                None
            } else {
                self.file.sync_handle()
            };
            match handle {
                Some(handle) => self.start_sync(handle),
                // A file with no second handle syncs on this thread.
                None => {
                    if let Err(e) = self.sync_inline() {
                        self.poison(e, waiters);
                    }
                }
            }
        }
    }

    /// Whether this round's sync runs on the log thread: always without sync threads, and
    /// while recent syncs were faster than [`LogConfig::sync_inline_below`].
    fn inline_sync_chosen(&self) -> bool {
        self.config.sync_threads == 0
            || self.shared.sync_recent_us.load(Ordering::Relaxed)
                < self.config.sync_inline_below.as_micros() as u64
    }

    /// Hands a sync of everything written so far to a sync thread.
    fn start_sync(&mut self, handle: SyncHandle) {
        let job = SyncJob {
            no: self.next_job,
            upto: self.progress.written_seq,
            handle,
        };
        self.next_job += 1;
        self.handed_upto = job.upto;
        self.last_sync = Instant::now();
        self.shared.syncs_in_flight.fetch_add(1, Ordering::AcqRel);
        lock(&self.shared.syncs).queue.push_back(job);
        self.shared.sync_work.notify_one();
    }

    /// Syncs everything written so far on this thread; its result is applied in order with
    /// the syncs started before it.
    fn sync_inline(&mut self) -> Result<(), String> {
        let (no, upto) = (self.next_job, self.progress.written_seq);
        self.next_job += 1;
        self.handed_upto = upto;
        self.shared.syncs_in_flight.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        let took = self
            .file
            .sync()
            .map(|()| started.elapsed())
            .map_err(|e| e.to_string());
        self.last_sync = Instant::now();
        let failed = took.as_ref().err().cloned();
        let result = SyncResult {
            upto,
            inline: true,
            took,
        };
        apply_sync(&self.shared, no, result);
        match failed {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    fn roll(&mut self, first_seq: u64) -> Result<(), String> {
        self.sync_inline()?;
        if self.prepared_active {
            // Its unwritten zeros go before a newer segment exists: only the newest segment
            // may end in anything but a whole frame.
            let len = self.segment_bytes;
            self.file
                .seal(len)
                .map_err(|e| format!("sealing the active log segment at {len} bytes: {e}"))?;
        }
        let path = segment_path(&self.config.dir, first_seq);
        let prepared = match &self.prep {
            Some(prep) => prep.take_into(&path).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not use the prepared log segment");
                false
            }),
            None => false,
        };
        let opened = if prepared {
            self.config.files.open_prepared(&path, 0)
        } else {
            self.config.files.open_append(&path)
        };
        let opened = opened.map_err(|e| format!("{}: {e}", path.display()))?;
        // Synced and sealed: nothing appends to it or reads it back before a restart, so
        // its cached pages can go (off this thread when there is a preparing one).
        let sealed = std::mem::replace(&mut self.file, opened);
        match &self.prep {
            Some(prep) => prep.release_sealed(sealed),
            None => sealed.release_cache(),
        }
        self.prepared_active = prepared;
        self.prep_asked = false;
        self.config
            .files
            .sync_dir(&self.config.dir)
            .map_err(|e| e.to_string())?;
        self.segment_bytes = 0;
        self.shared
            .active_first_seq
            .store(first_seq, Ordering::Release);
        {
            let mut stats = lock(&self.shared.stats);
            stats.segments_created += 1;
            stats.segments_prepared += u64::from(prepared);
        }
        Ok(())
    }

    fn publish(&self) {
        publish_progress(&self.shared, self.progress);
    }

    fn poison(&mut self, reason: String, waiters: &mut Vec<W>) {
        tracing::error!(%reason, "log poisoned: refusing writes until restart");
        lock(&self.shared.poison).get_or_insert(reason);
        let err = LogError::Poisoned(lock(&self.shared.poison).clone().unwrap_or_default());
        let waiting: Vec<W> = lock(&self.shared.syncs)
            .waiting
            .drain(..)
            .flat_map(|(_, w)| w)
            .collect();
        for w in waiters.drain(..).chain(waiting) {
            w.complete(Err(&err));
        }
        self.shared.progress_changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;
    use crate::io::FailingSyncs;
    use std::sync::mpsc;

    struct TestWaiter {
        seq: u64,
        durability: Durability,
        done: mpsc::Sender<(u64, bool)>,
    }

    impl Waiter for TestWaiter {
        fn durability(&self) -> Durability {
            self.durability
        }
        fn complete(self, result: Result<(), &LogError>) {
            let _ = self.done.send((self.seq, result.is_ok()));
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn one_frame(seq: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        frame::encode_into(&mut buf, &seq.to_le_bytes()).unwrap();
        buf
    }

    /// Where a [`TestWaiter`] reports `(seq, ok)`, and where a test reads it.
    type Acks = (mpsc::Sender<(u64, bool)>, mpsc::Receiver<(u64, bool)>);

    /// Submits `frame` as commit `seq` with an fsync waiter and waits for its acknowledgement,
    /// which must be a success.
    fn commit_fsync(log: &Log<TestWaiter>, frame: &[u8], seq: u64, acks: &Acks) {
        let waiter = TestWaiter {
            seq,
            durability: Durability::Fsync,
            done: acks.0.clone(),
        };
        log.submit(frame, 1, seq, [waiter]).unwrap();
        assert_eq!(acks.1.recv().unwrap(), (seq, true));
    }

    /// Reads every segment of `dir` back, checking each frame's payload against
    /// `payload(seq)` and that every segment but the newest is sealed (exactly its frames).
    /// Returns the seqs in order, and the newest segment's length and where its frames end.
    fn read_back(dir: &std::path::Path, payload: impl Fn(u64) -> Vec<u8>) -> (Vec<u64>, u64, u64) {
        let segments = list_segments(dir).unwrap();
        let (mut seen, mut newest_len, mut newest_end) = (Vec::new(), 0, 0);
        for (i, segment) in segments.iter().enumerate() {
            let bytes = std::fs::read(&segment.path).unwrap();
            let newest = i + 1 == segments.len();
            let end = crate::segment::scan::<LogError>(&segment.path, &bytes, newest, |_, p| {
                seen.push(u64::from_le_bytes(p[..8].try_into().unwrap()));
                assert_eq!(p, payload(*seen.last().unwrap()));
                Ok(())
            })
            .unwrap();
            if newest {
                (newest_len, newest_end) = (bytes.len() as u64, end.valid_len);
            } else {
                assert_eq!(end.valid_len, bytes.len() as u64, "{segment:?} is sealed");
            }
        }
        (seen, newest_len, newest_end)
    }

    #[test]
    fn many_fsync_commits_share_few_syncs() {
        let dir = temp_dir("group");
        let log = Log::open(LogConfig::new(&dir), 0, |_| {}).unwrap();
        let (tx, rx) = mpsc::channel();
        for seq in 1..=500u64 {
            let waiter = TestWaiter {
                seq,
                durability: Durability::Fsync,
                done: tx.clone(),
            };
            log.submit(&one_frame(seq), 1, seq, [waiter]).unwrap();
        }
        for _ in 0..500 {
            let (_, ok) = rx.recv().unwrap();
            assert!(ok);
        }
        let stats = log.stats();
        assert_eq!(stats.frames_written, 500);
        assert!(stats.syncs < 500, "syncs: {}", stats.syncs);
        assert!(log.progress().synced_seq == 500);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disk_commits_under_steady_load_are_still_synced_in_the_background() {
        let dir = temp_dir("background");
        let mut config = LogConfig::new(&dir);
        config.background_sync_interval = Duration::from_millis(20);
        let log = Log::open(config, 0, |_| {}).unwrap();
        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        let mut seq = 0;
        while started.elapsed() < Duration::from_millis(300) {
            seq += 1;
            let waiter = TestWaiter {
                seq,
                durability: Durability::Disk,
                done: tx.clone(),
            };
            log.submit(&one_frame(seq), 1, seq, [waiter]).unwrap();
            assert_eq!(rx.recv().unwrap(), (seq, true));
        }
        let stats = log.stats();
        assert!(
            stats.syncs >= 2,
            "{} syncs for {seq} disk commits",
            stats.syncs
        );
        assert!(
            stats.syncs < seq,
            "disk commits do not each wait for a sync"
        );
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disk_commits_are_acknowledged_while_a_background_sync_is_stuck() {
        let dir = temp_dir("stuck-background");
        let (log, files) = gated_log(&dir, Duration::from_millis(10), SYNC_THREADS_DEFAULT);
        let (w, rx) = waiters(Durability::Disk);
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        assert_eq!(rx.recv().unwrap(), (1, true));
        files.wait_until_reached(0);
        for seq in 2..=20 {
            log.submit(&one_frame(seq), 1, seq, [w(seq)]).unwrap();
            let done = rx.recv_timeout(Duration::from_secs(10));
            assert_eq!(
                done,
                Ok((seq, true)),
                "disk commit {seq} waited for the sync"
            );
        }
        assert_eq!(log.progress().written_seq, 20);
        assert!(log.progress().synced_seq < 20, "{:?}", log.progress());
        files.open_all();
        log.sync_barrier(20).unwrap();
        assert_eq!(log.progress().synced_seq, 20);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Real files whose n-th sync handle (counting from 0, across files) waits at gate n
    /// until the test opens it, to succeed or fail (or opens them all).
    #[derive(Clone, Default)]
    struct NumberedGates {
        state: Arc<(Mutex<Gates>, Condvar)>,
    }

    /// (handles made, gates reached, each gate's verdict once opened: `Ok` or fail; whether
    /// every gate is open, to succeed)
    type Gates = (usize, Vec<usize>, BTreeMap<usize, bool>, bool);

    impl NumberedGates {
        fn wait_until_reached(&self, gate: usize) {
            let (lock, cv) = &*self.state;
            let g = lock.lock().unwrap();
            let (g, timeout) = cv
                .wait_timeout_while(g, Duration::from_secs(10), |g| !g.1.contains(&gate))
                .unwrap();
            assert!(!timeout.timed_out(), "sync {gate} never started: {:?}", g.1);
        }
        fn open(&self, gate: usize, ok: bool) {
            let (lock, cv) = &*self.state;
            lock.lock().unwrap().2.insert(gate, ok);
            cv.notify_all();
        }
        fn open_all(&self) {
            let (lock, cv) = &*self.state;
            lock.lock().unwrap().3 = true;
            cv.notify_all();
        }
    }

    struct NumberedFile(std::fs::File, NumberedGates);

    impl LogFile for NumberedFile {
        fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.0.append(bytes)
        }
        fn sync(&mut self) -> std::io::Result<()> {
            self.0.sync_data()
        }
        fn sync_handle(&self) -> Option<SyncHandle> {
            let (file, gates) = (self.0.try_clone().ok()?, self.1.clone());
            let gate = {
                let mut g = gates.state.0.lock().unwrap();
                g.0 += 1;
                g.0 - 1
            };
            Some(Box::new(move || {
                let (lock, cv) = &*gates.state;
                let mut g = lock.lock().unwrap();
                g.1.push(gate);
                cv.notify_all();
                let ok = loop {
                    if let Some(ok) = g.2.get(&gate) {
                        break *ok;
                    }
                    if g.3 {
                        break true;
                    }
                    g = cv.wait(g).unwrap();
                };
                drop(g);
                if !ok {
                    return Err(std::io::Error::other("injected fdatasync failure"));
                }
                file.sync_data()
            }))
        }
    }

    impl LogFileFactory for NumberedGates {
        fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
            Ok(Box::new(NumberedFile(
                crate::io::open_append_file(path)?,
                self.clone(),
            )))
        }
    }

    /// A log over gated sync handles ([`NumberedGates`]) with this background interval and
    /// number of sync threads, which always hands syncs off when it has sync threads.
    fn gated_log(
        dir: &std::path::Path,
        background_sync_interval: Duration,
        sync_threads: usize,
    ) -> (Log<TestWaiter>, NumberedGates) {
        gated_log_inline_below(dir, background_sync_interval, sync_threads, Duration::ZERO)
    }

    /// [`gated_log`] that syncs inline while recent syncs took less than `inline_below`.
    fn gated_log_inline_below(
        dir: &std::path::Path,
        background_sync_interval: Duration,
        sync_threads: usize,
        inline_below: Duration,
    ) -> (Log<TestWaiter>, NumberedGates) {
        let files = NumberedGates::default();
        let mut config = LogConfig::new(dir);
        config.background_sync_interval = background_sync_interval;
        config.sync_threads = sync_threads;
        config.sync_inline_below = inline_below;
        config.files = Arc::new(files.clone());
        (Log::open(config, 0, |_| {}).unwrap(), files)
    }

    /// Sync handles taken so far from a [`NumberedGates`] file.
    fn handles_taken(files: &NumberedGates) -> usize {
        files.state.0.lock().unwrap().0
    }

    /// Waiters of one durability class for any seq, and the channel they report on.
    fn waiters(
        durability: Durability,
    ) -> (impl Fn(u64) -> TestWaiter, mpsc::Receiver<(u64, bool)>) {
        let (tx, rx) = mpsc::channel();
        let waiter = move |seq| TestWaiter {
            seq,
            durability,
            done: tx.clone(),
        };
        (waiter, rx)
    }

    /// Submits commits `seqs` one at a time and asserts each is acknowledged before the next
    /// is submitted, with no gate opened (so only an inline sync can have done it).
    fn assert_each_acknowledged_inline(
        log: &Log<TestWaiter>,
        w: &impl Fn(u64) -> TestWaiter,
        rx: &mpsc::Receiver<(u64, bool)>,
        seqs: std::ops::RangeInclusive<u64>,
    ) {
        for seq in seqs {
            log.submit(&one_frame(seq), 1, seq, [w(seq)]).unwrap();
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)),
                Ok((seq, true)),
                "commit {seq} was not acknowledged by an inline sync"
            );
        }
    }

    /// Two fsync commits in two rounds, each round's sync started while the first one is
    /// still in the device; returns the log, the gates and the waiters' channel.
    fn two_syncs_in_flight(
        dir: &std::path::Path,
    ) -> (Log<TestWaiter>, NumberedGates, mpsc::Receiver<(u64, bool)>) {
        let (log, files) = gated_log(dir, Duration::from_secs(600), 2);
        let (w, rx) = waiters(Durability::Fsync);
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        files.wait_until_reached(0);
        log.submit(&one_frame(2), 1, 2, [w(2)]).unwrap();
        // The second sync starts while the first is stuck: two are in flight at once.
        files.wait_until_reached(1);
        (log, files, rx)
    }

    #[test]
    fn with_no_sync_threads_the_log_thread_syncs_itself() {
        let dir = temp_dir("sync-inline");
        let (log, files) = gated_log(&dir, Duration::from_secs(600), 0);
        let (w, rx) = waiters(Durability::Fsync);
        // No gate is ever opened: a sync through a handle would never return.
        assert_each_acknowledged_inline(&log, &w, &rx, 1..=3);
        assert_eq!(handles_taken(&files), 0, "a sync handle was taken");
        assert_eq!(log.progress().synced_seq, 3);
        assert!(log.stats().syncs >= 1);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_log_syncs_inline_while_syncs_are_fast_and_hands_them_off_while_slow() {
        // Fast: a threshold of 10 s makes any real sync fast. The first sync is handed off
        // (nothing measured yet); once it returned, the next rounds sync on the log thread.
        let dir = temp_dir("sync-adaptive-fast");
        let (log, files) =
            gated_log_inline_below(&dir, Duration::from_secs(600), 2, Duration::from_secs(10));
        let (w, rx) = waiters(Durability::Fsync);
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        files.wait_until_reached(0);
        files.open(0, true);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((1, true)));
        // No further gate is opened: only an inline sync can acknowledge these.
        assert_each_acknowledged_inline(&log, &w, &rx, 2..=4);
        assert_eq!(
            handles_taken(&files),
            1,
            "a fast log took another sync handle"
        );
        assert!(log.stats().inline_syncs >= 3, "{:?}", log.stats());
        assert!(log.stats().sync_recent_us < 10_000_000);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();

        // Slow: the first sync takes 200 ms against a 20 ms threshold, so the next round's
        // sync is handed off too.
        let dir = temp_dir("sync-adaptive-slow");
        let (log, files) =
            gated_log_inline_below(&dir, Duration::from_secs(600), 2, Duration::from_millis(20));
        let (w, rx) = waiters(Durability::Fsync);
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        files.wait_until_reached(0);
        std::thread::sleep(Duration::from_millis(200));
        files.open(0, true);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((1, true)));
        log.submit(&one_frame(2), 1, 2, [w(2)]).unwrap();
        files.wait_until_reached(1);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(mpsc::RecvTimeoutError::Timeout),
            "commit 2 was acknowledged before its handed-off sync returned"
        );
        files.open(1, true);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((2, true)));
        assert_eq!(handles_taken(&files), 2);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_later_sync_that_returns_first_acknowledges_nothing_until_the_earlier_one_has() {
        let dir = temp_dir("sync-order");
        let (log, files, rx) = two_syncs_in_flight(&dir);
        files.open(1, true);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(mpsc::RecvTimeoutError::Timeout),
            "a commit was acknowledged while an earlier sync was still running"
        );
        assert_eq!(log.progress().synced_seq, 0);
        files.open(0, true);
        let mut done = [rx.recv().unwrap(), rx.recv().unwrap()];
        done.sort();
        assert_eq!(done, [(1, true), (2, true)]);
        assert_eq!(log.progress().synced_seq, 2);
        assert_eq!(log.stats().synced_commits, 2);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_earlier_failed_sync_fails_the_commits_a_later_successful_one_covers() {
        let dir = temp_dir("sync-order-fail");
        let (log, files, rx) = two_syncs_in_flight(&dir);
        files.open(1, true);
        files.open(0, false);
        let mut done = [rx.recv().unwrap(), rx.recv().unwrap()];
        done.sort();
        assert_eq!(done, [(1, false), (2, false)]);
        assert!(log.poisoned().is_some());
        assert_eq!(log.progress().synced_seq, 0);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_background_sync_poisons_the_log() {
        let dir = temp_dir("poison-background");
        let mut config = LogConfig::new(&dir);
        config.background_sync_interval = Duration::from_millis(10);
        config.files = Arc::new(FailingSyncs::new(1));
        let log = Log::open(config, 0, |_| {}).unwrap();
        let (tx, rx) = mpsc::channel();
        let w = |seq| TestWaiter {
            seq,
            durability: Durability::Disk,
            done: tx.clone(),
        };
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        assert_eq!(rx.recv().unwrap(), (1, true));
        assert!(matches!(log.sync_barrier(1), Err(LogError::Poisoned(_))));
        assert!(matches!(
            log.submit(&one_frame(2), 1, 2, [w(2)]),
            Err(LogError::Poisoned(_))
        ));
        assert_eq!(log.progress().synced_seq, 0);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_sync_poisons_the_log() {
        let dir = temp_dir("poison");
        let mut config = LogConfig::new(&dir);
        config.files = Arc::new(FailingSyncs::new(2));
        let log = Log::open(config, 0, |_| {}).unwrap();
        let (tx, rx) = mpsc::channel();
        let w = |seq| TestWaiter {
            seq,
            durability: Durability::Fsync,
            done: tx.clone(),
        };
        log.submit(&one_frame(1), 1, 1, [w(1)]).unwrap();
        assert_eq!(rx.recv().unwrap(), (1, true));
        log.submit(&one_frame(2), 1, 2, [w(2)]).unwrap();
        assert_eq!(rx.recv().unwrap(), (2, false));
        assert!(log.poisoned().is_some());
        assert!(matches!(
            log.submit(&one_frame(3), 1, 3, [w(3)]),
            Err(LogError::Poisoned(_))
        ));
        assert_eq!(log.progress().synced_seq, 1);
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fsync_acknowledged_frames_in_new_segments_survive_power_loss() {
        use crate::segment::scan;
        use crate::sim::{Cut, FaultPlan, SimDisk};
        for seed in 0..16 {
            let dir = temp_dir(&format!("sim-roll-{seed}"));
            let disk = SimDisk::new(FaultPlan {
                seed,
                ..FaultPlan::default()
            });
            let mut config = LogConfig::new(&dir);
            config.segment_bytes_max = 60;
            config.files = Arc::new(disk.clone());
            let log = Log::open(config, 0, |_| {}).unwrap();
            let acks = mpsc::channel();
            for seq in 1..=12u64 {
                commit_fsync(&log, &one_frame(seq), seq, &acks);
            }
            let image = disk.halt_now(Cut::PowerLoss);
            drop(log);
            assert!(image.files.len() > 3, "seed {seed}: segments rolled");
            let mut frames = 0;
            for (path, bytes) in &image.files {
                let bytes = bytes
                    .as_ref()
                    .unwrap_or_else(|| panic!("seed {seed}: {} vanished", path.display()));
                let end = scan(path, bytes, false, |_, _| {
                    frames += 1;
                    Ok::<(), LogError>(())
                })
                .unwrap();
                assert!(end.torn.is_none());
            }
            assert_eq!(frames, 12, "seed {seed}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn segments_roll_and_old_ones_retire() {
        let dir = temp_dir("roll");
        let mut config = LogConfig::new(&dir);
        config.segment_bytes_max = 100;
        let log = Log::open(config, 0, |_| {}).unwrap();
        let (tx, rx) = mpsc::channel();
        for seq in 1..=20u64 {
            let waiter = TestWaiter {
                seq,
                durability: Durability::Fsync,
                done: tx.clone(),
            };
            log.submit(&one_frame(seq), 1, seq, [waiter]).unwrap();
            rx.recv().unwrap();
        }
        let before = list_segments(&dir).unwrap();
        assert!(before.len() > 2, "{before:?}");
        log.retire_segments_before(10).unwrap();
        let after = list_segments(&dir).unwrap();
        assert!(after.len() < before.len());
        // The segment holding seq 10 survives.
        assert!(after[0].first_seq <= 10, "{after:?}");
        drop(log);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// With `prepare_segments`, the segments after the first are written over prepared
    /// files: each ends up exactly its frames once the next one starts (sealed), the newest
    /// is zeros after its frames until the log stops, and every acknowledged frame is in
    /// place, in order.
    #[test]
    fn segments_are_written_over_prepared_files_and_sealed_at_each_roll() {
        prepared_segments_are_sealed_at_each_roll("prepared", Arc::new(RealFiles));
    }

    /// The same with direct I/O (`--log-direct-io`): blocks written whole, the partial last
    /// one again with each append, read back as the same frames.
    #[cfg(target_os = "linux")]
    #[test]
    fn direct_segments_are_written_over_prepared_files_and_sealed_at_each_roll() {
        prepared_segments_are_sealed_at_each_roll(
            "prepared-direct",
            Arc::new(crate::direct::DirectFiles),
        );
    }

    fn prepared_segments_are_sealed_at_each_roll(name: &str, files: Arc<dyn LogFileFactory>) {
        let dir = temp_dir(name);
        let mut config = LogConfig::new(&dir);
        config.segment_bytes_max = 4096;
        config.prepare_segments = true;
        config.files = files;
        let log = Log::open(config, 0, |_| {}).unwrap();
        let prepared = dir.join(PREPARED_FILE_NAME);
        let acks = mpsc::channel();
        let payload = |seq: u64| {
            let mut p = seq.to_le_bytes().to_vec();
            p.resize(200, seq as u8);
            p
        };
        let last = std::cell::Cell::new(0u64);
        let submit = |n: u64| {
            for _ in 0..n {
                let seq = last.get() + 1;
                last.set(seq);
                let mut frame = Vec::new();
                frame::encode_into(&mut frame, &payload(seq)).unwrap();
                commit_fsync(&log, &frame, seq, &acks);
            }
        };
        // The first segment grows by appends until a prepared file is ready.
        let deadline = Instant::now() + Duration::from_secs(30);
        while log.stats().segments_prepared == 0 {
            assert!(Instant::now() < deadline, "no segment was prepared");
            submit(1);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(last.get() < 100, "prepared after {} frames", last.get());
        submit(100 - last.get());
        let stats = log.stats();
        // Most rolls find a prepared file (one that does not gets a growing segment, which
        // gives way at the first round after one is ready).
        assert!(stats.segments_prepared >= 2, "{stats:?}");
        // Sealed segments leave the page cache once the preparing thread takes them (before
        // anything reads them).
        #[cfg(target_os = "linux")]
        {
            let segments = list_segments(&dir).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            for s in &segments[..segments.len() - 1] {
                loop {
                    let cached = crate::io::resident_bytes(&s.path);
                    if matches!(cached, None | Some(0)) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "{cached:?} of {s:?}");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        let (seen, newest_len, newest_end) = read_back(&dir, payload);
        // The newest: a prepared file, zeros after its frames (the scan checked them), unless
        // its last write ran past the prepared size; else a growing one, its frames only.
        assert!(
            newest_len >= 4096 || newest_end == newest_len,
            "{newest_len} bytes, frames end at {newest_end}"
        );
        assert_eq!(seen, (1..=100).collect::<Vec<_>>());
        log.shutdown().unwrap();
        let newest = list_segments(&dir).unwrap().pop().unwrap();
        let bytes = std::fs::read(&newest.path).unwrap();
        let end =
            crate::segment::scan::<LogError>(&newest.path, &bytes, true, |_, _| Ok(())).unwrap();
        assert_eq!(
            (end.valid_len, end.torn),
            (bytes.len() as u64, None),
            "sealed at shutdown"
        );
        assert!(
            !prepared.exists(),
            "the prepared file is removed at shutdown"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Retired segments become spares (up to [`SPARES_MAX`], the rest are deleted) and the
    /// next segments are prepared over them: the same files (inodes), zeros where their old
    /// frames were, so every segment still reads back exactly its own frames. The spares
    /// outlive a shutdown; a log that opens without preparing removes them.
    #[test]
    fn retired_segments_are_kept_as_spares_the_next_segments_are_prepared_over() {
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("spare");
        let mut config = LogConfig::new(&dir);
        config.segment_bytes_max = 4096;
        config.prepare_segments = true;
        let log = Log::open(config, 0, |_| {}).unwrap();
        let spares = || -> Vec<u64> {
            (0..SPARES_MAX)
                .filter_map(|i| std::fs::metadata(spare_path(&dir, i)).ok())
                .map(|m| m.ino())
                .collect()
        };
        let acks = mpsc::channel();
        let payload = |seq: u64| {
            let mut p = seq.to_le_bytes().to_vec();
            p.resize(300, seq as u8);
            p
        };
        let last = std::cell::Cell::new(0u64);
        let submit_until = |done: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !done() {
                assert!(Instant::now() < deadline, "{:?}", log.stats());
                let seq = last.get() + 1;
                last.set(seq);
                let mut frame = Vec::new();
                frame::encode_into(&mut frame, &payload(seq)).unwrap();
                commit_fsync(&log, &frame, seq, &acks);
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        submit_until(&|| list_segments(&dir).unwrap().len() >= SPARES_MAX + 3);
        let before = list_segments(&dir).unwrap();
        let retire = SPARES_MAX + 1;
        let retired = log
            .retire_segments_before(before[retire].first_seq)
            .unwrap();
        assert_eq!(retired, retire, "{before:?}");
        let kept = spares();
        assert_eq!(kept.len(), SPARES_MAX, "the rest were deleted");
        for seg in &before[..retire] {
            assert!(!seg.path.exists(), "{seg:?} is retired");
        }
        assert_eq!(
            list_segments(&dir).unwrap()[0].first_seq,
            before[retire].first_seq
        );

        // The next prepared files are the spares, written over.
        submit_until(&|| spares().is_empty() && log.stats().segments_prepared >= 2);
        submit_until(&|| {
            let inodes: Vec<u64> = list_segments(&dir)
                .unwrap()
                .iter()
                .map(|s| std::fs::metadata(&s.path).unwrap().ino())
                .collect();
            kept.iter().all(|k| inodes.contains(k))
        });
        let (seen, _, _) = read_back(&dir, payload);
        let segments = list_segments(&dir).unwrap();
        assert_eq!(
            seen,
            (segments[0].first_seq..=last.get()).collect::<Vec<_>>()
        );
        // A second retirement keeps a spare again; it outlives the shutdown.
        log.retire_segments_before(segments[1].first_seq).unwrap();
        assert_eq!(spares().len(), 1);
        log.shutdown().unwrap();
        assert_eq!(spares().len(), 1, "kept for the next open");
        let reopened = Log::<TestWaiter>::open(LogConfig::new(&dir), last.get(), |_| {}).unwrap();
        assert!(
            spares().is_empty(),
            "removed by a log that does not prepare"
        );
        drop(reopened);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// After a crash the newest prepared segment ends in zeros; recovery keeps them and the
    /// reopened log writes over them from where the frames end (not after them), and seals
    /// the segment when it stops.
    #[test]
    fn a_reopened_log_writes_over_the_kept_zeros_from_where_the_frames_end() {
        reopened_log_writes_over_the_zeros("resume", Arc::new(RealFiles));
    }

    /// The same with direct I/O: the frames before the resume point in its block are
    /// written again with it, unchanged.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_reopened_direct_log_writes_over_the_kept_zeros_from_where_the_frames_end() {
        reopened_log_writes_over_the_zeros("resume-direct", Arc::new(crate::direct::DirectFiles));
    }

    fn reopened_log_writes_over_the_zeros(name: &str, files: Arc<dyn LogFileFactory>) {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = Vec::new();
        for seq in 1..=3u64 {
            bytes.extend_from_slice(&one_frame(seq));
        }
        let frames_end = bytes.len() as u64;
        bytes.resize(8192, 0);
        let path = segment_path(&dir, 1);
        std::fs::write(&path, &bytes).unwrap();
        let mut config = LogConfig::new(&dir);
        config.resume_newest_at = Some(frames_end);
        config.files = files;
        let log = Log::open(config, 3, |_| {}).unwrap();
        let acks = mpsc::channel();
        for seq in 4..=6u64 {
            commit_fsync(&log, &one_frame(seq), seq, &acks);
        }
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            8192,
            "written over the zeros, not appended"
        );
        log.shutdown().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut seqs = Vec::new();
        let end = crate::segment::scan::<LogError>(&path, &bytes, false, |_, p| {
            seqs.push(u64::from_le_bytes(p.try_into().unwrap()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(end.valid_len, bytes.len() as u64, "sealed at shutdown");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
