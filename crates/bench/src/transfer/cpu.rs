//! Where the CPU went during a case, from `/proc`: the database server process (Sluice by
//! thread name; PostgreSQL's postmaster with its backends) and this bench process.
//!
//! On a machine this small, clients and servers share the CPUs, so a system's throughput
//! is bounded by the CPU it needs per transaction; these numbers show that cost.

use std::collections::BTreeMap;
use std::time::Instant;

/// Kernel clock ticks per second for `/proc/<pid>/stat` times (USER_HZ: 100 on Linux).
const CLOCK_TICKS_PER_S: f64 = 100.0;

/// CPU seconds consumed so far, at one instant.
#[derive(Debug)]
pub struct CpuSample {
    at: Instant,
    server_s: Option<f64>,
    server_threads_s: BTreeMap<String, f64>,
    bench_s: Option<f64>,
}

/// Average cores used between two samples.
#[derive(Debug, Default)]
pub struct Usage {
    pub server_cores: Option<f64>,
    pub server_threads_cores: BTreeMap<String, f64>,
    pub bench_cores: Option<f64>,
}

impl Usage {
    /// µs of CPU per operation at `ops_per_sec`: for each `(group, thread-name prefix)` of
    /// `groups`, the server threads named so; `other` for the rest of the server's threads;
    /// and `bench` (this process) when `with_bench`. Empty when `ops_per_sec` is not
    /// positive.
    pub fn us_per_op(
        &self,
        groups: &[(&str, &str)],
        ops_per_sec: f64,
        with_bench: bool,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if ops_per_sec <= 0.0 {
            return out;
        }
        // `+ 0.0`: an empty sum is -0.0, printed "-0.00".
        let us = |cores: f64| cores * 1e6 / ops_per_sec + 0.0;
        let mut named = 0.0;
        for &(group, prefix) in groups {
            let cores: f64 = self
                .server_threads_cores
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .map(|(_, c)| c)
                .sum();
            named += cores;
            out.insert(group.to_string(), us(cores));
        }
        let all: f64 = self.server_threads_cores.values().sum();
        out.insert("other".into(), us((all - named).max(0.0)));
        if let (true, Some(bench)) = (with_bench, self.bench_cores) {
            out.insert("bench".into(), us(bench));
        }
        out
    }
}

impl CpuSample {
    /// Reads the server `server_pid` (with its direct children), by thread name if
    /// `by_thread`, and this process.
    pub fn take(server_pid: Option<u32>, by_thread: bool) -> CpuSample {
        CpuSample {
            at: Instant::now(),
            server_s: server_pid.and_then(process_tree_cpu_s),
            server_threads_s: server_pid
                .filter(|_| by_thread)
                .map(threads_cpu_s)
                .unwrap_or_default(),
            bench_s: proc_stat("/proc/self/stat").map(|(s, _, _)| s),
        }
    }

    /// The cores used from `earlier` to this sample.
    pub fn since(&self, earlier: &CpuSample) -> Usage {
        let dt = self.at.duration_since(earlier.at).as_secs_f64().max(1e-9);
        let rate = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| ((b - a) / dt).max(0.0));
        Usage {
            server_cores: rate(earlier.server_s, self.server_s),
            // Threads that ended in between are left out; new ones count from zero.
            server_threads_cores: self
                .server_threads_s
                .iter()
                .map(|(name, &b)| {
                    let a = earlier.server_threads_s.get(name).copied().unwrap_or(0.0);
                    (name.clone(), ((b - a) / dt).max(0.0))
                })
                .filter(|(_, cores)| *cores >= 0.005)
                .collect(),
            bench_cores: rate(earlier.bench_s, self.bench_s),
        }
    }
}

/// (user + system CPU seconds, parent pid, command name) of a `/proc/…/stat` file.
fn proc_stat(path: &str) -> Option<(f64, u32, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name is in parentheses and may contain spaces; fields resume after it.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    // fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(((utime + stime) / CLOCK_TICKS_PER_S, ppid, comm))
}

/// CPU seconds of `pid` and its live direct children (PostgreSQL's backends).
fn process_tree_cpu_s(pid: u32) -> Option<f64> {
    let (own, _, _) = proc_stat(&format!("/proc/{pid}/stat"))?;
    let children: f64 = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.parse::<u32>().ok()?;
            let (s, ppid, _) = proc_stat(&format!("/proc/{name}/stat"))?;
            (ppid == pid).then_some(s)
        })
        .sum();
    Some(own + children)
}

/// CPU seconds of each live thread of `pid`, summed by thread name.
fn threads_cpu_s(pid: u32) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let path = task.path().join("stat");
        if let Some((s, _, comm)) = proc_stat(&path.to_string_lossy()) {
            *by_name.entry(comm).or_insert(0.0) += s;
        }
    }
    by_name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_and_its_threads_are_readable() {
        let pid = std::process::id();
        let a = CpuSample::take(Some(pid), true);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = CpuSample::take(Some(pid), true);
        let u = b.since(&a);
        assert!(u.server_cores.is_some() && u.bench_cores.is_some(), "{u:?}");
        assert!(!a.server_threads_s.is_empty());
    }
}
