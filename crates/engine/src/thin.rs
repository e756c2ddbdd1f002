//! Owned bytes and text in 12 bytes: a pointer and a 32-bit length, packed to 4-byte
//! alignment, so that a [`Value`](crate::Value) or a [`Key`](crate::Key) holding one is
//! 16 bytes (tag, padding, then these 12) instead of 24 (tag, then a 16-byte `Box<str>`).
//!
//! *Why.* Rows are the bulk of the server's memory, and every row is a slice of `Value`s: at
//! 24 bytes a 5-column row's values took 136 bytes (a 160-byte allocation class), at 16 they
//! take 96 (an exact class). On a machine where fresh memory is slow to touch (a VM whose host
//! backs guest pages lazily: ~1 ns per byte here) the bytes a row takes are a large part of
//! what ingest and log replay cost. The length stays beside the pointer (a first version kept
//! it in the heap block, which cost 8 bytes per text and a read of the block for every
//! `len()`); 32 bits are plenty, since a row is limited far below 4 GiB.
//!
//! The heap block is exactly the bytes (`Layout::array::<u8>(len)`); an empty value holds a
//! dangling pointer and allocates nothing.
//!
//! The engine's only `unsafe`: a block's layout is computed in one place ([`layout`]), every
//! block is written once before it is shared and never after, and the tests below cover every
//! length class, the empty value, clones outliving their source, and order, equality and hash
//! agreeing with the bytes'.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::ptr::NonNull;

/// Immutable owned bytes in 12 bytes (what `Box<[u8]>` is in 16).
#[repr(C, packed(4))]
pub struct ThinBytes {
    /// The first of `len` bytes this value owns; dangling when `len` is 0.
    ptr: NonNull<u8>,
    len: u32,
}

// SAFETY: a `ThinBytes` owns its block exclusively and never mutates it after construction, like
// `Box<[u8]>`.
unsafe impl Send for ThinBytes {}
// SAFETY: shared access only reads the block.
unsafe impl Sync for ThinBytes {}

fn layout(len: usize) -> Layout {
    Layout::array::<u8>(len).expect("a value's length fits in memory")
}

impl ThinBytes {
    /// Copies `bytes`. Panics above `u32::MAX` bytes (4 GiB), far above any row's limit.
    pub fn new(bytes: &[u8]) -> ThinBytes {
        let len = u32::try_from(bytes.len()).expect("a value is under 4 GiB");
        if len == 0 {
            return ThinBytes {
                ptr: NonNull::dangling(),
                len,
            };
        }
        let layout = layout(bytes.len());
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: the block is `len` bytes and nothing else sees it yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        ThinBytes { ptr, len }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        let (ptr, len) = (self.ptr, self.len as usize);
        // SAFETY: `ptr` points at `len` initialised bytes owned by `self` (or is dangling and
        // well aligned for `u8` with `len` 0), alive as long as `self`.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) }
    }
}

impl Drop for ThinBytes {
    fn drop(&mut self) {
        let (ptr, len) = (self.ptr, self.len as usize);
        if len == 0 {
            return;
        }
        // SAFETY: a non-empty block was allocated in `new` with exactly this layout, and only
        // this value owns it.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(len)) }
    }
}

impl Clone for ThinBytes {
    fn clone(&self) -> ThinBytes {
        ThinBytes::new(self.as_bytes())
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
        for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 100, 4096] {
            let text: String = "é✓x".chars().cycle().take(len).collect();
            let thin = ThinStr::from(text.as_str());
            assert_eq!(thin.as_str(), text);
            assert_eq!(thin.len(), text.len());
            let copy = thin.clone();
            drop(thin);
            assert_eq!(copy.as_str(), text, "a clone outlives its source");
            assert_eq!(format!("{copy:?}"), format!("{text:?}"));
            assert_eq!(copy.to_string(), text);
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
        let words = ["", "a", "ab", "b", "ba", "\u{0}", "zz", "é"];
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
        assert_eq!(std::mem::size_of::<Option<ThinStr>>(), 12);
        assert_eq!(std::mem::size_of::<crate::Value>(), 16);
        assert_eq!(std::mem::size_of::<crate::Key>(), 16);
    }
}
