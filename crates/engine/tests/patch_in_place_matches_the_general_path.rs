//! A typed patch (`TxRef::patch_decoded`) on a table without secondary indexes replaces its
//! row where it lies, found once; the general path (`patch`, JSON in) reads the row and
//! then writes it back. Random patches — rows present and missing, `if_version` right and
//! wrong, a NOT NULL column set to null, rows past `row_bytes_max`, transactions past
//! `commit_bytes_max`, commits and rollbacks — must get the same answers from both and leave
//! the same rows behind, and a copy of the row map taken before (as a snapshot takes one)
//! must not change.

use serde_json::{json, Map, Value as Json};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Db, Key, Limits, Retention, SchemaChange, TableSchema, Value,
};
use sluice_fuzzkit::Rng;

const ROWS: i64 = 40;

fn db() -> Db {
    let limits = Limits {
        row_bytes_max: 300,
        commit_bytes_max: 2_000,
        ..Limits::default()
    };
    let mut db = Db::new(limits, Changelog::new(Retention::default()));
    let column = |name: &str, ty, not_null| ColumnDef {
        name: name.into(),
        ty,
        not_null,
        default: None,
    };
    let schema = TableSchema {
        name: "t".into(),
        columns: vec![
            column("id", ColumnType::Integer, true),
            column("n", ColumnType::Integer, true),
            column("s", ColumnType::Text, false),
        ],
        pk: 0,
        indexes: vec![],
    };
    let change = SchemaChange::CreateTable {
        schema,
        if_not_exists: false,
    };
    db.apply_schema(vec![change], "create t".into()).unwrap();
    for id in 0..ROWS {
        let mut tx = db.transaction();
        let row = json!({"id": id, "n": id * 10, "s": "x"});
        tx.insert("t", row.as_object().unwrap(), None).unwrap();
        tx.commit();
    }
    db
}

/// Every row of `t`: key, values, version, seq.
fn rows(db: &Db) -> Vec<(Key, Vec<Value>, u64)> {
    db.table("t")
        .unwrap()
        .rows
        .iter()
        .map(|(k, e)| (k.clone(), e.values.to_vec(), e.version))
        .collect()
}

/// An answer: the key and version written, or the refusal's code and message.
type Answer = Result<(Key, u64), (String, String)>;

#[test]
fn a_patch_in_place_answers_and_writes_as_the_general_path_does() {
    let seed = std::env::var("SLUICE_PATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9a7c_4e11_u64);
    let mut rng = Rng::new(seed);
    let (mut fast, mut general) = (db(), db());
    let before = fast.table("t").unwrap().rows.clone();
    let rows_before = before.iter().count();
    let schema = fast.table("t").unwrap().schema.clone();
    let (mut refused, mut written) = (0, 0);
    for step in 0..3_000 {
        let mut tx_fast = fast.transaction();
        let mut tx_general = general.transaction();
        for _ in 0..1 + rng.below(6) {
            // A few ids past the table's rows: not found.
            let id = rng.below(ROWS as usize + 4) as i64;
            let n = match rng.below(8) {
                0 => Json::Null, // NOT NULL
                _ => json!(rng.below(1_000)),
            };
            let s = "é".repeat(rng.below(200)); // past row_bytes_max at times
            let mut set = Map::new();
            let mut typed = Vec::new();
            if rng.below(3) != 0 {
                typed.push((1, n.as_i64().map_or(Value::Null, Value::Integer)));
                set.insert("n".into(), n);
            }
            if rng.below(2) == 0 || set.is_empty() {
                typed.push((2, Value::Text(s.as_str().into())));
                set.insert("s".into(), json!(s));
            }
            let current = tx_general
                .get("t", &Key::Int(id))
                .unwrap()
                .map(|e| e.version);
            let if_version = match rng.below(4) {
                0 => current,
                1 => Some(rng.below(5) as u64),
                _ => None,
            };
            let a: Answer = tx_fast
                .ops()
                .patch_decoded(&schema, Key::Int(id), &mut typed, if_version)
                .map(|w| (w.key, w.version))
                .map_err(|e| (format!("{:?}", e.code), e.message));
            let b: Answer = tx_general
                .patch("t", &json!(id), &set, if_version)
                .map(|w| (w.key, w.version))
                .map_err(|e| (format!("{:?}", e.code), e.message));
            assert_eq!(a, b, "seed {seed} step {step}: patch of {id} with {set:?}");
            if a.is_err() {
                refused += 1;
            } else {
                written += 1;
            }
        }
        if rng.below(3) == 0 {
            drop(tx_fast); // rolls back
            drop(tx_general);
        } else {
            let (a, b) = (tx_fast.commit(), tx_general.commit());
            assert_eq!(
                a.map(|c| c.seq),
                b.map(|c| c.seq),
                "seed {seed} step {step}"
            );
        }
        assert_eq!(rows(&fast), rows(&general), "seed {seed} step {step}");
    }
    assert!(
        refused > 500 && written > 500,
        "{refused} refused, {written} written"
    );
    // The copy taken before still holds the rows as they were.
    assert_eq!(before.iter().count(), rows_before);
    for (key, entry) in before.iter() {
        let Key::Int(id) = key else {
            panic!("integer keys")
        };
        assert_eq!(
            entry.values[1],
            Value::Integer(id * 10),
            "row {id} of the copy"
        );
    }
}
