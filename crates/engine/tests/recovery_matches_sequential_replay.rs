//! A differential test of recovery's fast path — segments read one at a time, frames decoded
//! on worker threads, tables that start empty built in bulk from ascending keys — against
//! the plain path: every commit decoded and [`Db::replay`]ed one by one. Random workloads
//! over several tables (ascending and random keys, updates, deletes, patches, schema changes,
//! policies, topic appends) are logged into many small segments, with or without a snapshot,
//! recovered, and every part of the state compared: rows with versions and seqs, schemas,
//! indexes, policies, topics, seq, schema seq, and the changelog window entry by entry
//! (including the before-images of replayed changes) and its horizon.
//!
//! `SLUICE_RECOVERY_DIFF_CASES` runs more cases; a failure prints its seed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{decode_commit, encode_commit, encode_snapshot};
use sluice_engine::recovery::{recover, RecoveryOptions};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Commit, CommitBody, Db, IndexDef, Limits, PolicyCommand,
    PolicyDef, Retention, SchemaChange, TableSchema, Value,
};

/// xorshift64*: small, seedable, good enough to pick ops.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn col(name: &str, ty: ColumnType) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null: false,
        default: None,
    }
}

fn retention() -> Retention {
    Retention {
        commits_max: 40,
        bytes_max: 16 << 10,
    }
}

fn new_db_with(retention: Retention) -> Db {
    Db::new(Limits::default(), Changelog::new(retention))
}

fn obj(v: Json) -> Map<String, Json> {
    v.as_object().expect("an object").clone()
}

/// Writes commits as frames into segments of about `segment_bytes`, named by first seq.
struct Log {
    dir: PathBuf,
    segment_bytes: usize,
    current: Option<(std::fs::File, usize)>,
    /// (first seq, path) of every segment written.
    segments: Vec<(u64, PathBuf)>,
    last_seq: u64,
}

impl Log {
    fn write(&mut self, commit: &Commit) {
        let mut payload = Vec::new();
        encode_commit(commit, &mut payload);
        let mut frame = Vec::new();
        sluice_log::frame::encode_into(&mut frame, &payload).unwrap();
        if self
            .current
            .as_ref()
            .is_none_or(|(_, n)| *n >= self.segment_bytes)
        {
            let path = sluice_log::segment::segment_path(&self.dir, commit.seq);
            self.current = Some((std::fs::File::create(&path).unwrap(), 0));
            self.segments.push((commit.seq, path));
        }
        let (file, n) = self.current.as_mut().unwrap();
        file.write_all(&frame).unwrap();
        *n += frame.len();
        self.last_seq = commit.seq;
    }
}

const TABLES: [&str; 3] = ["a", "b", "c"];

fn create(db: &mut Db, log: &mut Log, name: &str, rng: &mut Rng) {
    let text_key = name == "b";
    let mut schema = TableSchema {
        name: name.into(),
        columns: vec![
            col(
                "id",
                if text_key {
                    ColumnType::Text
                } else {
                    ColumnType::Integer
                },
            ),
            col("room", ColumnType::Text),
            col("n", ColumnType::Integer),
        ],
        pk: 0,
        indexes: Vec::new(),
    };
    if rng.chance(50) {
        schema.indexes.push(IndexDef {
            name: format!("{name}_room"),
            columns: vec![1],
        });
    }
    let commit = db
        .apply_schema(
            vec![SchemaChange::CreateTable {
                schema,
                if_not_exists: false,
            }],
            format!("CREATE TABLE {name} …"),
        )
        .unwrap()
        .unwrap();
    log.write(&commit);
}

fn key_json(table: &str, id: u64) -> Json {
    if table == "b" {
        // Zero-padded, so text order is numeric order and ascending ids are ascending keys.
        json!(format!("k{id:08}"))
    } else {
        json!(id)
    }
}

fn row(db: &Db, table: &str, id: u64, rng: &mut Rng) -> Map<String, Json> {
    let mut m = obj(json!({
        "id": key_json(table, id),
        "room": format!("room-{}", rng.below(5)),
        "n": rng.below(1000),
    }));
    for c in db.tables[table].schema.columns.iter().skip(3) {
        if rng.chance(70) {
            m.insert(c.name.clone(), json!(rng.below(100)));
        }
    }
    m
}

/// One random commit (or none if every op was refused); `schema_percent` of them change
/// a schema.
fn step(db: &mut Db, log: &mut Log, next_id: &mut [u64; 3], rng: &mut Rng, schema_percent: u64) {
    let t = rng.below(3) as usize;
    let table = TABLES[t];
    if !db.tables.contains_key(table) {
        create(db, log, table, rng);
        next_id[t] = 0;
        return;
    }
    let kind = rng.below(100);
    if kind < schema_percent {
        // Schema: add a column, add an index, a policy, or drop the table.
        let change = match rng.below(4) {
            0 => SchemaChange::AddColumn {
                table: table.into(),
                column: ColumnDef {
                    name: format!("x{}", db.tables[table].schema.columns.len()),
                    ty: ColumnType::Integer,
                    not_null: false,
                    default: rng.chance(50).then_some(Value::Integer(7)),
                },
            },
            1 => SchemaChange::CreateIndex {
                table: table.into(),
                name: format!("{table}_n{}", db.tables[table].schema.indexes.len()),
                columns: vec!["n".into()],
                if_not_exists: true,
            },
            2 => SchemaChange::CreatePolicy {
                table: table.into(),
                policy: PolicyDef {
                    name: format!("p{}", db.tables[table].policies.len()),
                    command: PolicyCommand::All,
                    using: Some("n > 3".into()),
                    check: None,
                },
            },
            _ => SchemaChange::DropTable {
                name: table.into(),
                if_exists: false,
            },
        };
        if let Ok(Some(commit)) = db.apply_schema(vec![change], "DDL".into()) {
            log.write(&commit);
        }
        return;
    }
    if kind < 9 {
        let topic = if rng.chance(50) { "chat" } else { "feed" };
        if let Ok(Some(commit)) = db.put_topic(topic, None) {
            log.write(&commit);
        }
        return;
    }
    let mut tx = db.transaction();
    let ops = 1 + rng.below(12);
    for _ in 0..ops {
        let existing = tx.db().tables[table].rows.len() as u64;
        match rng.below(100) {
            // Ascending inserts: the common case, built in bulk.
            0..=59 => {
                next_id[t] += 1 + rng.below(3);
                let r = row(tx.db(), table, next_id[t], rng);
                let _ = tx.insert(table, &r, None);
            }
            // Upserts of random keys, existing or not, out of order.
            60..=74 => {
                let id = rng.below(next_id[t] + 5);
                let r = row(tx.db(), table, id, rng);
                let _ = tx.upsert(table, &r, None);
            }
            75..=84 if existing > 0 => {
                let id = rng.below(next_id[t] + 1);
                let _ = tx.delete(table, &key_json(table, id), None);
            }
            85..=94 if existing > 0 => {
                let id = rng.below(next_id[t] + 1);
                let set = obj(json!({"n": rng.below(50), "room": "patched"}));
                let _ = tx.patch(table, &key_json(table, id), &set, None);
            }
            _ => {
                for topic in ["chat", "feed"] {
                    if tx.db().topics.contains_key(topic) && rng.chance(50) {
                        let tags = vec![format!("t{}", rng.below(3))];
                        let _ = tx.append(topic, tags, &json!({"i": rng.below(9)}), 1_000);
                    }
                }
            }
        }
    }
    if let Some(commit) = tx.commit() {
        log.write(&commit);
    }
}

/// Everything recovery must restore, as comparable text (the changelog from its horizon).
fn state(db: &Db) -> String {
    let mut out = format!(
        "seq {} schema_seq {} horizon {}\n",
        db.seq,
        db.schema_seq,
        db.changelog.horizon()
    );
    for (name, t) in &db.tables {
        out.push_str(&format!(
            "table {name}: {:?}\n policies {:?}\n",
            t.schema, t.policies
        ));
        for (k, r) in t.rows.iter() {
            out.push_str(&format!("  {k:?} v{} {:?}\n", r.version, r.values));
        }
        for (i, ix) in t.indexes.iter().enumerate() {
            out.push_str(&format!(" index {i}: {ix:?}\n"));
        }
    }
    for (name, t) in &db.topics {
        out.push_str(&format!(
            "topic {name}: {:?} {:?} first {} next {} last_ts {}\n",
            t.config(),
            t.rules(),
            t.first(),
            t.next(),
            t.last_ts_us()
        ));
        for r in t.records() {
            out.push_str(&format!("  {r:?}\n"));
        }
    }
    let since = db.changelog.horizon();
    for c in db.changelog.since(since).expect("from the horizon") {
        out.push_str(&commit_text(c));
    }
    out
}

fn commit_text(c: &Commit) -> String {
    let mut out = format!("commit {}\n", c.seq);
    match &c.body {
        CommitBody::Rows(changes) => {
            for ch in changes {
                out.push_str(&format!(
                    "  {} {:?} {:?} v{} row {:?} old {:?} schema {:?}\n",
                    ch.table.name, ch.op, ch.key, ch.version, ch.row, ch.old, ch.table
                ));
            }
        }
        other => out.push_str(&format!("  {other:?}\n")),
    }
    for a in &c.appends {
        out.push_str(&format!("  appends {a:?}\n"));
    }
    out
}

/// The plain path: every logged commit decoded and replayed one by one.
fn replay_one_by_one(dir: &Path) -> Db {
    replay_one_by_one_with(dir, retention())
}

fn replay_one_by_one_with(dir: &Path, retention: Retention) -> Db {
    let mut db = new_db_with(retention);
    for seg in sluice_log::segment::list_segments(dir).unwrap() {
        let bytes = std::fs::read(&seg.path).unwrap();
        sluice_log::segment::scan(&seg.path, &bytes, true, |_, payload| {
            let (seq, body) = decode_commit(payload).expect("decodes");
            db.replay(seq, body).expect("replays");
            Ok::<(), sluice_log::LogError>(())
        })
        .unwrap();
    }
    db
}

fn scratch(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!(
        "sluice-recovery-diff-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `commits` random steps into a fresh directory; with `snapshot_at`, snapshots after
/// that many steps (deleting the segments a server would) and carries on.
fn build(dir: &Path, seed: u64, commits: usize, snapshot_at: Option<usize>) -> Db {
    build_with(dir, seed, commits, snapshot_at, retention())
}

fn build_with(
    dir: &Path,
    seed: u64,
    commits: usize,
    snapshot_at: Option<usize>,
    retention: Retention,
) -> Db {
    build_with_schema_changes(dir, seed, commits, snapshot_at, retention, 6)
}

fn build_with_schema_changes(
    dir: &Path,
    seed: u64,
    commits: usize,
    snapshot_at: Option<usize>,
    retention: Retention,
    schema_percent: u64,
) -> Db {
    let mut rng = Rng(seed | 1);
    let mut db = new_db_with(retention);
    let mut log = Log {
        dir: dir.to_path_buf(),
        segment_bytes: 512 + rng.below(4096) as usize,
        current: None,
        segments: Vec::new(),
        last_seq: 0,
    };
    let mut next_id = [0u64; 3];
    for i in 0..commits {
        if snapshot_at == Some(i) && db.seq > 0 {
            let frames = encode_snapshot(&db);
            sluice_log::snapshot::write_snapshot(dir, db.seq, &frames).unwrap();
            let horizon = db.changelog.horizon().min(db.seq);
            let mut kept = Vec::new();
            for (k, (first, path)) in log.segments.iter().enumerate() {
                let next_first = log.segments.get(k + 1).map(|s| s.0);
                if next_first.is_some_and(|n| n <= horizon + 1) {
                    std::fs::remove_file(path).unwrap();
                } else {
                    kept.push((*first, path.clone()));
                }
            }
            log.segments = kept;
            log.current = None;
        }
        step(&mut db, &mut log, &mut next_id, &mut rng, schema_percent);
    }
    assert_eq!(log.last_seq, db.seq);
    db
}

fn options() -> RecoveryOptions {
    RecoveryOptions {
        limits: Limits::default(),
        retention: retention(),
        repair: false,
        keep_zero_tail: false,
    }
}

fn cases() -> u64 {
    std::env::var("SLUICE_RECOVERY_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

#[test]
fn recovery_without_a_snapshot_equals_replaying_every_commit_one_by_one() {
    let dir = scratch("log");
    for case in 0..cases() {
        let seed = 0x5EED_0000 + case;
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let commits = 50 + (case as usize * 37) % 400;
        let live = build(&dir, seed, commits, None);
        let recovered = recover(&dir, &options())
            .unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        let plain = replay_one_by_one(&dir);
        let (fast, plain) = (state(&recovered.db), state(&plain));
        if fast != plain {
            panic!(
                "seed {seed:#x}: recovery differs from one-by-one replay\n{}",
                first_difference(&fast, &plain)
            );
        }
        // And both equal the state that wrote the log (the changelog included).
        let live = state(&live);
        if fast != live {
            panic!(
                "seed {seed:#x}: recovery differs from the live state\n{}",
                first_difference(&fast, &live)
            );
        }
        assert_eq!(recovered.replayed, recovered.db.seq, "seed {seed:#x}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tables that grow by thousands of rows between schema changes: their held-back writes
/// fill blocks large enough to be sorted on recovery's sorting thread (see
/// `sluice_engine::bulk`), for several tables at once.
#[test]
fn recovery_of_large_tables_equals_replaying_every_commit_one_by_one() {
    let dir = scratch("large");
    for case in 0..2 {
        let seed = 0x1A26_E000 + case;
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let live = build_with_schema_changes(&dir, seed, 2500, None, retention(), 0);
        let recovered = recover(&dir, &options())
            .unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        let largest = recovered.db.tables.values().map(|t| t.rows.len()).max();
        // Past two blocks of the size the sorting thread takes.
        assert!(
            largest > Some(2100),
            "seed {seed:#x}: largest table {largest:?}"
        );
        let plain = replay_one_by_one(&dir);
        let (fast, plain, live) = (state(&recovered.db), state(&plain), state(&live));
        if fast != plain {
            panic!(
                "seed {seed:#x}: recovery differs from one-by-one replay\n{}",
                first_difference(&fast, &plain)
            );
        }
        if fast != live {
            panic!(
                "seed {seed:#x}: recovery differs from the live state\n{}",
                first_difference(&fast, &live)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn recovery_from_a_snapshot_restores_the_live_state_and_its_window() {
    let dir = scratch("snap");
    for case in 0..cases() {
        let seed = 0xA11C_E000 + case;
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let commits = 60 + (case as usize * 53) % 400;
        let snapshot_at = commits / 2 + (case as usize % 7) * 5;
        let live = build(&dir, seed, commits, Some(snapshot_at.min(commits - 1)));
        let recovered = recover(&dir, &options())
            .unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        let snap_seq = recovered.snapshot_seq.expect("a snapshot was taken");
        // Rows, schemas, indexes, policies, topics and seq: exactly the live ones.
        let cut = |s: String| s.split("commit ").next().unwrap().to_string();
        let strip = |s: String| s.lines().skip(1).collect::<Vec<_>>().join("\n");
        let (fast, want) = (strip(cut(state(&recovered.db))), strip(cut(state(&live))));
        if fast != want {
            panic!(
                "seed {seed:#x}: recovered state differs from the live one\n{}",
                first_difference(&fast, &want)
            );
        }
        assert_eq!(recovered.db.seq, live.seq, "seed {seed:#x}");
        // The window: commits after the snapshot exactly as the live changelog holds them;
        // commits before it (rebuilt without before-images) with the same rows.
        let horizon = recovered.db.changelog.horizon();
        assert!(
            horizon >= live.changelog.horizon(),
            "seed {seed:#x}: horizon"
        );
        let live_commits: Vec<&Arc<Commit>> = live.changelog.since(horizon).unwrap().collect();
        let got: Vec<&Arc<Commit>> = recovered.db.changelog.since(horizon).unwrap().collect();
        assert_eq!(
            got.len(),
            live_commits.len(),
            "seed {seed:#x}: window length"
        );
        for (g, l) in got.iter().zip(&live_commits) {
            if g.seq > snap_seq {
                assert_eq!(commit_text(g), commit_text(l), "seed {seed:#x}");
            } else {
                assert_eq!(g.seq, l.seq, "seed {seed:#x}");
                if let (CommitBody::Rows(a), CommitBody::Rows(b)) = (&g.body, &l.body) {
                    let rows = |cs: &[sluice_engine::Change]| {
                        cs.iter()
                            .map(|c| format!("{:?} {:?} {} {:?}", c.op, c.key, c.version, c.row))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(rows(a), rows(b), "seed {seed:#x}: commit {}", g.seq);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A snapshot whose whole log is still on disk and inside the changelog window: recovery
/// replays the whole log instead of loading it (cheaper: loading it would be followed by
/// decoding every commit for the window anyway), and must end exactly where loading it
/// would — the same rows, the same window (before-images included, as the live changelog
/// holds them), and replayed counts that start after the snapshot (they pace the next one).
#[test]
fn recovery_replays_the_whole_log_instead_of_a_snapshot_it_covers_with_the_same_result() {
    let dir = scratch("whole");
    let wide = Retention {
        commits_max: 100_000,
        bytes_max: 64 << 20,
    };
    let opts = RecoveryOptions {
        retention: wide,
        ..options()
    };
    for case in 0..cases() {
        let seed = 0x3401_E000 + case;
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let commits = 60 + (case as usize * 53) % 400;
        let snapshot_at = (commits / 3 + (case as usize % 7) * 5).min(commits - 1);
        let live = build_with(&dir, seed, commits, Some(snapshot_at), wide);
        let recovered =
            recover(&dir, &opts).unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        let snap_seq = recovered.snapshot_seq.expect("a snapshot was taken");
        assert!(
            recovered.whole_log,
            "seed {seed:#x}: the snapshot was loaded"
        );
        assert_eq!(
            recovered.replayed,
            recovered.db.seq - snap_seq,
            "seed {seed:#x}: replayed commits count from the snapshot"
        );
        let (fast, want) = (state(&recovered.db), state(&live));
        if fast != want {
            panic!(
                "seed {seed:#x}: recovered state differs from the live one\n{}",
                first_difference(&fast, &want)
            );
        }
        let plain = state(&replay_one_by_one_with(&dir, wide));
        if fast != plain {
            panic!(
                "seed {seed:#x}: recovery differs from one-by-one replay\n{}",
                first_difference(&fast, &plain)
            );
        }
        // A damaged snapshot is never stood in for: it is passed over and reported as
        // before (here there is no older one, so the whole log is replayed the usual way).
        let snapshots = sluice_log::snapshot::list_snapshots(&dir).unwrap();
        let (_, path) = snapshots.last().unwrap();
        let mut bytes = std::fs::read(path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(path, &bytes).unwrap();
        let recovered =
            recover(&dir, &opts).unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        assert!(!recovered.whole_log, "seed {seed:#x}");
        assert_eq!(recovered.snapshot_seq, None, "seed {seed:#x}");
        assert_eq!(recovered.skipped_snapshots.len(), 1, "seed {seed:#x}");
        assert_eq!(state(&recovered.db), fast, "seed {seed:#x}");
        // Checked later (as the server does): the same state from the whole log, and the
        // snapshot handed back unchecked, where the caller's check finds the damage.
        let (later, unchecked) =
            sluice_engine::recovery::recover_checking_snapshot_later(&dir, &opts)
                .unwrap_or_else(|e| panic!("seed {seed:#x}: recovery failed: {e}"));
        assert!(later.whole_log, "seed {seed:#x}");
        assert_eq!(state(&later.db), fast, "seed {seed:#x}");
        let unchecked = unchecked.expect("the snapshot the whole log stood in for");
        assert_eq!(&unchecked.path, path, "seed {seed:#x}");
        assert!(!unchecked.is_intact(), "seed {seed:#x}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server writes over prepared segments (zeros written ahead), so its newest segment is a
/// segment's full size however few frames it holds: the choice counts the frames, not the
/// zeros after them, and still replays a small log whole.
#[test]
fn a_prepared_newest_segment_counts_only_its_frames_toward_the_window() {
    let dir = scratch("whole-prepared");
    let wide = Retention {
        commits_max: 100_000,
        bytes_max: 64 << 20,
    };
    let live = build_with(&dir, 0x9E_57A7, 200, Some(120), wide);
    let segments = sluice_log::segment::list_segments(&dir).unwrap();
    let newest = &segments.last().unwrap().path;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(newest)
        .unwrap();
    let frames_len = file.metadata().unwrap().len();
    // Zeros past the frames, the file longer than the window's bytes on its own.
    file.set_len((wide.bytes_max as u64) + (1 << 20)).unwrap();
    drop(file);
    let opts = RecoveryOptions {
        retention: wide,
        keep_zero_tail: true,
        ..options()
    };
    let recovered = recover(&dir, &opts).expect("recovers");
    assert!(recovered.whole_log, "the 64 MiB of zeros were counted");
    assert_eq!(state(&recovered.db), state(&live));
    // More frames than the window holds: loaded as a snapshot, zeros or not.
    let tight = RecoveryOptions {
        retention: Retention {
            commits_max: 100_000,
            bytes_max: (frames_len / 2) as usize,
        },
        ..opts
    };
    let recovered = recover(&dir, &tight).expect("recovers");
    assert!(!recovered.whole_log);
    assert_eq!(recovered.db.seq, live.seq);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole log is replayed instead of a snapshot only when it starts at seq 1 and fits the
/// window: a log too large for the window, or one whose first segments were deleted, loads
/// the snapshot.
#[test]
fn a_snapshot_is_loaded_when_the_log_does_not_fit_the_window_or_lost_its_start() {
    let dir = scratch("nowhole");
    let seed = 0xB16_1065;
    // Too many commits for the window (retention() keeps 40).
    let live = build(&dir, seed, 300, Some(150));
    let recovered = recover(&dir, &options()).expect("recovers");
    assert!(!recovered.whole_log);
    let newest = sluice_log::snapshot::list_snapshots(&dir).unwrap();
    assert_eq!(recovered.snapshot_seq, newest.last().map(|s| s.0));
    assert_eq!(recovered.db.seq, live.seq);
    // Even with a window wide enough, a log whose first segments the snapshot let go (as
    // `build` deletes them) cannot stand in for it.
    let segments = sluice_log::segment::list_segments(&dir).unwrap();
    assert!(segments[0].first_seq > 1, "the first segments were deleted");
    let opts = RecoveryOptions {
        retention: Retention {
            commits_max: 100_000,
            bytes_max: 64 << 20,
        },
        ..options()
    };
    let recovered = recover(&dir, &opts).expect("recovers");
    assert!(!recovered.whole_log);
    let _ = std::fs::remove_dir_all(&dir);
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {i}:\n  got  {x}\n  want {y}");
        }
    }
    format!(
        "one is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}
