//! The registry's per-view indexes in their compact forms: a server may hold a million idle
//! views, so every byte an index spends per view is a megabyte.
//!
//! - [`QueryIndex`]: views by (normalised text, canonical parameter bytes), for sharing. It
//!   stores only `(hash, view id)` — 16 bytes a slot — and confirms a hash match against the
//!   view itself; a map keyed by the text and the bytes cost ~100 bytes a view (a 48-byte
//!   key and value in a table at most 7/8 full, doubling) plus the bytes' own allocation.
//! - [`IdleQueue`]: views that lost their last subscriber, in the order they did, so expiry
//!   pops the due ones instead of visiting every view (a million-view scan every tick held
//!   the live thread for tens of milliseconds).

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

/// A view's id in the registry.
pub(crate) type ViewId = u64;

/// Views by a key the caller can recompute from each view (see the module docs).
pub(crate) struct QueryIndex {
    table: HashTable<(u64, ViewId)>,
    hasher: std::collections::hash_map::RandomState,
}

impl QueryIndex {
    pub(crate) fn new() -> QueryIndex {
        QueryIndex {
            table: HashTable::new(),
            hasher: Default::default(),
        }
    }

    /// The hash of a key: the normalised text and the parameters' canonical bytes.
    pub(crate) fn hash(&self, text: &str, params: &[u8]) -> u64 {
        self.hasher.hash_one((text, params))
    }

    /// The first view under `hash` for which `is` (does this view have the key?) says yes.
    pub(crate) fn find(&self, hash: u64, mut is: impl FnMut(ViewId) -> bool) -> Option<ViewId> {
        self.table
            .find(hash, |&(h, id)| h == hash && is(id))
            .map(|&(_, id)| id)
    }

    /// Registers `id` under `hash` (the caller checked that no view has its key).
    pub(crate) fn insert(&mut self, hash: u64, id: ViewId) {
        self.table.insert_unique(hash, (hash, id), |&(h, _)| h);
    }

    /// Unregisters `id` from under `hash`; whether it was there.
    pub(crate) fn remove(&mut self, hash: u64, id: ViewId) -> bool {
        match self.table.find_entry(hash, |&(h, i)| h == hash && i == id) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// Views in the order they became idle (see the module docs). Entries are not removed when
/// a view gains a subscriber again: a popped entry counts only if the view is still idle
/// since that instant (the caller checks), and the queue is compacted when stale entries
/// outnumber the views.
#[derive(Default)]
pub(crate) struct IdleQueue {
    queue: VecDeque<(Instant, ViewId)>,
}

impl IdleQueue {
    /// Notes that view `id` became idle at `at` (not before the last noted instant). When
    /// the queue holds more than twice `live` entries plus a margin, the entries for which
    /// `current` says no are dropped first, so the queue stays O(views) however often views
    /// flap between idle and subscribed.
    pub(crate) fn push(
        &mut self,
        at: Instant,
        id: ViewId,
        live: usize,
        mut current: impl FnMut(Instant, ViewId) -> bool,
    ) {
        if self.queue.len() >= live.saturating_mul(2).saturating_add(1024) {
            self.queue.retain(|&(t, i)| current(t, i));
            self.queue.shrink_to(self.queue.len().saturating_mul(2));
        }
        self.queue.push_back((at, id));
    }

    /// Takes every entry idle for `ttl` by `now` (every entry if `all`), oldest first.
    pub(crate) fn due(&mut self, now: Instant, ttl: Duration, all: bool) -> Vec<(Instant, ViewId)> {
        let n = if all {
            self.queue.len()
        } else {
            self.queue
                .partition_point(|&(t, _)| now.saturating_duration_since(t) >= ttl)
        };
        let due: Vec<_> = self.queue.drain(..n).collect();
        if self.queue.is_empty() && self.queue.capacity() > 1024 {
            self.queue = VecDeque::new();
        }
        due
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}

/// A view's subscribers: almost always exactly one, held inline (16 bytes, no allocation);
/// a `Vec` was 24 bytes plus an allocation for the one id.
#[derive(Debug, Default)]
pub(crate) enum Subs {
    #[default]
    None,
    One(u64),
    #[allow(clippy::box_collection)] // inline, the Vec would make every view's list 32 bytes
    Many(Box<Vec<u64>>),
}

impl Subs {
    pub(crate) fn as_slice(&self) -> &[u64] {
        match self {
            Subs::None => &[],
            Subs::One(id) => std::slice::from_ref(id),
            Subs::Many(ids) => ids,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    pub(crate) fn push(&mut self, id: u64) {
        match self {
            Subs::None => *self = Subs::One(id),
            Subs::One(first) => *self = Subs::Many(Box::new(vec![*first, id])),
            Subs::Many(ids) => ids.push(id),
        }
    }

    /// Removes every occurrence of `id`, keeping the others in order.
    pub(crate) fn remove(&mut self, id: u64) {
        match self {
            Subs::None => {}
            Subs::One(only) => {
                if *only == id {
                    *self = Subs::None;
                }
            }
            Subs::Many(ids) => {
                ids.retain(|&i| i != id);
                match ids[..] {
                    [] => *self = Subs::None,
                    [only] => *self = Subs::One(only),
                    _ => {}
                }
            }
        }
    }
}

impl<'a> IntoIterator for &'a Subs {
    type Item = &'a u64;
    type IntoIter = std::slice::Iter<'a, u64>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// A small deterministic generator.
    fn mix(i: u64) -> u64 {
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 29)
    }

    /// The index against a model map from key to the ids under it, with few distinct keys
    /// (so keys repeat) and keys that share a hash (a forced collision).
    #[test]
    fn query_index_matches_a_model_map() {
        let mut index = QueryIndex::new();
        let mut model: HashMap<(String, Vec<u8>), Vec<ViewId>> = HashMap::new();
        let mut keys: BTreeMap<ViewId, (String, Vec<u8>)> = BTreeMap::new();
        let mut next = 1;
        for step in 0..20_000u64 {
            let r = mix(step);
            let key = (format!("SELECT {}", r % 7), vec![(r >> 8) as u8 % 5]);
            // A fifth of the keys hash to one value: the index must tell them apart by `is`.
            let hash = if key.1[0] == 0 {
                42
            } else {
                index.hash(&key.0, &key.1)
            };
            let is = |keys: &BTreeMap<ViewId, (String, Vec<u8>)>, id| keys[&id] == key;
            let found = index.find(hash, |id| is(&keys, id));
            let expected = model.get(&key).and_then(|ids| ids.first().copied());
            assert_eq!(found, expected, "step {step}");
            match (r >> 16) % 3 {
                0 | 1 if found.is_none() => {
                    index.insert(hash, next);
                    keys.insert(next, key.clone());
                    model.entry(key).or_default().push(next);
                    next += 1;
                }
                _ => {
                    if let Some(id) = found {
                        assert!(index.remove(hash, id));
                        assert!(!index.remove(hash, id), "removed twice");
                        keys.remove(&id);
                        let ids = model.get_mut(&key).unwrap();
                        ids.retain(|&i| i != id);
                        if ids.is_empty() {
                            model.remove(&key);
                        }
                    }
                }
            }
            assert_eq!(index.len(), keys.len());
        }
    }

    /// Subscriber lists against a `Vec` over random pushes and removes.
    #[test]
    fn subs_match_a_vec() {
        assert_eq!(std::mem::size_of::<Subs>(), 16);
        let mut subs = Subs::default();
        let mut model: Vec<u64> = Vec::new();
        for step in 0..20_000u64 {
            let r = mix(step);
            let id = (r >> 8) % 6;
            if r.is_multiple_of(2) {
                subs.push(id);
                model.push(id);
            } else {
                subs.remove(id);
                model.retain(|&i| i != id);
            }
            assert_eq!(subs.as_slice(), &model[..], "step {step}");
            assert_eq!(subs.is_empty(), model.is_empty());
            assert_eq!(matches!(subs, Subs::Many(_)), model.len() > 1);
            assert_eq!((&subs).into_iter().count(), model.len());
        }
    }

    #[test]
    fn idle_queue_hands_out_due_views_in_order_and_stays_bounded() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ttl = Duration::from_millis(100);
        let mut q = IdleQueue::default();
        for id in 0..10 {
            q.push(at(id * 10), id, 10, |_, _| true);
        }
        assert!(q.due(at(50), ttl, false).is_empty());
        let due: Vec<ViewId> = q.due(at(125), ttl, false).iter().map(|e| e.1).collect();
        assert_eq!(due, [0, 1, 2]);
        let all: Vec<ViewId> = q.due(at(125), ttl, true).iter().map(|e| e.1).collect();
        assert_eq!(all, (3..10).collect::<Vec<_>>());
        assert_eq!(q.len(), 0);

        // One view flapping between idle and subscribed: stale entries are compacted away.
        let mut current = at(0);
        for i in 0..100_000u64 {
            current = at(i);
            let now = current;
            q.push(now, 7, 1, |t, id| id == 7 && t == now);
            assert!(q.len() <= 2 + 1024 + 1, "{} entries for one view", q.len());
        }
        let due = q.due(current + ttl, ttl, false);
        assert_eq!(due.last(), Some(&(current, 7)));
    }
}
