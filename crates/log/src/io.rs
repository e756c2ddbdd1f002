//! The file the log writer appends to, behind a trait so tests can inject failures.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An append-only log file.
pub trait LogFile: Send {
    /// Appends all of `bytes`. On success the bytes **must** be in the OS page cache (they
    /// survive a process crash, not power loss).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// On success every byte appended so far **must** be on stable storage.
    fn sync(&mut self) -> std::io::Result<()>;
    /// A second handle on the same file for syncing on another thread while appends go
    /// on: calling it **must** make every byte appended before the call durable, as
    /// [`LogFile::sync`] would, and **must** report a write-back error of any of those bytes
    /// even if another handle's sync reported it first (several syncs run at once: for a
    /// real file, a file description of its own, not a `dup`, whose error cursor another
    /// sync would advance). `None` (the default) if the file has none; the log then syncs on
    /// its own thread.
    fn sync_handle(&self) -> Option<SyncHandle> {
        None
    }
    /// The segment is complete after `len` bytes: anything the file holds past them (the
    /// unwritten part of a prepared file) is cut, durably, before a newer segment can exist
    /// (only the newest segment may end in anything but a whole frame). A no-op for a file
    /// that only ever grew by appends, which is exactly `len` bytes long.
    fn seal(&mut self, len: u64) -> std::io::Result<()> {
        let _ = len;
        Ok(())
    }
    /// Called once the segment is sealed and durable, never to be appended to again: lets
    /// the OS drop the file's cached pages (normal operation never reads a segment back;
    /// recovery does, from the device if they are gone). A no-op by default.
    fn release_cache(&self) {}
}

/// See [`LogFile::sync_handle`].
pub type SyncHandle = Box<dyn FnMut() -> std::io::Result<()> + Send>;

impl LogFile for File {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
    fn sync_handle(&self) -> Option<SyncHandle> {
        let file = own_description(self)?;
        Some(Box::new(move || file.sync_data()))
    }
    fn release_cache(&self) {
        drop_cached_pages(self);
    }
}

/// A segment written over a prepared file ([`LogFileFactory::prepare`]): frames overwrite
/// its zeros from offset 0 (the file is opened without `O_APPEND`, its cursor starts at 0),
/// so an `fdatasync` finds the blocks allocated and the size unchanged and flushes the data
/// only — no file-system journal commit for a growing file (on ext4 here, 110 µs instead
/// of 170–185 µs per sync, and a third less CPU; ARCHITECTURE "Prepared segments").
pub struct PreparedFile {
    file: File,
}

impl LogFile for PreparedFile {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn sync_handle(&self) -> Option<SyncHandle> {
        self.file.sync_handle()
    }
    fn seal(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)?;
        // The size is metadata an `fdatasync` of a shrunk file need not write: a full sync.
        self.file.sync_all()
    }
    fn release_cache(&self) {
        drop_cached_pages(&self.file);
    }
}

/// Asks the OS to drop `file`'s clean cached pages (`POSIX_FADV_DONTNEED`), as PostgreSQL
/// does with a WAL segment it closes: advice only, so a failure changes nothing. On a
/// machine whose fresh memory is slow (a VM whose host backs guest memory on first use, and
/// takes back what the guest leaves free), the freed pages are what the preparer's zeros for
/// the next segment land in, instead of pages the page cache takes fresh (ARCHITECTURE
/// *Prepared segments*).
#[allow(unsafe_code)]
pub(crate) fn drop_cached_pages(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: an advice call on a file descriptor `file` owns; no memory is passed.
        let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            tracing::debug!(
                errno = r,
                "posix_fadvise(DONTNEED) on a sealed log segment failed"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Bytes of zeros written per `write` while preparing a file: small enough that one write
/// into fresh page cache (~0.4 GB/s on the VM measured) stays well under a millisecond, so
/// the preparer can offer the CPU between writes (a 64 MiB segment written in 1 MiB writes
/// ran 4–6 ms at a stretch in `perf sched timehist`, while the threads of the write path
/// waited behind it for the scheduler's tick).
pub(crate) const PREPARE_CHUNK_BYTES: usize = 256 << 10;

/// Makes `path` a file of `bytes` zero bytes and syncs it, stopping early with
/// [`std::io::ErrorKind::Interrupted`] once `stop` returns true. A file already there (a
/// retired segment handed on as the log's spare, or one left by an earlier run) is written
/// over in place, not truncated first: its pages are likely still in the page cache, and
/// writing into them costs a copy, where truncating frees them and every new page has to
/// be allocated and zeroed again (on a VM whose host backs guest memory lazily, ~0.4 GB/s
/// against ~10 GB/s measured here); its blocks stay allocated, too.
pub fn prepare_zeroed_file(
    path: &std::path::Path,
    bytes: u64,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)?;
    write_zeros_over(&file, bytes, &vec![0u8; PREPARE_CHUNK_BYTES], 1, stop)
}

/// Writes `bytes` zeros over `file` from offset 0, `zeros.len()` bytes per write (each
/// rounded up to a multiple of `unit`, for direct writes), offering the CPU between writes
/// and stopping with `Interrupted` once `stop` returns true; then cuts the file to `bytes`
/// (a longer file written over keeps nothing past them, nor the last write's rounding) and
/// syncs it. Shared by the buffered and the direct preparer.
pub(crate) fn write_zeros_over(
    file: &File,
    bytes: u64,
    zeros: &[u8],
    unit: u64,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut pacer = sluice_sched::Pacer::check_every(1);
    let mut at = 0u64;
    while at < bytes {
        pacer.step();
        if stop() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "the log is stopping",
            ));
        }
        let n = (bytes - at).min(zeros.len() as u64).next_multiple_of(unit) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.set_len(bytes)?;
    file.sync_all()
}

/// The same file opened anew: `fdatasync` through it flushes the file whoever wrote it, and,
/// unlike a `dup` (which shares the file description and so its write-back error cursor),
/// it reports a write-back error even if a sync through another description already did.
#[cfg(target_os = "linux")]
pub(crate) fn own_description(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// Elsewhere, no second handle: the log syncs on its own thread.
#[cfg(not(target_os = "linux"))]
pub(crate) fn own_description(_file: &File) -> Option<File> {
    None
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
    /// Whether this factory prepares segment files ([`LogFileFactory::prepare`]); only then
    /// does the log run its preparing thread.
    fn prepares(&self) -> bool {
        false
    }
    /// Writes a file of `bytes` zeros at `path` and makes it durable, for a later segment
    /// (see [`PreparedFile`]); gives up early with `Interrupted` once `stop` returns true.
    fn prepare(
        &self,
        path: &std::path::Path,
        bytes: u64,
        stop: &dyn Fn() -> bool,
    ) -> std::io::Result<()> {
        let _ = (path, bytes, stop);
        Err(std::io::Error::other(
            "this log file factory prepares no files",
        ))
    }
    /// Opens a prepared segment for writing over its zeros from byte `offset` (0 for a file
    /// just prepared; after a restart, where recovery found its frames end).
    fn open_prepared(
        &self,
        path: &std::path::Path,
        offset: u64,
    ) -> std::io::Result<Box<dyn LogFile>> {
        let _ = (path, offset);
        Err(std::io::Error::other(
            "this log file factory prepares no files",
        ))
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

/// Real files, opened for appending (created if missing).
pub struct RealFiles;

impl LogFileFactory for RealFiles {
    fn open_append(&self, path: &std::path::Path) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(open_append_file(path)?))
    }
    fn prepares(&self) -> bool {
        true
    }
    fn prepare(
        &self,
        path: &std::path::Path,
        bytes: u64,
        stop: &dyn Fn() -> bool,
    ) -> std::io::Result<()> {
        prepare_zeroed_file(path, bytes, stop)
    }
    fn open_prepared(
        &self,
        path: &std::path::Path,
        offset: u64,
    ) -> std::io::Result<Box<dyn LogFile>> {
        use std::io::Seek;
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.seek(std::io::SeekFrom::Start(offset))?;
        Ok(Box::new(PreparedFile { file }))
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
    fn sync_handle(&self) -> Option<SyncHandle> {
        let file = own_description(&self.file)?;
        let (syncs, fail_from) = (self.syncs.clone(), self.fail_from);
        Some(Box::new(move || {
            let n = syncs.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= fail_from {
                return Err(std::io::Error::other("injected fdatasync failure"));
            }
            file.sync_data()
        }))
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

/// Bytes one step of [`remove_file_gradually`] frees.
pub const REMOVE_STEP_BYTES: u64 = 4 << 20;

/// Suffix of a file [`remove_file_gradually`] is deleting. It ends in `.tmp`, so a server
/// that starts after a crash part-way removes it with its other temporary files.
pub const RETIRED_SUFFIX: &str = ".retired.tmp";

/// Deletes a large file (a retired segment or snapshot) a few MiB at a time, so that the
/// log's syncs never wait long behind the deletion.
///
/// Why: on a filesystem mounted with online discard (ext4 `discard`, usual on cloud VMs,
/// and this project's test machines) freeing a file's blocks issues the discards inside
/// the journal commit, and a log `fdatasync` that needs a commit waits for them. Measured:
/// one `unlink` of a 64 MiB segment took 13.8 ms, and an fsync-class acknowledgement
/// waited out most of it. Here the file is first renamed out of sight
/// (`<name>`[`RETIRED_SUFFIX`], the directory synced, so a crash part-way never leaves a
/// short file under a name recovery reads), then shrunk by [`REMOVE_STEP_BYTES`] per step,
/// each step synced so that it is a journal commit of its own, then unlinked.
pub fn remove_file_gradually(path: &std::path::Path) -> std::io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return std::fs::remove_file(path);
    };
    let mut retired_name = name.to_os_string();
    retired_name.push(RETIRED_SUFFIX);
    let retired = dir.join(retired_name);
    std::fs::rename(path, &retired)?;
    sync_dir(dir)?;
    let file = std::fs::OpenOptions::new().write(true).open(&retired)?;
    shrink_gradually(&file, 0)?;
    drop(file);
    std::fs::remove_file(&retired)
}

/// Shrinks `file` towards `len` bytes [`REMOVE_STEP_BYTES`] per synced step while more than
/// a step is left (see [`remove_file_gradually`] for why), leaving the last step to the
/// caller (a final `set_len`, or an unlink).
pub fn shrink_gradually(file: &File, len: u64) -> std::io::Result<()> {
    let mut at = file.metadata()?.len();
    while at > len + REMOVE_STEP_BYTES {
        at -= REMOVE_STEP_BYTES;
        file.set_len(at)?;
        file.sync_data()?;
    }
    Ok(())
}

/// Bytes of `path` in the page cache (`mincore` over a read-only mapping, which faults
/// nothing in), or `None` on a file system whose pages cannot be dropped (tmpfs: its page
/// cache is the file) or where the file cannot be mapped. For tests of
/// [`drop_cached_pages`].
#[cfg(all(test, target_os = "linux"))]
#[allow(unsafe_code)]
pub(crate) fn resident_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let file = File::open(path).ok()?;
    let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
    // SAFETY: `statfs` writes into the zeroed struct it is given; the fd is open.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 || fs.f_type as i64 == TMPFS_MAGIC {
        return None;
    }
    if len == 0 {
        return Some(0);
    }
    let page = 4096usize;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open file, read by
    // `mincore` into a vector of one byte per page, then unmapped; nothing dereferences it.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if map == libc::MAP_FAILED {
            return None;
        }
        let r = libc::mincore(map, len, resident.as_mut_ptr());
        libc::munmap(map, len);
        if r != 0 {
            return None;
        }
    }
    Some(resident.iter().filter(|b| *b & 1 == 1).count() as u64 * page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A written, synced file's pages leave the page cache when dropped, and its bytes
    /// read back unchanged (from the device).
    #[cfg(target_os = "linux")]
    #[test]
    fn dropped_pages_of_a_synced_file_leave_the_cache_and_the_bytes_stay() {
        let dir = std::env::temp_dir().join(format!("sluice-dontneed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("00000000000000000001.log");
        let bytes: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        let Some(before) = resident_bytes(&path) else {
            eprintln!("skipped: the temp dir's file system keeps its pages (tmpfs)");
            return;
        };
        assert!(before >= 6 << 20, "just written, mostly cached: {before}");
        drop_cached_pages(&file);
        assert_eq!(resident_bytes(&path), Some(0));
        assert!(std::fs::read(&path).unwrap() == bytes);
        assert!(
            resident_bytes(&path).unwrap() >= 6 << 20,
            "read back into the cache"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_removed_gradually_is_gone_and_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("sluice-remove-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("00000000000000000001.log");
        let len = 3 * REMOVE_STEP_BYTES + 12_345;
        std::fs::write(&path, vec![7u8; len as usize]).unwrap();
        let keep = dir.join("other.log");
        std::fs::write(&keep, b"kept").unwrap();
        remove_file_gradually(&path).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["other.log".to_string()]);
        assert_eq!(std::fs::read(&keep).unwrap(), b"kept");
        // A missing file is an error, as for `std::fs::remove_file`.
        let err = remove_file_gradually(&path).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
