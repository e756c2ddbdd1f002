//! What the functions crate's integration tests share: a `TxAccess` over an owned database,
//! and the JavaScript values the JS ↔ row differentials draw from.

#![allow(dead_code)] // each test file uses its own part

use sluice_engine::{Db, TxRef, TxState};
use sluice_functions::TxAccess;

/// A database and a transaction on it, lent to one call; fixed clock and seed.
pub struct Owned {
    pub db: Db,
    pub st: TxState,
}

impl TxAccess for Owned {
    fn tx(&mut self) -> TxRef<'_> {
        self.db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        1_700_000_000_000_000
    }
    fn seed(&self) -> u64 {
        1
    }
}

/// A property value: its JavaScript source and what the old path made of it (`None`:
/// skipped, as `undefined` and functions are).
pub const VALUES: &[(&str, Option<&str>)] = &[
    ("0", Some("0")),
    ("7", Some("7")),
    ("-3", Some("-3")),
    ("2147483648", Some("2147483648")),
    ("-2147483649", Some("-2147483649")),
    ("9007199254740991", Some("9007199254740991")),
    ("9007199254740992", Some("9007199254740992.0")),
    ("1.5", Some("1.5")),
    ("-0", Some("0")),
    ("3.0", Some("3")),
    ("1e300", Some("1e300")),
    ("\"abc\"", Some("\"abc\"")),
    ("\"\"", Some("\"\"")),
    ("\"AAEC\"", Some("\"AAEC\"")),
    ("\"é ☃\"", Some("\"é ☃\"")),
    ("\"2024-01-02T03:04:05Z\"", Some("\"2024-01-02T03:04:05Z\"")),
    ("true", Some("true")),
    ("false", Some("false")),
    ("null", Some("null")),
    ("[1, \"x\"]", Some("[1, \"x\"]")),
    ("{a: 1}", Some("{\"a\": 1}")),
    ("undefined", None),
    ("() => 1", None),
    ("10n", Some("10")),
];
