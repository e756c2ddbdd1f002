//! Segment files: `<first_seq:020>.log` in the data directory, each a sequence of frames.
//!
//! Only the newest segment may end in a torn frame (a crash cut a write short); anything
//! wrong before that point, or in an older segment, is corruption and is reported with the
//! file and byte offset — never skipped.

use std::path::{Path, PathBuf};

use crate::frame::{self, Decoded};
use crate::LogError;

pub const SEGMENT_SUFFIX: &str = ".log";

/// A segment file on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile {
    /// The seq of the first frame this segment holds (the name of the file).
    pub first_seq: u64,
    pub path: PathBuf,
}

pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}{SEGMENT_SUFFIX}"))
}

/// Every segment in `dir`, oldest first.
pub fn list_segments(dir: &Path) -> Result<Vec<SegmentFile>, LogError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        if stem.len() != 20 {
            continue;
        }
        let Ok(first_seq) = stem.parse::<u64>() else {
            continue;
        };
        out.push(SegmentFile {
            first_seq,
            path: entry.path(),
        });
    }
    out.sort_by_key(|s| s.first_seq);
    Ok(out)
}

/// How a scan of one segment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEnd {
    /// Bytes of whole, valid frames from the start of the file.
    pub valid_len: u64,
    /// Set when the file continues past `valid_len` with a torn frame (only possible for
    /// the newest segment); recovery truncates the file to `valid_len`.
    pub torn: Option<String>,
}

/// Calls `on_frame(offset, payload)` for every frame of `bytes` (the contents of `path`).
///
/// `is_newest` allows a torn tail: a frame cut short, a whole last frame with a bad
/// checksum, or a zero-filled end. Anything else that fails its checks is
/// [`LogError::Corrupt`] naming `path` and the offset.
pub fn scan<E: From<LogError>>(
    path: &Path,
    bytes: &[u8],
    is_newest: bool,
    on_frame: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<ScanEnd, E> {
    scan_at(path, bytes, 0, is_newest, on_frame)
}

/// [`scan`] of the end of a file: `bytes` are the file's bytes from offset `base` to its
/// end, and every offset reported (to `on_frame`, in errors, `valid_len`, the torn-tail
/// message) is one in the file. Recovery reads segments piece by piece and scans whole
/// frames itself; where a piece's frames stop at damage it reads the rest of the file and
/// lets this give the verdict `scan` of the whole file would.
pub fn scan_at<E: From<LogError>>(
    path: &Path,
    bytes: &[u8],
    base: u64,
    is_newest: bool,
    mut on_frame: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<ScanEnd, E> {
    let mut offset = 0usize;
    let corrupt = |offset: usize, reason: &str| LogError::Corrupt {
        path: path.to_path_buf(),
        offset: base + offset as u64,
        reason: reason.to_string(),
    };
    loop {
        let torn_reason = match frame::decode(bytes, offset) {
            Decoded::Frame { payload, next } => {
                on_frame(base + offset as u64, payload)?;
                offset = next;
                continue;
            }
            Decoded::End => {
                return Ok(ScanEnd {
                    valid_len: base + offset as u64,
                    torn: None,
                })
            }
            Decoded::Truncated => {
                if !is_newest {
                    return Err(corrupt(offset, "segment ends inside a frame").into());
                }
                "the last frame is cut short"
            }
            Decoded::BadLength => {
                // Zero fill, possibly after a length written only in part: nothing whole
                // can hide behind it.
                let after_len = (offset + 8).min(bytes.len());
                if !(is_newest && all_zeros(&bytes[after_len..])) {
                    return Err(corrupt(offset, "frame length does not match its check").into());
                }
                ZERO_TAIL_REASON
            }
            Decoded::BadChecksum { end } => {
                // The last frame, possibly followed by file-system zero fill.
                if !(is_newest && all_zeros(&bytes[end..])) {
                    return Err(corrupt(offset, "frame checksum mismatch").into());
                }
                "the last frame fails its checksum"
            }
        };
        return Ok(ScanEnd {
            valid_len: base + offset as u64,
            torn: Some(torn_tail_message(
                path,
                base + offset as u64,
                torn_reason,
                (bytes.len() - offset) as u64,
            )),
        });
    }
}

/// Whether every byte of `bytes` is zero. In blocks whose OR is taken without an early exit,
/// so it is vectorised: 0.5 ms for 64 MiB where `iter().all(|&b| b == 0)`, which stops at
/// the first non-zero byte and so is checked byte by byte, took 17 ms — the zeros of a
/// prepared newest segment are checked at every start.
pub fn all_zeros(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(256);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

/// Why a scan ended at a frame boundary followed only by zeros ([`torn_tail_message`]).
pub const ZERO_TAIL_REASON: &str = "the file ends in zero bytes";

/// The torn-tail verdict of a scan that stopped at byte `offset` of `path` for `reason`,
/// with `bytes_after` more bytes in the file.
pub fn torn_tail_message(path: &Path, offset: u64, reason: &str, bytes_after: u64) -> String {
    format!(
        "{}: torn tail at byte offset {offset} ({reason}); {bytes_after} bytes after it",
        path.display()
    )
}

/// Reads a whole file.
pub fn read_file(path: &Path) -> Result<Vec<u8>, LogError> {
    std::fs::read(path).map_err(|e| LogError::io(path, e))
}

/// Cuts `path` to `len` bytes and syncs it (recovery's torn-tail repair).
pub fn truncate(path: &Path, len: u64) -> Result<(), LogError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| LogError::io(path, e))?;
    file.set_len(len).map_err(|e| LogError::io(path, e))?;
    file.sync_all().map_err(|e| LogError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: usize) -> (Vec<u8>, Vec<usize>) {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for i in 0..n {
            frame::encode_into(&mut buf, format!("payload number {i}").as_bytes()).unwrap();
            ends.push(buf.len());
        }
        (buf, ends)
    }

    #[test]
    fn all_zeros_finds_a_non_zero_byte_anywhere() {
        for len in [0usize, 1, 255, 256, 257, 511, 512, 1000, 4096] {
            let mut bytes = vec![0u8; len];
            assert!(all_zeros(&bytes), "{len} zeros");
            for at in 0..len {
                bytes[at] = 0x80 >> (at % 8);
                assert!(!all_zeros(&bytes), "{len} bytes, non-zero at {at}");
                bytes[at] = 0;
            }
        }
    }

    #[test]
    fn a_cut_newest_segment_keeps_exactly_the_whole_frames() {
        let (buf, ends) = frames(20);
        for cut in 0..=buf.len() {
            let mut seen = 0;
            let end = scan(Path::new("x.log"), &buf[..cut], true, |_, _| {
                seen += 1;
                Ok::<(), LogError>(())
            })
            .unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(seen, whole, "cut at {cut}");
            let expected_len = if whole == 0 { 0 } else { ends[whole - 1] };
            assert_eq!(end.valid_len as usize, expected_len);
            assert_eq!(end.torn.is_some(), cut != expected_len);
        }
    }

    #[test]
    fn a_cut_older_segment_is_corruption() {
        let (buf, ends) = frames(3);
        let err = scan(Path::new("x.log"), &buf[..ends[1] + 3], false, |_, _| {
            Ok::<(), LogError>(())
        })
        .unwrap_err();
        match err {
            LogError::Corrupt { offset, .. } => assert_eq!(offset as usize, ends[1]),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn a_flipped_byte_before_the_tail_names_its_frame_offset() {
        let (buf, ends) = frames(10);
        for pos in 0..ends[8] {
            let mut damaged = buf.clone();
            damaged[pos] ^= 0x40;
            let err = scan(Path::new("x.log"), &damaged, true, |_, _| {
                Ok::<(), LogError>(())
            })
            .unwrap_err();
            let frame_start = ends.iter().rev().find(|&&e| e <= pos).copied().unwrap_or(0);
            match err {
                LogError::Corrupt { offset, .. } => assert_eq!(offset as usize, frame_start),
                other => panic!("unexpected {other}"),
            }
        }
    }
}
