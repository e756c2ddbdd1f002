//! The hand-written reader of a JSON mutate body: the bodies clients send, read in one pass
//! over the bytes into typed ops, in well under `serde_json`'s instructions (its per-string
//! UTF-8 checks, its visitor calls for every key and value).
//!
//! Like the decoder around it, it only ever *accepts*: whatever it is not sure of — an op
//! naming its table after its `row`, a number `serde_json` would read as a float where an
//! integer belongs, a lone surrogate escape, a key it does not know — makes it return
//! `None`, and [`super::read_mutate_serde`] reads the body instead. What it accepts it
//! reads exactly as that reader does: the same ops, the same values, down to the bits of a
//! REAL and the shape of a JSON column's value (both of which it leaves to `serde_json`
//! itself, given the value's text).
//!
//! The body is checked as UTF-8 once, whole; every string then lies between ASCII quotes,
//! so slicing the checked text there is always on a character boundary.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value as Json;
use sluice_engine::{ColumnType, TableSchema, Value};
use sluice_live::chunked::mp;
use sluice_log::Durability;

use super::{column_index, finish_op, finish_row, table, text_value};
use super::{Kind, Pending, Schemas, Seen, TypedOp};

/// The ops, durability and (a WebSocket request's) id of the mutate body `body`, or `None`
/// (see the module's doc). `ws`: a WebSocket `mutate` request, which also has `"type":
/// "mutate"` (required) and may have an `"id"`, as [`super::BodySeed`] reads them.
pub(super) fn read(
    body: &[u8],
    schemas: &mut dyn Schemas,
    ops_max: usize,
    ws: bool,
) -> Option<super::Body> {
    let mut r = Reader::new(body)?;
    r.open(b'{')?;
    let mut ops = None;
    let mut durability: Option<Option<Durability>> = None;
    let mut id = None;
    let mut typed = false;
    loop {
        match &*r.key()? {
            "type" if ws && !typed => {
                if r.string()? != "mutate" {
                    return None;
                }
                typed = true;
            }
            "id" if ws && id.is_none() => id = Some(r.json(JSON_DEPTH_MAX)?),
            "ops" if ops.is_none() => ops = Some(r.ops(schemas, ops_max)?),
            "durability" if durability.is_none() => {
                durability = Some(r.durability()?);
            }
            _ => return None,
        }
        if !r.more(b'}')? {
            break;
        }
    }
    if !r.at_end() || (ws && !typed) {
        return None;
    }
    Some((ops?, durability.flatten(), id))
}

/// The `args` and `durability` of a `POST /v1/call` body, `{"args": …, "durability": …}`,
/// with the arguments as MessagePack (see [`Reader::msgpack`]: what the functions take
/// from a WebSocket call, built into JS values without a `serde_json::Value` first), or
/// `None` for a body it leaves to the general path (an unknown or repeated field, an
/// unknown durability, a value it does not transcode).
pub(super) fn read_call(body: &[u8]) -> Option<(Vec<u8>, Option<Durability>)> {
    let mut r = Reader::new(body)?;
    r.open(b'{')?;
    let mut args = None;
    let mut durability: Option<Option<Durability>> = None;
    if !r.empty(b'}') {
        loop {
            match &*r.key()? {
                "args" if args.is_none() => {
                    let mut out = Vec::with_capacity(64);
                    r.msgpack(&mut out, JSON_DEPTH_MAX)?;
                    args = Some(out);
                }
                "durability" if durability.is_none() => {
                    durability = Some(r.durability()?);
                }
                _ => return None,
            }
            if !r.more(b'}')? {
                break;
            }
        }
    }
    if !r.at_end() {
        return None;
    }
    // No `args`: `null`, as the general path reads it.
    Some((
        args.unwrap_or_else(|| vec![MSGPACK_NIL]),
        durability.flatten(),
    ))
}

const MSGPACK_NIL: u8 = 0xc0;

/// Nesting the hand reader takes in a JSON column's value or a request's id (`serde_json`
/// takes 128 levels in the whole body; a value read whole at this depth is well inside).
const JSON_DEPTH_MAX: usize = 64;

/// A position in the body's text.
struct Reader<'b> {
    text: &'b str,
    at: usize,
}

impl<'b> Reader<'b> {
    /// A reader at the start of `body`, which must be UTF-8 (checked once, whole).
    fn new(body: &'b [u8]) -> Option<Reader<'b>> {
        Some(Reader {
            text: std::str::from_utf8(body).ok()?,
            at: 0,
        })
    }

    /// Whether only whitespace is left.
    fn at_end(&mut self) -> bool {
        self.skip_space();
        self.at == self.text.len()
    }

    /// A `"durability"`: `null` (the server's default) or the name of a class.
    fn durability(&mut self) -> Option<Option<Durability>> {
        Some(match self.null_or_string()? {
            None => None,
            Some(name) => Some(name.parse().ok()?),
        })
    }

    fn bytes(&self) -> &'b [u8] {
        self.text.as_bytes()
    }

    /// Skips JSON whitespace.
    #[inline(always)]
    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.bytes().get(self.at).copied()
    }

    /// Consumes `open` (after whitespace).
    #[inline(always)]
    fn open(&mut self, open: u8) -> Option<()> {
        (self.peek()? == open).then(|| self.at += 1)
    }

    /// Consumes `close` if it comes next: an empty object or array.
    #[inline(always)]
    fn empty(&mut self, close: u8) -> bool {
        let empty = self.peek() == Some(close);
        if empty {
            self.at += 1;
        }
        empty
    }

    /// After a member or an element: `true` on a comma, `false` on `close`.
    #[inline(always)]
    fn more(&mut self, close: u8) -> Option<bool> {
        let b = self.peek()?;
        self.at += 1;
        match b {
            b',' => Some(true),
            _ if b == close => Some(false),
            _ => None,
        }
    }

    /// Consumes the word `word` (`null`, `true`, `false`).
    fn word(&mut self, word: &[u8]) -> Option<()> {
        self.skip_space();
        let end = self.at + word.len();
        (self.bytes().get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An object member's key, and its colon.
    #[inline(always)]
    fn key(&mut self) -> Option<Cow<'b, str>> {
        let key = self.string()?;
        self.open(b':')?;
        Some(key)
    }

    /// A string, its escapes read as `serde_json` reads them.
    #[inline(always)]
    fn string(&mut self) -> Option<Cow<'b, str>> {
        self.open(b'"')?;
        let b = self.bytes();
        let start = self.at;
        let end = special(b, start)?;
        match b[end] {
            b'"' => {
                self.at = end + 1;
                Some(Cow::Borrowed(self.text.get(start..end)?))
            }
            b'\\' => self.escaped(start, end).map(Cow::Owned),
            // A control character, which JSON does not allow in a string.
            _ => None,
        }
    }

    /// The rest of a string that holds an escape (at `at`): the escapes replaced.
    fn escaped(&mut self, start: usize, mut at: usize) -> Option<String> {
        let b = self.bytes();
        let mut out = String::with_capacity(at - start + 16);
        out.push_str(self.text.get(start..at)?);
        loop {
            // `b[at]` is a backslash.
            let escape = *b.get(at + 1)?;
            at += 2;
            out.push(match escape {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let unit = hex4(b.get(at..at + 4)?)?;
                    at += 4;
                    match unit {
                        0xD800..=0xDBFF => {
                            // Only a whole surrogate pair is a character.
                            if b.get(at..at + 2)? != b"\\u" {
                                return None;
                            }
                            let low = hex4(b.get(at + 2..at + 6)?)?;
                            if !(0xDC00..=0xDFFF).contains(&low) {
                                return None;
                            }
                            at += 6;
                            char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?
                        }
                        _ => char::from_u32(unit)?,
                    }
                }
                _ => return None,
            });
            let end = special(b, at)?;
            out.push_str(self.text.get(at..end)?);
            at = end;
            match b[end] {
                b'"' => {
                    self.at = end + 1;
                    return Some(out);
                }
                b'\\' => {}
                _ => return None,
            }
        }
    }

    /// `null` (`Some(None)`) or a string.
    fn null_or_string(&mut self) -> Option<Option<Cow<'b, str>>> {
        if self.peek()? == b'n' {
            self.word(b"null")?;
            return Some(None);
        }
        self.string().map(Some)
    }

    /// A number as `serde_json` reads it into an `i64`; `None` for what it would read as
    /// a float (a fraction or exponent, `-0`, beyond `u64`) or a `u64` above `i64::MAX`.
    #[inline(always)]
    fn integer(&mut self) -> Option<i64> {
        self.skip_space();
        let negative = self.bytes().get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let magnitude = self.digits()?;
        if negative {
            // `-0` is a float to serde_json, as is anything below `i64::MIN`.
            match magnitude {
                1..=0x8000_0000_0000_0000 => Some((magnitude as i64).wrapping_neg()),
                _ => None,
            }
        } else {
            i64::try_from(magnitude).ok()
        }
    }

    /// An unsigned integer of at most 19 digits (so it fits a `u64`), with no sign, fraction
    /// or exponent.
    #[inline(always)]
    fn digits(&mut self) -> Option<u64> {
        let b = self.bytes();
        let start = self.at;
        let mut at = start;
        let mut value = 0u64;
        while let Some(&c) = b.get(at) {
            let digit = c.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            if at - start == 19 {
                return None;
            }
            // Below 10^19 after 19 digits: no overflow.
            value = value * 10 + u64::from(digit);
            at += 1;
        }
        let count = at - start;
        // At least one digit, and only one leading zero, and then no digit.
        if count == 0 || (count > 1 && b[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = b.get(at) {
            return None;
        }
        self.at = at;
        Some(value)
    }

    /// A number read as `serde_json` reads it into an `f64`: a short decimal
    /// ([`short_decimal`]) here, anything else handed to it as the number's text, so the
    /// bits are its own.
    fn real(&mut self) -> Option<f64> {
        self.skip_space();
        let start = self.at;
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.bytes().get(self.at) {
            self.at += 1;
        }
        let text = self.text.get(start..self.at)?;
        short_decimal(text.as_bytes()).or_else(|| serde_json::from_str(text).ok())
    }

    /// Any JSON value, at most `depth` levels deep, read by `serde_json` from its text (found
    /// by [`Reader::skip`]): the value the serde reader reads in its place.
    fn json(&mut self, depth: usize) -> Option<Json> {
        self.skip_space();
        let start = self.at;
        self.skip(depth)?;
        serde_json::from_str(self.text.get(start..self.at)?).ok()
    }

    /// Passes over one JSON value of at most `depth` levels: only far enough to find its
    /// end — `serde_json` checks the text. A string's escapes are passed over whole (a
    /// backslash and the byte after it).
    fn skip(&mut self, depth: usize) -> Option<()> {
        let b = self.bytes();
        match self.peek()? {
            b'"' => {
                let mut at = self.at + 1;
                loop {
                    at = special(b, at)?;
                    match b[at] {
                        b'"' => break,
                        b'\\' => at += 2,
                        _ => return None,
                    }
                }
                self.at = at + 1;
            }
            open @ (b'{' | b'[') => {
                let depth = depth.checked_sub(1)?;
                let close = if open == b'{' { b'}' } else { b']' };
                self.at += 1;
                if self.empty(close) {
                    return Some(());
                }
                loop {
                    if open == b'{' {
                        self.skip(0)?;
                        self.open(b':')?;
                    }
                    self.skip(depth)?;
                    if !self.more(close)? {
                        break;
                    }
                }
            }
            _ => {
                // A number, `true`, `false` or `null`: up to the next delimiter.
                let start = self.at;
                while let Some(c) = b.get(self.at) {
                    if matches!(c, b',' | b'}' | b']' | b':' | b'"' | b'[' | b'{')
                        || c.is_ascii_whitespace()
                    {
                        break;
                    }
                    self.at += 1;
                }
                if self.at == start {
                    return None;
                }
            }
        }
        Some(())
    }

    /// One JSON value, at most `depth` levels deep, appended to `out` as MessagePack that
    /// reads back (`sluice_functions::msgpack::Msgpack::to_json`) to the value `serde_json`
    /// reads from the text: an integer in its shortest form, a number with a fraction or
    /// exponent as a float 64 of `serde_json`'s bits ([`Reader::real`]), strings unescaped
    /// (the writers of `sluice_live::chunked::mp`), objects and arrays with a 32-bit count
    /// (written before their members are counted). `None` for an integer only a `u64`
    /// holds (left to `serde_json`). A key given twice is transcoded as it is; the check that
    /// follows (`Msgpack::read`) refuses it, and the general path reads the body.
    fn msgpack(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        match self.peek()? {
            open @ (b'{' | b'[') => {
                let depth = depth.checked_sub(1)?;
                let (close, marker) = if open == b'{' {
                    (b'}', 0xdf)
                } else {
                    (b']', 0xdd)
                };
                self.at += 1;
                let header = out.len();
                out.extend_from_slice(&[marker, 0, 0, 0, 0]);
                let mut count = 0u32;
                if !self.empty(close) {
                    loop {
                        if open == b'{' {
                            mp::str(&self.key()?, out);
                        }
                        self.msgpack(out, depth)?;
                        count = count.checked_add(1)?;
                        if !self.more(close)? {
                            break;
                        }
                    }
                }
                out[header + 1..header + 5].copy_from_slice(&count.to_be_bytes());
            }
            b'"' => {
                mp::str(&self.string()?, out);
            }
            b'n' => {
                self.word(b"null")?;
                out.push(MSGPACK_NIL);
            }
            b't' => {
                self.word(b"true")?;
                mp::bool(true, out);
            }
            b'f' => {
                self.word(b"false")?;
                mp::bool(false, out);
            }
            _ => {
                let start = self.at;
                let fraction = self.bytes()[start..]
                    .iter()
                    .take_while(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .any(|c| matches!(c, b'.' | b'e' | b'E'));
                if fraction {
                    mp::f64(self.real()?, out);
                } else {
                    mp::int(self.integer()?, out);
                }
            }
        }
        Some(())
    }

    /// One column value of type `ty`, as `super::ColumnSeed` converts it.
    fn column(&mut self, ty: ColumnType) -> Option<Value> {
        if ty == ColumnType::Json {
            let json = self.json(JSON_DEPTH_MAX)?;
            return Value::from_json(ColumnType::Json, &json).ok();
        }
        match self.peek()? {
            b'n' => {
                self.word(b"null")?;
                Some(Value::Null)
            }
            b'"' => text_value(ty, &self.string()?),
            b't' if ty == ColumnType::Boolean => {
                self.word(b"true")?;
                Some(Value::Boolean(true))
            }
            b'f' if ty == ColumnType::Boolean => {
                self.word(b"false")?;
                Some(Value::Boolean(false))
            }
            _ => match ty {
                ColumnType::Integer => self.integer().map(Value::Integer),
                ColumnType::Timestamp => self.integer().map(Value::Timestamp),
                ColumnType::Real => self.real().map(Value::Real),
                _ => None,
            },
        }
    }

    /// `"ops"`: a non-empty array of ops, at most `ops_max`.
    fn ops(&mut self, schemas: &mut dyn Schemas, ops_max: usize) -> Option<Vec<TypedOp>> {
        self.open(b'[')?;
        if self.empty(b']') {
            return None;
        }
        let mut ops = Vec::new();
        // The table of the previous op, and the scratch row (as `super::OpsSeed` keeps them).
        let mut last = None;
        let mut buf = Vec::new();
        loop {
            let start = self.at;
            let op = self.op(schemas, &mut last, &mut buf)?;
            if ops.len() == ops_max {
                return None;
            }
            if ops.is_empty() {
                // As many more as ops this long would fill the rest of the body.
                let rest = self.bytes().len() - self.at;
                ops.reserve((rest / (self.at - start) + 1).min(ops_max));
            }
            ops.push(op);
            if !self.more(b']')? {
                return Some(ops);
            }
        }
    }

    /// One op; its table must come before its `row`, `set` or `id`.
    fn op(
        &mut self,
        schemas: &mut dyn Schemas,
        last: &mut Option<Arc<TableSchema>>,
        buf: &mut Vec<Value>,
    ) -> Option<TypedOp> {
        self.open(b'{')?;
        let mut kind = None;
        let mut schema: Option<Arc<TableSchema>> = None;
        let mut if_version: Option<Option<u64>> = None;
        let mut fields: Option<(bool, Pending)> = None;
        let mut id = None;
        loop {
            match &*self.key()? {
                "op" if kind.is_none() => {
                    kind = Some(match &*self.string()? {
                        "insert" => Kind::Insert,
                        "upsert" => Kind::Upsert,
                        "patch" => Kind::Patch,
                        "delete" => Kind::Delete,
                        _ => return None,
                    });
                }
                "table" if schema.is_none() => {
                    schema = Some(table(schemas, last, self.string()?.as_bytes())?);
                }
                "if_version" if if_version.is_none() => {
                    if_version = Some(match self.peek()? {
                        b'n' => self.word(b"null").map(|()| None)?,
                        _ => Some(self.digits()?),
                    });
                }
                "row" if fields.is_none() => {
                    let row = self.row(schema.as_deref()?, buf)?;
                    fields = Some((false, Pending::Row(row)));
                }
                "set" if fields.is_none() => {
                    let set = self.set(schema.as_deref()?)?;
                    fields = Some((true, Pending::Set(set)));
                }
                "id" if id.is_none() => {
                    id = Some(self.column(schema.as_deref()?.pk_column().ty)?);
                }
                _ => return None,
            }
            if !self.more(b'}')? {
                break;
            }
        }
        finish_op(kind?, schema?, if_version.flatten(), fields, id, buf)
    }

    /// A whole `row` (as `super::FullRowSeed`): the named columns into `buf`, the others
    /// their default, then the row's own allocation.
    fn row(&mut self, schema: &TableSchema, buf: &mut Vec<Value>) -> Option<Arc<[Value]>> {
        buf.clear();
        buf.resize(schema.columns.len(), Value::Null);
        let mut seen = self.members(schema, |i, v| buf[i] = v)?;
        finish_row(schema, buf, &mut seen)
    }

    /// A `set` (as `super::RowSeed`): the named columns, in the order named.
    fn set(&mut self, schema: &TableSchema) -> Option<Vec<(usize, Value)>> {
        let mut out = Vec::with_capacity(schema.columns.len());
        self.members(schema, |i, v| out.push((i, v)))?;
        Some(out)
    }

    /// The members of a `row` or `set` object, each a column of `schema` named once:
    /// `each(column, value)` in the order named. The columns named.
    fn members(
        &mut self,
        schema: &TableSchema,
        mut each: impl FnMut(usize, Value),
    ) -> Option<Seen> {
        let mut seen = Seen::new(schema.columns.len());
        self.open(b'{')?;
        if self.empty(b'}') {
            return Some(seen);
        }
        let mut next = 0;
        loop {
            let i = column_index(schema, next, self.key()?.as_bytes())?;
            if !seen.insert(i) {
                return None;
            }
            next = i + 1;
            each(i, self.column(schema.columns[i].ty)?);
            if !self.more(b'}')? {
                return Some(seen);
            }
        }
    }
}

/// A byte that ends a string's plain run: a quote, a backslash or a control character.
#[inline(always)]
fn is_special(c: u8) -> bool {
    SPECIAL[usize::from(c)]
}

/// [`is_special`] by byte: one load instead of three comparisons.
static SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = c == b'"' as usize || c == b'\\' as usize || c < 0x20;
        c += 1;
    }
    table
};

/// A number written `-?(0|[1-9][0-9]*)\.[0-9]+` with at most 15 digits in all, as an `f64`:
/// its digits as an integer (below 2^53, so exact) over the power of ten of its fraction
/// (exact up to 10^22): one division of two exact numbers is the correctly rounded value,
/// which is what `serde_json` gives (both with `float_roundtrip`, which this build has,
/// and without, where it makes this same division). `None` for any other number.
fn short_decimal(b: &[u8]) -> Option<f64> {
    const POW10: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    let (negative, digits) = match b.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, b),
    };
    let point = digits.iter().position(|&c| c == b'.')?;
    let (whole, fraction) = (&digits[..point], &digits[point + 1..]);
    if whole.is_empty()
        || fraction.is_empty()
        || (whole.len() > 1 && whole[0] == b'0')
        || whole.len() + fraction.len() > 15
    {
        return None;
    }
    let mut significand = 0u64;
    for &c in whole.iter().chain(fraction) {
        let digit = c.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        significand = significand * 10 + u64::from(digit);
    }
    let f = significand as f64 / POW10[fraction.len()];
    Some(if negative { -f } else { f })
}

/// Four hex digits.
fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, &d| {
        let v = (d as char).to_digit(16)?;
        Some(n << 4 | v)
    })
}

/// Where the first quote, backslash or control character at or after `from` is: the end
/// of a string's plain run. Eight bytes at a time: each test flags exactly the bytes it
/// looks for at and below the first one found (a borrow only ever runs upwards), so the
/// lowest flag is the first such byte.
#[inline(always)]
fn special(b: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut at = from;
    while let Some(chunk) = b.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        let found = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | x.wrapping_sub(ONES * 0x20) & !x)
            & HIGH;
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let rest = b.get(at..)?;
    rest.iter().position(|&c| is_special(c)).map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use super::{short_decimal, special};

    /// Every short decimal reads to the bits `serde_json` gives it: random digit strings
    /// of every length and point position, signs, leading zeros, and the longest ones.
    #[test]
    fn short_decimals_read_as_serde_json_reads_them() {
        let mut rng = sluice_fuzzkit::Rng::new(0x5eed_dec1);
        let mut texts: Vec<String> = ["0.0", "-0.0", "0.1", "0.30000000000000004", "124.875"]
            .map(String::from)
            .to_vec();
        texts.extend(
            [
                "999999999999999.9",
                "0.00000000000001",
                "1.5e3",
                "01.5",
                "1.",
                ".5",
            ]
            .map(String::from),
        );
        for _ in 0..100_000 {
            let len = 1 + rng.below(17);
            let point = rng.below(len + 1);
            let digits: String = (0..len)
                .map(|_| char::from(b'0' + rng.below(10) as u8))
                .collect();
            let sign = if rng.one_in(2) { "-" } else { "" };
            texts.push(format!("{sign}{}.{}", &digits[..point], &digits[point..]));
        }
        let mut read = 0;
        for text in &texts {
            let serde: Option<f64> = serde_json::from_str(text).ok();
            if let Some(f) = short_decimal(text.as_bytes()) {
                read += 1;
                let want = serde.unwrap_or_else(|| panic!("{text}: serde_json refuses it"));
                assert_eq!(
                    f.to_bits(),
                    want.to_bits(),
                    "{text}: {f:?} against {want:?}"
                );
            }
        }
        assert!(read > 50_000, "only {read} of {} read here", texts.len());
    }

    /// The eight-byte scan finds what a byte-by-byte one finds, wherever it lies in a word
    /// and whatever comes before it (bytes above 0x7f among them).
    #[test]
    fn the_word_scan_finds_the_first_special_byte() {
        let fill: &[u8] = b"ab\x7f\x80\xa0\xff ~!#[]{}z";
        let specials: &[u8] = b"\"\\\x00\x01\x1f";
        for len in 0..40 {
            for from in 0..len.min(9) {
                for &s in specials {
                    for pos in from..=len {
                        let mut b: Vec<u8> = (0..len).map(|i| fill[i % fill.len()]).collect();
                        if pos < len {
                            b[pos] = s;
                        }
                        let want = b[from..]
                            .iter()
                            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                            .map(|p| from + p);
                        assert_eq!(special(&b, from), want, "{b:?} from {from}");
                    }
                }
            }
        }
    }
}
