//! Short scheduler slices for the threads a write's acknowledgement waits on.
//!
//! On a busy machine (the bootstrap bench: a 5 M-row snapshot being built and encoded, its
//! client parsing, other processes compiling — more runnable threads than cores) the
//! writer's acknowledgement waited up to 30–44 ms for its own threads to get a CPU: each
//! wake-up of the HTTP worker or the writer thread queued behind threads that had just
//! started a full slice (`perf sched`: the writer thread's scheduling delay p99 1 ms, max
//! 31–44 ms, its run time per wake-up ~0.1 ms). Linux's EEVDF scheduler (6.12+) takes a
//! per-thread slice request (`sched_setattr`'s `sched_runtime` for `SCHED_OTHER`; no
//! privilege needed, the nice value and the thread's share of the CPU are unchanged): a
//! thread with a shorter slice than the one running preempts it when it wakes. So the
//! runtime's workers and the writer and log threads ask for a short slice; bulk work on
//! the live thread keeps the default. Older kernels ignore the field; a refusal (another
//! OS, a seccomp filter) is logged once and changes nothing else.
//!
//! A short slice is a hint the kernel does not always act on (a woken thread still waited a
//! full 4 ms tick behind bulk work now and then), so long bulk loops also pace themselves
//! ([`Pacer`]): they give up the CPU every [`BULK_RUN_MAX`] of work.
//!
//! Two more process settings live here for want of a better home, both asked of the kernel
//! the same way: transparent huge pages ([`set_transparent_huge_pages`]) and the open-file
//! limit ([`raise_open_files_limit`]).
#![allow(unsafe_code)]

use std::time::Duration;

/// `struct sched_attr`, its first version (`SCHED_ATTR_SIZE_VER0`, 48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Asks the scheduler to give thread `tid` (0: the calling thread) slices of `slice`,
/// keeping its nice value and `SCHED_OTHER`.
#[cfg(target_os = "linux")]
pub fn request_slice(tid: i32, slice: Duration) -> std::io::Result<()> {
    let nice = nice(tid)?;
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice.as_nanos().min(u64::MAX as u128) as u64,
        deadline: 0,
        period: 0,
    };
    // SAFETY: a syscall on integers and a pointer to a local, fully initialised struct whose
    // size is passed in it.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &attr as *const SchedAttr, 0) };
    zero_or_errno(r)
}

#[cfg(not(target_os = "linux"))]
pub fn request_slice(_tid: i32, _slice: Duration) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// [`request_slice`] for every thread of this process named one of `names` (see
/// [`own_threads_named`]); how many it applied to.
pub fn request_slice_named(names: &[&str], slice: Duration) -> std::io::Result<usize> {
    let tids = own_threads_named(names)?;
    for &tid in &tids {
        request_slice(tid, slice)?;
    }
    Ok(tids.len())
}

/// The thread ids of this process's threads named one of `names` (their names as
/// `/proc/self/task/*/comm` shows them).
pub fn own_threads_named(names: &[&str]) -> std::io::Result<Vec<i32>> {
    let mut tids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let task = task?;
        let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if !names.contains(&comm.trim_end()) {
            continue;
        }
        if let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) {
            tids.push(tid);
        }
    }
    Ok(tids)
}

/// How long bulk work runs before it offers the CPU to waiting threads ([`Pacer`]).
pub const BULK_RUN_MAX: Duration = Duration::from_micros(250);
/// Steps between two looks at the clock in [`Pacer::step`].
const PACE_CHECK_STEPS: u32 = 256;

/// Cooperative pacing for long bulk work (a million-row view built, hashed or dropped) on
/// a thread that shares the CPUs with the ones a write's acknowledgement waits on: every
/// [`BULK_RUN_MAX`] of work it yields the CPU (`sched_yield`), so a thread woken behind it
/// runs within a quarter of a millisecond.
///
/// *Why.* A short scheduler slice ([`request_slice`]) did not get the woken threads on:
/// `perf sched timehist` of a 1 M-row subscribe showed the live thread running 3.4–4.5 ms
/// at a stretch while the writer's HTTP client (slice 100 µs) waited 3.8–4.1 ms on the same
/// CPU's queue — the 4 ms scheduler tick of a `HZ=250` kernel, not the wake-up, ended each
/// stretch. A yield is a syscall (about a microsecond) per [`BULK_RUN_MAX`] of work when
/// nothing waits.
pub struct Pacer {
    since: std::time::Instant,
    until_check: u32,
    check_steps: u32,
    yields: u64,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new()
    }
}

impl Pacer {
    /// A pacer for small steps (a row): it reads the clock every few hundred.
    pub fn new() -> Pacer {
        Pacer::check_every(PACE_CHECK_STEPS)
    }

    /// A pacer that reads the clock every `steps` steps (1 for steps of tens of
    /// microseconds or more, such as parsing a message).
    pub fn check_every(steps: u32) -> Pacer {
        let steps = steps.max(1);
        Pacer {
            since: std::time::Instant::now(),
            until_check: steps,
            check_steps: steps,
            yields: 0,
        }
    }

    /// Starts a new turn of work (after the thread waited: the wait was not work).
    pub fn restart(&mut self) {
        self.since = std::time::Instant::now();
        self.until_check = self.check_steps;
    }

    /// Times this pacer yielded the CPU.
    pub fn yields(&self) -> u64 {
        self.yields
    }

    /// One step of bulk work done: yields if the work ran [`BULK_RUN_MAX`] since the last
    /// yield (the clock is read every few hundred steps).
    #[inline]
    pub fn step(&mut self) {
        self.until_check -= 1;
        if self.until_check == 0 {
            self.until_check = self.check_steps;
            let now = std::time::Instant::now();
            if now.duration_since(self.since) >= BULK_RUN_MAX {
                std::thread::yield_now();
                self.yields += 1;
                self.since = std::time::Instant::now();
            }
        }
    }
}

/// `iter`, with a [`Pacer`] step per item.
pub fn paced<I: Iterator>(iter: I) -> Paced<I> {
    Paced {
        iter,
        pacer: Pacer::new(),
    }
}

/// See [`paced`].
pub struct Paced<I> {
    iter: I,
    pacer: Pacer,
}

impl<I: Iterator> Iterator for Paced<I> {
    type Item = I::Item;

    #[inline]
    fn next(&mut self) -> Option<I::Item> {
        self.pacer.step();
        self.iter.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.iter.size_hint()
    }
}

/// `Ok` for a syscall's 0, else the thread's `errno` as an error.
#[cfg(target_os = "linux")]
fn zero_or_errno(r: i64) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets the calling thread's nice value (Linux nice values are per thread): the bulk
/// threads (snapshots, chunk encoding, returning freed memory) run at a lower priority than
/// the ones a write's acknowledgement waits on. Raising it back needs privilege.
#[cfg(target_os = "linux")]
pub fn set_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: plain syscalls on integers; the id is the calling thread's own.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    zero_or_errno(r.into())
}

#[cfg(not(target_os = "linux"))]
pub fn set_nice(_nice: i32) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// The nice value of thread `tid` of this process (0: the calling thread).
#[cfg(target_os = "linux")]
pub fn nice(tid: i32) -> std::io::Result<i32> {
    // getpriority returns the nice value, and -1 is a valid one: errno tells errors apart.
    // SAFETY: plain syscalls on integers.
    unsafe {
        let tid = if tid == 0 { libc::gettid() } else { tid };
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(not(target_os = "linux"))]
pub fn nice(_tid: i32) -> std::io::Result<i32> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// With `enabled: false`, stops the kernel from backing this process's memory with
/// transparent huge pages (`PR_SET_THP_DISABLE`; inherited by children): mimalloc asks for them on its arenas
/// (`MADV_HUGEPAGE`), and the first touch of each 2 MiB page then stalls the touching thread
/// while the kernel clears it. On the 2-core VM measured, touching 1 GiB of fresh heap in
/// 256 KiB allocations took 2.3 s with a p99 stall of 4.6 ms per allocation, and 0.35–0.47 s
/// with a p99 of 0.2–0.8 ms with 4 KiB pages — a writer round, a log replay or a view's
/// build that grows the heap pays that. Databases usually say the same (Redis warns when THP
/// is on). Older kernels and other systems refuse; nothing else changes then.
///
/// `enabled: true` lifts that again (a process inherits the setting from its parent, which
/// may have set it).
#[cfg(target_os = "linux")]
pub fn set_transparent_huge_pages(enabled: bool) -> std::io::Result<()> {
    let disable = libc::c_ulong::from(!enabled);
    // SAFETY: a prctl on integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable, 0, 0, 0) };
    zero_or_errno(r.into())
}

#[cfg(not(target_os = "linux"))]
pub fn set_transparent_huge_pages(_enabled: bool) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Whether the kernel may back this process's memory with transparent huge pages, as far as
/// the process decides (`PR_GET_THP_DISABLE`; the system's own setting applies on top).
#[cfg(target_os = "linux")]
pub fn transparent_huge_pages() -> std::io::Result<bool> {
    // SAFETY: a prctl on integer arguments only.
    match unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        r => Ok(r == 0),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn transparent_huge_pages() -> std::io::Result<bool> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Raises this process's soft limit of open files (`RLIMIT_NOFILE`) to `want`, or to the
/// hard limit if that is lower; never lowers it. Returns the soft limit before and after.
///
/// Every client connection is a file descriptor, and service managers start processes with
/// a soft limit of 1024 (systemd's default `LimitNOFILE=1024:524288`) that only exists for
/// programs still using `select(2)`: past it `accept` fails with `EMFILE` and clients are
/// turned away while the machine has room. Servers raise it to the hard limit themselves
/// (Go's runtime does it for every Go program, NATS included).
#[cfg(unix)]
// `rlim_t` is `u64` on 64-bit Linux but not on every Unix.
#[allow(clippy::unnecessary_cast)]
pub fn raise_open_files_limit(want: u64) -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur as u64;
    let target = (want as libc::rlim_t).min(limit.rlim_max);
    if target <= limit.rlim_cur {
        return Ok((before, before));
    }
    limit.rlim_cur = target;
    // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((before, target as u64))
}

#[cfg(not(unix))]
pub fn raise_open_files_limit(_want: u64) -> std::io::Result<(u64, u64)> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Runs test `name` of this binary again in a child process with `env` set (the test
    /// then does its part there) and asserts that it passed: for settings that are
    /// process-wide, which this binary's other tests need not share.
    fn in_child_process(name: &str, env: &str) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name])
            .env(env, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    fn transparent_huge_pages_disabled() -> bool {
        !transparent_huge_pages().expect("PR_GET_THP_DISABLE (Linux 3.15+)")
    }

    #[test]
    fn transparent_huge_pages_can_be_disabled_for_the_process() {
        // In a child process: the setting is process-wide and this test binary's other
        // tests need not share it.
        if std::env::var_os("SLUICE_THP_PROBE").is_some() {
            set_transparent_huge_pages(false).expect("PR_SET_THP_DISABLE (Linux 3.15+)");
            assert!(transparent_huge_pages_disabled());
            set_transparent_huge_pages(true).unwrap();
            assert!(!transparent_huge_pages_disabled());
            return;
        }
        assert!(!transparent_huge_pages_disabled(), "on by default");
        in_child_process(
            "tests::transparent_huge_pages_can_be_disabled_for_the_process",
            "SLUICE_THP_PROBE",
        );
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // `rlim_t` is not `u64` on every Unix
    fn the_open_files_limit_is_raised_to_the_hard_limit_and_never_lowered() {
        // In a child process: the limit is process-wide.
        if std::env::var_os("SLUICE_NOFILE_PROBE").is_some() {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: as in raise_open_files_limit.
            assert_eq!(
                unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
                0
            );
            let hard = limit.rlim_max as u64;
            if hard <= 256 {
                return; // nothing to raise into on this machine
            }
            limit.rlim_cur = 256;
            // SAFETY: as in raise_open_files_limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
            assert_eq!(
                raise_open_files_limit(200).unwrap(),
                (256, 256),
                "never lowered"
            );
            assert_eq!(raise_open_files_limit(300).unwrap(), (256, 300));
            assert_eq!(raise_open_files_limit(u64::MAX).unwrap(), (300, hard));
            // SAFETY: as in raise_open_files_limit.
            assert_eq!(
                unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
                0
            );
            assert_eq!(
                limit.rlim_cur as u64, hard,
                "the kernel holds the raised limit"
            );
            return;
        }
        in_child_process(
            "tests::the_open_files_limit_is_raised_to_the_hard_limit_and_never_lowered",
            "SLUICE_NOFILE_PROBE",
        );
    }

    #[test]
    fn a_pacer_yields_once_bulk_work_ran_its_turn_and_not_before() {
        let mut pacer = Pacer::check_every(1);
        pacer.step();
        assert_eq!(pacer.yields(), 0, "no time has passed");
        std::thread::sleep(BULK_RUN_MAX + Duration::from_micros(50));
        pacer.step();
        assert_eq!(pacer.yields(), 1);
        pacer.step();
        assert_eq!(pacer.yields(), 1, "the turn starts again after a yield");
        std::thread::sleep(BULK_RUN_MAX + Duration::from_micros(50));
        pacer.restart();
        pacer.step();
        assert_eq!(pacer.yields(), 1, "a wait before a restart is not work");

        // The default pacer reads the clock only every PACE_CHECK_STEPS steps.
        let mut rows = Pacer::new();
        std::thread::sleep(BULK_RUN_MAX + Duration::from_micros(50));
        for _ in 1..PACE_CHECK_STEPS {
            rows.step();
        }
        assert_eq!(rows.yields(), 0);
        rows.step();
        assert_eq!(rows.yields(), 1);
    }

    #[test]
    fn a_paced_iterator_yields_every_item_in_order() {
        let items: Vec<u32> = paced(0..10_000).collect();
        assert_eq!(items, (0..10_000).collect::<Vec<_>>());
        assert_eq!(paced(0..7).size_hint(), (7, Some(7)));
    }

    #[test]
    fn a_thread_can_ask_for_a_short_slice_without_privilege() {
        // Kernels before sched_setattr (3.14) refuse with ENOSYS; a short slice is only a
        // hint, so the test accepts that and checks the nice value was kept otherwise.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        match std::thread::spawn(move || {
            let r = request_slice(0, Duration::from_micros(100));
            (r, unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) })
        })
        .join()
        .unwrap()
        {
            (Ok(()), after) => assert_eq!(after, before),
            (Err(e), _) => assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "{e}"),
        }
    }

    #[test]
    fn a_thread_lowers_its_own_priority_only() {
        // SAFETY: getpriority on the calling thread (0) only.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let inside = std::thread::spawn(|| {
            set_nice(7).unwrap();
            // SAFETY: as above.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
        })
        .join()
        .unwrap();
        assert_eq!(inside, 7.max(before));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }, before);
    }

    #[test]
    fn named_threads_are_found() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("slice-probe".into())
            .spawn(move || {
                // Scanned only once the thread runs (and its name shows, below).
                let _ = started_tx.send(());
                rx.recv()
            })
            .unwrap();
        started.recv().unwrap();
        // Where the OS name is set from the spawning side, it may land after the thread
        // runs: wait (bounded) until the kernel shows it.
        let named_by = std::time::Instant::now() + Duration::from_secs(10);
        while own_threads_named(&["slice-probe"]).unwrap().is_empty()
            && std::time::Instant::now() < named_by
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let n = request_slice_named(&["slice-probe"], Duration::from_micros(100));
        drop(tx);
        let _ = t.join();
        match n {
            Ok(n) => assert_eq!(n, 1, "threads named slice-probe"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "{e}"),
        }
    }
}
