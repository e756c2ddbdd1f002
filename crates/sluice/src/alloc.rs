//! The server's global allocator: mimalloc, wrapped to count live heap bytes and blocks.
//!
//! The counts are exact (what the program asked for, not what the allocator holds from the
//! operating system), so `sluice bench live` can give memory per view from them where RSS
//! moves by whole pages and keeps freed ones. They show in `/metrics` as
//! `sluice_alloc_bytes` and `sluice_alloc_blocks`.
//!
//! Off by default (`sluice serve --count-allocations` turns it on): counting costs two relaxed
//! atomic adds per allocation and per free on two counters every thread shares, which the
//! write path should not pay when nobody reads them. Off, the cost is one relaxed load of a
//! flag that is never written. Counting starts when it is enabled, so the absolute figure
//! misses what was allocated before (and is lowered by freeing it); differences between two
//! readings — what the live bench uses — are exact. No locks, no allocation, no
//! thread-locals (a global allocator must not allocate itself).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// Whether allocations are counted (see the module docs).
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Starts counting allocations from now on.
pub fn enable_counting() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Bytes requested and not yet freed. Signed: a block freed on one thread may be counted
/// before its allocation on another becomes visible (relaxed ordering), so a read can be
/// transiently off, never for long.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
/// Blocks allocated and not yet freed.
static LIVE_BLOCKS: AtomicIsize = AtomicIsize::new(0);

/// Forwards every call to the inner allocator unchanged and counts sizes.
pub struct Counting<A>(pub A);

// SAFETY: every method forwards to the inner allocator with the caller's arguments
// unchanged, so the inner allocator's guarantees hold; the counters never touch the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc_zeroed`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `dealloc`.
        unsafe { self.0.dealloc(ptr, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
            LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `realloc`.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        // On failure the old block stays allocated, unchanged.
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

/// Live heap bytes and blocks as the counters stand now.
pub fn live() -> (i64, i64) {
    (
        LIVE_BYTES.load(Ordering::Relaxed) as i64,
        LIVE_BLOCKS.load(Ordering::Relaxed) as i64,
    )
}

/// Appends the allocator's series to `/metrics` (registered with
/// [`sluice_server::add_metrics_hook`]).
pub fn render_metrics(out: &mut String) {
    let (bytes, blocks) = live();
    let _ = writeln!(
        out,
        "# HELP sluice_alloc_bytes Heap bytes allocated and not yet freed (the global allocator's own count).\n# TYPE sluice_alloc_bytes gauge\nsluice_alloc_bytes {bytes}"
    );
    let _ = writeln!(
        out,
        "# HELP sluice_alloc_blocks Heap blocks allocated and not yet freed.\n# TYPE sluice_alloc_blocks gauge\nsluice_alloc_blocks {blocks}"
    );
}

// Returning freed memory to the operating system off the threads that serve.
//
// mimalloc hands the pages a free empties back to its arenas and *purges* them
// (`madvise(MADV_DONTNEED)`) once `purge_delay` (1 s) has passed — on whichever thread next
// takes its allocation slow path. After a large view or snapshot was dropped that can be
// hundreds of MiB at once: `perf` caught the writer thread in `mi_arena_purge` → `madvise`
// for 21 ms in a row during `sluice bench bootstrap` (the slowest writer acks there were
// 40–65 ms, the server's share of them as long). So `serve` (and `bench`, whose client threads
// met the same: a subscriber's thread purged for 30 ms in `bench live`) sets the delay to
// [`PURGE_DELAY_NEVER_MS`] (no thread finds a purge due) and a thread of its own, at a low
// priority, forces the purge of everything freed every [`PURGE_INTERVAL`]. mimalloc lets
// one thread purge at a time and the others skip it, never wait.

/// `mi_option_purge_delay`'s place in mimalloc v3's `mi_option_t`
/// (`libmimalloc-sys` declares the option functions only with a feature that needs a crate
/// this build does not have; the C library linked in has them all). A unit test checks the
/// index against the option's documented default.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    fn mi_collect(force: bool);
}

/// A purge delay (ms) no allocating thread reaches: only the purge thread purges.
pub const PURGE_DELAY_NEVER_MS: i64 = 24 * 3600 * 1000;

/// How often the purge thread returns freed memory.
pub const PURGE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Nice value of the purge thread (as the snapshot thread's): a purge of a large drop is
/// tens of milliseconds of kernel time that must not take turns with a write's path.
const PURGE_NICE: i32 = 10;

/// Starts the purge thread (see above). Best effort: if it cannot start, mimalloc purges as
/// it did before, on the allocating threads.
pub fn purge_in_background() {
    let spawned = std::thread::Builder::new()
        .name("sluice-purge".into())
        .spawn(|| {
            // Best effort: a refusal only costs latency.
            let _ = sluice_sched::set_nice(PURGE_NICE);
            loop {
                std::thread::sleep(PURGE_INTERVAL);
                // SAFETY: a plain call into the linked allocator, callable from any thread.
                unsafe { mi_collect(true) };
            }
        });
    match spawned {
        // SAFETY: mimalloc's options may be set at any time from any thread.
        Ok(_) => unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_NEVER_MS as _) },
        Err(e) => {
            tracing::warn!(error = %e, "no purge thread: mimalloc purges on allocating threads")
        }
    }
}

/// The current purge delay in milliseconds (mimalloc's `purge_delay` option).
#[cfg(test)]
pub fn purge_delay_ms() -> i64 {
    // SAFETY: reading an option has no preconditions.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) as i64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_allocation_shows_in_the_live_count() {
        // The test binary runs under the counting allocator too (it is the crate's global
        // allocator), and other test threads allocate concurrently: look for a block far
        // larger than anything else allocates, and compare with a margin.
        const BIG: usize = 64 << 20;
        enable_counting();
        let (before, _) = live();
        let kept = std::hint::black_box(vec![1u8; BIG]);
        let (during, _) = live();
        drop(kept);
        let (after, _) = live();
        assert!(during - before > (BIG as i64) / 2, "{before} → {during}");
        assert!(during - after > (BIG as i64) / 2, "{during} → {after}");
        let mut out = String::new();
        render_metrics(&mut out);
        assert!(out.contains("\nsluice_alloc_bytes "), "{out}");
        assert!(out.contains("\nsluice_alloc_blocks "), "{out}");
    }

    #[test]
    fn the_purge_delay_option_is_where_this_build_looks_for_it() {
        // mimalloc v3 documents `purge_delay` as 1000 ms by default; a wrong index would
        // read another option's value (none of those near it is 1000, nor the "never"
        // value the purge thread sets).
        let delay = purge_delay_ms();
        assert!(
            delay == 1000 || delay == PURGE_DELAY_NEVER_MS,
            "option {MI_OPTION_PURGE_DELAY} reads {delay}"
        );
    }

    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    #[test]
    fn memory_freed_goes_back_to_the_system_through_the_purge_thread() {
        // With the delay at "never" only the purge thread purges: freed memory leaves the
        // resident set within a few of its rounds.
        purge_in_background();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_NEVER_MS);
        const BLOCK: usize = 64 << 10;
        const BLOCKS: usize = 4096; // 256 MiB in arena-sized pieces
        let before = rss_bytes();
        let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![i as u8 | 1; BLOCK]).collect();
        let full = rss_bytes();
        assert!(
            full > before + (BLOCK * BLOCKS) as u64 / 2,
            "{before} → {full}"
        );
        drop(std::hint::black_box(blocks));
        let deadline = std::time::Instant::now() + 20 * PURGE_INTERVAL;
        let mut now = rss_bytes();
        while now > before + (BLOCK * BLOCKS) as u64 / 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "256 MiB freed, resident {} MiB → {} MiB → still {} MiB",
                before >> 20,
                full >> 20,
                now >> 20
            );
            std::thread::sleep(PURGE_INTERVAL / 5);
            now = rss_bytes();
        }
    }
}
