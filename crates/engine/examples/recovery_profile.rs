//! A fixed, repeatable recovery workload for profiling (`perf`, `callgrind`) without a server.
//!
//! ```text
//! cargo run --release -p sluice-engine --example recovery_profile -- gen DIR ROWS [TAIL]
//! cargo run --release -p sluice-engine --example recovery_profile -- recover DIR [REPEATS]
//! ```
//!
//! `gen` writes the log the `recovery` bench writes (`events` rows, 100 per commit, 64 MiB
//! segments); with `TAIL` it then snapshots (deleting the segments a server would delete
//! with the default retention) and writes `TAIL` more rows. `recover` recovers `DIR` (never
//! repairing) and prints the wall and CPU time of each run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{encode_commit, encode_snapshot};
use sluice_engine::recovery::{recover, RecoveryOptions};
use sluice_engine::{Changelog, Db, Limits, Retention, SchemaChange};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: u64 = 100;
const SEGMENT_BYTES_MAX: usize = 64 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("gen") => {
            let dir = PathBuf::from(&args[1]);
            let rows: u64 = args[2].parse().expect("ROWS");
            let tail: Option<u64> = args.get(3).map(|t| t.parse().expect("TAIL"));
            generate(&dir, rows, tail);
        }
        Some("recover") => {
            let dir = PathBuf::from(&args[1]);
            let repeats: usize = args.get(2).map_or(1, |r| r.parse().expect("REPEATS"));
            for _ in 0..repeats {
                let cpu0 = process_cpu_s();
                let started = Instant::now();
                let r = recover(
                    &dir,
                    &RecoveryOptions {
                        limits: Limits::default(),
                        retention: Retention::default(),
                        repair: false,
                        keep_zero_tail: false,
                    },
                )
                .expect("recovers");
                let wall = started.elapsed().as_secs_f64();
                let cpu = process_cpu_s() - cpu0;
                let rows: usize = r.db.tables.values().map(|t| t.rows.len()).sum();
                println!(
                    "seq {} rows {rows} replayed {} changelog {} horizon {}: wall {:.1} ms, cpu {:.1} ms, {:.2} M rows/s",
                    r.db.seq,
                    r.replayed,
                    r.db.changelog.len(),
                    r.db.changelog.horizon(),
                    wall * 1e3,
                    cpu * 1e3,
                    rows as f64 / wall / 1e6
                );
                let ph = r.phases;
                println!(
                    "  snapshot {:.1} ms, read+check {:.1} ms, window {:.1} ms, decode+apply {:.1} ms, build {:.1} ms",
                    ph.snapshot.as_secs_f64() * 1e3,
                    ph.read_check.as_secs_f64() * 1e3,
                    ph.window.as_secs_f64() * 1e3,
                    ph.replay.as_secs_f64() * 1e3,
                    ph.build.as_secs_f64() * 1e3
                );
                let dropped = Instant::now();
                drop(r);
                println!("  (drop {:.1} ms)", dropped.elapsed().as_secs_f64() * 1e3);
            }
        }
        _ => eprintln!("usage: recovery_profile gen DIR ROWS [TAIL] | recover DIR [REPEATS]"),
    }
}

fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

struct LogOut {
    dir: PathBuf,
    file: Option<(u64, std::fs::File, usize)>,
    buf: Vec<u8>,
    frame: Vec<u8>,
}

impl LogOut {
    fn write(&mut self, commit: &sluice_engine::Commit) {
        self.buf.clear();
        encode_commit(commit, &mut self.buf);
        self.frame.clear();
        sluice_log::frame::encode_into(&mut self.frame, &self.buf).unwrap();
        if self.file.as_ref().is_none_or(|f| f.2 >= SEGMENT_BYTES_MAX) {
            let path = sluice_log::segment::segment_path(&self.dir, commit.seq);
            self.file = Some((commit.seq, std::fs::File::create(path).unwrap(), 0));
        }
        let f = self.file.as_mut().unwrap();
        f.1.write_all(&self.frame).unwrap();
        f.2 += self.frame.len();
    }
}

fn row(id: u64) -> Map<String, Json> {
    let body: String = "the quick brown fox jumps over the lazy dog while the sluice keeps every write in order and durable; pack my box"
        .chars()
        .cycle()
        .skip((id % 97) as usize)
        .take(100)
        .collect();
    let v = json!({
        "id": id,
        "room": format!("room-{}", id % 1000),
        "author": format!("user-{}", id % 10000),
        "body": body,
        "ts": 1_700_000_000_000_000i64 + id as i64 * 1000,
    });
    match v {
        Json::Object(m) => m,
        _ => unreachable!(),
    }
}

/// Loads `rows` rows from id `first`, `BATCH` per commit. Like the bench's 4 loading
/// clients, the batches of each group of 4 commit out of order (3, 1, 0, 2), so replay
/// sees keys nearly, not strictly, ascending.
fn load(db: &mut Db, out: &mut LogOut, first: u64, rows: u64) {
    let batches: Vec<u64> = (first..first + rows).step_by(BATCH as usize).collect();
    for group in batches.chunks(4) {
        let order: &[usize] = if group.len() == 4 {
            &[3, 1, 0, 2]
        } else {
            &[0, 1, 2]
        };
        for &g in order.iter().filter(|&&g| g < group.len()) {
            let id = group[g];
            let n = BATCH.min(first + rows - id);
            let mut tx = db.transaction();
            for i in id..id + n {
                tx.insert("events", &row(i), None).unwrap();
            }
            let commit = tx.commit().unwrap();
            out.write(&commit);
        }
    }
}

fn generate(dir: &Path, rows: u64, tail: Option<u64>) {
    std::fs::create_dir_all(dir).unwrap();
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let mut out = LogOut {
        dir: dir.to_path_buf(),
        file: None,
        buf: Vec::new(),
        frame: Vec::new(),
    };
    let sql = "CREATE TABLE events (id INTEGER PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts INTEGER)";
    let schema = sluice_engine::TableSchema {
        name: "events".into(),
        columns: ["id", "room", "author", "body", "ts"]
            .iter()
            .enumerate()
            .map(|(i, n)| sluice_engine::ColumnDef {
                name: n.to_string(),
                ty: if i == 0 || i == 4 {
                    sluice_engine::ColumnType::Integer
                } else {
                    sluice_engine::ColumnType::Text
                },
                not_null: i == 1,
                default: None,
            })
            .collect(),
        pk: 0,
        indexes: Vec::new(),
    };
    let commit = db
        .apply_schema(
            vec![SchemaChange::CreateTable {
                schema,
                if_not_exists: false,
            }],
            sql.into(),
        )
        .unwrap()
        .unwrap();
    out.write(&commit);
    load(&mut db, &mut out, 1, rows);
    if let Some(tail) = tail {
        let frames = encode_snapshot(&db);
        sluice_log::snapshot::write_snapshot(dir, db.seq, &frames).unwrap();
        // The server deletes segments whose every frame is at or below both the snapshot
        // and the changelog horizon.
        let horizon = db.changelog.horizon().min(db.seq);
        let segments = sluice_log::segment::list_segments(dir).unwrap();
        for pair in segments.windows(2) {
            if pair[1].first_seq <= horizon + 1 {
                std::fs::remove_file(&pair[0].path).unwrap();
            }
        }
        out.file = None;
        load(&mut db, &mut out, rows + 1, tail);
    }
    println!("generated seq {}", db.seq);
}
