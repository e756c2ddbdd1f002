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
}
