//! Model-based oracle for the engine and its durability path.
//!
//! A seeded random workload — DDL batches and multi-op transactions, with deliberate
//! failures mixed in — runs against a real [`Db`] and against a plain reference model made
//! of `BTreeMap`s. After every step both must agree on the tables, their columns, every
//! row's values, version and seq, the contents of every secondary index, and `db.seq`.
//!
//! Every commit is also written to a real data directory (through the group-commit
//! [`Log`], as the server does) with snapshots taken at random points. At checkpoints the
//! directory is recovered three ways — newest snapshot plus log, log alone, and past a
//! damaged newest snapshot — and each result must equal the live state, changelog window
//! included. Some checkpoints are restarts: the log is shut down, the directory recovered
//! in place, and the workload sometimes continues on the recovered `Db`. In half the seeds
//! old segments are retired behind the snapshots, as the server does; recovery without a
//! snapshot reaching back far enough must then refuse, never skip the missing commits.
//!
//! Further tests cut the newest segment at every frame boundary and at random offsets
//! (recovery must keep exactly the whole commits), damage the log before its tail (recovery
//! must refuse, naming the file and offset), and pin down single behaviours.
//!
//! A failure names its seed and step. Reproduce it with
//! `SLUICE_ORACLE_SEED=<seed> SLUICE_ORACLE_STEPS=<steps> cargo test -p sluice-engine --test model_oracle`.

use sluice_fuzzkit::env_u64;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Map, Value as Json};
use sluice_engine::codec;
use sluice_engine::recovery::{recover, Recovered, RecoveryError, RecoveryOptions};
use sluice_engine::{
    Change, ChangeOp, Changelog, ColumnDef, ColumnType, Commit, CommitBody, Db, ErrorCode,
    IndexDef, Key, Limits, Retention, SchemaChange, TableSchema, TopicChange, TopicConfig, Tx,
    TxError, Value, WriteResult,
};
use sluice_log::segment::{list_segments, segment_path};
use sluice_log::snapshot::{snapshot_path, write_snapshot};
use sluice_log::{frame, Durability, Log, LogConfig, LogError, Waiter};

// ---------------------------------------------------------------------------------------
// Seeds, steps and failure context

fn seeds(default: &[u64]) -> Vec<u64> {
    env_u64("SLUICE_ORACLE_SEED").map_or_else(|| default.to_vec(), |s| vec![s])
}

fn steps() -> usize {
    env_u64("SLUICE_ORACLE_STEPS").map_or(3000, |s| s as usize)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Runs `body` for one seed; a panic inside comes back as a message naming the seed, the
/// step it happened at and how to reproduce it.
fn run_seeded(test: &str, seed: u64, body: impl FnOnce(&Cell<usize>)) -> Result<(), String> {
    let step = Cell::new(0usize);
    catch_unwind(AssertUnwindSafe(|| body(&step))).map_err(|payload| {
        format!(
            "{test}: seed={seed} step={}: {}\n  reproduce with: SLUICE_ORACLE_SEED={seed} \
             SLUICE_ORACLE_STEPS={} cargo test -p sluice-engine --test model_oracle {test}\n  \
             the data directory is left at {}/sluice-oracle-*-{}-{seed}",
            step.get(),
            panic_message(payload.as_ref()),
            steps(),
            std::env::temp_dir().display(),
            std::process::id(),
        )
    })
}

/// Runs every seed on its own thread and fails with all failures at once.
fn run_seeds(test: &str, default_seeds: &[u64], body: fn(u64, &Cell<usize>)) {
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds(default_seeds)
            .into_iter()
            .map(|seed| scope.spawn(move || run_seeded(test, seed, |step| body(seed, step))))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("seed thread").err())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------------------
// A tiny PRNG (splitmix64)

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_F42D_4C95_7F2D)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0);
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The reference model

/// A value as the model keeps it: exact (REAL by bits, INTEGER and TIMESTAMP apart).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum MVal {
    Null,
    Int(i64),
    Real(u64),
    Bool(bool),
    Text(String),
    Blob(Vec<u8>),
    Json(String),
    Ts(i64),
}

impl MVal {
    fn of(v: &Value) -> MVal {
        match v {
            Value::Null => MVal::Null,
            Value::Integer(i) => MVal::Int(*i),
            Value::Real(r) => MVal::Real(r.to_bits()),
            Value::Boolean(b) => MVal::Bool(*b),
            Value::Text(s) => MVal::Text(s.to_string()),
            Value::Blob(b) => MVal::Blob(b.to_vec()),
            Value::Json(s) => MVal::Json(s.to_string()),
            Value::Timestamp(t) => MVal::Ts(*t),
        }
    }

    fn to_value(&self) -> Value {
        match self {
            MVal::Null => Value::Null,
            MVal::Int(i) => Value::Integer(*i),
            MVal::Real(bits) => Value::Real(f64::from_bits(*bits)),
            MVal::Bool(b) => Value::Boolean(*b),
            MVal::Text(s) => Value::Text(s.as_str().into()),
            MVal::Blob(b) => Value::Blob(b.as_slice().into()),
            MVal::Json(s) => Value::Json(s.as_str().into()),
            MVal::Ts(t) => Value::Timestamp(*t),
        }
    }

    fn fits(&self, ty: ColumnType) -> bool {
        matches!(
            (self, ty),
            (MVal::Null, _)
                | (MVal::Int(_), ColumnType::Integer)
                | (MVal::Real(_), ColumnType::Real)
                | (MVal::Bool(_), ColumnType::Boolean)
                | (MVal::Text(_), ColumnType::Text)
                | (MVal::Blob(_), ColumnType::Blob)
                | (MVal::Json(_), ColumnType::Json)
                | (MVal::Ts(_), ColumnType::Timestamp)
        )
    }

    /// Bytes in a log record, as `row_bytes_max` counts them.
    fn encoded_len(&self) -> usize {
        match self {
            MVal::Null | MVal::Bool(_) => 1,
            MVal::Int(_) | MVal::Real(_) | MVal::Ts(_) => 9,
            MVal::Text(s) | MVal::Json(s) => 5 + s.len(),
            MVal::Blob(b) => 5 + b.len(),
        }
    }
}

/// What a JSON value means in a column of type `ty`; `None` if it does not fit.
fn convert(ty: ColumnType, json: &Json) -> Option<MVal> {
    if json.is_null() {
        return Some(MVal::Null);
    }
    match ty {
        ColumnType::Integer => json.as_i64().map(MVal::Int),
        ColumnType::Timestamp => json.as_i64().map(MVal::Ts),
        ColumnType::Real => json.as_f64().map(|f| MVal::Real(f.to_bits())),
        ColumnType::Boolean => json.as_bool().map(MVal::Bool),
        ColumnType::Text => json.as_str().map(|s| MVal::Text(s.to_string())),
        ColumnType::Blob => json
            .as_str()
            .and_then(|s| B64.decode(s).ok())
            .map(MVal::Blob),
        ColumnType::Json => Some(MVal::Json(json.to_string())),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum MKey {
    Int(i64),
    Text(String),
}

impl MKey {
    fn of(k: &Key) -> MKey {
        match k {
            Key::Int(i) => MKey::Int(*i),
            Key::Text(s) => MKey::Text(s.to_string()),
        }
    }

    fn from_val(v: &MVal) -> Option<MKey> {
        match v {
            MVal::Int(i) => Some(MKey::Int(*i)),
            MVal::Text(s) => Some(MKey::Text(s.clone())),
            _ => None,
        }
    }

    fn to_key(&self) -> Key {
        match self {
            MKey::Int(i) => Key::Int(*i),
            MKey::Text(s) => Key::Text(s.as_str().into()),
        }
    }

    fn to_json(&self) -> Json {
        match self {
            MKey::Int(i) => Json::from(*i),
            MKey::Text(s) => Json::from(s.as_str()),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct MCol {
    name: String,
    ty: ColumnType,
    not_null: bool,
    default: Option<MVal>,
}

impl MCol {
    fn of(c: &ColumnDef) -> MCol {
        MCol {
            name: c.name.clone(),
            ty: c.ty,
            not_null: c.not_null,
            default: c.default.as_ref().map(MVal::of),
        }
    }

    /// A NOT NULL column that an insert must name (no usable default).
    fn required(&self) -> bool {
        self.not_null && self.default.as_ref().is_none_or(|d| *d == MVal::Null)
    }
}

#[derive(Clone, Debug, PartialEq)]
struct MRow {
    values: Vec<MVal>,
    /// The seq of the commit that last wrote the row.
    version: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct MTable {
    columns: Vec<MCol>,
    pk: usize,
    indexes: Vec<(String, Vec<usize>)>,
    rows: BTreeMap<MKey, MRow>,
}

impl MTable {
    fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    fn version_of(&self, key: &MKey) -> u64 {
        self.rows.get(key).map_or(0, |r| r.version)
    }
}

type Tables = BTreeMap<String, MTable>;

#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    tables: Tables,
    topics: MTopics,
    seq: u64,
}

/// Error codes (as `ErrorCode::as_str`) any of which is a right answer.
type Codes = BTreeSet<&'static str>;

fn codes(list: &[&'static str]) -> Codes {
    list.iter().copied().collect()
}

/// Applies one schema change to `tables`: `Ok(true)` applied, `Ok(false)` a valid no-op.
fn model_schema_change(
    tables: &mut Tables,
    change: &SchemaChange,
    limits: &Limits,
) -> Result<bool, Codes> {
    let max = limits.columns_per_table_max;
    let mut errs = Codes::new();
    match change {
        SchemaChange::CreatePolicy { .. } | SchemaChange::DropPolicy { .. } => {
            panic!("the model generates no row policies (their tests are in crates/sluice/tests)")
        }
        SchemaChange::CreateTable {
            schema,
            if_not_exists,
        } => {
            if tables.contains_key(&schema.name) {
                if *if_not_exists {
                    return Ok(false);
                }
                errs.insert("already_exists");
            }
            if schema.columns.len() > max {
                errs.insert("limit");
            }
            let cols: Vec<MCol> = schema.columns.iter().map(MCol::of).collect();
            let names: BTreeSet<&str> = cols.iter().map(|c| c.name.as_str()).collect();
            let bad_pk = cols
                .get(schema.pk)
                .is_none_or(|c| !matches!(c.ty, ColumnType::Integer | ColumnType::Text));
            let bad_default = cols
                .iter()
                .any(|c| c.default.as_ref().is_some_and(|d| !d.fits(c.ty)));
            if cols.is_empty() || names.len() != cols.len() || bad_pk || bad_default {
                errs.insert("schema");
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            let indexes = schema
                .indexes
                .iter()
                .map(|ix| (ix.name.clone(), ix.columns.clone()))
                .collect();
            tables.insert(
                schema.name.clone(),
                MTable {
                    columns: cols,
                    pk: schema.pk,
                    indexes,
                    rows: BTreeMap::new(),
                },
            );
        }
        SchemaChange::CreateIndex {
            table,
            name,
            columns,
            if_not_exists,
        } => {
            let Some(t) = tables.get_mut(table) else {
                return Err(codes(&["not_found"]));
            };
            if t.indexes.iter().any(|(n, _)| n == name) {
                if *if_not_exists {
                    return Ok(false);
                }
                errs.insert("already_exists");
            }
            let positions: Vec<Option<usize>> = columns.iter().map(|c| t.col(c)).collect();
            if positions.is_empty() || positions.iter().any(Option::is_none) {
                errs.insert("schema");
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            t.indexes.push((
                name.clone(),
                positions.into_iter().map(Option::unwrap).collect(),
            ));
        }
        SchemaChange::DropTable { name, if_exists } => {
            if tables.remove(name).is_none() {
                return if *if_exists {
                    Ok(false)
                } else {
                    Err(codes(&["not_found"]))
                };
            }
        }
        SchemaChange::AddColumn { table, column } => {
            let Some(t) = tables.get_mut(table) else {
                return Err(codes(&["not_found"]));
            };
            let col = MCol::of(column);
            if t.col(&col.name).is_some() {
                errs.insert("already_exists");
            }
            if t.columns.len() + 1 > max {
                errs.insert("limit");
            }
            if col.required() || col.default.as_ref().is_some_and(|d| !d.fits(col.ty)) {
                errs.insert("schema");
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            let fill = col.default.clone().unwrap_or(MVal::Null);
            for row in t.rows.values_mut() {
                row.values.push(fill.clone());
            }
            t.columns.push(col);
        }
    }
    Ok(true)
}

/// A batch is all or nothing: the new tables and the changes that were not no-ops, or the
/// index of the first failing change and the codes it may fail with.
fn model_schema_batch(
    tables: &Tables,
    changes: &[SchemaChange],
    limits: &Limits,
) -> Result<(Tables, Vec<SchemaChange>), (usize, Codes)> {
    let mut scratch = tables.clone();
    let mut applied = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        match model_schema_change(&mut scratch, change, limits) {
            Ok(true) => applied.push(change.clone()),
            Ok(false) => {}
            Err(codes) => return Err((i, codes)),
        }
    }
    Ok((scratch, applied))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Insert,
    Upsert,
    Patch,
    Delete,
}

#[derive(Clone, Debug)]
struct OpSpec {
    kind: OpKind,
    table: String,
    /// The row (insert, upsert) or the columns to set (patch).
    fields: Map<String, Json>,
    /// The key (patch, delete).
    id: Json,
    if_version: Option<u64>,
}

/// One row change as a commit should report it.
#[derive(Clone, Debug, PartialEq)]
struct ExpChange {
    table: String,
    op: ChangeOp,
    key: MKey,
    row: Option<Vec<MVal>>,
    version: u64,
}

impl ExpChange {
    fn of(c: &Change) -> ExpChange {
        ExpChange {
            table: c.table.name.clone(),
            op: c.op,
            key: MKey::of(&c.key),
            row: c.row.as_ref().map(|r| r.iter().map(MVal::of).collect()),
            version: c.version,
        }
    }
}

fn check_row(t: &MTable, values: &[MVal], limits: &Limits, errs: &mut Codes) {
    if t.columns
        .iter()
        .zip(values)
        .any(|(c, v)| c.not_null && *v == MVal::Null)
    {
        errs.insert("schema");
    }
    if values.iter().map(MVal::encoded_len).sum::<usize>() > limits.row_bytes_max {
        errs.insert("limit");
    }
}

/// Applies one write op to `tables` as part of the transaction that will get `seq`.
fn model_op(
    tables: &mut Tables,
    op: &OpSpec,
    seq: u64,
    limits: &Limits,
) -> Result<ExpChange, Codes> {
    let Some(t) = tables.get_mut(&op.table) else {
        return Err(codes(&["not_found"]));
    };
    let mut errs = Codes::new();
    match op.kind {
        OpKind::Insert | OpKind::Upsert => {
            let mut given: Vec<Option<MVal>> = vec![None; t.columns.len()];
            for (name, json) in &op.fields {
                match t
                    .col(name)
                    .and_then(|i| Some((i, convert(t.columns[i].ty, json)?)))
                {
                    Some((i, v)) => given[i] = Some(v),
                    None => {
                        errs.insert("schema");
                    }
                }
            }
            // Unnamed columns take their default; an explicit null stays NULL.
            let values: Vec<MVal> = given
                .into_iter()
                .zip(&t.columns)
                .map(|(v, c)| v.or_else(|| c.default.clone()).unwrap_or(MVal::Null))
                .collect();
            let Some(key) = MKey::from_val(&values[t.pk]) else {
                errs.insert("schema");
                return Err(errs);
            };
            check_row(t, &values, limits, &mut errs);
            let current = t.rows.get(&key).map(|r| r.version);
            if op.if_version.is_some_and(|v| v != current.unwrap_or(0)) {
                errs.insert("conflict");
            }
            if current.is_some() && op.kind == OpKind::Insert {
                errs.insert("already_exists");
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            // A row's version is the seq of the commit that last wrote it.
            let (change_op, version) = match current {
                Some(_) => (ChangeOp::Update, seq),
                None => (ChangeOp::Insert, seq),
            };
            t.rows.insert(
                key.clone(),
                MRow {
                    values: values.clone(),
                    version,
                },
            );
            Ok(ExpChange {
                table: op.table.clone(),
                op: change_op,
                key,
                row: Some(values),
                version,
            })
        }
        OpKind::Patch | OpKind::Delete => {
            let pk_ty = t.columns[t.pk].ty;
            let Some(key) = convert(pk_ty, &op.id).as_ref().and_then(MKey::from_val) else {
                return Err(codes(&["schema"]));
            };
            if op.if_version.is_some_and(|v| v != t.version_of(&key)) {
                errs.insert("conflict");
            }
            let Some(old) = t.rows.get(&key).cloned() else {
                errs.insert("not_found");
                return Err(errs);
            };
            if op.kind == OpKind::Delete {
                if !errs.is_empty() {
                    return Err(errs);
                }
                t.rows.remove(&key);
                return Ok(ExpChange {
                    table: op.table.clone(),
                    op: ChangeOp::Delete,
                    key,
                    row: None,
                    version: old.version,
                });
            }
            let mut values = old.values.clone();
            for (name, json) in &op.fields {
                match t.col(name) {
                    // A patch may not name the primary key, even with its current value.
                    Some(i) if i == t.pk => {
                        errs.insert("bad_request");
                    }
                    Some(i) => match convert(t.columns[i].ty, json) {
                        Some(v) => values[i] = v,
                        None => {
                            errs.insert("schema");
                        }
                    },
                    None => {
                        errs.insert("schema");
                    }
                }
            }
            check_row(t, &values, limits, &mut errs);
            if !errs.is_empty() {
                return Err(errs);
            }
            let version = seq;
            t.rows.insert(
                key.clone(),
                MRow {
                    values: values.clone(),
                    version,
                },
            );
            Ok(ExpChange {
                table: op.table.clone(),
                op: ChangeOp::Update,
                key,
                row: Some(values),
                version,
            })
        }
    }
}

fn run_op(tx: &mut Tx<'_>, op: &OpSpec) -> Result<WriteResult, TxError> {
    match op.kind {
        OpKind::Insert => tx.insert(&op.table, &op.fields, op.if_version),
        OpKind::Upsert => tx.upsert(&op.table, &op.fields, op.if_version),
        OpKind::Patch => tx.patch(&op.table, &op.id, &op.fields, op.if_version),
        OpKind::Delete => tx.delete(&op.table, &op.id, op.if_version),
    }
}

// ---------------------------------------------------------------------------------------
// Comparing an engine Db with the model

/// The model an engine `Db` amounts to.
fn model_of(db: &Db) -> Model {
    let tables = db
        .tables
        .iter()
        .map(|(name, t)| {
            let table = MTable {
                columns: t.schema.columns.iter().map(MCol::of).collect(),
                pk: t.schema.pk,
                indexes: t
                    .schema
                    .indexes
                    .iter()
                    .map(|ix| (ix.name.clone(), ix.columns.clone()))
                    .collect(),
                rows: t
                    .rows
                    .iter()
                    .map(|(k, r)| {
                        let row = MRow {
                            values: r.values.iter().map(MVal::of).collect(),
                            version: r.version,
                        };
                        (MKey::of(k), row)
                    })
                    .collect(),
            };
            (name.clone(), table)
        })
        .collect();
    Model {
        tables,
        topics: model_topics_of(db),
        seq: db.seq,
    }
}

/// The first difference between two models, if any.
fn diff_models(want: &Model, got: &Model) -> Option<String> {
    if want.seq != got.seq {
        return Some(format!("seq: expected {}, got {}", want.seq, got.seq));
    }
    if let Some(diff) = diff_topics(&want.topics, &got.topics) {
        return Some(diff);
    }
    let (wn, gn): (Vec<_>, Vec<_>) = (want.tables.keys().collect(), got.tables.keys().collect());
    if wn != gn {
        return Some(format!("tables: expected {wn:?}, got {gn:?}"));
    }
    for (name, w) in &want.tables {
        let g = &got.tables[name];
        if w.columns != g.columns {
            return Some(format!(
                "table {name:?}: columns: expected {:?}, got {:?}",
                w.columns, g.columns
            ));
        }
        if w.pk != g.pk {
            return Some(format!(
                "table {name:?}: pk: expected {}, got {}",
                w.pk, g.pk
            ));
        }
        if w.indexes != g.indexes {
            return Some(format!(
                "table {name:?}: indexes: expected {:?}, got {:?}",
                w.indexes, g.indexes
            ));
        }
        let keys: BTreeSet<&MKey> = w.rows.keys().chain(g.rows.keys()).collect();
        for key in keys {
            let (wr, gr) = (w.rows.get(key), g.rows.get(key));
            if wr != gr {
                return Some(format!(
                    "table {name:?} row {key:?} ({} rows expected, {} found): expected {wr:?}, got {gr:?}",
                    w.rows.len(),
                    g.rows.len()
                ));
            }
        }
    }
    None
}

type IndexEntry = (Vec<MVal>, MKey);

/// Every secondary index must hold exactly the entries derived from the rows, and every
/// row must sit under the key its primary-key column says.
fn check_indexes(db: &Db, what: &str) {
    for (name, t) in &db.tables {
        assert_eq!(
            &t.schema.name, name,
            "{what}: table stored under another name"
        );
        assert_eq!(
            t.indexes.len(),
            t.schema.indexes.len(),
            "{what}: table {name:?} has {} index sets for {} index definitions",
            t.indexes.len(),
            t.schema.indexes.len()
        );
        for (key, row) in &t.rows {
            assert_eq!(
                row.values.len(),
                t.schema.columns.len(),
                "{what}: table {name:?} row {key} has the wrong number of values"
            );
            assert_eq!(
                Key::from_value(&row.values[t.schema.pk]).as_ref(),
                Some(key),
                "{what}: table {name:?} row {key} holds another primary key value"
            );
        }
        for (i, def) in t.schema.indexes.iter().enumerate() {
            let want: BTreeSet<IndexEntry> = t
                .rows
                .iter()
                .map(|(k, r)| {
                    let vals = def
                        .columns
                        .iter()
                        .map(|&c| MVal::of(&r.values[c]))
                        .collect();
                    (vals, MKey::of(k))
                })
                .collect();
            let got_list: Vec<IndexEntry> = t.indexes[i]
                .iter()
                .map(|(vals, k)| (vals.iter().map(MVal::of).collect(), MKey::of(k)))
                .collect();
            let got: BTreeSet<IndexEntry> = got_list.iter().cloned().collect();
            if got != want || got_list.len() != want.len() {
                let missing: Vec<_> = want.difference(&got).take(3).collect();
                let extra: Vec<_> = got.difference(&want).take(3).collect();
                panic!(
                    "{what}: index {:?} of table {name:?} holds {} entries for {} rows; \
                     missing {missing:?}, stale {extra:?}",
                    def.name,
                    got_list.len(),
                    t.rows.len()
                );
            }
        }
    }
}

/// The engine `db` must equal `model` in every table, column, row and index, and in seq.
fn assert_matches(db: &Db, model: &Model, what: &str) {
    if let Some(diff) = diff_models(model, &model_of(db)) {
        panic!("{what}: the engine differs from the model: {diff}");
    }
    check_indexes(db, what);
    check_topic_indexes(db, what);
}

/// Both changelogs must retain the same window of seqs with equal entries. Row entries after
/// `full_after` were replayed (not rebuilt for the window), so they must also be rendered
/// with the same column names.
fn compare_changelogs(live: &Db, rec: &Db, full_after: u64, what: &str) {
    let (lh, rh) = (live.changelog.horizon(), rec.changelog.horizon());
    assert_eq!(
        rh, lh,
        "{what}: changelog horizon: recovered {rh}, live {lh}"
    );
    let l: Vec<Arc<Commit>> = live
        .changelog
        .since(lh)
        .expect("live window")
        .cloned()
        .collect();
    let r: Vec<Arc<Commit>> = rec
        .changelog
        .since(rh)
        .expect("recovered window")
        .cloned()
        .collect();
    let ls: Vec<u64> = l.iter().map(|c| c.seq).collect();
    let rs: Vec<u64> = r.iter().map(|c| c.seq).collect();
    assert_eq!(rs, ls, "{what}: changelog seqs: recovered vs live");
    for (a, b) in l.iter().zip(&r) {
        match (&a.body, &b.body) {
            (
                CommitBody::Schema {
                    changes: ca,
                    sql: sa,
                },
                CommitBody::Schema {
                    changes: cb,
                    sql: sb,
                },
            ) => {
                assert_eq!(sb, sa, "{what}: changelog seq {}: DDL text", a.seq);
                assert_eq!(cb, ca, "{what}: changelog seq {}: schema changes", a.seq);
            }
            (CommitBody::Rows(ra), CommitBody::Rows(rb)) => {
                let ea: Vec<ExpChange> = ra.iter().map(ExpChange::of).collect();
                let eb: Vec<ExpChange> = rb.iter().map(ExpChange::of).collect();
                assert_eq!(eb, ea, "{what}: changelog seq {}: row changes", a.seq);
                if a.seq > full_after {
                    let names = |changes: &[Change]| -> Vec<Vec<String>> {
                        changes
                            .iter()
                            .map(|c| c.table.columns.iter().map(|c| c.name.clone()).collect())
                            .collect()
                    };
                    assert_eq!(
                        names(rb),
                        names(ra),
                        "{what}: changelog seq {}: columns",
                        a.seq
                    );
                }
            }
            (CommitBody::Topic(ta), CommitBody::Topic(tb)) => {
                assert_eq!(tb, ta, "{what}: changelog seq {}: topic change", a.seq);
            }
            _ => panic!(
                "{what}: changelog seq {} is DDL on one side and rows on the other",
                a.seq
            ),
        }
        assert_eq!(
            appends_of(b),
            appends_of(a),
            "{what}: changelog seq {}: appended records",
            a.seq
        );
    }
}

// ---------------------------------------------------------------------------------------
// Topics in the model

/// Per-record bookkeeping counted against `retain_bytes` beside its data and tags (checked
/// against `Record::bytes` on every record, so a change shows up as such).
const RECORD_OVERHEAD_BYTES: u64 = 32;

#[derive(Clone, Debug, PartialEq, Eq)]
struct MRecord {
    offset: u64,
    ts_us: i64,
    seq: u64,
    tags: Vec<String>,
    data: String,
}

impl MRecord {
    fn of(r: &sluice_engine::Record) -> MRecord {
        MRecord {
            offset: r.offset,
            ts_us: r.ts_us,
            seq: r.seq,
            tags: r.tags.iter().map(|t| t.to_string()).collect(),
            data: r.data.to_string(),
        }
    }

    fn bytes(&self) -> u64 {
        RECORD_OVERHEAD_BYTES
            + self.data.len() as u64
            + self.tags.iter().map(|t| t.len() as u64).sum::<u64>()
    }
}

#[derive(Clone, Debug, PartialEq)]
struct MTopic {
    config: TopicConfig,
    first: u64,
    next: u64,
    /// Newest append time ever (`i64::MIN` before the first record).
    last_ts: i64,
    records: VecDeque<MRecord>,
}

impl MTopic {
    fn new(config: TopicConfig) -> MTopic {
        MTopic {
            config,
            first: 0,
            next: 0,
            last_ts: i64::MIN,
            records: VecDeque::new(),
        }
    }

    fn bytes(&self) -> u64 {
        self.records.iter().map(MRecord::bytes).sum()
    }

    /// Retention as documented: the oldest go first while there are more than
    /// `retain_records`, more than `retain_bytes` bytes, or (with `now`) records older than
    /// `retain_secs`; the newest record always stays.
    fn trim(&mut self, now: Option<i64>) -> u64 {
        let floor = match now {
            Some(now) if self.config.retain_secs > 0 => {
                Some(now - self.config.retain_secs as i64 * 1_000_000)
            }
            _ => None,
        };
        let mut dropped = 0;
        while let Some(front) = self.records.front() {
            let n = self.records.len() as u64;
            let over = n > self.config.retain_records
                || (n > 1 && self.bytes() > self.config.retain_bytes)
                || (n > 1 && floor.is_some_and(|f| front.ts_us < f));
            if !over {
                break;
            }
            self.first = front.offset + 1;
            self.records.pop_front();
            dropped += 1;
        }
        dropped
    }
}

type MTopics = BTreeMap<String, MTopic>;

fn model_topics_of(db: &Db) -> MTopics {
    db.topics
        .iter()
        .map(|(name, t)| {
            let records: VecDeque<MRecord> = t.records().map(|r| MRecord::of(r)).collect();
            for (r, m) in t.records().zip(&records) {
                assert_eq!(
                    r.bytes(),
                    m.bytes(),
                    "topic {name:?}: bytes of record {}",
                    r.offset
                );
            }
            let topic = MTopic {
                config: t.config(),
                first: t.first(),
                next: t.next(),
                last_ts: t.last_ts_us(),
                records,
            };
            assert_eq!(t.bytes(), topic.bytes(), "topic {name:?}: bytes kept");
            assert_eq!(
                t.name().as_ref(),
                name.as_str(),
                "topic stored under another name"
            );
            (name.clone(), topic)
        })
        .collect()
}

fn diff_topics(want: &MTopics, got: &MTopics) -> Option<String> {
    let (wn, gn): (Vec<_>, Vec<_>) = (want.keys().collect(), got.keys().collect());
    if wn != gn {
        return Some(format!("topics: expected {wn:?}, got {gn:?}"));
    }
    for (name, w) in want {
        let g = &got[name];
        if (w.config, w.first, w.next) != (g.config, g.first, g.next) {
            return Some(format!(
                "topic {name:?}: (config, first, next): expected {:?}, got {:?}",
                (w.config, w.first, w.next),
                (g.config, g.first, g.next)
            ));
        }
        // After recovery the last append time of a topic whose records were all trimmed
        // is not required to survive; while records are kept it is the newest one's.
        if !w.records.is_empty() && w.last_ts != g.last_ts {
            return Some(format!(
                "topic {name:?}: last append time: expected {}, got {}",
                w.last_ts, g.last_ts
            ));
        }
        if w.records != g.records {
            let at = w
                .records
                .iter()
                .zip(&g.records)
                .position(|(a, b)| a != b)
                .unwrap_or(w.records.len().min(g.records.len()));
            return Some(format!(
                "topic {name:?}: {} records expected, {} found; first difference at #{at}: \
                 expected {:?}, got {:?}",
                w.records.len(),
                g.records.len(),
                w.records.get(at),
                g.records.get(at)
            ));
        }
    }
    None
}

/// Every topic's tag index must hold exactly the offsets of the kept records per tag, and
/// reads through it must agree with a scan.
fn check_topic_indexes(db: &Db, what: &str) {
    for (name, t) in &db.topics {
        let mut want: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for r in t.records() {
            for tag in r.tags.iter() {
                want.entry(tag).or_default().push(r.offset);
            }
        }
        assert_eq!(
            t.tags().len(),
            want.len(),
            "{what}: topic {name:?}: distinct tags in the index"
        );
        for (tag, offsets) in &want {
            let got: Vec<u64> = t
                .tags()
                .lookup_exact(tag)
                .map(|l| l.iter().copied().collect())
                .unwrap_or_default();
            assert_eq!(
                &got, offsets,
                "{what}: topic {name:?}: posting list of {tag:?}"
            );
        }
        for pattern in ["user:*", "room:1", "x", "*"] {
            let filter = sluice_engine::TagFilter::parse(&[pattern]).expect("a good pattern");
            let scan: Vec<u64> = t
                .records()
                .filter(|r| filter.matches(&r.tags))
                .map(|r| r.offset)
                .collect();
            let (read, next) = t.read(t.first(), usize::MAX, &filter).expect("from first");
            let read: Vec<u64> = read.iter().map(|r| r.offset).collect();
            assert_eq!(read, scan, "{what}: topic {name:?}: read with {pattern:?}");
            assert_eq!(
                next,
                t.next(),
                "{what}: topic {name:?}: next after a full read"
            );
        }
    }
}

/// The records a commit appended, topic by topic in commit order.
fn appends_of(commit: &Commit) -> Vec<(String, MRecord)> {
    commit
        .appends
        .iter()
        .flat_map(|a| {
            a.records
                .iter()
                .map(|r| (a.topic.to_string(), MRecord::of(r)))
        })
        .collect()
}

const TOPIC_NAMES: &[&str] = &["q0", "q1", "chat.room-7", "t0", "Q_2"];
const BAD_TOPIC_NAMES: &[&str] = &["", "a/b", "sp ace", "ä"];
const GOOD_TAGS: &[&str] = &[
    "user:1", "user:2", "user:30", "room:1", "room:12", "x", "~!#",
];
const BAD_TAGS: &[&str] = &["", "a b", "room:*", "*", "é", "tab\t"];

#[derive(Debug)]
struct AppendOp {
    topic: String,
    tags: Vec<String>,
    data: Json,
    ts_us: i64,
}

fn pick_topic_name(rng: &mut Rng, topics: &MTopics) -> String {
    let existing: Vec<&String> = topics.keys().collect();
    if !existing.is_empty() && rng.percent(60) {
        (*rng.pick(&existing)).clone()
    } else {
        rng.pick(TOPIC_NAMES).to_string()
    }
}

fn gen_topic_config(rng: &mut Rng, limits: &Limits) -> Option<TopicConfig> {
    if rng.percent(20) {
        return None;
    }
    let retain_records = match rng.below(20) {
        0 => 0,
        1..=5 => 1 + rng.below(3) as u64,
        6..=15 => 2 + rng.below(30) as u64,
        _ => limits.topic_retain_records,
    };
    let retain_bytes = match rng.below(20) {
        0 => 0,
        1 => limits.topic_retain_bytes + 1,
        2..=8 => 40 + rng.below(600) as u64,
        _ => limits.topic_retain_bytes,
    };
    let retain_secs = *rng.pick(&[0, 0, 1, 2, 30]);
    Some(TopicConfig {
        retain_records,
        retain_bytes,
        retain_secs,
    })
}

/// What `put_topic` must do: `Ok(None)` a no-op, `Ok(Some(change))` a commit.
fn model_put_topic(
    topics: &mut MTopics,
    name: &str,
    config: Option<TopicConfig>,
    limits: &Limits,
) -> Result<Option<TopicChange>, Codes> {
    if BAD_TOPIC_NAMES.contains(&name) {
        return Err(codes(&["bad_request"]));
    }
    let check = |c: &TopicConfig| -> Result<(), Codes> {
        if c.retain_records == 0 || c.retain_bytes == 0 {
            Err(codes(&["bad_request"]))
        } else if c.retain_bytes > limits.topic_retain_bytes {
            Err(codes(&["limit"]))
        } else {
            Ok(())
        }
    };
    match (topics.get_mut(name), config) {
        (Some(_), None) => Ok(None),
        (Some(t), Some(c)) if t.config == c => Ok(None),
        (Some(t), Some(c)) => {
            check(&c)?;
            t.config = c;
            t.trim(None);
            Ok(Some(TopicChange::Put {
                name: name.to_string(),
                config: c,
                created: false,
            }))
        }
        (None, c) => {
            if topics.len() >= limits.topics_max {
                return Err(codes(&["limit"]));
            }
            let c = c.unwrap_or(TopicConfig {
                retain_records: limits.topic_retain_records,
                retain_bytes: limits.topic_retain_bytes,
                retain_secs: 0,
            });
            check(&c)?;
            topics.insert(name.to_string(), MTopic::new(c));
            Ok(Some(TopicChange::Put {
                name: name.to_string(),
                config: c,
                created: true,
            }))
        }
    }
}

fn gen_append(rng: &mut Rng, topics: &MTopics, limits: &Limits, clock: i64, bad: bool) -> AppendOp {
    let mut topic = pick_topic_name(rng, topics);
    let mut tags: Vec<String> = (0..rng.below(4))
        .map(|_| rng.pick(GOOD_TAGS).to_string())
        .collect();
    let mut data = gen_json_doc(rng, 2);
    // Now and then the caller's clock is behind the topic's last append.
    let ts_us = if rng.percent(10) {
        clock - rng.range(1, 5_000_000)
    } else {
        clock
    };
    if bad {
        match rng.below(5) {
            0 => topic = rng.pick(&["nope", "Q0", "q9"]).to_string(),
            1 => {
                let at = rng.below(tags.len() + 1);
                tags.insert(at, rng.pick(BAD_TAGS).to_string());
            }
            2 => tags.push("y".repeat(129)),
            3 => tags = (0..17).map(|i| format!("n{i}")).collect(),
            _ => data = Json::from("z".repeat(limits.record_bytes_max + rng.below(100))),
        }
    }
    AppendOp {
        topic,
        tags,
        data,
        ts_us,
    }
}

/// What an append inside a transaction must do, in the engine's order of checks: the
/// topic, its tags, then the record's size.
fn model_append(
    topics: &mut MTopics,
    op: &AppendOp,
    seq: u64,
    limits: &Limits,
) -> Result<MRecord, Codes> {
    let Some(t) = topics.get_mut(&op.topic) else {
        return Err(codes(&["not_found"]));
    };
    if op.tags.len() > 16 {
        return Err(codes(&["limit"]));
    }
    let mut tags: Vec<String> = Vec::new();
    for tag in &op.tags {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'*');
        if !ok {
            return Err(codes(&["bad_request"]));
        }
        if !tags.contains(tag) {
            tags.push(tag.clone());
        }
    }
    let record = MRecord {
        offset: t.next,
        ts_us: op.ts_us.max(t.last_ts),
        seq,
        tags,
        data: op.data.to_string(),
    };
    if record.bytes() > limits.record_bytes_max as u64 {
        return Err(codes(&["limit"]));
    }
    t.next += 1;
    t.last_ts = record.ts_us;
    t.records.push_back(record.clone());
    Ok(record)
}

#[derive(Debug, Default)]
struct TopicStats {
    appends_ok: usize,
    append_errors: BTreeMap<&'static str, usize>,
    commits_with_appends: usize,
    commits_with_rows_and_appends: usize,
    ddl_applied: usize,
    ddl_noops: usize,
    ddl_refused: BTreeMap<&'static str, usize>,
    trimmed: u64,
}

// ---------------------------------------------------------------------------------------
// Workload generation

const TABLE_NAMES: &[&str] = &["t0", "t1", "t2", "t3", "tä"];
const MISSING_TABLES: &[&str] = &["nope", "T0", "t9"];
const COLUMN_NAMES: &[&str] = &["id", "a", "b", "c", "d", "e", "f", "g"];
const ADDED_NAMES: &[&str] = &["a", "b", "n0", "n1", "n2", "n3", "n4", "n5", "n6"];
const INDEX_NAMES: &[&str] = &["ix0", "ix1", "ix2", "ix_inline"];
const TYPES: &[ColumnType] = &[
    ColumnType::Integer,
    ColumnType::Real,
    ColumnType::Boolean,
    ColumnType::Text,
    ColumnType::Blob,
    ColumnType::Json,
    ColumnType::Timestamp,
];
const CHARS: &[&str] = &["a", "b", "z", "0", " ", "é", "日", "😀", "\"", "\\"];

fn gen_text(rng: &mut Rng, max_chars: usize) -> String {
    (0..rng.below(max_chars + 1))
        .map(|_| *rng.pick(CHARS))
        .collect()
}

fn gen_json_doc(rng: &mut Rng, depth: usize) -> Json {
    match rng.below(if depth == 0 { 4 } else { 7 }) {
        0 => Json::from(rng.range(-5, 500)),
        1 => Json::from(gen_text(rng, 4)),
        2 => Json::Bool(rng.percent(50)),
        3 => Json::from(*rng.pick(&[0.5, -1.25, 1e-7])),
        4 => Json::Null,
        5 => Json::Array(
            (0..rng.below(3))
                .map(|_| gen_json_doc(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(3) {
                m.insert(
                    rng.pick(&["k", "a", "b"]).to_string(),
                    gen_json_doc(rng, depth - 1),
                );
            }
            Json::Object(m)
        }
    }
}

/// A non-null JSON value that fits a column of type `ty`.
fn gen_valid(rng: &mut Rng, ty: ColumnType) -> Json {
    match ty {
        ColumnType::Integer => match rng.below(10) {
            0 => Json::from(*rng.pick(&[0, 1, -1, i64::MAX, i64::MIN])),
            _ => Json::from(rng.range(-1000, 1000)),
        },
        ColumnType::Timestamp => {
            Json::from(1_700_000_000_000_000 + rng.range(-1_000_000, 1_000_000))
        }
        ColumnType::Real => match rng.below(10) {
            0 => Json::from(rng.range(-9, 9)),
            1..=3 => Json::from(*rng.pick(&[0.0, -0.0, 1e300, -2.5e-300, f64::MAX, 0.1])),
            _ => Json::from(rng.range(-4000, 4000) as f64 / 8.0),
        },
        ColumnType::Boolean => Json::Bool(rng.percent(50)),
        ColumnType::Text => Json::from(gen_text(rng, 10)),
        ColumnType::Blob => {
            let bytes: Vec<u8> = (0..rng.below(9)).map(|_| rng.below(256) as u8).collect();
            Json::from(B64.encode(bytes))
        }
        ColumnType::Json => loop {
            let doc = gen_json_doc(rng, 2);
            if !doc.is_null() {
                break doc;
            }
        },
    }
}

/// A JSON value that does not fit a column of type `ty` (none exists for JSON columns).
fn gen_wrong(rng: &mut Rng, ty: ColumnType) -> Option<Json> {
    let options = match ty {
        ColumnType::Integer | ColumnType::Timestamp => {
            vec![
                json!("12"),
                json!(1.5),
                json!(true),
                json!(u64::MAX),
                json!([1]),
            ]
        }
        ColumnType::Real => vec![json!("1.5"), json!(true), json!({"a": 1}), json!([])],
        ColumnType::Boolean => vec![json!(1), json!("true"), json!(0.0)],
        ColumnType::Text => vec![json!(5), json!(true), json!(["x"]), json!({"a": "b"})],
        ColumnType::Blob => vec![
            json!(5),
            json!("!!not base64!!"),
            json!("abc"),
            json!(false),
        ],
        ColumnType::Json => return None,
    };
    Some(rng.pick(&options).clone())
}

fn gen_key_json(rng: &mut Rng, ty: ColumnType) -> Json {
    match ty {
        ColumnType::Integer => match rng.below(40) {
            0 => Json::from(*rng.pick(&[i64::MIN, i64::MAX])),
            _ => Json::from(rng.range(-3, 45)),
        },
        _ => match rng.below(25) {
            0 => Json::from(""),
            1 => Json::from(format!("ключ{}", rng.below(5))),
            _ => Json::from(format!("k{}", rng.below(45))),
        },
    }
}

fn valid_value(rng: &mut Rng, ty: ColumnType) -> Value {
    convert(ty, &gen_valid(rng, ty)).expect("valid").to_value()
}

fn wrong_value(ty: ColumnType) -> Value {
    match ty {
        ColumnType::Integer => Value::Text("1".into()),
        ColumnType::Timestamp => Value::Integer(5),
        ColumnType::Real | ColumnType::Boolean | ColumnType::Text | ColumnType::Json => {
            Value::Integer(1)
        }
        ColumnType::Blob => Value::Text("x".into()),
    }
}

fn existing_key(rng: &mut Rng, t: &MTable) -> Option<MKey> {
    if t.rows.is_empty() {
        return None;
    }
    t.rows.keys().nth(rng.below(t.rows.len())).cloned()
}

fn fresh_key(rng: &mut Rng, t: &MTable) -> Json {
    let ty = t.columns[t.pk].ty;
    for _ in 0..20 {
        let j = gen_key_json(rng, ty);
        let key = convert(ty, &j)
            .as_ref()
            .and_then(MKey::from_val)
            .expect("key");
        if !t.rows.contains_key(&key) {
            return j;
        }
    }
    gen_key_json(rng, ty)
}

fn gen_create_table(rng: &mut Rng) -> SchemaChange {
    let name = rng.pick(TABLE_NAMES).to_string();
    let n = if rng.percent(8) { 7 } else { 1 + rng.below(5) };
    let mut names = COLUMN_NAMES.to_vec();
    rng.shuffle(&mut names);
    let pk = rng.below(n);
    let mut columns: Vec<ColumnDef> = Vec::new();
    for (i, name) in names.iter().take(n).enumerate() {
        let column = if i == pk {
            let ty = if rng.percent(50) {
                ColumnType::Integer
            } else {
                ColumnType::Text
            };
            let default = rng.percent(5).then(|| {
                let j = gen_key_json(rng, ty);
                convert(ty, &j).expect("key").to_value()
            });
            ColumnDef {
                name: name.to_string(),
                ty,
                not_null: rng.percent(50),
                default,
            }
        } else {
            let ty = *rng.pick(TYPES);
            let not_null = rng.percent(30);
            let default = match rng.below(100) {
                0..=34 => Some(valid_value(rng, ty)),
                35..=39 => Some(Value::Null),
                _ => None,
            };
            ColumnDef {
                name: name.to_string(),
                ty,
                not_null,
                default,
            }
        };
        columns.push(column);
    }
    let mut indexes = Vec::new();
    if rng.percent(15) {
        let cols = (0..1 + rng.below(2)).map(|_| rng.below(n)).collect();
        indexes.push(IndexDef {
            name: "ix_inline".into(),
            columns: cols,
        });
    }
    if rng.percent(6) {
        // A schema the engine must refuse.
        match rng.below(4) {
            0 if n >= 2 => columns[1].name = columns[0].name.clone(),
            1 => {
                columns.clear();
                indexes.clear();
            }
            2 => {
                columns[pk].ty = *rng.pick(&[
                    ColumnType::Real,
                    ColumnType::Boolean,
                    ColumnType::Blob,
                    ColumnType::Timestamp,
                ])
            }
            _ => {
                let i = rng.below(n);
                columns[i].default = Some(wrong_value(columns[i].ty));
            }
        }
    }
    SchemaChange::CreateTable {
        schema: TableSchema {
            name,
            columns,
            pk,
            indexes,
        },
        if_not_exists: rng.percent(30),
    }
}

fn gen_schema_change(rng: &mut Rng, tables: &Tables) -> SchemaChange {
    let existing: Vec<&String> = tables.keys().collect();
    let r = rng.below(100);
    if existing.is_empty() || r < 30 {
        return gen_create_table(rng);
    }
    let table = if rng.percent(95) {
        rng.pick(&existing).to_string()
    } else {
        rng.pick(MISSING_TABLES).to_string()
    };
    let t = tables.get(&table);
    if r < 55 {
        let mut columns: Vec<String> = match t {
            Some(t) => (0..1 + rng.below(3))
                .map(|_| rng.pick(&t.columns).name.clone())
                .collect(),
            None => vec!["a".into()],
        };
        if rng.percent(5) {
            if rng.percent(50) {
                columns.clear();
            } else {
                columns.push("zz".into());
            }
        }
        SchemaChange::CreateIndex {
            table,
            name: rng.pick(INDEX_NAMES).to_string(),
            columns,
            if_not_exists: rng.percent(30),
        }
    } else if r < 88 {
        let ty = *rng.pick(TYPES);
        let not_null = rng.percent(30);
        let mut default = match (not_null, rng.below(100)) {
            (true, 0..=69) | (false, 0..=49) => Some(valid_value(rng, ty)),
            (true, 70..=84) | (false, 50..=59) => Some(Value::Null),
            _ => None,
        };
        if rng.percent(3) {
            default = Some(wrong_value(ty));
        }
        SchemaChange::AddColumn {
            table,
            column: ColumnDef {
                name: rng.pick(ADDED_NAMES).to_string(),
                ty,
                not_null,
                default,
            },
        }
    } else {
        SchemaChange::DropTable {
            name: table,
            if_exists: rng.percent(50),
        }
    }
}

/// A change that fails against `tables` (used to end a batch that must roll back).
fn gen_failing_change(rng: &mut Rng, tables: &Tables) -> SchemaChange {
    let existing: Vec<&String> = tables.keys().collect();
    let table = existing
        .get(rng.below(existing.len().max(1)))
        .map(|s| s.to_string());
    match (rng.below(4), table) {
        (0, Some(name)) => SchemaChange::CreateTable {
            schema: TableSchema {
                name,
                columns: vec![ColumnDef {
                    name: "id".into(),
                    ty: ColumnType::Integer,
                    not_null: true,
                    default: None,
                }],
                pk: 0,
                indexes: vec![],
            },
            if_not_exists: false,
        },
        (1, Some(table)) => SchemaChange::AddColumn {
            table,
            column: ColumnDef {
                name: "nn_fail".into(),
                ty: ColumnType::Integer,
                not_null: true,
                default: None,
            },
        },
        (2, Some(table)) => SchemaChange::CreateIndex {
            table,
            name: "ix_fail".into(),
            columns: vec!["zz".into()],
            if_not_exists: rng.percent(50),
        },
        _ => SchemaChange::DropTable {
            name: "nope".into(),
            if_exists: false,
        },
    }
}

fn gen_schema_batch(rng: &mut Rng, tables: &Tables, limits: &Limits) -> Vec<SchemaChange> {
    let n = if rng.percent(70) { 1 } else { 2 + rng.below(2) };
    let mut scratch = tables.clone();
    let mut batch = Vec::new();
    for _ in 0..n {
        let change = gen_schema_change(rng, &scratch);
        let _ = model_schema_change(&mut scratch, &change, limits);
        batch.push(change);
    }
    if n > 1 && rng.percent(35) {
        batch.push(gen_failing_change(rng, &scratch));
    }
    batch
}

/// One write op against the state `tables` (the transaction's own view); `bad` asks for a
/// deliberate defect.
fn gen_op(rng: &mut Rng, tables: &Tables, bad: bool) -> OpSpec {
    let mut kind = match rng.below(100) {
        0..=34 => OpKind::Insert,
        35..=59 => OpKind::Upsert,
        60..=84 => OpKind::Patch,
        _ => OpKind::Delete,
    };
    let mut op = OpSpec {
        kind,
        table: String::new(),
        fields: Map::new(),
        id: Json::Null,
        if_version: None,
    };
    let names: Vec<&String> = tables.keys().collect();
    if names.is_empty() || (bad && rng.percent(12)) {
        op.table = rng.pick(MISSING_TABLES).to_string();
        op.fields.insert("id".into(), json!(1));
        op.id = json!(1);
        return op;
    }
    let name = rng.pick(&names).to_string();
    let t = &tables[&name];
    if matches!(kind, OpKind::Patch | OpKind::Delete) && t.rows.is_empty() && !bad {
        kind = OpKind::Insert;
    }
    op.kind = kind;
    op.table = name;
    let pk = &t.columns[t.pk];
    match kind {
        OpKind::Insert | OpKind::Upsert => {
            let key_json = match existing_key(rng, t) {
                Some(k) if kind == OpKind::Upsert && rng.percent(50) => k.to_json(),
                _ => fresh_key(rng, t),
            };
            for (i, c) in t.columns.iter().enumerate() {
                if i == t.pk {
                    if c.default.is_none() || rng.percent(95) {
                        op.fields.insert(c.name.clone(), key_json.clone());
                    }
                } else if c.required() || rng.percent(60) {
                    let v = if !c.not_null && rng.percent(10) {
                        Json::Null
                    } else {
                        gen_valid(rng, c.ty)
                    };
                    op.fields.insert(c.name.clone(), v);
                }
            }
            if rng.percent(25) {
                let key = convert(pk.ty, &key_json).as_ref().and_then(MKey::from_val);
                op.if_version = Some(key.map_or(0, |k| t.version_of(&k)));
            }
        }
        OpKind::Patch | OpKind::Delete => {
            let key = existing_key(rng, t);
            op.id = match &key {
                Some(k) => k.to_json(),
                None => fresh_key(rng, t),
            };
            if kind == OpKind::Patch && !rng.percent(5) {
                let others: Vec<usize> = (0..t.columns.len()).filter(|&i| i != t.pk).collect();
                for _ in 0..1 + rng.below(3) {
                    if let Some(&i) = others.get(rng.below(others.len().max(1))) {
                        let c = &t.columns[i];
                        let v = if !c.not_null && rng.percent(10) {
                            Json::Null
                        } else {
                            gen_valid(rng, c.ty)
                        };
                        op.fields.insert(c.name.clone(), v);
                    }
                }
                if rng.percent(10) {
                    op.fields.insert(pk.name.clone(), op.id.clone());
                }
            }
            if rng.percent(30) {
                op.if_version = Some(key.map_or(0, |k| t.version_of(&k)));
            }
        }
    }
    if bad {
        add_defect(rng, t, &mut op);
    }
    op
}

fn add_defect(rng: &mut Rng, t: &MTable, op: &mut OpSpec) {
    let pk = &t.columns[t.pk];
    let current_key = || {
        let j = if matches!(op.kind, OpKind::Insert | OpKind::Upsert) {
            op.fields.get(&pk.name).cloned().unwrap_or(Json::Null)
        } else {
            op.id.clone()
        };
        convert(pk.ty, &j).as_ref().and_then(MKey::from_val)
    };
    let wrong_version = |rng: &mut Rng, key: Option<MKey>| {
        let v = key.map_or(0, |k| t.version_of(&k));
        if v > 0 && rng.percent(30) {
            0
        } else {
            v + 1 + rng.below(3) as u64
        }
    };
    let typed: Vec<usize> = (0..t.columns.len())
        .filter(|&i| t.columns[i].ty != ColumnType::Json)
        .collect();
    let not_null: Vec<usize> = (0..t.columns.len())
        .filter(|&i| t.columns[i].not_null && i != t.pk)
        .collect();
    let texts: Vec<usize> = (0..t.columns.len())
        .filter(|&i| t.columns[i].ty == ColumnType::Text && i != t.pk)
        .collect();
    match op.kind {
        OpKind::Insert | OpKind::Upsert => match rng.below(7) {
            0 => {
                op.fields.insert("zz_unknown".into(), json!(1));
            }
            1 if !typed.is_empty() => {
                let c = &t.columns[*rng.pick(&typed)];
                op.fields
                    .insert(c.name.clone(), gen_wrong(rng, c.ty).expect("typed"));
            }
            2 => {
                if pk.default.is_some() {
                    op.fields.insert(pk.name.clone(), Json::Null);
                } else {
                    op.fields.remove(&pk.name);
                }
            }
            3 if !not_null.is_empty() => {
                let c = &t.columns[*rng.pick(&not_null)];
                op.fields.insert(c.name.clone(), Json::Null);
            }
            4 if op.kind == OpKind::Insert && !t.rows.is_empty() => {
                let k = existing_key(rng, t).expect("rows");
                op.fields.insert(pk.name.clone(), k.to_json());
            }
            5 if !texts.is_empty() => {
                let c = &t.columns[*rng.pick(&texts)];
                op.fields
                    .insert(c.name.clone(), Json::from("x".repeat(300)));
            }
            _ => op.if_version = Some(wrong_version(rng, current_key())),
        },
        OpKind::Patch => match rng.below(7) {
            0 => {
                op.fields.insert("zz_unknown".into(), json!(1));
            }
            1 if !typed.is_empty() => {
                let c = &t.columns[*rng.pick(&typed)];
                op.fields
                    .insert(c.name.clone(), gen_wrong(rng, c.ty).expect("typed"));
            }
            2 => {
                op.id = fresh_key(rng, t);
                op.if_version = None;
            }
            3 => {
                let other = fresh_key(rng, t);
                op.fields.insert(pk.name.clone(), other);
            }
            4 => op.id = gen_wrong(rng, pk.ty).unwrap_or(Json::Null),
            5 if !not_null.is_empty() => {
                let c = &t.columns[*rng.pick(&not_null)];
                op.fields.insert(c.name.clone(), Json::Null);
            }
            _ => op.if_version = Some(wrong_version(rng, current_key())),
        },
        OpKind::Delete => match rng.below(3) {
            0 => {
                op.id = fresh_key(rng, t);
                op.if_version = None;
            }
            1 => {
                op.id = if rng.percent(50) {
                    Json::Null
                } else {
                    gen_wrong(rng, pk.ty).unwrap_or(Json::Null)
                }
            }
            _ => op.if_version = Some(wrong_version(rng, current_key())),
        },
    }
}

// ---------------------------------------------------------------------------------------
// The harness: engine + model + data directory

/// Records a failed completion; the oracle never expects one.
struct FlagWaiter {
    durability: Durability,
    failed: Arc<AtomicBool>,
}

impl Waiter for FlagWaiter {
    fn durability(&self) -> Durability {
        self.durability
    }
    fn complete(self, result: Result<(), &LogError>) {
        if result.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
    }
}

#[derive(Clone, Debug)]
struct FrameAt {
    seq: u64,
    path: PathBuf,
    start: usize,
    end: usize,
}

enum Sink {
    /// Commits go through the group-commit writer, as the server sends them.
    Log {
        log: Option<Log<FlagWaiter>>,
        segment_bytes_max: u64,
        pending: Vec<u8>,
        pending_frames: u64,
        failed: Arc<AtomicBool>,
    },
    /// Commits are appended to segment files directly, remembering where each frame is.
    Files {
        current: PathBuf,
        roll_next: bool,
        roll_percent: usize,
        frames: Vec<FrameAt>,
    },
}

fn open_log(dir: &Path, segment_bytes_max: u64, last_seq: u64) -> Log<FlagWaiter> {
    let mut config = LogConfig::new(dir);
    config.segment_bytes_max = segment_bytes_max;
    Log::open(config, last_seq, |_| {}).expect("open the log")
}

#[derive(Debug, Default)]
struct Stats {
    commits: usize,
    empty_txs: usize,
    aborted_txs: usize,
    refused_txs: usize,
    ops_ok: usize,
    op_errors: BTreeMap<&'static str, usize>,
    ddl_applied: usize,
    ddl_multi_applied: usize,
    ddl_noops: usize,
    ddl_refused: BTreeMap<&'static str, usize>,
    ddl_multi_refused: usize,
    snapshots: usize,
    checkpoints: usize,
    restarts: usize,
    switched_to_recovered: usize,
    segments_retired: usize,
    max_rows: usize,
    topic: TopicStats,
}

struct Harness {
    rng: Rng,
    db: Db,
    model: Model,
    limits: Limits,
    retention: Retention,
    dir: PathBuf,
    sink: Sink,
    /// Seqs of the snapshot files in `dir`, oldest first.
    snapshots: Vec<u64>,
    auto_snapshots: bool,
    /// Retire log segments covered by the oldest snapshot and the changelog horizon.
    retire: bool,
    /// The live changelog holds rebuilt (not replayed) row entries up to this seq, after
    /// the workload switched to a recovered `Db`.
    live_rebuilt_upto: u64,
    /// `history[seq]`: the model as of that seq (when recorded).
    history: Option<Vec<Model>>,
    /// `frame_bytes[seq]`: the size of that commit's frame in the log.
    frame_bytes: Vec<u64>,
    stats: Stats,
    /// The workload's clock (µs since the epoch) for appends and age retention; it runs
    /// ahead of the real one and never goes back.
    clock: i64,
}

impl Harness {
    fn new(seed: u64, name: &str, direct_files: bool) -> Harness {
        let mut rng = Rng::new(seed);
        let limits = if rng.percent(50) {
            Limits {
                row_bytes_max: 160,
                columns_per_table_max: 6,
                topics_max: 3,
                record_bytes_max: 120,
                topic_retain_records: 25,
                topic_retain_bytes: 4000,
                ..Limits::default()
            }
        } else {
            Limits::default()
        };
        // Retention by count only, so the window's exact length can be checked.
        let retention = Retention {
            commits_max: *rng.pick(&[100_000, 37, 500]),
            bytes_max: 1 << 40,
        };
        let dir = std::env::temp_dir().join(format!(
            "sluice-oracle-{name}-{}-{seed}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the data directory");
        let retire = !direct_files && rng.percent(50);
        let sink = if direct_files {
            Sink::Files {
                current: segment_path(&dir, 1),
                roll_next: false,
                roll_percent: 2,
                frames: Vec::new(),
            }
        } else {
            let segment_bytes_max = 256 + rng.below(8192) as u64;
            Sink::Log {
                log: Some(open_log(&dir, segment_bytes_max, 0)),
                segment_bytes_max,
                pending: Vec::new(),
                pending_frames: 0,
                failed: Arc::new(AtomicBool::new(false)),
            }
        };
        Harness {
            rng,
            db: Db::new(limits.clone(), Changelog::new(retention)),
            model: Model::default(),
            limits,
            retention,
            dir,
            sink,
            snapshots: Vec::new(),
            auto_snapshots: true,
            retire,
            live_rebuilt_upto: 0,
            history: None,
            frame_bytes: vec![0],
            stats: Stats::default(),
            clock: 1_700_000_000_000_000,
        }
    }

    fn random_step(&mut self) {
        let r = self.rng.below(100);
        if r < 14 || (self.model.tables.is_empty() && r < 60) {
            self.schema_step();
        } else if r < 15 && self.auto_snapshots {
            self.snapshot();
        } else if r < 21 || (self.model.topics.is_empty() && r < 30) {
            self.topic_step();
        } else {
            self.tx_step();
        }
        self.check("after the step");
    }

    fn check(&mut self, what: &str) {
        assert_matches(&self.db, &self.model, what);
        let cl = &self.db.changelog;
        assert_eq!(
            cl.horizon() + cl.len() as u64,
            self.db.seq,
            "{what}: the changelog window must end at db.seq"
        );
        let retained = self.db.seq.min(self.retention.commits_max as u64);
        assert_eq!(
            cl.len() as u64,
            retained,
            "{what}: the changelog keeps the last commits_max commits"
        );
        if !cl.is_empty() {
            let last = cl.since(self.db.seq - 1).expect("retained").last();
            assert_eq!(
                last.map(|c| c.seq),
                Some(self.db.seq),
                "{what}: last changelog entry"
            );
        }
        let rows = self.model.tables.values().map(|t| t.rows.len()).sum();
        self.stats.max_rows = self.stats.max_rows.max(rows);
    }

    fn schema_step(&mut self) {
        let changes = gen_schema_batch(&mut self.rng, &self.model.tables, &self.limits);
        let sql = format!(
            "-- DDL batch of {} change(s) at seq {}",
            changes.len(),
            self.model.seq
        );
        let want = model_schema_batch(&self.model.tables, &changes, &self.limits);
        let seq_before = self.db.seq;
        let got = self.db.apply_schema(changes.clone(), sql.clone());
        match (want, got) {
            (Ok((tables, applied)), Ok(commit)) => {
                let Some(commit) = commit else {
                    assert!(applied.is_empty(), "DDL {changes:?}: the engine applied nothing; the model applied {applied:?}");
                    assert_eq!(self.db.seq, seq_before, "a no-op DDL batch must not consume a seq");
                    self.stats.ddl_noops += 1;
                    return;
                };
                assert!(!applied.is_empty(), "DDL {changes:?}: a commit for a batch of no-ops");
                assert_eq!(commit.seq, self.model.seq + 1, "DDL commit seq");
                match &commit.body {
                    CommitBody::Schema { changes: logged, sql: text } => {
                        assert_eq!(logged, &applied, "DDL {changes:?}: the changes the commit records");
                        assert_eq!(text, &sql);
                    }
                    CommitBody::Rows(_) | CommitBody::Topic(_) => panic!("DDL produced a rows or topic commit"),
                }
                self.stats.ddl_applied += 1;
                if changes.len() > 1 {
                    self.stats.ddl_multi_applied += 1;
                }
                self.model.tables = tables;
                self.model.seq = commit.seq;
                self.log_commit(&commit);
            }
            (Err((i, codes)), Err(err)) => {
                assert_eq!(err.op, Some(i), "DDL {changes:?}: refused with {err}; the model says change {i} fails");
                assert!(
                    codes.contains(err.code.as_str()),
                    "DDL {changes:?}: refused with {err}; the model expected one of {codes:?}"
                );
                assert_eq!(self.db.seq, seq_before, "a refused DDL batch must not consume a seq");
                *self.stats.ddl_refused.entry(err.code.as_str()).or_default() += 1;
                if changes.len() > 1 {
                    self.stats.ddl_multi_refused += 1;
                }
            }
            (Ok((_, applied)), Err(err)) => {
                panic!("DDL {changes:?}: the engine refused ({err}); the model applied {applied:?}")
            }
            (Err((i, codes)), Ok(commit)) => panic!(
                "DDL {changes:?}: the engine accepted ({commit:?}); the model expected change {i} to fail with one of {codes:?}"
            ),
        }
    }

    fn tx_step(&mut self) {
        let n = match self.rng.below(100) {
            0..=2 => 0,
            3..=40 => 1,
            41..=70 => 2,
            71..=88 => 3,
            _ => 4 + self.rng.below(3),
        };
        let bad_at = (n > 0 && self.rng.percent(30)).then(|| self.rng.below(n));
        let abort = self.rng.percent(5);
        let next_seq = self.model.seq + 1;
        let mut scratch = self.model.tables.clone();
        let mut expected = Vec::new();
        let mut refused = false;
        let mut scratch_topics = self.model.topics.clone();
        let mut appended: Vec<(String, MRecord)> = Vec::new();
        self.clock += self.rng.range(0, 400_000);
        let clock = self.clock;
        let mut tx = self.db.transaction();
        assert_eq!(tx.seq(), next_seq, "a transaction's seq is db.seq + 1");
        for i in 0..n {
            if self.rng.percent(30) {
                // A topic append in the same transaction as the row writes.
                let op = gen_append(
                    &mut self.rng,
                    &scratch_topics,
                    &self.limits,
                    clock,
                    bad_at == Some(i),
                );
                let want = model_append(&mut scratch_topics, &op, next_seq, &self.limits);
                let got = tx.append(&op.topic, op.tags.clone(), &op.data, op.ts_us);
                match (want, got) {
                    (Ok(record), Ok(offset)) => {
                        assert_eq!(offset, record.offset, "append {i} {op:?}: offset");
                        appended.push((op.topic.clone(), record));
                        self.stats.topic.appends_ok += 1;
                    }
                    (Err(codes), Err(err)) => {
                        assert!(
                            codes.contains(err.code.as_str()),
                            "append {i} {op:?}: the engine refused with {err}; the model expected one of {codes:?}"
                        );
                        *self.stats.topic.append_errors.entry(err.code.as_str()).or_default() += 1;
                        refused = true;
                        break;
                    }
                    (Ok(record), Err(err)) => panic!(
                        "append {i} {op:?}: the engine refused ({err}); the model expected {record:?}"
                    ),
                    (Err(codes), Ok(offset)) => panic!(
                        "append {i} {op:?}: the engine accepted (offset {offset}); the model expected a refusal with one of {codes:?}"
                    ),
                }
                continue;
            }
            let op = gen_op(&mut self.rng, &scratch, bad_at == Some(i));
            let want = model_op(&mut scratch, &op, next_seq, &self.limits);
            let got = run_op(&mut tx, &op);
            match (want, got) {
                (Ok(change), Ok(result)) => {
                    assert_eq!(result.table.name, op.table, "op {i} {op:?}: result table");
                    assert_eq!(MKey::of(&result.key), change.key, "op {i} {op:?}: result key");
                    assert_eq!(result.version, change.version, "op {i} {op:?}: result version");
                    expected.push(change);
                    self.stats.ops_ok += 1;
                }
                (Err(codes), Err(err)) => {
                    assert!(
                        codes.contains(err.code.as_str()),
                        "op {i} {op:?}: the engine refused with {err}; the model expected one of {codes:?}"
                    );
                    *self.stats.op_errors.entry(err.code.as_str()).or_default() += 1;
                    refused = true;
                    break;
                }
                (Ok(change), Err(err)) => panic!(
                    "op {i} {op:?}: the engine refused ({err}); the model expected {change:?}"
                ),
                (Err(codes), Ok(result)) => panic!(
                    "op {i} {op:?}: the engine accepted ({result:?}); the model expected a refusal with one of {codes:?}"
                ),
            }
            if self.rng.percent(25) {
                spot_check(&tx, &scratch, &mut self.rng);
            }
        }
        if refused || abort {
            drop(tx);
            if refused {
                self.stats.refused_txs += 1;
            } else {
                self.stats.aborted_txs += 1;
            }
            return;
        }
        let Some(commit) = tx.commit() else {
            assert!(
                expected.is_empty() && appended.is_empty(),
                "a transaction with writes committed nothing"
            );
            self.stats.empty_txs += 1;
            return;
        };
        assert!(
            !expected.is_empty() || !appended.is_empty(),
            "a transaction without writes consumed seq {}",
            commit.seq
        );
        assert_eq!(
            appends_of(&commit),
            appended,
            "the records of commit {next_seq}"
        );
        if !appended.is_empty() {
            self.stats.topic.commits_with_appends += 1;
            if !expected.is_empty() {
                self.stats.topic.commits_with_rows_and_appends += 1;
            }
        }
        let touched: BTreeSet<&str> = appended.iter().map(|(t, _)| t.as_str()).collect();
        for name in touched {
            let t = scratch_topics.get_mut(name).expect("appended topics exist");
            let newest = t.records.back().map(|r| r.ts_us);
            self.stats.topic.trimmed += t.trim(newest);
        }
        assert_eq!(commit.seq, next_seq, "commit seq");
        let CommitBody::Rows(changes) = &commit.body else {
            panic!("a transaction produced a DDL commit");
        };
        let got: Vec<ExpChange> = changes.iter().map(ExpChange::of).collect();
        assert_eq!(got, expected, "the changes of commit {next_seq}");
        self.stats.commits += 1;
        self.model.tables = scratch;
        self.model.topics = scratch_topics;
        self.model.seq = next_seq;
        self.log_commit(&commit);
    }

    /// Creates, changes or drops a topic (or tries to, with a bad name or config).
    fn topic_step(&mut self) {
        let seq_before = self.db.seq;
        let (what, want, got) = if self.rng.percent(25) {
            let name = pick_topic_name(&mut self.rng, &self.model.topics);
            let mut topics = self.model.topics.clone();
            let want = match topics.remove(&name) {
                Some(_) => Ok(Some(TopicChange::Drop { name: name.clone() })),
                None => Err(codes(&["not_found"])),
            };
            let got = self.db.drop_topic(&name).map(Some);
            (
                format!("drop topic {name:?}"),
                want.map(|c| (c, topics)),
                got,
            )
        } else {
            let name = if self.rng.percent(8) {
                self.rng.pick(BAD_TOPIC_NAMES).to_string()
            } else {
                pick_topic_name(&mut self.rng, &self.model.topics)
            };
            let config = gen_topic_config(&mut self.rng, &self.limits);
            let mut topics = self.model.topics.clone();
            let want = model_put_topic(&mut topics, &name, config, &self.limits);
            let got = self.db.put_topic(&name, config);
            (
                format!("put topic {name:?} {config:?}"),
                want.map(|c| (c, topics)),
                got,
            )
        };
        match (want, got) {
            (Ok((None, _)), Ok(None)) => {
                assert_eq!(self.db.seq, seq_before, "{what}: a no-op consumed a seq");
                self.stats.topic.ddl_noops += 1;
            }
            (Ok((Some(change), topics)), Ok(Some(commit))) => {
                assert_eq!(commit.seq, self.model.seq + 1, "{what}: commit seq");
                match &commit.body {
                    CommitBody::Topic(logged) => assert_eq!(logged, &change, "{what}"),
                    other => panic!("{what}: committed {other:?}"),
                }
                assert!(commit.appends.is_empty(), "{what}: appends in topic DDL");
                self.stats.topic.ddl_applied += 1;
                self.model.topics = topics;
                self.model.seq = commit.seq;
                self.log_commit(&commit);
            }
            (Err(codes), Err(err)) => {
                assert!(
                    codes.contains(err.code.as_str()),
                    "{what}: refused with {err}; the model expected one of {codes:?}"
                );
                assert_eq!(self.db.seq, seq_before, "{what}: a refusal consumed a seq");
                *self
                    .stats
                    .topic
                    .ddl_refused
                    .entry(err.code.as_str())
                    .or_default() += 1;
            }
            (want, got) => panic!("{what}: the model says {want:?}, the engine {got:?}"),
        }
    }

    /// The age check the server's writer runs: drops records older than `retain_secs`
    /// as of the workload's clock, on the engine and in the model alike.
    fn trim_topics_by_age(&mut self) {
        let now = self.clock;
        let before: u64 = self.db.topics.values().map(|t| t.len() as u64).sum();
        // Each topic that drops records is one logged `Trim` commit (the clock does not
        // replay, the log does).
        let commits = self.db.expire_topics(now);
        let dropped = before - self.db.topics.values().map(|t| t.len() as u64).sum::<u64>();
        let mut want = 0;
        let mut trimmed_topics = 0;
        for t in self.model.topics.values_mut() {
            if t.config.retain_secs > 0 {
                let n = t.trim(Some(now));
                want += n;
                trimmed_topics += u64::from(n > 0);
            }
        }
        assert_eq!(dropped, want, "records dropped by the age check at {now}");
        assert_eq!(
            commits.len() as u64,
            trimmed_topics,
            "one trim commit per topic that dropped records"
        );
        for c in &commits {
            self.model.seq += 1;
            assert_eq!(c.seq, self.model.seq, "trim commits take the next seqs");
            self.log_commit(c);
        }
        self.stats.topic.trimmed += want;
    }

    fn log_commit(&mut self, commit: &Commit) {
        let mut payload = Vec::new();
        codec::encode_commit(commit, &mut payload);
        let (seq, _) = codec::decode_commit(&payload)
            .unwrap_or_else(|e| panic!("commit {} does not decode: {e}", commit.seq));
        assert_eq!(seq, commit.seq, "decoded seq");
        let mut framed = Vec::new();
        frame::encode_into(&mut framed, &payload).expect("a commit fits in a frame");
        match &mut self.sink {
            Sink::Log {
                pending,
                pending_frames,
                ..
            } => {
                pending.extend_from_slice(&framed);
                *pending_frames += 1;
                if self.rng.percent(60) {
                    let durability = *self.rng.pick(&[Durability::Memory, Durability::Disk]);
                    self.flush_log(durability);
                }
            }
            Sink::Files {
                current,
                roll_next,
                roll_percent,
                frames,
            } => {
                if *roll_next || self.rng.percent(*roll_percent) {
                    *current = segment_path(&self.dir, commit.seq);
                    *roll_next = false;
                }
                let start = fs::metadata(&*current).map_or(0, |m| m.len() as usize);
                append(current, &framed);
                frames.push(FrameAt {
                    seq: commit.seq,
                    path: current.clone(),
                    start,
                    end: start + framed.len(),
                });
            }
        }
        assert_eq!(
            self.frame_bytes.len() as u64,
            commit.seq,
            "frame sizes are dense"
        );
        self.frame_bytes.push(framed.len() as u64);
        if let Some(history) = &mut self.history {
            assert_eq!(history.len() as u64, commit.seq, "history is dense");
            history.push(self.model.clone());
        }
    }

    fn flush_log(&mut self, durability: Durability) {
        let seq = self.model.seq;
        if let Sink::Log {
            log: Some(log),
            pending,
            pending_frames,
            failed,
            ..
        } = &mut self.sink
        {
            if *pending_frames > 0 {
                let waiter = FlagWaiter {
                    durability,
                    failed: failed.clone(),
                };
                log.submit(pending, *pending_frames, seq, [waiter])
                    .expect("submit to the log");
                pending.clear();
                *pending_frames = 0;
            }
        }
    }

    /// Everything committed so far is on disk.
    fn sync_log(&mut self) {
        self.flush_log(Durability::Disk);
        let seq = self.model.seq;
        if let Sink::Log {
            log: Some(log),
            failed,
            ..
        } = &self.sink
        {
            if seq > 0 {
                log.sync_barrier(seq).expect("sync barrier");
            }
            assert!(
                log.poisoned().is_none(),
                "the log is poisoned: {:?}",
                log.poisoned()
            );
            assert!(
                !failed.load(Ordering::SeqCst),
                "a log waiter completed with an error"
            );
        }
    }

    fn force_roll(&mut self) {
        if let Sink::Files {
            roll_next,
            roll_percent,
            ..
        } = &mut self.sink
        {
            *roll_next = true;
            *roll_percent = 0;
        }
    }

    fn frames(&self) -> Vec<FrameAt> {
        match &self.sink {
            Sink::Files { frames, .. } => frames.clone(),
            Sink::Log { .. } => Vec::new(),
        }
    }

    fn snapshot(&mut self) {
        let frames = codec::encode_snapshot(&self.db);
        write_snapshot(&self.dir, self.db.seq, &frames).expect("write a snapshot");
        if self.snapshots.last() != Some(&self.db.seq) {
            self.snapshots.push(self.db.seq);
        }
        while self.snapshots.len() > 3 {
            let old = self.snapshots.remove(0);
            fs::remove_file(snapshot_path(&self.dir, old)).expect("remove an old snapshot");
        }
        self.stats.snapshots += 1;
        if self.rng.percent(50) {
            self.retire_segments();
        }
    }

    /// Removes the segments that hold only seqs covered by the oldest snapshot kept and no
    /// longer in the changelog window (what the server's snapshotter does).
    fn retire_segments(&mut self) {
        let (true, Some(&oldest), Sink::Log { log: Some(log), .. }) =
            (self.retire, self.snapshots.first(), &self.sink)
        else {
            return;
        };
        let keep_from = oldest.min(self.db.changelog.horizon()) + 1;
        let removed = log
            .retire_segments_before(keep_from)
            .expect("retire segments");
        self.stats.segments_retired += removed;
    }

    /// Bytes of the frames of commits `after + 1 ..= upto`.
    fn log_bytes(&self, after: u64, upto: u64) -> u64 {
        self.frame_bytes[after as usize + 1..=upto as usize]
            .iter()
            .sum()
    }

    /// The seq the oldest segment on disk starts at.
    fn log_start(&self) -> u64 {
        let segments = list_segments(&self.dir).expect("list segments");
        segments.first().map_or(self.model.seq + 1, |s| s.first_seq)
    }

    fn scratch_dir(&self, tag: &str) -> PathBuf {
        let mut name = self.dir.file_name().expect("name").to_os_string();
        name.push(format!("-{tag}"));
        self.dir.with_file_name(name)
    }

    fn recovery_options(&mut self) -> RecoveryOptions {
        // Limits bind new requests, not history: any limits must recover the same state.
        let limits = match self.rng.below(3) {
            0 => self.limits.clone(),
            1 => Limits::default(),
            _ => Limits {
                row_bytes_max: 64,
                columns_per_table_max: 2,
                ..Limits::default()
            },
        };
        RecoveryOptions {
            limits,
            retention: self.retention,
            repair: true,
            keep_zero_tail: false,
        }
    }

    fn recover_dir(&mut self, dir: &Path, what: &str) -> Recovered {
        let opts = self.recovery_options();
        let rec = recover(dir, &opts)
            .unwrap_or_else(|e| panic!("{what}: recovery of {} failed: {e}", dir.display()));
        // Age trims are logged commits: recovery alone restores them.
        rec
    }

    /// A recovered state must equal the live one: rows, indexes, seq and changelog window.
    fn verify_recovered(&self, rec: &Recovered, snapshot: Option<u64>, log_start: u64, what: &str) {
        assert_eq!(
            rec.snapshot_seq, snapshot,
            "{what}: the snapshot recovery started from"
        );
        assert!(
            rec.torn_tail.is_none(),
            "{what}: unexpected torn tail {:?}",
            rec.torn_tail
        );
        assert_eq!(
            rec.replayed,
            self.model.seq - snapshot.unwrap_or(0),
            "{what}: commits replayed"
        );
        assert_eq!(
            rec.replayed_bytes,
            self.log_bytes(snapshot.unwrap_or(0), self.model.seq),
            "{what}: log bytes replayed"
        );
        assert_eq!(
            rec.frames_read,
            self.model.seq + 1 - log_start,
            "{what}: frames read"
        );
        assert_matches(&rec.db, &self.model, what);
        let full_after = snapshot.unwrap_or(0).max(self.live_rebuilt_upto);
        compare_changelogs(&self.db, &rec.db, full_after, what);
    }

    /// Recovery starting from `snapshot` must equal the live state — or, when the log no
    /// longer reaches back to the snapshot, must refuse rather than skip the gap.
    fn recover_expecting(
        &mut self,
        dir: &Path,
        snapshot: Option<u64>,
        log_start: u64,
        what: &str,
    ) -> Option<Recovered> {
        if log_start > snapshot.unwrap_or(0) + 1 {
            let opts = self.recovery_options();
            match recover(dir, &opts) {
                Ok(rec) => panic!(
                    "{what}: the log starts at seq {log_start}, after the state at {snapshot:?}, \
                     yet recovery produced seq {} instead of refusing",
                    rec.db.seq
                ),
                Err(e) => assert!(
                    e.to_string().contains("missing"),
                    "{what}: refused with {e}"
                ),
            }
            return None;
        }
        let rec = self.recover_dir(dir, what);
        self.verify_recovered(&rec, snapshot, log_start, what);
        Some(rec)
    }

    /// Recovers the data directory three ways and compares each with the live state; a
    /// restart also shuts the log down first and reopens it after.
    fn checkpoint(&mut self, restart: bool) {
        self.trim_topics_by_age();
        self.check("after the age check");
        self.sync_log();
        self.retire_segments();
        self.stats.checkpoints += 1;
        let newest = self.snapshots.last().copied();
        let log_start = self.log_start();

        // (a) The newest snapshot plus the log after it.
        if restart {
            if let Sink::Log { log, .. } = &mut self.sink {
                log.take()
                    .expect("log open")
                    .shutdown()
                    .expect("clean log shutdown");
            }
        }
        let a_dir = if restart {
            self.dir.clone()
        } else {
            copy_dir(&self.dir, &self.scratch_dir("a"), |_| true)
        };
        let rec = self.recover_dir(&a_dir, "(a) recovery from the newest snapshot");
        assert!(
            rec.skipped_snapshots.is_empty(),
            "(a) skipped {:?}",
            rec.skipped_snapshots
        );
        self.verify_recovered(
            &rec,
            newest,
            log_start,
            "(a) recovery from the newest snapshot",
        );
        if !restart {
            fs::remove_dir_all(&a_dir).expect("remove scratch");
        }

        // (b) The log alone, from seq 1 (refused if segments were retired).
        let b_dir = copy_dir(&self.dir, &self.scratch_dir("b"), |n| n.ends_with(".log"));
        self.recover_expecting(&b_dir, None, log_start, "(b) recovery from the log alone");
        fs::remove_dir_all(&b_dir).expect("remove scratch");

        // (c) A damaged newest snapshot is passed over for the one before it.
        if let Some(newest) = newest {
            let c_dir = copy_dir(&self.dir, &self.scratch_dir("c"), |_| true);
            flip_random_bit(&mut self.rng, &snapshot_path(&c_dir, newest), 0);
            let fallback = self.snapshots.iter().rev().nth(1).copied();
            let what = "(c) recovery past a damaged snapshot";
            if let Some(rec_c) = self.recover_expecting(&c_dir, fallback, log_start, what) {
                assert_eq!(
                    rec_c.skipped_snapshots.len(),
                    1,
                    "{what}: the damaged snapshot must be reported: {:?}",
                    rec_c.skipped_snapshots
                );
            }
            fs::remove_dir_all(&c_dir).expect("remove scratch");
        }

        if restart {
            self.stats.restarts += 1;
            if self.rng.percent(50) {
                // Carry on with the recovered state as the live one.
                let mut db = rec.db;
                db.limits = self.limits.clone();
                self.live_rebuilt_upto = self.live_rebuilt_upto.max(newest.unwrap_or(0));
                self.db = db;
                self.stats.switched_to_recovered += 1;
                self.check("after switching to the recovered state");
            }
            if let Sink::Log {
                log,
                segment_bytes_max,
                ..
            } = &mut self.sink
            {
                *log = Some(open_log(&self.dir, *segment_bytes_max, self.model.seq));
            }
        }
    }

    fn cleanup(self) {
        let dir = self.dir.clone();
        drop(self);
        fs::remove_dir_all(&dir).expect("remove the data directory");
    }
}

/// Reads the row under `key` inside the transaction; it must be what the model holds.
fn spot_check(tx: &Tx<'_>, scratch: &Tables, rng: &mut Rng) {
    let names: Vec<&String> = scratch.keys().collect();
    if names.is_empty() {
        return;
    }
    let name = *rng.pick(&names);
    let t = &scratch[name];
    let key = match existing_key(rng, t) {
        Some(k) if rng.percent(70) => k,
        _ => {
            let ty = t.columns[t.pk].ty;
            convert(ty, &gen_key_json(rng, ty))
                .as_ref()
                .and_then(MKey::from_val)
                .expect("key")
        }
    };
    let got = tx
        .get(name, &key.to_key())
        .expect("the table exists")
        .map(|r| MRow {
            values: r.values.iter().map(MVal::of).collect(),
            version: r.version,
        });
    assert_eq!(
        got.as_ref(),
        t.rows.get(&key),
        "read inside the transaction: {name:?} {key:?}"
    );
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open segment");
    file.write_all(bytes).expect("append to segment");
}

fn copy_dir(src: &Path, dst: &Path, keep: impl Fn(&str) -> bool) -> PathBuf {
    let _ = fs::remove_dir_all(dst);
    fs::create_dir_all(dst).expect("create scratch dir");
    for entry in fs::read_dir(src).expect("read dir") {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().to_string();
        if entry.file_type().expect("file type").is_file() && keep(&name) {
            fs::copy(entry.path(), dst.join(&name)).expect("copy file");
        }
    }
    dst.to_path_buf()
}

/// Flips one bit at or after byte `from` of `path`; returns its offset.
fn flip_random_bit(rng: &mut Rng, path: &Path, from: usize) -> usize {
    let mut bytes = fs::read(path).expect("read file");
    let at = from + rng.below(bytes.len() - from);
    bytes[at] ^= 1 << rng.below(8);
    fs::write(path, &bytes).expect("write file");
    at
}

// ---------------------------------------------------------------------------------------
// The oracle

fn oracle_run(seed: u64, step: &Cell<usize>) {
    let steps = steps();
    let mut h = Harness::new(seed, "oracle", false);
    let every = (steps / 6).max(50);
    for i in 0..steps {
        step.set(i);
        h.random_step();
        if i % every == every - 1 {
            let restart = h.stats.checkpoints % 2 == 1;
            h.checkpoint(restart);
        }
    }
    step.set(steps);
    h.checkpoint(true);
    eprintln!(
        "model_oracle seed={seed} limits={:?} retention={:?}: {:#?}",
        h.limits, h.retention, h.stats
    );
    if steps >= 1500 {
        // The workload must really exercise what it claims to.
        let s = &h.stats;
        assert!(s.commits > steps / 5, "too few commits: {s:#?}");
        for code in ["already_exists", "not_found", "conflict", "schema"] {
            assert!(
                s.op_errors.get(code).is_some_and(|&n| n > 0),
                "no op failed with {code}: {s:#?}"
            );
        }
        assert!(
            s.aborted_txs > 0 && s.refused_txs > 0 && s.empty_txs > 0,
            "{s:#?}"
        );
        assert!(
            s.ddl_applied > 0 && s.ddl_noops > 0 && s.ddl_multi_applied > 0,
            "{s:#?}"
        );
        assert!(
            s.ddl_multi_refused > 0 && s.ddl_refused.len() >= 3,
            "{s:#?}"
        );
        assert!(s.snapshots > 0 && s.restarts >= 2, "{s:#?}");
        assert!(s.max_rows >= 20, "{s:#?}");
        let t = &s.topic;
        assert!(
            t.appends_ok > steps / 10 && t.commits_with_rows_and_appends > 0,
            "{s:#?}"
        );
        for code in ["not_found", "bad_request", "limit"] {
            assert!(
                t.append_errors.get(code).is_some_and(|&n| n > 0),
                "no append failed with {code}: {s:#?}"
            );
        }
        assert!(
            t.ddl_applied > 0 && t.ddl_noops > 0 && t.ddl_refused.len() >= 2 && t.trimmed > 0,
            "{s:#?}"
        );
    }
    h.cleanup();
}

#[test]
fn random_workloads_match_the_model_and_recover_equal() {
    run_seeds(
        "random_workloads_match_the_model_and_recover_equal",
        &[1, 2, 3, 0x5EED_CAFE],
        oracle_run,
    );
}

// ---------------------------------------------------------------------------------------
// Torn tails and damage

fn torn_run(seed: u64, step: &Cell<usize>) {
    let mut h = Harness::new(seed, "torn", true);
    h.auto_snapshots = false;
    h.history = Some(vec![Model::default()]);
    let first_phase = (steps() / 10).max(100);
    for i in 0..first_phase {
        step.set(i);
        h.random_step();
    }
    let base = h.model.seq;
    assert!(base > 0, "the first phase committed nothing");
    h.snapshot();
    h.force_roll();
    let mut i = first_phase;
    while h.model.seq < base + 30 {
        i += 1;
        step.set(i);
        assert!(i < first_phase + 1000, "the second phase does not commit");
        h.random_step();
    }
    let newest = segment_path(&h.dir, base + 1);
    let frames: Vec<FrameAt> = h
        .frames()
        .into_iter()
        .filter(|f| f.path == newest)
        .collect();
    assert_eq!(frames.first().map(|f| f.seq), Some(base + 1));
    let bytes = fs::read(&newest).expect("read the newest segment");
    assert_eq!(frames.last().map(|f| f.end), Some(bytes.len()));
    let history = h.history.clone().expect("history");

    let mut cuts: Vec<usize> = vec![0, bytes.len()];
    cuts.extend(frames.iter().map(|f| f.end));
    cuts.extend(frames.iter().map(|f| f.start + 1 + h.rng.below(16)));
    cuts.extend((0..40).map(|_| h.rng.below(bytes.len() + 1)));
    let scratch = h.scratch_dir("cut");
    for (n, &cut) in cuts.iter().enumerate() {
        step.set(i + 1 + n);
        let whole: Vec<&FrameAt> = frames.iter().filter(|f| f.end <= cut).collect();
        let at_boundary = whole.last().map_or(0, |f| f.end) == cut;
        let cut_frame = frames.iter().find(|f| f.start < cut && cut < f.end);
        let mut data = bytes[..cut].to_vec();
        let (mut expect_seq, mut valid_len) = whole.last().map_or((base, 0), |f| (f.seq, f.end));
        let variant = match h.rng.below(3) {
            // The file goes on in zeros (its size reached the disk, the data did not),
            // maybe past the end the cut frame declares. Left out: a cut inside the length
            // fields (see `a_zero_filled_frame_header_is_a_torn_tail`), and a cut at a zero
            // byte, where the zeros may complete the frame as it was.
            1 if at_boundary
                || cut_frame.is_some_and(|f| cut >= f.start + 8 && bytes[cut] != 0) =>
            {
                let past = cut_frame.map_or(0, |f| f.end - cut);
                let zeros = 1 + h.rng.below(64) + if h.rng.percent(50) { past } else { 0 };
                data.extend(std::iter::repeat_n(0u8, zeros));
                "zero-filled tail"
            }
            2 if at_boundary && !whole.is_empty() => {
                // The last whole frame fails its checksum: it is the torn one.
                let last = whole.last().expect("a whole frame");
                let at = last.start + 8 + h.rng.below(last.end - last.start - 8);
                data[at] ^= 1 << h.rng.below(8);
                expect_seq = last.seq - 1;
                valid_len = last.start;
                "bad checksum in the last frame"
            }
            _ => "plain cut",
        };
        let torn = data.len() != valid_len;
        let what = format!("cut {cut} of {} ({variant})", bytes.len());
        copy_dir(&h.dir, &scratch, |_| true);
        let with_snapshot = n % 2 == 0;
        if !with_snapshot {
            fs::remove_file(snapshot_path(&scratch, base)).expect("remove snapshot");
        }
        let seg = segment_path(&scratch, base + 1);
        fs::write(&seg, &data).expect("write the cut segment");
        let opts = RecoveryOptions {
            limits: h.limits.clone(),
            retention: h.retention,
            repair: true,
            keep_zero_tail: false,
        };
        let rec =
            recover(&scratch, &opts).unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
        assert_eq!(
            rec.torn_tail.is_some(),
            torn,
            "{what}: torn tail reported: {:?}",
            rec.torn_tail
        );
        let len = fs::metadata(&seg).expect("segment").len() as usize;
        assert_eq!(len, valid_len, "{what}: the repaired segment length");
        let replayed_from = if with_snapshot { base } else { 0 };
        assert_eq!(
            rec.replayed_bytes,
            h.log_bytes(replayed_from, expect_seq),
            "{what}: log bytes replayed"
        );
        assert_eq!(
            rec.snapshot_seq,
            with_snapshot.then_some(base),
            "{what}: snapshot used"
        );
        assert_matches(&rec.db, &history[expect_seq as usize], &what);
        let window: Vec<u64> = rec
            .db
            .changelog
            .since(rec.db.changelog.horizon())
            .expect("window")
            .map(|c| c.seq)
            .collect();
        let first = expect_seq.saturating_sub(h.retention.commits_max as u64) + 1;
        assert_eq!(
            window,
            (first..=expect_seq).collect::<Vec<_>>(),
            "{what}: changelog window"
        );

        let again = recover(&scratch, &opts)
            .unwrap_or_else(|e| panic!("{what}: second recovery failed: {e}"));
        assert!(
            again.torn_tail.is_none(),
            "{what}: the repair did not stick"
        );
        assert_matches(
            &again.db,
            &history[expect_seq as usize],
            &format!("{what}, recovered again"),
        );
    }
    fs::remove_dir_all(&scratch).expect("remove scratch");
    h.cleanup();
}

#[test]
fn recovery_after_torn_tail_keeps_whole_commits() {
    run_seeds(
        "recovery_after_torn_tail_keeps_whole_commits",
        &[11, 12],
        torn_run,
    );
}

fn assert_corrupt_at(err: &RecoveryError, path: &Path, offset: usize, what: &str) {
    match err {
        RecoveryError::Log(LogError::Corrupt {
            path: p, offset: o, ..
        })
        | RecoveryError::Corrupt {
            path: p, offset: o, ..
        } => {
            assert_eq!(p, path, "{what}: the file named in {err}");
            assert_eq!(*o as usize, offset, "{what}: the offset named in {err}");
        }
        other => panic!(
            "{what}: expected corruption at {}:{offset}, got {other}",
            path.display()
        ),
    }
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains(&offset.to_string()),
        "{what}: the message must name the file and offset: {text}"
    );
}

fn damage_run(seed: u64, step: &Cell<usize>) {
    let mut h = Harness::new(seed, "damage", true);
    h.auto_snapshots = false;
    let mut i = 0;
    while h.model.seq < 20 {
        i += 1;
        step.set(i);
        assert!(i < 2000, "the workload does not commit");
        h.random_step();
    }
    h.force_roll();
    let base = h.model.seq;
    while h.model.seq < base + 20 {
        i += 1;
        step.set(i);
        assert!(i < 4000, "the workload does not commit");
        h.random_step();
    }
    let newest = segment_path(&h.dir, base + 1);
    let frames = h.frames();
    let (older, last): (Vec<FrameAt>, Vec<FrameAt>) =
        frames.into_iter().partition(|f| f.path != newest);
    let opts = RecoveryOptions {
        limits: Limits::default(),
        retention: Retention::default(),
        repair: true,
        keep_zero_tail: false,
    };
    let scratch = h.scratch_dir("damage");
    let in_scratch = |p: &Path| scratch.join(p.file_name().expect("file name"));

    for round in 0..12 {
        copy_dir(&h.dir, &scratch, |_| true);
        let (what, path, offset) = match round % 4 {
            0 => {
                // A flipped bit in a frame before the last of the newest segment.
                let f = &last[h.rng.below(last.len() - 1)];
                let path = in_scratch(&f.path);
                let mut bytes = fs::read(&path).expect("read");
                let at = f.start + h.rng.below(f.end - f.start);
                bytes[at] ^= 1 << h.rng.below(8);
                fs::write(&path, &bytes).expect("write");
                ("a flipped bit before the tail", path, f.start)
            }
            1 => {
                // An older segment cut short: only the newest may have a torn tail.
                let f = &older[h.rng.below(older.len())];
                let path = in_scratch(&f.path);
                let cut = f.start + 1 + h.rng.below(f.end - f.start - 1);
                let bytes = fs::read(&path).expect("read");
                fs::write(&path, &bytes[..cut]).expect("write");
                ("an older segment cut short", path, f.start)
            }
            2 => {
                // A whole, checksummed frame that is not a commit.
                let f = &last[h.rng.below(last.len() - 1)];
                let path = in_scratch(&f.path);
                let bytes = fs::read(&path).expect("read");
                let mut out = bytes[..f.start].to_vec();
                frame::encode_into(&mut out, b"not a commit").expect("frame");
                out.extend_from_slice(&bytes[f.end..]);
                fs::write(&path, &out).expect("write");
                ("a frame that does not decode", path, f.start)
            }
            _ => {
                // A whole frame missing from the middle: the seqs jump.
                let f = &last[1 + h.rng.below(last.len() - 2)];
                let path = in_scratch(&f.path);
                let bytes = fs::read(&path).expect("read");
                let mut out = bytes[..f.start].to_vec();
                out.extend_from_slice(&bytes[f.end..]);
                fs::write(&path, &out).expect("write");
                ("a missing frame", path, f.start)
            }
        };
        let before = fs::read(&path).expect("read");
        let err = match recover(&scratch, &opts) {
            Ok(rec) => panic!(
                "{what}: recovery accepted a damaged log (seq {})",
                rec.db.seq
            ),
            Err(e) => e,
        };
        assert_corrupt_at(&err, &path, offset, what);
        assert_eq!(
            fs::read(&path).expect("read"),
            before,
            "{what}: a refused recovery changed the file"
        );
    }
    fs::remove_dir_all(&scratch).expect("remove scratch");
    h.cleanup();
}

#[test]
fn damage_before_the_tail_is_refused_naming_file_and_offset() {
    run_seeds(
        "damage_before_the_tail_is_refused_naming_file_and_offset",
        &[21],
        damage_run,
    );
}

// ---------------------------------------------------------------------------------------
// Focused behaviours

fn new_db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

fn col(name: &str, ty: ColumnType, not_null: bool, default: Option<Value>) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null,
        default,
    }
}

fn obj(v: Json) -> Map<String, Json> {
    match v {
        Json::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn create_index(table: &str, name: &str, columns: &[&str]) -> SchemaChange {
    SchemaChange::CreateIndex {
        table: table.into(),
        name: name.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        if_not_exists: false,
    }
}

/// `player(id INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT 'anon', score INTEGER)` with
/// two indexes and players 1..=5.
fn player_db() -> Db {
    let mut db = new_db();
    let schema = TableSchema {
        name: "player".into(),
        columns: vec![
            col("id", ColumnType::Integer, true, None),
            col(
                "name",
                ColumnType::Text,
                true,
                Some(Value::Text("anon".into())),
            ),
            col("score", ColumnType::Integer, false, None),
        ],
        pk: 0,
        indexes: vec![],
    };
    let ddl = vec![
        SchemaChange::CreateTable {
            schema,
            if_not_exists: false,
        },
        create_index("player", "by_score", &["score"]),
        create_index("player", "by_name_score", &["name", "score"]),
    ];
    db.apply_schema(ddl, "CREATE TABLE player ...; CREATE INDEX ...".into())
        .expect("DDL")
        .expect("a commit");
    let mut tx = db.transaction();
    for i in 1..=5 {
        let row = obj(json!({"id": i, "name": format!("p{i}"), "score": i * 10}));
        tx.insert("player", &row, None).expect("insert");
    }
    tx.commit().expect("commit");
    db
}

type FailingOp = fn(&mut Tx<'_>) -> Result<WriteResult, TxError>;

#[test]
fn a_failed_transaction_changes_nothing() {
    let mut db = player_db();
    let before = model_of(&db);
    let changelog_len = db.changelog.len();
    let cases: Vec<(&str, FailingOp, &[ErrorCode])> = vec![
        (
            "duplicate insert",
            |tx| tx.insert("player", &obj(json!({"id": 4})), None),
            &[ErrorCode::AlreadyExists],
        ),
        (
            "patch of a missing row",
            |tx| tx.patch("player", &json!(99), &obj(json!({"score": 1})), None),
            &[ErrorCode::NotFound],
        ),
        (
            "delete of a missing row",
            |tx| tx.delete("player", &json!(99), None),
            &[ErrorCode::NotFound],
        ),
        (
            "stale if_version",
            |tx| tx.patch("player", &json!(4), &obj(json!({"score": 1})), Some(7)),
            &[ErrorCode::Conflict],
        ),
        (
            "wrong type",
            |tx| tx.insert("player", &obj(json!({"id": 8, "score": "high"})), None),
            &[ErrorCode::Schema],
        ),
        (
            "unknown column",
            |tx| tx.insert("player", &obj(json!({"id": 8, "level": 3})), None),
            &[ErrorCode::Schema],
        ),
        (
            "missing primary key",
            |tx| tx.insert("player", &obj(json!({"name": "x"})), None),
            &[ErrorCode::Schema],
        ),
        (
            "NOT NULL violated",
            |tx| tx.patch("player", &json!(4), &obj(json!({"name": null})), None),
            &[ErrorCode::Schema],
        ),
        (
            "primary key changed by a patch",
            |tx| tx.patch("player", &json!(4), &obj(json!({"id": 40})), None),
            &[ErrorCode::BadRequest],
        ),
        (
            "primary key named by a patch with its current value",
            |tx| {
                tx.patch(
                    "player",
                    &json!(4),
                    &obj(json!({"id": 4, "score": 1})),
                    None,
                )
            },
            &[ErrorCode::BadRequest],
        ),
        (
            "unknown table",
            |tx| tx.insert("nope", &obj(json!({"id": 1})), None),
            &[ErrorCode::NotFound],
        ),
    ];
    for (what, failing, allowed) in cases {
        let mut tx = db.transaction();
        // Successful writes first: both index keys of row 1 change, row 2 loses its score,
        // row 3 goes, row 6 comes and is written twice.
        tx.upsert(
            "player",
            &obj(json!({"id": 1, "name": "zed", "score": 999})),
            None,
        )
        .expect("upsert");
        let (loaded, seq) = (tx.seq() - 1, tx.seq());
        tx.patch(
            "player",
            &json!(2),
            &obj(json!({"score": null})),
            Some(loaded),
        )
        .expect("patch");
        tx.delete("player", &json!(3), None).expect("delete");
        tx.insert("player", &obj(json!({"id": 6, "score": 60})), None)
            .expect("insert");
        tx.upsert("player", &obj(json!({"id": 6, "name": "six"})), Some(seq))
            .expect("upsert again");
        let err = failing(&mut tx).expect_err(what);
        assert!(
            allowed.contains(&err.code),
            "{what}: refused with {err}, expected {allowed:?}"
        );
        drop(tx);
        assert_matches(&db, &before, what);
        assert_eq!(
            db.changelog.len(),
            changelog_len,
            "{what}: the changelog grew"
        );
    }

    // Dropping a transaction whose ops all succeeded rolls it back too.
    let mut tx = db.transaction();
    tx.delete("player", &json!(1), None).expect("delete");
    tx.insert("player", &obj(json!({"id": 1, "score": -1})), None)
        .expect("reinsert");
    drop(tx);
    assert_matches(&db, &before, "a dropped transaction");

    // The next commit takes the very next seq: refused transactions left no gap.
    let mut tx = db.transaction();
    tx.insert("player", &obj(json!({"id": 7})), None)
        .expect("insert");
    let commit = tx.commit().expect("a commit");
    assert_eq!(commit.seq, before.seq + 1);
    check_indexes(&db, "after the commit");
}

#[test]
fn a_failed_schema_batch_changes_nothing() {
    let mut db = player_db();
    let before = model_of(&db);
    let other = TableSchema {
        name: "player".into(),
        columns: vec![col("key", ColumnType::Text, true, None)],
        pk: 0,
        indexes: vec![],
    };
    let batch = vec![
        SchemaChange::AddColumn {
            table: "player".into(),
            column: col("level", ColumnType::Integer, true, Some(Value::Integer(1))),
        },
        create_index("player", "by_level", &["level", "name"]),
        SchemaChange::DropTable {
            name: "player".into(),
            if_exists: false,
        },
        SchemaChange::CreateTable {
            schema: other,
            if_not_exists: false,
        },
        // NOT NULL without a DEFAULT cannot be added to a table: the whole batch fails.
        SchemaChange::AddColumn {
            table: "player".into(),
            column: col("rank", ColumnType::Integer, true, None),
        },
    ];
    let err = db
        .apply_schema(batch, "ALTER ...; DROP ...; CREATE ...".into())
        .expect_err("must fail");
    assert_eq!((err.code, err.op), (ErrorCode::Schema, Some(4)), "{err}");
    assert_matches(&db, &before, "after a refused batch");

    for default in [None, Some(Value::Null)] {
        let change = SchemaChange::AddColumn {
            table: "player".into(),
            column: col("rank", ColumnType::Integer, true, default),
        };
        let err = db.apply_schema(
            vec![change],
            "ALTER TABLE player ADD COLUMN rank INTEGER NOT NULL".into(),
        );
        assert_eq!(
            err.expect_err("NOT NULL without a default").code,
            ErrorCode::Schema
        );
    }

    // A batch of no-ops consumes no seq.
    let noop = vec![
        SchemaChange::CreateIndex {
            table: "player".into(),
            name: "by_score".into(),
            columns: vec!["id".into()],
            if_not_exists: true,
        },
        SchemaChange::DropTable {
            name: "nope".into(),
            if_exists: true,
        },
    ];
    assert!(db
        .apply_schema(noop, "no-ops".into())
        .expect("no-ops are fine")
        .is_none());
    assert_matches(&db, &before, "after a batch of no-ops");
}

#[test]
fn a_write_takes_its_commit_seq_as_the_row_version() {
    let mut db = new_db();
    let schema = TableSchema {
        name: "doc".into(),
        columns: vec![
            col("id", ColumnType::Text, false, None),
            col("body", ColumnType::Text, false, None),
            col("n", ColumnType::Integer, true, Some(Value::Integer(0))),
        ],
        pk: 0,
        indexes: vec![],
    };
    let ddl = SchemaChange::CreateTable {
        schema,
        if_not_exists: false,
    };
    db.apply_schema(vec![ddl], "CREATE TABLE doc ...".into())
        .expect("DDL");
    let a = json!("a");
    let row = |db: &Db| db.tables["doc"].rows.get(&Key::Text("a".into())).cloned();

    let write = |db: &mut Db, f: &dyn Fn(&mut Tx<'_>) -> Result<WriteResult, TxError>| {
        let mut tx = db.transaction();
        let result = f(&mut tx);
        let commit = result.is_ok().then(|| tx.commit().expect("a commit"));
        (result, commit.map(|c| c.seq))
    };

    // `if_version: 0` means "must not exist yet". A write's version is its commit's seq.
    let (r, seq) = write(&mut db, &|tx| {
        tx.insert("doc", &obj(json!({"id": "a", "n": 5})), Some(0))
    });
    let s1 = seq.expect("seq");
    assert_eq!(r.expect("insert").version, s1);
    assert_eq!(row(&db).map(|r| r.version), Some(s1));

    let (r, seq) = write(&mut db, &|tx| {
        tx.patch("doc", &a, &obj(json!({"body": "x"})), None)
    });
    let s2 = seq.expect("seq");
    assert!(s2 > s1);
    assert_eq!(r.expect("patch").version, s2);
    assert_eq!(row(&db).map(|r| r.version), Some(s2));

    // An upsert replaces the whole row: `n` falls back to its default.
    let (r, seq) = write(&mut db, &|tx| {
        tx.upsert("doc", &obj(json!({"id": "a", "body": "y"})), Some(s2))
    });
    let s3 = seq.expect("seq");
    assert_eq!(r.expect("upsert").version, s3);
    let values: Vec<MVal> = row(&db).expect("row").values.iter().map(MVal::of).collect();
    assert_eq!(
        values,
        vec![MVal::Text("a".into()), MVal::Text("y".into()), MVal::Int(0)]
    );

    let (r, _) = write(&mut db, &|tx| {
        tx.patch("doc", &a, &obj(json!({"n": 1})), Some(s2))
    });
    assert_eq!(r.expect_err("stale").code, ErrorCode::Conflict);
    let (r, _) = write(&mut db, &|tx| {
        tx.upsert("doc", &obj(json!({"id": "a"})), Some(0))
    });
    assert_eq!(r.expect_err("exists").code, ErrorCode::Conflict);
    assert_eq!(
        row(&db).map(|r| r.version),
        Some(s3),
        "refused writes do not change the version"
    );

    // Two writes of one row in one transaction: both have the commit's seq.
    let mut tx = db.transaction();
    let s4 = tx.seq();
    tx.patch("doc", &a, &obj(json!({"n": 1})), Some(s3))
        .expect("patch");
    tx.patch("doc", &a, &obj(json!({"n": 2})), Some(s4))
        .expect("patch again");
    let commit = tx.commit().expect("commit");
    assert_eq!(commit.seq, s4);
    let CommitBody::Rows(changes) = &commit.body else {
        panic!("rows")
    };
    let versions: Vec<u64> = changes.iter().map(|c| c.version).collect();
    assert_eq!(versions, vec![s4, s4]);
    assert_eq!(row(&db).map(|r| r.version), Some(s4));

    // A delete reports the version it deleted.
    let mut tx = db.transaction();
    assert_eq!(tx.delete("doc", &a, Some(s4)).expect("delete").version, s4);
    let commit = tx.commit().expect("commit");
    let CommitBody::Rows(changes) = &commit.body else {
        panic!("rows")
    };
    assert_eq!(
        (changes[0].op, changes[0].version, changes[0].row.is_none()),
        (ChangeOp::Delete, s4, true)
    );
    assert!(row(&db).is_none());

    // Other rows have their own writes' seqs.
    let (r, seq) = write(&mut db, &|tx| {
        tx.insert("doc", &obj(json!({"id": "b"})), None)
    });
    assert_eq!(r.expect("insert").version, seq.expect("seq"));
    assert_eq!(
        db.seq, 7,
        "one seq per DDL batch and per committed transaction"
    );
}

#[test]
fn a_version_taken_before_a_delete_does_not_match_the_reinserted_row() {
    let mut db = player_db();
    let four = json!(4);
    let before = db.tables["player"].rows[&Key::Int(4)].version;
    let mut tx = db.transaction();
    tx.delete("player", &four, Some(before)).expect("delete");
    tx.commit().expect("commit");
    let mut tx = db.transaction();
    let again = tx
        .insert("player", &obj(json!({"id": 4, "name": "again"})), Some(0))
        .expect("re-insert")
        .version;
    tx.commit().expect("commit");
    assert_ne!(again, before, "a key's versions never repeat");
    // The client that read the old row still holds `before`: its compare-and-set fails.
    for (what, op) in [
        (
            "patch",
            Box::new(|tx: &mut Tx<'_>| {
                tx.patch("player", &json!(4), &obj(json!({"score": 1})), Some(before))
            }) as Box<dyn Fn(&mut Tx<'_>) -> Result<WriteResult, TxError>>,
        ),
        (
            "upsert",
            Box::new(|tx: &mut Tx<'_>| tx.upsert("player", &obj(json!({"id": 4})), Some(before))),
        ),
        (
            "delete",
            Box::new(|tx: &mut Tx<'_>| tx.delete("player", &json!(4), Some(before))),
        ),
    ] {
        let mut tx = db.transaction();
        let err = op(&mut tx).expect_err(what);
        assert_eq!(err.code, ErrorCode::Conflict, "{what}: {err}");
    }
    // Even when the delete and the re-insert are one transaction.
    let mut tx = db.transaction();
    tx.delete("player", &four, Some(again)).expect("delete");
    let third = tx
        .insert("player", &obj(json!({"id": 4})), None)
        .expect("re-insert")
        .version;
    tx.commit().expect("commit");
    assert!(third > again);
    let mut tx = db.transaction();
    let err = tx
        .patch("player", &four, &obj(json!({"score": 2})), Some(again))
        .expect_err("stale");
    assert_eq!(err.code, ErrorCode::Conflict);
}

// ---------------------------------------------------------------------------------------
// Zero fill after a torn last frame

/// Cuts the last frame of a fresh log `keep` bytes after its start, fills the file with
/// zeros to `extra` bytes past the frame's declared end, and recovers: the frame must be
/// cut as a torn tail and every commit before it kept.
fn zero_filled_tail(seed: u64, keep: impl Fn(&mut Rng, usize) -> usize) {
    let mut h = Harness::new(seed, "zerofill", true);
    h.auto_snapshots = false;
    h.history = Some(vec![Model::default()]);
    while h.model.seq < 10 {
        h.random_step();
    }
    let last = h.frames().pop().expect("frames");
    let mut data = fs::read(&last.path).expect("read");
    // Zeros from `kept` on must really change the frame.
    let kept = loop {
        let kept = keep(&mut h.rng, last.end - last.start);
        if data[last.start + kept..last.end].iter().any(|&b| b != 0) {
            break kept;
        }
    };
    data.truncate(last.start + kept);
    data.resize(last.end + 1 + h.rng.below(4096), 0);
    fs::write(&last.path, &data).expect("write");
    let opts = RecoveryOptions {
        limits: h.limits.clone(),
        retention: h.retention,
        repair: true,
        keep_zero_tail: false,
    };
    let what = format!("the last frame cut {kept} bytes in, then zeros");
    let rec = recover(&h.dir, &opts).unwrap_or_else(|e| panic!("{what}: recovery refused: {e}"));
    assert!(rec.torn_tail.is_some(), "{what}: no torn tail reported");
    let history = h.history.clone().expect("history");
    assert_matches(&rec.db, &history[last.seq as usize - 1], &what);
    assert_eq!(
        fs::metadata(&last.path).expect("segment").len() as usize,
        last.start
    );
    h.cleanup();
}

/// After a power loss a file's size can cover blocks whose data never reached the disk, so
/// the last frame can be written only in part and be followed by zeros past its declared
/// end. Nothing after the frame is data: it is a torn tail.
#[test]
fn a_partly_written_last_frame_followed_by_zeros_is_a_torn_tail() {
    zero_filled_tail(31, |rng, len| {
        frame::FRAME_HEADER_BYTES + rng.below(len - frame::FRAME_HEADER_BYTES)
    });
}

/// The same when the cut falls inside the frame header's length fields (a header across a
/// sector boundary): the length check fails, but only zeros follow, so no good frame can
/// be hiding behind the damaged length.
#[test]
fn a_zero_filled_frame_header_is_a_torn_tail() {
    zero_filled_tail(32, |rng, _| 1 + rng.below(7));
}
