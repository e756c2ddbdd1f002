//! Recovery: rebuild a [`Db`] from a data directory, and verify one offline.
//!
//! 1. Load the newest snapshot that passes every check (older ones are the fallback).
//! 2. Scan every segment, oldest first. Frames must carry consecutive seqs. Frames at or
//!    below the snapshot's seq only rebuild the changelog window; later ones are replayed.
//! 3. A torn tail of the newest segment is cut off (when repairing). Any other damage stops
//!    recovery with the file and byte offset.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_log::segment::{list_segments, read_file, scan, truncate};
use sluice_log::snapshot::{list_snapshots, SnapshotFile};
use sluice_log::LogError;

use crate::changelog::{Changelog, Retention};
use crate::codec::{
    decode_commit, decode_snapshot_frame, DecodeResult, SnapshotLoader, COUNTER_MAX,
};
use std::collections::HashMap;

use crate::db::{Change, Commit, CommitBody, Db, Limits, ReplayBody};
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
}

pub struct Recovered {
    pub db: Db,
    pub snapshot_seq: Option<u64>,
    /// Commits replayed from the log on top of the snapshot.
    pub replayed: u64,
    /// Log bytes (frames) of those commits: how much log the next snapshot would cover.
    pub replayed_bytes: u64,
    /// Frames read in all (including those only used for the changelog).
    pub frames_read: u64,
    pub segments: usize,
    pub torn_tail: Option<String>,
    /// Snapshots that failed their checks and were passed over, with the reason.
    pub skipped_snapshots: Vec<String>,
    pub duration: Duration,
}

pub fn recover(dir: &Path, opts: &RecoveryOptions) -> Result<Recovered, RecoveryError> {
    let started = Instant::now();
    let mut skipped_snapshots = Vec::new();
    let mut loaded = None;
    for (_, path) in list_snapshots(dir)?.into_iter().rev() {
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
    let snapshot_seq = loaded.as_ref().map(|db: &Db| db.seq);
    let mut db =
        loaded.unwrap_or_else(|| Db::new(opts.limits.clone(), Changelog::new(opts.retention)));

    // Pass 1: read every segment, check every frame and the seq chain, cut a torn tail.
    let segments = list_segments(dir)?;
    let mut files: Vec<Vec<u8>> = Vec::with_capacity(segments.len());
    let mut frames: Vec<FrameRef> = Vec::new();
    let mut prev_seq: Option<u64> = None;
    let mut torn_tail = None;
    for (i, seg) in segments.iter().enumerate() {
        let bytes = read_file(&seg.path)?;
        let is_newest = i + 1 == segments.len();
        let end = scan(&seg.path, &bytes, is_newest, |offset, payload| {
            let corrupt = |reason: String| RecoveryError::Corrupt {
                path: seg.path.clone(),
                offset,
                reason,
            };
            let seq = peek_seq(payload).map_err(&corrupt)?;
            match prev_seq {
                Some(prev) if prev.checked_add(1) != Some(seq) => {
                    return Err(corrupt(format!("seq {seq} follows seq {prev}")));
                }
                None if seq > db.seq.saturating_add(1) => {
                    return Err(corrupt(format!(
                        "the log starts at seq {seq} but the state is at seq {}: commits are missing",
                        db.seq
                    )));
                }
                _ => {}
            }
            prev_seq = Some(seq);
            let start = offset as usize + sluice_log::frame::FRAME_HEADER_BYTES;
            frames.push(FrameRef {
                segment: i,
                offset,
                payload: start..start + payload.len(),
                seq,
            });
            Ok(())
        })?;
        if let Some(torn) = end.torn {
            tracing::warn!("{torn}");
            if opts.repair {
                truncate(&seg.path, end.valid_len)?;
            }
            torn_tail = Some(torn);
        } else if end.padding > 0 && opts.repair {
            // Space the log reserved ahead of its appends: not damage, but the log reopens
            // the segment right after its last frame.
            truncate(&seg.path, end.valid_len)?;
        }
        files.push(bytes);
    }

    // Frames at or before the snapshot only feed the changelog window; skip decoding those
    // that the window's retention would drop anyway (frame size stands in for entry size).
    let retention = db.changelog.retention();
    let mut window_start = db.seq + 1;
    let (mut count, mut bytes) = (0usize, 0usize);
    for f in frames.iter().rev().filter(|f| f.seq <= db.seq) {
        count += 1;
        bytes += f.payload.len();
        if count > retention.commits_max || (bytes > retention.bytes_max && count > 1) {
            break;
        }
        window_start = f.seq;
    }

    // Pass 2: rebuild the window, replay the rest. Decoding runs on a second thread, a
    // batch of frames ahead of applying (replay is single-threaded by nature; decoding
    // is not), joined through a bounded channel.
    let mut replayed = 0u64;
    let mut replayed_bytes = 0u64;
    let frames_read = frames.len() as u64;
    let mut changelog_started = false;
    let mut window = WindowSchemas::default();
    let wanted: Vec<&FrameRef> = frames.iter().filter(|f| f.seq >= window_start).collect();
    let corrupt = |f: &FrameRef, reason: String| RecoveryError::Corrupt {
        path: segments[f.segment].path.clone(),
        offset: f.offset,
        reason,
    };
    std::thread::scope(|scope| -> Result<(), RecoveryError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<DecodeResult<(u64, ReplayBody)>>>(
            REPLAY_DECODE_BATCHES_AHEAD,
        );
        let files = &files;
        let wanted_ref = &wanted;
        scope.spawn(move || {
            for chunk in wanted_ref.chunks(REPLAY_DECODE_BATCH_FRAMES) {
                let decoded = chunk
                    .iter()
                    .map(|f| decode_commit(&files[f.segment][f.payload.clone()]))
                    .collect();
                if tx.send(decoded).is_err() {
                    return; // the applier stopped on an error
                }
            }
        });
        let mut next = wanted.iter();
        for batch in rx {
            for decoded in batch {
                let f = next.next().expect("one decoded frame per wanted frame");
                let (seq, body) = decoded.map_err(|r| corrupt(f, r))?;
                debug_assert_eq!(seq, f.seq);
                if !changelog_started {
                    db.changelog.reset_to(seq - 1);
                    changelog_started = true;
                }
                if seq <= db.seq {
                    let commit = window.rebuild(&db, seq, body);
                    db.changelog.push(Arc::new(commit));
                } else {
                    db.replay(seq, body).map_err(|r| corrupt(f, r))?;
                    replayed += 1;
                    replayed_bytes +=
                        (f.payload.len() + sluice_log::frame::FRAME_HEADER_BYTES) as u64;
                }
            }
        }
        Ok(())
    })?;
    drop(files);
    if let Some(last) = prev_seq {
        if last < db.seq {
            return Err(RecoveryError::Inconsistent(format!(
                "the log ends at seq {last}, before the snapshot's seq {}",
                db.seq
            )));
        }
    }
    if !changelog_started {
        db.changelog.reset_to(db.seq);
    }
    Ok(Recovered {
        db,
        snapshot_seq,
        replayed,
        replayed_bytes,
        frames_read,
        segments: segments.len(),
        torn_tail,
        skipped_snapshots,
        duration: started.elapsed(),
    })
}

fn load_snapshot(path: &Path, opts: &RecoveryOptions) -> Result<Db, RecoveryError> {
    let file = SnapshotFile::read(path)?;
    if file.seq > COUNTER_MAX {
        return Err(RecoveryError::Corrupt {
            path: path.to_path_buf(),
            offset: sluice_log::snapshot::SNAPSHOT_MAGIC.len() as u64,
            reason: format!("implausible snapshot seq {}", file.seq),
        });
    }
    let mut db = Db::new(opts.limits.clone(), Changelog::new(opts.retention));
    let mut loader = SnapshotLoader::new();
    let mut last_offset = 0;
    let corrupt = |offset: u64, reason: String| RecoveryError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    // Frames (~1 MiB of rows each) are decoded on a second thread while this one builds
    // the tables.
    let frames: Vec<(u64, &[u8])> = file.frames().collect();
    std::thread::scope(|scope| -> Result<(), RecoveryError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(REPLAY_DECODE_BATCHES_AHEAD);
        scope.spawn(move || {
            for (offset, payload) in frames {
                if tx.send((offset, decode_snapshot_frame(payload))).is_err() {
                    return;
                }
            }
        });
        for (offset, decoded) in rx {
            last_offset = offset;
            let frame = decoded.map_err(|r| corrupt(offset, r))?;
            loader
                .apply(&mut db, frame)
                .map_err(|r| corrupt(offset, r))?;
        }
        Ok(())
    })?;
    if !loader.finished() {
        return Err(RecoveryError::Corrupt {
            path: path.to_path_buf(),
            offset: last_offset,
            reason: "snapshot has no end frame".into(),
        });
    }
    db.seq = file.seq;
    db.changelog.reset_to(file.seq);
    Ok(db)
}

/// Frames decoded per batch handed from the decoding thread to the applying one.
const REPLAY_DECODE_BATCH_FRAMES: usize = 64;
/// Batches the decoding thread may run ahead (bounds the memory of decoded commits).
const REPLAY_DECODE_BATCHES_AHEAD: usize = 8;

/// Where a checked frame lies, for the second recovery pass.
struct FrameRef {
    segment: usize,
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
            ) =>
        {
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
        _ => Err("not a commit record".into()),
    }
}

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

    fn resolve(&mut self, db: &Db, table: &str, width: Option<usize>) -> Arc<TableSchema> {
        let fits = |s: &TableSchema| width.is_none_or(|w| s.columns.len() == w);
        if let Some(s) = self.seen.get(table).filter(|s| fits(s)) {
            return s.clone();
        }
        let current = db.tables.get(table).map(|t| t.schema.clone());
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

    fn rebuild(&mut self, db: &Db, seq: u64, body: ReplayBody) -> Commit {
        let body = match body {
            ReplayBody::Schema { changes, sql } => {
                for c in &changes {
                    self.schema_change(c);
                }
                CommitBody::Schema { changes, sql }
            }
            ReplayBody::Rows(rows) => CommitBody::Rows(self.changes(db, rows)),
            ReplayBody::Tx { rows, appends } => {
                let body = CommitBody::Rows(self.changes(db, rows));
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

    fn changes(&mut self, db: &Db, rows: Vec<crate::db::ReplayRow>) -> Vec<Change> {
        rows.into_iter()
            .map(|r| Change {
                table: self.resolve(db, &r.table, r.values.as_ref().map(Vec::len)),
                op: r.op,
                key: r.key,
                row: r.values.map(Into::into),
                old: None,
                version: r.version,
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
