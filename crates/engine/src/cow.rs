//! [`CowMap`]: an ordered map made of shared chunks, so a clone is a frozen version that
//! costs O(chunks) to take and the original keeps changing beside it.
//!
//! Layout: a sorted `Vec` of `Arc` chunks, each a sorted `Vec` of at most [`CHUNK_MAX`]
//! entries. Invariants: no chunk is empty; within a chunk keys ascend strictly; the last key
//! of a chunk is below the first key of the next one; `len` is the sum of chunk lengths.
//!
//! Why chunks and not a persistent B-tree: a clone copies only the top vec of pointers (a
//! few µs per million rows), a write copies only the one chunk it touches if a clone still
//! shares it (`Arc::make_mut`), and an unshared write is a binary search plus a short
//! `memmove` inside one contiguous chunk — ascending inserts (the common ingest shape)
//! append to the last chunk without moving anything. Safe Rust throughout.
//!
//! Point lookups ([`CowMap::get`], `insert`, `remove`) first *guess* where a key falls
//! when the key type can say ([`Guess`]: integers interpolate between the keys around
//! them), then gallop outward from the guess. Dense integer keys — ids — are found in one
//! or two probes per level instead of a binary search's ~17, and each avoided probe is a
//! likely cache miss on a map larger than the caches (the uniform-α transfer workload
//! spent 22 % of its writer thread in `get`). A bad guess costs at most about twice a
//! binary search; keys that cannot guess (text) search exactly as before.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::{Bound, Index, RangeBounds};
use std::sync::Arc;

/// Most entries a chunk holds; a full chunk splits in two on an insert in its middle.
pub const CHUNK_MAX: usize = 128;
/// A chunk that falls below this merges with a neighbour when both fit in one chunk.
const CHUNK_MERGE_BELOW: usize = CHUNK_MAX / 4;

type Chunk<K, V> = Arc<Vec<(K, V)>>;

/// A key that can estimate where it falls between two others: the fraction of the way
/// from `lo` to `hi` (both inclusive bounds, `lo <= self <= hi`), or `None` when it cannot
/// tell (then the search is a plain binary search). A guess only steers the search: a
/// wrong one costs probes, never a wrong answer.
pub trait Guess {
    fn guess(&self, lo: &Self, hi: &Self) -> Option<f64> {
        let _ = (lo, hi);
        None
    }
}

macro_rules! guess_by_interpolation {
    ($($t:ty),*) => {$(
        impl Guess for $t {
            fn guess(&self, lo: &Self, hi: &Self) -> Option<f64> {
                interpolate(*self as f64, *lo as f64, *hi as f64)
            }
        }
    )*};
}
guess_by_interpolation!(i64, u64, i32, u32, usize);

impl Guess for str {}
impl Guess for String {}
/// Composite keys (a live view's result keys) search without a guess.
impl<T> Guess for Vec<T> {}

/// `(x − lo) / (hi − lo)` clamped to `[0, 1]`; `None` for an empty span.
pub fn interpolate(x: f64, lo: f64, hi: f64) -> Option<f64> {
    let span = hi - lo;
    (span > 0.0).then(|| ((x - lo) / span).clamp(0.0, 1.0))
}

/// The index [`search`] probes first in `len` items, if `bounds` let `key` make a guess.
fn guess_index<Q>(len: usize, key: &Q, bounds: Option<(&Q, &Q, usize)>) -> Option<usize>
where
    Q: Ord + Guess + ?Sized,
{
    let (lo, hi, last_at) = bounds?;
    let f = key.guess(lo, hi)?;
    Some(((f * last_at as f64).round() as usize).min(len.checked_sub(1)?))
}

/// Asks the CPU to bring the cache line at `p` in (a hint: never faults, changes nothing).
#[inline]
pub fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that reads nothing architecturally and never faults,
        // whatever the address; SSE is part of x86-64's baseline.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Searches ascending `items` for `key` like `binary_search_by`, starting from a guess
/// when `bounds` (keys known to lie at indexes `0` and `last_at`) let `key` make one:
/// probes the guessed index, then gallops outward (1, 2, 4 … away) until it brackets the
/// key, then binary-searches the bracket.
fn search<T, Q>(
    items: &[T],
    key_of: impl Fn(&T) -> &Q,
    key: &Q,
    bounds: Option<(&Q, &Q, usize)>,
) -> Result<usize, usize>
where
    Q: Ord + Guess + ?Sized,
{
    let Some(at) = guess_index(items.len(), key, bounds) else {
        return items.binary_search_by(|e| key_of(e).cmp(key));
    };
    let (lo, hi) = match key_of(&items[at]).cmp(key) {
        Ordering::Equal => return Ok(at),
        Ordering::Less => {
            // The key is right of `at`: the bracket is (at, first probe above it].
            let mut lo = at + 1;
            let mut step = 1;
            loop {
                let probe = at + step;
                if probe >= items.len() {
                    break (lo, items.len());
                }
                match key_of(&items[probe]).cmp(key) {
                    Ordering::Equal => return Ok(probe),
                    Ordering::Less => lo = probe + 1,
                    Ordering::Greater => break (lo, probe),
                }
                step *= 2;
            }
        }
        Ordering::Greater => {
            // The key is left of `at`: the bracket is [last probe below it, at).
            let mut hi = at;
            let mut step = 1;
            loop {
                let Some(probe) = at.checked_sub(step) else {
                    break (0, hi);
                };
                match key_of(&items[probe]).cmp(key) {
                    Ordering::Equal => return Ok(probe),
                    Ordering::Greater => hi = probe,
                    Ordering::Less => break (probe + 1, hi),
                }
                step *= 2;
            }
        }
    };
    match items[lo..hi].binary_search_by(|e| key_of(e).cmp(key)) {
        Ok(i) => Ok(lo + i),
        Err(i) => Err(lo + i),
    }
}

/// An ordered map whose clones share storage chunk by chunk (copy on write).
pub struct CowMap<K, V> {
    chunks: Vec<Chunk<K, V>>,
    /// `firsts[i]` is the first key of `chunks[i]`: the chunk search is a binary search over
    /// one contiguous vec instead of a pointer chase into every probed chunk (which made
    /// random reads 1.5–3× slower than a `BTreeMap`).
    firsts: Vec<K>,
    len: usize,
}

impl<K: Clone, V> Clone for CowMap<K, V> {
    /// O(chunks): the clone shares every chunk; later writes to either side copy the one
    /// chunk they touch.
    fn clone(&self) -> Self {
        CowMap {
            chunks: self.chunks.clone(),
            firsts: self.firsts.clone(),
            len: self.len,
        }
    }
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap {
            chunks: Vec::new(),
            firsts: Vec::new(),
            len: 0,
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for CowMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<K: Eq, V: Eq> Eq for CowMap<K, V> {}

impl<K, V> CowMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of chunks (for tests and memory accounting).
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// How many of this map's chunks `other` shares (tests: what a write copied).
    pub fn shared_chunks_with(&self, other: &Self) -> usize {
        let theirs: std::collections::HashSet<*const Vec<(K, V)>> =
            other.chunks.iter().map(Arc::as_ptr).collect();
        self.chunks
            .iter()
            .filter(|c| theirs.contains(&Arc::as_ptr(c)))
            .count()
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            head: [].iter(),
            mid: self.chunks.iter(),
            tail: [].iter(),
            remaining: self.len,
        }
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.iter().map(|(_, v)| v)
    }

    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.chunks
            .first()
            .and_then(|c| c.first())
            .map(|(k, v)| (k, v))
    }

    /// The chunks, in key order, each with up to [`CHUNK_MAX`] entries: for dropping a large
    /// map a chunk at a time (between which the caller can yield the CPU).
    pub fn into_chunks(self) -> impl Iterator<Item = Arc<Vec<(K, V)>>> {
        self.chunks.into_iter()
    }

    pub fn last_key_value(&self) -> Option<(&K, &V)> {
        self.chunks
            .last()
            .and_then(|c| c.last())
            .map(|(k, v)| (k, v))
    }

    /// Builds a map from entries in strictly ascending key order (snapshot loading,
    /// recovery, a live view's rows), filling each chunk to [`CHUNK_MAX`].
    pub fn from_sorted(entries: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Ord + Clone,
    {
        let entries = entries.into_iter();
        let mut builder = CowMapBuilder::with_capacity(entries.size_hint().0);
        for (k, v) in entries {
            builder.push(k, v);
        }
        builder.finish()
    }
}

impl<K: Ord + Clone, V: Clone> CowMap<K, V> {
    /// The chunk that holds `key` if any chunk does: the last chunk whose first key is
    /// at or below `key`.
    fn chunk_of<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let bounds = match (self.firsts.first(), self.firsts.last()) {
            (Some(lo), Some(hi)) => Some((lo.borrow(), hi.borrow(), self.firsts.len() - 1)),
            _ => None,
        };
        match search(&self.firsts, |f| f.borrow(), key, bounds) {
            Ok(c) => Some(c),
            Err(after) => after.checked_sub(1),
        }
    }

    /// `key`'s index in chunk `c` (or where it would go), guessing from the chunk's first
    /// key and the next chunk's first key (both already in `firsts`, so the guess costs
    /// no probe into the chunk).
    fn find_in<Q>(&self, c: usize, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        search(&self.chunks[c], |e| e.0.borrow(), key, self.bounds_in(c))
    }

    /// Keys known to lie at chunk `c`'s first index and at an index past it, for the
    /// guess: the chunk's first key and the next chunk's (both in `firsts`, so the guess
    /// costs no probe into the chunk), or the chunk's last key for the last chunk.
    fn bounds_in<Q>(&self, c: usize) -> Option<(&Q, &Q, usize)>
    where
        K: Borrow<Q>,
        Q: ?Sized,
    {
        let chunk = &self.chunks[c];
        match self.firsts.get(c + 1) {
            Some(next) => Some((self.firsts[c].borrow(), next.borrow(), chunk.len())),
            None => chunk
                .last()
                .map(|(last, _)| (self.firsts[c].borrow(), last.borrow(), chunk.len() - 1)),
        }
    }

    /// Starts bringing in the entry a [`CowMap::get`] of `key` would probe first (its
    /// chunk's guessed slot), so a get a little later finds it cached. Reads only what a
    /// get reads before that probe.
    pub fn prefetch<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let Some(c) = self.chunk_of(key) else {
            return;
        };
        let chunk = &self.chunks[c];
        if let Some(at) = guess_index(chunk.len(), key, self.bounds_in(c)) {
            prefetch_line(&chunk[at]);
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let c = self.chunk_of(key)?;
        let i = self.find_in(c, key).ok()?;
        Some(&self.chunks[c][i].1)
    }

    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let c = self.chunk_of(key)?;
        let i = self.find_in(c, key).ok()?;
        let (k, v) = &self.chunks[c][i];
        Some((k, v))
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Mutable access; copies the entry's chunk first if a clone shares it.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let c = self.chunk_of(key)?;
        let i = self.find_in(c, key).ok()?;
        Some(&mut Arc::make_mut(&mut self.chunks[c])[i].1)
    }

    /// Stores `value` under `key`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V>
    where
        K: Guess,
    {
        let Some(last) = self.chunks.len().checked_sub(1) else {
            let mut chunk = Vec::with_capacity(CHUNK_MAX);
            self.firsts.push(key.clone());
            chunk.push((key, value));
            self.chunks.push(Arc::new(chunk));
            self.len = 1;
            return None;
        };
        // Below every key: the first chunk takes it.
        let c = self.chunk_of(&key).unwrap_or(0);
        let at = match self.find_in(c, &key) {
            Ok(i) => {
                let slot = &mut Arc::make_mut(&mut self.chunks[c])[i].1;
                return Some(std::mem::replace(slot, value));
            }
            Err(i) => i,
        };
        self.len += 1;
        let full = self.chunks[c].len() >= CHUNK_MAX;
        if !full {
            if at == 0 {
                self.firsts[c] = key.clone();
            }
            Arc::make_mut(&mut self.chunks[c]).insert(at, (key, value));
        } else if c == last && at == CHUNK_MAX {
            // Ascending inserts start a new chunk and leave the full one full.
            let mut chunk = Vec::with_capacity(CHUNK_MAX);
            self.firsts.push(key.clone());
            chunk.push((key, value));
            self.chunks.push(Arc::new(chunk));
        } else if c == 0 && at == 0 {
            // Descending inserts likewise.
            let mut chunk = Vec::with_capacity(CHUNK_MAX);
            self.firsts.insert(0, key.clone());
            chunk.push((key, value));
            self.chunks.insert(0, Arc::new(chunk));
        } else {
            let left = Arc::make_mut(&mut self.chunks[c]);
            let mut right = Vec::with_capacity(CHUNK_MAX);
            right.extend(left.drain(CHUNK_MAX / 2..));
            if at <= CHUNK_MAX / 2 {
                left.insert(at, (key, value));
            } else {
                right.insert(at - CHUNK_MAX / 2, (key, value));
            }
            // `at == 0` only reaches a full chunk as chunk 0 (handled above), so the left
            // chunk's first key is unchanged.
            self.firsts.insert(c + 1, right[0].0.clone());
            self.chunks.insert(c + 1, Arc::new(right));
        }
        None
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        self.remove_entry(key).map(|(_, v)| v)
    }

    pub fn remove_entry<Q>(&mut self, key: &Q) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Ord + Guess + ?Sized,
    {
        let c = self.chunk_of(key)?;
        let i = self.find_in(c, key).ok()?;
        let chunk = Arc::make_mut(&mut self.chunks[c]);
        let entry = chunk.remove(i);
        self.len -= 1;
        let left_len = chunk.len();
        if left_len > 0 && i == 0 {
            self.firsts[c] = chunk[0].0.clone();
        }
        if left_len == 0 {
            self.chunks.remove(c);
            self.firsts.remove(c);
        } else if left_len < CHUNK_MERGE_BELOW {
            self.merge_small(c);
        }
        Some(entry)
    }

    /// Merges small chunk `c` into a neighbour when the two fit in one chunk.
    fn merge_small(&mut self, c: usize) {
        let n = self.chunks[c].len();
        let (left, right) =
            if c + 1 < self.chunks.len() && self.chunks[c + 1].len() + n <= CHUNK_MAX {
                (c, c + 1)
            } else if c > 0 && self.chunks[c - 1].len() + n <= CHUNK_MAX {
                (c - 1, c)
            } else {
                return;
            };
        let moved = self.chunks.remove(right);
        self.firsts.remove(right);
        let into = Arc::make_mut(&mut self.chunks[left]);
        match Arc::try_unwrap(moved) {
            Ok(entries) => into.extend(entries),
            Err(shared) => into.extend(shared.iter().cloned()),
        }
    }

    /// Mutable values in key order; copies every chunk a clone shares.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.chunks
            .iter_mut()
            .flat_map(|c| Arc::make_mut(c).iter_mut().map(|(_, v)| v))
    }

    /// The position of the first entry at or after `bound` taken as a lower bound.
    fn lower<Q>(&self, bound: Bound<&Q>) -> (usize, usize)
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match bound {
            Bound::Unbounded => (0, 0),
            Bound::Included(k) => self.first_where(|e| e.borrow() >= k),
            Bound::Excluded(k) => self.first_where(|e| e.borrow() > k),
        }
    }

    /// The position just past the last entry within `bound` taken as an upper bound.
    fn upper<Q>(&self, bound: Bound<&Q>) -> (usize, usize)
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match bound {
            Bound::Unbounded => (self.chunks.len(), 0),
            Bound::Included(k) => self.first_where(|e| e.borrow() > k),
            Bound::Excluded(k) => self.first_where(|e| e.borrow() >= k),
        }
    }

    /// The position `(chunk, index)` of the first entry whose key satisfies `at_or_after`
    /// (a predicate monotone in key order), or `(chunks, 0)` if none does.
    fn first_where(&self, at_or_after: impl Fn(&K) -> bool) -> (usize, usize) {
        // The first chunk whose first key satisfies it; the entry may still be in the chunk
        // before.
        let j = self.firsts.partition_point(|f| !at_or_after(f));
        if let Some(prev) = j.checked_sub(1) {
            let i = self.chunks[prev].partition_point(|e| !at_or_after(&e.0));
            if i < self.chunks[prev].len() {
                return (prev, i);
            }
        }
        (j, 0)
    }

    /// Entries with keys in `range`, ascending (reversible). An empty or inverted range
    /// yields nothing (where `BTreeMap::range` would panic on an inverted one).
    pub fn range<Q, R>(&self, range: R) -> Iter<'_, K, V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q>,
    {
        let (sc, si) = self.lower(range.start_bound());
        let (ec, ei) = self.upper(range.end_bound());
        let empty = Iter {
            head: [].iter(),
            mid: [].iter(),
            tail: [].iter(),
            remaining: 0,
        };
        match (sc, si).cmp(&(ec, ei)) {
            Ordering::Greater | Ordering::Equal => empty,
            Ordering::Less if sc == ec => Iter {
                head: self.chunks[sc][si..ei].iter(),
                mid: [].iter(),
                tail: [].iter(),
                remaining: ei - si,
            },
            Ordering::Less => {
                let mid = &self.chunks[sc + 1..ec];
                let tail: &[(K, V)] = if ec < self.chunks.len() {
                    &self.chunks[ec][..ei]
                } else {
                    &[]
                };
                let head = &self.chunks[sc][si..];
                Iter {
                    remaining: head.len() + mid.iter().map(|c| c.len()).sum::<usize>() + tail.len(),
                    head: head.iter(),
                    mid: mid.iter(),
                    tail: tail.iter(),
                }
            }
        }
    }

    /// Checks the layout invariants (tests).
    pub fn check_invariants(&self) {
        let mut n = 0;
        let mut prev: Option<&K> = None;
        for c in &self.chunks {
            assert!(!c.is_empty(), "no chunk is empty");
            assert!(c.len() <= CHUNK_MAX, "a chunk holds at most CHUNK_MAX");
            for (k, _) in c.iter() {
                assert!(prev.is_none_or(|p| p < k), "keys ascend strictly");
                prev = Some(k);
            }
            n += c.len();
        }
        assert_eq!(n, self.len, "len is the sum of chunk lengths");
        assert_eq!(
            self.firsts.len(),
            self.chunks.len(),
            "one first key per chunk"
        );
        for (f, c) in self.firsts.iter().zip(&self.chunks) {
            assert!(*f == c[0].0, "firsts[i] is chunk i's first key");
        }
    }
}

impl<K, Q, V> Index<&Q> for CowMap<K, V>
where
    K: Borrow<Q> + Ord + Clone,
    Q: Ord + Guess + ?Sized,
    V: Clone,
{
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry found for key")
    }
}

impl<'a, K, V> IntoIterator for &'a CowMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for CowMap<K, V> {
    /// Like `BTreeMap`: any order, and the last value for a repeated key wins.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        if entries.windows(2).all(|w| w[0].0 < w[1].0) {
            return CowMap::from_sorted(entries);
        }
        // Stable: equal keys keep their order, so the last one is the one to keep.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduped: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for e in entries {
            match deduped.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => deduped.push(e),
            }
        }
        CowMap::from_sorted(deduped)
    }
}

/// Builds a [`CowMap`] from entries pushed in strictly ascending key order, chunk by chunk
/// (snapshot loading and recovery need no intermediate `Vec` of all rows).
pub struct CowMapBuilder<K, V> {
    chunks: Vec<Chunk<K, V>>,
    current: Vec<(K, V)>,
    len: usize,
}

impl<K: Ord + Clone, V> CowMapBuilder<K, V> {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// `entries` is a hint of how many entries will be pushed.
    pub fn with_capacity(entries: usize) -> Self {
        CowMapBuilder {
            chunks: Vec::with_capacity(entries.div_ceil(CHUNK_MAX)),
            current: Vec::with_capacity(CHUNK_MAX),
            len: 0,
        }
    }

    /// Appends an entry; its key must be above every key pushed before (asserted).
    pub fn push(&mut self, key: K, value: V) {
        assert!(
            self.last_key().is_none_or(|p| *p < key),
            "CowMapBuilder::push takes keys in strictly ascending order"
        );
        if self.current.len() == CHUNK_MAX {
            let full = std::mem::replace(&mut self.current, Vec::with_capacity(CHUNK_MAX));
            self.chunks.push(Arc::new(full));
        }
        self.current.push((key, value));
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The last (greatest) key pushed so far.
    pub fn last_key(&self) -> Option<&K> {
        self.current
            .last()
            .map(|e| &e.0)
            .or_else(|| self.chunks.last().map(|c| &c[c.len() - 1].0))
    }

    pub fn finish(mut self) -> CowMap<K, V> {
        if !self.current.is_empty() {
            // A map of a few dozen entries keeps a few dozen slots, not CHUNK_MAX (a live
            // view of 40 rows); the next insert past them grows the vec as usual.
            self.current.shrink_to_fit();
            self.chunks.push(Arc::new(self.current));
        }
        let firsts = self.chunks.iter().map(|c| c[0].0.clone()).collect();
        CowMap {
            chunks: self.chunks,
            firsts,
            len: self.len,
        }
    }
}

impl<K: Ord + Clone, V> Default for CowMapBuilder<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

/// Iterator over a [`CowMap`] or a range of it, in key order from either end.
pub struct Iter<'a, K, V> {
    /// The partial chunk at the front being walked.
    head: std::slice::Iter<'a, (K, V)>,
    /// Whole chunks between the ends.
    mid: std::slice::Iter<'a, Chunk<K, V>>,
    /// The partial chunk at the back being walked.
    tail: std::slice::Iter<'a, (K, V)>,
    remaining: usize,
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.head.next() {
                self.remaining -= 1;
                return Some((k, v));
            }
            match self.mid.next() {
                Some(c) => self.head = c.iter(),
                None => {
                    let (k, v) = self.tail.next()?;
                    self.remaining -= 1;
                    return Some((k, v));
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.tail.next_back() {
                self.remaining -= 1;
                return Some((k, v));
            }
            match self.mid.next_back() {
                Some(c) => self.tail = c.iter(),
                None => {
                    let (k, v) = self.head.next_back()?;
                    self.remaining -= 1;
                    return Some((k, v));
                }
            }
        }
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<K, V> std::iter::FusedIterator for Iter<'_, K, V> {}

impl<K, V> Clone for Iter<'_, K, V> {
    fn clone(&self) -> Self {
        Iter {
            head: self.head.clone(),
            mid: self.mid.clone(),
            tail: self.tail.clone(),
            remaining: self.remaining,
        }
    }
}
