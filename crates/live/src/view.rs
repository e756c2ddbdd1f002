//! A view's materialised result ([`Materialized`]): its rows by result key, their order, the
//! window a subscriber sees, the checksum of that window, and the diff a set of row-level
//! deltas makes to it.
//!
//! Every operator ends in the same place: "after this commit, result key K holds this row
//! (or nothing)". [`Materialized::apply`] turns that into the changes a client applies in
//! order — for an unordered view by key only; for an ordered view with the `index` each
//! change lands at; for a `LIMIT`/`OFFSET` window by comparing the old and new window, which
//! costs O(offset + limit) per commit that touches the view, not O(view).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use sluice_engine::Value;

use crate::checksum::{render, row_hash, same_row};
use crate::store::Store;
pub use crate::store::{Order, Out, RKey};

/// One change as a client applies it (see `docs/protocol.md`).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Add {
        key: RKey,
        row: Arc<[Value]>,
        index: Option<usize>,
    },
    Change {
        key: RKey,
        row: Arc<[Value]>,
        index: Option<usize>,
    },
    Remove {
        key: RKey,
        index: Option<usize>,
    },
}

/// How much of its result a top-k view keeps: the first `keep` rows (`OFFSET + LIMIT` plus
/// spare ones), so its memory follows the window, not the rows its filter selects.
///
/// Invariant: unless `complete`, the store holds exactly the rows of the result positioned
/// up to its last row (a prefix of the result); when `complete` it holds the whole result.
struct Prefix {
    keep: usize,
    /// Rows past `keep` the store may grow by before it is trimmed back.
    spare: usize,
    complete: bool,
}

pub struct Materialized {
    pub columns: Arc<[String]>,
    /// The output types as the protocol sends them (`types` in a snapshot); `Null` when
    /// unknown (tests building views by hand).
    pub types: Arc<Json>,
    windowed: bool,
    offset: usize,
    limit: usize,
    /// The full result, or (top-k views) its first rows.
    store: Store,
    prefix: Option<Prefix>,
    /// Of the rows the subscriber sees.
    checksum: u64,
}

pub fn key_json(key: &[Value]) -> Json {
    match key {
        [one] => one.to_json(),
        many => Json::Array(many.iter().map(Value::to_json).collect()),
    }
}

impl Materialized {
    /// A view of `columns` ordered by `order` with the window `offset`/`limit`. With
    /// `spare_rows`, a view with a `LIMIT` keeps only its first `offset + limit + spare_rows`
    /// rows (the caller then follows [`Materialized::admit`] and refills it when that says
    /// so); without, it keeps its whole result.
    pub fn new(
        columns: Arc<[String]>,
        order: Order,
        offset: usize,
        limit: Option<usize>,
        spare_rows: Option<usize>,
    ) -> Materialized {
        let windowed = offset > 0 || limit.is_some();
        let ordered = windowed || !order.is_empty();
        let prefix = match (limit, spare_rows) {
            (Some(limit), Some(spare)) => Some(Prefix {
                keep: offset.saturating_add(limit).saturating_add(spare),
                spare,
                complete: true,
            }),
            _ => None,
        };
        Materialized {
            columns,
            types: Arc::new(Json::Null),
            windowed,
            offset,
            limit: limit.unwrap_or(usize::MAX),
            store: Store::new(order, ordered),
            prefix,
            checksum: 0,
        }
    }

    /// The checksum of the rows a subscriber sees.
    pub fn checksum(&self) -> u64 {
        self.checksum
    }

    /// Rows in the full result (not only the window).
    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Replaces the contents (the initial load, or a rebuild) with `rows`, the full result.
    pub fn load(&mut self, mut rows: Vec<(RKey, Out)>) {
        if let Some(p) = &mut self.prefix {
            p.complete = rows.len() <= p.keep;
            self.store.first_n(&mut rows, p.keep);
        }
        self.store.load(rows);
        self.checksum = sluice_sched::paced(self.visible())
            .fold(0u64, |acc, (_, o)| acc.wrapping_add(row_hash(&o.row)));
    }

    /// Drops every row, yielding the CPU now and then ([`Store::release_paced`]); the view
    /// is empty afterwards (called on a view about to be dropped).
    pub fn release_paced(&mut self) {
        self.store.release_paced();
    }

    /// The keys of the rows whose key starts with `first` (a join anchor's rows).
    pub fn keys_with_first(&self, first: &Value) -> Vec<RKey> {
        self.store.keys_with_first(first)
    }

    /// Every row of the full result.
    pub fn all(&self) -> impl Iterator<Item = (&RKey, &Out)> {
        self.store.iter()
    }

    /// The rows the subscriber sees, in order: the window costs O(offset + limit).
    pub fn visible(&self) -> Box<dyn Iterator<Item = (&RKey, &Out)> + '_> {
        if self.windowed {
            Box::new(self.store.iter_from(self.offset).take(self.limit))
        } else {
            self.store.iter()
        }
    }

    /// Whether a client's array is ordered (`ORDER BY`, `LIMIT`, `OFFSET`): its diffs carry
    /// `index`.
    pub fn ordered(&self) -> bool {
        self.store.ordered()
    }

    /// The row a subscriber sees at `key`, if it sees one.
    pub fn visible_row(&self, key: &RKey) -> Option<Arc<[Value]>> {
        if self.windowed {
            return self
                .visible()
                .find(|(k, _)| *k == key)
                .map(|(_, o)| o.row.clone());
        }
        self.store.get(key).map(|o| o.row.clone())
    }

    /// For a view that keeps a prefix of its result: drops from `deltas` the rows that land
    /// past the last kept row (the store does not hold their neighbours), and says whether
    /// the rows kept then still cover the window. `false` means the view must be refilled
    /// from the table ([`Materialized::refill`]) instead of applying `deltas`.
    pub fn admit(&self, deltas: &mut BTreeMap<RKey, Option<Out>>) -> bool {
        let Some(p) = &self.prefix else {
            return true;
        };
        if p.complete {
            return true;
        }
        let frontier = self.store.last();
        let mut len = self.store.len();
        for (key, delta) in deltas.iter_mut() {
            if let Some(out) = delta {
                let past = frontier.is_none_or(|f| self.store.cmp((key, out), f).is_gt());
                if past {
                    *delta = None;
                }
            }
            match (self.store.get(key).is_some(), delta.is_some()) {
                (true, false) => len -= 1,
                (false, true) => len += 1,
                _ => {}
            }
        }
        len >= self.offset.saturating_add(self.limit)
    }

    /// The deltas that replace a prefix view's rows with the first ones of `rows` (the full
    /// result read again); apply them with [`Materialized::apply`].
    pub fn refill(&mut self, mut rows: Vec<(RKey, Out)>) -> BTreeMap<RKey, Option<Out>> {
        let p = self
            .prefix
            .as_mut()
            .expect("only prefix views are refilled");
        p.complete = rows.len() <= p.keep;
        self.store.first_n(&mut rows, p.keep);
        let mut deltas: BTreeMap<RKey, Option<Out>> =
            self.store.iter().map(|(k, _)| (k.clone(), None)).collect();
        deltas.extend(rows.into_iter().map(|(k, o)| (k, Some(o))));
        deltas
    }

    /// Trims a prefix view that grew past its spare rows back to the rows it keeps (none of
    /// them visible: `keep` ≥ `offset + limit`).
    fn trim(&mut self) {
        if let Some(p) = &mut self.prefix {
            if self.store.len() > p.keep.saturating_add(p.spare) {
                self.store.truncate(p.keep);
                p.complete = false;
            }
        }
    }

    /// Applies "after this commit, key K holds this (or nothing)" and returns the changes a
    /// client must apply, in order. Keys whose row is unchanged produce nothing.
    pub fn apply(&mut self, deltas: BTreeMap<RKey, Option<Out>>) -> Vec<Op> {
        if self.windowed {
            return self.apply_windowed(deltas);
        }
        let ordered = self.store.ordered();
        let store = &mut self.store;
        // Where the rows this commit only re-sorts (same row, new sort values) stand now: if
        // every change is such a move and each ends where it started, the client sees nothing.
        let mut resorted: BTreeMap<RKey, usize> = BTreeMap::new();
        if ordered {
            for (key, new) in &deltas {
                if let (Some(o), Some(n)) = (store.get(key), new) {
                    if same_row(&o.row, &n.row) && o.sort != n.sort {
                        resorted.insert(key.clone(), store.rank(key, o));
                    }
                }
            }
        }
        let mut ops = Vec::new();
        for (key, new) in deltas {
            let old = store.get(&key).cloned();
            match (old, new) {
                (None, None) => {}
                (None, Some(n)) => {
                    self.checksum = self.checksum.wrapping_add(row_hash(&n.row));
                    let index = ordered.then(|| store.rank(&key, &n));
                    ops.push(Op::Add {
                        key: key.clone(),
                        row: n.row.clone(),
                        index,
                    });
                    store.insert(key, n);
                }
                (Some(o), None) => {
                    self.checksum = self.checksum.wrapping_sub(row_hash(&o.row));
                    let index = ordered.then(|| store.rank(&key, &o));
                    store.remove(&key);
                    ops.push(Op::Remove { key, index });
                }
                (Some(o), Some(n)) => {
                    let moved = ordered && o.sort != n.sort;
                    if same_row(&o.row, &n.row) && !moved {
                        store.insert(key, n);
                        continue;
                    }
                    self.checksum = self
                        .checksum
                        .wrapping_sub(row_hash(&o.row))
                        .wrapping_add(row_hash(&n.row));
                    let index = ordered.then(|| {
                        store.remove(&key);
                        store.rank(&key, &n)
                    });
                    ops.push(Op::Change {
                        key: key.clone(),
                        row: n.row.clone(),
                        index,
                    });
                    store.insert(key, n);
                }
            }
        }
        let in_place = |op: &Op| match op {
            Op::Change { key, .. } => resorted.get(key).is_some_and(|&i| {
                let out = store.get(key).expect("a changed row is in the view");
                store.rank(key, out) == i
            }),
            _ => false,
        };
        if ops.iter().all(in_place) {
            ops.clear();
        }
        ops
    }

    /// A windowed view's diff: the old window (taken before the deltas land) against the
    /// new one, O(offset + limit).
    fn apply_windowed(&mut self, deltas: BTreeMap<RKey, Option<Out>>) -> Vec<Op> {
        let old_window: Vec<(RKey, Arc<[Value]>)> = self
            .visible()
            .map(|(k, o)| (k.clone(), o.row.clone()))
            .collect();
        for (key, new) in deltas {
            match new {
                Some(n) => self.store.insert(key, n),
                None => {
                    self.store.remove(&key);
                }
            }
        }
        let new_window: Vec<(&RKey, &Out)> = self.visible().collect();
        let new_keys: BTreeSet<&RKey> = new_window.iter().map(|(k, _)| *k).collect();
        let old_rows: BTreeMap<&RKey, &Arc<[Value]>> =
            old_window.iter().map(|(k, r)| (k, r)).collect();
        let mut ops = Vec::new();
        let mut working: Vec<&RKey> = old_window.iter().map(|(k, _)| k).collect();
        let mut sum = self.checksum;
        for (k, row) in &old_window {
            if !new_keys.contains(k) {
                let i = working.iter().position(|w| *w == k).expect("in the window");
                working.remove(i);
                sum = sum.wrapping_sub(row_hash(row));
                ops.push(Op::Remove {
                    key: k.clone(),
                    index: Some(i),
                });
            }
        }
        for (i, &(k, out)) in new_window.iter().enumerate() {
            let row = out.row.clone();
            let Some(old_row) = old_rows.get(k) else {
                working.insert(i, k);
                sum = sum.wrapping_add(row_hash(&row));
                ops.push(Op::Add {
                    key: k.clone(),
                    row,
                    index: Some(i),
                });
                continue;
            };
            let at = i + working[i..]
                .iter()
                .position(|w| *w == k)
                .expect("kept keys stay after the settled prefix");
            let changed = !same_row(old_row, &row);
            if at != i || changed {
                working.remove(at);
                working.insert(i, k);
                if changed {
                    sum = sum
                        .wrapping_sub(row_hash(old_row))
                        .wrapping_add(row_hash(&row));
                }
                ops.push(Op::Change {
                    key: k.clone(),
                    row,
                    index: Some(i),
                });
            }
        }
        debug_assert_eq!(working.len(), new_window.len());
        self.checksum = sum;
        self.trim();
        ops
    }

    pub fn row_json(&self, row: &[Value]) -> Json {
        let mut m = Map::with_capacity(row.len());
        for (c, v) in self.columns.iter().zip(row) {
            m.insert(c.clone(), v.to_json());
        }
        Json::Object(m)
    }

    /// The snapshot message body at `seq`: written straight from the typed values (no
    /// `serde_json::Value` per row, no copy of the column names and types), byte for byte
    /// what [`Materialized::snapshot_json_built`] renders. Every subscribe renders one.
    pub fn snapshot_json(&self, seq: u64, reset: bool) -> String {
        let names = &self.columns;
        if (1..names.len()).any(|i| names[..i].contains(&names[i])) {
            // A row object keeps one member per name: the built form says which.
            return self.snapshot_json_built(seq, reset);
        }
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        for (i, (k, o)) in self.visible().enumerate() {
            if i > 0 {
                keys.push(b',');
                rows.push(b',');
            }
            crate::chunked::json_key(k, &mut keys);
            rows.push(b'{');
            for (c, (name, v)) in names.iter().zip(o.row.iter()).enumerate() {
                if c > 0 {
                    rows.push(b',');
                }
                crate::chunked::json_str(name, &mut rows);
                rows.push(b':');
                crate::chunked::json_value(v, &mut rows);
            }
            rows.push(b'}');
        }
        let mut out = Vec::with_capacity(keys.len() + rows.len() + 128);
        out.extend_from_slice(b"{\"seq\":");
        out.extend_from_slice(seq.to_string().as_bytes());
        out.extend_from_slice(b",\"columns\":");
        crate::chunked::json_strs(&self.columns, &mut out);
        out.extend_from_slice(b",\"types\":");
        crate::chunked::json_json(&self.types, &mut out);
        out.extend_from_slice(b",\"keys\":[");
        out.extend_from_slice(&keys);
        out.extend_from_slice(b"],\"rows\":[");
        out.extend_from_slice(&rows);
        out.extend_from_slice(b"],\"checksum\":");
        crate::chunked::json_str(&render(self.checksum), &mut out);
        if reset {
            out.extend_from_slice(b",\"reset\":true");
        }
        out.push(b'}');
        String::from_utf8(out).expect("JSON is written from UTF-8 text only")
    }

    /// The snapshot message body at `seq`, built as a `serde_json::Value` first.
    pub fn snapshot_json_built(&self, seq: u64, reset: bool) -> String {
        let mut keys = Vec::new();
        let mut rows = Vec::new();
        for (k, o) in self.visible() {
            keys.push(key_json(k));
            rows.push(self.row_json(&o.row));
        }
        let mut body = json!({
            "seq": seq,
            "columns": &*self.columns,
            "types": &*self.types,
            "keys": keys,
            "rows": rows,
            "checksum": render(self.checksum),
        });
        if reset {
            body["reset"] = Json::Bool(true);
        }
        body.to_string()
    }

    /// The snapshot event at `seq`: one rendered message up to
    /// [`crate::chunked::SNAPSHOT_MESSAGE_ROWS_MAX`] visible rows (exactly
    /// [`Materialized::snapshot_json`]), else the visible rows frozen for the transport to
    /// send in chunks — O(rows) pointer copies here instead of rendering.
    pub fn snapshot_event(&self, seq: u64, reset: bool) -> crate::sink::Event {
        let visible = if self.windowed {
            self.len().saturating_sub(self.offset).min(self.limit)
        } else {
            self.len()
        };
        if visible <= crate::chunked::SNAPSHOT_MESSAGE_ROWS_MAX {
            return crate::sink::Event {
                seq,
                kind: crate::sink::EventKind::Snapshot,
                json: self.snapshot_json(seq, reset),
                chunked: None,
            };
        }
        let rows = self
            .visible()
            .map(|(k, o)| (k.clone(), o.row.clone()))
            .collect();
        crate::sink::Event {
            seq,
            kind: crate::sink::EventKind::Snapshot,
            json: String::new(),
            chunked: Some(Arc::new(crate::chunked::ChunkedSnapshot::new(
                seq,
                reset,
                self.columns.clone(),
                self.types.clone(),
                rows,
                self.checksum,
            ))),
        }
    }

    /// [`Materialized::snapshot_event`] for a view just built from `table` (a frozen
    /// version of its one table, at `seq`): when the snapshot is chunked and the view is an
    /// unordered set holding its whole result, the chunks are encoded from the table itself
    /// ([`crate::chunked::FrozenTable`]), in key order, instead of from a copy of the rows
    /// taken here. Otherwise as `snapshot_event`.
    pub(crate) fn snapshot_event_from(
        &self,
        seq: u64,
        reset: bool,
        table: crate::chunked::FrozenTable,
    ) -> crate::sink::Event {
        let whole_set = !self.windowed && !self.ordered() && self.prefix.is_none();
        if !whole_set || self.len() <= crate::chunked::SNAPSHOT_MESSAGE_ROWS_MAX {
            return self.snapshot_event(seq, reset);
        }
        crate::sink::Event {
            seq,
            kind: crate::sink::EventKind::Snapshot,
            json: String::new(),
            chunked: Some(Arc::new(crate::chunked::ChunkedSnapshot::from_table(
                seq,
                reset,
                self.columns.clone(),
                self.types.clone(),
                table,
                self.len(),
                self.checksum,
            ))),
        }
    }

    /// The diff message body at `seq`.
    /// Written straight from the typed values, byte for byte what
    /// [`Materialized::diff_json_built`] renders: every diff of every view is rendered here,
    /// on the live thread, and the built form cost a map, a copy of each column's name and a
    /// `serde_json::Value` per value of each changed row.
    pub fn diff_json(&self, seq: u64, ops: &[Op]) -> String {
        let names = &self.columns;
        if (1..names.len()).any(|i| names[..i].contains(&names[i])) {
            // A row object keeps one member per name: the built form says which.
            return self.diff_json_built(seq, ops);
        }
        let mut out = Vec::with_capacity(64 + ops.len() * (48 + 16 * names.len()));
        out.extend_from_slice(b"{\"seq\":");
        let _ = write!(out, "{seq}");
        out.extend_from_slice(b",\"changes\":[");
        for (i, op) in ops.iter().enumerate() {
            let (name, key, row, index) = match op {
                Op::Add { key, row, index } => (&b"add"[..], key, Some(row), index),
                Op::Change { key, row, index } => (&b"change"[..], key, Some(row), index),
                Op::Remove { key, index } => (&b"remove"[..], key, None, index),
            };
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"op\":\"");
            out.extend_from_slice(name);
            out.extend_from_slice(b"\",\"key\":");
            crate::chunked::json_key(key, &mut out);
            if let Some(row) = row {
                out.extend_from_slice(b",\"row\":{");
                for (c, (name, v)) in names.iter().zip(row.iter()).enumerate() {
                    if c > 0 {
                        out.push(b',');
                    }
                    crate::chunked::json_str(name, &mut out);
                    out.push(b':');
                    crate::chunked::json_value(v, &mut out);
                }
                out.push(b'}');
            }
            if let Some(index) = index {
                out.extend_from_slice(b",\"index\":");
                let _ = write!(out, "{index}");
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"checksum\":\"");
        out.extend_from_slice(render(self.checksum).as_bytes());
        out.extend_from_slice(b"\"}");
        String::from_utf8(out).expect("JSON is written from UTF-8 text only")
    }

    /// The diff message body at `seq`, built as a `serde_json::Value` first.
    pub fn diff_json_built(&self, seq: u64, ops: &[Op]) -> String {
        let changes: Vec<Json> = ops
            .iter()
            .map(|op| {
                let (name, key, row, index) = match op {
                    Op::Add { key, row, index } => ("add", key, Some(row), index),
                    Op::Change { key, row, index } => ("change", key, Some(row), index),
                    Op::Remove { key, index } => ("remove", key, None, index),
                };
                let mut c = Map::new();
                c.insert("op".into(), Json::from(name));
                c.insert("key".into(), key_json(key));
                if let Some(r) = row {
                    c.insert("row".into(), self.row_json(r));
                }
                if let Some(i) = index {
                    c.insert("index".into(), Json::from(*i));
                }
                Json::Object(c)
            })
            .collect();
        json!({"seq": seq, "changes": changes, "checksum": render(self.checksum)}).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(columns: &[&str], rows: Vec<Vec<Value>>) -> Materialized {
        let columns: Arc<[String]> = columns.iter().map(|c| c.to_string()).collect();
        let mut mat = Materialized::new(columns, Arc::new([]), 0, None, None);
        mat.types = Arc::new(json!(["integer", {"t": "text"}]));
        mat.load(
            rows.into_iter()
                .map(|r| {
                    let key = vec![r[0].clone()];
                    let out = Out {
                        sort: Box::new([]),
                        row: r.into(),
                    };
                    (key, out)
                })
                .collect(),
        );
        mat
    }

    /// One value of every type, with the cases a JSON writer gets wrong (escapes, NaN,
    /// huge reals, bytes, raw JSON).
    fn awkward_values() -> [Value; 10] {
        [
            Value::Null,
            Value::Integer(-7),
            Value::Real(1.5),
            Value::Real(f64::NAN),
            Value::Real(1e300),
            Value::Boolean(true),
            Value::Text("quote \" and \\ and \u{1}, ünï".into()),
            Value::Blob([0, 255, 3].into()),
            Value::Json(r#"{"b": [1, 2.50, "x"]}"#.into()),
            Value::Timestamp(1_700_000_000_000_000),
        ]
    }

    /// The direct snapshot writer renders what the built form renders, byte for byte.
    #[test]
    fn snapshot_json_is_the_built_form() {
        let values = awkward_values();
        let rows: Vec<Vec<Value>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| vec![Value::Integer(i as i64), v.clone()])
            .collect();
        for columns in [
            &["id", "v"][..],
            &["id", "a \"name\""],
            &["id", "id"],
            &["id"],
        ] {
            for n in [0, 1, rows.len()] {
                let mat = view(columns, rows[..n].to_vec());
                for (seq, reset) in [(0, false), (41, true)] {
                    assert_eq!(
                        mat.snapshot_json(seq, reset),
                        mat.snapshot_json_built(seq, reset),
                        "columns {columns:?}, {n} rows"
                    );
                }
            }
        }
    }

    /// The direct diff writer renders what the built form renders, byte for byte.
    #[test]
    fn diff_json_is_the_built_form() {
        let values = awkward_values();
        let row = |i: usize, v: &Value| -> Arc<[Value]> {
            vec![Value::Integer(i as i64), v.clone()].into()
        };
        let mut ops = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let key = if i % 2 == 0 {
                vec![Value::Integer(i as i64)]
            } else {
                vec![Value::Integer(i as i64), v.clone()]
            };
            let index = (i % 3 == 0).then_some(i * 1000);
            ops.push(match i % 3 {
                0 => Op::Add {
                    key,
                    row: row(i, v),
                    index,
                },
                1 => Op::Change {
                    key,
                    row: row(i, v),
                    index,
                },
                _ => Op::Remove { key, index },
            });
        }
        for columns in [
            &["id", "v"][..],
            &["id", "a \"name\""],
            &["id", "id"],
            &["id"],
        ] {
            let mat = view(columns, vec![vec![Value::Integer(1), Value::Integer(2)]]);
            for n in [0, 1, ops.len()] {
                for seq in [0, 41, u64::MAX] {
                    assert_eq!(
                        mat.diff_json(seq, &ops[..n]),
                        mat.diff_json_built(seq, &ops[..n]),
                        "columns {columns:?}, {n} ops"
                    );
                }
            }
        }
    }
}
