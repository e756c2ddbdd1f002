//! What a suite leaves behind: `bench-results/<suite>/{summary.md, samples.json, run.json,
//! *.svg}`, and the tables it prints on stdout.
//!
//! - `summary.md`: the machine, the command, targets next to measurements, result tables,
//!   the charts and notes.
//! - `samples.json`: raw per-case and per-second samples, for anyone who wants to re-plot.
//! - `run.json`: machine facts, arguments and timestamps, so a run can be reproduced.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use anyhow::Context;
use serde_json::{json, Value};

use crate::sys::{rfc3339, MachineInfo};

/// A result table: a title, a header row and text cells.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// A sentence under the table saying how to read it.
    pub note: Option<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            ..Table::default()
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.headers.len(),
            "a row needs one cell per column"
        );
        self.rows.push(cells);
    }

    /// A row of a failed case: its identity cells, `failed`, and `—` in the other columns.
    pub fn failed_row(&mut self, id: Vec<String>) {
        let mut cells = id;
        if cells.len() < self.headers.len() {
            cells.push("failed".into());
        }
        cells.resize(self.headers.len(), "—".into());
        self.row(cells);
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("## {}\n\n", self.title);
        let cell = |s: &str| s.replace('|', "\\|");
        let _ = writeln!(
            out,
            "| {} |",
            self.headers
                .iter()
                .map(|h| cell(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(out, "|{}", "---|".repeat(self.headers.len()));
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} |",
                row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        if let Some(note) = &self.note {
            let _ = write!(out, "\n{note}\n");
        }
        out
    }

    /// Aligned plain text for the terminal.
    pub fn text(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.headers[i].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, &w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let mut out = format!("{}\n{}\n", self.title, line(&self.headers));
        let _ = writeln!(
            out,
            "{}",
            widths
                .iter()
                .map(|&w| "-".repeat(w))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for row in &self.rows {
            let _ = writeln!(out, "{}", line(row));
        }
        out
    }
}

/// A stated goal next to what was measured.
#[derive(Clone, Debug)]
pub struct Target {
    pub what: String,
    pub goal: String,
    pub measured: String,
    /// `None`: informational, or not measured in this run.
    pub met: Option<bool>,
}

/// Everything one suite run produces.
#[derive(Debug)]
pub struct Report {
    pub suite: &'static str,
    started_at: SystemTime,
    started: Instant,
    machine: MachineInfo,
    /// The suite's parameters as parsed (for `run.json`).
    pub params: Value,
    /// Free text under the header (what the suite does, how to read it).
    pub intro: Vec<String>,
    pub targets: Vec<Target>,
    pub tables: Vec<Table>,
    /// (file name, caption, svg text).
    pub charts: Vec<(String, String, String)>,
    pub notes: Vec<String>,
    /// Raw samples (`samples.json`).
    pub samples: Value,
    /// Extra facts for `run.json` (peer versions, …).
    pub run_extra: serde_json::Map<String, Value>,
    /// One row per case for `samples.csv` (suites on the harness fill it).
    pub csv: Option<crate::harness::Csv>,
}

impl Report {
    pub fn new(suite: &'static str, params: Value) -> Report {
        let mut run_extra = serde_json::Map::new();
        let serve_args = crate::server::serve_args_from_env();
        if !serve_args.is_empty() {
            run_extra.insert("serve_args_from_env".into(), serde_json::json!(serve_args));
        }
        Report {
            suite,
            started_at: SystemTime::now(),
            started: Instant::now(),
            machine: MachineInfo::collect(),
            params,
            intro: Vec::new(),
            targets: Vec::new(),
            tables: Vec::new(),
            charts: Vec::new(),
            notes: Vec::new(),
            samples: Value::Null,
            run_extra,
            csv: None,
        }
    }

    pub fn machine(&self) -> &MachineInfo {
        &self.machine
    }

    pub fn chart(&mut self, file: &str, caption: &str, svg: String) {
        self.charts
            .push((file.to_string(), caption.to_string(), svg));
    }

    fn targets_table(&self) -> Table {
        let mut t = Table::new("Targets", &["target", "goal", "measured", "met"]);
        for target in &self.targets {
            let met = match target.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            t.row(vec![
                target.what.clone(),
                target.goal.clone(),
                target.measured.clone(),
                met.to_string(),
            ]);
        }
        t
    }

    pub fn summary_markdown(&self) -> String {
        let mut out = format!("# sluice bench {}\n\n", self.suite);
        let _ = writeln!(
            out,
            "Run {} on {}.  ",
            rfc3339(self.started_at),
            self.machine.one_line()
        );
        let _ = writeln!(out, "Command: `{}`\n", command_line());
        if let Some(Value::Array(serve_args)) = self.run_extra.get("serve_args_from_env") {
            let args: Vec<&str> = serve_args.iter().filter_map(Value::as_str).collect();
            let _ = writeln!(
                out,
                "Every Sluice server ran with `{}` added (`$SLUICE_BENCH_SERVE_ARGS`).\n",
                args.join(" ")
            );
        }
        for warning in self.warnings() {
            let _ = writeln!(out, "**{warning}**\n");
        }
        for p in &self.intro {
            let _ = writeln!(out, "{p}\n");
        }
        if !self.targets.is_empty() {
            out.push_str(&self.targets_table().markdown());
            out.push('\n');
        }
        for t in &self.tables {
            out.push_str(&t.markdown());
            out.push('\n');
        }
        if !self.charts.is_empty() {
            out.push_str("## Charts\n\n");
            for (file, caption, _) in &self.charts {
                let _ = writeln!(out, "![{caption}]({file})\n");
            }
        }
        if !self.notes.is_empty() {
            out.push_str("## Notes\n\n");
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
            out.push('\n');
        }
        let csv = if self.csv.is_some() {
            " (one row per case: `samples.csv`)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "Raw samples: `samples.json`{csv}; machine, arguments and timestamps: `run.json`."
        );
        out
    }

    /// What made this run's numbers lower or noisier than an idle machine's.
    fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self.busy_warning().into_iter().collect();
        if let Some(rate) = self.machine.fresh_memory_gib_per_s {
            if rate < crate::sys::FRESH_MEMORY_SLOW_GIB_PER_S {
                warnings.push(format!(
                    "Fresh memory was slow when this run started ({rate:.2} GiB/s to fault in \
                     new pages, where bare-metal Linux does 4–10): on a VM whose host backs \
                     guest memory on first use, every case that grows the server's memory \
                     (ingest, log replay, building views) pays for each new page, and its \
                     numbers move with this figure from run to run."
                ));
            }
        }
        warnings
    }

    /// A warning when other work was running: it takes CPU from both sides of every case.
    fn busy_warning(&self) -> Option<String> {
        let load: f64 = self
            .machine
            .load_average
            .as_deref()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        (load >= self.machine.nproc as f64 / 2.0).then(|| {
            format!(
                "The machine was busy when this run started (1-minute load average {load:.1} on \
                 {} CPUs): other processes competed for the CPUs, so the numbers are lower and \
                 noisier than on an idle machine.",
                self.machine.nproc
            )
        })
    }

    pub fn run_json(&self) -> Value {
        let finished = SystemTime::now();
        let mut v = json!({
            "suite": self.suite,
            "args": std::env::args().collect::<Vec<_>>(),
            "params": self.params,
            "started_at": rfc3339(self.started_at),
            "finished_at": rfc3339(finished),
            "duration_s": self.started.elapsed().as_secs_f64(),
            "machine": self.machine,
            "load_average_at_end": std::fs::read_to_string("/proc/loadavg")
                .ok()
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")),
        });
        if let Value::Object(map) = &mut v {
            map.extend(self.run_extra.clone());
        }
        v
    }

    /// Writes every file under `<out_root>/<suite>/`, replacing those of an earlier run.
    pub fn write(&self, out_root: &Path) -> anyhow::Result<PathBuf> {
        let dir = out_root.join(self.suite);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        // Charts of an earlier run with other cases must not linger beside this run's.
        for e in std::fs::read_dir(&dir)?.flatten() {
            if e.file_name().to_string_lossy().ends_with(".svg") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
        };
        write("summary.md", self.summary_markdown().as_bytes())?;
        write("samples.json", &serde_json::to_vec_pretty(&self.samples)?)?;
        write("run.json", &serde_json::to_vec_pretty(&self.run_json())?)?;
        if let Some(csv) = &self.csv {
            write("samples.csv", csv.render().as_bytes())?;
        }
        for (file, _, svg) in &self.charts {
            write(file, svg.as_bytes())?;
        }
        Ok(dir)
    }

    /// The tables on stdout.
    pub fn print(&self) {
        println!(
            "\nsluice bench {} — {}\n",
            self.suite,
            self.machine.one_line()
        );
        for warning in self.warnings() {
            println!("{warning}\n");
        }
        if !self.targets.is_empty() {
            println!("{}", self.targets_table().text().replace("**", ""));
        }
        for t in &self.tables {
            println!("{}", t.text());
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}

/// Checks that `dir` holds `summary.md`, `samples.json`, `run.json` and at least one
/// `.svg`, all non-empty; returns the parsed samples.
pub fn verify_files(dir: &Path) -> anyhow::Result<Value> {
    for name in ["summary.md", "samples.json", "run.json"] {
        let len = std::fs::metadata(dir.join(name))
            .with_context(|| format!("{} is missing", dir.join(name).display()))?
            .len();
        anyhow::ensure!(len > 0, "{} is empty", dir.join(name).display());
    }
    let svgs = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".svg"))
        .filter(|e| {
            std::fs::read_to_string(e.path())
                .is_ok_and(|s| s.starts_with("<svg") && s.contains("</svg>"))
        })
        .count();
    anyhow::ensure!(svgs > 0, "no SVG chart in {}", dir.display());
    let run: Value = serde_json::from_slice(&std::fs::read(dir.join("run.json"))?)?;
    anyhow::ensure!(
        run["machine"]["nproc"].as_u64().unwrap_or(0) > 0,
        "run.json lacks machine facts"
    );
    Ok(serde_json::from_slice(&std::fs::read(
        dir.join("samples.json"),
    )?)?)
}

fn command_line() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .map_or(p.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "sluice".into());
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_render_as_markdown_and_text() {
        let mut t = Table::new("Throughput", &["case", "rows/s"]);
        t.row(vec!["a|b".into(), "1.00 M".into()]);
        let md = t.markdown();
        assert!(
            md.contains("| case | rows/s |\n|---|---|\n| a\\|b | 1.00 M |"),
            "{md}"
        );
        let text = t.text();
        assert!(
            text.contains("case  rows/s\n----  ------\na|b   1.00 M"),
            "{text}"
        );
    }

    #[test]
    fn report_writes_all_files() {
        let out = crate::sys::TempDir::new("report-test").unwrap();
        let mut r = Report::new("unit", json!({"seconds": 1}));
        r.targets.push(Target {
            what: "x".into(),
            goal: ">= 1".into(),
            measured: "2".into(),
            met: Some(true),
        });
        r.samples = json!({"cases": []});
        r.chart("c.svg", "a chart", "<svg></svg>\n".into());
        let dir = r.write(out.path()).unwrap();
        for f in ["summary.md", "samples.json", "run.json", "c.svg"] {
            assert!(dir.join(f).is_file(), "{f} missing");
        }
        let run: Value =
            serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
        assert!(run["machine"]["nproc"].as_u64().unwrap() >= 1);
        assert!(std::fs::read_to_string(dir.join("summary.md"))
            .unwrap()
            .contains("![a chart](c.svg)"));
        let rate = run["machine"]["fresh_memory_gib_per_s"].as_f64().unwrap();
        assert!(rate.is_finite() && rate > 0.0, "fresh memory rate {rate}");
        // Probes of the host, each in the summary's first line as well.
        let latency = run["machine"]["memory_latency_ns"].as_f64().unwrap();
        let step = run["machine"]["cpu_step_ns"].as_f64().unwrap();
        // No machine loads from DRAM in under 10 ns or takes a µs per multiply.
        assert!(
            (10.0..10_000.0).contains(&latency),
            "memory latency {latency} ns"
        );
        assert!((0.05..1_000.0).contains(&step), "cpu step {step} ns");
        let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(
            summary.contains(&format!("memory latency {latency:.0} ns")),
            "{summary}"
        );
        assert!(summary.contains("ns per dependent multiply"), "{summary}");
    }

    #[test]
    fn slow_fresh_memory_is_named_in_the_summary_and_fast_memory_is_not() {
        let mut r = Report::new("unit", json!({}));
        r.machine.load_average = None;
        r.machine.fresh_memory_gib_per_s = Some(0.61);
        let summary = r.summary_markdown();
        assert!(summary.contains("fresh memory 0.61 GiB/s"), "{summary}");
        assert!(summary.contains("**Fresh memory was slow"), "{summary}");
        r.machine.fresh_memory_gib_per_s = Some(crate::sys::FRESH_MEMORY_SLOW_GIB_PER_S * 2.0);
        assert!(!r.summary_markdown().contains("Fresh memory was slow"));
    }
}
