//! `kill <pid>` of a running `sluice bench` (SIGTERM to the bench alone, not a terminal's
//! Ctrl-C, which signals the whole process group) stops the `sluice serve` it started and
//! removes its temp dirs, then exits with 128 + 15. Before, the bench died alone and its
//! server kept running.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_bench::sys::{children_of, proc_state, signal, wait_timeout, TempDir};

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    proc_state(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Whether `pid` runs `… serve …`.
fn is_serve(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| cmdline.split(|b| *b == 0).any(|arg| arg == b"serve"))
        .unwrap_or(false)
}

#[test]
fn sigterm_to_a_bench_stops_its_server_and_removes_its_temp_dirs() {
    let out = TempDir::new("signal-results").expect("a temp dir");
    let stderr_path = out.path().join("bench.stderr");
    let mut bench = Command::new(common::BIN)
        .args(["bench", "snapshot", "--quick", "--out"])
        .arg(out.path())
        .env("SLUICE_BIN", common::BIN)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("create the stderr file"))
        .spawn()
        .expect("start sluice bench");
    let bench_pid = bench.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    // The bench runs short-lived helpers too (`git`, `kill`): wait for its `sluice serve`.
    let servers = loop {
        let children: Vec<u32> = children_of(bench_pid)
            .into_iter()
            .filter(|pid| is_serve(*pid))
            .collect();
        if !children.is_empty() {
            break children;
        }
        assert!(
            bench.try_wait().expect("poll the bench").is_none(),
            "the bench ended before it started a server"
        );
        assert!(Instant::now() < deadline, "no server started within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let the server get going (it may be recovering or serving) before the signal.
    std::thread::sleep(Duration::from_millis(300));
    signal(bench_pid, "TERM").expect("SIGTERM the bench");
    assert!(
        wait_timeout(&mut bench, Duration::from_secs(30)),
        "the bench did not exit within 30 s of SIGTERM"
    );
    let status = bench.wait().expect("reap the bench");
    assert_eq!(status.code(), Some(143), "{status}");
    let stderr = std::fs::read_to_string(&stderr_path).expect("the bench's stderr");
    assert!(
        servers.iter().all(|p| stderr.contains(&p.to_string())),
        "the bench did not name the servers it stopped ({servers:?}): {stderr}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in servers {
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "pid {pid}, started by the bench, still runs after it exited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let marker = format!("-{bench_pid}-");
    let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .expect("read the temp dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("sluice-bench-") && name.contains(&marker))
        .collect();
    assert!(left.is_empty(), "the bench left temp dirs: {left:?}");
    assert!(Path::new(out.path()).exists());
}
