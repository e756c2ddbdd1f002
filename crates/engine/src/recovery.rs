//! Recovery: rebuild a [`Db`] from a data directory, and verify one offline.
//!
//! 1. Load the newest snapshot that passes every check (older ones are the fallback) —
//!    unless the log still starts at seq 1 and the changelog window would hold all of it
//!    anyway: then replaying the whole log is cheaper and builds the same state and window.
//! 2. Scan every segment, oldest first. Frames must carry consecutive seqs. Frames at or
//!    below the snapshot's seq only rebuild the changelog window; later ones are replayed.
//! 3. A torn tail of the newest segment is cut off (when repairing). Any other damage stops
//!    recovery with the file and byte offset.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_log::segment::{list_segments, truncate};
use sluice_log::snapshot::{list_snapshots, SnapshotReader};
use sluice_log::LogError;

use crate::changelog::{Changelog, Retention};
use crate::codec::{
    decode_commit, decode_commit_sharing, decode_snapshot_frame, SnapshotLoader, COUNTER_MAX,
};
use std::collections::HashMap;

use crate::db::{BulkLoad, Change, Commit, CommitBody, Db, Limits, ReplayBody};
use crate::schema::{ColumnDef, SchemaChange, TableSchema};
use crate::value::ColumnType;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("{path}: byte offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("{0}")]
    Inconsistent(String),
}

#[derive(Clone, Debug)]
pub struct RecoveryOptions {
    pub limits: Limits,
    pub retention: Retention,
    /// Truncate a torn tail (serve) or leave files untouched (check).
    pub repair: bool,
    /// Zeros from a frame boundary to the end of the newest segment (the unwritten end of a
    /// prepared segment) are kept, not cut, and not reported as a torn tail: the log goes on
    /// writing over them at [`Recovered::newest_zero_tail_at`] (`LogConfig::resume_newest_at`).
    /// Cutting them would cost a truncation and a full sync of the file — with the data a
    /// crash left unsynced in the page cache, 150–300 ms in the recovery bench.
    pub keep_zero_tail: bool,
}

pub struct Recovered {
    pub db: Db,
    /// The snapshot the state continues: loaded, or (see `whole_log`) covered by replaying
    /// the whole log instead.
    pub snapshot_seq: Option<u64>,
    /// The whole log was replayed instead of loading the snapshot at `snapshot_seq` (the
    /// changelog window would have covered the whole log anyway, so that was cheaper).
    pub whole_log: bool,
    /// Commits replayed from the log on top of the snapshot.
    pub replayed: u64,
    /// Log bytes (frames) of those commits: how much log the next snapshot would cover.
    pub replayed_bytes: u64,
    /// Frames read in all (including those only used for the changelog).
    pub frames_read: u64,
    pub segments: usize,
    pub torn_tail: Option<String>,
    /// With [`RecoveryOptions::keep_zero_tail`]: where the newest segment's frames end when
    /// only zeros follow them (kept in the file).
    pub newest_zero_tail_at: Option<u64>,
    /// Snapshots that failed their checks and were passed over, with the reason.
    pub skipped_snapshots: Vec<String>,
    pub duration: Duration,
    /// Where `duration` went.
    pub phases: RecoveryPhases,
}

/// Wall time of each part of recovery (they add up to about the whole: decoding overlaps
/// applying inside `window` and `replay`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecoveryPhases {
    /// Loading the snapshot (reading, checking, decoding, building tables).
    pub snapshot: Duration,
    /// Waiting for segments to be read and their frames and seq chain checked (pass 2's
    /// reader thread runs one segment ahead, so this is only what it does not hide).
    pub read_check: Duration,
    /// Decoding the commits at or before the snapshot into the changelog window.
    pub window: Duration,
    /// Decoding and applying the commits after the snapshot.
    pub replay: Duration,
    /// Building the tables whose rows were held back for a bulk build.
    pub build: Duration,
}

pub fn recover(dir: &Path, opts: &RecoveryOptions) -> Result<Recovered, RecoveryError> {
    recover_checking(dir, opts, SnapshotCheck::Alongside).map(|(recovered, _)| recovered)
}

/// As [`recover`], except that a snapshot the whole log replayed in place of is not checked
/// before this returns: it comes back as an [`UncheckedSnapshot`] for the caller to check
/// once it serves (the server does, on a thread of its own, and its snapshotter waits for
/// the verdict). The state is the same either way — the whole log built it — so only what
/// the caller may *keep* depends on the verdict: a damaged snapshot must not count as one of
/// the snapshots the log is retired against. Saves a read and a hash of the whole snapshot
/// (13.6 MiB at 100 K rows, ~2.5 ms of CPU beside the replay) from time-to-ready.
pub fn recover_checking_snapshot_later(
    dir: &Path,
    opts: &RecoveryOptions,
) -> Result<(Recovered, Option<UncheckedSnapshot>), RecoveryError> {
    recover_checking(dir, opts, SnapshotCheck::Later)
}

/// When the snapshot a whole-log replay stands in for is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SnapshotCheck {
    /// On a thread of its own while the log replays; a damaged one sends recovery the usual
    /// way, which passes it over and reports it.
    Alongside,
    /// By the caller, after recovery ([`recover_checking_snapshot_later`]).
    Later,
}

/// A snapshot recovery did not load because replaying the whole log was cheaper, and has not
/// checked yet ([`recover_checking_snapshot_later`]).
#[derive(Clone, Debug)]
pub struct UncheckedSnapshot {
    pub seq: u64,
    pub path: PathBuf,
}

impl UncheckedSnapshot {
    /// Whether it passes the checks that need no decoding (checksums, its seq, an end
    /// frame): what recovery would have checked before loading it.
    pub fn is_intact(&self) -> bool {
        snapshot_is_intact(&self.path, self.seq)
    }
}

fn recover_checking(
    dir: &Path,
    opts: &RecoveryOptions,
    when: SnapshotCheck,
) -> Result<(Recovered, Option<UncheckedSnapshot>), RecoveryError> {
    let mut torn_tail = None;
    if let Some((snapshot_seq, path)) = whole_log_replaces_snapshot(dir, opts)? {
        let (recovered, intact) = std::thread::scope(|scope| {
            let check = (when == SnapshotCheck::Alongside)
                .then(|| scope.spawn(|| snapshot_is_intact(&path, snapshot_seq)));
            let recovered = recover_from(dir, opts, Some(snapshot_seq));
            (recovered, check.map(|c| c.join().unwrap_or(false)))
        });
        match (recovered, intact) {
            (Ok(recovered), None) => {
                let unchecked = UncheckedSnapshot {
                    seq: snapshot_seq,
                    path,
                };
                return Ok((recovered, Some(unchecked)));
            }
            (Ok(recovered), Some(true)) => return Ok((recovered, None)),
            // A damaged snapshot: recover the usual way, which passes it over and reports
            // it (the torn tail this replay cut, if any, is reported all the same).
            (Ok(recovered), Some(false)) => torn_tail = recovered.torn_tail,
            // The log alone did not replay (damage the snapshot would have covered):
            // recover the usual way, which reports any damage that remains.
            (Err(e), _) => tracing::warn!(
                error = %e,
                "replaying the whole log instead of loading the snapshot failed; loading it"
            ),
        }
    }
    let mut recovered = recover_from(dir, opts, None)?;
    if recovered.torn_tail.is_none() {
        recovered.torn_tail = torn_tail;
    }
    Ok((recovered, None))
}

/// Whether the snapshot at `path` passes the checks that need no decoding — checksums, its
/// seq, an end frame. It stays the base of the next snapshot (and of deleting segments)
/// when the whole log is replayed in its place, so a damaged one must not.
fn snapshot_is_intact(path: &Path, snapshot_seq: u64) -> bool {
    // Streamed through one reused buffer: the file is never in memory whole.
    let Ok(mut reader) = SnapshotReader::open(path) else {
        return false;
    };
    let (mut buf, mut last_kind) = (Vec::new(), None);
    loop {
        match reader.next_frame(&mut buf) {
            Ok(Some(_)) => last_kind = buf.first().copied(),
            Ok(None) => break,
            Err(_) => return false,
        }
    }
    reader.seq == snapshot_seq && last_kind == Some(crate::codec::SNAP_END)
}

/// The seq of the newest snapshot if replaying the whole log costs less than loading that
/// snapshot: the log still starts at seq 1 and the changelog window would hold every
/// commit up to the snapshot anyway (so loading it would be followed by decoding the whole
/// log for the window). Replaying every commit from seq 1 builds the same state and the same
/// window — it is what recovery does when there is no snapshot. Decided from file names and
/// sizes (segment bytes bound the frames' payload bytes from above; for the newest segment,
/// which may be prepared, where its zeros begin: [`frames_end_estimate`]); the snapshot must
/// also pass [`snapshot_is_intact`], checked alongside the replay.
fn whole_log_replaces_snapshot(
    dir: &Path,
    opts: &RecoveryOptions,
) -> Result<Option<(u64, PathBuf)>, RecoveryError> {
    let snapshots = list_snapshots(dir)?;
    let Some((snapshot_seq, path)) = snapshots.last() else {
        return Ok(None);
    };
    let snapshot_seq = *snapshot_seq;
    let segments = list_segments(dir)?;
    if segments.first().is_none_or(|s| s.first_seq != 1)
        || snapshot_seq > opts.retention.commits_max as u64
    {
        return Ok(None);
    }
    let mut bytes = 0u64;
    for (i, seg) in segments.iter().enumerate() {
        let io = |source| LogError::Io {
            path: seg.path.clone(),
            source,
        };
        let mut len = std::fs::metadata(&seg.path).map_err(io)?.len();
        if i + 1 == segments.len() {
            len = frames_end_estimate(&seg.path, len).map_err(io)?;
        }
        bytes = bytes.saturating_add(len);
        if bytes > opts.retention.bytes_max as u64 {
            return Ok(None);
        }
    }
    Ok(Some((snapshot_seq, path.clone())))
}

/// Block size of [`frames_end_estimate`]'s search.
const ZERO_PROBE_BYTES: u64 = 4096;

/// Where the frames of the newest segment end, estimated from above without reading it
/// whole: a prepared segment (zeros written and synced ahead, then written over) is a
/// segment's full size long however few frames it holds, so its length says nothing. The
/// frames are followed by zeros; a binary search over [`ZERO_PROBE_BYTES`] blocks finds
/// the first all-zero one (a few reads). A payload holding a whole zero block can make it
/// stop early: it only steers [`whole_log_replaces_snapshot`]'s choice between two ways
/// to the same state, never what recovery reads.
fn frames_end_estimate(path: &Path, len: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let mut block = vec![0u8; ZERO_PROBE_BYTES as usize];
    let mut is_zero = |index: u64| -> std::io::Result<bool> {
        let at = index * ZERO_PROBE_BYTES;
        let n = (len - at).min(ZERO_PROBE_BYTES) as usize;
        file.read_exact_at(&mut block[..n], at)?;
        Ok(sluice_log::segment::all_zeros(&block[..n]))
    };
    // The first block of the all-zero end: blocks before `lo` hold data, `hi` is zero.
    let (mut lo, mut hi) = (0u64, len.div_ceil(ZERO_PROBE_BYTES));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if is_zero(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok((lo * ZERO_PROBE_BYTES).min(len))
}

/// Recovery from the newest snapshot that passes its checks and the log after it, or, with
/// `whole_log` (the seq of a snapshot [`whole_log_replaces_snapshot`] chose not to load),
/// from the whole log, counting as replayed only the commits after that snapshot.
fn recover_from(
    dir: &Path,
    opts: &RecoveryOptions,
    whole_log: Option<u64>,
) -> Result<Recovered, RecoveryError> {
    let started = Instant::now();
    let mut skipped_snapshots = Vec::new();
    let snapshots = if whole_log.is_some() {
        Vec::new()
    } else {
        list_snapshots(dir)?
    };
    let segments = list_segments(dir)?;
    let mut torn_tail = None;
    let mut newest_zero_tail_at = None;
    // Pass 1 for the newest snapshot runs on a thread of its own while the snapshot loads:
    // it needs only the snapshot's seq, which its file name gives. Used only if that very
    // snapshot loads (an older one, after it fails its checks, gets a pass 1 of its own).
    let newest_seq = snapshots.last().map(|(seq, _)| *seq);
    let (loaded, planned, snapshot_time) = std::thread::scope(|scope| {
        let segments = &segments;
        let planned = newest_seq.map(|seq| {
            let plan = scope.spawn(move || plan_window(segments, seq, opts));
            (seq, plan)
        });
        let mut loaded = None;
        for (_, path) in snapshots.into_iter().rev() {
            match load_snapshot(&path, opts) {
                Ok(db) => {
                    loaded = Some(db);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "passing over a snapshot that fails its checks");
                    skipped_snapshots.push(e.to_string());
                }
            }
        }
        let snapshot_time = started.elapsed();
        // Only the wait beyond the load counts as reading and checking: the rest was hidden.
        let t = Instant::now();
        let planned = planned.map(|(seq, plan)| {
            let plan = plan.join().expect("pass 1 does not panic");
            (
                seq,
                plan.map(|p| WindowPlan {
                    read_check: t.elapsed(),
                    ..p
                }),
            )
        });
        (loaded, planned, snapshot_time)
    });
    let mut phases = RecoveryPhases {
        snapshot: snapshot_time,
        ..RecoveryPhases::default()
    };
    let snapshot_seq = loaded.as_ref().map(|db: &Db| db.seq).or(whole_log);
    let mut db =
        loaded.unwrap_or_else(|| Db::new(opts.limits.clone(), Changelog::new(opts.retention)));
    // Commits up to here are in the state's base (a loaded or a replaced snapshot); those
    // after it count as replayed.
    let base_seq = snapshot_seq.unwrap_or(0);

    let mut window_start = db.seq + 1;
    if db.seq > 0 {
        let plan = match planned {
            Some((seq, plan)) if seq == db.seq => plan?,
            _ => plan_window(&segments, db.seq, opts)?,
        };
        window_start = plan.start;
        torn_tail = plan.torn_tail;
        phases.read_check += plan.read_check;
    }

    // Pass 2, segment by segment: check every frame and the seq chain (cutting a torn
    // tail), then decode on worker threads, in order, ahead of the single-threaded apply:
    // frames from `window_start` to the snapshot rebuild the changelog window, later ones
    // are replayed. An error while decoding or applying is reported only once every later
    // segment passed its checks too (damage found by the checks comes first, as it is the
    // likelier cause), so recovery reports what a check-everything-first pass would.
    // Reading and checking run one piece of a segment ahead on a thread of their own (two
    // buffers of about `SEGMENT_PIECE_BYTES` take turns), so the next piece's read overlaps
    // this one's decode and apply.
    let threads = decode_threads();
    let mut frames_read = 0u64;
    let mut replayed = 0u64;
    let mut replayed_bytes = 0u64;
    let mut changelog_started = false;
    let mut window = WindowSchemas::default();
    let mut bulk = BulkLoad::default();
    let mut failed: Option<RecoveryError> = None;
    let chain_prev = std::thread::scope(|scope| -> Result<Option<u64>, RecoveryError> {
        let (to_main, from_reader) =
            std::sync::mpsc::sync_channel::<Result<ScannedPiece, RecoveryError>>(SEGMENT_BUFFERS);
        let (to_reader, spare_buffers) = std::sync::mpsc::channel::<Vec<u8>>();
        for _ in 0..SEGMENT_BUFFERS {
            to_reader.send(Vec::new()).expect("the receiver is here");
        }
        let segments = &segments;
        let mut chain = SeqChain::new(db.seq);
        let reader = scope.spawn(move || {
            let mut pieces = PieceSizes::growing(FIRST_PIECE_BYTES, SEGMENT_PIECE_BYTES);
            for i in 0..segments.len() {
                let scanned = scan_segment(
                    segments,
                    i,
                    &mut chain,
                    opts,
                    &mut pieces,
                    // No buffer comes back once recovery stopped.
                    || spare_buffers.recv().ok(),
                    |piece| to_main.send(Ok(piece)).ok().map(|()| None),
                );
                match scanned {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        let _ = to_main.send(Err(e));
                        break;
                    }
                }
            }
            chain.prev
        });
        loop {
            let t = Instant::now();
            // Closed once the reader sent every piece (or its first error).
            let Ok(scanned) = from_reader.recv() else {
                break;
            };
            let scanned = scanned?;
            phases.read_check += t.elapsed();
            let ScannedPiece {
                seg,
                buf,
                frames,
                torn: end,
                zero_tail_at,
            } = scanned;
            let seg = &segments[seg];
            if let Some(torn) = end {
                torn_tail = Some(torn);
            }
            if zero_tail_at.is_some() {
                newest_zero_tail_at = zero_tail_at;
            }
            frames_read += frames.len() as u64;
            if failed.is_some() {
                let _ = to_reader.send(buf);
                continue;
            }
            let first_wanted = frames.partition_point(|f| f.seq < window_start);
            let first_replayed = frames.partition_point(|f| f.seq <= db.seq);
            let corrupt = |f: &FrameRef, reason: String| RecoveryError::Corrupt {
                path: seg.path.clone(),
                offset: f.offset,
                reason,
            };
            let bytes = &buf[..];
            // The window: decoded against the loaded state (rows it holds are shared, not
            // copied), pushed to the changelog in order.
            let window_frames = &frames[first_wanted.min(first_replayed)..first_replayed];
            let tables = &db.tables;
            let changelog = &mut db.changelog;
            let t = Instant::now();
            let applied = decode_in_order(
                window_frames,
                REPLAY_DECODE_BATCH_FRAMES,
                threads,
                |f| decode_commit_sharing(&bytes[f.payload.clone()], tables),
                |f, decoded| {
                    let (seq, body) = decoded.map_err(|r| corrupt(f, r))?;
                    if !changelog_started {
                        changelog.reset_to(seq - 1);
                        changelog_started = true;
                    }
                    changelog.push(Arc::new(window.rebuild(tables, seq, body)));
                    Ok(())
                },
            )
            .and_then(|()| {
                phases.window += t.elapsed();
                let t = Instant::now();
                let replay = decode_in_order(
                    &frames[first_replayed.max(first_wanted)..],
                    REPLAY_DECODE_BATCH_FRAMES,
                    threads,
                    |f| decode_commit(&bytes[f.payload.clone()]),
                    |f, decoded| {
                        let (seq, body) = decoded.map_err(|r| corrupt(f, r))?;
                        if !changelog_started {
                            db.changelog.reset_to(seq - 1);
                            changelog_started = true;
                        }
                        db.replay_bulk(seq, body, &mut bulk)
                            .map_err(|r| corrupt(f, r))?;
                        if seq > base_seq {
                            replayed += 1;
                            replayed_bytes +=
                                (f.payload.len() + sluice_log::frame::FRAME_HEADER_BYTES) as u64;
                        }
                        Ok(())
                    },
                );
                phases.replay += t.elapsed();
                replay
            });
            if let Err(e) = applied {
                failed = Some(e);
            }
            // Back to the reader (which has stopped if this was the last segment).
            let _ = to_reader.send(buf);
        }
        drop(to_reader);
        Ok(reader.join().expect("the segment reader does not panic"))
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let t = Instant::now();
    db.finish_bulk(&mut bulk);
    phases.build = t.elapsed();
    if let Some(last) = chain_prev {
        if last < base_seq.max(db.seq) {
            return Err(RecoveryError::Inconsistent(format!(
                "the log ends at seq {last}, before the snapshot's seq {}",
                base_seq.max(db.seq)
            )));
        }
    }
    if !changelog_started {
        db.changelog.reset_to(db.seq);
    }
    Ok(Recovered {
        db,
        snapshot_seq,
        whole_log: whole_log.is_some(),
        replayed,
        replayed_bytes,
        frames_read,
        segments: segments.len(),
        torn_tail,
        newest_zero_tail_at,
        skipped_snapshots,
        duration: started.elapsed(),
        phases,
    })
}

/// Where the changelog window starts after a snapshot at `state_seq` (pass 1 of recovery).
struct WindowPlan {
    /// The first commit at or before the snapshot that the window keeps.
    start: u64,
    torn_tail: Option<String>,
    /// Time spent reading and checking that recovery waited for.
    read_check: Duration,
}

/// Pass 1 (only with a snapshot): frames at or before the snapshot only feed the changelog
/// window, and decoding those its retention would drop anyway is wasted (frame size stands
/// in for entry size). Checks the segments up to the first frame past the snapshot to learn
/// the sizes of the frames at or before it, and keeps the newest that retention holds.
fn plan_window(
    segments: &[sluice_log::segment::SegmentFile],
    state_seq: u64,
    opts: &RecoveryOptions,
) -> Result<WindowPlan, RecoveryError> {
    let started = Instant::now();
    let mut torn_tail = None;
    let mut chain = SeqChain::new(state_seq);
    let mut before: Vec<(u64, usize)> = Vec::new();
    // Only frame lengths and seqs are kept, so one small buffer serves every piece of every
    // segment: it stays in the cache, and it is the only fresh memory this pass touches
    // (it runs beside the snapshot's load, which faults in a whole table's worth).
    let buffer = std::cell::Cell::new(Vec::with_capacity(PLAN_PIECE_BYTES));
    for i in 0..segments.len() {
        scan_segment(
            segments,
            i,
            &mut chain,
            opts,
            &mut PieceSizes::fixed(PLAN_PIECE_BYTES),
            || Some(buffer.take()),
            |piece| {
                for f in &piece.frames {
                    if f.seq <= state_seq {
                        before.push((f.seq, f.payload.len()));
                    }
                }
                if piece.torn.is_some() {
                    torn_tail = piece.torn;
                }
                buffer.set(piece.buf);
                Some(None)
            },
        )?;
        if chain.prev.is_some_and(|p| p > state_seq) {
            break;
        }
    }
    let retention = opts.retention;
    let (mut count, mut bytes) = (0usize, 0usize);
    let mut start = state_seq.saturating_add(1);
    for &(seq, len) in before.iter().rev() {
        count += 1;
        bytes += len;
        if count > retention.commits_max || (bytes > retention.bytes_max && count > 1) {
            break;
        }
        start = seq;
    }
    Ok(WindowPlan {
        start,
        torn_tail,
        read_check: started.elapsed(),
    })
}

/// The seq chain across segments: consecutive seqs, starting no later than just after the
/// state's seq.
struct SeqChain {
    state_seq: u64,
    prev: Option<u64>,
}

impl SeqChain {
    fn new(state_seq: u64) -> Self {
        SeqChain {
            state_seq,
            prev: None,
        }
    }

    fn next(&mut self, seq: u64) -> Result<(), String> {
        match self.prev {
            Some(prev) if prev.checked_add(1) != Some(seq) => {
                return Err(format!("seq {seq} follows seq {prev}"));
            }
            None if seq > self.state_seq.saturating_add(1) => {
                return Err(format!(
                    "the log starts at seq {seq} but the state is at seq {}: commits are missing",
                    self.state_seq
                ));
            }
            _ => {}
        }
        self.prev = Some(seq);
        Ok(())
    }
}

/// Reads segment `segments[index]` piece by piece — `pieces` says how many bytes each
/// ([`PieceSizes`]), more for a larger frame — and checks every frame
/// (checksums, seq chain) with the verdicts `segment::scan` gives on the whole file; cuts a
/// torn tail of the newest (last) segment when repairing. Each piece's buffer comes from
/// `next_buf` (`None`: stop) and goes with its whole frames to `emit`, which hands it back
/// for the next piece, keeps it (`Some(None)`) or stops recovery (`None`). Returns whether
/// the whole segment was read.
///
/// Why pieces: whole segments (64 MiB each) took two or three 64 MiB buffers of fresh
/// memory — each page zeroed by the kernel on first touch, ~17 % of recovery's CPU at 1 M
/// rows with a snapshot — where two pieces' buffers (16 MiB) do.
fn scan_segment(
    segments: &[sluice_log::segment::SegmentFile],
    index: usize,
    chain: &mut SeqChain,
    opts: &RecoveryOptions,
    pieces: &mut PieceSizes,
    mut next_buf: impl FnMut() -> Option<Vec<u8>>,
    mut emit: impl FnMut(ScannedPiece) -> Option<Option<Vec<u8>>>,
) -> Result<bool, RecoveryError> {
    use std::io::Read;
    let (seg, is_newest) = (&segments[index], index + 1 == segments.len());
    let io = |source| LogError::Io {
        path: seg.path.clone(),
        source,
    };
    let mut file = std::fs::File::open(&seg.path).map_err(io)?;
    // File offset of the piece's first byte; the start of a frame cut by the last piece.
    let mut base = 0u64;
    let mut carry: Vec<u8> = Vec::new();
    let mut spare: Option<Vec<u8>> = None;
    loop {
        let Some(mut buf) = spare.take().or_else(&mut next_buf) else {
            return Ok(false);
        };
        buf.clear();
        // At least one byte more than the carried part of a frame, and the whole frame.
        let want = whole_frame_len(&carry).max(carry.len() + pieces.next_piece());
        // Room for the whole piece at once: `read_to_end` would otherwise grow the buffer
        // by doubling, copying it and faulting in fresh pages at each step. A buffer too
        // small for the piece is replaced, not grown: growing would copy its whole old
        // capacity (the allocator cannot know it was cleared).
        if buf.capacity() < want {
            drop(std::mem::take(&mut buf));
            buf = Vec::with_capacity(want);
        }
        buf.extend_from_slice(&carry);
        let mut eof = false;
        while buf.len() < want {
            let had = buf.len();
            (&mut file)
                .take((want - had) as u64)
                .read_to_end(&mut buf)
                .map_err(io)?;
            if buf.len() == had {
                eof = true;
                break;
            }
        }
        carry.clear();
        let mut frames = Vec::new();
        let mut pos = 0usize;
        let mut on_frame = |offset: u64, payload_len: usize| {
            let start = (offset - base) as usize + sluice_log::frame::FRAME_HEADER_BYTES;
            let payload = &buf[start..start + payload_len];
            let corrupt = |reason: String| RecoveryError::Corrupt {
                path: seg.path.clone(),
                offset,
                reason,
            };
            let seq = peek_seq(payload).map_err(&corrupt)?;
            chain.next(seq).map_err(&corrupt)?;
            frames.push(FrameRef {
                offset,
                payload: start..start + payload_len,
                seq,
            });
            Ok::<(), RecoveryError>(())
        };
        // `Some(torn)`: the segment ended here (`torn` says whether with a torn tail).
        let mut ended: Option<Option<String>> = None;
        // Where a run of zeros starts that may reach the newest segment's end.
        let mut zero_run_at: Option<usize> = None;
        loop {
            match sluice_log::frame::decode(&buf, pos) {
                sluice_log::frame::Decoded::Frame { payload, next } => {
                    on_frame(base + pos as u64, payload.len())?;
                    pos = next;
                }
                sluice_log::frame::Decoded::End if !eof => break,
                sluice_log::frame::Decoded::End => {
                    ended = Some(None);
                    break;
                }
                sluice_log::frame::Decoded::Truncated if !eof => {
                    carry.extend_from_slice(&buf[pos..]);
                    break;
                }
                _ => {
                    // Zeros from a frame boundary to the end of the newest segment — the
                    // unwritten end of a prepared segment, mostly — need not be read into
                    // memory to be judged: streamed through a small buffer, after the
                    // frames before them went to be applied (below).
                    if is_newest && sluice_log::segment::all_zeros(&buf[pos..]) {
                        zero_run_at = Some(pos);
                        break;
                    }
                    // Damage or a torn tail: judged as a scan of the whole file would,
                    // with the rest of the file in view (trailing zeros tell a torn tail).
                    if !eof {
                        file.read_to_end(&mut buf).map_err(io)?;
                    }
                    ended = Some(judge_damage(
                        seg,
                        &buf[pos..],
                        base + pos as u64,
                        is_newest,
                        opts,
                    )?);
                    break;
                }
            }
        }
        if let Some(pos) = zero_run_at {
            // The frames before the zeros are checked: they are applied while the rest of
            // the file is judged here (50 MiB of a prepared segment's zeros take a few ms
            // to read even from the page cache).
            let valid_len = base + pos as u64;
            let zeros_in_piece = (buf.len() - pos) as u64;
            if !frames.is_empty() {
                let piece = ScannedPiece {
                    seg: index,
                    buf,
                    frames,
                    torn: None,
                    zero_tail_at: None,
                };
                if emit(piece).is_none() {
                    return Ok(false);
                }
            }
            let (torn, zero_tail_at) =
                judge_zero_run(seg, &mut file, valid_len, zeros_in_piece, eof, opts)?;
            if torn.is_some() || zero_tail_at.is_some() {
                let last = ScannedPiece {
                    seg: index,
                    buf: Vec::new(),
                    frames: Vec::new(),
                    torn,
                    zero_tail_at,
                };
                if emit(last).is_none() {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        let piece_len = pos;
        let (frames_empty, torn) = (frames.is_empty(), ended.clone().flatten());
        if frames_empty && torn.is_none() {
            spare = Some(buf);
        } else {
            match emit(ScannedPiece {
                seg: index,
                buf,
                frames,
                torn,
                zero_tail_at: None,
            }) {
                None => return Ok(false),
                Some(back) => spare = back,
            }
        }
        if ended.is_some() {
            return Ok(true);
        }
        base += piece_len as u64;
    }
}

/// Judges the newest segment from `valid_len` (a frame boundary followed by zeros for the
/// `zeros_in_piece` bytes read so far; `file` is positioned after them, at its end if
/// `eof`) as a scan of the whole file would: zeros to the end are the prepared segment's
/// unwritten part (kept with [`RecoveryOptions::keep_zero_tail`], else a torn tail, cut
/// with `repair`); anything else is judged with the rest of the file in view. Returns
/// the torn tail found, if any, and where the kept zeros start.
fn judge_zero_run(
    seg: &sluice_log::segment::SegmentFile,
    file: &mut std::fs::File,
    valid_len: u64,
    zeros_in_piece: u64,
    eof: bool,
    opts: &RecoveryOptions,
) -> Result<(Option<String>, Option<u64>), RecoveryError> {
    use std::io::{Read, Seek};
    let io = |source| LogError::Io {
        path: seg.path.clone(),
        source,
    };
    let rest = if eof {
        Some(0)
    } else {
        zeros_to_end(file).map_err(io)?
    };
    if let Some(rest) = rest {
        if opts.keep_zero_tail {
            return Ok((None, Some(valid_len)));
        }
        let torn = sluice_log::segment::torn_tail_message(
            &seg.path,
            valid_len,
            sluice_log::segment::ZERO_TAIL_REASON,
            zeros_in_piece + rest,
        );
        tracing::warn!("{torn}");
        if opts.repair {
            truncate(&seg.path, valid_len)?;
        }
        return Ok((Some(torn), None));
    }
    // Not zeros all the way: damage or a torn tail, judged with the rest in view.
    file.seek(std::io::SeekFrom::Start(valid_len)).map_err(io)?;
    let mut rest = Vec::new();
    file.read_to_end(&mut rest).map_err(io)?;
    Ok((judge_damage(seg, &rest, valid_len, true, opts)?, None))
}

/// Judges `bytes` (the rest of a segment from file offset `at`, where a frame failed its
/// checks) as a scan of the whole file would: the torn tail it cut (warned of, and cut with
/// `repair`), or the damage as an error.
fn judge_damage(
    seg: &sluice_log::segment::SegmentFile,
    bytes: &[u8],
    at: u64,
    is_newest: bool,
    opts: &RecoveryOptions,
) -> Result<Option<String>, RecoveryError> {
    let mut rest_frames = 0usize;
    let end = sluice_log::segment::scan_at(&seg.path, bytes, at, is_newest, |_, _| {
        rest_frames += 1;
        Ok::<(), RecoveryError>(())
    })?;
    // The frame at `at` failed its checks, so the scan stops right there.
    assert_eq!(rest_frames, 0, "frame::decode judges alike twice");
    let torn = end.torn.inspect(|torn| tracing::warn!("{torn}"));
    if torn.is_some() && opts.repair {
        truncate(&seg.path, end.valid_len)?;
    }
    Ok(torn)
}

/// Reads `file` from its position to its end through a small buffer: the number of bytes
/// read if every one is zero, else `None` (the position is then wherever reading stopped).
fn zeros_to_end(file: &mut std::fs::File) -> std::io::Result<Option<u64>> {
    use std::io::Read;
    let mut chunk = vec![0u8; ZERO_CHECK_CHUNK_BYTES];
    let mut read = 0u64;
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => return Ok(Some(read)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if !sluice_log::segment::all_zeros(&chunk[..n]) {
            return Ok(None);
        }
        read += n as u64;
    }
}

/// Bytes read at a time by [`zeros_to_end`].
const ZERO_CHECK_CHUNK_BYTES: usize = 1 << 20;

/// Bytes of the whole frame whose start `head` holds, if its header is whole and sane.
fn whole_frame_len(head: &[u8]) -> usize {
    use sluice_log::frame::{FRAME_HEADER_BYTES, FRAME_PAYLOAD_BYTES_MAX};
    let Some(header) = head.get(..8) else {
        return 0;
    };
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let len_inv = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    if len != !len_inv || len as usize > FRAME_PAYLOAD_BYTES_MAX {
        return 0;
    }
    FRAME_HEADER_BYTES + len as usize
}

/// Threads that decode frames while the calling thread applies them.
fn decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, DECODE_THREADS_MAX))
}

/// Decodes `items` with `decode` on `threads` worker threads, a batch at a time, and hands
/// each result to `apply` in order on the calling thread. Stops at `apply`'s first error.
fn decode_in_order<I: Sync, T: Send, E>(
    items: &[I],
    batch: usize,
    threads: usize,
    decode: impl Fn(&I) -> T + Sync,
    mut apply: impl FnMut(&I, T) -> Result<(), E>,
) -> Result<(), E> {
    if items.is_empty() {
        return Ok(());
    }
    let batches: Vec<&[I]> = items.chunks(batch.max(1)).collect();
    let threads = threads.clamp(1, batches.len());
    let decode = &decode;
    std::thread::scope(|scope| {
        let mut from_workers = Vec::with_capacity(threads);
        for w in 0..threads {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<T>>(REPLAY_DECODE_BATCHES_AHEAD);
            from_workers.push(rx);
            let batches = &batches;
            scope.spawn(move || {
                // Worker `w` takes batches w, w + threads, w + 2·threads, …
                for batch in batches.iter().skip(w).step_by(threads) {
                    if tx.send(batch.iter().map(decode).collect()).is_err() {
                        return; // the applier stopped on an error
                    }
                }
            });
        }
        for (i, batch) in batches.iter().enumerate() {
            let decoded = from_workers[i % threads]
                .recv()
                .expect("a decoding worker sends every batch it is given");
            for (item, d) in batch.iter().zip(decoded) {
                apply(item, d)?;
            }
        }
        Ok(())
    })
}

fn load_snapshot(path: &Path, opts: &RecoveryOptions) -> Result<Db, RecoveryError> {
    let reader = SnapshotReader::open(path)?;
    if reader.seq > COUNTER_MAX {
        return Err(RecoveryError::Corrupt {
            path: path.to_path_buf(),
            offset: sluice_log::snapshot::SNAPSHOT_MAGIC.len() as u64,
            reason: format!("implausible snapshot seq {}", reader.seq),
        });
    }
    let seq = reader.seq;
    let mut db = Db::new(opts.limits.clone(), Changelog::new(opts.retention));
    let mut loader = SnapshotLoader::new();
    let mut last_offset = 0;
    let corrupt = |offset: u64, reason: String| RecoveryError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    // Frames (~1 MiB of rows each) are read and checked on one thread, decoded on worker
    // threads and applied (the tables built) on this one, all at once: the file is never
    // in memory whole.
    stream_in_order(
        reader,
        decode_threads(),
        decode_snapshot_frame,
        |offset, decoded| {
            last_offset = offset;
            let frame = decoded.map_err(|r| corrupt(offset, r))?;
            loader.apply(&mut db, frame).map_err(|r| corrupt(offset, r))
        },
    )?;
    if !loader.finished() {
        return Err(RecoveryError::Corrupt {
            path: path.to_path_buf(),
            offset: last_offset,
            reason: "snapshot has no end frame".into(),
        });
    }
    db.seq = seq;
    db.changelog.reset_to(seq);
    Ok(db)
}

/// Reads the frames of `reader` on a thread of its own, decodes them with `decode` on
/// `threads` worker threads (frame `i` on worker `i % threads`, so results come back in
/// order without reordering) and hands each to `apply` in file order on the calling thread.
///
/// Errors come in the order a check-everything-first pass would report them (what
/// `SnapshotFile::read` then decoding did): after `apply`'s first error the rest of the
/// file is still read and checked, and damage found there is the error.
fn stream_in_order<R: std::io::Read + Send, T: Send>(
    mut reader: SnapshotReader<R>,
    threads: usize,
    decode: impl Fn(&[u8]) -> T + Sync,
    mut apply: impl FnMut(u64, T) -> Result<(), RecoveryError>,
) -> Result<(), RecoveryError> {
    type Read = Result<(u64, Vec<u8>), LogError>;
    let threads = threads.max(1);
    let decode = &decode;
    std::thread::scope(|scope| {
        // Payload buffers go back to the reader once decoded (at most a few per thread).
        let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let mut to_workers = Vec::with_capacity(threads);
        let mut from_workers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Read>(SNAPSHOT_FRAMES_AHEAD);
            let (out_tx, out_rx) =
                std::sync::mpsc::sync_channel::<Result<(u64, T), LogError>>(SNAPSHOT_FRAMES_AHEAD);
            to_workers.push(tx);
            from_workers.push(out_rx);
            let spare_tx = spare_tx.clone();
            scope.spawn(move || {
                for read in rx {
                    let out = read.map(|(offset, payload)| {
                        let decoded = decode(&payload);
                        let _ = spare_tx.send(payload);
                        (offset, decoded)
                    });
                    if out_tx.send(out).is_err() {
                        return;
                    }
                }
            });
        }
        drop(spare_tx);
        scope.spawn(move || {
            for i in 0.. {
                let mut buf = spare_rx.try_recv().unwrap_or_default();
                let read = match reader.next_frame(&mut buf) {
                    Ok(Some(offset)) => Ok((offset, buf)),
                    Ok(None) => return,
                    Err(e) => Err(e),
                };
                let stop = read.is_err();
                if to_workers[i % threads].send(read).is_err() || stop {
                    return;
                }
            }
        });
        let mut failed = None;
        for i in 0.. {
            // Closed: the reader reached the end (or stopped at damage already returned).
            let Ok(out) = from_workers[i % threads].recv() else {
                break;
            };
            let (offset, decoded) = out?;
            // After a failed apply the rest is only checked (decoded frames are dropped).
            if failed.is_none() {
                if let Err(e) = apply(offset, decoded) {
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    })
}

/// Snapshot frames (~1 MiB each) each decoding thread may hold read or decoded ahead.
const SNAPSHOT_FRAMES_AHEAD: usize = 2;

/// Frames decoded per batch handed from a decoding thread to the applying one.
const REPLAY_DECODE_BATCH_FRAMES: usize = 32;
/// Batches each decoding thread may run ahead (bounds the memory of decoded commits).
const REPLAY_DECODE_BATCHES_AHEAD: usize = 4;
/// Most threads decoding frames at once.
const DECODE_THREADS_MAX: usize = 4;

/// Piece buffers the reader and the decoders take turns with: the reader fills one while
/// the other's frames are decoded and applied (two pieces in memory at most).
const SEGMENT_BUFFERS: usize = 2;

/// Bytes of a segment read at a time (see [`scan_segment`]), once the pieces have grown.
const SEGMENT_PIECE_BYTES: usize = 16 << 20;

/// Bytes of recovery's first piece; each next one is twice as large, up to
/// [`SEGMENT_PIECE_BYTES`]. Why: decoding starts when the first piece is read and checked,
/// so a first piece of 16 MiB made a 100 K-record log (14 MiB) wait 12–18 ms for its whole
/// read before any decoding, on top of the decoding itself; a small first piece starts
/// the decoders after ~1 MiB and the reader keeps a piece ahead of them from there.
const FIRST_PIECE_BYTES: usize = 1 << 20;

/// How many bytes [`scan_segment`] reads per piece: fixed, or growing by doubling (one
/// sequence across every segment a pass reads).
struct PieceSizes {
    next: usize,
    max: usize,
}

impl PieceSizes {
    fn fixed(bytes: usize) -> PieceSizes {
        PieceSizes::growing(bytes, bytes)
    }

    fn growing(first: usize, max: usize) -> PieceSizes {
        assert!(0 < first && first <= max, "piece sizes {first} .. {max}");
        PieceSizes { next: first, max }
    }

    fn next_piece(&mut self) -> usize {
        let bytes = self.next;
        self.next = (bytes * 2).min(self.max);
        bytes
    }
}

/// Bytes read at a time by [`plan_window`], which keeps no frame: small enough to stay in
/// the cache, large enough that a read costs little per byte.
const PLAN_PIECE_BYTES: usize = 1 << 20;

/// A piece of a segment read and checked by the reader thread of [`recover_from`]: whole
/// frames only (a frame the piece's end cuts starts the next piece).
struct ScannedPiece {
    /// Index of its segment.
    seg: usize,
    buf: Vec<u8>,
    /// Offsets in the file, payload ranges in `buf`.
    frames: Vec<FrameRef>,
    /// The torn tail it cut, if any (only the newest segment's last piece may have one).
    torn: Option<String>,
    /// Where the newest segment's frames end if only zeros follow them and they are kept
    /// ([`RecoveryOptions::keep_zero_tail`]).
    zero_tail_at: Option<u64>,
}

/// Where a checked frame lies in its segment.
struct FrameRef {
    offset: u64,
    payload: std::ops::Range<usize>,
    seq: u64,
}

/// The seq of a commit record without decoding the rest (kind byte, then u64 seq).
/// Seqs start at 1 (0 is the empty state), so a record claiming seq 0 is damaged.
fn peek_seq(payload: &[u8]) -> Result<u64, String> {
    match payload.get(1..9) {
        Some(b) if b == [0; 8] => Err("commit record with seq 0 (seqs start at 1)".into()),
        Some(b) if u64::from_le_bytes(b.try_into().expect("8 bytes")) > COUNTER_MAX => {
            Err("commit record with an implausible seq".into())
        }
        Some(b)
            if matches!(
                payload[0],
                crate::codec::RECORD_ROWS
                    | crate::codec::RECORD_SCHEMA
                    | crate::codec::RECORD_TX
                    | crate::codec::RECORD_TOPIC
                    | crate::codec::RECORD_ROWS_PACKED
                    | crate::codec::RECORD_TX_PACKED
            ) =>
        {
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
        _ => Err("not a commit record".into()),
    }
}

type Tables = std::collections::BTreeMap<String, crate::table::Table>;

/// Schemas for commits from before the snapshot, which are rebuilt only for the changelog
/// window. The schema a row was written under is found, in order: from DDL seen earlier in
/// the window; from the snapshot's schema, cut to the row's width (ADD COLUMN only appends,
/// so a narrower row was written under a prefix of today's columns); or, for a table dropped
/// before the snapshot and created before the window, generic column names `c0, c1, …`.
#[derive(Default)]
struct WindowSchemas {
    seen: HashMap<String, Arc<TableSchema>>,
    cut: HashMap<(String, usize), Arc<TableSchema>>,
}

impl WindowSchemas {
    fn schema_change(&mut self, change: &SchemaChange) {
        match change {
            SchemaChange::CreateTable { schema, .. } => {
                self.seen
                    .insert(schema.name.clone(), Arc::new(schema.clone()));
            }
            SchemaChange::AddColumn { table, column } => {
                if let Some(s) = self.seen.get_mut(table) {
                    Arc::make_mut(s).columns.push(column.clone());
                }
            }
            SchemaChange::DropTable { name, .. } => {
                self.seen.remove(name);
            }
            SchemaChange::CreateIndex { .. }
            | SchemaChange::CreatePolicy { .. }
            | SchemaChange::DropPolicy { .. } => {}
        }
    }

    fn resolve(&mut self, tables: &Tables, table: &str, width: Option<usize>) -> Arc<TableSchema> {
        let fits = |s: &TableSchema| width.is_none_or(|w| s.columns.len() == w);
        if let Some(s) = self.seen.get(table).filter(|s| fits(s)) {
            return s.clone();
        }
        let current = tables.get(table).map(|t| t.schema.clone());
        if let Some(s) = current.as_ref().filter(|s| fits(s)) {
            return s.clone();
        }
        let width = width.unwrap_or(1);
        self.cut
            .entry((table.to_string(), width))
            .or_insert_with(|| {
                let mut schema = match current {
                    Some(s) if s.columns.len() > width && s.pk < width => (*s).clone(),
                    _ => generic_schema(table, width),
                };
                schema.columns.truncate(width);
                schema.indexes.clear();
                Arc::new(schema)
            })
            .clone()
    }

    fn rebuild(&mut self, tables: &Tables, seq: u64, body: ReplayBody) -> Commit {
        let body = match body {
            ReplayBody::Schema { changes, sql } => {
                for c in &changes {
                    self.schema_change(c);
                }
                CommitBody::Schema { changes, sql }
            }
            ReplayBody::Rows(rows) => CommitBody::Rows(self.changes(tables, rows)),
            ReplayBody::Tx { rows, appends } => {
                let body = CommitBody::Rows(self.changes(tables, rows));
                return Commit { seq, body, appends };
            }
            ReplayBody::Topic(change) => CommitBody::Topic(change),
        };
        Commit {
            seq,
            body,
            appends: Vec::new(),
        }
    }

    fn changes(&mut self, tables: &Tables, rows: Vec<crate::db::ReplayRow>) -> Vec<Change> {
        // Rows of one commit mostly name one table at one width: resolved once.
        let mut last: Option<(Arc<str>, Option<usize>, Arc<TableSchema>)> = None;
        rows.into_iter()
            .map(|r| {
                let width = r.values.as_ref().map(|v| v.len());
                let table = match &last {
                    Some((name, w, schema)) if Arc::ptr_eq(name, &r.table) && *w == width => {
                        schema.clone()
                    }
                    _ => {
                        let schema = self.resolve(tables, &r.table, width);
                        last = Some((r.table.clone(), width, schema.clone()));
                        schema
                    }
                };
                Change {
                    table,
                    op: r.op,
                    key: r.key,
                    row: r.values,
                    old: None,
                    version: r.version,
                }
            })
            .collect()
    }
}

fn generic_schema(table: &str, width: usize) -> TableSchema {
    TableSchema {
        name: table.to_string(),
        columns: (0..width)
            .map(|i| ColumnDef {
                name: format!("c{i}"),
                ty: ColumnType::Text,
                not_null: false,
                default: None,
            })
            .collect(),
        pk: 0,
        indexes: Vec::new(),
    }
}

/// What `sluice check` found.
#[derive(Debug)]
pub struct CheckReport {
    pub snapshots: usize,
    pub segments: usize,
    pub frames: u64,
    pub seq: u64,
    pub torn_tail: Option<String>,
}

/// Verifies every snapshot and segment in `dir` without changing anything. The first
/// damaged file is the error, with its byte offset.
pub fn check(dir: &Path) -> Result<CheckReport, RecoveryError> {
    if !dir.is_dir() {
        return Err(RecoveryError::Inconsistent(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let opts = RecoveryOptions {
        limits: Limits {
            row_bytes_max: usize::MAX,
            columns_per_table_max: usize::MAX,
            commit_bytes_max: usize::MAX,
            topics_max: usize::MAX,
            record_bytes_max: usize::MAX,
            ..Limits::default()
        },
        retention: Retention {
            commits_max: 1,
            bytes_max: 0,
        },
        repair: false,
        keep_zero_tail: false,
    };
    let snapshots = list_snapshots(dir)?;
    for (_, path) in &snapshots {
        load_snapshot(path, &opts)?;
    }
    let recovered = recover(dir, &opts)?;
    Ok(CheckReport {
        snapshots: snapshots.len(),
        segments: recovered.segments,
        frames: recovered.frames_read,
        seq: recovered.db.seq,
        torn_tail: recovered.torn_tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::Retention;

    /// A commit record's bytes as far as the scan reads them: kind, seq, then filler.
    fn record(seq: u64, filler: usize) -> Vec<u8> {
        let mut p = vec![crate::codec::RECORD_ROWS];
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend((0..filler).map(|i| (i * 7 + seq as usize) as u8));
        p
    }

    /// What a scan found: each frame (offset, seq, payload) and the verdict.
    type Outcome = (Vec<(u64, u64, Vec<u8>)>, Result<Option<String>, String>);

    /// The whole file scanned at once (what recovery did before it read pieces).
    fn whole(path: &Path, is_newest: bool) -> Outcome {
        let bytes = std::fs::read(path).unwrap();
        let mut chain = SeqChain::new(0);
        let mut frames = Vec::new();
        let end = sluice_log::segment::scan(path, &bytes, is_newest, |offset, payload| {
            let corrupt = |reason: String| RecoveryError::Corrupt {
                path: path.to_path_buf(),
                offset,
                reason,
            };
            let seq = peek_seq(payload).map_err(&corrupt)?;
            chain.next(seq).map_err(&corrupt)?;
            frames.push((offset, seq, payload.to_vec()));
            Ok::<(), RecoveryError>(())
        });
        (frames, end.map(|e| e.torn).map_err(|e| e.to_string()))
    }

    fn pieces(path: &Path, is_newest: bool, mut sizes: PieceSizes) -> Outcome {
        // Another segment after it, unless it is the newest.
        let segments = vec![
            sluice_log::segment::SegmentFile {
                first_seq: 1,
                path: path.to_path_buf(),
            };
            if is_newest { 1 } else { 2 }
        ];
        let opts = RecoveryOptions {
            limits: Limits::default(),
            retention: Retention::default(),
            repair: false,
            keep_zero_tail: false,
        };
        let mut chain = SeqChain::new(0);
        let mut frames = Vec::new();
        let mut torn = None;
        let read = scan_segment(
            &segments,
            0,
            &mut chain,
            &opts,
            &mut sizes,
            || Some(Vec::new()),
            |piece| {
                for f in &piece.frames {
                    frames.push((f.offset, f.seq, piece.buf[f.payload.clone()].to_vec()));
                }
                torn = torn.take().or(piece.torn);
                Some(None)
            },
        );
        let verdict = read.map(|whole| {
            assert!(whole, "emit never stops it");
            torn
        });
        (frames, verdict.map_err(|e| e.to_string()))
    }

    /// Read in pieces of any size (1 byte, cutting every header and payload, up to more
    /// than the file), a segment gives the verdict of scanning the whole file — healthy,
    /// torn in every way the newest segment may be, or damaged — and the same frames.
    #[test]
    fn a_segment_read_in_pieces_scans_like_the_whole_file() {
        let dir = std::env::temp_dir().join(format!("sluice-pieces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("00000000000000000001.log");
        let mut healthy = Vec::new();
        for (i, filler) in [0usize, 3, 40, 1, 200, 17, 0, 90].into_iter().enumerate() {
            sluice_log::frame::encode_into(&mut healthy, &record(i as u64 + 1, filler)).unwrap();
        }
        let len = healthy.len();
        let mut variants: Vec<(&str, Vec<u8>)> = vec![("healthy", healthy.clone())];
        for cut in [1, 9, 16, 30, len / 2, len - 1] {
            variants.push(("cut", healthy[..cut].to_vec()));
        }
        let mut zeros = healthy.clone();
        zeros.extend([0u8; 40]);
        variants.push(("zero tail", zeros));
        for at in [3, 20, len / 2, len - 2] {
            let mut flipped = healthy.clone();
            flipped[at] ^= 0x10;
            variants.push(("flipped", flipped.clone()));
            // A failed last frame followed by zeros is a torn tail, elsewhere damage.
            flipped.extend([0u8; 25]);
            variants.push(("flipped, zero tail", flipped));
        }
        let mut gap = Vec::new();
        sluice_log::frame::encode_into(&mut gap, &record(1, 5)).unwrap();
        sluice_log::frame::encode_into(&mut gap, &record(3, 5)).unwrap();
        variants.push(("seq gap", gap));
        let mut torn_seen = false;
        for (name, bytes) in &variants {
            std::fs::write(&path, bytes).unwrap();
            for is_newest in [false, true] {
                let expected = whole(&path, is_newest);
                torn_seen |= matches!(expected.1, Ok(Some(_)));
                let fixed = [
                    1,
                    2,
                    7,
                    16,
                    17,
                    33,
                    100,
                    250,
                    len - 1,
                    len,
                    len + 1,
                    1 << 20,
                ]
                .map(|b| (b, b));
                // Growing as recovery's are (doubling from a small first piece).
                let growing = [(1, 64), (3, len), (16, 1 << 20)];
                for (first, max) in fixed.into_iter().chain(growing) {
                    let got = pieces(&path, is_newest, PieceSizes::growing(first, max));
                    let case = format!("{name}, newest {is_newest}, pieces of {first}..{max}");
                    assert_eq!(got.1, expected.1, "{case}");
                    if expected.1.is_ok() {
                        assert_eq!(got.0, expected.0, "{case}");
                    } else {
                        // Earlier pieces went out before the damage was found (recovery
                        // then reports the damage); each was a frame of the whole scan.
                        assert!(expected.0.starts_with(&got.0), "{case}");
                    }
                }
            }
        }
        assert!(torn_seen, "some variants are torn tails");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pieces_double_from_the_first_up_to_the_largest() {
        let mut sizes = PieceSizes::growing(FIRST_PIECE_BYTES, SEGMENT_PIECE_BYTES);
        let seen: Vec<usize> = (0..7).map(|_| sizes.next_piece() >> 20).collect();
        assert_eq!(seen, [1, 2, 4, 8, 16, 16, 16]);
        let mut fixed = PieceSizes::fixed(PLAN_PIECE_BYTES);
        assert_eq!(
            [fixed.next_piece(), fixed.next_piece()],
            [PLAN_PIECE_BYTES; 2]
        );
    }
}
