//! [`Ranked`]: an ordered set that also answers "how many elements come before x" — the
//! `index` of a change in an ordered view — without walking the elements before it.
//!
//! Elements live in sorted chunks of at most `chunk_max`. Finding an element's chunk is a
//! binary search over the chunks' last elements; its rank is the summed lengths of the chunks
//! before it (a scan of `len / chunk_max` integers) plus a binary search inside its chunk.
//! At a million rows and 512 per chunk that is ~2 000 additions instead of a million steps
//! through a B-tree, and inserting or removing moves at most one chunk's elements.

/// Elements per chunk before it is split in two.
pub const CHUNK_MAX: usize = 512;

pub struct Ranked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
    chunk_max: usize,
}

impl<T: Ord> Ranked<T> {
    pub fn new() -> Ranked<T> {
        Ranked::with_chunk_max(CHUNK_MAX)
    }

    /// With chunks of at most `chunk_max` (≥ 2) elements (small ones exercise the splits).
    pub fn with_chunk_max(chunk_max: usize) -> Ranked<T> {
        assert!(chunk_max >= 2, "a chunk must hold two elements to split");
        Ranked {
            chunks: Vec::new(),
            len: 0,
            chunk_max,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The first chunk whose last element is not below `x` (`chunks.len()` if none).
    fn chunk_of(&self, x: &T) -> usize {
        self.chunks
            .partition_point(|c| c.last().expect("chunks are never empty") < x)
    }

    /// The number of elements less than `x`.
    pub fn rank(&self, x: &T) -> usize {
        let ci = self.chunk_of(x);
        if ci == self.chunks.len() {
            return self.len;
        }
        let before: usize = self.chunks[..ci].iter().map(Vec::len).sum();
        before + self.chunks[ci].partition_point(|e| e < x)
    }

    /// Adds `x`; false if it was already there.
    pub fn insert(&mut self, x: T) -> bool {
        if self.chunks.is_empty() {
            self.chunks.push(vec![x]);
            self.len = 1;
            return true;
        }
        let ci = self.chunk_of(&x).min(self.chunks.len() - 1);
        let chunk = &mut self.chunks[ci];
        let Err(at) = chunk.binary_search(&x) else {
            return false;
        };
        chunk.insert(at, x);
        self.len += 1;
        if chunk.len() > self.chunk_max {
            let tail = chunk.split_off(chunk.len() / 2);
            self.chunks.insert(ci + 1, tail);
        }
        true
    }

    /// Removes `x`; false if it was not there.
    pub fn remove(&mut self, x: &T) -> bool {
        let ci = self.chunk_of(x);
        let Some(chunk) = self.chunks.get_mut(ci) else {
            return false;
        };
        let Ok(at) = chunk.binary_search(x) else {
            return false;
        };
        chunk.remove(at);
        self.len -= 1;
        let left = chunk.len();
        if left == 0 {
            self.chunks.remove(ci);
        } else if left < self.chunk_max / 4
            && self
                .chunks
                .get(ci + 1)
                .is_some_and(|next| left + next.len() <= self.chunk_max)
        {
            // Keep chunks from thinning out: fold a small one into its successor.
            let next = self.chunks.remove(ci + 1);
            self.chunks[ci].extend(next);
        }
        true
    }

    pub fn last(&self) -> Option<&T> {
        self.chunks.last().and_then(|c| c.last())
    }

    /// The elements in order, from the `skip`-th: O(len / chunk_max) to get there.
    pub fn iter_from(&self, skip: usize) -> impl Iterator<Item = &T> {
        let mut skipped = 0;
        let mut first = self.chunks.len();
        for (i, c) in self.chunks.iter().enumerate() {
            if skipped + c.len() > skip {
                first = i;
                break;
            }
            skipped += c.len();
        }
        let within = skip - skipped;
        self.chunks[first..]
            .iter()
            .enumerate()
            .flat_map(move |(i, c)| if i == 0 { &c[within..] } else { &c[..] })
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }
}

impl<T: Ord> Default for Ranked<T> {
    fn default() -> Self {
        Ranked::new()
    }
}

impl<T: Ord> FromIterator<T> for Ranked<T> {
    /// Sorts once and fills chunks half full, so the first inserts do not split at once.
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let mut all: Vec<T> = items.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut r = Ranked::new();
        r.len = all.len();
        let per = (r.chunk_max / 2).max(1);
        let mut rest = all.into_iter().peekable();
        while rest.peek().is_some() {
            r.chunks.push(rest.by_ref().take(per).collect());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Random inserts and removals with tiny chunks, checked against a `BTreeSet`.
    #[test]
    fn ranked_matches_a_btreeset() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for chunk_max in [2, 3, 8, 512] {
            let mut r = Ranked::with_chunk_max(chunk_max);
            let mut model = BTreeSet::new();
            for step in 0..4_000 {
                let x = next(300);
                // Mostly grow in the first half, mostly shrink in the second.
                let grow = if step < 2_000 { 7 } else { 3 };
                if next(10) < grow {
                    assert_eq!(r.insert(x), model.insert(x));
                } else {
                    assert_eq!(r.remove(&x), model.remove(&x));
                }
                assert_eq!(r.len(), model.len());
                let probe = next(310);
                assert_eq!(r.rank(&probe), model.range(..probe).count(), "step {step}");
                assert_eq!(r.last(), model.last());
                let skip = next(model.len() as u64 + 2) as usize;
                assert!(r.iter_from(skip).eq(model.iter().skip(skip)));
                assert!(r
                    .chunks
                    .iter()
                    .all(|c| !c.is_empty() && c.len() <= chunk_max));
            }
            assert!(r.iter().eq(model.iter()));
        }
        let built: Ranked<u64> = [5, 3, 9, 3, 1].into_iter().collect();
        assert!(built.iter().copied().eq([1, 3, 5, 9]));
        assert_eq!(built.rank(&6), 3);
    }
}
