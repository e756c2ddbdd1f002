//! The file the log writer appends to, behind a trait so tests can inject failures.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An append-only log file.
pub trait LogFile: Send {
    /// Appends all of `bytes`. On success the bytes **must** be in the OS page cache (they
    /// survive a process crash, not power loss).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// On success every byte appended so far **must** be on stable storage.
    fn sync(&mut self) -> std::io::Result<()>;
    /// The log is done with this file (it moves to a new segment, or shuts down): space
    /// reserved past the last appended byte is given back, durably, so that only the newest
    /// segment ever ends in padding. The default has nothing to give back.
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    /// Asks the file to reserve its space `bytes` at a time ahead of the appends (the log
    /// passes its segment size, capped by [`PREALLOCATE_BYTES`]). The default reserves
    /// nothing.
    fn reserve_ahead(&mut self, bytes: u64) {
        let _ = bytes;
    }
}

impl LogFile for File {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
}

/// Opens segment files and makes their creation durable. The default opens real files;
/// tests swap in [`FailingSyncs`] or the simulated disk ([`crate::sim::SimDisk`]).
pub trait LogFileFactory: Send + Sync {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>>;
    /// Makes the creation of the files opened in `dir` durable (a new file whose directory
    /// was not synced can vanish on power loss, synced data and all).
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        sync_dir(dir)
    }
}

/// Opens a real segment file for appending, creating it if missing (what every factory over
/// real files does before wrapping the file).
pub fn open_append_file(path: &std::path::Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Real files (created if missing), with their space reserved ahead of the appends
/// ([`PreallocatedFile`]).
pub struct RealFiles;

impl LogFileFactory for RealFiles {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(PreallocatedFile::open(path)?))
    }
}

/// How far ahead of the appends a segment's space is reserved, per `fallocate`.
pub const PREALLOCATE_BYTES: u64 = 8 << 20;

/// A segment file whose space is reserved (`fallocate`, which also extends the file's size)
/// in [`PREALLOCATE_BYTES`] steps ahead of the appends, which overwrite the reserved zeros
/// at the tracked end of the data.
///
/// *Why.* `fdatasync` after an append that grows a file must also commit the new size (on
/// ext4 a journal commit); after an overwrite inside the file's size it flushes only the
/// data. On this project's machines that took a sync from ~1 ms to a few hundred µs under
/// load, and every `fsync`-class acknowledgement waits for one. PostgreSQL reserves its WAL
/// segments for the same reason.
///
/// *The price.* The newest segment ends in zeros (padding) until the log moves on or shuts
/// down ([`LogFile::finish`] cuts it); recovery treats zeros after the last whole frame as
/// padding, not damage, and cuts them before the log reopens (`segment::scan`). Where the file
/// system cannot `fallocate`, appends simply extend the file.
pub struct PreallocatedFile {
    file: File,
    /// Bytes of data: the next append goes here.
    len: u64,
    /// The file's size: `len..reserved` are zeros, reserved for appends.
    reserved: u64,
    /// Reservation step; 0 reserves nothing (until [`LogFile::reserve_ahead`] is called).
    step: u64,
    /// Cleared when the file system refuses `fallocate`.
    can_reserve: bool,
}

impl PreallocatedFile {
    /// Opens (or creates) `path`; its data must end at its size (no padding left over: the
    /// log cuts padding before it reopens a segment).
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(PreallocatedFile {
            file,
            len,
            reserved: len,
            step: 0,
            can_reserve: true,
        })
    }

    /// Reserves space so that `needed` bytes of data fit.
    fn reserve(&mut self, needed: u64) -> std::io::Result<()> {
        if needed <= self.reserved || !self.can_reserve || self.step == 0 {
            return Ok(());
        }
        let to = needed.max(self.reserved + self.step);
        let flags = rustix::fs::FallocateFlags::empty();
        match rustix::fs::fallocate(&self.file, flags, self.reserved, to - self.reserved) {
            Ok(()) => {
                self.reserved = to;
                Ok(())
            }
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                self.can_reserve = false;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl LogFile for PreallocatedFile {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reserve(self.len + bytes.len() as u64)?;
        self.file.write_all_at(bytes, self.len)?;
        self.len += bytes.len() as u64;
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn reserve_ahead(&mut self, bytes: u64) {
        self.step = bytes.min(PREALLOCATE_BYTES);
    }
    fn finish(&mut self) -> std::io::Result<()> {
        if self.reserved > self.len {
            self.file.set_len(self.len)?;
            self.reserved = self.len;
            // The shorter size must be durable: an older segment may not end in padding.
            self.file.sync_all()?;
        }
        Ok(())
    }
}

/// Real files whose `sync` fails from the `fail_from`-th sync on (counting from 1), across
/// every file the factory opened. For poisoning tests.
pub struct FailingSyncs {
    pub fail_from: u64,
    syncs: Arc<AtomicU64>,
}

impl FailingSyncs {
    pub fn new(fail_from: u64) -> Self {
        FailingSyncs {
            fail_from,
            syncs: Arc::new(AtomicU64::new(0)),
        }
    }
}

struct FailingFile {
    file: File,
    fail_from: u64,
    syncs: Arc<AtomicU64>,
}

impl LogFile for FailingFile {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        let n = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.fail_from {
            return Err(std::io::Error::other("injected fdatasync failure"));
        }
        self.file.sync_data()
    }
}

impl LogFileFactory for FailingSyncs {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
        let file = open_append_file(path)?;
        Ok(Box::new(FailingFile {
            file,
            fail_from: self.fail_from,
            syncs: self.syncs.clone(),
        }))
    }
}

/// Syncs a directory so that file creations, renames and removals in it are durable.
pub fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;
    use crate::segment::{cut_padding, scan};

    fn frames(n: usize, from: usize) -> Vec<u8> {
        let mut buf = Vec::new();
        for i in from..from + n {
            frame::encode_into(&mut buf, format!("frame {i}").as_bytes()).unwrap();
        }
        buf
    }

    #[test]
    fn a_preallocated_segment_reads_back_as_its_frames_then_padding() {
        let dir = std::env::temp_dir().join(format!("sluice-prealloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("00000000000000000001.log");
        let _ = std::fs::remove_file(&path);
        let written = frames(50, 0);
        let mut file = PreallocatedFile::open(&path).unwrap();
        file.reserve_ahead(1000);
        for chunk in written.chunks(37) {
            file.append(chunk).unwrap();
        }
        file.sync().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert!(
            on_disk.len() > written.len(),
            "the file holds its data and reserved space"
        );
        assert_eq!(&on_disk[..written.len()], &written[..]);
        let mut seen = 0;
        let end = scan(&path, &on_disk, true, |_, _| {
            seen += 1;
            Ok::<(), crate::LogError>(())
        })
        .unwrap();
        assert_eq!(seen, 50);
        assert_eq!(end.valid_len as usize, written.len());
        assert!(end.torn.is_none(), "padding is not a torn tail");
        assert_eq!(end.padding as usize, on_disk.len() - written.len());

        // A log that stopped without finishing: reopening cuts the padding first, so the
        // next appends follow the last frame.
        drop(file);
        cut_padding(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            written.len()
        );
        let more = frames(3, 50);
        let mut file = PreallocatedFile::open(&path).unwrap();
        file.reserve_ahead(PREALLOCATE_BYTES);
        file.append(&more).unwrap();
        file.finish().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(
            on_disk.len(),
            written.len() + more.len(),
            "finish cuts the padding"
        );
        let mut seen = 0;
        let end = scan(&path, &on_disk, false, |_, _| {
            seen += 1;
            Ok::<(), crate::LogError>(())
        })
        .unwrap();
        assert_eq!((seen, end.padding), (53, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zeros_after_a_frame_in_an_older_segment_are_corruption() {
        let mut bytes = frames(3, 0);
        let end = bytes.len();
        bytes.resize(end + 100, 0);
        let err = scan(std::path::Path::new("x.log"), &bytes, false, |_, _| {
            Ok::<(), crate::LogError>(())
        })
        .unwrap_err();
        match err {
            crate::LogError::Corrupt { offset, .. } => assert_eq!(offset as usize, end),
            other => panic!("unexpected {other}"),
        }
    }
}
