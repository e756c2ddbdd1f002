//! Bytes of log records and snapshot frames. Layouts are documented in
//! `docs/formats.md`; integers are little-endian, lengths and counts are LEB128 varints,
//! signed integers zigzag-encoded varints.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cow::CowMapBuilder;
use crate::db::{ChangeOp, Commit, CommitBody, Db, ReplayBody, ReplayRow, TopicChange};
use crate::schema::{ColumnDef, IndexDef, PolicyCommand, PolicyDef, SchemaChange, TableSchema};
use crate::table::{RowEntry, Table};
use crate::topic::{check_tag, check_topic_name, Appended, Record, Topic, TopicConfig, TopicRules};
use crate::value::{ColumnType, Key, Value};

pub const RECORD_ROWS: u8 = 1;
pub const RECORD_SCHEMA: u8 = 2;
/// Row changes and topic appends of one transaction.
pub const RECORD_TX: u8 = 3;
/// A topic created, changed or dropped.
pub const RECORD_TOPIC: u8 = 4;
/// [`RECORD_ROWS`] with packed rows (see [`ROW_HEAD_OP`]): what is written now; kinds 1
/// and 3 (unpacked) are still read.
pub const RECORD_ROWS_PACKED: u8 = 5;
/// [`RECORD_TX`] with packed rows.
pub const RECORD_TX_PACKED: u8 = 6;

/// A packed row starts with one head byte. Its low two bits are the op (0 insert, 1 update,
/// 2 delete); the flags above say which fields follow, so that what every row of a commit
/// would repeat is left out: the table's name (written when it differs from the previous
/// row's), the version (written when it is not the commit's seq, as it is for every insert
/// and update) and the key (written when it is not the row's first value, as it is when the
/// primary key is the first column).
pub const ROW_HEAD_OP: u8 = 0b11;
/// The table's name follows (always on a commit's first row).
pub const ROW_NAMES_TABLE: u8 = 1 << 2;
/// The version follows; without it the version is the commit's seq.
pub const ROW_HAS_VERSION: u8 = 1 << 3;
/// The key follows; without it the key is the row's first value (never for a delete).
pub const ROW_HAS_KEY: u8 = 1 << 4;
const ROW_HEAD_BITS: u8 = ROW_HEAD_OP | ROW_NAMES_TABLE | ROW_HAS_VERSION | ROW_HAS_KEY;

pub const SNAP_SCHEMA: u8 = 1;
/// Rows with a seq beside each version (always equal to it): what snapshots held before
/// [`SNAP_ROWS_PACKED`]; still read.
pub const SNAP_ROWS: u8 = 2;
pub const SNAP_END: u8 = 3;
/// A topic's name, retention, offsets and last append time.
pub const SNAP_TOPIC: u8 = 4;
/// A run of a topic's records.
pub const SNAP_RECORDS: u8 = 5;
/// A table's row policies.
pub const SNAP_POLICIES: u8 = 6;
/// Rows, each with its version only (the row's last writer's seq, which [`SNAP_ROWS`] wrote
/// twice).
pub const SNAP_ROWS_PACKED: u8 = 7;

const TOPIC_PUT: u8 = 1;
const TOPIC_DROP: u8 = 2;
const TOPIC_TRIM: u8 = 3;
const TOPIC_RULES: u8 = 4;

/// Largest seq or row version a record may carry. Both count up by one per commit from 0,
/// so nothing real comes near; a larger value read back is damage, refused here so that
/// `seq + 1` and `version + 1` can never overflow later.
pub const COUNTER_MAX: u64 = i64::MAX as u64;

/// Items a decoder reserves room for up front, whatever count the bytes claim.
const DECODE_RESERVE_MAX: usize = 1024;

/// A snapshot rows frame is closed once its payload passes this size.
pub const SNAP_FRAME_BYTES_TARGET: usize = 1 << 20;

const TAG_NULL: u8 = 0;
const TAG_INTEGER: u8 = 1;
const TAG_REAL: u8 = 2;
const TAG_FALSE: u8 = 3;
const TAG_TRUE: u8 = 4;
const TAG_TEXT: u8 = 5;
const TAG_BLOB: u8 = 6;
const TAG_JSON: u8 = 7;
const TAG_TIMESTAMP: u8 = 8;

const SCHEMA_CREATE_TABLE: u8 = 1;
const SCHEMA_CREATE_INDEX: u8 = 2;
const SCHEMA_DROP_TABLE: u8 = 3;
const SCHEMA_ADD_COLUMN: u8 = 4;
const SCHEMA_CREATE_POLICY: u8 = 5;
const SCHEMA_DROP_POLICY: u8 = 6;

// ---------------------------------------------------------------------------------------
// Writing

pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u64_fixed(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    pub fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.u8(TAG_NULL),
            Value::Integer(i) => {
                self.u8(TAG_INTEGER);
                self.zigzag(*i)
            }
            Value::Real(r) => {
                self.u8(TAG_REAL);
                self.0.extend_from_slice(&r.to_le_bytes())
            }
            Value::Boolean(false) => self.u8(TAG_FALSE),
            Value::Boolean(true) => self.u8(TAG_TRUE),
            Value::Text(s) => {
                self.u8(TAG_TEXT);
                self.str(s)
            }
            Value::Blob(b) => {
                self.u8(TAG_BLOB);
                self.bytes(b)
            }
            Value::Json(s) => {
                self.u8(TAG_JSON);
                self.str(s)
            }
            Value::Timestamp(t) => {
                self.u8(TAG_TIMESTAMP);
                self.zigzag(*t)
            }
        }
    }
    pub fn key(&mut self, k: &Key) {
        self.value(&k.to_value());
    }
    fn column(&mut self, c: &ColumnDef) {
        self.str(&c.name);
        self.u8(c.ty.code());
        self.u8(c.not_null as u8);
        match &c.default {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.value(v)
            }
        }
    }
    fn policy(&mut self, p: &PolicyDef) {
        self.str(&p.name);
        self.u8(p.command.code());
        for text in [&p.using, &p.check] {
            match text {
                None => self.u8(0),
                Some(t) => {
                    self.u8(1);
                    self.str(t);
                }
            }
        }
    }

    fn table_schema(&mut self, s: &TableSchema) {
        self.str(&s.name);
        self.varint(s.columns.len() as u64);
        for c in &s.columns {
            self.column(c);
        }
        self.varint(s.pk as u64);
        self.varint(s.indexes.len() as u64);
        for ix in &s.indexes {
            self.str(&ix.name);
            self.varint(ix.columns.len() as u64);
            for &c in &ix.columns {
                self.varint(c as u64);
            }
        }
    }
}

/// Encodes a commit as a log record payload.
pub fn encode_commit(commit: &Commit, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    match &commit.body {
        CommitBody::Rows(changes) => {
            w.u8(if commit.appends.is_empty() {
                RECORD_ROWS_PACKED
            } else {
                RECORD_TX_PACKED
            });
            w.u64_fixed(commit.seq);
            w.varint(changes.len() as u64);
            let mut last_table: Option<&str> = None;
            for c in changes {
                let names_table = last_table != Some(c.table.name.as_str());
                let has_version = c.version != commit.seq;
                let key_is_first_value = match (&c.key, c.row.as_ref().and_then(|r| r.first())) {
                    (Key::Int(k), Some(Value::Integer(v))) => k == v,
                    (Key::Text(k), Some(Value::Text(v))) => k == v,
                    _ => false,
                };
                let mut head = match c.op {
                    ChangeOp::Insert => 0,
                    ChangeOp::Update => 1,
                    ChangeOp::Delete => 2,
                };
                if names_table {
                    head |= ROW_NAMES_TABLE;
                }
                if has_version {
                    head |= ROW_HAS_VERSION;
                }
                if !key_is_first_value {
                    head |= ROW_HAS_KEY;
                }
                w.u8(head);
                if names_table {
                    w.str(&c.table.name);
                    last_table = Some(&c.table.name);
                }
                if has_version {
                    w.varint(c.version);
                }
                if !key_is_first_value {
                    w.key(&c.key);
                }
                if let Some(values) = &c.row {
                    w.varint(values.len() as u64);
                    for v in values.iter() {
                        w.value(v);
                    }
                }
            }
            if !commit.appends.is_empty() {
                w.varint(commit.appends.len() as u64);
                for a in &commit.appends {
                    w.str(&a.topic);
                    w.varint(a.records.first().map_or(0, |r| r.offset));
                    w.varint(a.records.len() as u64);
                    for r in &a.records {
                        w.record_body(r);
                    }
                    w.varint(a.first_after);
                }
            }
        }
        CommitBody::Topic(change) => {
            w.u8(RECORD_TOPIC);
            w.u64_fixed(commit.seq);
            match change {
                TopicChange::Put {
                    name,
                    config,
                    created,
                } => {
                    w.u8(TOPIC_PUT);
                    w.str(name);
                    w.topic_config(config);
                    w.u8(u8::from(*created));
                }
                TopicChange::Rules { name, rules } => {
                    w.u8(TOPIC_RULES);
                    w.str(name);
                    w.topic_rules(rules);
                }
                TopicChange::Drop { name } => {
                    w.u8(TOPIC_DROP);
                    w.str(name);
                }
                TopicChange::Trim { name, first } => {
                    w.u8(TOPIC_TRIM);
                    w.str(name);
                    w.varint(*first);
                }
            }
        }
        CommitBody::Schema { changes, sql } => {
            w.u8(RECORD_SCHEMA);
            w.u64_fixed(commit.seq);
            w.str(sql);
            w.varint(changes.len() as u64);
            for change in changes {
                w.schema_change(change);
            }
        }
    }
}

impl Writer<'_> {
    fn topic_rules(&mut self, rules: &TopicRules) {
        for list in [&rules.read, &rules.append] {
            self.varint(list.len() as u64);
            for p in list {
                self.str(p);
            }
        }
    }

    fn topic_config(&mut self, c: &TopicConfig) {
        self.varint(c.retain_records);
        self.varint(c.retain_bytes);
        self.varint(c.retain_secs);
    }

    /// A record without its offset (implied by its run) and seq (its commit's).
    fn record_body(&mut self, r: &Record) {
        self.zigzag(r.ts_us);
        self.varint(r.tags.len() as u64);
        for t in r.tags.iter() {
            self.str(t);
        }
        self.str(&r.data);
    }

    fn schema_change(&mut self, change: &SchemaChange) {
        let w = self;
        {
            match change {
                SchemaChange::CreateTable {
                    schema,
                    if_not_exists,
                } => {
                    w.u8(SCHEMA_CREATE_TABLE);
                    w.u8(*if_not_exists as u8);
                    w.table_schema(schema);
                }
                SchemaChange::CreateIndex {
                    table,
                    name,
                    columns,
                    if_not_exists,
                } => {
                    w.u8(SCHEMA_CREATE_INDEX);
                    w.u8(*if_not_exists as u8);
                    w.str(table);
                    w.str(name);
                    w.varint(columns.len() as u64);
                    for c in columns {
                        w.str(c);
                    }
                }
                SchemaChange::DropTable { name, if_exists } => {
                    w.u8(SCHEMA_DROP_TABLE);
                    w.u8(*if_exists as u8);
                    w.str(name);
                }
                SchemaChange::AddColumn { table, column } => {
                    w.u8(SCHEMA_ADD_COLUMN);
                    w.str(table);
                    w.column(column);
                }
                SchemaChange::CreatePolicy { table, policy } => {
                    w.u8(SCHEMA_CREATE_POLICY);
                    w.str(table);
                    w.policy(policy);
                }
                SchemaChange::DropPolicy {
                    table,
                    name,
                    if_exists,
                } => {
                    w.u8(SCHEMA_DROP_POLICY);
                    w.u8(*if_exists as u8);
                    w.str(table);
                    w.str(name);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

pub type DecodeResult<T> = Result<T, String>;

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn take(&mut self, n: usize) -> DecodeResult<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(format!("record ends early at byte {}", self.pos));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> DecodeResult<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u64_fixed(&mut self) -> DecodeResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    #[inline]
    pub fn varint(&mut self) -> DecodeResult<u64> {
        // Most varints (lengths, tags' payloads, small counters) are one byte.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(b as u64);
            }
        }
        self.varint_long()
    }

    #[inline(never)]
    fn varint_long(&mut self) -> DecodeResult<u64> {
        let mut v = 0u64;
        let mut shift = 0;
        while shift < 64 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("record ends early at byte {}", self.pos));
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
        }
        Err("varint too long".into())
    }
    /// Room to reserve for `n` decoded items: a count is checked only against the bytes
    /// left, and a decoded item is many times larger than its smallest encoding, so a
    /// damaged count must not size an allocation by itself (growth amortises the rest).
    pub fn reserve(n: usize) -> usize {
        n.min(DECODE_RESERVE_MAX)
    }
    /// Room to reserve for `n` decoded items of `item_bytes` each, up to twice the bytes
    /// left: bounded by the record's size, not by a count alone. For snapshot frames
    /// (~1 MiB, thousands of rows), where capping at [`Reader::reserve`] grew each frame's
    /// row vec three times, into fresh memory each time (~4 % of the CPU of loading a
    /// snapshot).
    fn reserve_within_input(&self, n: usize, item_bytes: usize) -> usize {
        n.min(2 * (self.buf.len() - self.pos) / item_bytes.max(1))
    }
    pub fn len(&mut self) -> DecodeResult<usize> {
        let n = self.varint()?;
        if n as usize > self.buf.len() - self.pos {
            return Err(format!("implausible length {n}"));
        }
        Ok(n as usize)
    }
    /// A seq or version: a varint no larger than [`COUNTER_MAX`].
    pub fn counter(&mut self, what: &str) -> DecodeResult<u64> {
        let v = self.varint()?;
        if v > COUNTER_MAX {
            return Err(format!("implausible {what} {v}"));
        }
        Ok(v)
    }
    pub fn zigzag(&mut self) -> DecodeResult<i64> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    pub fn bytes(&mut self) -> DecodeResult<&'a [u8]> {
        let n = self.varint()? as usize;
        self.take(n)
    }
    pub fn string(&mut self) -> DecodeResult<String> {
        self.str_ref().map(str::to_owned)
    }
    /// The next text, borrowed from the input (checked UTF-8): a value is built from it
    /// with one allocation of its own size.
    pub fn str_ref(&mut self) -> DecodeResult<&'a str> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| "invalid UTF-8 text".to_string())
    }
    pub fn value(&mut self) -> DecodeResult<Value> {
        Ok(match self.u8()? {
            TAG_NULL => Value::Null,
            TAG_INTEGER => Value::Integer(self.zigzag()?),
            TAG_REAL => Value::Real(f64::from_le_bytes(self.take(8)?.try_into().expect("8"))),
            TAG_FALSE => Value::Boolean(false),
            TAG_TRUE => Value::Boolean(true),
            TAG_TEXT => Value::Text(self.str_ref()?.into()),
            TAG_BLOB => Value::Blob(self.bytes()?.into()),
            TAG_JSON => Value::Json(self.str_ref()?.into()),
            TAG_TIMESTAMP => Value::Timestamp(self.zigzag()?),
            t => return Err(format!("unknown value tag {t}")),
        })
    }
    pub fn key(&mut self) -> DecodeResult<Key> {
        // The two key types straight into their key (no value decoded, then cloned).
        match self.buf.get(self.pos) {
            Some(&TAG_INTEGER) => {
                self.pos += 1;
                return Ok(Key::Int(self.zigzag()?));
            }
            Some(&TAG_TEXT) => {
                self.pos += 1;
                return Ok(Key::Text(self.str_ref()?.into()));
            }
            _ => {}
        }
        let v = self.value()?;
        Key::from_value(&v).ok_or_else(|| format!("bad key value {v:?}"))
    }

    /// `n` values decoded straight into one exact-size `Arc<[Value]>` through `scratch`
    /// (a buffer reused across rows): one allocation per row, no growth, no copy.
    pub fn row_values(
        &mut self,
        n: usize,
        scratch: &mut Vec<Value>,
    ) -> DecodeResult<std::sync::Arc<[Value]>> {
        if n <= DECODE_RESERVE_MAX {
            // Decoded straight into the row's own allocation: `(0..n).map(..)` has an exact
            // length, so the `Arc` is allocated once and each value written once (through a
            // `Vec` it was written twice: 7 % of replay's CPU). After an error the rest are
            // `Null` without reading, and the row is dropped.
            let mut failed = None;
            let row: std::sync::Arc<[Value]> = (0..n)
                .map(|_| match failed {
                    Some(_) => Value::Null,
                    None => self.value().unwrap_or_else(|e| {
                        failed = Some(e);
                        Value::Null
                    }),
                })
                .collect();
            return match failed {
                None => Ok(row),
                Some(e) => Err(e),
            };
        }
        scratch.clear();
        scratch.reserve(Self::reserve(n));
        for _ in 0..n {
            scratch.push(self.value()?);
        }
        Ok(scratch.drain(..).collect())
    }

    /// Whether the next values are exactly `stored` (same types, same bits), read without
    /// allocating. On `false` or an error the position is wherever the reading stopped.
    fn values_match(&mut self, stored: &[Value]) -> DecodeResult<bool> {
        for v in stored {
            let same = match (self.u8()?, v) {
                (TAG_NULL, Value::Null)
                | (TAG_FALSE, Value::Boolean(false))
                | (TAG_TRUE, Value::Boolean(true)) => true,
                (TAG_INTEGER, Value::Integer(i)) | (TAG_TIMESTAMP, Value::Timestamp(i)) => {
                    self.zigzag()? == *i
                }
                (TAG_REAL, Value::Real(x)) => self.take(8)? == x.to_le_bytes(),
                (TAG_TEXT, Value::Text(s)) | (TAG_JSON, Value::Json(s)) => {
                    self.bytes()? == s.as_bytes()
                }
                (TAG_BLOB, Value::Blob(b)) => self.bytes()? == &b[..],
                _ => false,
            };
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A table name, shared with the previous row's when the bytes are the same (rows of
    /// one commit mostly name one table): no allocation per row.
    fn table_name(
        &mut self,
        last: &mut Option<std::sync::Arc<str>>,
    ) -> DecodeResult<std::sync::Arc<str>> {
        let b = self.bytes()?;
        if let Some(t) = last.as_ref().filter(|t| t.as_bytes() == b) {
            return Ok(t.clone());
        }
        let t: std::sync::Arc<str> = std::str::from_utf8(b)
            .map_err(|_| "invalid UTF-8 text".to_string())?
            .into();
        *last = Some(t.clone());
        Ok(t)
    }
    fn column(&mut self) -> DecodeResult<ColumnDef> {
        let name = self.string()?;
        let ty = ColumnType::from_code(self.u8()?).ok_or("unknown column type")?;
        let not_null = self.u8()? != 0;
        let default = match self.u8()? {
            0 => None,
            _ => Some(self.value()?),
        };
        Ok(ColumnDef {
            name,
            ty,
            not_null,
            default,
        })
    }
    fn table_schema(&mut self) -> DecodeResult<TableSchema> {
        let name = self.string()?;
        let n = self.len()?;
        let columns = (0..n)
            .map(|_| self.column())
            .collect::<DecodeResult<Vec<_>>>()?;
        let pk = self.varint()? as usize;
        let n_ix = self.len()?;
        let mut indexes = Vec::with_capacity(Self::reserve(n_ix));
        for _ in 0..n_ix {
            let name = self.string()?;
            let n = self.len()?;
            let cols = (0..n)
                .map(|_| self.varint().map(|c| c as usize))
                .collect::<DecodeResult<Vec<_>>>()?;
            if cols.iter().any(|&c| c >= columns.len()) {
                return Err("index column out of range".into());
            }
            indexes.push(IndexDef {
                name,
                columns: cols,
            });
        }
        if pk >= columns.len() {
            return Err("primary key column out of range".into());
        }
        Ok(TableSchema {
            name,
            columns,
            pk,
            indexes,
        })
    }
}

/// Decodes a log record payload into its seq and body.
pub fn decode_commit(payload: &[u8]) -> DecodeResult<(u64, ReplayBody)> {
    decode_commit_with(payload, None)
}

/// [`decode_commit`] for a commit the state already holds (at or before a loaded snapshot,
/// decoded only for the changelog window): a row whose values are exactly those stored
/// under its key in `tables` shares that row's storage instead of being allocated again
/// (the window then costs no second copy of the rows it mentions). The result is equal to
/// [`decode_commit`]'s, errors included.
pub fn decode_commit_sharing(
    payload: &[u8],
    tables: &BTreeMap<String, Table>,
) -> DecodeResult<(u64, ReplayBody)> {
    decode_commit_with(payload, Some(tables))
}

fn decode_commit_with(
    payload: &[u8],
    tables: Option<&BTreeMap<String, Table>>,
) -> DecodeResult<(u64, ReplayBody)> {
    let mut r = Reader::new(payload);
    let kind = r.u8()?;
    let seq = r.u64_fixed()?;
    if seq == 0 || seq > COUNTER_MAX {
        return Err(format!("implausible seq {seq}"));
    }
    let body = match kind {
        RECORD_ROWS | RECORD_TX | RECORD_ROWS_PACKED | RECORD_TX_PACKED => {
            let packed = matches!(kind, RECORD_ROWS_PACKED | RECORD_TX_PACKED);
            let n = r.len()?;
            let mut rows = Vec::with_capacity(Reader::reserve(n));
            let mut scratch = Vec::new();
            let mut last_table = None;
            for _ in 0..n {
                // An unpacked row is a packed one with every field present, its op in a
                // byte of its own after the table's name.
                let head = if packed {
                    let head = r.u8()?;
                    if head & !ROW_HEAD_BITS != 0 {
                        return Err(format!("unknown row head bits {head:#010b}"));
                    }
                    head
                } else {
                    ROW_NAMES_TABLE | ROW_HAS_VERSION | ROW_HAS_KEY
                };
                let table = if head & ROW_NAMES_TABLE != 0 {
                    r.table_name(&mut last_table)?
                } else {
                    last_table
                        .clone()
                        .ok_or("a commit's first row does not name its table")?
                };
                let op = match if packed { head & ROW_HEAD_OP } else { r.u8()? } {
                    0 => ChangeOp::Insert,
                    1 => ChangeOp::Update,
                    2 => ChangeOp::Delete,
                    o => return Err(format!("unknown change op {o}")),
                };
                let version = if head & ROW_HAS_VERSION != 0 {
                    r.counter("version")?
                } else {
                    seq
                };
                let mut key = if head & ROW_HAS_KEY != 0 {
                    Some(r.key()?)
                } else {
                    None
                };
                let values = if op == ChangeOp::Delete {
                    None
                } else {
                    let n = r.len()?;
                    // A key left out is the first value: read it there, then the values
                    // from their start.
                    if key.is_none() {
                        if n == 0 {
                            return Err("a row without values or key".into());
                        }
                        let at = r.pos;
                        key = Some(r.key()?);
                        r.pos = at;
                    }
                    let stored = tables
                        .and_then(|ts| ts.get(&*table))
                        .and_then(|t| key.as_ref().and_then(|k| t.rows.get(k)))
                        .map(|e| &e.values)
                        .filter(|v| v.len() == n);
                    let at = r.pos;
                    match stored {
                        Some(stored) if r.values_match(stored) == Ok(true) => Some(stored.clone()),
                        _ => {
                            r.pos = at;
                            Some(r.row_values(n, &mut scratch)?)
                        }
                    }
                };
                let key = key.ok_or("a delete without its key")?;
                rows.push(ReplayRow {
                    table,
                    op,
                    key,
                    values,
                    version,
                });
            }
            if matches!(kind, RECORD_ROWS | RECORD_ROWS_PACKED) {
                ReplayBody::Rows(rows)
            } else {
                let n = r.len()?;
                let mut appends = Vec::with_capacity(Reader::reserve(n));
                for _ in 0..n {
                    let topic = r.string()?;
                    check_topic_name(&topic).map_err(|e| e.message)?;
                    let first = r.counter("offset")?;
                    let count = r.len()?;
                    let mut records = Vec::with_capacity(Reader::reserve(count));
                    for i in 0..count as u64 {
                        let offset = first
                            .checked_add(i)
                            .filter(|o| *o <= COUNTER_MAX)
                            .ok_or("implausible offset")?;
                        records.push(Arc::new(r.record_body(offset, seq)?));
                    }
                    if records.is_empty() {
                        return Err(format!("an empty run of records for topic {topic:?}"));
                    }
                    let first_after = r.counter("offset")?;
                    appends.push(Appended {
                        topic: topic.into(),
                        records,
                        first_after,
                    });
                }
                if appends.is_empty() {
                    return Err("a transaction record without appends".into());
                }
                ReplayBody::Tx { rows, appends }
            }
        }
        RECORD_TOPIC => {
            let change = match r.u8()? {
                TOPIC_PUT => TopicChange::Put {
                    name: r.string()?,
                    config: r.topic_config()?,
                    created: match r.u8()? {
                        0 => false,
                        1 => true,
                        b => return Err(format!("bad created flag {b}")),
                    },
                },
                TOPIC_DROP => TopicChange::Drop { name: r.string()? },
                TOPIC_RULES => TopicChange::Rules {
                    name: r.string()?,
                    rules: r.topic_rules()?,
                },
                TOPIC_TRIM => TopicChange::Trim {
                    name: r.string()?,
                    first: r.counter("offset")?,
                },
                k => return Err(format!("unknown topic change {k}")),
            };
            ReplayBody::Topic(change)
        }
        RECORD_SCHEMA => {
            let sql = r.string()?;
            let n = r.len()?;
            let changes = (0..n)
                .map(|_| r.schema_change())
                .collect::<DecodeResult<Vec<_>>>()?;
            ReplayBody::Schema { changes, sql }
        }
        k => return Err(format!("unknown record kind {k}")),
    };
    if !r.is_empty() {
        return Err("trailing bytes after record".into());
    }
    Ok((seq, body))
}

impl Reader<'_> {
    fn topic_rules(&mut self) -> DecodeResult<TopicRules> {
        let mut list = || -> DecodeResult<Vec<String>> {
            let n = self.len()?;
            (0..n).map(|_| self.string()).collect()
        };
        let read = list()?;
        let append = list()?;
        Ok(TopicRules { read, append })
    }

    fn topic_config(&mut self) -> DecodeResult<TopicConfig> {
        Ok(TopicConfig {
            retain_records: self.varint()?,
            retain_bytes: self.varint()?,
            retain_secs: self.varint()?,
        })
    }

    fn record_body(&mut self, offset: u64, seq: u64) -> DecodeResult<Record> {
        let ts_us = self.zigzag()?;
        let n = self.len()?;
        if n > crate::topic::TAGS_PER_RECORD_MAX {
            return Err(format!("a record with {n} tags"));
        }
        let mut tags = Vec::with_capacity(n);
        for _ in 0..n {
            let t = self.string()?;
            check_tag(&t).map_err(|e| e.message)?;
            tags.push(std::sync::Arc::<str>::from(t));
        }
        let data = self.string()?;
        // The same check as an append's: the data must parse as a value (not just as JSON
        // syntax), so every reader can serve it.
        if serde_json::from_str::<serde_json::Value>(&data).is_err() {
            return Err("a record whose data is not JSON".into());
        }
        Ok(Record {
            offset,
            ts_us,
            seq,
            tags: tags.into_boxed_slice(),
            data: data.into_boxed_str(),
        })
    }

    fn policy(&mut self) -> DecodeResult<PolicyDef> {
        let name = self.string()?;
        let code = self.u8()?;
        let command = PolicyCommand::from_code(code)
            .ok_or_else(|| format!("unknown policy command {code}"))?;
        let mut text = || -> DecodeResult<Option<String>> {
            match self.u8()? {
                0 => Ok(None),
                1 => Ok(Some(self.string()?)),
                k => Err(format!("bad policy predicate marker {k}")),
            }
        };
        let using = text()?;
        let check = text()?;
        Ok(PolicyDef {
            name,
            command,
            using,
            check,
        })
    }

    fn schema_change(&mut self) -> DecodeResult<SchemaChange> {
        let r = self;
        {
            let change = match r.u8()? {
                SCHEMA_CREATE_TABLE => {
                    let if_not_exists = r.u8()? != 0;
                    SchemaChange::CreateTable {
                        if_not_exists,
                        schema: r.table_schema()?,
                    }
                }
                SCHEMA_CREATE_INDEX => {
                    let if_not_exists = r.u8()? != 0;
                    let table = r.string()?;
                    let name = r.string()?;
                    let n = r.len()?;
                    let columns = (0..n).map(|_| r.string()).collect::<DecodeResult<_>>()?;
                    SchemaChange::CreateIndex {
                        table,
                        name,
                        columns,
                        if_not_exists,
                    }
                }
                SCHEMA_DROP_TABLE => {
                    let if_exists = r.u8()? != 0;
                    SchemaChange::DropTable {
                        name: r.string()?,
                        if_exists,
                    }
                }
                SCHEMA_ADD_COLUMN => SchemaChange::AddColumn {
                    table: r.string()?,
                    column: r.column()?,
                },
                SCHEMA_CREATE_POLICY => SchemaChange::CreatePolicy {
                    table: r.string()?,
                    policy: r.policy()?,
                },
                SCHEMA_DROP_POLICY => {
                    let if_exists = r.u8()? != 0;
                    SchemaChange::DropPolicy {
                        table: r.string()?,
                        name: r.string()?,
                        if_exists,
                    }
                }
                k => return Err(format!("unknown schema change kind {k}")),
            };
            Ok(change)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Snapshots

/// The state a snapshot encodes, frozen at one seq: taken on the writer thread under the
/// read lock in O(tables + row chunks + topic records) — the row maps are copy-on-write
/// clones ([`crate::cow::CowMap`]), topic records are `Arc`s — and encoded on the snapshot
/// thread while writes go on. Until it is dropped it keeps alive the row chunks the writer
/// has copied since (at most one copy of the rows it froze).
pub struct FrozenState {
    /// Seq of the last commit the state includes.
    pub seq: u64,
    tables: Vec<FrozenTable>,
    topics: Vec<FrozenTopic>,
}

struct FrozenTable {
    schema: Arc<TableSchema>,
    policies: Vec<PolicyDef>,
    rows: crate::cow::CowMap<Key, RowEntry>,
}

struct FrozenTopic {
    name: Arc<str>,
    config: TopicConfig,
    first: u64,
    next: u64,
    rules: Arc<TopicRules>,
    records: Vec<Arc<Record>>,
}

impl FrozenState {
    /// Freezes `db` as it is now (see [`FrozenState`] for the cost).
    pub fn of(db: &Db) -> FrozenState {
        FrozenState {
            seq: db.seq,
            tables: db
                .tables
                .values()
                .map(|t| FrozenTable {
                    schema: t.schema.clone(),
                    policies: t.policies.clone(),
                    rows: t.rows.clone(),
                })
                .collect(),
            topics: db
                .topics
                .values()
                .map(|t| FrozenTopic {
                    name: t.name().clone(),
                    config: t.config(),
                    first: t.first(),
                    next: t.next(),
                    rules: t.rules().clone(),
                    records: t.records().cloned().collect(),
                })
                .collect(),
        }
    }

    /// Rows across all tables.
    pub fn row_count(&self) -> usize {
        self.tables.iter().map(|t| t.rows.len()).sum()
    }
}

/// Encodes the whole of `db` as snapshot body frames (see `docs/formats.md`); the same
/// bytes as [`encode_frozen`] of [`FrozenState::of`]`(db)`.
pub fn encode_snapshot(db: &Db) -> Vec<Vec<u8>> {
    encode_frozen(&FrozenState::of(db))
}

/// Encodes a frozen state as snapshot body frames (see `docs/formats.md`), one buffer per
/// frame (~1 MiB each), so a large state is never copied into one ever-growing buffer.
pub fn encode_frozen(state: &FrozenState) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    encode_frozen_to(state, |frame| {
        out.push(frame.to_vec());
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_else(|never| match never {});
    out
}

/// Encodes a frozen state as snapshot body frames (the bytes of [`encode_frozen`]) and
/// hands each whole frame (~1 MiB at most for rows and records) to `sink` as it is made,
/// through one reused buffer: the snapshot thread streams them to the file, so the
/// encoded state never exists in memory as a whole. Stops at `sink`'s first error.
pub fn encode_frozen_to<E>(
    state: &FrozenState,
    mut sink: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut payload = Vec::new();
    let mut framed = Vec::new();
    let mut emit = |payload: &[u8]| {
        framed.clear();
        sluice_log::frame::encode_into(&mut framed, payload).expect("snapshot frames are bounded");
        sink(&framed)
    };
    {
        let mut w = Writer(&mut payload);
        w.u8(SNAP_SCHEMA);
        w.varint(state.tables.len() as u64);
        for t in state.tables.iter() {
            w.table_schema(&t.schema);
        }
    }
    emit(&payload)?;
    for t in state.tables.iter().filter(|t| !t.policies.is_empty()) {
        payload.clear();
        let mut w = Writer(&mut payload);
        w.u8(SNAP_POLICIES);
        w.str(&t.schema.name);
        w.varint(t.policies.len() as u64);
        for p in &t.policies {
            w.policy(p);
        }
        emit(&payload)?;
    }
    let mut total_rows = 0u64;
    let mut body = Vec::with_capacity(SNAP_FRAME_BYTES_TARGET + 4096);
    for t in state.tables.iter() {
        let mut rows = t.rows.iter().peekable();
        while rows.peek().is_some() {
            body.clear();
            let mut n = 0u64;
            {
                let mut w = Writer(&mut body);
                for (key, row) in rows.by_ref() {
                    encode_snapshot_row(&mut w, key, row);
                    n += 1;
                    if w.0.len() >= SNAP_FRAME_BYTES_TARGET {
                        break;
                    }
                }
            }
            payload.clear();
            let mut w = Writer(&mut payload);
            w.u8(SNAP_ROWS_PACKED);
            w.str(&t.schema.name);
            w.varint(n);
            payload.extend_from_slice(&body);
            emit(&payload)?;
            total_rows += n;
        }
    }
    let mut total_records = 0u64;
    for t in state.topics.iter() {
        payload.clear();
        let mut w = Writer(&mut payload);
        w.u8(SNAP_TOPIC);
        w.str(&t.name);
        w.topic_config(&t.config);
        w.varint(t.first);
        w.varint(t.next);
        if !t.rules.read.is_empty() || !t.rules.append.is_empty() {
            w.topic_rules(&t.rules);
        }
        emit(&payload)?;
        let mut records = t.records.iter().peekable();
        while let Some(first) = records.peek().map(|r| r.offset) {
            body.clear();
            let mut n = 0u64;
            {
                let mut w = Writer(&mut body);
                for r in records.by_ref() {
                    w.varint(r.seq);
                    w.record_body(r);
                    n += 1;
                    if w.0.len() >= SNAP_FRAME_BYTES_TARGET {
                        break;
                    }
                }
            }
            payload.clear();
            let mut w = Writer(&mut payload);
            w.u8(SNAP_RECORDS);
            w.str(&t.name);
            w.varint(first);
            w.varint(n);
            payload.extend_from_slice(&body);
            emit(&payload)?;
            total_records += n;
        }
    }
    payload.clear();
    let mut w = Writer(&mut payload);
    w.u8(SNAP_END);
    w.varint(state.tables.len() as u64);
    w.varint(total_rows);
    w.varint(state.topics.len() as u64);
    w.varint(total_records);
    emit(&payload)
}

fn encode_snapshot_row(w: &mut Writer<'_>, key: &Key, row: &RowEntry) {
    w.key(key);
    w.varint(row.version);
    w.varint(row.values.len() as u64);
    for v in row.values.iter() {
        w.value(v);
    }
}

/// One decoded snapshot body frame. Decoding needs nothing but the bytes, so it can run on
/// another thread than [`SnapshotLoader::apply`].
pub enum SnapFrame {
    Schemas(Vec<TableSchema>),
    Policies {
        table: String,
        policies: Vec<PolicyDef>,
    },
    Rows {
        table: String,
        rows: Vec<(Key, RowEntry)>,
    },
    Topic {
        name: String,
        config: TopicConfig,
        first: u64,
        next: u64,
        /// Absent in snapshots written before topic rules existed (and when empty).
        rules: TopicRules,
    },
    Records {
        topic: String,
        records: Vec<Record>,
    },
    End {
        tables: u64,
        rows: u64,
        /// Topics and records (0 and 0 in snapshots written before topics existed).
        topics: u64,
        records: u64,
    },
}

/// Decodes one snapshot body frame.
pub fn decode_snapshot_frame(payload: &[u8]) -> DecodeResult<SnapFrame> {
    let mut r = Reader::new(payload);
    let frame = match r.u8()? {
        SNAP_SCHEMA => {
            let n = r.len()?;
            SnapFrame::Schemas(
                (0..n)
                    .map(|_| r.table_schema())
                    .collect::<DecodeResult<_>>()?,
            )
        }
        SNAP_POLICIES => {
            let table = r.string()?;
            let n = r.len()?;
            SnapFrame::Policies {
                table,
                policies: (0..n).map(|_| r.policy()).collect::<DecodeResult<_>>()?,
            }
        }
        kind @ (SNAP_ROWS | SNAP_ROWS_PACKED) => {
            let table = r.string()?;
            let n = r.len()?;
            let mut rows =
                Vec::with_capacity(r.reserve_within_input(n, size_of::<(Key, RowEntry)>()));
            let mut scratch = Vec::new();
            for _ in 0..n {
                let key = r.key()?;
                let version = r.counter("version")?;
                if kind == SNAP_ROWS {
                    // The row's last writer's seq: its version again.
                    r.counter("seq")?;
                }
                let nv = r.len()?;
                let values = r.row_values(nv, &mut scratch)?;
                rows.push((key, RowEntry { values, version }));
            }
            SnapFrame::Rows { table, rows }
        }
        SNAP_TOPIC => {
            let name = r.string()?;
            check_topic_name(&name).map_err(|e| e.message)?;
            let config = r.topic_config()?;
            let first = r.counter("offset")?;
            let next = r.counter("offset")?;
            if first > next {
                return Err(format!(
                    "topic {name:?} starts at {first} after its next offset {next}"
                ));
            }
            let rules = if r.is_empty() {
                TopicRules::default()
            } else {
                r.topic_rules()?
            };
            SnapFrame::Topic {
                name,
                config,
                first,
                next,
                rules,
            }
        }
        SNAP_RECORDS => {
            let topic = r.string()?;
            let first = r.counter("offset")?;
            let n = r.len()?;
            let mut records = Vec::with_capacity(Reader::reserve(n));
            for i in 0..n as u64 {
                let seq = r.counter("seq")?;
                let offset = first
                    .checked_add(i)
                    .filter(|o| *o <= COUNTER_MAX)
                    .ok_or("implausible offset")?;
                records.push(r.record_body(offset, seq)?);
            }
            SnapFrame::Records { topic, records }
        }
        SNAP_END => {
            let tables = r.varint()?;
            let rows = r.varint()?;
            let (topics, records) = if r.is_empty() {
                (0, 0)
            } else {
                (r.varint()?, r.varint()?)
            };
            SnapFrame::End {
                tables,
                rows,
                topics,
                records,
            }
        }
        k => return Err(format!("unknown snapshot frame kind {k}")),
    };
    if !r.is_empty() {
        return Err("trailing bytes in snapshot frame".into());
    }
    Ok(frame)
}

/// Builds a [`Db`] from snapshot frames, fed in file order.
///
/// Rows arrive in key order, table by table, so each table's rows are collected and its
/// B-tree and indexes built in bulk when the next table (or the end) begins.
#[derive(Default)]
pub struct SnapshotLoader {
    tables_expected: Option<u64>,
    rows: u64,
    records: u64,
    /// Each topic's declared next offset, checked at the end.
    topics_next: Vec<(String, u64)>,
    done: bool,
    /// The table whose rows are arriving, its row map built as they come (no `Vec` of
    /// all its rows, which doubled its way up and was then copied into the map).
    pending: Option<(String, CowMapBuilder<Key, RowEntry>)>,
}

impl SnapshotLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes and applies one body frame to `db` (which must start empty).
    pub fn frame(&mut self, db: &mut Db, payload: &[u8]) -> DecodeResult<()> {
        self.apply(db, decode_snapshot_frame(payload)?)
    }

    /// Applies one decoded frame to `db` (which must start empty).
    pub fn apply(&mut self, db: &mut Db, frame: SnapFrame) -> DecodeResult<()> {
        if self.done {
            return Err("frame after the end frame".into());
        }
        match frame {
            SnapFrame::Schemas(schemas) => {
                if self.tables_expected.is_some() {
                    return Err("second schema frame".into());
                }
                self.tables_expected = Some(schemas.len() as u64);
                for schema in schemas {
                    // The same checks as CREATE TABLE and replay: a snapshot's schemas are
                    // outside bytes too (duplicate columns, a REAL primary key, …).
                    crate::db::validate_columns(&schema)
                        .map_err(|e| format!("table {:?}: {}", schema.name, e.message))?;
                    if db.tables.contains_key(&schema.name) {
                        return Err(format!("table {:?} is declared twice", schema.name));
                    }
                    db.tables.insert(
                        schema.name.clone(),
                        crate::table::Table::new(std::sync::Arc::new(schema)),
                    );
                }
            }
            SnapFrame::Policies { table, policies } => {
                let t = db
                    .tables
                    .get_mut(&table)
                    .ok_or_else(|| format!("policies for unknown table {table:?}"))?;
                if !t.policies.is_empty() {
                    return Err(format!("policies of table {table:?} come twice"));
                }
                for (i, p) in policies.iter().enumerate() {
                    if policies[..i].iter().any(|q| q.name == p.name) {
                        return Err(format!(
                            "policy {:?} of table {table:?} is declared twice",
                            p.name
                        ));
                    }
                }
                t.policies = policies;
            }
            SnapFrame::Rows { table, rows } => {
                let t = db
                    .tables
                    .get(&table)
                    .ok_or_else(|| format!("rows for unknown table {table:?}"))?;
                let columns = t.schema.columns.len();
                if let Some((_, row)) = rows.iter().find(|(_, r)| r.values.len() != columns) {
                    return Err(format!(
                        "row of {} values in table {table:?} of {columns} columns",
                        row.values.len()
                    ));
                }
                self.rows += rows.len() as u64;
                if self.pending.as_ref().is_none_or(|(name, _)| *name != table) {
                    self.flush(db)?;
                    if !db.tables[&table].rows.is_empty() {
                        return Err(format!(
                            "rows for table {table:?} come in two separate runs"
                        ));
                    }
                    self.pending = Some((table, CowMapBuilder::new()));
                }
                let (name, pending) = self.pending.as_mut().expect("set above");
                for (key, row) in rows {
                    if pending.last_key().is_some_and(|last| *last >= key) {
                        return Err(format!("rows of table {name:?} are not in key order"));
                    }
                    pending.push(key, row);
                }
            }
            SnapFrame::Topic {
                name,
                config,
                first,
                next,
                rules,
            } => {
                self.flush(db)?;
                if db.topics.contains_key(&name) {
                    return Err(format!("topic {name:?} is declared twice"));
                }
                self.topics_next.push((name.clone(), next));
                let mut topic = Topic::starting_at(&name, config, first);
                topic.set_rules(rules);
                db.topics.insert(name.clone(), topic);
            }
            SnapFrame::Records { topic, records } => {
                let t = db
                    .topics
                    .get_mut(&topic)
                    .ok_or_else(|| format!("records for unknown topic {topic:?}"))?;
                for r in records {
                    if r.offset != t.next() || r.ts_us < t.last_ts_us() {
                        return Err(format!(
                            "record at offset {} of topic {topic:?} does not follow offset {}",
                            r.offset,
                            t.next()
                        ));
                    }
                    t.push(Arc::new(r));
                    self.records += 1;
                }
            }
            SnapFrame::End {
                tables,
                rows,
                topics,
                records,
            } => {
                self.flush(db)?;
                if Some(tables) != self.tables_expected || rows != self.rows {
                    return Err(format!(
                        "end frame counts {tables} tables / {rows} rows, found {:?} / {}",
                        self.tables_expected, self.rows
                    ));
                }
                if topics != self.topics_next.len() as u64 || records != self.records {
                    return Err(format!(
                        "end frame counts {topics} topics / {records} records, found {} / {}",
                        self.topics_next.len(),
                        self.records
                    ));
                }
                for (name, next) in &self.topics_next {
                    let t = &db.topics[name];
                    if t.next() != *next {
                        return Err(format!(
                            "topic {name:?} declares next offset {next} but its records end at {}",
                            t.next()
                        ));
                    }
                }
                self.done = true;
            }
        }
        Ok(())
    }

    fn flush(&mut self, db: &mut Db) -> DecodeResult<()> {
        let Some((name, rows)) = self.pending.take() else {
            return Ok(());
        };
        let table = db
            .tables
            .get_mut(&name)
            .expect("checked when the rows came");
        // Checked when the run began: the table was empty then, and only this run fills it.
        table.load_map(rows.finish());
        Ok(())
    }

    /// Whether the end frame was seen (a snapshot without one is incomplete).
    pub fn finished(&self) -> bool {
        self.done
    }
}
