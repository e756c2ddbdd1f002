//! Fuzz targets for the engine's decoders of bytes read back from disk: commit records,
//! snapshot body frames, and recovery of a whole data directory built from mutated
//! records. Every one must refuse bad bytes with an error — never panic, never allocate from
//! a length it has not checked — and what recovery accepts must survive its own snapshot.
//!
//! The frame checksum would stop almost every mutation at the log layer, so these targets
//! mutate the *payloads* and frame them afresh: the decoders behind the checksum are what
//! is under test. `SLUICE_FUZZ_EXECS` / `SLUICE_FUZZ_SEED` run a long mode (see
//! `sluice-fuzzkit`); `--nocapture` shows executions and panics per target.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{self, SnapshotLoader};
use sluice_engine::recovery::{check, recover, RecoveryError, RecoveryOptions};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Commit, Db, IndexDef, Limits, Retention, SchemaChange,
    TableSchema, Value,
};
use sluice_fuzzkit::{Fuzzer, Kind};
use sluice_log::frame;
use sluice_log::segment::segment_path;
use sluice_log::snapshot::write_snapshot;

// ---------------------------------------------------------------------------------------
// A real workload for the seeds

fn col(name: &str, ty: ColumnType, not_null: bool, default: Option<Value>) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null,
        default,
    }
}

fn new_db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

fn obj(v: Json) -> Map<String, Json> {
    v.as_object().expect("an object").clone()
}

/// Runs a small workload touching every value type and schema change; returns every
/// commit (in seq order) and the snapshot body frames taken after `snapshot_after` commits.
fn workload(snapshot_after: usize) -> (Vec<Arc<Commit>>, Vec<Vec<u8>>, u64) {
    let mut db = new_db();
    let mut commits = Vec::new();
    let mut snapshot = None;
    let t = TableSchema {
        name: "t".into(),
        columns: vec![
            col("id", ColumnType::Integer, true, None),
            col("name", ColumnType::Text, false, None),
            col("score", ColumnType::Real, false, Some(Value::Real(0.5))),
            col("flag", ColumnType::Boolean, false, None),
            col("data", ColumnType::Blob, false, None),
            col("doc", ColumnType::Json, false, None),
            col("ts", ColumnType::Timestamp, true, Some(Value::Timestamp(0))),
        ],
        pk: 0,
        indexes: vec![IndexDef {
            name: "t_name".into(),
            columns: vec![1],
        }],
    };
    let u = TableSchema {
        name: "u".into(),
        columns: vec![
            col("k", ColumnType::Text, true, None),
            col("v", ColumnType::Integer, true, Some(Value::Integer(5))),
        ],
        pk: 0,
        indexes: Vec::new(),
    };
    let ddl = vec![
        SchemaChange::CreateTable {
            schema: t,
            if_not_exists: false,
        },
        SchemaChange::CreateTable {
            schema: u,
            if_not_exists: true,
        },
    ];
    let mut take = |db: &Db, commits: &mut Vec<Arc<Commit>>, c: Option<Arc<Commit>>| {
        commits.extend(c);
        if commits.len() == snapshot_after && snapshot.is_none() {
            snapshot = Some((codec::encode_snapshot(db), db.seq));
        }
    };
    let c = db.apply_schema(ddl, "CREATE TABLE t …; CREATE TABLE u …".into());
    take(&db, &mut commits, c.unwrap());
    for i in 0..12i64 {
        let mut tx = db.transaction();
        tx.insert(
            "t",
            &obj(
                json!({"id": i * 7 - 20, "name": format!("n{}", i % 3), "score": i as f64 / 3.0,
                        "flag": i % 2 == 0, "data": "AAEC/w==", "doc": {"a": [i, null]},
                        "ts": i * 1_000_000}),
            ),
            None,
        )
        .unwrap();
        tx.upsert("u", &obj(json!({"k": format!("key-{i}"), "v": i})), None)
            .unwrap();
        if i % 4 == 3 {
            // The row was written by this transaction: its version is this commit's seq.
            let version = tx.seq();
            tx.patch(
                "t",
                &json!(i * 7 - 20),
                &obj(json!({"name": null})),
                Some(version),
            )
            .unwrap();
            tx.delete("u", &json!(format!("key-{}", i - 1)), None)
                .unwrap();
        }
        let c = tx.commit();
        take(&db, &mut commits, c);
    }
    let ddl = vec![
        SchemaChange::AddColumn {
            table: "u".into(),
            column: col("w", ColumnType::Text, true, Some(Value::Text("x".into()))),
        },
        SchemaChange::CreateIndex {
            table: "u".into(),
            name: "u_v".into(),
            columns: vec!["v".into(), "w".into()],
            if_not_exists: false,
        },
    ];
    let c = db.apply_schema(ddl, "ALTER TABLE u ADD COLUMN w …".into());
    take(&db, &mut commits, c.unwrap());
    let mut tx = db.transaction();
    tx.upsert("u", &obj(json!({"k": "", "v": i64::MIN, "w": "é"})), None)
        .unwrap();
    let c = tx.commit();
    take(&db, &mut commits, c);
    let c = db.apply_schema(
        vec![SchemaChange::DropTable {
            name: "t".into(),
            if_exists: true,
        }],
        "DROP TABLE t".into(),
    );
    take(&db, &mut commits, c.unwrap());
    let (frames, seq) = snapshot.unwrap_or_else(|| (codec::encode_snapshot(&db), db.seq));
    (commits, frames, seq)
}

fn payload_of(commit: &Commit) -> Vec<u8> {
    let mut out = Vec::new();
    codec::encode_commit(commit, &mut out);
    out
}

/// The payload of an encoded frame.
fn unframe(f: &[u8]) -> Vec<u8> {
    f[frame::FRAME_HEADER_BYTES..].to_vec()
}

// ---------------------------------------------------------------------------------------
// A list of payloads in one fuzz input: each is `u16 length (LE)` then its bytes. A
// mutated length only moves the boundaries; every input splits into some payloads.

fn join(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in payloads {
        out.extend_from_slice(&(p.len() as u16).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn split(mut input: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while input.len() >= 2 {
        let n = (u16::from_le_bytes([input[0], input[1]]) as usize).min(input.len() - 2);
        out.push(&input[2..2 + n]);
        input = &input[2 + n..];
    }
    out
}

/// Decodes and applies snapshot body payloads to a fresh database.
fn load(payloads: &[&[u8]]) -> Result<Db, String> {
    let mut db = new_db();
    let mut loader = SnapshotLoader::new();
    for p in payloads {
        loader.frame(&mut db, p)?;
    }
    if !loader.finished() {
        return Err("no end frame".into());
    }
    Ok(db)
}

/// A database's state as comparable text: tables, schemas, rows with version and seq.
fn state(db: &Db) -> String {
    let mut out = format!("seq {}\n", db.seq);
    for (name, t) in &db.tables {
        out.push_str(&format!("{name}: {:?}\n", t.schema));
        for (k, r) in t.rows.iter() {
            out.push_str(&format!("  {k:?} v{} {:?}\n", r.version, r.values));
        }
    }
    out
}

/// `db` takes a new write to rows of every table (a panic here would be the writer's):
/// each row written back as it is, in one transaction. Refusals are fine.
fn write_back(db: &mut Db) {
    let rows: Vec<(String, Map<String, Json>)> = db
        .tables
        .values()
        .flat_map(|t| {
            t.rows.values().take(3).map(|r| {
                let row = sluice_engine::db::row_to_json(&t.schema, &r.values);
                (
                    t.schema.name.clone(),
                    row.as_object().cloned().unwrap_or_default(),
                )
            })
        })
        .collect();
    let mut tx = db.transaction();
    for (table, row) in &rows {
        let _ = tx.upsert(table, row, None);
    }
    let _ = tx.commit();
}

/// `db`'s own snapshot loads back to the same state (what a restart would do next).
fn assert_snapshot_round_trips(db: &Db) {
    let frames = codec::encode_snapshot(db);
    let payloads: Vec<Vec<u8>> = frames.iter().map(|f| unframe(f)).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let mut loaded = load(&refs).expect("a state's own snapshot loads");
    loaded.seq = db.seq;
    assert_eq!(state(&loaded), state(db), "snapshot round trip");
}

fn first_word(s: &str) -> String {
    s.split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------
// Targets

const EXECS: u64 = 50_000;

/// A commit record of 4 GiB of text, of a row of 2^32 values and of 2^32 rows is refused
/// from the count alone, before anything of that size is allocated.
#[test]
fn lengths_claiming_four_gib_are_refused_before_allocating() {
    let four_gib_varint = [0x80, 0x80, 0x80, 0x80, 0x10];
    // A rows record (either layout), seq 1, 2^32 changes.
    for kind in [codec::RECORD_ROWS, codec::RECORD_ROWS_PACKED] {
        let mut rows = vec![kind];
        rows.extend_from_slice(&1u64.to_le_bytes());
        rows.extend_from_slice(&four_gib_varint);
        assert!(codec::decode_commit(&rows).is_err());
    }
    // RECORD_SCHEMA, seq 1, SQL text of 4 GiB.
    let mut schema = vec![codec::RECORD_SCHEMA];
    schema.extend_from_slice(&1u64.to_le_bytes());
    schema.extend_from_slice(&four_gib_varint);
    schema.extend_from_slice(b"CREATE");
    assert!(codec::decode_commit(&schema).is_err());
    // A snapshot rows frame (either layout) for table "t" of 2^32 rows, then one of a row
    // (key 1, version 1, and in the older layout seq 1) of 2^32 values.
    for kind in [codec::SNAP_ROWS, codec::SNAP_ROWS_PACKED] {
        let mut snap = vec![kind, 1, b't'];
        snap.extend_from_slice(&four_gib_varint);
        assert!(codec::decode_snapshot_frame(&snap).is_err());
    }
    let mut snap = vec![codec::SNAP_ROWS, 1, b't', 1, 1 << 1, 1, 1];
    snap.extend_from_slice(&four_gib_varint);
    assert!(codec::decode_snapshot_frame(&snap).is_err());
    let mut snap = vec![codec::SNAP_ROWS_PACKED, 1, b't', 1, 1 << 1, 1];
    snap.extend_from_slice(&four_gib_varint);
    assert!(codec::decode_snapshot_frame(&snap).is_err());
}

#[test]
fn fuzz_commit_record_decode_and_replay() {
    let (commits, _, _) = workload(usize::MAX);
    let payloads: Vec<Vec<u8>> = commits.iter().map(|c| payload_of(c)).collect();
    // The schema the replayed records are applied to: the workload's first commit.
    let base = codec::decode_commit(&payloads[0]).unwrap().1;
    Fuzzer::new("engine_commit_record", EXECS, Kind::Bytes)
        .seeds(payloads.clone())
        .run(|input| {
            let (seq, body) = match codec::decode_commit(input) {
                Ok(decoded) => decoded,
                Err(e) => return first_word(&e),
            };
            let _ = seq;
            // Apply it where it could have come from: after the CREATE TABLEs.
            let mut db = new_db();
            db.replay(1, base.clone()).unwrap();
            match db.replay(2, body) {
                Ok(()) => {
                    assert_eq!(db.seq, 2);
                    assert_snapshot_round_trips(&db);
                    write_back(&mut db);
                    "replayed".into()
                }
                Err(e) => format!("replay: {}", first_word(&e)),
            }
        });
}

#[test]
fn fuzz_snapshot_frames_load() {
    let mut seeds = Vec::new();
    for after in [1, 3, 9, usize::MAX] {
        let (_, frames, _) = workload(after);
        seeds.push(join(&frames.iter().map(|f| unframe(f)).collect::<Vec<_>>()));
    }
    Fuzzer::new("engine_snapshot_frames", EXECS, Kind::Bytes)
        .seeds(seeds)
        .run(|input| match load(&split(input)) {
            Ok(mut db) => {
                assert_snapshot_round_trips(&db);
                write_back(&mut db);
                "loaded".into()
            }
            Err(e) => first_word(&e),
        });
}

/// A scratch data directory reused by every execution.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        // A memory file system where there is one: recovery syncs, and syncing to a real
        // disk thousands of times would be most of the run.
        let shm = Path::new("/dev/shm");
        let base = match shm.is_dir() {
            true => shm.to_path_buf(),
            false => std::env::temp_dir(),
        };
        let dir = base.join(format!("sluice-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn clear(&self) {
        for entry in std::fs::read_dir(&self.0).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Lays out a data directory from one fuzz input: payload 0 says how (`[snapshot frames,
/// commits in the first segment, flags (1: tear the tail, 2: renumber), snapshot seq (u64
/// LE), first seq when renumbering (u64 LE)]`), the next payloads
/// are the snapshot's body frames, the rest the commit records, framed afresh.
fn lay_out(dir: &Path, input: &[u8]) {
    let parts = split(input);
    let Some((control, rest)) = parts.split_first() else {
        return;
    };
    let get = |i: usize| control.get(i).copied().unwrap_or(0) as usize;
    let n_snap = get(0).min(rest.len());
    let (snap, log) = rest.split_at(n_snap);
    if n_snap > 0 {
        let seq = control
            .get(3..11)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        let mut body = Vec::new();
        for p in snap {
            frame::encode_into(&mut body, p).unwrap();
        }
        write_snapshot(dir, seq, &[body]).unwrap();
    }
    let mut log: Vec<Vec<u8>> = log.iter().map(|p| p.to_vec()).collect();
    if get(2) & 2 != 0 {
        // Renumber the commits from a seq of the control's choosing (wrapping), so seq
        // chains near 0 and u64::MAX are a one-field mutation away.
        let start = control
            .get(11..19)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        for (i, p) in log.iter_mut().enumerate() {
            if let Some(seq) = p.get_mut(1..9) {
                seq.copy_from_slice(&start.wrapping_add(i as u64).to_le_bytes());
            }
        }
    }
    let seq_of = |p: &[u8]| {
        p.get(1..9)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let split_at = get(1).min(log.len());
    for part in [&log[..split_at], &log[split_at..]] {
        let Some(first) = part.first() else { continue };
        let mut bytes = Vec::new();
        for p in part {
            frame::encode_into(&mut bytes, p).unwrap();
        }
        std::fs::write(segment_path(dir, seq_of(first)), bytes).unwrap();
    }
    if get(2) % 4 == 1 {
        // A torn tail: half a frame after the last segment.
        if let Some(last) = log.last() {
            let mut torn = Vec::new();
            frame::encode_into(&mut torn, last).unwrap();
            torn.truncate(torn.len() / 2);
            let path = segment_path(dir, seq_of(&log[split_at.min(log.len() - 1)]));
            let mut bytes = std::fs::read(&path).unwrap_or_default();
            bytes.extend_from_slice(&torn);
            std::fs::write(path, bytes).unwrap();
        }
    }
}

#[test]
fn fuzz_recovery_of_a_damaged_directory() {
    let mut seeds = Vec::new();
    for (after, split_at, flags) in [(0, 0, 0), (4, 3, 2), (9, 0, 1), (usize::MAX, 2, 3)] {
        let (commits, frames, seq) = workload(after);
        let snap: Vec<Vec<u8>> = match after {
            0 => Vec::new(),
            _ => frames.iter().map(|f| unframe(f)).collect(),
        };
        let mut control = vec![snap.len() as u8, split_at, flags];
        control.extend_from_slice(&seq.to_le_bytes());
        control.extend_from_slice(&1u64.to_le_bytes());
        let mut parts = vec![control];
        parts.extend(snap);
        parts.extend(commits.iter().map(|c| payload_of(c)));
        seeds.push(join(&parts));
    }
    let scratch = Scratch::new("recovery");
    let opts = RecoveryOptions {
        limits: Limits::default(),
        retention: Retention::default(),
        repair: true,
        keep_zero_tail: false,
    };
    Fuzzer::new("engine_recovery", 10_000, Kind::Bytes)
        .seeds(seeds)
        .len_max(1 << 14)
        .run(|input| {
            scratch.clear();
            lay_out(&scratch.0, input);
            let checked = check(&scratch.0);
            match recover(&scratch.0, &opts) {
                Ok(recovered) => {
                    assert_snapshot_round_trips(&recovered.db);
                    // A repaired directory recovers again to the same state.
                    let mut again =
                        recover(&scratch.0, &opts).expect("a repaired directory recovers");
                    assert_eq!(state(&again.db), state(&recovered.db));
                    write_back(&mut again.db);
                    format!(
                        "ok torn={} skipped={} check={}",
                        recovered.torn_tail.is_some(),
                        recovered.skipped_snapshots.len().min(1),
                        checked.is_ok()
                    )
                }
                Err(RecoveryError::Corrupt { reason, .. }) => first_word(&reason),
                Err(RecoveryError::Inconsistent(reason)) => first_word(&reason),
                Err(RecoveryError::Log(e)) => first_word(&e.to_string()),
                Err(e) => first_word(&e.to_string()),
            }
        });
}

// ---------------------------------------------------------------------------------------
// Regression cases: the exact inputs the fuzzer found (SLUICE_FUZZ_SEED=492150982), each a
// panic in recovery before its fix. Laid out and recovered as the target does.

/// `sluice check`'s answer and recovery's, as text.
fn check_and_recover(input: &[u8]) -> (Result<u64, String>, Result<String, String>) {
    let scratch = Scratch::new(&format!("regression-{}", input.len()));
    lay_out(&scratch.0, input);
    let opts = RecoveryOptions {
        limits: Limits::default(),
        retention: Retention::default(),
        repair: true,
        keep_zero_tail: false,
    };
    let checked = check(&scratch.0).map(|r| r.seq).map_err(|e| e.to_string());
    let recovered = recover(&scratch.0, &opts)
        .map(|r| state(&r.db))
        .map_err(|e| e.to_string());
    (checked, recovered)
}

/// Both `sluice check` and recovery refuse the directory built from `input`, as damage.
fn check_and_recovery_refuse(input: &[u8]) {
    let (checked, recovered) = check_and_recover(input);
    let err = checked.expect_err("check finds the damage");
    assert!(
        err.contains("implausible") || err.contains("seq 0"),
        "{err}"
    );
    recovered.expect_err("recovery refuses the damaged directory");
}

/// Found by `fuzz_recovery_of_a_damaged_directory`: recovery.rs:104 (`db.seq + 1` overflowed): a snapshot whose header claims seq u64::MAX.
#[test]
fn a_snapshot_at_seq_u64_max_is_refused_not_overflowed() {
    const INPUT: &[u8] = b"\x13\x00\x03\x02\x03\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x00\x00\x00\x00\x00\x00\"\x00\x01\x01\x01u\x03\x01k\x03\x01\x00\x01v\x00\x01\x01\x01\n\x01w\x03\x01\x01\x05\x01x\x00\x01\x03u_v\x02\x01\x02\xe2\x00\x02\x01u\n\x05\x00\x01\x0f\x03\x05\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x05\x02\xc3\xa9\x05\x05key-0\x01\x02\x03\x05\x05key-0\x01\x00\x05\x01x\x05\x05key-1\x01\x03\x03\x05\x05key-1\x01\x02\x05\x01x\x05\x06key-11\x01\r\x03\x05\x06key-11\x01\x16\x05\x01x\x05\x05key-3\x01\x05\x03\x05\x05key-3\x01\x06\x05\x01x\x05\x05key-4\x01\x06\x03\x05\x05key-4\x01\x08\x05\x01h\x05\x05key-5\x01\x07\x03\x05\x05key-5\x01\n\x05\x01x\x05\x05key-7\x01\t\x03\x05\x05key-7\x01\x0e\x05\x01x\x05\x05key-8\x01\n\x03\x05\x05key-8\x01\x10\x05\x01x\x05\x05key-9\x01\x0b\x03\x05\x05key-9\x01\x12\x05\x01x\x03\x00\x03\x01\n\x00\x02\x01EATE TAB";
    check_and_recovery_refuse(INPUT);
}

/// Found by `fuzz_recovery_of_a_damaged_directory`: recovery.rs:184 (`seq - 1` overflowed): a log whose first record claims seq 0 behind a snapshot.
#[test]
fn a_commit_record_with_seq_zero_is_refused() {
    const INPUT: &[u8] = b"\x13\x00\x04\x03\x02\x04\x00\x00\x00\x00\x00\x7f\x00\x00\x00\x00\x00\x00\x00\x00\x00`\x00\x01\x02\x01t\x07\x02id\x00\x01\x00\x04name\x03\x00\x00\x05score\x01\x00\x01\x02\x00\x00\x00\x00\x00\x00\xe0?\x04flag\x02\x00\x00\x04data\x04\x00\x00\x03doc\x05\x00\x00\x02ts\x06\x01\x01\x08\x00\x00\x01\x06t_name\x01\x01\x01u\x02\x01k\x03\x01\x00\x01v\x00\x01\x01\x01\n\x00\x00\x90\x00\x02\x01t\x03\x01\'\x01\x02\x07\x01\'\x05\x02n0\x02\x00\x00\x00\x00\x00\x00\x00\x00\x04\x06\x04\x00\x01e\xff\x07\x0e{\"a\":[0,null]}\x08\x00\x01\x19\x01\x03\x07\x01\x19\x05\x02n1\x02UUUUUU\xd5?\x03\x06\x04\x00\x01\x02\xff\x07\x0e{\"a\":[1,null]}\x08\x80\x89z\x01\x0b\x01\x04\x07\x01\x0b\x05\x02n2\x02UUUUUU\xe5?\x04\x06\x04\x00\x01\x02\xff\x07\x0e{\"a\":[2,null]}\x08\x80\x92\xf4\x01=\x00\x02\x01u\x03\x05\x05key-0\x01\x02\x02\x05\x05key-0\x01\x00\x05\x05key-1\x01\x03\x02\x05\x05key-1\x01\x02\x05\x05key-2\x01\x04\x02\x05\x05key-2\x01\x04\x03\x00\x03\x02\x06\x93\x00\x02\x01\x00\x00\x00\x00\x00\x00\x00&CREATE TABLE t \xe2\x80\xa6; CREATE TABLE u \xe2\x80\xa6\x02\x01\x00\x01t\x07\x02id\x00\x01\x00\x04name\x03\x00\x00\x05score\x01\x00\x01\x02\x00\x00\x00\x00\x00\x00\xe0?\x04flag\x02\x00\x00\x04data\x04\x00\x00\x03doc\x05\x00\x00\x02ts\x06\x01\x01\x08\x00\x00\x01\x06t_name\x01\x01\x01\x01\x01u\x02\x01k\x03\x01\x00\x01v\x00\x01\x01\x01\n\x00\x00\x00\x01\x02\x00\x00\x00\x00\x00\x00\x00\x02";
    check_and_recovery_refuse(INPUT);
}
