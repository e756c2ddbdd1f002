//! Small operating-system helpers: temp dirs, free loopback ports, signals sent to one pid,
//! waiting for a child with a deadline, and the machine facts that go into `run.json`.
//!
//! Every process the bench stops is one it started, addressed by its own pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

/// A directory under the system temp dir, removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/sluice-bench-<label>-<pid>-<n>`, emptying a leftover of that name.
    /// The first call in a process also removes the dirs that bench processes which no longer
    /// run left behind (a `kill -9` skips `Drop`), so killed runs do not fill the disk.
    pub fn new(label: &str) -> anyhow::Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            sweep_stale_dirs(&std::env::temp_dir(), pid_is_running);
        }
        let path =
            std::env::temp_dir().join(format!("sluice-bench-{label}-{}-{n}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot empty {}", path.display()))?;
        }
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The pid in a name `sluice-bench-<label>-<pid>-<n>` (the label may contain dashes).
fn bench_dir_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("sluice-bench-")?;
    let mut parts = rest.rsplitn(3, '-');
    let n = parts.next()?;
    let pid = parts.next()?;
    let label = parts.next()?;
    if label.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

fn pid_is_running(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes every `sluice-bench-<label>-<pid>-<n>` directory under `dir` whose pid is not
/// running; returns how many it removed. A dir whose pid runs (ours, or a reused pid) stays.
fn sweep_stale_dirs(dir: &Path, running: impl Fn(u32) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(bench_dir_pid) else {
            continue;
        };
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if !is_dir || running(pid) {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            eprintln!(
                "removed a stale bench dir of pid {pid}: {}",
                entry.path().display()
            );
            removed += 1;
        }
    }
    removed
}

/// CLOCK_MONOTONIC in seconds: where a result names a moment, this lets it be matched with a
/// trace taken meanwhile (`perf record -k CLOCK_MONOTONIC`; `Instant` reads the same clock
/// but does not show it).
pub fn monotonic_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// A loopback port that was free a moment ago, below the ephemeral range so that no outgoing
/// connection takes it before its server binds it ([`sluice_cluster::testkit::free_ports`]).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(sluice_cluster::testkit::free_ports(1)?[0])
}

/// Sends `signal` (e.g. `TERM`) to exactly `pid` with `kill(1)`; `std` only sends SIGKILL.
pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("cannot run kill(1)")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed: {status}");
    Ok(())
}

/// Waits up to `timeout` for `child` to exit; `true` if it did.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Stops `child` (our own, by its pid): SIGTERM, up to `timeout` for it to exit, then
/// SIGKILL; reaps it. `name` is for the message when SIGTERM was not enough.
pub fn stop_child(child: &mut Child, name: &str, timeout: Duration) {
    if let Ok(None) = child.try_wait() {
        let _ = signal(child.id(), "TERM");
        if !wait_timeout(child, timeout) {
            eprintln!(
                "{name} (pid {}) did not stop within {timeout:?} of SIGTERM; sending SIGKILL",
                child.id()
            );
        }
    }
    kill_and_reap(child);
}

/// The state letter (`Z` for a zombie) and parent pid of process `pid`, from
/// `/proc/<pid>/stat`; `None` if it is gone.
pub fn proc_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`; `comm` may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// The pids of `parent`'s living children (not yet exited), from `/proc/<pid>/stat`.
/// A child of ours keeps its pid until we reap it, so no pid here is a stranger's.
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(
            |&pid| matches!(proc_state(pid), Some((state, ppid)) if state != 'Z' && ppid == parent),
        )
        .collect()
}

/// How long [`stop_children_on_signal`] gives the bench's children after SIGINT.
const SIGNAL_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// On SIGINT, SIGTERM or SIGHUP, stops every process this bench started (SIGINT, then
/// SIGKILL after [`SIGNAL_STOP_TIMEOUT`]), removes its temp dirs and exits with 128 + the
/// signal's number. Without it the signal ended the bench alone: `Drop` does not run, and a
/// `kill <bench pid>` left its `sluice serve`, PostgreSQL, Redis and NATS servers running
/// (Ctrl-C in a terminal reached them only because it signals the whole process group).
/// Call it before the first child starts.
pub fn stop_children_on_signal() {
    let watcher = std::thread::Builder::new()
        .name("sluice-bench-signals".into())
        .spawn(|| {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                return;
            };
            let received = runtime.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let mut interrupt = signal(SignalKind::interrupt()).ok()?;
                let mut terminate = signal(SignalKind::terminate()).ok()?;
                let mut hangup = signal(SignalKind::hangup()).ok()?;
                Some(tokio::select! {
                    _ = interrupt.recv() => ("SIGINT", 2),
                    _ = terminate.recv() => ("SIGTERM", 15),
                    _ = hangup.recv() => ("SIGHUP", 1),
                })
            });
            let Some((name, number)) = received else {
                return;
            };
            let stopped = stop_own_children();
            let me = std::process::id();
            sweep_stale_dirs(&std::env::temp_dir(), |pid| pid != me);
            eprintln!(
                "sluice bench: {name}: stopped the processes it had started (pids {stopped:?}) and removed its temp dirs"
            );
            std::process::exit(128 + number);
        });
    if let Err(e) = watcher {
        eprintln!(
            "sluice bench: cannot watch for signals ({e}); a signal will end the bench alone"
        );
    }
}

/// SIGINTs this process's children, SIGKILLs those still running after
/// [`SIGNAL_STOP_TIMEOUT`]; returns the pids it signalled. SIGINT is the fast shutdown of
/// every server the bench runs; PostgreSQL's SIGTERM is a "smart" one that would wait for
/// the bench's own connections to close.
fn stop_own_children() -> Vec<u32> {
    let me = std::process::id();
    let children = children_of(me);
    for &pid in &children {
        let _ = signal(pid, "INT");
    }
    let deadline = Instant::now() + SIGNAL_STOP_TIMEOUT;
    loop {
        let running: Vec<u32> = children_of(me)
            .into_iter()
            .filter(|pid| children.contains(pid))
            .collect();
        if running.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            for pid in running {
                let _ = signal(pid, "KILL");
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
}

/// SIGKILLs `child` (our own child, by its pid) and reaps it.
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// The last `lines` lines of a text file, for error messages about a child that died.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Total size in bytes of the regular files directly in `dir` whose name satisfies `keep`.
pub fn dir_bytes(dir: &Path, keep: impl Fn(&str) -> bool) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| keep(&e.file_name().to_string_lossy()))
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant), valid for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Facts about the machine and the build, for `run.json` and the summary header.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub memory_bytes: Option<u64>,
    pub kernel: Option<String>,
    pub os: Option<String>,
    /// `/proc/loadavg` when the run started: other work on the machine skews numbers.
    pub load_average: Option<String>,
    /// GiB/s at which new memory became usable when the run started ([`fresh_memory_rate`]):
    /// on a VM whose host backs guest pages on first use it is several times slower than
    /// reusing memory, and cases that grow the server's memory move with it.
    pub fresh_memory_gib_per_s: Option<f64>,
    /// ns per dependent load over memory far larger than any cache when the run started
    /// ([`memory_latency_ns`]): the same VM has measured 56 to 344 ns for the same lookups
    /// on different days, and every case bound by cache misses (the writer's row lookups,
    /// view maintenance, replay) moves with it.
    pub memory_latency_ns: Option<f64>,
    /// ns per step of a dependent rotate-and-multiply chain ([`cpu_step_ns`]): the core's
    /// clock as this run had it (4 cycles a step on the AMD EPYC cores this was written on).
    pub cpu_step_ns: Option<f64>,
    pub sluice_version: &'static str,
    pub build_profile: &'static str,
    pub rustc: Option<String>,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
}

impl MachineInfo {
    /// Reads `/proc` and asks `rustc` and `git` (both optional, both quick).
    pub fn collect() -> MachineInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string());
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kib| kib.parse::<u64>().ok())
            })
            .map(|kib| kib * 1024);
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_string())
            });
        // The working directory's repository, else the one the executable was built in.
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let repo = [Some(PathBuf::from(".")), exe_dir]
            .into_iter()
            .flatten()
            .find(|d| {
                command_output("git", &["-C", &d.to_string_lossy(), "rev-parse", "HEAD"]).is_some()
            });
        let git = |args: &[&str]| {
            let dir = repo.as_ref()?.to_string_lossy().into_owned();
            command_output_raw("git", &[&["-C", dir.as_str()][..], args].concat())
        };
        let git_commit = git(&["rev-parse", "HEAD"]).map(|s| s.trim().to_string());
        let git_dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.trim().is_empty());
        MachineInfo {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_bytes,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_string()),
            os,
            load_average: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")),
            fresh_memory_gib_per_s: fresh_memory_rate(),
            memory_latency_ns: memory_latency_ns(),
            cpu_step_ns: Some(cpu_step_ns()),
            sluice_version: env!("CARGO_PKG_VERSION"),
            build_profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            rustc: command_output("rustc", &["--version"]),
            git_commit,
            git_dirty,
        }
    }

    /// One line for the top of a summary.
    pub fn one_line(&self) -> String {
        let mut parts = vec![format!("{} CPU(s)", self.nproc)];
        if let Some(m) = &self.cpu_model {
            parts.push(m.clone());
        }
        if let Some(b) = self.memory_bytes {
            parts.push(format!("{:.1} GiB RAM", b as f64 / (1u64 << 30) as f64));
        }
        if let Some(k) = &self.kernel {
            parts.push(format!("Linux {k}"));
        }
        if let Some(l) = &self.load_average {
            parts.push(format!("load average {l} at start"));
        }
        if let Some(r) = self.fresh_memory_gib_per_s {
            parts.push(format!("fresh memory {r:.2} GiB/s"));
        }
        if let Some(ns) = self.memory_latency_ns {
            parts.push(format!("memory latency {ns:.0} ns"));
        }
        if let Some(ns) = self.cpu_step_ns {
            parts.push(format!("{ns:.2} ns per dependent multiply"));
        }
        let mut build = format!(
            "sluice {} ({} build",
            self.sluice_version, self.build_profile
        );
        if let Some(c) = &self.git_commit {
            build.push_str(&format!(", git {}", &c[..c.len().min(12)]));
            if self.git_dirty == Some(true) {
                build.push_str(" + local changes");
            }
        }
        build.push(')');
        parts.push(build);
        parts.join(", ")
    }
}

/// Bytes [`fresh_memory_rate`] touches: enough to span many huge pages, little enough to take
/// well under a second on the slowest machine seen (0.55 GiB/s).
const FRESH_MEMORY_PROBE_BYTES: usize = 256 << 20;

/// Below this many GiB/s, fresh memory is slow enough to say so in a summary (a bare-metal
/// Linux machine faults in and zeroes new pages at 4–10 GiB/s; the VM this was measured on
/// does 0.55–2.3).
pub const FRESH_MEMORY_SLOW_GIB_PER_S: f64 = 2.0;

/// GiB/s to fault in [`FRESH_MEMORY_PROBE_BYTES`] of memory this process never used (one write
/// per 4 KiB page of a new allocation, which the allocator takes straight from the OS), or
/// `None` if the allocation failed.
///
/// *Why measure it.* On this project's 2-core VM the kernel's zeroing of a new page runs at
/// 0.55 GiB/s for memory the host has not backed yet (right after boot, or seconds after it
/// was freed: the balloon driver reports free pages back to the host) and at ~2 GiB/s for
/// memory it has. A server that grows by 300 bytes a row pays that per row: the same binary
/// ingested 1.26 M rows/s on cold memory and 2.3–2.5 M/s minutes later on warm memory. The
/// figure in each summary says which kind of run it was.
///
/// Measured with transparent huge pages allowed (mimalloc asks for them, as a server
/// recovers with them), whatever the bench process runs on otherwise
/// ([`crate::server::pages_as_serve`]): a huge page's fault shows the host's state starkly —
/// 0.43 GiB/s cold against 15–20 warm — where 4 KiB faults run at ~1.2–3 GiB/s either way.
pub fn fresh_memory_rate() -> Option<f64> {
    const PAGE_BYTES: usize = 4096;
    let before = sluice_sched::transparent_huge_pages().ok();
    if before == Some(false) {
        let _ = sluice_sched::set_transparent_huge_pages(true);
    }
    let rate = (|| {
        let mut block: Vec<u8> = Vec::new();
        block.try_reserve_exact(FRESH_MEMORY_PROBE_BYTES).ok()?;
        let spare = block.spare_capacity_mut();
        let started = Instant::now();
        for page in spare.chunks_mut(PAGE_BYTES) {
            page[0].write(1);
        }
        let elapsed = started.elapsed().as_secs_f64();
        std::hint::black_box(&block);
        Some(FRESH_MEMORY_PROBE_BYTES as f64 / (1u64 << 30) as f64 / elapsed.max(1e-9))
    })();
    if before == Some(false) {
        let _ = sluice_sched::set_transparent_huge_pages(false);
    }
    rate
}

/// Bytes [`memory_latency_ns`] chases through: eight times the L3 cache of the largest core
/// complex of the EPYC hosts seen here (32 MiB), so nearly every load misses every cache.
const MEMORY_LATENCY_PROBE_BYTES: usize = 256 << 20;

/// Dependent loads [`memory_latency_ns`] times (well under a second at the slowest latency
/// seen, 344 ns).
const MEMORY_LATENCY_PROBE_STEPS: usize = 1 << 20;

/// Mean ns per load of a pointer chase through one random cycle over the cache lines of
/// [`MEMORY_LATENCY_PROBE_BYTES`] (each load's address is the value the one before it read,
/// so no two overlap), or `None` if the memory could not be had.
///
/// *Why measure it.* Fresh memory says how fast the server can grow; this says how fast it
/// reads what it holds. On this project's VM the same lookups have taken 56 ns on one day and
/// 344 ns on another: the host's other tenants share its memory controllers and caches. A
/// transfer's writer misses the cache a few times per account, so the figure explains runs
/// of the same binary whose CPU per transfer differs by half.
pub fn memory_latency_ns() -> Option<f64> {
    const LINE_BYTES: usize = 64;
    let lines = MEMORY_LATENCY_PROBE_BYTES / LINE_BYTES;
    let mut block: Vec<u8> = Vec::new();
    block.try_reserve_exact(MEMORY_LATENCY_PROBE_BYTES).ok()?;
    block.resize(MEMORY_LATENCY_PROBE_BYTES, 0);
    // Sattolo's shuffle: one cycle through every line, so the chase never settles into a
    // short loop the caches could hold.
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..lines).rev() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        order.swap(i, (rng % i as u64) as usize);
    }
    for (k, &line) in order.iter().enumerate() {
        let next = order[(k + 1) % lines];
        let at = line as usize * LINE_BYTES;
        block[at..at + 4].copy_from_slice(&next.to_le_bytes());
    }
    drop(order);
    let read = |line: u32| {
        let at = line as usize * LINE_BYTES;
        u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"))
    };
    // A first lap warms the TLB paths the chase shares with the timed one.
    let mut line = 0u32;
    for _ in 0..MEMORY_LATENCY_PROBE_STEPS / 8 {
        line = read(line);
    }
    let started = Instant::now();
    for _ in 0..MEMORY_LATENCY_PROBE_STEPS {
        line = read(line);
    }
    let elapsed = started.elapsed();
    std::hint::black_box(line);
    Some(elapsed.as_secs_f64() * 1e9 / MEMORY_LATENCY_PROBE_STEPS as f64)
}

/// Steps of [`cpu_step_ns`]'s chain: ~30 ms at 3 GHz.
const CPU_PROBE_STEPS: u64 = 25_000_000;

/// Mean ns per step of a chain of dependent 64-bit rotate-and-multiplies, which no cache or
/// memory can slow: it reads the core's clock as this run got it (turbo, or a host that
/// throttles its guests), beside [`memory_latency_ns`]. A step is 4 cycles on Zen 3
/// (rotate 1, multiply 3), so 1.33 ns is 3 GHz.
pub fn cpu_step_ns() -> f64 {
    let steps = std::hint::black_box(CPU_PROBE_STEPS);
    let mut x = std::hint::black_box(1u64);
    let started = Instant::now();
    for _ in 0..steps {
        // A rotate between the multiplies keeps the compiler from folding steps together
        // (it turns a plain multiply–add chain into one multiply–add per 8 steps).
        x = x.rotate_left(7).wrapping_mul(6_364_136_223_846_793_005);
    }
    let elapsed = started.elapsed();
    std::hint::black_box(x);
    elapsed.as_secs_f64() * 1e9 / steps as f64
}

fn command_output_raw(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    command_output_raw(program, args)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56Z");
    }

    #[test]
    fn stale_bench_dirs_of_dead_pids_are_swept_and_others_kept() {
        let root = TempDir::new("sweep-root").unwrap();
        let make = |name: &str| {
            let p = root.path().join(name);
            std::fs::create_dir_all(p.join("data")).unwrap();
            std::fs::write(p.join("data/f"), b"x").unwrap();
            p
        };
        let dead = make("sluice-bench-transfer-srv-4242-0");
        let alive = make("sluice-bench-ingest-7-3");
        let not_ours = make("sluice-benchmark-4242-0");
        let no_seq = make("sluice-bench-4242-0");
        std::fs::write(root.path().join("sluice-bench-writer-4242-1"), b"a file").unwrap();
        let removed = sweep_stale_dirs(root.path(), |pid| pid == 7);
        assert_eq!(removed, 1);
        assert!(!dead.exists());
        assert!(alive.exists() && not_ours.exists() && no_seq.exists());
        assert!(root.path().join("sluice-bench-writer-4242-1").exists());
        assert_eq!(bench_dir_pid("sluice-bench-a-b-c-12-5"), Some(12));
        assert_eq!(bench_dir_pid("sluice-bench-x-12-"), None);
    }

    #[test]
    fn children_of_lists_a_running_child_and_not_an_exited_one() {
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        assert!(children_of(std::process::id()).contains(&pid));
        assert!(!children_of(std::process::id()).contains(&std::process::id()));
        child.kill().expect("kill sleep");
        // Exited but not reaped (a zombie): no longer a living child.
        let deadline = Instant::now() + Duration::from_secs(10);
        while children_of(std::process::id()).contains(&pid) {
            assert!(
                Instant::now() < deadline,
                "pid {pid} still listed after SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().expect("reap sleep");
        assert!(!children_of(std::process::id()).contains(&pid));
    }

    #[test]
    fn temp_dir_is_removed_on_drop() {
        let dir = TempDir::new("selftest").unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), b"x").unwrap();
        assert_eq!(dir_bytes(&path, |_| true), 1);
        drop(dir);
        assert!(!path.exists());
    }
}
