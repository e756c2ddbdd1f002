//! Prepared segments written around the page cache (`O_DIRECT`): `sluice serve
//! --log-direct-io`.
//!
//! *Why.* On a VM whose host backs guest memory on first use, every page-cache page the log
//! fills for the first time costs a host fault and a clear (~0.4 GB/s in this project's
//! slow spells, against ~10 GB/s for a copy into a cached page): `perf` of in-process
//! ingest put 11.9 % of all CPU in the segment preparer's zeros and 4.4 % in the first,
//! unprepared segment (ARCHITECTURE "What is next"). Direct writes go from one reused,
//! block-aligned buffer to the device and fill no page cache at all. The price is what
//! the default keeps: a `disk` commit waits for the device's write (~70 µs for 4 KiB here)
//! instead of a copy into the cache, and recovery after a crash reads the log from the
//! device rather than from the cache. So it is a switch, off by default.
//!
//! *How.* Only prepared segments ([`crate::io::PreparedFile`]'s files: zeros written and
//! synced, then written over) are direct; the preparer writes its zeros direct too. Each
//! append copies its bytes after the partial last block already on the device, writes from
//! that block's start through the end of the block holding its last byte (the rest of that
//! block zeros, which is what the prepared file holds there), then keeps the new partial
//! block for the next append. The blocks rewritten hold acknowledged frames, but the same
//! bytes again: a write torn by power loss leaves each sector old or new, and both read the
//! same there. The first segment after opening the log (a plain growing file) goes through
//! the page cache as without the switch: a growing file written direct would be padded to
//! whole blocks.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::io::{
    open_append_file, own_description, write_zeros_over, LogFile, LogFileFactory, SyncHandle,
    PREPARE_CHUNK_BYTES,
};

/// Alignment and size unit of every direct write: the offset, the length and the buffer's
/// address (4 KiB covers the 512-byte and 4 KiB logical blocks of the devices we run on).
pub const BLOCK_BYTES: usize = 4096;

/// Bytes of the append buffer; a larger append goes out in pieces of this size.
pub const APPEND_BUFFER_BYTES: usize = 1 << 20;

const _: () = assert!(APPEND_BUFFER_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(PREPARE_CHUNK_BYTES.is_multiple_of(BLOCK_BYTES));

/// `len` bytes starting at a [`BLOCK_BYTES`]-aligned address, in safe Rust: a `Vec` one block
/// longer, used from its first aligned byte on (it never grows, so the address stays).
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + BLOCK_BYTES];
        let start = storage.as_ptr().align_offset(BLOCK_BYTES);
        assert!(
            start < BLOCK_BYTES,
            "a byte pointer aligns within one block"
        );
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

fn open_direct(options: &mut std::fs::OpenOptions, path: &Path) -> io::Result<File> {
    options
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| {
            if e.kind() == ErrorKind::InvalidInput {
                io::Error::new(
                    e.kind(),
                    format!(
                        "the file system of {} does not take direct I/O (O_DIRECT), which \
                         --log-direct-io asks for: {e}",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })
}

/// A prepared segment written with direct I/O from byte `block_at + tail` on.
pub struct DirectFile {
    file: File,
    buf: AlignedBuf,
    /// File offset of `buf`'s first byte: a multiple of [`BLOCK_BYTES`].
    block_at: u64,
    /// Bytes at the start of `buf` already written (the partial block the next append
    /// continues); below [`BLOCK_BYTES`] between appends.
    tail: usize,
}

impl DirectFile {
    /// Opens the prepared file `path` for writing over it from byte `offset` on: the frames
    /// before `offset` in its block are read back, as they are written again with the block.
    pub fn open(path: &Path, offset: u64) -> io::Result<DirectFile> {
        let file = open_direct(std::fs::OpenOptions::new().write(true), path)?;
        let block_at = offset - offset % BLOCK_BYTES as u64;
        let tail = (offset - block_at) as usize;
        let mut buf = AlignedBuf::zeroed(APPEND_BUFFER_BYTES);
        if tail > 0 {
            File::open(path)?.read_exact_at(&mut buf.bytes()[..tail], block_at)?;
        }
        Ok(DirectFile {
            file,
            buf,
            block_at,
            tail,
        })
    }
}

impl LogFile for DirectFile {
    fn append(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        let cap = self.buf.len;
        loop {
            let n = bytes.len().min(cap - self.tail);
            self.buf.bytes()[self.tail..self.tail + n].copy_from_slice(&bytes[..n]);
            self.tail += n;
            bytes = &bytes[n..];
            if bytes.is_empty() {
                break;
            }
            // The buffer is full (whole blocks): out it goes, and the next piece starts empty.
            self.file.write_all_at(self.buf.bytes(), self.block_at)?;
            self.block_at += cap as u64;
            self.tail = 0;
        }
        let end = self.tail;
        let padded = end.next_multiple_of(BLOCK_BYTES);
        let at = self.block_at;
        let buf = self.buf.bytes();
        buf[end..padded].fill(0);
        self.file.write_all_at(&buf[..padded], at)?;
        // The partial last block (if any) moves to the front, for the next append.
        let whole = end - end % BLOCK_BYTES;
        buf.copy_within(whole..end, 0);
        self.block_at += whole as u64;
        self.tail = end - whole;
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_handle(&self) -> Option<SyncHandle> {
        let file = own_description(&self.file)?;
        Some(Box::new(move || file.sync_data()))
    }

    fn seal(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        // The size is metadata an `fdatasync` of a shrunk file need not write: a full sync.
        self.file.sync_all()
    }
}

/// Makes `path` a file of `bytes` zero bytes with direct writes and syncs it (a file already
/// there, a spare, is written over in place), stopping early with `Interrupted` once `stop`
/// returns true.
pub fn prepare_zeroed_file_direct(
    path: &Path,
    bytes: u64,
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    let file = open_direct(
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false),
        path,
    )?;
    let mut zeros = AlignedBuf::zeroed(PREPARE_CHUNK_BYTES);
    write_zeros_over(&file, bytes, zeros.bytes(), BLOCK_BYTES as u64, stop)
}

/// Real files whose prepared segments are written with direct I/O (see the module docs);
/// the first segment after opening grows through the page cache as with
/// [`crate::io::RealFiles`].
pub struct DirectFiles;

impl DirectFiles {
    /// Fails with a clear error if the file system of `dir` takes no direct writes, so that a
    /// server asked for them refuses to start rather than poisoning its log at the first
    /// prepared segment.
    pub fn check_dir(dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let probe = dir.join("direct-io-probe.tmp");
        let result = (|| {
            let file = open_direct(
                std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true),
                &probe,
            )?;
            file.write_all_at(AlignedBuf::zeroed(BLOCK_BYTES).bytes(), 0)
        })();
        let _ = std::fs::remove_file(&probe);
        result
    }
}

impl LogFileFactory for DirectFiles {
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(open_append_file(path)?))
    }
    fn prepares(&self) -> bool {
        true
    }
    fn prepare(&self, path: &Path, bytes: u64, stop: &dyn Fn() -> bool) -> io::Result<()> {
        prepare_zeroed_file_direct(path, bytes, stop)
    }
    fn open_prepared(&self, path: &Path, offset: u64) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(DirectFile::open(path, offset)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-direct-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Appends of every size class — within a block, across blocks, ending on a block
    /// boundary, larger than the buffer — then a reopen in the middle of a block: the file
    /// reads back as exactly the bytes appended, followed by the prepared zeros.
    #[test]
    fn a_direct_segment_reads_back_as_appended_across_blocks_and_reopens() {
        let dir = temp_dir("append");
        let path = dir.join("segment");
        let prepared = 4 * APPEND_BUFFER_BYTES as u64;
        // Written over a longer file with old bytes in it (a spare): cut, and zeros.
        std::fs::write(&path, vec![0xAB; prepared as usize + 5000]).unwrap();
        DirectFiles.prepare(&path, prepared, &|| false).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), prepared);
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));

        let mut expected = Vec::new();
        let sizes = [
            1,
            17,
            BLOCK_BYTES - 18,
            BLOCK_BYTES,
            3 * BLOCK_BYTES + 5,
            0,
            APPEND_BUFFER_BYTES + 123,
            2 * APPEND_BUFFER_BYTES - 7,
            4095,
            1,
        ];
        let mut next = 0u8;
        let mut appended = |file: &mut Box<dyn LogFile>, expected: &mut Vec<u8>, n: usize| {
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    next = next.wrapping_add(1).max(1);
                    next
                })
                .collect();
            file.append(&bytes).unwrap();
            expected.extend_from_slice(&bytes);
        };
        let mut file = DirectFiles.open_prepared(&path, 0).unwrap();
        for n in sizes {
            appended(&mut file, &mut expected, n);
        }
        file.sync().unwrap();
        drop(file);
        let offset = expected.len() as u64;
        assert_ne!(
            offset % BLOCK_BYTES as u64,
            0,
            "the reopen lands inside a block"
        );
        let mut file = DirectFiles.open_prepared(&path, offset).unwrap();
        for n in [10, BLOCK_BYTES + 1] {
            appended(&mut file, &mut expected, n);
        }
        (file.sync_handle().expect("a second handle syncs"))().unwrap();

        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len() as u64, prepared);
        assert_eq!(&on_disk[..expected.len()], &expected[..]);
        assert!(on_disk[expected.len()..].iter().all(|&b| b == 0));

        // Sealed: cut to its frames, durably.
        file.seal(expected.len() as u64).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_probe_accepts_a_file_system_with_direct_io_and_leaves_nothing() {
        let dir = temp_dir("probe");
        DirectFiles::check_dir(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
