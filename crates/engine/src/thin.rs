//! Owned bytes and text in 12 bytes: up to 11 bytes inline, longer ones as a pointer and a
//! 32-bit length, packed to 4-byte alignment, so that a [`Value`](crate::Value) or a
//! [`Key`](crate::Key) holding one is 16 bytes (tag, padding, then these 12) instead of 24
//! (tag, then a 16-byte `Box<str>`).
//!
//! *Why.* Rows are the bulk of the server's memory, and every row is a slice of `Value`s: at
//! 24 bytes a 5-column row's values took 136 bytes (a 160-byte allocation class), at 16 they
//! take 96 (an exact class). On a machine where fresh memory is slow to touch (a VM whose host
//! backs guest pages lazily: ~1 ns per byte here) the bytes a row takes are a large part of
//! what ingest and log replay cost. The length stays beside the pointer (a first version kept
//! it in the heap block, which cost 8 bytes per text and a read of the block for every
//! `len()`); 31 bits are plenty, since a row is limited far below 2 GiB.
//!
//! *Why inline.* Short text is most text in rows (names, rooms, codes, countries): kept in
//! the 12 bytes themselves it costs no allocation to build, to clone, to free, and no second
//! cache line to compare or encode. The events shape (`room`, `author`) saves two 16-byte
//! blocks and two allocator calls per row.
//!
//! Representation: byte 11 (the high byte of the little-endian length when on the heap) tells
//! the two apart. Inline: `0x80 | len` there, the bytes in 0..len, zeros after them. On the
//! heap: `len` ≥ 12 and < 2^31, so that byte's top bit is clear; the block is exactly the
//! bytes (`Layout::array::<u8>(len)`). The empty value is inline and allocates nothing.
//!
//! The engine's only `unsafe`: a block's layout is computed in one place ([`layout`]), every
//! block is written once before it is shared and never after, the heap fields are read only
//! when byte 11 says they were written, and the tests below cover every length class on
//! both sides of the inline limit, the empty value, clones outliving their source, and order,
//! equality and hash agreeing with the bytes'.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Most bytes kept inline (the 12 bytes less the one that says which form this is).
pub const INLINE_MAX: usize = 11;
/// Set in byte 11 for the inline form.
const INLINE_FLAG: u8 = 0x80;

#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Heap {
    /// The first of `len` bytes this value owns.
    ptr: *mut u8,
    /// Little-endian, so its last byte is byte 11 of the value whatever the target.
    len: [u8; 4],
}

#[derive(Clone, Copy)]
#[repr(C, packed(4))]
union Repr {
    heap: Heap,
    inline: [u8; 12],
}

/// Immutable owned bytes in 12 bytes (what `Box<[u8]>` is in 16).
#[repr(transparent)]
pub struct ThinBytes(Repr);

// SAFETY: a `ThinBytes` owns its block exclusively and never mutates it after construction, like
// `Box<[u8]>`.
unsafe impl Send for ThinBytes {}
// SAFETY: shared access only reads the block.
unsafe impl Sync for ThinBytes {}

fn layout(len: usize) -> Layout {
    Layout::array::<u8>(len).expect("a value's length fits in memory")
}

impl ThinBytes {
    /// Copies `bytes` (inline up to [`INLINE_MAX`]). Panics at 2 GiB and above, far above
    /// any row's limit.
    pub fn new(bytes: &[u8]) -> ThinBytes {
        let len = bytes.len();
        if len <= INLINE_MAX {
            let mut inline = [0u8; 12];
            inline[..len].copy_from_slice(bytes);
            inline[11] = INLINE_FLAG | len as u8;
            return ThinBytes(Repr { inline });
        }
        let len32 = u32::try_from(len)
            .ok()
            .filter(|&l| l < 1 << 31)
            .expect("a value is under 2 GiB");
        let layout = layout(len);
        // SAFETY: `layout` has a non-zero size (len > INLINE_MAX).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout)
        }
        // SAFETY: the block is `len` bytes and nothing else sees it yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, len) };
        ThinBytes(Repr {
            heap: Heap {
                ptr,
                len: len32.to_le_bytes(),
            },
        })
    }

    /// Byte 11: `INLINE_FLAG | len` inline, the length's high byte (top bit clear) on the heap.
    #[inline]
    fn marker(&self) -> u8 {
        // SAFETY: all 12 bytes are initialised in either form, and any byte is a valid u8.
        unsafe { self.0.inline[11] }
    }

    /// The heap block and its length, `None` for the inline form.
    #[inline]
    fn heap(&self) -> Option<(*mut u8, usize)> {
        if self.marker() & INLINE_FLAG != 0 {
            return None;
        }
        // SAFETY: byte 11's top bit is clear only for the heap form, so `heap` was written.
        let Heap { ptr, len } = unsafe { self.0.heap };
        Some((ptr, u32::from_le_bytes(len) as usize))
    }

    #[inline]
    pub fn len(&self) -> usize {
        match self.heap() {
            Some((_, len)) => len,
            None => (self.marker() & !INLINE_FLAG) as usize,
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes live in the value itself (no heap block).
    #[inline]
    pub fn is_inline(&self) -> bool {
        self.heap().is_none()
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match self.heap() {
            // SAFETY: `ptr` points at `len` initialised bytes owned by `self`, alive as long
            // as `self`.
            Some((ptr, len)) => unsafe { std::slice::from_raw_parts(ptr, len) },
            None => {
                let len = (self.marker() & !INLINE_FLAG) as usize;
                // SAFETY: the inline form was written (marker), its first `len` bytes are the
                // value's. `inline` is a `[u8; 12]`: alignment 1, so a reference into the
                // packed union is aligned.
                unsafe { &self.0.inline[..len] }
            }
        }
    }
}

impl Drop for ThinBytes {
    fn drop(&mut self) {
        if let Some((ptr, len)) = self.heap() {
            // SAFETY: a heap block was allocated in `new` with exactly this layout, and only
            // this value owns it.
            unsafe { std::alloc::dealloc(ptr, layout(len)) }
        }
    }
}

impl Clone for ThinBytes {
    fn clone(&self) -> ThinBytes {
        match self.heap() {
            Some(_) => ThinBytes::new(self.as_bytes()),
            // The inline form owns nothing outside its 12 bytes: a copy of them is a clone.
            None => ThinBytes(self.0),
        }
    }
}

impl Deref for ThinBytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for ThinBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Borrow<[u8]> for ThinBytes {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<&[u8]> for ThinBytes {
    fn from(bytes: &[u8]) -> ThinBytes {
        ThinBytes::new(bytes)
    }
}

impl From<Vec<u8>> for ThinBytes {
    fn from(bytes: Vec<u8>) -> ThinBytes {
        ThinBytes::new(&bytes)
    }
}

impl From<Box<[u8]>> for ThinBytes {
    fn from(bytes: Box<[u8]>) -> ThinBytes {
        ThinBytes::new(&bytes)
    }
}

impl<const N: usize> From<[u8; N]> for ThinBytes {
    fn from(bytes: [u8; N]) -> ThinBytes {
        ThinBytes::new(&bytes)
    }
}

impl PartialEq for ThinBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ThinBytes {}

impl PartialOrd for ThinBytes {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ThinBytes {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for ThinBytes {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl fmt::Debug for ThinBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_bytes(), f)
    }
}

/// Immutable owned UTF-8 text in 12 bytes (what `Box<str>` is in 16).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThinStr(ThinBytes);

impl ThinStr {
    pub fn new(text: &str) -> ThinStr {
        ThinStr(ThinBytes::new(text.as_bytes()))
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        // SAFETY: a `ThinStr` is only built from a `&str`, so its bytes are UTF-8.
        unsafe { std::str::from_utf8_unchecked(self.0.as_bytes()) }
    }
}

impl Deref for ThinStr {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ThinStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for ThinStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

/// Hashes as the `str` it holds, so maps keyed by `ThinStr` can be looked up by `&str`.
impl Hash for ThinStr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl From<&str> for ThinStr {
    fn from(text: &str) -> ThinStr {
        ThinStr::new(text)
    }
}

impl From<&String> for ThinStr {
    fn from(text: &String) -> ThinStr {
        ThinStr::new(text)
    }
}

impl From<String> for ThinStr {
    fn from(text: String) -> ThinStr {
        ThinStr::new(&text)
    }
}

impl From<Box<str>> for ThinStr {
    fn from(text: Box<str>) -> ThinStr {
        ThinStr::new(&text)
    }
}

impl From<std::borrow::Cow<'_, str>> for ThinStr {
    fn from(text: std::borrow::Cow<'_, str>) -> ThinStr {
        ThinStr::new(&text)
    }
}

impl From<ThinStr> for String {
    fn from(text: ThinStr) -> String {
        text.as_str().to_owned()
    }
}

impl From<&ThinStr> for String {
    fn from(text: &ThinStr) -> String {
        text.as_str().to_owned()
    }
}

impl PartialEq<str> for ThinStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ThinStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for ThinStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ThinStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn text_round_trips_at_every_length_and_clones_are_independent() {
        for len in [0usize, 1, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 100, 4096] {
            let text: String = "é✓x".chars().cycle().take(len).collect();
            let thin = ThinStr::from(text.as_str());
            assert_eq!(thin.as_str(), text);
            assert_eq!(thin.len(), text.len());
            assert_eq!(thin.0.is_inline(), text.len() <= INLINE_MAX, "{len} bytes");
            let copy = thin.clone();
            drop(thin);
            assert_eq!(copy.as_str(), text, "a clone outlives its source");
            assert_eq!(format!("{copy:?}"), format!("{text:?}"));
            assert_eq!(copy.to_string(), text);
        }
    }

    #[test]
    fn any_bytes_round_trip_on_both_sides_of_the_inline_limit() {
        // Zeros and bytes with the top bit set in every position, byte 11 included.
        for len in 0..=40usize {
            for fill in [0x00u8, 0x80, 0x8b, 0xff, 0x7f] {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| fill ^ (i as u8).wrapping_mul(37))
                    .collect();
                let thin = ThinBytes::new(&bytes);
                assert_eq!(&*thin, &bytes[..], "{len} bytes of {fill:#x}");
                assert_eq!(thin.len(), len);
                assert_eq!(thin.is_inline(), len <= INLINE_MAX);
                let copy = thin.clone();
                drop(thin);
                assert_eq!(&*copy, &bytes[..], "a clone outlives its source");
            }
        }
    }

    #[test]
    fn empty_values_allocate_nothing() {
        let a = ThinBytes::new(&[]);
        let b = ThinStr::from(String::new());
        assert!(a.is_empty() && b.is_empty());
        assert_eq!(&*a, &[] as &[u8]);
        assert_eq!(b.as_str(), "");
        assert_eq!(b.clone(), b);
    }

    #[test]
    fn order_equality_and_hash_are_those_of_the_bytes() {
        // Both sides of the inline limit (11 bytes), and prefixes across it.
        let words = [
            "",
            "a",
            "ab",
            "b",
            "ba",
            "\u{0}",
            "zz",
            "é",
            "aaaaaaaaaaa",
            "aaaaaaaaaaaa",
            "aaaaaaaaaab",
            "aaaaaaaaaaab",
            "\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}",
        ];
        for x in words {
            for y in words {
                let (tx, ty) = (ThinStr::from(x), ThinStr::from(y));
                assert_eq!(tx.cmp(&ty), x.cmp(y), "{x:?} vs {y:?}");
                assert_eq!(tx == ty, x == y);
                let (bx, by) = (ThinBytes::from(x.as_bytes()), ThinBytes::from(y.as_bytes()));
                assert_eq!(bx.cmp(&by), x.as_bytes().cmp(y.as_bytes()));
            }
        }
        let map: HashMap<ThinStr, usize> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (ThinStr::from(*w), i))
            .collect();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(map.get(*w), Some(&i), "looked up by &str");
        }
    }

    #[test]
    fn a_value_or_key_holding_text_is_16_bytes() {
        assert_eq!(std::mem::size_of::<ThinStr>(), 12);
        assert_eq!(std::mem::size_of::<crate::Value>(), 16);
        assert_eq!(std::mem::size_of::<crate::Key>(), 16);
    }
}
