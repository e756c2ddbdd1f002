//! Rows records are written packed (kinds 5 and 6): a row leaves out its table's name when the
//! row before it named the same table, its version when that is the commit's seq, and its key
//! when that is its first value. Logs written before keep kinds 1 and 3, which still read.
//!
//! Random transactions over tables with integer and text keys, a key that is not the first
//! column, deletes and topic appends: each commit's packed record and its unpacked form
//! (written here as the encoder wrote it before) decode to the same body, the packed one is
//! never the longer, and replaying either rebuilds the source's state exactly. Damaged packed
//! rows are refused with a message saying what is wrong.
//!
//! Snapshot rows frames likewise: kind 7 writes each row's version once, kind 2 (written
//! before) wrote it twice, as version and as last writer's seq; both load alike.

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{self, decode_commit, encode_commit, Writer};
use sluice_engine::db::{ChangeOp, Commit, CommitBody};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Db, Limits, Retention, SchemaChange, TableSchema,
};

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

fn column(name: &str, ty: ColumnType) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null: false,
        default: None,
    }
}

fn create(db: &mut Db, name: &str, columns: Vec<ColumnDef>, pk: usize) -> Commit {
    let schema = TableSchema {
        name: name.into(),
        columns,
        pk,
        indexes: vec![],
    };
    let change = SchemaChange::CreateTable {
        schema,
        if_not_exists: false,
    };
    let commit = db.apply_schema(vec![change], format!("create {name}"));
    (*commit.unwrap().unwrap()).clone()
}

/// The rows section as kinds 1 and 3 lay it out: every row with its table, op, version and
/// key (`docs/formats.md` before format revision 2).
fn unpacked(commit: &Commit) -> Vec<u8> {
    let CommitBody::Rows(changes) = &commit.body else {
        let mut out = Vec::new();
        encode_commit(commit, &mut out);
        return out;
    };
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.u8(if commit.appends.is_empty() {
        codec::RECORD_ROWS
    } else {
        codec::RECORD_TX
    });
    w.u64_fixed(commit.seq);
    w.varint(changes.len() as u64);
    for c in changes {
        w.str(&c.table.name);
        w.u8(match c.op {
            ChangeOp::Insert => 0,
            ChangeOp::Update => 1,
            ChangeOp::Delete => 2,
        });
        w.varint(c.version);
        w.key(&c.key);
        if let Some(values) = &c.row {
            w.varint(values.len() as u64);
            for v in values.iter() {
                w.value(v);
            }
        }
    }
    if !commit.appends.is_empty() {
        // The appends section is the same in both layouts: take it from the packed record,
        // after its rows (the record of the same commit without appends ends there).
        let rows_only = Commit {
            seq: commit.seq,
            body: commit.body.clone(),
            appends: Vec::new(),
        };
        let (mut rows, mut whole) = (Vec::new(), Vec::new());
        encode_commit(&rows_only, &mut rows);
        encode_commit(commit, &mut whole);
        out.extend_from_slice(&whole[rows.len()..]);
    }
    out
}

/// Every row of every table, with its version and last writer's seq.
fn state(db: &Db) -> Vec<String> {
    db.tables
        .values()
        .flat_map(|t| {
            t.rows
                .iter()
                .map(move |(k, e)| format!("{} {k:?} {:?} v{}", t.schema.name, e.values, e.version))
        })
        .collect()
}

fn obj(v: Json) -> Map<String, Json> {
    v.as_object().expect("an object").clone()
}

#[test]
fn packed_and_unpacked_records_of_random_commits_decode_and_replay_alike() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut source = db();
    let mut commits = vec![
        create(
            &mut source,
            "ints",
            vec![
                column("id", ColumnType::Integer),
                column("n", ColumnType::Integer),
                column("s", ColumnType::Text),
            ],
            0,
        ),
        create(
            &mut source,
            "texts",
            vec![
                column("name", ColumnType::Text),
                column("v", ColumnType::Integer),
            ],
            0,
        ),
        // The key is not the first value: packed rows must carry it.
        create(
            &mut source,
            "late",
            vec![
                column("a", ColumnType::Text),
                column("b", ColumnType::Integer),
                column("id", ColumnType::Integer),
            ],
            2,
        ),
    ];
    commits.push((*source.put_topic("feed", None).unwrap().unwrap()).clone());
    for step in 0..600 {
        let mut tx = source.transaction();
        for _ in 0..1 + rng.below(8) {
            let id = rng.below(30) as i64;
            let (table, key, row, set) = match rng.below(3) {
                0 => (
                    "ints",
                    json!(id),
                    json!({"id": id, "n": rng.below(1 << 40), "s": "x".repeat(id as usize)}),
                    json!({"n": step}),
                ),
                1 => (
                    "texts",
                    json!(format!("k{id}")),
                    json!({"name": format!("k{id}"), "v": -id}),
                    json!({"v": step}),
                ),
                _ => (
                    "late",
                    json!(id),
                    json!({"a": format!("a{step}"), "b": id * 3, "id": id}),
                    json!({"b": step}),
                ),
            };
            // Refusals (a duplicate insert, a missing row) change nothing and are fine here.
            let _ = match rng.below(4) {
                0 => tx.insert(table, &obj(row), None).map(|_| ()),
                1 => tx.upsert(table, &obj(row), None).map(|_| ()),
                2 => tx.delete(table, &key, None).map(|_| ()),
                _ => tx.patch(table, &key, &obj(set), None).map(|_| ()),
            };
        }
        if rng.below(5) == 0 {
            tx.append("feed", vec![format!("t{}", step % 3)], &json!(step), step)
                .unwrap();
        }
        if let Some(c) = tx.commit() {
            commits.push((*c).clone());
        }
    }
    let (mut from_packed, mut from_unpacked) = (db(), db());
    let (mut packed_bytes, mut unpacked_bytes, mut with_appends, mut deletes) = (0, 0, 0, 0);
    for commit in &commits {
        let mut packed = Vec::new();
        encode_commit(commit, &mut packed);
        let old = unpacked(commit);
        if let CommitBody::Rows(changes) = &commit.body {
            let kind = if commit.appends.is_empty() {
                codec::RECORD_ROWS_PACKED
            } else {
                with_appends += 1;
                codec::RECORD_TX_PACKED
            };
            assert_eq!(packed[0], kind, "seq {}", commit.seq);
            deletes += changes.iter().filter(|c| c.op == ChangeOp::Delete).count();
        }
        assert!(packed.len() <= old.len(), "seq {}", commit.seq);
        packed_bytes += packed.len();
        unpacked_bytes += old.len();
        let (seq_p, body_p) = decode_commit(&packed).expect("a packed record decodes");
        let (seq_u, body_u) = decode_commit(&old).expect("an unpacked record decodes");
        assert_eq!(seq_p, commit.seq);
        assert_eq!(seq_u, commit.seq);
        assert_eq!(
            format!("{body_p:?}"),
            format!("{body_u:?}"),
            "seq {}",
            commit.seq
        );
        from_packed.replay(seq_p, body_p).expect("replays");
        from_unpacked.replay(seq_u, body_u).expect("replays");
    }
    assert!(
        with_appends > 50 && deletes > 100,
        "{with_appends} {deletes}"
    );
    assert_eq!(state(&from_packed), state(&source));
    assert_eq!(state(&from_unpacked), state(&source));
    assert_eq!(from_packed.seq, source.seq);
    assert!(
        packed_bytes * 10 < unpacked_bytes * 9,
        "packed {packed_bytes} bytes against {unpacked_bytes}"
    );
}

#[test]
fn an_insert_leaves_out_exactly_its_table_name_version_and_key() {
    let mut source = db();
    create(
        &mut source,
        "events",
        vec![
            column("id", ColumnType::Integer),
            column("body", ColumnType::Text),
        ],
        0,
    );
    let mut tx = source.transaction();
    tx.insert("events", &obj(json!({"id": 7, "body": "hi"})), None)
        .unwrap();
    let commit = tx.commit().unwrap();
    let mut packed = Vec::new();
    encode_commit(&commit, &mut packed);
    // kind, seq, 1 row: head (insert, names its table), "events", 2 values.
    let mut expected = vec![codec::RECORD_ROWS_PACKED];
    expected.extend_from_slice(&2u64.to_le_bytes());
    expected.extend_from_slice(&[1, codec::ROW_NAMES_TABLE, 6]);
    expected.extend_from_slice(b"events");
    expected.extend_from_slice(&[2, 1, 14, 5, 2, b'h', b'i']);
    assert_eq!(packed, expected);
    // A second row of the same table in the same commit is its head and values only.
    let mut tx = source.transaction();
    tx.insert("events", &obj(json!({"id": 8, "body": ""})), None)
        .unwrap();
    tx.insert("events", &obj(json!({"id": 9, "body": ""})), None)
        .unwrap();
    let commit = tx.commit().unwrap();
    let mut packed = Vec::new();
    encode_commit(&commit, &mut packed);
    let second_row = [0, 2, 1, 18, 5, 0];
    assert!(packed.ends_with(&second_row), "{packed:?}");
    assert_eq!(packed.len(), 1 + 8 + 1 + (1 + 7 + 5) + second_row.len());
}

#[test]
fn damaged_packed_rows_are_refused_with_what_is_wrong() {
    let record = |rows: &[u8]| {
        let mut p = vec![codec::RECORD_ROWS_PACKED];
        p.extend_from_slice(&5u64.to_le_bytes());
        p.push(1);
        p.extend_from_slice(rows);
        decode_commit(&p).map(|_| ()).unwrap_err()
    };
    let named = codec::ROW_NAMES_TABLE;
    // A whole good row for contrast: insert into "t", key 1 from the first value.
    let mut good = vec![codec::RECORD_ROWS_PACKED];
    good.extend_from_slice(&5u64.to_le_bytes());
    good.extend_from_slice(&[1, named, 1, b't', 1, 1, 2]);
    assert!(decode_commit(&good).is_ok());
    let cases: [(&[u8], &str); 6] = [
        (&[0, 1, 1, 2], "does not name its table"),
        (&[named | 0x20, 1, b't', 1, 1, 2], "unknown row head bits"),
        (&[named | 3, 1, b't', 1, 1, 2], "unknown change op 3"),
        (&[named | 2, 1, b't'], "a delete without its key"),
        (&[named, 1, b't', 0], "a row without values or key"),
        // The first value is REAL, which no key is.
        (
            &[named, 1, b't', 1, 2, 0, 0, 0, 0, 0, 0, 0, 0],
            "bad key value",
        ),
    ];
    for (rows, expected) in cases {
        let e = record(rows);
        assert!(e.contains(expected), "{rows:?}: {e}");
    }
}

#[test]
fn snapshot_rows_frames_of_both_layouts_load_alike() {
    use sluice_engine::{Key, Value};
    let rows: Vec<(Key, u64, Vec<Value>)> = (0..50i64)
        .map(|i| {
            let key = Key::Int(i * 3 - 20);
            let values = vec![
                Value::Integer(i * 3 - 20),
                Value::Text("x".repeat(i as usize).as_str().into()),
            ];
            (key, 1_000 + i as u64, values)
        })
        .collect();
    // Kind 7 as snapshots write it now; kind 2 as they wrote it before, each version twice.
    let frame = |kind: u8| {
        let mut out = Vec::new();
        let mut w = Writer(&mut out);
        w.u8(kind);
        w.str("t");
        w.varint(rows.len() as u64);
        for (key, version, values) in &rows {
            w.key(key);
            w.varint(*version);
            if kind == codec::SNAP_ROWS {
                w.varint(*version);
            }
            w.varint(values.len() as u64);
            for v in values {
                w.value(v);
            }
        }
        out
    };
    let (packed, older) = (frame(codec::SNAP_ROWS_PACKED), frame(codec::SNAP_ROWS));
    assert_eq!(
        older.len() - packed.len(),
        50 * 2,
        "one 2-byte varint less per row"
    );
    let decoded =
        |bytes: &[u8]| match codec::decode_snapshot_frame(bytes).expect("a rows frame decodes") {
            codec::SnapFrame::Rows { table, rows } => format!("{table} {rows:?}"),
            _ => panic!("not a rows frame"),
        };
    let text = decoded(&packed);
    assert_eq!(text, decoded(&older));
    assert!(text.contains("version: 1049"), "{text}");
    // A snapshot written now uses the packed kind.
    let mut source = db();
    create(&mut source, "t", vec![column("id", ColumnType::Integer)], 0);
    let mut tx = source.transaction();
    tx.insert("t", &obj(json!({"id": 1})), None).unwrap();
    tx.commit().unwrap();
    let frames = codec::encode_snapshot(&source);
    let kinds: Vec<u8> = frames
        .iter()
        .map(|f| f[sluice_log::frame::FRAME_HEADER_BYTES])
        .collect();
    assert!(kinds.contains(&codec::SNAP_ROWS_PACKED), "{kinds:?}");
    assert!(!kinds.contains(&codec::SNAP_ROWS), "{kinds:?}");
}
