//! A snapshot's schema frame is outside bytes like any other: a table it declares must pass
//! the same checks as `CREATE TABLE` (no duplicate column, an INTEGER or TEXT primary key, an
//! index on existing columns), else loading refuses it with a message naming the table.

use std::sync::Arc;

use sluice_engine::codec::{encode_snapshot, SnapshotLoader};
use sluice_engine::table::Table;
use sluice_engine::{Changelog, ColumnDef, ColumnType, Db, Limits, Retention, TableSchema};
use sluice_log::frame::{decode, Decoded};

fn column(name: &str, ty: ColumnType) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null: false,
        default: None,
    }
}

/// Encodes a snapshot of a db holding one table with `schema` (bypassing the checks, as a
/// damaged or forged file would) and loads it into a fresh db.
fn load(schema: TableSchema) -> Result<Db, String> {
    let mut source = Db::new(Limits::default(), Changelog::new(Retention::default()));
    source
        .tables
        .insert(schema.name.clone(), Table::new(Arc::new(schema)));
    let mut loaded = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let mut loader = SnapshotLoader::new();
    for frame in encode_snapshot(&source) {
        let Decoded::Frame { payload, .. } = decode(&frame, 0) else {
            panic!("encode_snapshot makes whole frames");
        };
        loader.frame(&mut loaded, payload)?;
    }
    Ok(loaded)
}

#[test]
fn a_well_formed_schema_loads() {
    let db = load(TableSchema {
        name: "t".into(),
        columns: vec![
            column("id", ColumnType::Integer),
            column("v", ColumnType::Text),
        ],
        pk: 0,
        indexes: vec![],
    })
    .expect("a valid snapshot loads");
    assert!(db.tables.contains_key("t"));
}

#[test]
fn a_schema_with_a_repeated_column_is_refused() {
    let err = load(TableSchema {
        name: "t".into(),
        columns: vec![
            column("id", ColumnType::Integer),
            column("id", ColumnType::Text),
        ],
        pk: 0,
        indexes: vec![],
    })
    .err()
    .expect("refused");
    assert!(
        err.contains("\"t\"") && err.contains("declared twice"),
        "{err}"
    );
}

#[test]
fn a_schema_with_a_real_primary_key_is_refused() {
    let err = load(TableSchema {
        name: "t".into(),
        columns: vec![column("id", ColumnType::Real)],
        pk: 0,
        indexes: vec![],
    })
    .err()
    .expect("refused");
    assert!(err.contains("must be INTEGER or TEXT"), "{err}");
}
