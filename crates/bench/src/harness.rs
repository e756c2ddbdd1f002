//! The one harness every suite shares: a runtime, the server under test and the peers, a
//! warm-up and a measured window, and the files of the run.
//!
//! A suite is: parse its arguments, [`Bench::new`], start what it compares
//! ([`Bench::sluice`] for the real `sluice serve` binary on a loopback port and its own data
//! dir, [`crate::peers`] for PostgreSQL, Redis and NATS), measure its cases ([`measure`]
//! for a warm-up followed by a bounded window into an hdrhistogram), fill the
//! [`Report`], and [`Bench::finish`]: `bench-results/<suite>/{summary.md, samples.json,
//! samples.csv, run.json, *.svg}`, the tables on stdout, and whether every case succeeded.
//!
//! Every process the harness starts is stopped by its own pid when its handle drops.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::hist::Latency;
use crate::progress::Progress;
use crate::report::Report;
use crate::server::{sluice_bin, SluiceServer};
use crate::sys::TempDir;
use crate::CommonArgs;

/// Note added to every `--quick` run.
pub const QUICK_NOTE: &str = "--quick: a smoke run; these numbers are not meaningful.";
/// Note added to every run of a debug build.
pub const DEBUG_NOTE: &str = "debug build: numbers are not meaningful; use cargo build --release.";

/// One suite run: its report, progress lines and where its files go.
#[derive(Debug)]
pub struct Bench {
    pub report: Report,
    pub progress: Progress,
    pub quick: bool,
    out: PathBuf,
    sluice_bin: Option<PathBuf>,
}

impl Bench {
    /// Starts the run of `suite` with its parsed `params` (for `run.json`).
    pub fn new(
        suite: &'static str,
        common: &CommonArgs,
        params: &impl serde::Serialize,
    ) -> anyhow::Result<Bench> {
        Ok(Bench {
            report: Report::new(suite, serde_json::to_value(params)?),
            progress: Progress::new(suite),
            quick: common.quick,
            out: common.out.clone(),
            sluice_bin: common.sluice_bin.clone(),
        })
    }

    /// The sluice binary this run starts (`--sluice-bin`, `$SLUICE_BIN`, this executable).
    pub fn bin(&self) -> anyhow::Result<PathBuf> {
        sluice_bin(self.sluice_bin.as_deref())
    }

    /// Starts `sluice serve` with `extra` flags on a free loopback port and its own temp
    /// data dir (removed when the returned handle drops, after the server is killed).
    pub async fn sluice(&self, label: &str, extra: &[String]) -> anyhow::Result<Sluice> {
        Sluice::start(&self.bin()?, label, extra).await
    }

    /// Writes the files, prints the tables and says where they went; `Ok(true)` if no case
    /// failed. Adds the `--quick` and debug-build notes.
    pub fn finish(mut self, failed: usize) -> anyhow::Result<bool> {
        standard_notes(&mut self.report, self.quick);
        finish_report(&self.report, &self.out, failed)
    }
}

/// The notes every run carries when they apply: `--quick`, debug build.
pub fn standard_notes(report: &mut Report, quick: bool) {
    if quick {
        report.notes.push(QUICK_NOTE.into());
    }
    if cfg!(debug_assertions) {
        report.notes.push(DEBUG_NOTE.into());
    }
}

/// Writes `report` under `<out>/<suite>/`, prints it, and says where it went and how many
/// cases failed; `Ok(true)` when none did.
pub fn finish_report(report: &Report, out: &Path, failed: usize) -> anyhow::Result<bool> {
    let dir = report.write(out)?;
    report.print();
    eprintln!("results in {}", dir.display());
    if failed > 0 {
        eprintln!("{failed} case(s) failed; see the notes in summary.md");
    }
    Ok(failed == 0)
}

/// The multi-threaded tokio runtime every suite drives its clients on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// A `sluice serve` child and the temp data dir it owns; both go on drop (process first).
#[derive(Debug)]
pub struct Sluice {
    pub server: SluiceServer,
    /// Dropped after `server` (fields drop in order), so the dir outlives the process.
    dir: TempDir,
}

impl Sluice {
    pub async fn start(bin: &Path, label: &str, extra: &[String]) -> anyhow::Result<Sluice> {
        let dir = TempDir::new(label)?;
        let (server, _) = SluiceServer::start(bin, &dir.path().join("data"), extra).await?;
        Ok(Sluice { server, dir })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `kill -9` (no final snapshot), then removes the data dir.
    pub fn kill9(mut self) {
        self.server.kill9_in_place();
    }
}

impl std::ops::Deref for Sluice {
    type Target = SluiceServer;
    fn deref(&self) -> &SluiceServer {
        &self.server
    }
}

/// What [`measure`] saw in its measured window.
#[derive(Clone, Debug)]
pub struct Window {
    pub seconds: f64,
    /// Operations (calls of the step) completed in the window.
    pub ops: u64,
    /// Items the steps reported (records, rows, deliveries …).
    pub items: u64,
    /// Latency of each step.
    pub latency: Latency,
}

impl Window {
    pub fn items_per_sec(&self) -> f64 {
        self.items as f64 / self.seconds.max(1e-9)
    }
}

/// Runs `step` for `warmup` (discarded), then for `window` or until `max_ops` steps,
/// whichever comes first; `step` returns how many items it handled. Single-threaded
/// (one step at a time); for many clients, run one `measure` per client task and merge.
pub async fn measure<F, Fut>(
    warmup: Duration,
    window: Duration,
    max_ops: u64,
    mut step: F,
) -> anyhow::Result<Window>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<u64>>,
{
    let warm_end = Instant::now() + warmup;
    while Instant::now() < warm_end {
        step().await?;
    }
    let started = Instant::now();
    let mut w = Window {
        seconds: 0.0,
        ops: 0,
        items: 0,
        latency: Latency::new(),
    };
    while w.ops < max_ops && started.elapsed() < window {
        let t = Instant::now();
        w.items += step().await?;
        w.latency.record(t.elapsed());
        w.ops += 1;
    }
    w.seconds = started.elapsed().as_secs_f64();
    Ok(w)
}

/// The same as [`measure`] for a synchronous step (in-process cases): each step is a
/// ready future, so the measurement runs to its end without a runtime.
pub fn measure_sync(
    warmup: Duration,
    window: Duration,
    max_ops: u64,
    mut step: impl FnMut() -> anyhow::Result<u64>,
) -> anyhow::Result<Window> {
    use futures_util::FutureExt;
    measure(warmup, window, max_ops, || std::future::ready(step()))
        .now_or_never()
        .expect("ready steps never wait")
}

/// Raises this process's soft open-file limit towards `want` (never above the hard limit);
/// returns the soft limit in force afterwards (0 if it cannot be read). Thousands of sockets
/// need it.
pub fn raise_nofile_limit(want: u64) -> u64 {
    sluice_sched::raise_open_files_limit(want).map_or(0, |(_, after)| after)
}

/// Rows for `samples.csv`: one header and rows of cells, quoted where needed.
#[derive(Clone, Debug, Default)]
pub struct Csv {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    pub fn new(headers: &[&str]) -> Csv {
        Csv {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.headers.len(), "one cell per column");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cell = |c: &String| {
            if c.contains([',', '"', '\n']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.clone()
            }
        };
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            out.push_str(&line.iter().map(cell).collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_cells_that_need_it() {
        let mut c = Csv::new(&["case", "p99_us"]);
        c.row(vec!["sse, 100 \"w\"".into(), "12".into()]);
        assert_eq!(c.render(), "case,p99_us\n\"sse, 100 \"\"w\"\"\",12\n");
    }

    #[test]
    fn measure_sync_stops_at_the_op_bound() {
        let w = measure_sync(Duration::ZERO, Duration::from_secs(60), 10, || Ok(3)).unwrap();
        assert_eq!((w.ops, w.items), (10, 30));
        assert_eq!(w.latency.count(), 10);
    }

    #[test]
    fn nofile_limit_is_not_lowered() {
        let before = raise_nofile_limit(1);
        assert!(before >= 1);
        assert!(raise_nofile_limit(before) >= before);
    }
}
