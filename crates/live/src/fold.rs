//! Opt-in coalescing (`coalesce_ms`): a subscriber that asks for a window receives at most
//! one diff per window, the net change of every commit in it, labelled with the seq of the
//! last diff it folds.
//!
//! A fold is per subscriber, not per view: each subscriber's client holds the state of its
//! own last event, so the base a folded diff is computed from is that subscriber's. The view
//! itself (its history, its other subscribers, resume) is untouched: folded diffs never enter
//! the view's history, and resuming from a folded diff's seq is exact because that seq is one
//! the view reached (and its state then is the state the folded diff leaves the client in).
//!
//! Two ways to remember the base, picked by the view's shape:
//! - **unordered** views are sets keyed by result key: the base is the visible row each key
//!   had before the first delta of the window that touched it (O(keys changed), not O(view));
//!   the folded diff is, per touched key, `add`, `remove` or `change` between that row and the
//!   current one — a key changed ten times is one `change`, added then removed is nothing.
//! - **ordered** views (`ORDER BY`, `LIMIT`/`OFFSET`) copy their visible rows (keys and shared
//!   row pointers) at the window's first diff; the folded diff compares that array with the
//!   current one exactly as a windowed view's diff compares its old and new window, so each
//!   change's `index` is right for sequential application. It costs O(visible rows) per
//!   window (not per commit).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_engine::Value;

use crate::checksum::same_row;
use crate::view::{Materialized, Op, RKey};

/// The largest `coalesce_ms` a subscriber may ask for (named in the refusal).
pub const COALESCE_MS_MAX: u32 = 10_000;

/// A subscriber's rows as of its last event, for the keys (or window) a fold may change.
pub(crate) enum Base {
    /// Per touched key, its visible row at the window's start (`None`: not in the result).
    Keys(BTreeMap<RKey, Option<Arc<[Value]>>>),
    /// The visible rows at the window's start, in order.
    Rows(Vec<(RKey, Arc<[Value]>)>),
}

/// One coalescing subscriber's window.
pub(crate) struct Fold {
    pub window: Duration,
    pub open: Option<Open>,
}

/// A window with at least one diff folded into it, waiting for its deadline.
pub(crate) struct Open {
    pub due: Instant,
    /// The seq of the newest diff folded.
    pub seq: u64,
    /// Diffs folded so far.
    pub diffs: u64,
    pub base: Base,
}

impl Fold {
    pub fn new(window_ms: u32) -> Fold {
        Fold {
            window: Duration::from_millis(u64::from(window_ms)),
            open: None,
        }
    }

    /// Notes, before `deltas` land on `mat`, what the subscriber's base needs from it; opens
    /// the window (due `now + window`) if it is not open. Returns the deadline when it opened
    /// one.
    pub fn before<V>(
        &mut self,
        mat: &Materialized,
        deltas: &BTreeMap<RKey, V>,
        now: Instant,
    ) -> Option<Instant> {
        let mut opened = None;
        let open = self.open.get_or_insert_with(|| {
            let due = now + self.window;
            opened = Some(due);
            let base = if mat.ordered() {
                Base::Rows(
                    mat.visible()
                        .map(|(k, o)| (k.clone(), o.row.clone()))
                        .collect(),
                )
            } else {
                Base::Keys(BTreeMap::new())
            };
            Open {
                due,
                seq: 0,
                diffs: 0,
                base,
            }
        });
        if let Base::Keys(keys) = &mut open.base {
            for key in deltas.keys() {
                if !keys.contains_key(key) {
                    keys.insert(key.clone(), mat.visible_row(key));
                }
            }
        }
        opened
    }

    /// Notes a diff at `seq` folded into the open window.
    pub fn folded(&mut self, seq: u64) {
        if let Some(open) = &mut self.open {
            open.seq = seq;
            open.diffs += 1;
        }
    }
}

/// The net change from `base` to `mat`'s visible rows, as a client applies it in order.
pub(crate) fn ops(base: &Base, mat: &Materialized) -> Vec<Op> {
    match base {
        Base::Keys(keys) => {
            let mut ops = Vec::new();
            for (key, before) in keys {
                let now = mat.visible_row(key);
                match (before, now) {
                    (None, None) => {}
                    (None, Some(row)) => ops.push(Op::Add {
                        key: key.clone(),
                        row,
                        index: None,
                    }),
                    (Some(_), None) => ops.push(Op::Remove {
                        key: key.clone(),
                        index: None,
                    }),
                    (Some(old), Some(row)) => {
                        if !same_row(old, &row) {
                            ops.push(Op::Change {
                                key: key.clone(),
                                row,
                                index: None,
                            });
                        }
                    }
                }
            }
            ops
        }
        Base::Rows(old) => {
            let new: Vec<(&RKey, &Arc<[Value]>)> =
                mat.visible().map(|(k, o)| (k, &o.row)).collect();
            compare(old, &new)
        }
    }
}

/// The changes that turn the ordered array `old` into `new`: removes of the keys that left,
/// then, position by position, adds of the keys that entered and changes (moves or new
/// rows) of the keys that stayed. Each `index` is where the change lands when the changes
/// are applied in order.
pub(crate) fn compare(old: &[(RKey, Arc<[Value]>)], new: &[(&RKey, &Arc<[Value]>)]) -> Vec<Op> {
    let new_keys: BTreeSet<&RKey> = new.iter().map(|(k, _)| *k).collect();
    let old_rows: BTreeMap<&RKey, &Arc<[Value]>> = old.iter().map(|(k, r)| (k, r)).collect();
    let mut ops = Vec::new();
    let mut working: Vec<&RKey> = Vec::with_capacity(old.len());
    for (k, _) in old {
        if new_keys.contains(k) {
            working.push(k);
        } else {
            // Removed back to front would keep indexes of the original; removing front to
            // back, the index is the key's place among the rows still there.
            ops.push(Op::Remove {
                key: k.clone(),
                index: Some(working.len()),
            });
        }
    }
    for (i, &(k, row)) in new.iter().enumerate() {
        let Some(old_row) = old_rows.get(k) else {
            working.insert(i, k);
            ops.push(Op::Add {
                key: k.clone(),
                row: row.clone(),
                index: Some(i),
            });
            continue;
        };
        let at = i + working[i..]
            .iter()
            .position(|w| *w == k)
            .expect("kept keys stay after the settled prefix");
        let changed = !same_row(old_row, row);
        if at != i || changed {
            working.remove(at);
            working.insert(i, k);
            ops.push(Op::Change {
                key: k.clone(),
                row: row.clone(),
                index: Some(i),
            });
        }
    }
    debug_assert_eq!(working.len(), new.len());
    ops
}
