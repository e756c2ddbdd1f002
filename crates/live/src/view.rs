//! A view's materialised result ([`Materialized`]): its rows by result key, their order, the
//! window a subscriber sees, the checksum of that window, and the diff a set of row-level
//! deltas makes to it.
//!
//! Every operator ends in the same place: "after this commit, result key K holds this row
//! (or nothing)". [`Materialized::apply`] turns that into the changes a client applies in
//! order — for an unordered view by key only; for an ordered view with the `index` each
//! change lands at; for a `LIMIT`/`OFFSET` window by comparing the old and new window, which
//! costs O(offset + limit) per commit that touches the view, not O(view).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use sluice_engine::Value;

use crate::checksum::{render, row_hash, same_row};

/// A row's identity in a result (see [`sluice_query::Keyed::key`]).
pub type RKey = Vec<Value>;

/// One result row with its `ORDER BY` values.
#[derive(Clone, Debug)]
pub struct Out {
    pub sort: Vec<Value>,
    pub row: Arc<[Value]>,
}

/// A sort value carrying its key's direction, so positions order as `ORDER BY` says.
#[derive(Clone, Debug)]
struct SortVal {
    v: Value,
    desc: bool,
    nulls_first: Option<bool>,
}

impl Ord for SortVal {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.nulls_first, self.v.is_null(), other.v.is_null()) {
            (Some(first), true, false) => {
                if first {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (Some(first), false, true) => {
                if first {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            (Some(_), true, true) => Ordering::Equal,
            _ => {
                let o = self.v.cmp(&other.v);
                if self.desc {
                    o.reverse()
                } else {
                    o
                }
            }
        }
    }
}
impl PartialOrd for SortVal {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for SortVal {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SortVal {}

/// A row's place in an ordered view: its sort values, ties broken by result key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    sort: Box<[SortVal]>,
    key: RKey,
}

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

/// The direction of each `ORDER BY` key: `(desc, nulls_first)`.
pub type Order = Arc<[(bool, Option<bool>)]>;

pub struct Materialized {
    pub columns: Arc<[String]>,
    order: Order,
    ordered: bool,
    windowed: bool,
    offset: usize,
    limit: usize,
    rows: BTreeMap<RKey, Out>,
    /// Every row's position, when `ordered`.
    positions: BTreeSet<Pos>,
    /// The keys the subscriber sees, in order, when `windowed`.
    window: Vec<RKey>,
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
    pub fn new(
        columns: Arc<[String]>,
        order: Order,
        offset: usize,
        limit: Option<usize>,
    ) -> Materialized {
        let windowed = offset > 0 || limit.is_some();
        Materialized {
            columns,
            ordered: windowed || !order.is_empty(),
            order,
            windowed,
            offset,
            limit: limit.unwrap_or(usize::MAX),
            rows: BTreeMap::new(),
            positions: BTreeSet::new(),
            window: Vec::new(),
            checksum: 0,
        }
    }

    fn pos(&self, key: &RKey, out: &Out) -> Pos {
        Pos {
            sort: self
                .order
                .iter()
                .zip(&out.sort)
                .map(|(&(desc, nulls_first), v)| SortVal {
                    v: v.clone(),
                    desc,
                    nulls_first,
                })
                .collect(),
            key: key.clone(),
        }
    }

    /// Rows in the full result (not only the window).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Replaces the contents (the initial load, or a rebuild).
    pub fn load(&mut self, rows: impl IntoIterator<Item = (RKey, Out)>) {
        self.rows.clear();
        self.positions.clear();
        for (k, out) in rows {
            if self.ordered {
                let p = self.pos(&k, &out);
                self.positions.insert(p);
            }
            self.rows.insert(k, out);
        }
        self.window = if self.windowed {
            self.compute_window()
        } else {
            Vec::new()
        };
        self.checksum = self
            .visible()
            .fold(0u64, |acc, (_, o)| acc.wrapping_add(row_hash(&o.row)));
    }

    pub fn get(&self, key: &RKey) -> Option<&Out> {
        self.rows.get(key)
    }

    /// The keys of the rows whose key starts with `first` (a join anchor's rows).
    pub fn keys_with_first(&self, first: &Value) -> Vec<RKey> {
        self.rows
            .range(vec![first.clone()]..)
            .take_while(|(k, _)| k.first() == Some(first))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every row of the full result, by key.
    pub fn all(&self) -> impl Iterator<Item = (&RKey, &Out)> {
        self.rows.iter()
    }

    fn compute_window(&self) -> Vec<RKey> {
        self.positions
            .iter()
            .skip(self.offset)
            .take(self.limit)
            .map(|p| p.key.clone())
            .collect()
    }

    /// The rows the subscriber sees, in order.
    pub fn visible(&self) -> Box<dyn Iterator<Item = (&RKey, &Out)> + '_> {
        if self.windowed {
            Box::new(self.window.iter().map(|k| (k, &self.rows[k])))
        } else if self.ordered {
            Box::new(self.positions.iter().map(|p| (&p.key, &self.rows[&p.key])))
        } else {
            Box::new(self.rows.iter())
        }
    }

    /// Applies "after this commit, key K holds this (or nothing)" and returns the changes a
    /// client must apply, in order. Keys whose row is unchanged produce nothing.
    pub fn apply(&mut self, deltas: BTreeMap<RKey, Option<Out>>) -> Vec<Op> {
        if self.windowed {
            return self.apply_windowed(deltas);
        }
        // Where the rows this commit only re-sorts (same row, new sort values) stand now: if
        // every change is such a move and each ends where it started, the client sees nothing.
        let mut resorted: BTreeMap<RKey, usize> = BTreeMap::new();
        if self.ordered {
            for (key, new) in &deltas {
                if let (Some(o), Some(n)) = (self.rows.get(key), new) {
                    if same_row(&o.row, &n.row) && o.sort.iter().zip(&n.sort).any(|(a, b)| a != b) {
                        let p = self.pos(key, o);
                        resorted.insert(key.clone(), self.positions.range(..&p).count());
                    }
                }
            }
        }
        let mut ops = Vec::new();
        for (key, new) in deltas {
            let old = self.rows.get(&key).cloned();
            match (old, new) {
                (None, None) => {}
                (None, Some(n)) => {
                    self.checksum = self.checksum.wrapping_add(row_hash(&n.row));
                    let index = self.ordered.then(|| {
                        let p = self.pos(&key, &n);
                        let i = self.positions.range(..&p).count();
                        self.positions.insert(p);
                        i
                    });
                    ops.push(Op::Add {
                        key: key.clone(),
                        row: n.row.clone(),
                        index,
                    });
                    self.rows.insert(key, n);
                }
                (Some(o), None) => {
                    self.checksum = self.checksum.wrapping_sub(row_hash(&o.row));
                    let index = self.ordered.then(|| {
                        let p = self.pos(&key, &o);
                        let i = self.positions.range(..&p).count();
                        self.positions.remove(&p);
                        i
                    });
                    self.rows.remove(&key);
                    ops.push(Op::Remove { key, index });
                }
                (Some(o), Some(n)) => {
                    let moved = self.ordered && o.sort.iter().zip(&n.sort).any(|(a, b)| a != b);
                    if same_row(&o.row, &n.row) && !moved {
                        self.rows.insert(key, n);
                        continue;
                    }
                    self.checksum = self
                        .checksum
                        .wrapping_sub(row_hash(&o.row))
                        .wrapping_add(row_hash(&n.row));
                    let index = self.ordered.then(|| {
                        let old_pos = self.pos(&key, &o);
                        self.positions.remove(&old_pos);
                        let p = self.pos(&key, &n);
                        let i = self.positions.range(..&p).count();
                        self.positions.insert(p);
                        i
                    });
                    ops.push(Op::Change {
                        key: key.clone(),
                        row: n.row.clone(),
                        index,
                    });
                    self.rows.insert(key, n);
                }
            }
        }
        let in_place = |op: &Op| match op {
            Op::Change { key, .. } => resorted.get(key).is_some_and(|&i| {
                let p = self.pos(key, &self.rows[key]);
                self.positions.range(..&p).count() == i
            }),
            _ => false,
        };
        if ops.iter().all(in_place) {
            ops.clear();
        }
        ops
    }

    fn apply_windowed(&mut self, deltas: BTreeMap<RKey, Option<Out>>) -> Vec<Op> {
        // Old rows of the keys this commit rewrote (for the checksum and change detection).
        let mut rewritten: BTreeMap<RKey, Arc<[Value]>> = BTreeMap::new();
        for (key, new) in deltas {
            let old = self.rows.remove(&key);
            if let Some(o) = &old {
                let p = self.pos(&key, o);
                self.positions.remove(&p);
            }
            if let Some(n) = new {
                let p = self.pos(&key, &n);
                self.positions.insert(p);
                if let Some(o) = &old {
                    if !same_row(&o.row, &n.row) {
                        rewritten.insert(key.clone(), o.row.clone());
                    }
                }
                self.rows.insert(key, n);
            } else if let Some(o) = old {
                rewritten.insert(key, o.row);
            }
        }
        let new_window = self.compute_window();
        let old_window = std::mem::take(&mut self.window);
        let new_set: BTreeSet<&RKey> = new_window.iter().collect();
        let old_set: BTreeSet<&RKey> = old_window.iter().collect();
        let mut ops = Vec::new();
        let mut working: Vec<&RKey> = old_window.iter().collect();
        let old_row = |k: &RKey| -> Arc<[Value]> {
            rewritten
                .get(k)
                .cloned()
                .unwrap_or_else(|| self.rows[k].row.clone())
        };
        let mut sum = self.checksum;
        for k in &old_window {
            if !new_set.contains(k) {
                let i = working.iter().position(|w| *w == k).expect("in the window");
                working.remove(i);
                sum = sum.wrapping_sub(row_hash(&old_row(k)));
                ops.push(Op::Remove {
                    key: k.clone(),
                    index: Some(i),
                });
            }
        }
        for (i, k) in new_window.iter().enumerate() {
            let row = self.rows[k].row.clone();
            if !old_set.contains(k) {
                working.insert(i, k);
                sum = sum.wrapping_add(row_hash(&row));
                ops.push(Op::Add {
                    key: k.clone(),
                    row,
                    index: Some(i),
                });
                continue;
            }
            let at = i + working[i..]
                .iter()
                .position(|w| *w == k)
                .expect("kept keys stay after the settled prefix");
            let changed = rewritten.contains_key(k);
            if at != i || changed {
                working.remove(at);
                working.insert(i, k);
                if changed {
                    sum = sum
                        .wrapping_sub(row_hash(&old_row(k)))
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
        self.window = new_window;
        ops
    }

    pub fn row_json(&self, row: &[Value]) -> Json {
        let mut m = Map::with_capacity(row.len());
        for (c, v) in self.columns.iter().zip(row) {
            m.insert(c.clone(), v.to_json());
        }
        Json::Object(m)
    }

    /// The snapshot message body at `seq`.
    pub fn snapshot_json(&self, seq: u64, reset: bool) -> String {
        let mut keys = Vec::new();
        let mut rows = Vec::new();
        for (k, o) in self.visible() {
            keys.push(key_json(k));
            rows.push(self.row_json(&o.row));
        }
        let mut body = json!({
            "seq": seq,
            "columns": &*self.columns,
            "keys": keys,
            "rows": rows,
            "checksum": render(self.checksum),
        });
        if reset {
            body["reset"] = Json::Bool(true);
        }
        body.to_string()
    }

    /// The diff message body at `seq`.
    pub fn diff_json(&self, seq: u64, ops: &[Op]) -> String {
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
