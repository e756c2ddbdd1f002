//! Snapshot files: `snapshot-<seq:020>.snap`, the whole state as of one seq.
//!
//! ```text
//! "SLUICESN"                     8-byte magic
//! frame { version u32, seq u64 } header frame (12-byte payload, little-endian)
//! frame { ... } *                body frames, meaning defined by sluice-engine
//! ```
//!
//! A snapshot is written to `<name>.tmp`, synced, renamed into place and the directory
//! synced, so a visible `.snap` file is always whole. Unlike segments it has no tail to tear:
//! any failed check anywhere is corruption.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::frame::{self, Decoded};
use crate::io::sync_dir;
use crate::LogError;

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"SLUICESN";
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

pub fn snapshot_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("snapshot-{seq:020}.snap"))
}

/// Every snapshot in `dir` as `(seq, path)`, oldest first.
pub fn list_snapshots(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(seq) = name
            .strip_prefix("snapshot-")
            .and_then(|s| s.strip_suffix(".snap"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((seq, entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Writes a snapshot of `seq` whose body is `body_frames` (already framed, in order)
/// atomically. On success the file **must** be durable under its final name.
pub fn write_snapshot(
    dir: &Path,
    seq: u64,
    body_frames: &[impl AsRef<[u8]>],
) -> Result<PathBuf, LogError> {
    let path = snapshot_path(dir, seq);
    let tmp = path.with_extension("snap.tmp");
    let mut header = Vec::with_capacity(12);
    header.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&seq.to_le_bytes());
    let mut head = Vec::new();
    head.extend_from_slice(SNAPSHOT_MAGIC);
    frame::encode_into(&mut head, &header)?;
    let mut file = std::fs::File::create(&tmp).map_err(|e| LogError::io(&tmp, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut file);
    out.write_all(&head)
        .and_then(|_| {
            body_frames
                .iter()
                .try_for_each(|f| out.write_all(f.as_ref()))
        })
        .and_then(|_| out.flush())
        .map_err(|e| LogError::io(&tmp, e))?;
    drop(out);
    file.sync_all().map_err(|e| LogError::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(|e| LogError::io(&path, e))?;
    sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
    Ok(path)
}

/// A snapshot file read into memory and verified frame by frame.
pub struct SnapshotFile {
    pub path: PathBuf,
    pub seq: u64,
    bytes: Vec<u8>,
    /// `(offset, payload range)` of each body frame.
    frames: Vec<(u64, std::ops::Range<usize>)>,
}

impl SnapshotFile {
    pub fn read(path: &Path) -> Result<SnapshotFile, LogError> {
        let bytes = std::fs::read(path).map_err(|e| LogError::io(path, e))?;
        Self::from_bytes(path, bytes)
    }

    /// Verifies `bytes`, the contents of the snapshot file `path` (named in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<SnapshotFile, LogError> {
        let corrupt = |offset: usize, reason: &str| LogError::Corrupt {
            path: path.to_path_buf(),
            offset: offset as u64,
            reason: reason.to_string(),
        };
        if bytes.len() < SNAPSHOT_MAGIC.len() || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(corrupt(0, "not a sluice snapshot (bad magic)"));
        }
        let mut offset = SNAPSHOT_MAGIC.len();
        let mut seq = None;
        let mut frames = Vec::new();
        loop {
            match frame::decode(&bytes, offset) {
                Decoded::Frame { payload, next } => {
                    if seq.is_none() {
                        if payload.len() != 12 {
                            return Err(corrupt(offset, "bad snapshot header frame"));
                        }
                        let version = u32::from_le_bytes(payload[0..4].try_into().expect("4"));
                        if version != SNAPSHOT_FORMAT_VERSION {
                            return Err(corrupt(offset, "unknown snapshot format version"));
                        }
                        seq = Some(u64::from_le_bytes(payload[4..12].try_into().expect("8")));
                    } else {
                        frames.push((offset as u64, next - payload.len()..next));
                    }
                    offset = next;
                }
                Decoded::End => break,
                Decoded::Truncated => return Err(corrupt(offset, "file ends inside a frame")),
                Decoded::BadLength => {
                    return Err(corrupt(offset, "frame length does not match its check"))
                }
                Decoded::BadChecksum { .. } => {
                    return Err(corrupt(offset, "frame checksum mismatch"))
                }
            }
        }
        let seq = seq.ok_or_else(|| corrupt(offset, "snapshot has no header frame"))?;
        Ok(SnapshotFile {
            path: path.to_path_buf(),
            seq,
            bytes,
            frames,
        })
    }

    /// The body frames as `(file offset, payload)`.
    pub fn frames(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.frames
            .iter()
            .map(|(offset, range)| (*offset, &self.bytes[range.clone()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_detect_damage() {
        let dir = std::env::temp_dir().join(format!("sluice-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut body = Vec::new();
        frame::encode_into(&mut body, b"table a").unwrap();
        frame::encode_into(&mut body, b"rows").unwrap();
        let path = write_snapshot(&dir, 42, &[body]).unwrap();
        let snap = SnapshotFile::read(&path).unwrap();
        assert_eq!(snap.seq, 42);
        let payloads: Vec<&[u8]> = snap.frames().map(|(_, p)| p).collect();
        assert_eq!(payloads, vec![&b"table a"[..], &b"rows"[..]]);
        assert_eq!(list_snapshots(&dir).unwrap(), vec![(42, path.clone())]);

        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            SnapshotFile::read(&path),
            Err(LogError::Corrupt { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
