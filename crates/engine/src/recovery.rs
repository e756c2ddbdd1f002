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
use crate::codec::{decode_commit, SnapshotLoader};
use crate::db::{Change, Commit, CommitBody, Db, Limits, ReplayBody};

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

    let segments = list_segments(dir)?;
    let mut prev_seq: Option<u64> = None;
    let mut replayed = 0u64;
    let mut frames_read = 0u64;
    let mut torn_tail = None;
    let mut changelog_started = false;
    for (i, seg) in segments.iter().enumerate() {
        let bytes = read_file(&seg.path)?;
        let is_newest = i + 1 == segments.len();
        let end = scan(&seg.path, &bytes, is_newest, |offset, payload| {
            let corrupt = |reason: String| RecoveryError::Corrupt {
                path: seg.path.clone(),
                offset,
                reason,
            };
            let (seq, body) = decode_commit(payload).map_err(&corrupt)?;
            frames_read += 1;
            match prev_seq {
                Some(prev) if seq != prev + 1 => {
                    return Err(corrupt(format!("seq {seq} follows seq {prev}")));
                }
                None if seq > db.seq + 1 => {
                    return Err(corrupt(format!(
                        "the log starts at seq {seq} but the state is at seq {}: commits are missing",
                        db.seq
                    )));
                }
                _ => {}
            }
            prev_seq = Some(seq);
            if !changelog_started {
                db.changelog.reset_to(seq - 1);
                changelog_started = true;
            }
            if seq <= db.seq {
                let commit = rebuild_commit(&db, seq, body);
                db.changelog.push(Arc::new(commit));
            } else {
                db.replay(seq, body).map_err(&corrupt)?;
                replayed += 1;
            }
            Ok(())
        })?;
        if let Some(torn) = end.torn {
            tracing::warn!("{torn}");
            if opts.repair {
                truncate(&seg.path, end.valid_len)?;
            }
            torn_tail = Some(torn);
        }
    }
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
        frames_read,
        segments: segments.len(),
        torn_tail,
        skipped_snapshots,
        duration: started.elapsed(),
    })
}

fn load_snapshot(path: &Path, opts: &RecoveryOptions) -> Result<Db, RecoveryError> {
    let file = SnapshotFile::read(path)?;
    let mut db = Db::new(opts.limits.clone(), Changelog::new(opts.retention));
    let mut loader = SnapshotLoader::new();
    let mut last_offset = 0;
    for (offset, payload) in file.frames() {
        last_offset = offset;
        loader
            .frame(&mut db, payload)
            .map_err(|reason| RecoveryError::Corrupt {
                path: path.to_path_buf(),
                offset,
                reason,
            })?;
    }
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

/// A commit from before the snapshot, rebuilt only for the changelog window. Rows are
/// rendered with the table's current schema; rows of tables that no longer exist, or whose
/// shape no longer matches, are left out of the window.
fn rebuild_commit(db: &Db, seq: u64, body: ReplayBody) -> Commit {
    let body = match body {
        ReplayBody::Schema { changes, sql } => CommitBody::Schema { changes, sql },
        ReplayBody::Rows(rows) => CommitBody::Rows(
            rows.into_iter()
                .filter_map(|r| {
                    let table = db.tables.get(&r.table)?;
                    if let Some(v) = &r.values {
                        if v.len() != table.schema.columns.len() {
                            return None;
                        }
                    }
                    Some(Change {
                        table: table.schema.clone(),
                        op: r.op,
                        key: r.key,
                        row: r.values.map(Into::into),
                        version: r.version,
                    })
                })
                .collect(),
        ),
    };
    Commit { seq, body }
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
