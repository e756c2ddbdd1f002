//! The view checksum: an order-independent 64-bit hash of the multiset of a view's rows.
//!
//! `checksum(view) = Σ row_hash(row) mod 2^64` over the rows the subscriber sees (the window
//! of an ordered view), rendered as 16 lower-case hex digits. Adding a row adds its hash,
//! removing subtracts it, so a diff updates it in O(change) and the order of rows does not
//! matter. `row_hash` is XXH3-64 (seed 0) of the row's canonical bytes: for each output column
//! in order, a tag byte and the value:
//!
//! | value     | bytes                                         |
//! |-----------|-----------------------------------------------|
//! | NULL      | `0x00`                                        |
//! | INTEGER   | `0x01`, i64 little-endian                     |
//! | REAL      | `0x02`, IEEE-754 bits as u64 little-endian    |
//! | BOOLEAN   | `0x03`, `0x00` or `0x01`                      |
//! | TEXT      | `0x04`, u32 LE byte length, UTF-8 bytes       |
//! | BLOB      | `0x05`, u32 LE byte length, bytes             |
//! | JSON      | `0x06`, u32 LE byte length, compact JSON text |
//! | TIMESTAMP | `0x07`, i64 LE microseconds since the epoch   |
//!
//! The same table is in `docs/protocol.md`, for clients that want to verify a materialisation.

use sluice_engine::Value;

/// Appends the canonical bytes of `row` to `out`.
pub fn canonical_bytes(row: &[Value], out: &mut Vec<u8>) {
    for v in row {
        let mut var = |tag: u8, bytes: &[u8]| {
            out.push(tag);
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        };
        match v {
            Value::Null => out.push(0x00),
            Value::Integer(i) => {
                out.push(0x01);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Value::Real(r) => {
                out.push(0x02);
                out.extend_from_slice(&r.to_bits().to_le_bytes());
            }
            Value::Boolean(b) => {
                out.push(0x03);
                out.push(*b as u8);
            }
            Value::Text(s) => var(0x04, s.as_bytes()),
            Value::Blob(b) => var(0x05, b),
            Value::Json(s) => var(0x06, s.as_bytes()),
            Value::Timestamp(t) => {
                out.push(0x07);
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }
}

/// The hash of one row.
pub fn row_hash(row: &[Value]) -> u64 {
    // One buffer per thread: building a million-row view hashes a million rows, and an
    // allocation (or two, past 64 bytes) per row was a measurable part of it.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        canonical_bytes(row, buf);
        let hash = xxhash_rust::xxh3::xxh3_64(buf);
        // A huge row does not keep its bytes for the life of the thread.
        if buf.capacity() > 1 << 16 {
            *buf = Vec::new();
        }
        hash
    })
}

/// The checksum of a multiset of rows, recomputed from scratch (for clients and tests).
pub fn checksum<'a>(rows: impl IntoIterator<Item = &'a [Value]>) -> u64 {
    rows.into_iter()
        .fold(0u64, |acc, r| acc.wrapping_add(row_hash(r)))
}

/// The wire form of a checksum.
pub fn render(sum: u64) -> String {
    format!("{sum:016x}")
}

/// Whether two rows are the same values of the same types (stricter than SQL `=`, which
/// finds `1` equal to `1.0`): a change between them must reach subscribers.
pub fn same_row(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            std::mem::discriminant(x) == std::mem::discriminant(y)
                && match (x, y) {
                    (Value::Real(p), Value::Real(q)) => p.to_bits() == q.to_bits(),
                    _ => x == y,
                }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_ignores_order_and_counts_duplicates() {
        let a = [Value::Integer(1), Value::Text("x".into())];
        let b = [Value::Null, Value::Real(1.5)];
        let ab = checksum([&a[..], &b[..]]);
        assert_eq!(ab, checksum([&b[..], &a[..]]));
        assert_ne!(ab, checksum([&a[..], &b[..], &b[..]]));
        assert_eq!(
            ab.wrapping_sub(row_hash(&b)),
            checksum([&a[..]]),
            "removing a row subtracts its hash"
        );
    }

    #[test]
    fn canonical_bytes_tell_types_apart() {
        assert_ne!(
            row_hash(&[Value::Integer(1)]),
            row_hash(&[Value::Real(1.0)])
        );
        assert_ne!(
            row_hash(&[Value::Text("1".into())]),
            row_hash(&[Value::Integer(1)])
        );
        assert!(!same_row(&[Value::Integer(1)], &[Value::Real(1.0)]));
        assert!(same_row(
            &[Value::Integer(1), Value::Null],
            &[Value::Integer(1), Value::Null]
        ));
        let mut out = Vec::new();
        canonical_bytes(&[Value::Text("ab".into()), Value::Integer(-1)], &mut out);
        assert_eq!(
            out,
            [&[4u8, 2, 0, 0, 0, b'a', b'b', 1][..], &[0xff; 8][..]].concat()
        );
    }
}
