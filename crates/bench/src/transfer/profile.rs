//! The writer thread's profile (issue 12 asks for it in the summary): `perf record -e
//! cpu-clock -t <tid of sluice-writer>` for the last seconds of one `sluice-ws` case's warm-up
//! (never its measured window: on two cores, perf's sampling and its own CPU would be charged
//! to the server), then, once the case is over, the top self-time symbols as a table and the
//! flat `perf report --stdio` text beside `summary.md`.
//!
//! Only `cpu-clock` is used (hardware counters are often missing on VMs). Without `perf`,
//! or when it fails, the case runs as usual and the summary says why there is no profile.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::report::Table;

/// Rows of the profile table in the summary.
pub const TOP_ROWS: usize = 15;
/// Seconds `perf record` may overrun its window before it is killed.
const OVERRUN_S: u64 = 30;
/// The writer thread's name (`std::thread::Builder::name` in the server).
pub const WRITER_THREAD: &str = "sluice-writer";

/// One row of a flat profile: the share of self time and the symbol.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub percent: f64,
    pub symbol: String,
}

/// A profile taken (or why not).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Profile {
    /// The case it was taken in, e.g. "sluice-ws, α = 0".
    pub case: String,
    pub samples_s: f64,
    /// Top symbols by self time; empty if none was taken.
    pub rows: Vec<Row>,
    /// The flat `perf report` text (written beside the summary).
    #[serde(skip)]
    pub text: String,
    /// Why there is no profile, if there is none.
    pub missing: Option<String>,
}

/// Whether a `perf` binary runs here.
pub fn perf_available() -> bool {
    Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The tid of `pid`'s thread named `name`.
pub fn thread_id(pid: u32, name: &str) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim_end() == name)
            .then(|| t.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

/// A recording of the writer thread, to be read back once the case is over.
pub struct Recording {
    case: String,
    samples_s: f64,
    /// The `perf.data` file, or why there is none.
    data: Result<PathBuf, String>,
}

/// Samples `pid`'s writer thread for `window` (blocking; run it off the runtime). Bounded:
/// `perf record` stops by itself after `window` and is killed if it overruns by
/// [`OVERRUN_S`].
pub fn record_writer(pid: u32, window: Duration, case: String) -> Recording {
    let data = match thread_id(pid, WRITER_THREAD) {
        None => Err(format!("no thread named {WRITER_THREAD} in pid {pid}")),
        Some(tid) => {
            let data = std::env::temp_dir().join(format!("sluice-bench-writer-{pid}.perf.data"));
            record(tid, window, &data)
                .map(|()| data)
                .map_err(|e| format!("{e:#}"))
        }
    };
    Recording {
        case,
        samples_s: window.as_secs_f64(),
        data,
    }
}

impl Recording {
    /// Reads the recording back into a profile and removes its file (blocking: `perf report`
    /// takes seconds of CPU, so it runs after the case's measured window).
    pub fn report(self) -> Profile {
        let mut profile = Profile {
            case: self.case,
            samples_s: self.samples_s,
            ..Profile::default()
        };
        let data = match self.data {
            Ok(data) => data,
            Err(e) => {
                profile.missing = Some(e);
                return profile;
            }
        };
        let result = report(&data);
        let _ = std::fs::remove_file(&data);
        match result {
            Ok(text) => {
                profile.rows = parse(&text);
                if profile.rows.is_empty() {
                    profile.missing = Some("perf recorded no samples of the writer".into());
                }
                profile.text = text;
            }
            Err(e) => profile.missing = Some(format!("{e:#}")),
        }
        profile
    }
}

fn record(tid: u32, window: Duration, data: &Path) -> anyhow::Result<()> {
    let seconds = format!("{:.3}", window.as_secs_f64());
    let mut child = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-t", &tid.to_string(), "-o"])
        .arg(data)
        .args(["--", "sleep", &seconds])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run perf: {e}"))?;
    let limit = window + Duration::from_secs(OVERRUN_S);
    if !crate::sys::wait_timeout(&mut child, limit) {
        let _ = child.kill();
        let _ = child.wait();
        anyhow::bail!("perf record did not stop within {limit:?}: killed");
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "perf record failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn report(data: &Path) -> anyhow::Result<String> {
    let out = Command::new("perf")
        .args([
            "report",
            "--no-children",
            "--stdio",
            "-g",
            "none",
            "--sort",
            "sym",
        ])
        .arg("-i")
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run perf report: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "perf report failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The rows of a flat `perf report --stdio --sort sym` text (`  8.67%  [.] symbol`), in
/// its order (by self time); comment and blank lines are skipped.
pub fn parse(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let (percent, rest) = line.split_once('%')?;
            let percent: f64 = percent.trim().parse().ok()?;
            let rest = rest.trim_start();
            // `[.]` user space, `[k]` kernel: the symbol follows.
            let symbol = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']').map_or(r, |(_, s)| s).trim(),
                None => rest,
            };
            (!symbol.is_empty()).then(|| Row {
                percent,
                symbol: symbol.to_string(),
            })
        })
        .collect()
}

/// A symbol as short as a table cell can hold: generic arguments of long names elided.
fn short(symbol: &str) -> String {
    const MAX: usize = 110;
    if symbol.chars().count() <= MAX {
        return symbol.replace('|', "\\|");
    }
    let cut: String = symbol.chars().take(MAX).collect();
    format!("{}…", cut.replace('|', "\\|"))
}

/// The summary's table: the top rows of `now`, each with its share in `before` (if given).
pub fn table(now: &Profile, before: Option<(&str, &[Row])>) -> Table {
    let mut headers = vec!["#", "self %", "symbol"];
    if before.is_some() {
        headers.push("self % before");
    }
    let mut t = Table::new(
        format!(
            "Writer thread profile ({WRITER_THREAD}, perf cpu-clock, {:.0} s of the {} warm-up, just before its measured window): top {TOP_ROWS} symbols by self time",
            now.samples_s, now.case
        ),
        &headers,
    );
    for (i, row) in now.rows.iter().take(TOP_ROWS).enumerate() {
        let mut cells = vec![
            (i + 1).to_string(),
            format!("{:.2}", row.percent),
            short(&row.symbol),
        ];
        if let Some((_, rows)) = before {
            cells.push(
                rows.iter()
                    .find(|r| r.symbol == row.symbol)
                    .map_or("—".into(), |r| format!("{:.2}", r.percent)),
            );
        }
        t.row(cells);
    }
    t.note = Some(match before {
        Some((label, _)) => format!(
            "The flat report is in writer-profile.txt beside this summary. \"Before\": {label} (— : not among its listed symbols; inlining differs between builds, so compare groups of symbols, not single rows)."
        ),
        None => "The flat report is in writer-profile.txt beside this summary.".into(),
    });
    t
}

/// The `--profile-before` table: the top rows of an earlier profile, each with its share now.
pub fn before_table(label: &str, before: &[Row], now: &Profile) -> Table {
    let mut t = Table::new(
        format!("Writer thread profile before ({label}): top {TOP_ROWS} symbols by self time"),
        &["#", "self % before", "symbol", "self % now"],
    );
    for (i, row) in before.iter().take(TOP_ROWS).enumerate() {
        t.row(vec![
            (i + 1).to_string(),
            format!("{:.2}", row.percent),
            short(&row.symbol),
            now.rows
                .iter()
                .find(|r| r.symbol == row.symbol)
                .map_or("—".into(), |r| format!("{:.2}", r.percent)),
        ]);
    }
    t
}

/// Reads a saved flat profile for `--profile-before`.
pub fn read_before(path: &PathBuf) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read --profile-before {}: {e}", path.display()))?;
    let rows = parse(&text);
    anyhow::ensure!(
        !rows.is_empty(),
        "--profile-before {}: no `N.NN%  [.] symbol` lines in it",
        path.display()
    );
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_perf_reports_parse_into_rows_in_order() {
        let text = "# Samples: 15K of event 'cpu-clock'\n#\n# Overhead  Symbol\n\n    22.78%  [.] rquickjs::call<(A,B,C)>\n     5.97%  [.] core::ptr::drop_in_place<sluice_engine::db::CommitBody>\n     0.94%  [k] finish_task_switch.isra.0\n\n#\n# (Tip: …)\n";
        let rows = parse(text);
        assert_eq!(
            rows,
            vec![
                Row {
                    percent: 22.78,
                    symbol: "rquickjs::call<(A,B,C)>".into()
                },
                Row {
                    percent: 5.97,
                    symbol: "core::ptr::drop_in_place<sluice_engine::db::CommitBody>".into()
                },
                Row {
                    percent: 0.94,
                    symbol: "finish_task_switch.isra.0".into()
                },
            ]
        );
    }

    #[test]
    fn the_table_shows_the_before_share_of_the_same_symbol() {
        let now = Profile {
            case: "sluice-ws, α = 0".into(),
            samples_s: 10.0,
            rows: parse("  10.00%  [.] a\n   5.00%  [.] b\n"),
            ..Profile::default()
        };
        let before = parse("   7.00%  [.] b\n");
        let t = table(&now, Some(("old", &before)));
        assert_eq!(t.rows[0][3], "—");
        assert_eq!(t.rows[1][3], "7.00");
        let b = before_table("old", &before, &now);
        assert_eq!(b.rows[0][3], "5.00");
    }

    #[test]
    fn a_missing_thread_is_said_not_fatal() {
        let p = record_writer(std::process::id(), Duration::from_millis(1), "x".into()).report();
        assert!(p.rows.is_empty());
        assert!(p.missing.unwrap().contains(WRITER_THREAD));
    }
}
