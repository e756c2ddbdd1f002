//! Point reads: one row by primary key, or the rows holding one value of an indexed
//! column — the reads behind `GET /v1/tables/{t}/rows/{id}`, the WebSocket `get` request
//! and in-process callers (`sluice bench reads`).
//!
//! A point read never goes through the writer: it takes the `Db` read lock, finds the row
//! (a binary search of the row map) and clones its `Arc` of values (no copy of the row),
//! then lets go of the lock; replies are encoded from those typed values afterwards.
//!
//! *Confirmation without waiting.* Reads never show a commit before it reached its
//! durability class (ARCHITECTURE "Durability classes and confirmed reads"). A general read
//! waits until the confirmed seq reaches the seq of the whole state it saw. A row read by
//! key needs less: the row it found was last written at `row.version`, and no later commit
//! wrote that key (the row is the newest), so the row is also what the state at every seq
//! from `row.version` to the applied seq holds — in particular the confirmed state, if
//! `row.version` is already confirmed. Then the read answers at once with the confirmed
//! seq, with no waiting machinery at all; otherwise it waits until `row.version` is
//! confirmed. What the rows found cannot vouch for is looked up in the commits after the
//! confirmed seq (the changelog, at most `CHANGES_LOOKED_AT_MAX` changes): an absent key is
//! absent in the confirmed state too unless one of them touched it (a delete not yet
//! confirmed); a lookup through an index is exact unless one of them took a row away from
//! the value. Anything else waits for the whole state's seq, as before: a refusal, such a
//! commit, a schema or policy commit not yet confirmed, a row hidden by a client's policy,
//! and a client's read policy that reads other tables (membership subqueries).

use std::ops::Bound;
use std::sync::Arc;

use serde_json::Value as Json;
use sluice_engine::table::Table;
use sluice_engine::{ColumnType, Db, ErrorCode, Key, TableSchema, TxError, Value};

use crate::auth::Caller;
use crate::core::Core;
use crate::error::CoreError;

/// Rows examined at most per index lookup, however many a client's read policy skips (the
/// page then ends early with `next` set): bounds how long one lookup holds the read lock.
pub const INDEX_EXAMINED_ROWS_MAX: usize = 100_000;

/// A key, or an indexed value, as its caller has it: typed already (in-process), JSON (a
/// WebSocket request) or text (a URL), converted by its column's type under the read lock.
#[derive(Debug)]
pub enum Given<'a, T> {
    Typed(&'a T),
    Json(&'a Json),
    Text(&'a str),
}

impl<T> Clone for Given<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Given<'_, T> {}

/// The index a lookup goes through.
#[derive(Clone, Copy, Debug)]
pub enum IndexBy<'a> {
    /// The index of this name (`CREATE INDEX name …`); the value is for its first column.
    Name(&'a str),
    /// The first index whose first column is this one; the primary key column reads by key.
    Column(&'a str),
}

/// One stored row: its values, shared with the table (not copied), and its version.
#[derive(Clone, Debug)]
pub struct PointRow {
    pub values: Arc<[Value]>,
    /// The seq of the commit that last wrote the row.
    pub version: u64,
}

/// A row read by primary key.
#[derive(Clone, Debug)]
pub struct Got {
    /// The schema the row's values follow (columns in order).
    pub schema: Arc<TableSchema>,
    /// `None`: no such row, or one the caller may not read (the two look the same).
    pub row: Option<PointRow>,
    /// A confirmed seq whose state holds exactly this answer.
    pub seq: u64,
}

/// Rows read by primary key in one batch ([`Core::get_rows`]): one entry per key asked,
/// in the order asked.
#[derive(Clone, Debug)]
pub struct GotMany {
    pub schema: Arc<TableSchema>,
    /// `None`: no such row, or one the caller may not read (as for [`Got::row`]).
    pub rows: Vec<Option<PointRow>>,
    /// A confirmed seq whose state holds exactly every one of these answers.
    pub seq: u64,
}

/// Keys one batched read may name (`get_keys_max`): bounds how long one batch holds the
/// read lock (about 0.3 µs a key) and the size of its reply.
pub const GET_KEYS_MAX: usize = 1_000;

/// One page of the rows holding a value of an indexed column, in primary key order.
#[derive(Clone, Debug)]
pub struct Found {
    pub schema: Arc<TableSchema>,
    pub rows: Vec<PointRow>,
    /// More rows may match: ask again with `after` = this key.
    pub next: Option<Key>,
    pub seq: u64,
}

/// A lookup through an index: which one, the value of its first column, and the page.
#[derive(Clone, Copy, Debug)]
pub struct IndexLookup<'a> {
    pub by: IndexBy<'a>,
    pub value: Given<'a, Value>,
    /// Rows after this primary key (the previous page's `next`).
    pub after: Option<Given<'a, Key>>,
    /// At most this many rows; 1 ..= `page_rows_max` (`--max-page-rows`).
    pub limit: usize,
}

/// The outcome of a point read made under the read lock, with the seq it must wait for
/// before it may be shown (none when that seq was already confirmed).
#[must_use = "a read must be confirmed before it is shown"]
pub struct Unconfirmed<T> {
    outcome: Result<T, CoreError>,
    /// 0: confirmed already.
    wait_for: u64,
}

impl<T> Unconfirmed<T> {
    /// The outcome, if it may be shown now; else the read, to wait with
    /// [`Unconfirmed::confirmed`].
    #[allow(clippy::result_large_err)]
    pub fn now(self) -> Result<Result<T, CoreError>, Self> {
        if self.wait_for == 0 {
            Ok(self.outcome)
        } else {
            Err(self)
        }
    }

    /// The seq this read waits for, if any.
    pub fn waits_for(&self) -> Option<u64> {
        (self.wait_for > 0).then_some(self.wait_for)
    }

    /// The outcome once the state it was decided on is confirmed (a refusal too), or the
    /// log's failure if that comes first.
    pub async fn confirmed(self, core: &Core) -> Result<T, CoreError> {
        if self.wait_for > 0 {
            core.wait_confirmed(self.wait_for).await?;
        }
        self.outcome
    }
}

impl Core {
    /// The row of `table` with primary key `key`, as `caller` may see it: the lookup
    /// under the read lock, to be confirmed ([`Unconfirmed::now`] or
    /// [`Unconfirmed::confirmed`]). See the module doc for when it needs no waiting.
    pub fn get_row(&self, caller: &Caller, table: &str, key: Given<'_, Key>) -> Unconfirmed<Got> {
        let db = self.db();
        let confirmed = self.shared.confirm.confirmed();
        debug_assert!(
            confirmed <= db.seq,
            "nothing is confirmed before it is applied"
        );
        let (outcome, depends) = match get_locked(self, &db, caller, table, key, confirmed) {
            Ok((schema, row, depends)) => (Ok((schema, row)), depends),
            Err(e) => (Err(e), db.seq),
        };
        drop(db);
        let seq = depends.max(confirmed);
        Unconfirmed {
            outcome: outcome.map(|(schema, row)| Got { schema, row, seq }),
            wait_for: if depends > confirmed { depends } else { 0 },
        }
    }

    /// The rows of `table` under each of `keys`, as `caller` may see them, all read under
    /// one hold of the read lock, to be confirmed like [`Core::get_row`]. Each row depends
    /// on what a single get of it would depend on, and each answer holds from that seq up
    /// to the applied state, so the batch holds exactly at the largest of them: the batch
    /// waits for that one (none when every row is vouched for by the confirmed state).
    /// More than [`GET_KEYS_MAX`] keys, or any key a single get would refuse, refuses the
    /// whole batch (no partial answer).
    pub fn get_rows<'k>(
        &self,
        caller: &Caller,
        table: &str,
        keys: impl ExactSizeIterator<Item = Given<'k, Key>>,
    ) -> Unconfirmed<GotMany> {
        if keys.len() > GET_KEYS_MAX {
            return Unconfirmed {
                outcome: Err(CoreError::Limit(format!(
                    "a get of {} keys; get_keys_max is {GET_KEYS_MAX}",
                    keys.len()
                ))),
                wait_for: 0,
            };
        }
        let db = self.db();
        let confirmed = self.shared.confirm.confirmed();
        let mut rows = Vec::with_capacity(keys.len());
        let mut depends = confirmed;
        let mut schema = None;
        let mut outcome = Ok(());
        for key in keys {
            match get_locked(self, &db, caller, table, key, confirmed) {
                Ok((s, row, d)) => {
                    schema.get_or_insert(s);
                    depends = depends.max(d);
                    rows.push(row);
                }
                Err(e) => {
                    outcome = Err(e);
                    depends = db.seq;
                    break;
                }
            }
        }
        // No keys: the table must still exist (as a get of one key would find).
        let schema = match (outcome, schema) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(s)) => Ok(s),
            (Ok(()), None) => db.table(table).map(|t| t.schema.clone()).map_err(|e| {
                depends = db.seq;
                CoreError::from(e)
            }),
        };
        drop(db);
        let seq = depends.max(confirmed);
        Unconfirmed {
            outcome: schema.map(|schema| GotMany { schema, rows, seq }),
            wait_for: if depends > confirmed { depends } else { 0 },
        }
    }

    /// [`Core::get_row`], confirmed.
    pub async fn get(
        &self,
        caller: &Caller,
        table: &str,
        key: Given<'_, Key>,
    ) -> Result<Got, CoreError> {
        self.get_row(caller, table, key).confirmed(self).await
    }

    /// One page of the rows of `table` holding `lookup.value` in an indexed column, as
    /// `caller` may see them, under the read lock; confirmed like [`Core::get_row`] but
    /// always against the whole state's seq.
    pub fn find_rows(
        &self,
        caller: &Caller,
        table: &str,
        lookup: IndexLookup<'_>,
    ) -> Unconfirmed<Found> {
        let db = self.db();
        let confirmed = self.shared.confirm.confirmed();
        let (outcome, depends) = match find_locked(self, &db, caller, table, lookup, confirmed) {
            Ok((schema, rows, next, depends)) => (Ok((schema, rows, next)), depends),
            Err(e) => (Err(e), db.seq),
        };
        drop(db);
        let seq = depends.max(confirmed);
        Unconfirmed {
            outcome: outcome.map(|(schema, rows, next)| Found {
                schema,
                rows,
                next,
                seq,
            }),
            wait_for: if depends > confirmed { depends } else { 0 },
        }
    }

    /// [`Core::find_rows`], confirmed.
    pub async fn find(
        &self,
        caller: &Caller,
        table: &str,
        lookup: IndexLookup<'_>,
    ) -> Result<Found, CoreError> {
        self.find_rows(caller, table, lookup).confirmed(self).await
    }
}

type Locked = (Arc<TableSchema>, Option<PointRow>, u64);

/// The row under `key`, and the seq its answer depends on.
fn get_locked(
    core: &Core,
    db: &Db,
    caller: &Caller,
    table: &str,
    key: Given<'_, Key>,
    confirmed: u64,
) -> Result<Locked, CoreError> {
    let t = db.table(table)?;
    let schema = &t.schema;
    let pk = schema.pk_column();
    let converted;
    let key = match key {
        Given::Typed(k) => {
            if !key_fits(k, pk.ty) {
                return Err(wrong_key(table, pk.ty, key_kind(k)).into());
            }
            k
        }
        Given::Json(j) => {
            converted = key_from_json(table, pk.ty, j)?;
            &converted
        }
        Given::Text(text) => {
            converted = Key::parse(pk.ty, text).map_err(TxError::schema)?;
            &converted
        }
    };
    let Some(entry) = t.rows.get(key) else {
        // Absent now; absent in the confirmed state too unless a later commit touched the
        // key (a delete not yet confirmed, say).
        let depends = if changed_since(db, confirmed, table, |c| c.key == *key) {
            db.seq
        } else {
            confirmed
        };
        return Ok((schema.clone(), None, depends));
    };
    // What the answer depends on beyond this row: the table's schema and policies, and
    // for a client any table its read policy reads.
    let mut depends = entry.version;
    if db.schema_seq > confirmed {
        depends = db.seq;
    }
    if let Some(claims) = caller.claims() {
        let rules = core.rules(db, table)?;
        if rules.read.reads_tables() {
            depends = db.seq;
        }
        if !crate::rules::allows(&rules.read, db, &entry.values, &claims.all) {
            // Not readable reads as absent: a client learns nothing of rows it may not
            // see. "Absent" is then an answer about the whole state.
            return Ok((schema.clone(), None, db.seq));
        }
    }
    let row = PointRow {
        values: entry.values.clone(),
        version: entry.version,
    };
    Ok((schema.clone(), Some(row), depends))
}

/// A page of rows, its `next`, and the seq the answer depends on.
type Page = (Arc<TableSchema>, Vec<PointRow>, Option<Key>, u64);

fn find_locked(
    core: &Core,
    db: &Db,
    caller: &Caller,
    table: &str,
    lookup: IndexLookup<'_>,
    confirmed: u64,
) -> Result<Page, CoreError> {
    let t = db.table(table)?;
    let schema = &t.schema;
    let max = core.config().page_rows_max;
    if lookup.limit == 0 {
        return Err(TxError::new(ErrorCode::BadRequest, "\"limit\" must be at least 1").into());
    }
    if lookup.limit > max {
        return Err(CoreError::Limit(format!(
            "limit {} exceeds page_rows_max (--max-page-rows) of {max}",
            lookup.limit
        )));
    }
    // The index, or the primary key column.
    let index = match lookup.by {
        IndexBy::Name(name) => Some(
            schema
                .indexes
                .iter()
                .position(|i| i.name == name)
                .ok_or_else(|| {
                    TxError::new(
                        ErrorCode::NotFound,
                        format!(
                            "table {table:?} has no index named {name:?} (its indexes: {})",
                            index_names(schema)
                        ),
                    )
                })?,
        ),
        IndexBy::Column(column) => {
            let c = schema.column(column).ok_or_else(|| {
                TxError::schema(format!("table {table:?} has no column {column:?}"))
            })?;
            if c == schema.pk {
                None
            } else {
                Some(
                    schema
                        .indexes
                        .iter()
                        .position(|i| i.columns[0] == c)
                        .ok_or_else(|| {
                            TxError::new(
                                ErrorCode::BadRequest,
                                format!(
                                    "no index of table {table:?} starts with column {column:?}, so it cannot be looked up by value (CREATE INDEX … ON {table} ({column}); its indexes: {})",
                                    index_names(schema)
                                ),
                            )
                        })?,
                )
            }
        }
    };
    let column = index.map_or(schema.pk, |i| schema.indexes[i].columns[0]);
    let ty = schema.columns[column].ty;
    let value = match lookup.value {
        Given::Typed(v) => {
            if !v.fits(ty) {
                return Err(TxError::schema(format!(
                    "value for column {:?} of table {table:?} must be {ty}",
                    schema.columns[column].name
                ))
                .into());
            }
            v.clone()
        }
        Given::Json(j) => Value::from_json(ty, j).map_err(|e| {
            TxError::schema(format!(
                "value for column {:?} of table {table:?}: {e}",
                schema.columns[column].name
            ))
        })?,
        Given::Text(text) => value_from_text(ty, text).map_err(|e| {
            TxError::schema(format!(
                "value for column {:?} of table {table:?}: {e}",
                schema.columns[column].name
            ))
        })?,
    };
    if value.is_null() {
        return Err(TxError::new(
            ErrorCode::BadRequest,
            "\"value\" must not be null: NULL equals nothing (query `IS NULL` instead)",
        )
        .into());
    }
    let pk = schema.pk_column().ty;
    let after = match lookup.after {
        None => None,
        Some(Given::Typed(k)) => {
            if !key_fits(k, pk) {
                return Err(wrong_key(table, pk, key_kind(k)).into());
            }
            Some(k.clone())
        }
        Some(Given::Json(j)) => Some(key_from_json(table, pk, j)?),
        Some(Given::Text(text)) => Some(Key::parse(pk, text).map_err(TxError::schema)?),
    };
    // A client's read rule, bound once for the whole page.
    let read = match caller.claims() {
        Some(claims) => {
            let rules = core.rules(db, table)?;
            let bound = rules.read.bind(db, &claims.all)?;
            Some((rules, bound))
        }
        None => None,
    };
    let readable = |values: &[Value]| {
        read.as_ref()
            .is_none_or(|(rules, bound)| rules.read.allows(values, bound))
    };
    let mut rows = Vec::new();
    let mut next = None;
    let reads_tables = read.as_ref().is_some_and(|(r, _)| r.read.reads_tables());
    let Some(index) = index else {
        // By primary key: at most one row, vouched for as a read by key is.
        let mut depends = confirmed;
        if let Some(key) = Key::from_value(&value) {
            if after.as_ref().is_none_or(|a| *a < key) {
                match t.rows.get(&key) {
                    Some(entry) => {
                        depends = entry.version.max(confirmed);
                        if readable(&entry.values) {
                            rows.push(PointRow {
                                values: entry.values.clone(),
                                version: entry.version,
                            });
                        }
                    }
                    None => {
                        if changed_since(db, confirmed, table, |c| c.key == key) {
                            depends = db.seq;
                        }
                    }
                }
            }
        }
        if db.schema_seq > confirmed || reads_tables {
            depends = db.seq;
        }
        return Ok((schema.clone(), rows, None, depends));
    };
    let first = |v: &Value| -> Box<[Value]> { Box::new([v.clone()]) };
    let start = match after {
        Some(k) => Bound::Excluded((first(&value), k)),
        None => Bound::Included((first(&value), Key::Int(i64::MIN))),
    };
    let mut last: Option<&Key> = None;
    for (examined, (_, key)) in t.indexes[index]
        .range((start, Bound::Unbounded))
        .take_while(|(values, _)| values[0] == value)
        .enumerate()
    {
        if rows.len() >= lookup.limit || examined >= INDEX_EXAMINED_ROWS_MAX {
            next = last.cloned();
            break;
        }
        last = Some(key);
        let entry = row_of(t, key);
        if readable(&entry.values) {
            rows.push(PointRow {
                values: entry.values.clone(),
                version: entry.version,
            });
        }
    }
    // The rows found vouch for themselves up to their own commits; a row that left the
    // value (or was deleted) after the confirmed state is not here to vouch, so the
    // commits since are looked at for it.
    let mut depends = rows
        .iter()
        .map(|r| r.version)
        .max()
        .unwrap_or(0)
        .max(confirmed);
    let left = changed_since(db, confirmed, table, |c| {
        c.old.as_ref().is_some_and(|old| old[column] == value)
    });
    if left || db.schema_seq > confirmed || reads_tables {
        depends = db.seq;
    }
    Ok((schema.clone(), rows, next, depends))
}

/// Changes looked at, at most, to tell that none after the confirmed seq matters to a
/// point read; past it the read waits for the whole state instead.
const CHANGES_LOOKED_AT_MAX: usize = 4096;

/// Whether a commit after `confirmed` (up to the applied state) may change the answer of a
/// read of `table`: a schema commit, a change to `table` that `hit` picks, or commits no
/// longer retained or too many to look at (then: yes).
fn changed_since(
    db: &Db,
    confirmed: u64,
    table: &str,
    hit: impl Fn(&sluice_engine::Change) -> bool,
) -> bool {
    if db.seq <= confirmed {
        return false;
    }
    let Ok(commits) = db.changelog.since(confirmed) else {
        return true;
    };
    let mut looked = 0;
    for commit in commits {
        match &commit.body {
            sluice_engine::CommitBody::Rows(changes) => {
                looked += changes.len();
                if looked > CHANGES_LOOKED_AT_MAX {
                    return true;
                }
                if changes.iter().any(|c| c.table.name == table && hit(c)) {
                    return true;
                }
            }
            sluice_engine::CommitBody::Schema { .. } => return true,
            _ => {}
        }
    }
    false
}

/// The row an index entry names (an index never names a missing row).
fn row_of<'t>(t: &'t Table, key: &Key) -> &'t sluice_engine::table::RowEntry {
    t.rows
        .get(key)
        .expect("every index entry names a row of its table")
}

fn index_names(schema: &TableSchema) -> String {
    if schema.indexes.is_empty() {
        return "none".into();
    }
    schema
        .indexes
        .iter()
        .map(|i| i.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn key_fits(key: &Key, ty: ColumnType) -> bool {
    matches!(
        (key, ty),
        (Key::Int(_), ColumnType::Integer) | (Key::Text(_), ColumnType::Text)
    )
}

fn key_kind(key: &Key) -> &'static str {
    match key {
        Key::Int(_) => "an integer",
        Key::Text(_) => "a string",
    }
}

fn json_kind(j: &Json) -> &'static str {
    match j {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn wrong_key(table: &str, ty: ColumnType, got: &str) -> TxError {
    TxError::schema(format!(
        "the primary key of table {table:?} is {ty}: expected {}, got {got}",
        match ty {
            ColumnType::Integer => "an integer",
            _ => "a string",
        }
    ))
}

fn key_from_json(table: &str, ty: ColumnType, j: &Json) -> Result<Key, TxError> {
    match (ty, j) {
        (ColumnType::Integer, Json::Number(n)) if n.as_i64().is_some() => {
            Ok(Key::Int(n.as_i64().unwrap_or_default()))
        }
        (ColumnType::Text, Json::String(s)) => Ok(Key::Text(s.as_str().into())),
        _ => Err(wrong_key(table, ty, json_kind(j))),
    }
}

/// A value of a column of type `ty` written as URL text.
fn value_from_text(ty: ColumnType, text: &str) -> Result<Value, String> {
    let bad = || format!("expected {ty}, got {text:?}");
    Ok(match ty {
        ColumnType::Integer => Value::Integer(text.parse().map_err(|_| bad())?),
        ColumnType::Timestamp => Value::Timestamp(text.parse().map_err(|_| bad())?),
        ColumnType::Real => Value::Real(text.parse().map_err(|_| bad())?),
        ColumnType::Boolean => Value::Boolean(match text {
            "true" => true,
            "false" => false,
            _ => return Err(bad()),
        }),
        ColumnType::Text => Value::Text(text.into()),
        ColumnType::Blob | ColumnType::Json => {
            let json = Json::String(text.to_string());
            return Value::from_json(ty, &json);
        }
    })
}

/// A row serialised straight from its typed values, as `{column: value, …}` in column
/// order — the same bytes (JSON) and the same MessagePack as the row's JSON value.
pub(crate) struct RowSer<'a> {
    pub schema: &'a TableSchema,
    pub values: &'a [Value],
}

impl serde::Serialize for RowSer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.values.len()))?;
        for (column, value) in self.schema.columns.iter().zip(self.values.iter()) {
            m.serialize_entry(&column.name, &ValueSer(value))?;
        }
        m.end()
    }
}

/// A stored row as `{"row": {…}, "version": n}`, straight from its typed values.
pub(crate) struct VersionedRowSer<'a> {
    pub schema: &'a TableSchema,
    pub row: &'a PointRow,
}

impl serde::Serialize for VersionedRowSer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("VersionedRow", 2)?;
        let row = RowSer {
            schema: self.schema,
            values: &self.row.values,
        };
        m.serialize_field("row", &row)?;
        m.serialize_field("version", &self.row.version)?;
        m.end()
    }
}

/// One value as [`Value::to_json`] would give it, without the JSON value in between.
struct ValueSer<'a>(&'a Value);

impl serde::Serialize for ValueSer<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit(),
            // As a JSON value holds them: non-negative integers as u64 (MessagePack then
            // writes them as unsigned, exactly as the JSON value's encoding does).
            Value::Integer(i) | Value::Timestamp(i) => match u64::try_from(*i) {
                Ok(u) => s.serialize_u64(u),
                Err(_) => s.serialize_i64(*i),
            },
            Value::Real(r) if r.is_finite() => s.serialize_f64(*r),
            Value::Real(_) => s.serialize_unit(),
            Value::Boolean(b) => s.serialize_bool(*b),
            Value::Text(t) => s.serialize_str(t),
            // Rare on the read path: these take the JSON value's route.
            Value::Blob(_) | Value::Json(_) => self.0.to_json().serialize(s),
        }
    }
}
