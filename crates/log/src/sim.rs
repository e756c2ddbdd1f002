//! [`SimDisk`]: a deterministic in-memory disk behind [`LogFileFactory`], for power-loss and
//! crash simulation tests. **A test tool**: nothing in the server uses it.
//!
//! # What is modelled
//! - Every segment file the log opens lives in memory: the bytes appended (the OS page
//!   cache), the length known synced (on stable storage), and whether the file's directory
//!   entry is durable (a file created since the directory was last synced may vanish on
//!   power loss).
//! - A file that exists in the real directory the first time it is opened is read from
//!   there and taken as fully durable: the real directory is the disk as it stood when the
//!   simulated process started (after recovery).
//! - Faults, one of each at most, from a [`FaultPlan`]: the N-th `append` fails (nothing
//!   written) or is short (a prefix written, then an error); the N-th `sync` fails (nothing
//!   more becomes durable, and the unsynced bytes become uncertain, see below).
//! - A cut ([`SimDisk::halt_at_op`] or [`SimDisk::halt_now`]): at that instant the disk
//!   freezes — the operation in flight and every later one fail, as if the process were
//!   gone — and the image of what survives is taken, atomically with the freeze:
//!   - [`Cut::ProcessCrash`]: the OS survives, so every appended byte is kept (of an append
//!     in flight, a random prefix) — except in a file whose `sync` failed: Linux may drop
//!     the dirty pages of a failed `fdatasync` ("fsyncgate"), so there only a random prefix
//!     of the unsynced bytes is kept, as on power loss;
//!   - [`Cut::PowerLoss`]: synced bytes are kept; of each file's unsynced tail a random
//!     prefix is kept (torn at any byte, possibly mid-frame), sometimes followed by zero
//!     fill (the file's size reached the disk, its data did not); a file whose directory
//!     entry was never synced may vanish entirely.
//! - [`Image::materialize`] writes an image to a real directory, so the normal recovery
//!   reads it.
//!
//! # What is not modelled
//! Snapshots and segment retirement (plain `std::fs` with fsync and rename; they stay on the
//! real file system), failing directory syncs, and garbage (non-zero bytes never written)
//! in an unsynced tail. Zeroed holes *inside* an unsynced tail (pages persisted out of order)
//! only on request ([`FaultPlan::holes`]): recovery cannot tell such a hole from damage to
//! synced frames, so it refuses to start rather than guess — no acknowledged data is lost,
//! but an operator has to truncate the segment by hand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::io::{LogFile, LogFileFactory};

/// How an `append` fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFault {
    /// Nothing is written.
    Fail,
    /// The first `keep` bytes (at most all but one) are written, then an error.
    Short { keep: usize },
}

/// The faults a [`SimDisk`] injects. Operations are counted from 1 across every file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The `n`-th append fails this way.
    pub write: Option<(u64, WriteFault)>,
    /// The `n`-th sync fails.
    pub sync: Option<u64>,
    /// The disk is cut this way at its `n`-th operation (append or sync, counted together),
    /// which does not happen.
    pub halt: Option<(u64, Cut)>,
    /// Seeds the random choices of a cut (torn lengths, zero fill, vanishing files).
    pub seed: u64,
    /// On power loss, sometimes also zero a range *inside* the kept unsynced tail, as file
    /// systems that persist pages out of order and expose unwritten extents as zeros can.
    /// Off by default: recovery refuses such a file as corruption (see the module docs).
    pub holes: bool,
}

/// How the simulated process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The process dies; the OS and its page cache survive.
    ProcessCrash,
    /// The machine loses power: only what was synced is sure to survive.
    PowerLoss,
}

/// What survives a cut: per file, its bytes, or `None` if the file vanished.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    pub files: BTreeMap<PathBuf, Option<Vec<u8>>>,
}

impl Image {
    /// Writes the image into `dir` (each file under its own file name): surviving files are
    /// replaced by their image, vanished ones removed. Files of `dir` the simulation never
    /// opened are left as they are.
    pub fn materialize(&self, dir: &Path) -> std::io::Result<()> {
        for (path, bytes) in &self.files {
            let name = path.file_name().ok_or_else(|| {
                std::io::Error::other(format!("{} has no file name", path.display()))
            })?;
            let target = dir.join(name);
            match bytes {
                Some(bytes) => std::fs::write(&target, bytes)?,
                None => match std::fs::remove_file(&target) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
            }
        }
        Ok(())
    }
}

/// Counters of a [`SimDisk`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub appends: u64,
    pub syncs: u64,
    pub dir_syncs: u64,
    pub bytes_appended: u64,
    /// Injected faults that happened (not counting the cut).
    pub faults: u64,
    /// Of those, failed syncs.
    pub sync_faults: u64,
    /// The cut came from the plan (at an operation), not from [`SimDisk::halt_now`].
    pub planned_cut: bool,
}

#[derive(Debug)]
struct SimFile {
    data: Vec<u8>,
    synced_len: usize,
    entry_durable: bool,
    /// A sync of this file failed: the kernel may have dropped its dirty pages, so even a
    /// process crash keeps only a prefix of the unsynced bytes.
    sync_failed: bool,
    /// Bytes made durable by syncs that succeeded before any sync of this file failed:
    /// after a failed sync a later one may report success for pages the kernel dropped
    /// (fsyncgate), so it proves nothing.
    trusted_synced_len: usize,
}

/// One file of a [`SimDisk`] at one moment, by length ([`SimDisk::lengths`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLengths {
    /// Bytes appended: what the page cache holds.
    pub written: u64,
    /// Bytes that any cut keeps: synced by a sync that proved it (see `trusted_synced_len`),
    /// and 0 while the file's directory entry is not durable (a power loss may lose it).
    pub durable: u64,
}

struct State {
    files: BTreeMap<PathBuf, SimFile>,
    plan: FaultPlan,
    ops: u64,
    stats: SimStats,
    image: Option<Image>,
    rng: u64,
    fault_reasons: Vec<String>,
}

struct Inner {
    state: Mutex<State>,
    /// Set (before the failing call returns) by the first injected fault.
    faulted: AtomicBool,
}

/// The simulated disk. Cheap to clone; clones share the disk.
#[derive(Clone)]
pub struct SimDisk {
    inner: Arc<Inner>,
}

impl SimDisk {
    pub fn new(plan: FaultPlan) -> Self {
        SimDisk {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    files: BTreeMap::new(),
                    plan,
                    ops: 0,
                    stats: SimStats::default(),
                    image: None,
                    rng: plan.seed ^ 0x2545_F491_4F6C_DD1D,
                    fault_reasons: Vec::new(),
                }),
                faulted: AtomicBool::new(false),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cuts the disk now (if not cut already) and returns the image of what survives.
    pub fn halt_now(&self, cut: Cut) -> Image {
        let mut st = self.lock();
        if st.image.is_none() {
            st.halt(cut, None);
        }
        st.image.clone().expect("halted")
    }

    /// Whether the disk has been cut (by its plan or [`SimDisk::halt_now`]).
    pub fn halted(&self) -> bool {
        self.lock().image.is_some()
    }

    /// The image taken when the disk was cut.
    pub fn image(&self) -> Option<Image> {
        self.lock().image.clone()
    }

    /// True once an injected fault happened (the cut does not count). Set before the
    /// failing call returns, so a waiter completed `Ok` after it was set was acknowledged
    /// after a failed write or sync.
    pub fn faulted(&self) -> bool {
        self.inner.faulted.load(Ordering::SeqCst)
    }

    /// What the injected faults were, in order.
    pub fn fault_reasons(&self) -> Vec<String> {
        self.lock().fault_reasons.clone()
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Every file's lengths now. An acknowledgement can be checked against the lengths
    /// taken when it was made: whatever the threads' timing, a commit acknowledged as
    /// written must lie within `written` and one acknowledged as synced within `durable`.
    pub fn lengths(&self) -> BTreeMap<PathBuf, FileLengths> {
        self.lock()
            .files
            .iter()
            .map(|(path, f)| {
                let durable = if f.entry_durable {
                    f.trusted_synced_len
                } else {
                    0
                };
                let lengths = FileLengths {
                    written: f.data.len() as u64,
                    durable: durable as u64,
                };
                (path.clone(), lengths)
            })
            .collect()
    }

    /// The bytes appended to `path` so far (page cache view), if the disk knows the file.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        self.lock().files.get(path).map(|f| f.data.clone())
    }

    fn fail(&self, st: &mut State, reason: String) -> std::io::Error {
        self.inner.faulted.store(true, Ordering::SeqCst);
        st.stats.faults += 1;
        st.fault_reasons.push(reason.clone());
        std::io::Error::other(reason)
    }

    fn append(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut st = self.lock();
        if st.image.is_some() {
            return Err(halted());
        }
        st.ops += 1;
        st.stats.appends += 1;
        let n = st.stats.appends;
        if let Some((at, cut)) = st.plan.halt {
            if st.ops >= at {
                st.halt(cut, Some((path, bytes)));
                st.stats.planned_cut = true;
                return Err(halted());
            }
        }
        let fault = st.plan.write.filter(|(at, _)| *at == n).map(|(_, f)| f);
        let keep = match fault {
            None => bytes.len(),
            Some(WriteFault::Fail) => 0,
            Some(WriteFault::Short { keep }) => keep.min(bytes.len().saturating_sub(1)),
        };
        let file = st.files.get_mut(path).expect("appends go to opened files");
        file.data.extend_from_slice(&bytes[..keep]);
        st.stats.bytes_appended += keep as u64;
        if fault.is_some() {
            let reason = format!(
                "injected write failure: append #{n} of {} bytes to {} wrote {keep}",
                bytes.len(),
                path.display()
            );
            return Err(self.fail(&mut st, reason));
        }
        Ok(())
    }

    fn sync(&self, path: &Path) -> std::io::Result<()> {
        let mut st = self.lock();
        if st.image.is_some() {
            return Err(halted());
        }
        st.ops += 1;
        st.stats.syncs += 1;
        let n = st.stats.syncs;
        if let Some((at, cut)) = st.plan.halt {
            if st.ops >= at {
                st.halt(cut, None);
                st.stats.planned_cut = true;
                return Err(halted());
            }
        }
        if st.plan.sync == Some(n) {
            let reason = format!(
                "injected fdatasync failure: sync #{n} of {}",
                path.display()
            );
            st.stats.sync_faults += 1;
            if let Some(file) = st.files.get_mut(path) {
                file.sync_failed = true;
            }
            return Err(self.fail(&mut st, reason));
        }
        let file = st.files.get_mut(path).expect("syncs go to opened files");
        file.synced_len = file.data.len();
        if !file.sync_failed {
            file.trusted_synced_len = file.synced_len;
        }
        Ok(())
    }
}

fn halted() -> std::io::Error {
    std::io::Error::other("the simulated disk was cut (crash or power loss)")
}

impl State {
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=n`.
    fn upto(&mut self, n: usize) -> usize {
        (self.next() % (n as u64 + 1)) as usize
    }

    /// Freezes the disk and takes the image. `in_flight` is an append under way.
    fn halt(&mut self, cut: Cut, in_flight: Option<(&Path, &[u8])>) {
        let mut image = Image::default();
        let paths: Vec<PathBuf> = self.files.keys().cloned().collect();
        for path in paths {
            let mut data = self.files[&path].data.clone();
            let synced_len = self.files[&path].synced_len;
            let entry_durable = self.files[&path].entry_durable;
            let sync_failed = self.files[&path].sync_failed;
            if let Some((p, bytes)) = in_flight.filter(|(p, _)| *p == path) {
                debug_assert_eq!(p, path);
                let keep = self.upto(bytes.len());
                data.extend_from_slice(&bytes[..keep]);
            }
            let survived = match cut {
                Cut::ProcessCrash if !sync_failed => Some(data),
                Cut::ProcessCrash if self.next().is_multiple_of(2) => Some(data),
                _ => {
                    if cut == Cut::PowerLoss && !entry_durable && self.next().is_multiple_of(2) {
                        None
                    } else {
                        let unsynced = data.len() - synced_len;
                        // Biased towards the edges: nothing kept, everything kept.
                        let keep = match self.next() % 4 {
                            0 => 0,
                            1 => unsynced,
                            _ => self.upto(unsynced),
                        };
                        let lost = unsynced - keep;
                        data.truncate(synced_len + keep);
                        if self.plan.holes && keep > 1 && self.next().is_multiple_of(2) {
                            let start = synced_len + self.upto(keep - 1);
                            let end = start + 1 + self.upto(synced_len + keep - start - 1);
                            data[start..end].fill(0);
                        }
                        if lost > 0 && self.next().is_multiple_of(4) {
                            let zeros = 1 + self.upto(lost - 1);
                            data.resize(data.len() + zeros, 0);
                        }
                        Some(data)
                    }
                }
            };
            image.files.insert(path, survived);
        }
        self.image = Some(image);
    }
}

impl LogFileFactory for SimDisk {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>> {
        let mut st = self.lock();
        if st.image.is_some() {
            return Err(halted());
        }
        if !st.files.contains_key(path) {
            let file = match std::fs::read(path) {
                Ok(data) => SimFile {
                    synced_len: data.len(),
                    trusted_synced_len: data.len(),
                    data,
                    entry_durable: true,
                    sync_failed: false,
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => SimFile {
                    data: Vec::new(),
                    synced_len: 0,
                    trusted_synced_len: 0,
                    entry_durable: false,
                    sync_failed: false,
                },
                Err(e) => return Err(e),
            };
            st.files.insert(path.to_path_buf(), file);
        }
        Ok(Box::new(SimHandle {
            disk: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        let mut st = self.lock();
        if st.image.is_some() {
            return Err(halted());
        }
        st.stats.dir_syncs += 1;
        for (path, file) in st.files.iter_mut() {
            if path.parent() == Some(dir) {
                file.entry_durable = true;
            }
        }
        Ok(())
    }
}

struct SimHandle {
    disk: SimDisk,
    path: PathBuf,
}

impl LogFile for SimHandle {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.disk.append(&self.path, bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.disk.sync(&self.path)
    }
    /// The background syncer's handle: the same file, synced from another thread (which
    /// makes the order of operations, and so where a planned cut lands, depend on thread
    /// timing — the invariants checked at each cut must hold for every order).
    fn sync_handle(&self) -> Option<crate::io::SyncHandle> {
        let disk = self.disk.clone();
        let path = self.path.clone();
        Some(Box::new(move || disk.sync(&path)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/nonexistent-sluice-sim")
    }

    fn open(disk: &SimDisk, name: &str) -> Box<dyn LogFile> {
        disk.open_append(&dir().join(name)).unwrap()
    }

    #[test]
    fn a_process_crash_keeps_every_appended_byte() {
        let disk = SimDisk::new(FaultPlan::default());
        let mut f = open(&disk, "a.log");
        f.append(b"hello").unwrap();
        f.sync().unwrap();
        f.append(b" world").unwrap();
        let image = disk.halt_now(Cut::ProcessCrash);
        assert_eq!(
            image.files[&dir().join("a.log")].as_deref(),
            Some(&b"hello world"[..])
        );
        assert!(f.append(b"!").is_err(), "a cut disk refuses further I/O");
        assert!(disk.halted() && !disk.faulted());
    }

    #[test]
    fn power_loss_keeps_synced_bytes_and_a_prefix_of_the_rest() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let disk = SimDisk::new(FaultPlan {
                seed,
                ..FaultPlan::default()
            });
            disk.sync_dir(&dir()).unwrap();
            let mut f = open(&disk, "a.log");
            disk.sync_dir(&dir()).unwrap();
            f.append(b"durable").unwrap();
            f.sync().unwrap();
            f.append(b"-volatile").unwrap();
            let image = disk.halt_now(Cut::PowerLoss);
            let bytes = image.files[&dir().join("a.log")].clone().unwrap();
            assert!(bytes.starts_with(b"durable"), "seed {seed}: {bytes:?}");
            let full = b"durable-volatile";
            let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            assert!(
                written >= 7 && full.starts_with(&bytes[..written]),
                "seed {seed}"
            );
            assert!(bytes[written..].iter().all(|&b| b == 0));
            assert!(bytes.len() <= full.len(), "seed {seed}");
            outcomes.insert((written, bytes.len()));
        }
        assert!(outcomes.len() > 5, "{outcomes:?}");
    }

    #[test]
    fn a_file_whose_directory_was_never_synced_can_vanish_on_power_loss() {
        let vanished = (0..64).any(|seed| {
            let disk = SimDisk::new(FaultPlan {
                seed,
                ..FaultPlan::default()
            });
            let mut f = open(&disk, "new.log");
            f.append(b"x").unwrap();
            f.sync().unwrap();
            disk.halt_now(Cut::PowerLoss).files[&dir().join("new.log")].is_none()
        });
        assert!(vanished);
    }

    #[test]
    fn durable_length_counts_only_syncs_before_a_failed_one_and_a_durable_entry() {
        let disk = SimDisk::new(FaultPlan {
            sync: Some(2),
            ..FaultPlan::default()
        });
        let path = dir().join("a.log");
        let mut f = open(&disk, "a.log");
        f.append(b"one").unwrap();
        f.sync().unwrap();
        let lengths = |d: &SimDisk| d.lengths()[&path];
        // Synced, but the directory entry is not durable yet: a power loss may lose it all.
        assert_eq!(
            lengths(&disk),
            FileLengths {
                written: 3,
                durable: 0
            }
        );
        disk.sync_dir(&dir()).unwrap();
        assert_eq!(
            lengths(&disk),
            FileLengths {
                written: 3,
                durable: 3
            }
        );
        f.append(b"two").unwrap();
        assert!(f.sync().is_err(), "sync #2 fails as planned");
        f.append(b"three").unwrap();
        f.sync().unwrap();
        // The sync after the failed one reports success, but proves nothing (fsyncgate).
        assert_eq!(
            lengths(&disk),
            FileLengths {
                written: 11,
                durable: 3
            }
        );
    }

    #[test]
    fn planned_faults_fail_the_nth_write_and_sync() {
        let disk = SimDisk::new(FaultPlan {
            write: Some((2, WriteFault::Short { keep: 3 })),
            sync: Some(2),
            ..FaultPlan::default()
        });
        let mut f = open(&disk, "a.log");
        disk.sync_dir(&dir()).unwrap();
        f.append(b"one").unwrap();
        f.sync().unwrap();
        assert!(!disk.faulted());
        assert!(f.append(b"twotwo").is_err());
        assert!(disk.faulted());
        assert!(f.sync().is_err());
        assert_eq!(disk.contents(&dir().join("a.log")).unwrap(), b"onetwo");
        assert_eq!(disk.stats().faults, 2);
        let image = disk.halt_now(Cut::PowerLoss);
        let bytes = image.files[&dir().join("a.log")].clone().unwrap();
        assert!(bytes.starts_with(b"one"));
    }

    #[test]
    fn a_planned_halt_cuts_at_that_operation() {
        let disk = SimDisk::new(FaultPlan {
            halt: Some((3, Cut::ProcessCrash)),
            ..FaultPlan::default()
        });
        let mut f = open(&disk, "a.log");
        f.append(b"a").unwrap();
        f.sync().unwrap();
        assert!(f.append(b"bbbb").is_err());
        assert!(disk.halted());
        let bytes = disk.image().unwrap().files[&dir().join("a.log")]
            .clone()
            .unwrap();
        assert!(b"abbbb".starts_with(&bytes) && bytes.starts_with(b"a"));
    }
}
