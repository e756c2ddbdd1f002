//! Recovery streams a snapshot (read and checked on one thread, decoded on workers, tables
//! built as rows arrive) instead of reading the whole file first. What it loads and the
//! error it reports must stay those of a read-everything-first load: the state of a
//! snapshot of several rows frames is the state it was taken of, and in a damaged file the
//! first failed check wins over an earlier frame that does not decode.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{encode_snapshot, SNAP_FRAME_BYTES_TARGET};
use sluice_engine::recovery::{check, recover, RecoveryError, RecoveryOptions};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Db, Limits, Retention, SchemaChange, TableSchema,
};
use sluice_log::frame::{decode, encode_into, Decoded, FRAME_HEADER_BYTES};
use sluice_log::snapshot::{snapshot_path, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC};
use sluice_log::LogError;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "sluice-snapshot-streamed-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn column(name: &str, ty: ColumnType) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null: false,
        default: None,
    }
}

/// Two tables (one with an index) whose rows fill several snapshot frames each.
fn source() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    for (name, indexes) in [("a", vec![]), ("b", vec![1])] {
        let schema = TableSchema {
            name: name.into(),
            columns: vec![
                column("id", ColumnType::Integer),
                column("v", ColumnType::Text),
            ],
            pk: 0,
            indexes: indexes
                .into_iter()
                .map(|c| sluice_engine::schema::IndexDef {
                    name: format!("{name}_v"),
                    columns: vec![c],
                })
                .collect(),
        };
        db.apply_schema(
            vec![SchemaChange::CreateTable {
                schema,
                if_not_exists: false,
            }],
            format!("CREATE TABLE {name} ..."),
        )
        .unwrap();
    }
    // ~3 frames per table.
    let rows = 3 * SNAP_FRAME_BYTES_TARGET / 200;
    for chunk in (0..rows).collect::<Vec<_>>().chunks(1000) {
        let mut tx = db.transaction();
        for &i in chunk {
            for table in ["a", "b"] {
                let row: Map<String, Json> = match json!({"id": i, "v": format!("{table}-{i}-{}", "x".repeat(180))})
                {
                    Json::Object(m) => m,
                    _ => unreachable!(),
                };
                tx.insert(table, &row, None).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    db
}

/// The snapshot file of `db` with each body payload passed through `damage` (its index,
/// its bytes) and framed again (so its checksum holds) unless `damage` returns `false`
/// (then the original frame is kept but its last byte flipped: a failed checksum).
fn snapshot_file(db: &Db, damage: impl Fn(usize, &mut Vec<u8>) -> bool) -> Vec<u8> {
    let mut out = SNAPSHOT_MAGIC.to_vec();
    let mut header = SNAPSHOT_FORMAT_VERSION.to_le_bytes().to_vec();
    header.extend_from_slice(&db.seq.to_le_bytes());
    encode_into(&mut out, &header).unwrap();
    for (i, framed) in encode_snapshot(db).iter().enumerate() {
        let Decoded::Frame { payload, .. } = decode(framed, 0) else {
            panic!("encode_snapshot makes whole frames");
        };
        let mut payload = payload.to_vec();
        if damage(i, &mut payload) {
            encode_into(&mut out, &payload).unwrap();
        } else {
            let at = out.len();
            out.extend_from_slice(framed);
            let last = out.len() - 1;
            out[last] ^= 1;
            assert!(out.len() > at + FRAME_HEADER_BYTES);
        }
    }
    out
}

/// (offset of each body frame, count) in a snapshot file's bytes.
fn frame_offsets(bytes: &[u8]) -> Vec<u64> {
    let mut offsets = Vec::new();
    let mut at = SNAPSHOT_MAGIC.len();
    while let Decoded::Frame { next, .. } | Decoded::BadChecksum { end: next } = decode(bytes, at) {
        offsets.push(at as u64);
        at = next;
    }
    offsets.remove(0); // the header frame
    offsets
}

fn state(db: &Db) -> String {
    let mut out = format!("seq {}\n", db.seq);
    for (name, t) in &db.tables {
        out += &format!("{name} {:?} {:?}\n", t.schema, t.indexes);
        for (k, r) in &t.rows {
            out += &format!("{k:?} {r:?}\n");
        }
    }
    out
}

fn options() -> RecoveryOptions {
    RecoveryOptions {
        limits: Limits::default(),
        retention: Retention::default(),
        repair: false,
        keep_zero_tail: false,
    }
}

fn write(dir: &Path, db: &Db, bytes: &[u8]) {
    std::fs::write(snapshot_path(dir, db.seq), bytes).unwrap();
}

#[test]
fn a_snapshot_of_many_frames_loads_the_state_it_was_taken_of() {
    let scratch = Scratch::new("whole");
    let db = source();
    let bytes = snapshot_file(&db, |_, _| true);
    assert!(
        frame_offsets(&bytes).len() >= 6,
        "several rows frames per table"
    );
    write(&scratch.0, &db, &bytes);
    let recovered = recover(&scratch.0, &options()).expect("recovers");
    assert!(recovered.skipped_snapshots.is_empty());
    assert_eq!(recovered.snapshot_seq, Some(db.seq));
    assert_eq!(state(&recovered.db), state(&db));
    for t in recovered.db.tables.values() {
        t.rows.check_invariants();
    }
}

/// (offset, reason) of a damaged snapshot as `check` reports it.
fn damage_of(e: RecoveryError) -> (u64, String) {
    match e {
        RecoveryError::Corrupt { offset, reason, .. }
        | RecoveryError::Log(LogError::Corrupt { offset, reason, .. }) => (offset, reason),
        other => panic!("expected a damaged frame, got {other}"),
    }
}

#[test]
fn a_failed_check_anywhere_is_reported_before_an_earlier_frame_that_does_not_decode() {
    let scratch = Scratch::new("damage");
    let db = source();
    let offsets = frame_offsets(&snapshot_file(&db, |_, _| true));
    let (bad, flipped) = (2, offsets.len() - 2);
    // An unknown frame kind in frame `bad` (checksum holds), a flipped bit in `flipped`.
    let undecodable = |i: usize, p: &mut Vec<u8>| {
        if i == bad {
            p[0] = 0xee;
        }
        true
    };
    write(&scratch.0, &db, &snapshot_file(&db, undecodable));
    let (offset, reason) = damage_of(check(&scratch.0).unwrap_err());
    assert_eq!(offset, offsets[bad]);
    assert!(reason.contains("unknown snapshot frame kind"), "{reason}");

    write(
        &scratch.0,
        &db,
        &snapshot_file(&db, |i, p| undecodable(i, p) && i != flipped),
    );
    let (offset, reason) = damage_of(check(&scratch.0).unwrap_err());
    assert_eq!(
        (offset, reason.as_str()),
        (offsets[flipped], "frame checksum mismatch")
    );

    // Cut inside the last frame: the file ends inside a frame, reported at that frame.
    let mut cut = snapshot_file(&db, |_, _| true);
    cut.truncate(cut.len() - 3);
    write(&scratch.0, &db, &cut);
    let (offset, reason) = damage_of(check(&scratch.0).unwrap_err());
    assert_eq!(
        (offset, reason.as_str()),
        (*offsets.last().unwrap(), "file ends inside a frame")
    );

    // Recovery passes the damaged snapshot over, naming the damage.
    let recovered = recover(&scratch.0, &options()).expect("recovers without it");
    assert_eq!(recovered.skipped_snapshots.len(), 1);
    assert!(
        recovered.skipped_snapshots[0].contains("file ends inside a frame"),
        "{:?}",
        recovered.skipped_snapshots
    );
}
