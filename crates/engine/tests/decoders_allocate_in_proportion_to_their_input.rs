//! A count read from bytes sizes no allocation by itself: a commit record or snapshot frame
//! whose count claims as many items as it has bytes left (each item would decode to a struct
//! many times its smallest encoding), followed by bytes that fail at the first item, is
//! refused without any single allocation larger than a small multiple of the input. Measured with a counting global allocator, so the numbers are
//! exact whatever the machine's load.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_engine::codec;

struct Largest;
static LARGEST_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_BYTES.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_BYTES.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Largest = Largest;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The largest single allocation `f` made.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST_BYTES.store(0, Ordering::SeqCst);
    f();
    LARGEST_BYTES.load(Ordering::SeqCst)
}

#[test]
fn counts_claiming_every_byte_left_allocate_in_proportion_to_the_input() {
    const BODY: usize = 1 << 20;
    // A rows record: seq 1, then a count of changes as large as the bytes after it.
    let mut rows = vec![codec::RECORD_ROWS];
    rows.extend_from_slice(&1u64.to_le_bytes());
    varint(BODY as u64, &mut rows);
    rows.resize(rows.len() + BODY, 0xff);
    // A snapshot rows frame for table "t" with as many rows as bytes.
    let mut snap = vec![codec::SNAP_ROWS, 1, b't'];
    varint(BODY as u64, &mut snap);
    snap.resize(snap.len() + BODY, 0xff);
    // A schema frame with one table of as many indexes as bytes.
    let mut schema = vec![codec::SNAP_SCHEMA, 1, 1, b't', 1, 1, b'a', 1, 0, 0, 0];
    varint(BODY as u64, &mut schema);
    schema.resize(schema.len() + BODY, 0xff);

    let budget = 2 * BODY;
    let largest = largest_allocation(|| assert!(codec::decode_commit(&rows).is_err()));
    assert!(
        largest <= budget,
        "a rows record allocated {largest} bytes at once"
    );
    rows[0] = codec::RECORD_ROWS_PACKED;
    let largest = largest_allocation(|| assert!(codec::decode_commit(&rows).is_err()));
    assert!(
        largest <= budget,
        "a packed rows record allocated {largest} bytes at once"
    );
    let largest = largest_allocation(|| assert!(codec::decode_snapshot_frame(&snap).is_err()));
    assert!(
        largest <= budget,
        "a snapshot rows frame allocated {largest} bytes at once"
    );
    snap[0] = codec::SNAP_ROWS_PACKED;
    let largest = largest_allocation(|| assert!(codec::decode_snapshot_frame(&snap).is_err()));
    assert!(
        largest <= budget,
        "a packed snapshot rows frame allocated {largest} bytes at once"
    );
    let largest = largest_allocation(|| assert!(codec::decode_snapshot_frame(&schema).is_err()));
    assert!(
        largest <= budget,
        "a snapshot schema frame allocated {largest} bytes at once"
    );
}
