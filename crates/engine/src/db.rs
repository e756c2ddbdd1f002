//! [`Db`]: all tables, the applied seq and the changelog; [`Tx`]: one atomic transaction.
//!
//! A transaction applies each op to the tables immediately and records how to undo it. On
//! [`Tx::commit`] the changes become a [`Commit`] with the next seq; dropping a `Tx`
//! without committing undoes every op in reverse, so a refused transaction leaves no trace
//! (the seq does not move and nothing reaches the changelog or the log).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::bulk::{PendingWrite, PendingWrites, Sorter};
use crate::changelog::Changelog;
use crate::error::{ErrorCode, TxError};
use crate::schema::{ColumnDef, IndexDef, SchemaChange, TableSchema};
use crate::table::{RowEntry, Table};
use crate::topic::{self, Appended, Topic, TopicConfig};
use crate::value::{ColumnType, Key, Value};

/// Limits the engine enforces; each is named in the error that enforces it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Encoded size of one row (`--max-row-bytes`).
    pub row_bytes_max: usize,
    /// Columns in one table (`--max-columns`).
    pub columns_per_table_max: usize,
    /// Encoded size of one transaction's commit record (`--max-commit-bytes`): enforced op
    /// by op while the transaction is built, so a commit always fits in one log frame.
    pub commit_bytes_max: usize,
    /// Topics in the database (`--max-topics`).
    pub topics_max: usize,
    /// One record's data (compact JSON) plus its tags (`--max-record-bytes`).
    pub record_bytes_max: usize,
    /// `retain_records` of a topic created without one (`--topic-retain-records`).
    pub topic_retain_records: u64,
    /// `retain_bytes` of a topic created without one, and the most any topic may set
    /// (`--topic-retain-bytes`).
    pub topic_retain_bytes: u64,
}

impl Limits {
    /// The retention of a topic created without one.
    pub fn default_topic_config(&self) -> TopicConfig {
        TopicConfig {
            retain_records: self.topic_retain_records,
            retain_bytes: self.topic_retain_bytes,
            retain_secs: 0,
        }
    }
}

/// Largest accepted `commit_bytes_max`. The size counted against it is an upper bound of the
/// encoded commit record, so a commit stays well inside one log frame (64 MiB).
pub const COMMIT_BYTES_MAX_CEILING: usize = 32 << 20;
/// Most row policies on one table.
pub const POLICIES_PER_TABLE_MAX: usize = 64;
const _: () = assert!(COMMIT_BYTES_MAX_CEILING < sluice_log::frame::FRAME_PAYLOAD_BYTES_MAX);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            row_bytes_max: 1 << 20,
            columns_per_table_max: 256,
            commit_bytes_max: 16 << 20,
            topics_max: 1024,
            record_bytes_max: 1 << 20,
            topic_retain_records: 1_000_000,
            topic_retain_bytes: 64 << 20,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeOp {
    Insert,
    Update,
    Delete,
}

impl ChangeOp {
    pub const fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Insert => "insert",
            ChangeOp::Update => "update",
            ChangeOp::Delete => "delete",
        }
    }
}

/// One row's change in a commit.
#[derive(Clone, Debug)]
pub struct Change {
    /// The table's schema when the change was made (renders `row` to JSON).
    pub table: Arc<TableSchema>,
    pub op: ChangeOp,
    pub key: Key,
    /// The row after the change; `None` for deletes.
    pub row: Option<Arc<[Value]>>,
    /// The row before the change; `None` for inserts. Kept in memory only (the log holds
    /// after-images): live views use it to retract what the row contributed before.
    pub old: Option<Arc<[Value]>>,
    /// The row's version after the change (for deletes: the version that was deleted).
    pub version: u64,
}

impl Change {
    pub fn row_json(&self) -> Json {
        match &self.row {
            Some(values) => row_to_json(&self.table, values),
            None => Json::Null,
        }
    }
}

pub fn row_to_json(schema: &TableSchema, values: &[Value]) -> Json {
    let mut map = Map::with_capacity(values.len());
    for (col, value) in schema.columns.iter().zip(values.iter()) {
        map.insert(col.name.clone(), value.to_json());
    }
    Json::Object(map)
}

#[derive(Clone, Debug)]
pub enum CommitBody {
    Rows(Vec<Change>),
    /// DDL: one or more schema changes applied atomically, with the SQL that asked for them.
    Schema {
        changes: Vec<SchemaChange>,
        sql: String,
    },
    /// A topic created, its retention changed, or dropped.
    Topic(TopicChange),
}

/// What a topic DDL commit did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicChange {
    /// Created (`created`) or changed the retention of an existing topic.
    Put {
        name: String,
        config: TopicConfig,
        created: bool,
    },
    Drop {
        name: String,
    },
    /// The topic's rules for clients changed.
    Rules {
        name: String,
        rules: crate::topic::TopicRules,
    },
    /// Records below `first` were dropped for the topic's age limit (`retain_secs`): logged,
    /// because the clock that decided it does not replay.
    Trim {
        name: String,
        first: u64,
    },
}

/// A committed transaction: the unit of the changelog, the log and replication.
#[derive(Clone, Debug)]
pub struct Commit {
    pub seq: u64,
    pub body: CommitBody,
    /// Records the transaction appended to topics (only with a `Rows` body).
    pub appends: Vec<Appended>,
}

/// What a successful write op reports back.
#[derive(Clone, Debug, PartialEq)]
pub struct WriteResult {
    /// The table written, as its schema when the op ran (`table.name` is its name): a
    /// reference count per row, not a copy of the name.
    pub table: Arc<TableSchema>,
    pub key: Key,
    pub version: u64,
}

/// The whole in-memory database.
pub struct Db {
    pub tables: BTreeMap<String, Table>,
    pub topics: BTreeMap<String, Topic>,
    /// Seq of the last applied commit.
    pub seq: u64,
    pub changelog: Changelog,
    pub limits: Limits,
    /// Seq of the last schema commit (tables, indexes, columns, policies) applied, or of the
    /// snapshot loaded: caches derived from schemas or policies are valid while it stays.
    pub schema_seq: u64,
}

/// Checks a policy's predicates against the state it is created in (the query crate
/// compiles them); the engine knows only their text.
pub type PolicyCheck<'a> = &'a dyn Fn(&Db, &str, &crate::schema::PolicyDef) -> Result<(), TxError>;

/// What rolling back one change restores: the version of the row it replaced, or `None` if
/// there was none. `TxState::undo[i]` belongs to `TxState::changes[i]`, whose table,
/// key and before-image (`Change::old`) say the rest: an entry holds no reference counts (a
/// copy of the schema's and of the old row's per write was shared-cache-line traffic on the
/// writer's hot path) and takes 16 bytes where it took 56.
type Undo = Option<u64>;

impl Db {
    pub fn new(limits: Limits, changelog: Changelog) -> Self {
        Db {
            tables: BTreeMap::new(),
            topics: BTreeMap::new(),
            seq: 0,
            changelog,
            limits,
            schema_seq: 0,
        }
    }

    pub fn table(&self, name: &str) -> Result<&Table, TxError> {
        self.tables.get(name).ok_or_else(|| no_table(name))
    }

    /// Starts a transaction. Its writes are visible to itself at once and to no one else
    /// until [`Tx::commit`].
    pub fn transaction(&mut self) -> Tx<'_> {
        let state = self.begin();
        Tx { db: self, state }
    }

    /// Validates and applies schema changes as one transaction: all of them or none.
    /// `Ok(None)` means every change was a no-op (`IF NOT EXISTS` / `IF EXISTS`) and no seq
    /// was consumed. On `Err`, the error's `op` is the index of the failing change.
    pub fn apply_schema(
        &mut self,
        changes: Vec<SchemaChange>,
        sql: String,
    ) -> Result<Option<Arc<Commit>>, TxError> {
        self.apply_schema_checked(changes, sql, &|_, _, _| Ok(()))
    }

    /// [`Db::apply_schema`], with each new policy checked by `check_policy` against the
    /// state the changes before it produced.
    pub fn apply_schema_checked(
        &mut self,
        changes: Vec<SchemaChange>,
        sql: String,
        check_policy: PolicyCheck<'_>,
    ) -> Result<Option<Arc<Commit>>, TxError> {
        let mut undo = Vec::new();
        let mut applied = Vec::new();
        for (i, change) in changes.into_iter().enumerate() {
            let valid = self.validate_schema(&change).and_then(|v| match &change {
                SchemaChange::CreatePolicy { table, policy } if v => {
                    check_policy(self, table, policy).map(|()| v)
                }
                _ => Ok(v),
            });
            match valid {
                Ok(true) => {
                    undo.push(self.apply_schema_unchecked(&change));
                    applied.push(change);
                }
                Ok(false) => {}
                Err(e) => {
                    for u in undo.into_iter().rev() {
                        self.undo_schema(u);
                    }
                    return Err(e.at_op(i));
                }
            }
        }
        if applied.is_empty() {
            return Ok(None);
        }
        let seq = self.seq + 1;
        self.seq = seq;
        self.schema_seq = seq;
        let commit = Arc::new(Commit {
            seq,
            body: CommitBody::Schema {
                changes: applied,
                sql,
            },
            appends: Vec::new(),
        });
        self.changelog.push(commit.clone());
        Ok(Some(commit))
    }

    /// Creates topic `name` (with `config`, or the defaults of [`Limits`]) or, if it exists
    /// and `config` differs from its own, changes its retention (trimming at once). `Ok(None)`:
    /// nothing changed, no seq consumed.
    pub fn put_topic(
        &mut self,
        name: &str,
        config: Option<TopicConfig>,
    ) -> Result<Option<Arc<Commit>>, TxError> {
        topic::check_topic_name(name)?;
        let change = match (self.topics.get(name), config) {
            (Some(_), None) => return Ok(None),
            (Some(t), Some(c)) if t.config() == c => return Ok(None),
            (Some(_), Some(c)) => {
                self.check_topic_config(&c)?;
                TopicChange::Put {
                    name: name.to_string(),
                    config: c,
                    created: false,
                }
            }
            (None, c) => {
                let max = self.limits.topics_max;
                if self.topics.len() >= max {
                    return Err(TxError::new(
                        ErrorCode::Limit,
                        format!(
                            "there are already {max} topics; topics_max (--max-topics) is {max}"
                        ),
                    ));
                }
                let c = c.unwrap_or_else(|| self.limits.default_topic_config());
                self.check_topic_config(&c)?;
                TopicChange::Put {
                    name: name.to_string(),
                    config: c,
                    created: true,
                }
            }
        };
        self.apply_topic_change(&change)
            .expect("validated against the current topics");
        Ok(Some(self.push_commit(CommitBody::Topic(change))))
    }

    /// Sets the rules of topic `name`; `Ok(None)`: they were already these.
    pub fn set_topic_rules(
        &mut self,
        name: &str,
        rules: crate::topic::TopicRules,
    ) -> Result<Option<Arc<Commit>>, TxError> {
        let t = self
            .topics
            .get(name)
            .ok_or_else(|| TxError::new(ErrorCode::NotFound, format!("no topic named {name:?}")))?;
        if **t.rules() == rules {
            return Ok(None);
        }
        rules.check()?;
        let change = TopicChange::Rules {
            name: name.to_string(),
            rules,
        };
        self.apply_topic_change(&change)
            .expect("validated against the current topics");
        Ok(Some(self.push_commit(CommitBody::Topic(change))))
    }

    /// Drops topic `name` and its records.
    pub fn drop_topic(&mut self, name: &str) -> Result<Arc<Commit>, TxError> {
        if !self.topics.contains_key(name) {
            return Err(TxError::new(
                ErrorCode::NotFound,
                format!("no topic named {name:?}"),
            ));
        }
        let change = TopicChange::Drop {
            name: name.to_string(),
        };
        self.apply_topic_change(&change).expect("checked above");
        Ok(self.push_commit(CommitBody::Topic(change)))
    }

    /// [`Db::expire_topics`], counting the records dropped instead of returning the commits
    /// (which are in the changelog all the same).
    pub fn trim_topics(&mut self, now_us: i64) -> u64 {
        let before: u64 = self.topics.values().map(|t| t.len() as u64).sum();
        self.expire_topics(now_us);
        before - self.topics.values().map(|t| t.len() as u64).sum::<u64>()
    }

    /// Whether some topic holds records past its age limit at `now_us`.
    pub fn topics_expired(&self, now_us: i64) -> bool {
        self.topics.values().any(|t| t.has_expired(now_us))
    }

    /// Drops records past their topic's age limit (`retain_secs`) as of `now_us`: one
    /// `Trim` commit per topic that dropped any (the clock does not replay; the log does).
    pub fn expire_topics(&mut self, now_us: i64) -> Vec<Arc<Commit>> {
        let expired: Vec<String> = self
            .topics
            .iter()
            .filter(|(_, t)| t.has_expired(now_us))
            .map(|(n, _)| n.clone())
            .collect();
        let mut commits = Vec::with_capacity(expired.len());
        for name in expired {
            let t = self.topics.get_mut(&name).expect("listed above");
            t.trim(Some(now_us));
            let first = t.first();
            commits.push(self.push_commit(CommitBody::Topic(TopicChange::Trim { name, first })));
        }
        commits
    }

    fn check_topic_config(&self, c: &TopicConfig) -> Result<(), TxError> {
        let ceiling = self.limits.topic_retain_bytes;
        if c.retain_records == 0 || c.retain_bytes == 0 {
            return Err(TxError::new(
                ErrorCode::BadRequest,
                "retain_records and retain_bytes must be at least 1",
            ));
        }
        if c.retain_bytes > ceiling {
            return Err(TxError::new(
                ErrorCode::Limit,
                format!(
                    "retain_bytes {} is over topic_retain_bytes (--topic-retain-bytes) of {ceiling}",
                    c.retain_bytes
                ),
            ));
        }
        if c.retain_secs > i64::MAX as u64 / 1_000_000 {
            return Err(TxError::new(
                ErrorCode::BadRequest,
                format!("retain_secs {} is too large", c.retain_secs),
            ));
        }
        Ok(())
    }

    /// Applies a topic change (new or replayed). Limits bind new requests only: replay
    /// accepts what was logged under other limits.
    fn apply_topic_change(&mut self, change: &TopicChange) -> Result<(), TxError> {
        match change {
            TopicChange::Put {
                name,
                config,
                created,
            } => {
                topic::check_topic_name(name)?;
                match self.topics.get_mut(name) {
                    Some(t) if !created => {
                        t.set_config(*config);
                        t.trim(None);
                    }
                    None if *created => {
                        self.topics.insert(name.clone(), Topic::new(name, *config));
                    }
                    _ => {
                        return Err(TxError::new(
                            ErrorCode::AlreadyExists,
                            format!("topic {name:?}: created twice or changed before it exists"),
                        ))
                    }
                }
            }
            TopicChange::Drop { name } => {
                self.topics.remove(name).ok_or_else(|| {
                    TxError::new(ErrorCode::NotFound, format!("no topic named {name:?}"))
                })?;
            }
            TopicChange::Rules { name, rules } => {
                let t = self.topics.get_mut(name).ok_or_else(|| {
                    TxError::new(ErrorCode::NotFound, format!("no topic named {name:?}"))
                })?;
                t.set_rules(rules.clone());
            }
            TopicChange::Trim { name, first } => {
                let t = self.topics.get_mut(name).ok_or_else(|| {
                    TxError::new(ErrorCode::NotFound, format!("no topic named {name:?}"))
                })?;
                t.trim_to(*first)
                    .map_err(|e| TxError::new(ErrorCode::BadRequest, e))?;
            }
        }
        Ok(())
    }

    /// Takes the next seq for a commit with `body` and records it in the changelog.
    fn push_commit(&mut self, body: CommitBody) -> Arc<Commit> {
        self.seq += 1;
        let commit = Arc::new(Commit {
            seq: self.seq,
            body,
            appends: Vec::new(),
        });
        self.changelog.push(commit.clone());
        commit
    }

    fn undo_schema(&mut self, undo: SchemaUndo) {
        match undo {
            SchemaUndo::RemoveTable(name) => {
                self.tables.remove(&name);
            }
            SchemaUndo::RestoreTable(table) => {
                self.tables.insert(table.schema.name.clone(), table);
            }
            SchemaUndo::Policies(table, old) => {
                self.tables.get_mut(&table).expect("undo in order").policies = old;
            }
            SchemaUndo::PopIndex(old) => {
                let t = self.tables.get_mut(&old.name).expect("undo in order");
                t.indexes.pop();
                t.schema = old;
            }
            SchemaUndo::PopColumn(old) => {
                let t = self.tables.get_mut(&old.name).expect("undo in order");
                for row in t.rows.values_mut() {
                    let n = row.values.len() - 1;
                    row.values = row.values[..n].to_vec().into();
                }
                t.schema = old;
            }
        }
    }

    /// Checks a schema change against the current tables; `Ok(false)` = valid no-op.
    fn validate_schema(&self, change: &SchemaChange) -> Result<bool, TxError> {
        let max = self.limits.columns_per_table_max;
        match change {
            SchemaChange::CreateTable {
                schema,
                if_not_exists,
            } => {
                if self.tables.contains_key(&schema.name) {
                    if *if_not_exists {
                        return Ok(false);
                    }
                    return Err(TxError::new(
                        ErrorCode::AlreadyExists,
                        format!("table {:?} already exists", schema.name),
                    ));
                }
                if schema.columns.len() > max {
                    return Err(TxError::new(
                        ErrorCode::Limit,
                        format!(
                            "table {:?} has {} columns; columns_per_table_max (--max-columns) is {max}",
                            schema.name,
                            schema.columns.len()
                        ),
                    ));
                }
                validate_columns(schema)?;
            }
            SchemaChange::CreateIndex {
                table,
                name,
                columns,
                if_not_exists,
            } => {
                let t = self.table(table)?;
                if t.schema.indexes.iter().any(|ix| &ix.name == name) {
                    if *if_not_exists {
                        return Ok(false);
                    }
                    return Err(TxError::new(
                        ErrorCode::AlreadyExists,
                        format!("index {name:?} already exists on table {table:?}"),
                    ));
                }
                if columns.is_empty() {
                    return Err(TxError::schema("an index needs at least one column"));
                }
                for c in columns {
                    if t.schema.column(c).is_none() {
                        return Err(TxError::schema(format!(
                            "table {table:?} has no column {c:?}"
                        )));
                    }
                }
            }
            SchemaChange::DropTable { name, if_exists } => {
                if !self.tables.contains_key(name) {
                    if *if_exists {
                        return Ok(false);
                    }
                    self.table(name)?;
                }
            }
            SchemaChange::AddColumn { table, column } => {
                let t = self.table(table)?;
                if t.schema.column(&column.name).is_some() {
                    return Err(TxError::new(
                        ErrorCode::AlreadyExists,
                        format!("table {table:?} already has a column {:?}", column.name),
                    ));
                }
                if t.schema.columns.len() + 1 > max {
                    return Err(TxError::new(
                        ErrorCode::Limit,
                        format!("table {table:?} would have {} columns; columns_per_table_max (--max-columns) is {max}", t.schema.columns.len() + 1),
                    ));
                }
                if column.not_null && column.default.as_ref().is_none_or(Value::is_null) {
                    return Err(TxError::schema(format!(
                        "column {:?} is NOT NULL, so adding it to existing rows needs a non-NULL DEFAULT",
                        column.name
                    )));
                }
                validate_default(column)?;
            }
            SchemaChange::CreatePolicy { table, policy } => {
                let t = self.table(table)?;
                if t.policies.iter().any(|p| p.name == policy.name) {
                    return Err(TxError::new(
                        ErrorCode::AlreadyExists,
                        format!("policy {:?} already exists on table {table:?}", policy.name),
                    ));
                }
                if t.policies.len() >= POLICIES_PER_TABLE_MAX {
                    return Err(TxError::new(
                        ErrorCode::Limit,
                        format!("table {table:?} has {POLICIES_PER_TABLE_MAX} policies; policies_per_table_max is {POLICIES_PER_TABLE_MAX}"),
                    ));
                }
                if policy.using.is_none() && policy.check.is_none() {
                    return Err(TxError::schema(format!(
                        "policy {:?} needs USING (…) or WITH CHECK (…)",
                        policy.name
                    )));
                }
            }
            SchemaChange::DropPolicy {
                table,
                name,
                if_exists,
            } => {
                let t = self.table(table)?;
                if !t.policies.iter().any(|p| &p.name == name) {
                    if *if_exists {
                        return Ok(false);
                    }
                    return Err(TxError::new(
                        ErrorCode::NotFound,
                        format!("no policy {name:?} on table {table:?}"),
                    ));
                }
            }
        }
        Ok(true)
    }

    /// Applies a validated (or replayed) schema change; returns how to undo it.
    fn apply_schema_unchecked(&mut self, change: &SchemaChange) -> SchemaUndo {
        match change {
            SchemaChange::CreateTable { schema, .. } => {
                let table = Table::new(Arc::new(schema.clone()));
                self.tables.insert(schema.name.clone(), table);
                SchemaUndo::RemoveTable(schema.name.clone())
            }
            SchemaChange::CreateIndex {
                table,
                name,
                columns,
                ..
            } => {
                let t = self.tables.get_mut(table).expect("validated");
                let old = t.schema.clone();
                let mut schema = (*t.schema).clone();
                let columns = columns
                    .iter()
                    .map(|c| schema.column(c).expect("validated"))
                    .collect();
                schema.indexes.push(IndexDef {
                    name: name.clone(),
                    columns,
                });
                t.add_index(Arc::new(schema));
                SchemaUndo::PopIndex(old)
            }
            SchemaChange::DropTable { name, .. } => {
                let table = self.tables.remove(name).expect("validated");
                SchemaUndo::RestoreTable(table)
            }
            SchemaChange::AddColumn { table, column } => {
                let t = self.tables.get_mut(table).expect("validated");
                let old = t.schema.clone();
                let mut schema = (*t.schema).clone();
                schema.columns.push(column.clone());
                let fill = column.default.clone().unwrap_or(Value::Null);
                t.add_column(Arc::new(schema), &fill);
                SchemaUndo::PopColumn(old)
            }
            SchemaChange::CreatePolicy { table, policy } => {
                let t = self.tables.get_mut(table).expect("validated");
                let old = t.policies.clone();
                t.policies.push(policy.clone());
                SchemaUndo::Policies(table.clone(), old)
            }
            SchemaChange::DropPolicy { table, name, .. } => {
                let t = self.tables.get_mut(table).expect("validated");
                let old = t.policies.clone();
                t.policies.retain(|p| &p.name != name);
                SchemaUndo::Policies(table.clone(), old)
            }
        }
    }

    /// Applies a commit read back from the log or a peer. It **must** be the next seq.
    pub fn replay(&mut self, seq: u64, body: ReplayBody) -> Result<(), String> {
        self.replay_with(seq, body, None).map(|_| ())
    }

    /// [`Db::replay`] returning the commit as the changelog holds it (with before-images),
    /// for a follower that feeds it on to live views and topic watchers like a commit of
    /// its own.
    pub fn replay_commit(&mut self, seq: u64, body: ReplayBody) -> Result<Arc<Commit>, String> {
        self.replay_with(seq, body, None)
    }

    /// [`Db::replay`] for recovery: the writes to a table which was empty at its first
    /// replayed write are held in `bulk` (in log order) and built in bulk at the next
    /// schema commit or at [`Db::finish_bulk`], which **must** be called before the state
    /// is used: sorted by key (stable), the last write of each key is its row
    /// ([`Table::load_map`]), and each write's before-image is set in its changelog
    /// entry then (while held back, a change's `old` is `None`). The end state is the one
    /// [`Db::replay`] builds.
    pub fn replay_bulk(
        &mut self,
        seq: u64,
        body: ReplayBody,
        bulk: &mut BulkLoad,
    ) -> Result<(), String> {
        self.replay_with(seq, body, Some(bulk)).map(|_| ())
    }

    /// Builds every table whose rows `bulk` holds back (see [`Db::replay_bulk`]).
    pub fn finish_bulk(&mut self, bulk: &mut BulkLoad) {
        let mut sorted_elsewhere: BTreeMap<usize, Vec<Vec<PendingWrite>>> = BTreeMap::new();
        for (id, block) in bulk.sorter.finish() {
            sorted_elsewhere.entry(id).or_default().push(block);
        }
        for (name, state) in std::mem::take(&mut bulk.tables) {
            let BulkTable::Pending(writes) = state else {
                continue;
            };
            let elsewhere = sorted_elsewhere.remove(&writes.id()).unwrap_or_default();
            // Each key's writes in log order (seq, then place in the commit): the last one
            // is the row, and each write's before-image is the one before it. Merged from
            // blocks sorted as they filled straight into the row map's chunks — no second
            // `Vec` of every row (see `crate::bulk`).
            let mut rows = crate::cow::CowMapBuilder::with_capacity(writes.len());
            // The previous write in merged order (the last one of its key so far).
            let mut prev: Option<PendingWrite> = None;
            for write in writes.into_sorted(elsewhere) {
                if let Some(p) = prev.take() {
                    if write.key == p.key {
                        if p.values.is_some() {
                            self.changelog.set_old(write.seq, write.change, p.values);
                        }
                    } else if let Some(values) = p.values {
                        // `p` was its key's last write: its row (it did not delete it).
                        rows.push(
                            p.key,
                            RowEntry {
                                values,
                                version: p.version,
                            },
                        );
                    }
                }
                prev = Some(write);
            }
            if let Some(p) = prev {
                if let Some(values) = p.values {
                    rows.push(
                        p.key,
                        RowEntry {
                            values,
                            version: p.version,
                        },
                    );
                }
            }
            self.tables
                .get_mut(&name)
                .expect("tables change only at schema commits, which flush first")
                .load_map(rows.finish());
        }
    }

    fn replay_with(
        &mut self,
        seq: u64,
        body: ReplayBody,
        mut bulk: Option<&mut BulkLoad>,
    ) -> Result<Arc<Commit>, String> {
        if self.seq.checked_add(1) != Some(seq) {
            return Err(format!(
                "expected seq {}, found {seq}",
                self.seq as u128 + 1
            ));
        }
        let mut appends = Vec::new();
        let commit_body = match body {
            ReplayBody::Topic(change) => {
                self.apply_topic_change(&change)
                    .map_err(|e| format!("seq {seq}: topic change does not apply: {e}"))?;
                CommitBody::Topic(change)
            }
            ReplayBody::Tx { rows, appends: a } => {
                let changes = self.replay_rows(seq, rows, bulk)?;
                for batch in &a {
                    let t = self.topics.get_mut(&*batch.topic).ok_or_else(|| {
                        format!("seq {seq} appends to unknown topic {:?}", batch.topic)
                    })?;
                    for r in &batch.records {
                        if r.offset != t.next() || r.ts_us < t.last_ts_us() || r.seq != seq {
                            return Err(format!(
                                "seq {seq}: record at offset {} of topic {:?} does not follow offset {} (ts {})",
                                r.offset,
                                batch.topic,
                                t.next(),
                                t.last_ts_us()
                            ));
                        }
                        t.push(r.clone());
                    }
                }
                // Trim as the commit did (its runs say where each topic started afterwards).
                for batch in &a {
                    let t = self.topics.get_mut(&*batch.topic).expect("checked above");
                    t.trim_to(batch.first_after)
                        .map_err(|e| format!("seq {seq}: {e}"))?;
                }
                appends = a;
                CommitBody::Rows(changes)
            }
            ReplayBody::Schema { changes, sql } => {
                if let Some(bulk) = bulk.as_deref_mut() {
                    self.finish_bulk(bulk);
                }
                for change in &changes {
                    // Limits bind new requests, not history: a lowered limit must not stop
                    // recovery of tables created under a higher one.
                    match self.validate_schema(change) {
                        Ok(true) => {}
                        Err(e) if e.code == ErrorCode::Limit => {}
                        Ok(false) => continue,
                        Err(e) => {
                            return Err(format!("seq {seq}: schema change does not apply: {e}"))
                        }
                    }
                    self.apply_schema_unchecked(change);
                }
                self.schema_seq = seq;
                CommitBody::Schema { changes, sql }
            }
            ReplayBody::Rows(rows) => CommitBody::Rows(self.replay_rows(seq, rows, bulk)?),
        };
        self.seq = seq;
        let commit = Arc::new(Commit {
            seq,
            body: commit_body,
            appends,
        });
        self.changelog.push(commit.clone());
        Ok(commit)
    }

    fn replay_rows(
        &mut self,
        seq: u64,
        rows: Vec<ReplayRow>,
        bulk: Option<&mut BulkLoad>,
    ) -> Result<Vec<Change>, String> {
        let mut changes = Vec::with_capacity(rows.len());
        let (mut bulk_tables, mut sorter) = match bulk {
            Some(BulkLoad { tables, sorter }) => (Some(tables), Some(sorter)),
            None => (None, None),
        };
        // The rows of one commit mostly name one table, sharing its name (decoded once):
        // the table and its bulk state are looked up once per name, not once per row.
        let mut current: Option<(Arc<str>, &mut Table, Option<&mut BulkTable>)> = None;
        for r in rows {
            if !current
                .as_ref()
                .is_some_and(|(name, ..)| Arc::ptr_eq(name, &r.table))
            {
                let table = self
                    .tables
                    .get_mut(&*r.table)
                    .ok_or_else(|| format!("seq {seq} writes unknown table {:?}", r.table))?;
                let state = match bulk_tables.as_deref_mut() {
                    None => None,
                    Some(tables) => Some({
                        // Distinct until `finish_bulk`, which empties both the map and
                        // the sorter: entries are only added until then.
                        let id = tables.len();
                        match tables.entry(r.table.to_string()) {
                            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                            std::collections::btree_map::Entry::Vacant(e) => {
                                e.insert(if table.rows.is_empty() {
                                    BulkTable::Pending(PendingWrites::new(id))
                                } else {
                                    BulkTable::Off
                                })
                            }
                        }
                    }),
                };
                current = Some((r.table.clone(), table, state));
            }
            let (_, table, state) = current.as_mut().expect("set above");
            let row = r.values;
            if let Some(values) = &row {
                if values.len() != table.schema.columns.len() {
                    return Err(format!(
                        "seq {seq}: row of {} values for table {:?} of {} columns",
                        values.len(),
                        r.table,
                        table.schema.columns.len()
                    ));
                }
            }
            if let Some(BulkTable::Pending(writes)) = state.as_deref_mut() {
                // Held back; the before-image is filled in when the table is built.
                writes.push(
                    PendingWrite {
                        key: r.key.clone(),
                        values: row.clone(),
                        version: r.version,
                        seq,
                        change: changes.len(),
                    },
                    sorter.as_deref_mut().expect("pending only in a bulk load"),
                );
                changes.push(Change {
                    table: table.schema.clone(),
                    op: r.op,
                    key: r.key,
                    row,
                    old: None,
                    version: r.version,
                });
                continue;
            }
            let old = match &row {
                Some(values) => table.put(
                    r.key.clone(),
                    RowEntry {
                        values: values.clone(),
                        version: r.version,
                    },
                ),
                None => table.remove(&r.key),
            };
            changes.push(Change {
                table: table.schema.clone(),
                op: r.op,
                key: r.key,
                row,
                old: old.map(|e| e.values),
                version: r.version,
            });
        }
        Ok(changes)
    }
}

/// Rows that [`Db::replay_bulk`] holds back, by table.
#[derive(Default)]
pub struct BulkLoad {
    tables: BTreeMap<String, BulkTable>,
    /// Sorts the held-back blocks of every table off the applying thread.
    sorter: Sorter,
}

enum BulkTable {
    /// The table was empty at its first replayed write: its writes since, in log order,
    /// not yet in the table.
    Pending(PendingWrites),
    /// Writes go to the table one by one.
    Off,
}

/// A commit as decoded from bytes, before it is applied.
#[derive(Clone, Debug)]
pub enum ReplayBody {
    Rows(Vec<ReplayRow>),
    /// Row changes and topic appends of one transaction (records carry their seq).
    Tx {
        rows: Vec<ReplayRow>,
        appends: Vec<Appended>,
    },
    Topic(TopicChange),
    Schema {
        changes: Vec<SchemaChange>,
        sql: String,
    },
}

enum SchemaUndo {
    Policies(String, Vec<crate::schema::PolicyDef>),
    RemoveTable(String),
    RestoreTable(Table),
    PopIndex(Arc<TableSchema>),
    PopColumn(Arc<TableSchema>),
}

#[derive(Clone, Debug)]
pub struct ReplayRow {
    /// Shared by the rows of one commit that name the same table (decoded once).
    pub table: Arc<str>,
    pub op: ChangeOp,
    pub key: Key,
    /// Decoded straight into the row's final storage; `None` for deletes.
    pub values: Option<Arc<[Value]>>,
    pub version: u64,
}

pub(crate) fn validate_columns(schema: &TableSchema) -> Result<(), TxError> {
    if schema.columns.is_empty() {
        return Err(TxError::schema("a table needs at least one column"));
    }
    if schema.pk >= schema.columns.len() {
        return Err(TxError::schema(format!(
            "primary key position {} is past the table's {} columns",
            schema.pk,
            schema.columns.len()
        )));
    }
    for (i, ix) in schema.indexes.iter().enumerate() {
        if ix.columns.is_empty() || ix.columns.iter().any(|&c| c >= schema.columns.len()) {
            return Err(TxError::schema(format!(
                "index {:?} names a column the table does not have",
                ix.name
            )));
        }
        if schema.indexes[..i].iter().any(|p| p.name == ix.name) {
            return Err(TxError::new(
                ErrorCode::AlreadyExists,
                format!("index {:?} is declared twice", ix.name),
            ));
        }
    }
    for (i, c) in schema.columns.iter().enumerate() {
        if schema.columns[..i].iter().any(|p| p.name == c.name) {
            return Err(TxError::schema(format!(
                "column {:?} is declared twice",
                c.name
            )));
        }
        validate_default(c)?;
    }
    let pk = schema.pk_column();
    if !matches!(pk.ty, ColumnType::Integer | ColumnType::Text) {
        return Err(TxError::schema(format!(
            "primary key {:?} must be INTEGER or TEXT, not {}",
            pk.name, pk.ty
        )));
    }
    Ok(())
}

fn validate_default(c: &ColumnDef) -> Result<(), TxError> {
    if let Some(d) = &c.default {
        if !d.fits(c.ty) {
            return Err(TxError::schema(format!(
                "DEFAULT for column {:?} is not a {} value",
                c.name, c.ty
            )));
        }
    }
    Ok(())
}

/// The undo log and changes of a transaction in progress, kept apart from the [`Db`] so a
/// caller that cannot hold `&mut Db` for the whole transaction (the JavaScript runtime, whose
/// host functions are `'static`) can carry it between ops. Every `TxState` **must** end in
/// [`Db::commit_state`] or [`Db::rollback_state`] before the next transaction starts.
#[derive(Debug)]
pub struct TxState {
    seq: u64,
    undo: Vec<Undo>,
    changes: Vec<Change>,
    appends: Vec<Appended>,
    /// For each run in `appends`: its topic's last append time before the run (for undo).
    appends_prev_ts: Vec<i64>,
    /// Upper bound of the commit record's encoded size so far (see [`Limits::commit_bytes_max`]).
    commit_bytes: usize,
    /// Set once an op was refused for the commit size: the transaction must not commit even
    /// if its caller (a JavaScript function that caught the error) carries on.
    over_limit: Option<TxError>,
}

impl TxState {
    /// The seq this transaction will have if it commits.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The commit-size refusal this transaction met, if any: such a transaction **must** be
    /// rolled back, never committed (an op it tried was too big to log).
    pub fn over_limit(&self) -> Option<&TxError> {
        self.over_limit.as_ref()
    }
}

/// Ops of one transaction over a [`Db`], borrowing its [`TxState`].
pub struct TxRef<'a> {
    db: &'a mut Db,
    st: &'a mut TxState,
}

/// One transaction over a [`Db`]: ops apply at once and are undone on drop unless committed.
pub struct Tx<'a> {
    db: &'a mut Db,
    state: TxState,
}

impl Tx<'_> {
    pub fn seq(&self) -> u64 {
        self.state.seq
    }

    /// Makes room for `rows` more row writes (a change and an undo entry each) at once: a
    /// caller that knows how many ops it will apply — a mutate — saves the lists' growth by
    /// doubling. The change list is handed to the commit, so each transaction's is new
    /// memory, and each doubling copied it into more of it: on the `wide` ingest, the
    /// writer's `Vec::push` reallocations were 41 % of its page faults.
    pub fn reserve_writes(&mut self, rows: usize) {
        self.state.undo.reserve(rows);
        self.state.changes.reserve(rows);
    }

    /// The row changes made so far, in order (a write check reads each op's before and after).
    pub fn changes(&self) -> &[Change] {
        &self.state.changes
    }

    pub fn ops(&mut self) -> TxRef<'_> {
        TxRef {
            db: self.db,
            st: &mut self.state,
        }
    }

    pub fn get(&self, table: &str, key: &Key) -> Result<Option<&RowEntry>, TxError> {
        Ok(self.db.table(table)?.rows.get(key))
    }

    pub fn db(&self) -> &Db {
        self.db
    }

    pub fn insert(
        &mut self,
        table: &str,
        row: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.ops().insert(table, row, if_version)
    }

    pub fn upsert(
        &mut self,
        table: &str,
        row: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.ops().upsert(table, row, if_version)
    }

    pub fn patch(
        &mut self,
        table: &str,
        id: &Json,
        set: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.ops().patch(table, id, set, if_version)
    }

    pub fn delete(
        &mut self,
        table: &str,
        id: &Json,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.ops().delete(table, id, if_version)
    }

    /// Appends a record to `topic`; returns its offset. See [`TxRef::append`].
    pub fn append(
        &mut self,
        topic: &str,
        tags: Vec<String>,
        data: &Json,
        ts_us: i64,
    ) -> Result<u64, TxError> {
        self.ops().append(topic, tags, data, ts_us)
    }

    /// Appends a record whose data is JSON text. See [`TxRef::append_json_text`].
    pub fn append_json_text(
        &mut self,
        topic: &str,
        tags: Vec<String>,
        data: Box<str>,
        ts_us: i64,
    ) -> Result<u64, TxError> {
        self.ops().append_json_text(topic, tags, data, ts_us)
    }

    /// Makes the transaction's changes permanent in memory and returns its commit, or
    /// `None` if it changed nothing (it then consumes no seq).
    pub fn commit(mut self) -> Option<Arc<Commit>> {
        self.db.commit_state(&mut self.state)
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        self.db.rollback_state(&mut self.state);
    }
}

impl Db {
    /// Starts a transaction state for [`Db::tx`]; see [`TxState`].
    pub fn begin(&self) -> TxState {
        TxState {
            seq: self.seq + 1,
            undo: Vec::new(),
            changes: Vec::new(),
            appends: Vec::new(),
            appends_prev_ts: Vec::new(),
            commit_bytes: COMMIT_HEADER_BYTES_MAX,
            over_limit: None,
        }
    }

    /// [`Db::begin`], reusing `spare` when given: the state of a transaction that ended
    /// (committed or rolled back) keeps its buffers, so a writer that runs one transaction
    /// after another allocates its undo list once.
    pub fn begin_with(&self, spare: Option<TxState>) -> TxState {
        let Some(mut st) = spare else {
            return self.begin();
        };
        assert!(
            st.undo.is_empty()
                && st.changes.is_empty()
                && st.appends.is_empty()
                && st.appends_prev_ts.is_empty()
                && st.over_limit.is_none(),
            "only the state of an ended transaction is reused"
        );
        st.seq = self.seq + 1;
        st.commit_bytes = COMMIT_HEADER_BYTES_MAX;
        st
    }

    /// The ops of the transaction `st` over this db.
    pub fn tx<'a>(&'a mut self, st: &'a mut TxState) -> TxRef<'a> {
        assert_eq!(st.seq, self.seq + 1, "a TxState belongs to the next seq");
        TxRef { db: self, st }
    }

    /// Commits `st` (see [`Tx::commit`]); `st` is left empty.
    pub fn commit_state(&mut self, st: &mut TxState) -> Option<Arc<Commit>> {
        assert!(
            st.over_limit.is_none(),
            "a transaction refused for its commit size must be rolled back"
        );
        st.undo.clear();
        st.commit_bytes = COMMIT_HEADER_BYTES_MAX;
        if st.changes.is_empty() && st.appends.is_empty() {
            return None;
        }
        assert_eq!(st.seq, self.seq + 1, "commits apply in seq order");
        let mut appends = std::mem::take(&mut st.appends);
        st.appends_prev_ts.clear();
        // Retention only ever trims committed records, so an undo never has to restore one.
        for a in &appends {
            let t = self
                .topics
                .get_mut(&*a.topic)
                .expect("appended topics exist");
            let newest = a.records.last().map(|r| r.ts_us);
            t.trim(newest);
        }
        for a in &mut appends {
            a.first_after = self.topics[&*a.topic].first();
        }
        let commit = Arc::new(Commit {
            seq: st.seq,
            body: CommitBody::Rows(std::mem::take(&mut st.changes)),
            appends,
        });
        self.seq = st.seq;
        self.changelog.push(commit.clone());
        Some(commit)
    }

    /// Undoes every op of `st`, newest first; `st` is left empty.
    pub fn rollback_state(&mut self, st: &mut TxState) {
        st.commit_bytes = COMMIT_HEADER_BYTES_MAX;
        st.over_limit = None;
        // Topics and tables are independent, so their undo orders need not interleave.
        while let Some(run) = st.appends.pop() {
            let prev_ts = st.appends_prev_ts.pop().expect("one per run");
            let t = self
                .topics
                .get_mut(&*run.topic)
                .expect("topics do not change inside a tx");
            for _ in &run.records {
                t.pop_back();
            }
            t.set_last_ts(prev_ts);
        }
        assert_eq!(st.undo.len(), st.changes.len(), "one undo entry per change");
        while let Some(undo) = st.undo.pop() {
            let change = st.changes.pop().expect("one change per undo entry");
            let t = self
                .tables
                .get_mut(&change.table.name)
                .expect("tables do not change inside a tx");
            match undo {
                Some(version) => {
                    let values = change.old.expect("a change that replaced a row keeps it");
                    t.put(change.key, RowEntry { values, version });
                }
                None => {
                    t.remove(&change.key);
                }
            }
        }
    }
}

impl TxRef<'_> {
    /// The seq this transaction will have if it commits.
    pub fn seq(&self) -> u64 {
        self.st.seq
    }

    pub fn get(&self, table: &str, key: &Key) -> Result<Option<&RowEntry>, TxError> {
        Ok(self.db.table(table)?.rows.get(key))
    }

    pub fn db(&self) -> &Db {
        self.db
    }

    /// Makes the transaction's changes permanent in memory and returns its commit, or
    /// `None` if it changed nothing (it then consumes no seq). The state is left empty.
    pub fn commit(self) -> Option<Arc<Commit>> {
        self.db.commit_state(self.st)
    }

    pub fn insert(
        &mut self,
        table: &str,
        row: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.put(table, row, if_version, false)
    }

    pub fn upsert(
        &mut self,
        table: &str,
        row: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        self.put(table, row, if_version, true)
    }

    fn put(
        &mut self,
        table_name: &str,
        fields: &Map<String, Json>,
        if_version: Option<u64>,
        replace: bool,
    ) -> Result<WriteResult, TxError> {
        let table = self.db.table(table_name)?;
        let schema = table.schema.clone();
        let mut values: Vec<Option<Value>> = vec![None; schema.columns.len()];
        for (name, json) in fields {
            let i = column_of(&schema, name)?;
            values[i] = Some(convert(&schema.columns[i], json)?);
        }
        let values: Vec<Value> = values
            .into_iter()
            .zip(&schema.columns)
            .map(|(v, c)| v.or_else(|| c.default.clone()).unwrap_or(Value::Null))
            .collect();
        let pk = &schema.columns[schema.pk];
        let key = Key::from_value(&values[schema.pk]).ok_or_else(|| {
            TxError::schema(format!(
                "row for table {table_name:?} is missing its primary key {:?}",
                pk.name
            ))
        })?;
        check_not_null(&schema, &values)?;
        // The rest depends on the state and the limits only: the decoded path's.
        self.put_decoded(&schema, key, values.into(), if_version, replace)
    }

    /// Sets some columns of an existing row.
    pub fn patch(
        &mut self,
        table_name: &str,
        id: &Json,
        set: &Map<String, Json>,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        let table = self.db.table(table_name)?;
        let schema = table.schema.clone();
        let key = key_from_json(&schema, id)?;
        let old = existing_row(table, &key, if_version)?.values.clone();
        let mut typed = Vec::with_capacity(set.len());
        for (name, json) in set {
            let i = column_of(&schema, name)?;
            if i == schema.pk {
                // Even with the current value: a patch names its row by "id" only.
                return Err(TxError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "patch cannot set the primary key {name:?} of table {table_name:?} (\"set\" names it); the row is chosen by \"id\" — to change a key, delete and insert"
                    ),
                ));
            }
            typed.push((i, convert(&schema.columns[i], json)?));
        }
        self.patch_row(&schema, key, &old, &mut typed)
    }

    pub fn delete(
        &mut self,
        table_name: &str,
        id: &Json,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        let table = self.db.table(table_name)?;
        let key = key_from_json(&table.schema, id)?;
        let version = existing_row(table, &key, if_version)?.version;
        let schema = table.schema.clone();
        let bound = change_bytes_bound(table_name, &key, None);
        self.write(&schema, key, None, bound, ChangeOp::Delete, version)
    }

    /// [`TxRef::insert`] (`replace` false) or [`TxRef::upsert`] of a row already decoded
    /// against `schema`, which **must** be the table's current schema (`Arc::ptr_eq`): every
    /// column converted, defaults filled, the key read from the primary-key column, NOT NULL
    /// checked (a typed request decoder does that off the writer thread). Refuses what
    /// depends on the state or the limits exactly as `insert`/`upsert` would.
    pub fn put_decoded(
        &mut self,
        schema: &Arc<TableSchema>,
        key: Key,
        values: Arc<[Value]>,
        if_version: Option<u64>,
        replace: bool,
    ) -> Result<WriteResult, TxError> {
        let table_name = schema.name.as_str();
        let db = &mut *self.db;
        let st = &mut *self.st;
        let Some(table) = db.tables.get_mut(table_name) else {
            return Err(no_table(table_name));
        };
        debug_assert!(
            Arc::ptr_eq(&table.schema, schema),
            "decoded against another schema"
        );
        let row_bytes = row_size(table_name, &values, db.limits.row_bytes_max)?;
        // The row goes in first — one search of the row map, not one to look and one to
        // store — and comes out again if the op is refused (the same checks, in the same
        // order, as looking first).
        let version = st.seq;
        let entry = RowEntry {
            values: values.clone(),
            version,
        };
        let old = table.put(key.clone(), entry);
        let refusal = check_version(table_name, &key, old.as_ref(), if_version)
            .err()
            .or_else(|| {
                (old.is_some() && !replace).then(|| {
                    TxError::new(
                        ErrorCode::AlreadyExists,
                        format!("table {table_name:?} already has a row with key {key}"),
                    )
                })
            })
            .or_else(|| {
                let bound = change_bytes_bound(table_name, &key, Some((values.len(), row_bytes)));
                add_commit_bytes(st, db.limits.commit_bytes_max, bound).err()
            });
        if let Some(e) = refusal {
            match old {
                Some(old) => table.put(key, old),
                None => table.remove(&key),
            };
            return Err(e);
        }
        let op = match old {
            Some(_) => ChangeOp::Update,
            None => ChangeOp::Insert,
        };
        Ok(record(st, schema, key, Some(values), old, op, version))
    }

    /// [`TxRef::patch`] with `set` already decoded against `schema` (the table's current
    /// schema, `Arc::ptr_eq`): `(column position, value)` pairs, never the primary key, each
    /// value fitting its column ([`Value::fits`]; a debug build asserts both). The values are
    /// moved out of `set` (left NULL), so a caller can reuse its buffer. The typed request
    /// decoder and the JavaScript `tx.patch` use it.
    pub fn patch_decoded(
        &mut self,
        schema: &Arc<TableSchema>,
        key: Key,
        set: &mut [(usize, Value)],
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        let (row_bytes_max, commit_bytes_max) = (
            self.db.limits.row_bytes_max,
            self.db.limits.commit_bytes_max,
        );
        let name = schema.name.as_str();
        let table = self.db.tables.get_mut(name).ok_or_else(|| no_table(name))?;
        debug_assert!(
            Arc::ptr_eq(&table.schema, schema),
            "decoded against another schema"
        );
        debug_assert!(set
            .iter()
            .all(|(i, v)| *i != schema.pk && v.fits(schema.columns[*i].ty)));
        if !table.indexes.is_empty() {
            let old = existing_row(table, &key, if_version)?.values.clone();
            return self.patch_row(schema, key, &old, set);
        }
        // No secondary index: the row is found once and replaced where it lies
        // (`CowMap::get_mut`), where the general path looks it up to read it and again to
        // write it. The checks, their order and the undo entry are the general path's
        // ([`TxRef::patch_row`]); on a refusal the row map is as it was (at most the row's
        // chunk stopped sharing its memory with a snapshot).
        let entry = table.rows.get_mut(&key);
        check_version(name, &key, entry.as_deref(), if_version)?;
        let entry = entry.ok_or_else(|| not_found(name, &key))?;
        let values = patched(&entry.values, set);
        check_not_null(schema, &values)?;
        let row_bytes = row_size(name, &values, row_bytes_max)?;
        let bound = change_bytes_bound(name, &key, Some((values.len(), row_bytes)));
        add_commit_bytes(self.st, commit_bytes_max, bound)?;
        let version = self.st.seq;
        let old = std::mem::replace(
            entry,
            RowEntry {
                values: values.clone(),
                version,
            },
        );
        Ok(record(
            self.st,
            schema,
            key,
            Some(values),
            Some(old),
            ChangeOp::Update,
            version,
        ))
    }

    /// The end of every patch, once its row `old` was found: the new row (built in its final
    /// place, one allocation; the last value set for a column wins), NOT NULL, size, write.
    fn patch_row(
        &mut self,
        schema: &Arc<TableSchema>,
        key: Key,
        old: &[Value],
        set: &mut [(usize, Value)],
    ) -> Result<WriteResult, TxError> {
        let values = patched(old, set);
        check_not_null(schema, &values)?;
        let row_bytes = row_size(&schema.name, &values, self.db.limits.row_bytes_max)?;
        let version = self.st.seq;
        let bound = change_bytes_bound(&schema.name, &key, Some((values.len(), row_bytes)));
        self.write(schema, key, Some(values), bound, ChangeOp::Update, version)
    }

    /// [`TxRef::delete`] with the key already decoded against `schema` (the table's current
    /// schema, `Arc::ptr_eq`).
    pub fn delete_decoded(
        &mut self,
        schema: &Arc<TableSchema>,
        key: Key,
        if_version: Option<u64>,
    ) -> Result<WriteResult, TxError> {
        let table = self.db.table(&schema.name)?;
        debug_assert!(
            Arc::ptr_eq(&table.schema, schema),
            "decoded against another schema"
        );
        let version = existing_row(table, &key, if_version)?.version;
        let bound = change_bytes_bound(&schema.name, &key, None);
        self.write(schema, key, None, bound, ChangeOp::Delete, version)
    }

    /// Appends a record with `tags` and `data` to `topic` at append time `ts_us` (raised to
    /// the topic's last append time if the clock went back); returns its offset. The record
    /// is part of this transaction: undone on rollback, visible to others only once committed.
    pub fn append(
        &mut self,
        topic_name: &str,
        tags: Vec<String>,
        data: &Json,
        ts_us: i64,
    ) -> Result<u64, TxError> {
        thread_local! {
            /// Printing buffer reused across appends: the record keeps an exact-size copy
            /// (no growing string shrunk again per record).
            static PRINTED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let text: Box<str> = PRINTED.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            serde_json::to_writer(&mut *buf, data).expect("a JSON value prints");
            std::str::from_utf8(&buf).expect("JSON is UTF-8").into()
        });
        self.append_json_text(topic_name, tags, text, ts_us)
    }

    /// [`TxRef::append`] with `data` already as JSON text (e.g. the raw text of a request,
    /// which then is not parsed into values and printed again). The caller guarantees that
    /// `data` is valid JSON.
    pub fn append_json_text(
        &mut self,
        topic_name: &str,
        tags: Vec<String>,
        data: Box<str>,
        ts_us: i64,
    ) -> Result<u64, TxError> {
        if !self.db.topics.contains_key(topic_name) {
            return Err(TxError::new(
                ErrorCode::NotFound,
                format!("no topic named {topic_name:?}"),
            ));
        }
        let tags = topic::check_tags(tags)?;
        let bytes = topic::new_record_bytes(&tags, &data);
        let max = self.db.limits.record_bytes_max;
        if bytes > max as u64 {
            return Err(TxError::new(
                ErrorCode::Limit,
                format!("a record of topic {topic_name:?} is {bytes} bytes with its tags; record_bytes_max (--max-record-bytes) is {max}"),
            ));
        }
        self.add_commit_bytes(record_bytes_bound(topic_name, &tags, &data))?;
        let seq = self.st.seq;
        let topic = self.db.topics.get_mut(topic_name).expect("looked up above");
        let prev_ts = topic.last_ts_us();
        let tags = tags.iter().map(|t| topic.intern(t)).collect();
        let record = Arc::new(topic::make_record(topic, seq, ts_us, tags, data));
        let offset = record.offset;
        topic.push(record.clone());
        match self.st.appends.last_mut() {
            Some(a) if *a.topic == *topic_name => a.records.push(record),
            _ => {
                self.st.appends.push(Appended {
                    topic: topic.name().clone(),
                    records: vec![record],
                    first_after: 0,
                });
                self.st.appends_prev_ts.push(prev_ts);
            }
        }
        Ok(offset)
    }

    /// Counts `bytes` more against `commit_bytes_max`; past it the transaction is marked
    /// (it must roll back even if its caller carries on).
    fn add_commit_bytes(&mut self, bytes: usize) -> Result<(), TxError> {
        add_commit_bytes(self.st, self.db.limits.commit_bytes_max, bytes)
    }

    /// Writes (`row`) or deletes the row `key` once the op was checked; `bound` is the
    /// change's [`change_bytes_bound`], counted against the commit's size first.
    fn write(
        &mut self,
        schema: &Arc<TableSchema>,
        key: Key,
        row: Option<Arc<[Value]>>,
        bound: usize,
        op: ChangeOp,
        version: u64,
    ) -> Result<WriteResult, TxError> {
        let table_name = schema.name.as_str();
        self.add_commit_bytes(bound)?;
        let table = self
            .db
            .tables
            .get_mut(table_name)
            .expect("checked by caller");
        let old = match &row {
            Some(values) => table.put(
                key.clone(),
                RowEntry {
                    values: values.clone(),
                    version,
                },
            ),
            None => table.remove(&key),
        };
        Ok(record(self.st, schema, key, row, old, op, version))
    }
}

/// Counts `bytes` more of `st` against `max` (`commit_bytes_max`); past it the transaction
/// is marked (it must roll back even if its caller carries on).
fn add_commit_bytes(st: &mut TxState, max: usize, bytes: usize) -> Result<(), TxError> {
    let total = st.commit_bytes.saturating_add(bytes);
    if total > max {
        let e = TxError::new(
            ErrorCode::Limit,
            format!(
                "the transaction's commit would exceed commit_bytes_max (--max-commit-bytes) of {max} bytes (at least {total} bytes after {} changes); nothing was written",
                st.changes.len() + st.appends.iter().map(|a| a.records.len()).sum::<usize>() + 1
            ),
        );
        st.over_limit = Some(e.clone());
        return Err(e);
    }
    st.commit_bytes = total;
    Ok(())
}

/// The encoded size of a row's values, refused past `max` (`row_bytes_max`).
fn row_size(table: &str, values: &[Value], max: usize) -> Result<usize, TxError> {
    let bytes: usize = values.iter().map(Value::encoded_len).sum();
    if bytes > max {
        return Err(TxError::new(
            ErrorCode::Limit,
            format!("row for table {table:?} is {bytes} bytes; row_bytes_max (--max-row-bytes) is {max}"),
        ));
    }
    Ok(bytes)
}

/// The end of every write, once the row map changed (`old` is what it held): the undo
/// entry, the change, the result.
fn record(
    st: &mut TxState,
    schema: &Arc<TableSchema>,
    key: Key,
    row: Option<Arc<[Value]>>,
    old: Option<RowEntry>,
    op: ChangeOp,
    version: u64,
) -> WriteResult {
    st.undo.push(old.as_ref().map(|e| e.version));
    let before = old.map(|e| e.values);
    st.changes.push(Change {
        table: schema.clone(),
        op,
        key: key.clone(),
        row,
        old: before,
        version,
    });
    WriteResult {
        table: schema.clone(),
        key,
        version,
    }
}

fn no_table(name: &str) -> TxError {
    TxError::new(ErrorCode::NotFound, format!("no table named {name:?}"))
}

/// Most bytes a commit record's header takes (record type, seq, change count, topic count).
const COMMIT_HEADER_BYTES_MAX: usize = 1 + 8 + 10 + 10;

/// An upper bound of one appended record's encoded size in a commit record: its topic's
/// name, offset and record count (as if every record opened its own topic run), time, tags
/// and data, each with its largest length prefix.
fn record_bytes_bound(topic: &str, tags: &[String], data: &str) -> usize {
    const VARINT_MAX: usize = 10;
    let tags: usize = tags.iter().map(|t| VARINT_MAX + t.len()).sum();
    4 * VARINT_MAX + topic.len() + VARINT_MAX + VARINT_MAX + tags + VARINT_MAX + data.len()
}

/// An upper bound of one change's encoded size in a commit record (`codec::encode_commit`):
/// table name, op, version, key and values, each with its largest length prefix. `row` is
/// the row's (value count, encoded size of its values), `None` for a delete.
fn change_bytes_bound(table: &str, key: &Key, row: Option<(usize, usize)>) -> usize {
    const VARINT_MAX: usize = 10;
    // As `key.to_value().encoded_len()`, without making the value.
    let key_len = match key {
        Key::Int(_) => Value::Integer(0).encoded_len(),
        Key::Text(s) => 5 + s.len(),
    };
    let values: usize = row.map_or(0, |(n, bytes)| VARINT_MAX + bytes + 2 * n);
    VARINT_MAX + table.len() + 1 + VARINT_MAX + key_len + 2 + values
}

fn column_of(schema: &TableSchema, name: &str) -> Result<usize, TxError> {
    schema
        .column(name)
        .ok_or_else(|| TxError::schema(format!("table {:?} has no column {name:?}", schema.name)))
}

fn convert(col: &ColumnDef, json: &Json) -> Result<Value, TxError> {
    Value::from_json(col.ty, json)
        .map_err(|e| TxError::schema(format!("column {:?}: {e}", col.name)))
}

fn check_not_null(schema: &TableSchema, values: &[Value]) -> Result<(), TxError> {
    for (c, v) in schema.columns.iter().zip(values) {
        if c.not_null && v.is_null() {
            return Err(TxError::schema(format!(
                "column {:?} of table {:?} is NOT NULL",
                c.name, schema.name
            )));
        }
    }
    Ok(())
}

fn check_version(
    table: &str,
    key: &Key,
    existing: Option<&RowEntry>,
    if_version: Option<u64>,
) -> Result<(), TxError> {
    if let Some(expected) = if_version {
        let actual = existing.map_or(0, |r| r.version);
        if actual != expected {
            return Err(TxError::new(
                ErrorCode::Conflict,
                format!("row {key} of table {table:?} is at version {actual}, not {expected}"),
            ));
        }
    }
    Ok(())
}

/// The row `key` of `table` for an op that needs it to exist (patch, delete): `if_version`
/// checked first (`conflict`), then `not_found`.
fn existing_row<'t>(
    table: &'t Table,
    key: &Key,
    if_version: Option<u64>,
) -> Result<&'t RowEntry, TxError> {
    let name = table.schema.name.as_str();
    let existing = table.rows.get(key);
    check_version(name, key, existing, if_version)?;
    existing.ok_or_else(|| not_found(name, key))
}

/// Row `old` with the columns of `set` replaced (built in its final place, one allocation;
/// the last value set for a column wins; the values set are taken out of `set`).
fn patched(old: &[Value], set: &mut [(usize, Value)]) -> Arc<[Value]> {
    old.iter()
        .enumerate()
        .map(|(i, v)| match set.iter_mut().rfind(|(c, _)| *c == i) {
            Some((_, new)) => std::mem::replace(new, Value::Null),
            None => v.clone(),
        })
        .collect()
}

fn not_found(table: &str, key: &Key) -> TxError {
    TxError::new(
        ErrorCode::NotFound,
        format!("table {table:?} has no row with key {key}"),
    )
}

/// Reads a primary key given as JSON (`"id"` of patch and delete).
pub fn key_from_json(schema: &TableSchema, id: &Json) -> Result<Key, TxError> {
    let pk = schema.pk_column();
    let value = Value::from_json(pk.ty, id)
        .map_err(|e| TxError::schema(format!("id for table {:?}: {e}", schema.name)))?;
    Key::from_value(&value)
        .ok_or_else(|| TxError::schema(format!("id for table {:?} must not be null", schema.name)))
}
