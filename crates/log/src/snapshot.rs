//! Snapshot files: `snapshot-<seq:020>.snap`, the whole state as of one seq.
//!
//! ```text
//! "SLUICESN"                     8-byte magic
//! frame { version u32, seq u64 } header frame (12-byte payload, little-endian)
//! frame { ... } *                body frames, meaning defined by sluice-engine
//! ```
//!
//! A snapshot is written to `<name>.tmp` (streamed, synced in pieces), synced, renamed into
//! place and the directory synced, so a visible `.snap` file is always whole. Unlike segments it has no tail to tear:
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

/// The snapshot spare in `dir`: a retired snapshot, kept so that the next one is written over
/// its blocks and pages ([`SnapshotWriter::create`], [`keep_as_spare`]). No reader looks at it.
pub fn snapshot_spare_path(dir: &Path) -> PathBuf {
    dir.join("next-snapshot.spare")
}

/// Keeps the retired snapshot `path` as the spare if there is none (`true`), else leaves it
/// (`false`: the caller deletes it).
///
/// Why: a snapshot written to a new file allocates every page of it anew, in the page cache
/// and on disk, and deleting the old one frees as many. On a VM whose host backs guest
/// memory on first use those fresh pages are dear (the snapshot thread's copy into fresh
/// page-cache pages was up to 17 % of in-process ingest's CPU on cold memory); written over
/// the spare, a snapshot mostly reuses the pages and blocks of the one before last. The cost
/// is one more snapshot's worth of disk.
pub fn keep_as_spare(path: &Path) -> Result<bool, LogError> {
    let Some(dir) = path.parent() else {
        return Ok(false);
    };
    let spare = snapshot_spare_path(dir);
    if spare.exists() {
        return Ok(false);
    }
    std::fs::rename(path, &spare).map_err(|e| LogError::io(path, e))?;
    Ok(true)
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
    let mut out = SnapshotWriter::create(dir, seq)?;
    for f in body_frames {
        out.write_framed(f.as_ref())?;
    }
    out.finish()
}

/// Bytes a [`SnapshotWriter`] writes between two `fdatasync`s of its temp file.
///
/// Why in pieces: the page cache would otherwise hold the whole snapshot (~150 MB per
/// million rows) dirty until one sync at the end, and the log's own `fdatasync`s then queue
/// behind that flush (on ext4 a log sync that commits the journal may also have to write
/// the snapshot's newly allocated blocks first). Syncing every MiB bounds what any log sync
/// can find in front of it (a 4 MiB piece measured ~4 ms behind which an fsync-class ack
/// waited; 1 MiB ~1–2 ms, for ~10 % more snapshot time).
pub const SNAPSHOT_SYNC_BYTES: usize = 1 << 20;

/// Bytes buffered before a `write` to the snapshot file.
const SNAPSHOT_WRITE_BYTES: usize = 1 << 20;

/// Streams a snapshot to `<name>.tmp` frame by frame (the encoded state never has to be in
/// memory whole), syncing every [`SNAPSHOT_SYNC_BYTES`]; [`SnapshotWriter::finish`] syncs
/// the rest, renames it into place and syncs the directory. Dropped unfinished, it leaves
/// only a `.tmp` file, which no reader looks at and the next snapshot of that seq replaces.
pub struct SnapshotWriter {
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
    file: std::fs::File,
    buf: Vec<u8>,
    unsynced: usize,
    /// Bytes written so far: where a recycled file is cut at the end.
    written: u64,
    /// Whether the file is the spare written over (its old bytes past `written` are cut).
    recycled: bool,
}

impl SnapshotWriter {
    /// Creates (or truncates) the temp file of the snapshot of `seq` and writes its header;
    /// if `dir` has a spare ([`keep_as_spare`]), that file becomes the temp file and is
    /// written over from its start, its old bytes past the new end cut at
    /// [`SnapshotWriter::finish`].
    pub fn create(dir: &Path, seq: u64) -> Result<SnapshotWriter, LogError> {
        let path = snapshot_path(dir, seq);
        let tmp = path.with_extension("snap.tmp");
        let mut header = Vec::with_capacity(12);
        header.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&seq.to_le_bytes());
        let mut buf = Vec::with_capacity(SNAPSHOT_WRITE_BYTES + (64 << 10));
        buf.extend_from_slice(SNAPSHOT_MAGIC);
        frame::encode_into(&mut buf, &header)?;
        let recycled = std::fs::rename(snapshot_spare_path(dir), &tmp).is_ok();
        let file = if recycled {
            std::fs::OpenOptions::new().write(true).open(&tmp)
        } else {
            std::fs::File::create(&tmp)
        }
        .map_err(|e| LogError::io(&tmp, e))?;
        Ok(SnapshotWriter {
            dir: dir.to_path_buf(),
            path,
            tmp,
            file,
            buf,
            unsynced: 0,
            written: 0,
            recycled,
        })
    }

    /// Appends one body frame, already framed (`frame::encode_into`).
    pub fn write_framed(&mut self, framed: &[u8]) -> Result<(), LogError> {
        if self.buf.len() + framed.len() > SNAPSHOT_WRITE_BYTES {
            self.flush()?;
        }
        if framed.len() >= SNAPSHOT_WRITE_BYTES {
            return self.write_out(framed);
        }
        self.buf.extend_from_slice(framed);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), LogError> {
        let buf = std::mem::take(&mut self.buf);
        let result = self.write_out(&buf);
        self.buf = buf;
        self.buf.clear();
        result
    }

    fn write_out(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        self.file
            .write_all(bytes)
            .map_err(|e| LogError::io(&self.tmp, e))?;
        self.written += bytes.len() as u64;
        self.unsynced += bytes.len();
        if self.unsynced >= SNAPSHOT_SYNC_BYTES {
            self.file
                .sync_data()
                .map_err(|e| LogError::io(&self.tmp, e))?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Writes what is buffered, syncs the file, renames it into place and syncs the
    /// directory: on success the snapshot is durable under its final name.
    pub fn finish(mut self) -> Result<PathBuf, LogError> {
        self.flush()?;
        if self.recycled {
            // The spare's bytes past this snapshot's end (none when it grew past them), cut
            // a few MiB per synced step when there are many, as a file is deleted
            // (`io::remove_file_gradually`): freeing blocks in one step can hold up the
            // log's syncs behind the discards.
            crate::io::shrink_gradually(&self.file, self.written)
                .and_then(|()| self.file.set_len(self.written))
                .map_err(|e| LogError::io(&self.tmp, e))?;
        }
        self.file
            .sync_all()
            .map_err(|e| LogError::io(&self.tmp, e))?;
        drop(self.file);
        std::fs::rename(&self.tmp, &self.path).map_err(|e| LogError::io(&self.path, e))?;
        sync_dir(&self.dir).map_err(|e| LogError::io(&self.dir, e))?;
        Ok(self.path)
    }
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

/// Reads a snapshot file frame by frame, checking each as it comes, with the verdicts of
/// [`SnapshotFile::from_bytes`] (same reasons, same offsets) but never more than one frame
/// in memory.
///
/// Why: recovery used to read the whole file first (~140 MB per million rows, every page
/// fresh memory the kernel zeroes before the copy) and only then decode it; streamed, the
/// read, the checks and the decoding overlap and the buffers are reused.
pub struct SnapshotReader<R> {
    path: PathBuf,
    input: R,
    /// Offset of the next frame in the file.
    offset: u64,
    /// The seq the header frame names.
    pub seq: u64,
}

impl SnapshotReader<std::io::BufReader<std::fs::File>> {
    /// Opens the snapshot at `path` and checks its magic and header frame.
    pub fn open(path: &Path) -> Result<Self, LogError> {
        let file = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
        SnapshotReader::new(path, std::io::BufReader::with_capacity(64 << 10, file))
    }
}

/// What [`SnapshotReader`] found at an offset (the cases of [`frame::decode`]).
enum Next {
    Frame,
    End,
    Corrupt(&'static str),
}

impl<R: std::io::Read> SnapshotReader<R> {
    /// Reads and checks the magic and header frame of the snapshot bytes `input` (the
    /// contents of the file `path`, named in errors).
    pub fn new(path: &Path, input: R) -> Result<Self, LogError> {
        let mut reader = SnapshotReader {
            path: path.to_path_buf(),
            input,
            offset: 0,
            seq: 0,
        };
        let mut magic = [0u8; SNAPSHOT_MAGIC.len()];
        if reader.read_up_to(&mut magic)? < magic.len() || &magic != SNAPSHOT_MAGIC {
            return Err(reader.corrupt(0, "not a sluice snapshot (bad magic)"));
        }
        reader.offset = SNAPSHOT_MAGIC.len() as u64;
        let mut header = Vec::with_capacity(12);
        match reader.read_frame(&mut header)? {
            Next::Frame => {}
            Next::End => return Err(reader.corrupt(reader.offset, "snapshot has no header frame")),
            Next::Corrupt(reason) => return Err(reader.corrupt(reader.offset, reason)),
        }
        if header.len() != 12 {
            return Err(reader.corrupt(reader.offset, "bad snapshot header frame"));
        }
        let version = u32::from_le_bytes(header[0..4].try_into().expect("4"));
        if version != SNAPSHOT_FORMAT_VERSION {
            return Err(reader.corrupt(reader.offset, "unknown snapshot format version"));
        }
        reader.seq = u64::from_le_bytes(header[4..12].try_into().expect("8"));
        reader.offset += (frame::FRAME_HEADER_BYTES + 12) as u64;
        Ok(reader)
    }

    /// Reads the next body frame's payload into `buf` (replacing what it held) and checks
    /// it; returns the frame's file offset, or `None` at the end of the file.
    pub fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, LogError> {
        match self.read_frame(buf)? {
            Next::Frame => {
                let at = self.offset;
                self.offset += (frame::FRAME_HEADER_BYTES + buf.len()) as u64;
                Ok(Some(at))
            }
            Next::End => Ok(None),
            Next::Corrupt(reason) => Err(self.corrupt(self.offset, reason)),
        }
    }

    /// The frame at `self.offset`, as [`frame::decode`] judges it; its payload in `buf`.
    fn read_frame(&mut self, buf: &mut Vec<u8>) -> Result<Next, LogError> {
        use std::io::Read;
        let mut header = [0u8; frame::FRAME_HEADER_BYTES];
        match self.read_up_to(&mut header)? {
            0 => return Ok(Next::End),
            n if n < header.len() => return Ok(Next::Corrupt("file ends inside a frame")),
            _ => {}
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let len_inv = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        if len != !len_inv || len as usize > frame::FRAME_PAYLOAD_BYTES_MAX {
            return Ok(Next::Corrupt("frame length does not match its check"));
        }
        let checksum = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        buf.clear();
        buf.reserve(len as usize);
        (&mut self.input)
            .take(len as u64)
            .read_to_end(buf)
            .map_err(|e| LogError::io(&self.path, e))?;
        if buf.len() < len as usize {
            return Ok(Next::Corrupt("file ends inside a frame"));
        }
        if xxhash_rust::xxh3::xxh3_64(buf) != checksum {
            return Ok(Next::Corrupt("frame checksum mismatch"));
        }
        Ok(Next::Frame)
    }

    /// Fills `out` from the input as far as it goes; returns how many bytes it holds.
    fn read_up_to(&mut self, out: &mut [u8]) -> Result<usize, LogError> {
        let mut filled = 0;
        while filled < out.len() {
            match self.input.read(&mut out[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(LogError::io(&self.path, e)),
            }
        }
        Ok(filled)
    }

    fn corrupt(&self, offset: u64, reason: &str) -> LogError {
        LogError::Corrupt {
            path: self.path.clone(),
            offset,
            reason: reason.to_string(),
        }
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

    #[test]
    fn a_streamed_snapshot_larger_than_its_pieces_reads_back_frame_by_frame() {
        let dir = std::env::temp_dir().join(format!("sluice-snap-big-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Frames of every size around the write buffer, over several sync pieces.
        let sizes = [
            1usize,
            100,
            SNAPSHOT_WRITE_BYTES - 20,
            SNAPSHOT_WRITE_BYTES + 5,
            70_000,
        ];
        let payloads: Vec<Vec<u8>> = (0..40)
            .map(|i| vec![i as u8; sizes[i % sizes.len()]])
            .collect();
        let total: usize = payloads.iter().map(Vec::len).sum();
        assert!(total > 2 * SNAPSHOT_SYNC_BYTES, "{total}");
        let mut out = SnapshotWriter::create(&dir, 7).unwrap();
        let mut framed = Vec::new();
        for p in &payloads {
            framed.clear();
            frame::encode_into(&mut framed, p).unwrap();
            out.write_framed(&framed).unwrap();
        }
        assert!(
            list_snapshots(&dir).unwrap().is_empty(),
            "not visible before finish"
        );
        let path = out.finish().unwrap();
        let snap = SnapshotFile::read(&path).unwrap();
        assert_eq!(snap.seq, 7);
        let read: Vec<&[u8]> = snap.frames().map(|(_, p)| p).collect();
        assert_eq!(read.len(), payloads.len());
        for (i, (a, b)) in read.iter().zip(&payloads).enumerate() {
            assert!(*a == b.as_slice(), "frame {i} differs");
        }
        assert!(!path.with_extension("snap.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A retired snapshot kept as the spare is the file the next snapshot is written into,
    /// shorter or longer than it, and reads back as exactly its own frames; with no spare,
    /// a new file is made.
    #[test]
    fn the_next_snapshot_is_written_over_the_spare_and_cut_to_its_own_length() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("sluice-snap-spare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let body = |len: usize, fill: u8| {
            let mut framed = Vec::new();
            for _ in 0..len {
                frame::encode_into(&mut framed, &[fill; 1000]).unwrap();
            }
            framed
        };
        // Over one cutting step (`REMOVE_STEP_BYTES`) longer than the third.
        let first = write_snapshot(&dir, 10, &[body(6000, 1)]).unwrap();
        let second = write_snapshot(&dir, 20, &[body(10, 2)]).unwrap();
        let first_ino = std::fs::metadata(&first).unwrap().ino();
        assert!(keep_as_spare(&first).unwrap());
        assert!(!first.exists() && snapshot_spare_path(&dir).exists());
        // Only one spare: a second retiree is left to its caller.
        assert!(!keep_as_spare(&second).unwrap());
        assert!(second.exists());

        // Shorter than the spare: the spare's old frames past the end are cut.
        let third = write_snapshot(&dir, 30, &[body(5, 3)]).unwrap();
        assert_eq!(std::fs::metadata(&third).unwrap().ino(), first_ino);
        assert!(!snapshot_spare_path(&dir).exists());
        let snap = SnapshotFile::read(&third).unwrap();
        assert_eq!(snap.seq, 30);
        let frames: Vec<&[u8]> = snap.frames().map(|(_, p)| p).collect();
        assert_eq!(frames.len(), 5);
        assert!(frames.iter().all(|p| *p == [3u8; 1000]));

        // Longer than the spare.
        assert!(keep_as_spare(&second).unwrap());
        let fourth = write_snapshot(&dir, 40, &[body(50, 4)]).unwrap();
        let snap = SnapshotFile::read(&fourth).unwrap();
        assert_eq!(snap.frames().count(), 50);
        assert!(snap.frames().all(|(_, p)| p == [4u8; 1000]));

        // No spare left: a new file.
        let fifth = write_snapshot(&dir, 50, &[body(1, 5)]).unwrap();
        let inos: Vec<u64> = [&third, &fourth, &fifth]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().ino())
            .collect();
        assert!(inos[2] != inos[0] && inos[2] != inos[1]);
        assert_eq!(SnapshotFile::read(&fifth).unwrap().frames().count(), 1);
        assert_eq!(
            list_snapshots(&dir)
                .unwrap()
                .iter()
                .map(|(s, _)| *s)
                .collect::<Vec<_>>(),
            vec![30, 40, 50]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
