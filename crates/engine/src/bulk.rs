//! Recovery's held-back writes (see [`crate::Db::replay_bulk`]): kept in log order in
//! blocks that are sorted as they fill, then merged into key order for the bulk build.
//!
//! Why blocks and not one `Vec`: a `Vec` of every write doubles as it grows, and each
//! doubling copies it into fresh memory the kernel must zero first — at 10 M writes
//! (64 B each) that was ~1.3 GB copied and ~2 GB of pages faulted, 13 % of recovery's CPU
//! in the profile. Blocks are allocated once at their final size, each is sorted while
//! it is still in the cache (instead of sorting hundreds of MB at the end), and the
//! merge frees each block as soon as it is consumed, so its memory is reused by the row
//! map being built. Log order is nearly key order (keys are mostly assigned ascending),
//! so blocks barely overlap and the merge costs about two comparisons per write.
//!
//! Why a [`Sorter`] thread: the thread that applies the log is recovery's critical path
//! (the decoders wait on it), and sorting the blocks was ~15 % of its time. Blocks of
//! [`SORT_ELSEWHERE_FROM`] writes or more are sorted on a thread of their own instead.

use std::cmp::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::value::{Key, Value};

/// A write held back by [`crate::Db::replay_bulk`].
pub(crate) struct PendingWrite {
    pub key: Key,
    /// `None`: a delete.
    pub values: Option<Arc<[Value]>>,
    pub version: u64,
    pub seq: u64,
    /// Its index among its commit's changes (whose before-image is set at the build).
    pub change: usize,
}

/// Key order, and log order (seq, then place in the commit) among writes of one key.
fn order(a: &PendingWrite, b: &PendingWrite) -> Ordering {
    (&a.key, a.seq, a.change).cmp(&(&b.key, b.seq, b.change))
}

/// The first block's capacity: small, so that small workloads (and tests) merge several
/// blocks too; each next block doubles, up to [`BLOCK_WRITES_MAX`].
const BLOCK_WRITES_FIRST: usize = 8;
/// Writes per block at most (64 Ki × 64 B = 4 MiB: sorted within the cache, and few
/// enough blocks at 10 M writes — 160 — for a cheap merge).
const BLOCK_WRITES_MAX: usize = 1 << 16;

/// Blocks of at least this many writes are sorted by the [`Sorter`]; smaller ones (small
/// tables, and the first blocks of every table) where they fill.
const SORT_ELSEWHERE_FROM: usize = 1024;

/// Held-back writes of one table, in log order.
pub(crate) struct PendingWrites {
    /// Names this table's blocks to the [`Sorter`].
    id: usize,
    /// Full blocks, each sorted by [`order`] (those the [`Sorter`] has are not here).
    sorted: Vec<Vec<PendingWrite>>,
    /// The block being filled, in log order.
    current: Vec<PendingWrite>,
    len: usize,
}

impl PendingWrites {
    /// `id`: distinct among the tables that share a [`Sorter`].
    pub fn new(id: usize) -> Self {
        PendingWrites {
            id,
            sorted: Vec::new(),
            current: Vec::with_capacity(BLOCK_WRITES_FIRST),
            len: 0,
        }
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, write: PendingWrite, sorter: &mut Sorter) {
        if self.current.len() == self.current.capacity() {
            let next = (self.current.capacity() * 2).clamp(BLOCK_WRITES_FIRST, BLOCK_WRITES_MAX);
            let full = std::mem::replace(&mut self.current, Vec::with_capacity(next));
            let unsorted = if full.len() >= SORT_ELSEWHERE_FROM {
                sorter.sort(self.id, full)
            } else {
                Some(full)
            };
            if let Some(block) = unsorted {
                self.seal(block);
            }
        }
        self.current.push(write);
        self.len += 1;
    }

    fn seal(&mut self, mut block: Vec<PendingWrite>) {
        if block.is_empty() {
            return;
        }
        sort(&mut block);
        self.sorted.push(block);
    }

    /// Every write in key order, each key's writes in log order. `sorted_elsewhere`: the
    /// blocks of this table [`Sorter::finish`] gave back.
    pub fn into_sorted(mut self, sorted_elsewhere: Vec<Vec<PendingWrite>>) -> Merged {
        let current = std::mem::take(&mut self.current);
        self.seal(current);
        debug_assert_eq!(
            self.sorted
                .iter()
                .chain(&sorted_elsewhere)
                .map(Vec::len)
                .sum::<usize>(),
            self.len
        );
        self.sorted.extend(sorted_elsewhere);
        let mut merged = Merged {
            heads: Vec::with_capacity(self.sorted.len()),
            rest: Vec::with_capacity(self.sorted.len()),
            heap: Vec::with_capacity(self.sorted.len()),
        };
        for block in self.sorted {
            let mut rest = block.into_iter();
            merged.heap.push(merged.heads.len());
            merged.heads.push(rest.next());
            merged.rest.push(rest);
        }
        for i in (0..merged.heap.len() / 2).rev() {
            merged.sift_down(i);
        }
        merged
    }
}

/// Runs shorter than this on average: the block is sorted as a whole.
const RUN_WRITES_MIN: usize = 16;

/// Puts a block in [`order`]. A block is mostly runs already in order — each commit's
/// writes, keys ascending — with whole commits out of place where concurrent clients'
/// commits reached the log out of key order. If its ascending runs, or else its commits,
/// do not overlap, they are put in order whole: a comparison or two per write to find
/// them, each write moved at most twice. Else (or if they are short) the block is sorted.
fn sort(block: &mut Vec<PendingWrite>) {
    for by_commit in [false, true] {
        if let Some(starts) = runs(block, by_commit) {
            if join_apart(block, &starts) {
                return;
            }
        }
    }
    sort_whole(block);
}

/// Where the block's runs start: a write out of [`order`] with the one before it starts
/// one, and (`by_commit`) so does every commit's first write. `None` if the runs are
/// shorter than [`RUN_WRITES_MIN`] on average.
fn runs(block: &[PendingWrite], by_commit: bool) -> Option<Vec<usize>> {
    let n = block.len();
    let mut starts = vec![0];
    for i in 1..n {
        let (a, b) = (&block[i - 1], &block[i]);
        if (by_commit && a.seq != b.seq) || order(a, b) == Ordering::Greater {
            starts.push(i);
            if starts.len() > n / RUN_WRITES_MIN {
                return None;
            }
        }
    }
    Some(starts)
}

/// Puts the runs starting at `starts` (each in [`order`]) in order whole, if they do not
/// overlap; `false` (and the block untouched) if they do.
fn join_apart(block: &mut Vec<PendingWrite>, starts: &[usize]) -> bool {
    let n = block.len();
    if starts.len() <= 1 {
        return true;
    }
    let end = |k: usize| starts.get(k + 1).copied().unwrap_or(n);
    // The runs by their first write; they are apart if each one's last write comes before
    // the next one's first.
    let mut by_first: Vec<usize> = (0..starts.len()).collect();
    by_first.sort_unstable_by(|&a, &b| order(&block[starts[a]], &block[starts[b]]));
    let apart = by_first
        .windows(2)
        .all(|w| order(&block[end(w[0]) - 1], &block[starts[w[1]]]) == Ordering::Less);
    if !apart {
        return false;
    }
    if by_first.iter().enumerate().all(|(place, &k)| place == k) {
        return true;
    }
    // Cut into runs from the back (each write copied once), then joined in order, into
    // the block's own buffer when its first run stays first.
    let mut runs: Vec<Vec<PendingWrite>> = starts[1..]
        .iter()
        .rev()
        .map(|&s| block.split_off(s))
        .collect();
    runs.push(std::mem::take(block));
    runs.reverse();
    let mut joined = if by_first[0] == 0 {
        std::mem::take(&mut runs[0])
    } else {
        Vec::with_capacity(n)
    };
    for &k in &by_first {
        joined.append(&mut runs[k]);
    }
    debug_assert_eq!(joined.len(), n);
    *block = joined;
    true
}

fn sort_whole(block: &mut [PendingWrite]) {
    // Unstable is fine: no two writes are equal under `order` (seq, change differ).
    block.sort_unstable_by(order);
}

/// A block sorted elsewhere, with the [`PendingWrites::id`] of its table.
type Sorted = (usize, Vec<PendingWrite>);

/// Sorts blocks on a thread of its own, started at the first block it is given; every
/// block comes back, sorted, from [`Sorter::finish`].
#[derive(Default)]
pub(crate) struct Sorter {
    running: Option<(mpsc::Sender<Sorted>, JoinHandle<Vec<Sorted>>)>,
    /// No thread could be started: blocks are sorted where they fill from then on.
    unavailable: bool,
}

impl Sorter {
    /// Hands `block` to the thread (started now if it is not running), or gives it back
    /// if no thread could be started: sorting it is then the caller's.
    fn sort(&mut self, id: usize, block: Vec<PendingWrite>) -> Option<Vec<PendingWrite>> {
        if self.unavailable {
            return Some(block);
        }
        if self.running.is_none() {
            let (to, from) = mpsc::channel::<Sorted>();
            let spawned = std::thread::Builder::new()
                .name("sluice-sort".into())
                .spawn(move || {
                    from.into_iter()
                        .map(|(id, mut block)| {
                            sort(&mut block);
                            (id, block)
                        })
                        .collect()
                });
            match spawned {
                Ok(thread) => self.running = Some((to, thread)),
                Err(e) => {
                    // Out of threads (a process or memory limit): slower, not wrong.
                    tracing::warn!(
                        error = %e,
                        "no thread to sort held-back writes on: the applying thread sorts them"
                    );
                    self.unavailable = true;
                    return Some(block);
                }
            }
        }
        let (to, _) = self.running.as_ref().expect("running");
        if to.send((id, block)).is_err() {
            // The thread ends only once `to` is dropped, or by panicking: pass that on.
            self.finish();
            unreachable!("the sorting thread stopped without panicking");
        }
        None
    }

    /// Waits for every block given so far, sorted, and stops the thread (the next
    /// [`Sorter::sort`] starts another).
    pub fn finish(&mut self) -> Vec<Sorted> {
        let Some((to, thread)) = self.running.take() else {
            return Vec::new();
        };
        drop(to);
        match thread.join() {
            Ok(sorted) => sorted,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// A k-way merge of sorted blocks: a binary min-heap of block indices by each block's
/// next write. While one block keeps holding the smallest write (blocks barely overlap),
/// each write costs the two comparisons with the root's children.
pub(crate) struct Merged {
    /// Each block's next write (`Some` for every block in the heap).
    heads: Vec<Option<PendingWrite>>,
    /// Each block's writes after its head; replaced by an empty iterator (freeing the
    /// block) once consumed.
    rest: Vec<std::vec::IntoIter<PendingWrite>>,
    heap: Vec<usize>,
}

impl Merged {
    fn less(&self, a: usize, b: usize) -> bool {
        let head = |i: usize| {
            self.heads[i]
                .as_ref()
                .expect("a block in the heap has a head")
        };
        order(head(a), head(b)) == Ordering::Less
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                return;
            }
            let mut child = left;
            if left + 1 < n && self.less(self.heap[left + 1], self.heap[left]) {
                child = left + 1;
            }
            if !self.less(self.heap[child], self.heap[i]) {
                return;
            }
            self.heap.swap(i, child);
            i = child;
        }
    }
}

impl Iterator for Merged {
    type Item = PendingWrite;

    fn next(&mut self) -> Option<PendingWrite> {
        let &block = self.heap.first()?;
        let write = self.heads[block]
            .take()
            .expect("a block in the heap has a head");
        match self.rest[block].next() {
            Some(next) => self.heads[block] = Some(next),
            None => {
                // Consumed: free the block now, and take it out of the heap.
                self.rest[block] = Vec::new().into_iter();
                let last = self.heap.pop().expect("the heap holds `block`");
                if self.heap.is_empty() {
                    return Some(write);
                }
                self.heap[0] = last;
            }
        }
        self.sift_down(0);
        Some(write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: i64, seq: u64, change: usize) -> PendingWrite {
        PendingWrite {
            key: Key::Int(key),
            values: None,
            version: 1,
            seq,
            change,
        }
    }

    /// The merge yields exactly a stable sort by key of the writes in log order, for
    /// ascending, nearly ascending and descending keys, commits of ascending keys out of
    /// order (runs apart, and runs that overlap), and random keys, with repeats, across
    /// many block sizes (every count from 0 to 300, then larger ones past the block cap),
    /// with the large blocks sorted on the sorting thread or, when none could be started,
    /// where they fill.
    #[test]
    fn merged_blocks_equal_a_stable_sort_by_key() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let counts = (0..=300).chain([BLOCK_WRITES_MAX - 1, BLOCK_WRITES_MAX * 3 + 17]);
        for (n, threaded) in counts.flat_map(|n| [(n, true), (n, false)]) {
            for pattern in 0..6 {
                let keys: Vec<i64> = (0..n as i64)
                    .map(|i| match pattern {
                        0 => i,
                        1 => i + rand(200) as i64 - 100,
                        2 => -i,
                        // Commits of 100 ascending keys, four at a time out of order (as
                        // concurrent clients' commits reach the log): runs apart.
                        3 => [300, 100, 0, 200][(i / 100 % 4) as usize] + i / 400 * 400 + i % 100,
                        // Commits of 40 keys from two ranges that interleave: runs overlap.
                        4 => (i / 40 % 2) * 20 + i / 80 * 80 + i % 40 * 2 - (i / 40 % 2) * 19,
                        _ => rand(n as u64 / 2 + 1) as i64,
                    })
                    .collect();
                let mut pending = PendingWrites::new(0);
                let mut sorter = Sorter {
                    running: None,
                    unavailable: !threaded,
                };
                let mut expected = Vec::new();
                for (i, &k) in keys.iter().enumerate() {
                    // Commits of 7 writes, or of the 100 or 40 of patterns 3 and 4.
                    let per_commit = match pattern {
                        3 => 100,
                        4 => 40,
                        _ => 7,
                    };
                    let (seq, change) = (i as u64 / per_commit + 1, i % per_commit as usize);
                    pending.push(write(k, seq, change), &mut sorter);
                    expected.push((k, seq, change));
                }
                assert_eq!(pending.len(), n);
                expected.sort_by_key(|&(k, ..)| k); // stable: log order within a key
                let elsewhere = sorter.finish().into_iter().map(|(id, block)| {
                    assert_eq!(id, 0);
                    block
                });
                let got: Vec<(i64, u64, usize)> = pending
                    .into_sorted(elsewhere.collect())
                    .map(|w| match w.key {
                        Key::Int(k) => (k, w.seq, w.change),
                        Key::Text(_) => unreachable!(),
                    })
                    .collect();
                assert!(
                    got == expected,
                    "{n} writes, pattern {pattern}, threaded {threaded}"
                );
            }
        }
    }

    /// A block of runs (ascending keys) is put in the order a sort gives, whether its runs
    /// are apart (moved whole) or overlap, are short or long, with repeated keys.
    #[test]
    fn a_block_of_runs_sorts_as_a_whole_sort_does() {
        let mut rng = sluice_fuzzkit::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut rand = move |n: usize| rng.below(n);
        for case in 0..2_000 {
            let runs = 1 + rand(40);
            let run_len = 1 + rand(60);
            let overlap = case % 3 == 0;
            let mut order_of_runs: Vec<usize> = (0..runs).collect();
            for i in (1..runs).rev() {
                order_of_runs.swap(i, rand(i + 1));
            }
            let mut block = Vec::new();
            for (place, &r) in order_of_runs.iter().enumerate() {
                let len = 1 + rand(run_len);
                let base = if overlap {
                    rand(50) as i64
                } else {
                    r as i64 * 1_000
                };
                let step = 1 + rand(3) as i64;
                for j in 0..len {
                    let key = base + j as i64 * step - if rand(20) == 0 { 1 } else { 0 };
                    block.push(write(key, place as u64 + 1, j));
                }
            }
            let mut want: Vec<(i64, u64, usize)> =
                block.iter().map(|w| (key_of(w), w.seq, w.change)).collect();
            want.sort();
            sort(&mut block);
            let got: Vec<(i64, u64, usize)> =
                block.iter().map(|w| (key_of(w), w.seq, w.change)).collect();
            assert_eq!(got, want, "case {case}: {runs} runs of up to {run_len}");
        }
    }

    fn key_of(w: &PendingWrite) -> i64 {
        match w.key {
            Key::Int(k) => k,
            Key::Text(_) => unreachable!(),
        }
    }
}
