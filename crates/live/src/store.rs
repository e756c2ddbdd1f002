//! [`Store`]: a view's rows by result key and, for ordered views, by position.
//!
//! Most live views are small (a room's last 20 messages, one user's rows) and most of a
//! server's views are idle, so a small view must cost little: up to [`SMALL_ROWS_MAX`] rows
//! are kept in one `Vec` sorted by position (or by key when the view is unordered) — one
//! allocation plus each row's key and sort values. A view that grows past that switches to a
//! [`CowMap`] by key (sorted chunks of up to 128 rows) plus a ranked set of positions, so
//! lookups and moves stay O(log n) at a million rows; it switches back once it shrinks below
//! a quarter of the threshold (the gap keeps a view hovering at the boundary from converting
//! on every commit).
//!
//! *Why chunks and not a `BTreeMap`.* A new view's rows arrive sorted by key, and a chunked
//! map is built from them by appending, a row at a time, so the build can offer the CPU
//! every quarter millisecond ([`sluice_sched::Pacer`]); `BTreeMap`'s bulk build is one call
//! that held the live thread's CPU for 26–47 ms at a million rows (and the threads that
//! woke behind it waited for the scheduler's 4 ms tick). It also allocates one block per
//! 128 rows instead of one node per 11.

use std::cmp::Ordering;
use std::sync::Arc;

use sluice_engine::cow::CowMap;
use sluice_engine::Value;
use sluice_query::sort_value_cmp;

use crate::ranked::Ranked;

/// A row's identity in a result (see [`sluice_query::Keyed::key`]).
pub type RKey = Vec<Value>;

/// The direction of each `ORDER BY` key: `(desc, nulls_first)`.
pub type Order = Arc<[(bool, Option<bool>)]>;

/// Rows a view keeps in its compact form.
pub const SMALL_ROWS_MAX: usize = 32;

/// One result row with its `ORDER BY` values.
#[derive(Clone, Debug)]
pub struct Out {
    pub sort: Box<[Value]>,
    pub row: Arc<[Value]>,
}

/// Position order: the sort values under `order`, ties broken by result key.
fn cmp_position(
    order: &[(bool, Option<bool>)],
    a: (&[Value], &RKey),
    b: (&[Value], &RKey),
) -> Ordering {
    order
        .iter()
        .zip(a.0.iter().zip(b.0))
        .map(|(&(desc, nulls_first), (x, y))| sort_value_cmp(x, y, desc, nulls_first))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.cmp(b.1))
}

/// A sort value carrying its key's direction, so [`Pos`]itions order as `ORDER BY` says.
#[derive(Clone, Debug)]
struct SortVal {
    v: Value,
    desc: bool,
    nulls_first: Option<bool>,
}

impl Ord for SortVal {
    fn cmp(&self, other: &Self) -> Ordering {
        sort_value_cmp(&self.v, &other.v, self.desc, self.nulls_first)
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

/// A row's place in a large ordered view: its sort values, ties broken by result key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    sort: Box<[SortVal]>,
    key: RKey,
}

enum Repr {
    /// At most [`SMALL_ROWS_MAX`] rows, sorted by position (ordered views) or by key.
    Small(Vec<(RKey, Out)>),
    Large {
        /// Boxed, like `positions`.
        rows: Box<CowMap<RKey, Out>>,
        /// Every row's position, when the view is ordered; ranked, so a change's `index`
        /// costs O(rows / chunk), not O(position). Boxed, so the enum — in every view, most
        /// of them small — is 24 bytes rather than 88.
        positions: Box<Ranked<Pos>>,
    },
}

const _: () = assert!(std::mem::size_of::<Repr>() == 24);

pub struct Store {
    order: Order,
    ordered: bool,
    repr: Repr,
}

impl Store {
    pub fn new(order: Order, ordered: bool) -> Store {
        Store {
            order,
            ordered,
            repr: Repr::Small(Vec::new()),
        }
    }

    pub fn ordered(&self) -> bool {
        self.ordered
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Small(v) => v.len(),
            Repr::Large { rows, positions } => {
                debug_assert!(!self.ordered || positions.len() == rows.len());
                rows.len()
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn pos(&self, key: &RKey, out: &Out) -> Pos {
        Pos {
            sort: self
                .order
                .iter()
                .zip(out.sort.iter())
                .map(|(&(desc, nulls_first), v)| SortVal {
                    v: v.clone(),
                    desc,
                    nulls_first,
                })
                .collect(),
            key: key.clone(),
        }
    }

    /// Where `(key, out)` goes in a small view's `Vec`: the number of rows before it.
    fn small_slot(&self, v: &[(RKey, Out)], key: &RKey, out: &Out) -> usize {
        if self.ordered {
            v.partition_point(|(k, o)| {
                cmp_position(&self.order, (&o.sort, k), (&out.sort, key)).is_lt()
            })
        } else {
            v.partition_point(|(k, _)| k < key)
        }
    }

    /// Replaces the contents.
    pub fn load(&mut self, mut rows: Vec<(RKey, Out)>) {
        if rows.len() <= SMALL_ROWS_MAX {
            if self.ordered {
                let order = self.order.clone();
                rows.sort_by(|(ka, a), (kb, b)| cmp_position(&order, (&a.sort, ka), (&b.sort, kb)));
            } else {
                rows.sort_by(|(a, _), (b, _)| a.cmp(b));
            }
            rows.shrink_to_fit();
            self.repr = Repr::Small(rows);
        } else {
            self.repr = self.large(rows);
        }
    }

    /// Empties the store a chunk of rows at a time with a [`sluice_sched::Pacer`]: dropping
    /// a million-row view in one call holds the live thread's CPU for tens of milliseconds.
    /// (A small store's few rows just go.)
    pub fn release_paced(&mut self) {
        if let Repr::Large { rows, positions } =
            std::mem::replace(&mut self.repr, Repr::Small(Vec::new()))
        {
            drop(positions);
            let mut pacer = sluice_sched::Pacer::check_every(CHUNKS_PER_CLOCK_CHECK);
            for chunk in (*rows).into_chunks() {
                drop(chunk);
                pacer.step();
            }
        }
    }

    fn large(&self, rows: Vec<(RKey, Out)>) -> Repr {
        let positions = if self.ordered {
            sluice_sched::paced(rows.iter())
                .map(|(k, o)| self.pos(k, o))
                .collect()
        } else {
            Ranked::new()
        };
        Repr::Large {
            rows: Box::new(build_rows(rows)),
            positions: Box::new(positions),
        }
    }

    pub fn get(&self, key: &RKey) -> Option<&Out> {
        match &self.repr {
            Repr::Small(v) if self.ordered => v.iter().find(|(k, _)| k == key).map(|(_, o)| o),
            Repr::Small(v) => v
                .binary_search_by(|(k, _)| k.cmp(key))
                .ok()
                .map(|i| &v[i].1),
            Repr::Large { rows, .. } => rows.get(key),
        }
    }

    /// The number of rows positioned before where `(key, out)` stands or would stand
    /// (ordered views; O(log n) small, O(n / chunk) large).
    pub fn rank(&self, key: &RKey, out: &Out) -> usize {
        debug_assert!(self.ordered);
        match &self.repr {
            Repr::Small(v) => self.small_slot(v, key, out),
            Repr::Large { positions, .. } => positions.rank(&self.pos(key, out)),
        }
    }

    /// Sets the row at `key` (replacing and repositioning any row there).
    pub fn insert(&mut self, key: RKey, out: Out) {
        self.remove(&key);
        match &mut self.repr {
            Repr::Small(v) => {
                let v = std::mem::take(v);
                let at = self.small_slot(&v, &key, &out);
                let mut v = v;
                v.insert(at, (key, out));
                if v.len() > SMALL_ROWS_MAX {
                    self.repr = self.large(v);
                } else {
                    self.repr = Repr::Small(v);
                }
            }
            Repr::Large { .. } => {
                let p = self.ordered.then(|| self.pos(&key, &out));
                let Repr::Large { rows, positions } = &mut self.repr else {
                    unreachable!()
                };
                if let Some(p) = p {
                    positions.insert(p);
                }
                rows.insert(key, out);
            }
        }
    }

    /// Removes the row at `key`, returning it.
    pub fn remove(&mut self, key: &RKey) -> Option<Out> {
        let (removed, shrink) = match &mut self.repr {
            Repr::Small(v) => {
                let at = if self.ordered {
                    v.iter().position(|(k, _)| k == key)
                } else {
                    v.binary_search_by(|(k, _)| k.cmp(key)).ok()
                };
                (at.map(|i| v.remove(i).1), false)
            }
            Repr::Large { rows, .. } => {
                let out = rows.remove(key);
                let shrink = rows.len() < SMALL_ROWS_MAX / 4;
                (out, shrink)
            }
        };
        if let (Some(out), true, Repr::Large { .. }) = (&removed, self.ordered, &self.repr) {
            let p = self.pos(key, out);
            if let Repr::Large { positions, .. } = &mut self.repr {
                positions.remove(&p);
            }
        }
        if shrink {
            let rows: Vec<(RKey, Out)> = self.iter().map(|(k, o)| (k.clone(), o.clone())).collect();
            self.repr = Repr::Small(rows);
        }
        removed
    }

    /// The rows from the `skip`-th on, in [`Store::iter`] order: O(rows / chunk) to get
    /// there in a large ordered view (a window's `OFFSET`).
    pub fn iter_from(&self, skip: usize) -> Box<dyn Iterator<Item = (&RKey, &Out)> + '_> {
        match &self.repr {
            Repr::Small(v) => Box::new(v[skip.min(v.len())..].iter().map(|(k, o)| (k, o))),
            Repr::Large { rows, positions } if self.ordered => {
                Box::new(positions.iter_from(skip).map(|p| (&p.key, &rows[&p.key])))
            }
            Repr::Large { rows, .. } => Box::new(rows.iter().skip(skip)),
        }
    }

    /// Every row, in position order (ordered views) or key order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&RKey, &Out)> + '_> {
        match &self.repr {
            Repr::Small(v) => Box::new(v.iter().map(|(k, o)| (k, o))),
            Repr::Large { rows, positions } if self.ordered => {
                Box::new(positions.iter().map(|p| (&p.key, &rows[&p.key])))
            }
            Repr::Large { rows, .. } => Box::new(rows.iter()),
        }
    }

    /// Position order (ordered views) or key order.
    pub fn cmp(&self, a: (&RKey, &Out), b: (&RKey, &Out)) -> Ordering {
        if self.ordered {
            cmp_position(&self.order, (&a.1.sort, a.0), (&b.1.sort, b.0))
        } else {
            a.0.cmp(b.0)
        }
    }

    /// The last row in [`Store::iter`] order.
    pub fn last(&self) -> Option<(&RKey, &Out)> {
        match &self.repr {
            Repr::Small(v) => v.last().map(|(k, o)| (k, o)),
            Repr::Large { rows, positions } if self.ordered => {
                positions.last().map(|p| (&p.key, &rows[&p.key]))
            }
            Repr::Large { rows, .. } => rows.last_key_value(),
        }
    }

    /// Drops rows from the end until at most `n` are left.
    pub fn truncate(&mut self, n: usize) {
        while self.len() > n {
            let key = self.last().expect("not empty").0.clone();
            self.remove(&key);
        }
    }

    /// Reduces `rows` to the first `n` in this store's order (in no particular order):
    /// O(rows), not a full sort.
    pub fn first_n(&self, rows: &mut Vec<(RKey, Out)>, n: usize) {
        if rows.len() > n {
            if n > 0 {
                rows.select_nth_unstable_by(n - 1, |(ka, a), (kb, b)| self.cmp((ka, a), (kb, b)));
            }
            rows.truncate(n);
        }
    }

    /// The keys of the rows whose key starts with `first` (a join anchor's rows).
    pub fn keys_with_first(&self, first: &Value) -> Vec<RKey> {
        match &self.repr {
            Repr::Small(v) => v
                .iter()
                .filter(|(k, _)| k.first() == Some(first))
                .map(|(k, _)| k.clone())
                .collect(),
            Repr::Large { rows, .. } => rows
                .range(vec![first.clone()]..)
                .take_while(|(k, _)| k.first() == Some(first))
                .map(|(k, _)| k.clone())
                .collect(),
        }
    }
}

/// Chunks dropped between two looks at the clock (each frees up to 128 rows).
const CHUNKS_PER_CLOCK_CHECK: u32 = 8;

/// The rows by key. Rows already in ascending key order (a view built from a table scan,
/// an aggregate's groups) are appended, with a [`sluice_sched::Pacer`]; others are sorted
/// first (the last of equal keys wins, as a map built by inserting them would keep).
fn build_rows(rows: Vec<(RKey, Out)>) -> CowMap<RKey, Out> {
    let ascending = sluice_sched::paced(rows.windows(2)).all(|w| w[0].0 < w[1].0);
    if !ascending {
        return rows.into_iter().collect();
    }
    CowMap::from_sorted(sluice_sched::paced(rows.into_iter()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model: every row in a `Vec`, sorted from scratch after each operation.
    fn model_order(order: &[(bool, Option<bool>)], ordered: bool, rows: &mut [(RKey, Out)]) {
        if ordered {
            rows.sort_by(|(ka, a), (kb, b)| cmp_position(order, (&a.sort, ka), (&b.sort, kb)));
        } else {
            rows.sort_by(|(a, _), (b, _)| a.cmp(b));
        }
    }

    fn tag(o: &Out) -> i64 {
        match o.row[0] {
            Value::Integer(i) => i,
            _ => unreachable!("rows are tagged with integers"),
        }
    }

    fn out(sort: Vec<Value>, tag: i64) -> Out {
        Out {
            sort: sort.into(),
            row: vec![Value::Integer(tag)].into(),
        }
    }

    #[test]
    fn a_large_load_keeps_the_last_of_equal_keys_and_a_release_empties_the_store() {
        let key = |i: i64| vec![Value::Integer(i)];
        for ascending in [true, false] {
            let mut rows: Vec<(RKey, Out)> = (0..1_000).map(|i| (key(i), out(vec![], i))).collect();
            if !ascending {
                rows.reverse();
                rows.push((key(500), out(vec![], -500))); // after the first row for key 500
            }
            let mut store = Store::new(Arc::from(vec![]), false);
            store.load(rows);
            assert!(matches!(store.repr, Repr::Large { .. }));
            assert_eq!(store.len(), 1_000);
            let keys: Vec<&RKey> = store.iter().map(|(k, _)| k).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "in key order");
            let want = if ascending { 500 } else { -500 };
            assert_eq!(tag(store.get(&key(500)).unwrap()), want);
            assert_eq!(tag(store.last().unwrap().1), 999);
            store.release_paced();
            assert_eq!(store.len(), 0);
            assert!(store.get(&key(1)).is_none());
        }
    }

    /// Random inserts, replacements and removals that grow views past the compact form and
    /// shrink them back, checked after every step against the model.
    #[test]
    fn store_matches_a_sorted_vec_across_both_forms() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let orders: [(Order, bool); 4] = [
            (Arc::from(vec![]), false),
            (Arc::from(vec![(false, None)]), true),
            (Arc::from(vec![(true, Some(false)), (false, None)]), true),
            (Arc::from(vec![(true, Some(true))]), true),
        ];
        for (order, ordered) in orders {
            let mut store = Store::new(order.clone(), ordered);
            let mut model: Vec<(RKey, Out)> = Vec::new();
            let mut was_large = false;
            let mut shrank = false;
            for step in 0..3_000 {
                // Grow for a while, then shrink, then grow again.
                let growing = (step / 500) % 2 == 0;
                let mut key = vec![
                    Value::Integer(next(4) as i64),
                    Value::Integer(next(40) as i64),
                ];
                let insert = if growing { next(10) < 8 } else { next(10) < 1 };
                if !growing && !model.is_empty() && next(10) < 9 {
                    key = model[next(model.len() as u64) as usize].0.clone(); // a hit
                }
                if insert {
                    let sort: Vec<Value> = order
                        .iter()
                        .map(|_| match next(5) {
                            0 => Value::Null,
                            n => Value::Integer(n as i64),
                        })
                        .collect();
                    let o = out(sort, step);
                    model.retain(|(k, _)| *k != key);
                    model.push((key.clone(), o.clone()));
                    store.insert(key.clone(), o);
                } else {
                    let had = model.iter().any(|(k, _)| *k == key);
                    model.retain(|(k, _)| *k != key);
                    assert_eq!(store.remove(&key).is_some(), had);
                }
                model_order(&order, ordered, &mut model);
                let large = matches!(store.repr, Repr::Large { .. });
                shrank |= was_large && !large;
                was_large |= large;
                assert_eq!(store.len(), model.len());
                let got: Vec<(&RKey, i64)> = store.iter().map(|(k, o)| (k, tag(o))).collect();
                let want: Vec<(&RKey, i64)> = model.iter().map(|(k, o)| (k, tag(o))).collect();
                if ordered {
                    assert_eq!(got, want, "step {step}");
                    for (i, (k, o)) in model.iter().enumerate().step_by(5) {
                        assert_eq!(store.rank(k, o), i, "step {step}");
                    }
                } else {
                    let mut got = got;
                    got.sort();
                    assert_eq!(got, want, "step {step}");
                }
                for (k, o) in &model {
                    assert_eq!(store.get(k).unwrap().row, o.row);
                }
                let first = Value::Integer(next(4) as i64);
                let mut with_first = store.keys_with_first(&first);
                with_first.sort();
                let mut expected: Vec<RKey> = model
                    .iter()
                    .filter(|(k, _)| k[0] == first)
                    .map(|(k, _)| k.clone())
                    .collect();
                expected.sort();
                assert_eq!(with_first, expected);
            }
            assert!(
                was_large && shrank,
                "both forms and both switches were exercised"
            );
        }
    }
}
