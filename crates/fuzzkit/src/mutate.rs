//! Mutators: each takes an input, another corpus input to splice from, and a dictionary.
//!
//! - [`bytes`]: for binary formats. Besides flips and splices it writes the integers
//!   decoders trip on: lengths claiming 1–4 GiB (u32 and LEB128 varint), `u64::MAX`, zero.
//! - [`text`]: for SQL and JavaScript. Edits whole tokens (words, numbers, punctuation) so
//!   most outputs still lex, swaps in dictionary keywords, and sometimes edits raw bytes.
//! - [`json`]: for request bodies. Edits the tree (retype a value, drop or add a field,
//!   graft a subtree from another input, nest deeply) when the input parses.

use serde_json::{Map, Value};

use crate::Rng;

/// Integers that decoders get wrong: boundaries, sign bits, lengths far past any buffer.
const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    1 << 30,
    (1 << 26) + 1,
    u64::MAX,
    u64::MAX - 1,
    i64::MAX as u64,
    i64::MIN as u64,
];

/// Numbers as text, for SQL, JavaScript and JSON.
const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "-0",
    "0.5",
    "1e308",
    "-1e308",
    "1e309",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "NaN",
    "Infinity",
    "1e-400",
    "0x7fffffff",
];

/// Applies one random edit to `data` in place.
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], dict: &[Vec<u8>], len_max: usize) {
    if data.is_empty() {
        data.push(rng.next_u64() as u8);
        return;
    }
    let n = data.len();
    let at = rng.below(n);
    match rng.below(14) {
        0 => data[at] ^= 1 << rng.below(8),
        1 => data[at] = rng.next_u64() as u8,
        2 => data[at] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xfe, 0xff]),
        3 => {
            // A little-endian integer of 4 or 8 bytes over whatever is there.
            let v = *rng.pick(INTERESTING_U64);
            let width = if rng.one_in(2) { 4 } else { 8 };
            let le = v.to_le_bytes();
            for (i, b) in le[..width].iter().enumerate() {
                if at + i < n {
                    data[at + i] = *b;
                }
            }
        }
        4 => {
            // A LEB128 varint: a length or count that claims far more than the input holds.
            let v = *rng.pick(INTERESTING_U64);
            let mut enc = Vec::new();
            let mut x = v;
            while x >= 0x80 {
                enc.push((x as u8) | 0x80);
                x >>= 7;
            }
            enc.push(x as u8);
            if rng.one_in(4) {
                // Overlong: never ends within ten bytes.
                enc = vec![0xff; 11];
            }
            let end = (at + 1 + rng.below(3)).min(n);
            data.splice(at..end, enc);
        }
        5 => {
            let k = 1 + rng.below(8);
            let fill: Vec<u8> = (0..k).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, fill);
        }
        6 => {
            let end = (at + 1 + rng.below(n.min(64))).min(n);
            data.drain(at..end);
        }
        7 => {
            let end = (at + 1 + rng.below(n.min(64))).min(n);
            let chunk = data[at..end].to_vec();
            let to = rng.below(n + 1);
            data.splice(to..to, chunk);
        }
        8 if !other.is_empty() => {
            // Splice: our head with the other input's tail, or a chunk of it inserted.
            let from = rng.below(other.len());
            if rng.one_in(2) {
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            } else {
                let end = (from + 1 + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
        }
        9 if !dict.is_empty() => {
            let word = rng.pick(dict).clone();
            data.splice(at..at, word);
        }
        10 => data.truncate(at),
        11 => data[at] = data[at].wrapping_add(rng.below(33) as u8).wrapping_sub(16),
        12 => {
            let len = rng.below(n - at) + 1;
            data[at..at + len].fill(if rng.one_in(2) { 0 } else { 0xff });
        }
        _ => {
            let a = rng.below(n);
            data.swap(at, a);
        }
    }
    data.truncate(len_max);
}

/// Splits text into tokens: runs of word characters, runs of spaces, single other bytes.
fn tokens(s: &[u8]) -> Vec<&[u8]> {
    let class = |b: u8| {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b >= 0x80 {
            0
        } else if b.is_ascii_whitespace() {
            1
        } else {
            2
        }
    };
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=s.len() {
        if i == s.len() || class(s[i]) != class(s[start]) || class(s[start]) == 2 {
            out.push(&s[start..i]);
            start = i;
        }
    }
    out
}

/// One token-level (sometimes byte-level) edit of `input`.
pub fn text(
    rng: &mut Rng,
    input: &[u8],
    other: &[u8],
    dict: &[Vec<u8>],
    len_max: usize,
) -> Vec<u8> {
    let mut toks: Vec<Vec<u8>> = tokens(input).into_iter().map(<[u8]>::to_vec).collect();
    let theirs: Vec<&[u8]> = tokens(other);
    if toks.is_empty() || rng.one_in(8) {
        let mut data = input.to_vec();
        bytes(rng, &mut data, other, dict, len_max);
        return data;
    }
    let n = toks.len();
    let at = rng.below(n);
    match rng.below(10) {
        0 => {
            let end = (at + 1 + rng.below(4)).min(n);
            toks.drain(at..end);
        }
        1 => {
            let t = toks[at].clone();
            toks.insert(rng.below(n + 1), t);
        }
        2 => {
            let b = rng.below(n);
            toks.swap(at, b);
        }
        3 | 4 if !dict.is_empty() => {
            let word = rng.pick(dict).clone();
            if rng.one_in(2) {
                toks[at] = word;
            } else {
                toks.insert(at, b" ".to_vec());
                toks.insert(at, word);
                toks.insert(at, b" ".to_vec());
            }
        }
        5 => toks[at] = rng.pick(INTERESTING_NUMBERS).as_bytes().to_vec(),
        6 if !theirs.is_empty() => {
            let from = rng.below(theirs.len());
            let end = (from + 1 + rng.below(theirs.len() - from)).min(theirs.len());
            let chunk: Vec<Vec<u8>> = theirs[from..end].iter().map(|t| t.to_vec()).collect();
            if rng.one_in(2) {
                toks.truncate(at);
                toks.extend(chunk);
            } else {
                toks.splice(at..at, chunk);
            }
        }
        7 => {
            // Deep nesting: parsers that recurse must refuse, not overflow the stack.
            let (open, close) = *rng.pick(&[("(", ")"), ("[", "]"), ("{", "}"), ("-", "")]);
            let depth = 1 + rng.below(2000);
            toks.insert(at, open.repeat(depth).into_bytes());
            if !close.is_empty() && rng.one_in(2) {
                toks.insert(at + 1, close.repeat(depth).into_bytes());
            }
        }
        8 => {
            // A long token: identifiers, strings and numbers far past usual sizes.
            let bits = rng.below(17);
            let k = 1 + rng.below(1 << bits);
            let c = *rng.pick(&[b'a', b'9', b'\'', b'"', b'\\', 0xff, b' ']);
            toks.insert(at, vec![c; k]);
        }
        _ => {
            let mut data = toks.concat();
            bytes(rng, &mut data, other, dict, len_max);
            return data;
        }
    }
    let mut out = toks.concat();
    out.truncate(len_max);
    out
}

/// One tree edit of a JSON input, or a text edit if it does not parse.
pub fn json(
    rng: &mut Rng,
    input: &[u8],
    other: &[u8],
    dict: &[Vec<u8>],
    len_max: usize,
) -> Vec<u8> {
    let parsed = serde_json::from_slice::<Value>(input);
    let Ok(mut doc) = parsed else {
        return text(rng, input, other, dict, len_max);
    };
    if rng.one_in(6) {
        return text(rng, input, other, dict, len_max);
    }
    let theirs = serde_json::from_slice::<Value>(other).ok();
    let count = nodes(&doc);
    let mut k = rng.below(count);
    let target = nth_mut(&mut doc, &mut k).expect("k < node count");
    match rng.below(8) {
        0 | 1 => *target = scalar(rng, dict),
        2 => match target {
            Value::Object(map) if !map.is_empty() => {
                let key = map
                    .keys()
                    .nth(rng.below(map.len()))
                    .cloned()
                    .expect("non-empty");
                map.remove(&key);
            }
            Value::Array(items) if !items.is_empty() => {
                items.remove(rng.below(items.len()));
            }
            other => *other = scalar(rng, dict),
        },
        3 => match target {
            Value::Object(map) => {
                let key = match dict.is_empty() || rng.one_in(4) {
                    true => format!("k{}", rng.below(4)),
                    false => String::from_utf8_lossy(rng.pick(dict).as_slice()).into_owned(),
                };
                map.insert(key, scalar(rng, dict));
            }
            Value::Array(items) => {
                let v = match items.is_empty() {
                    true => scalar(rng, dict),
                    false => items[rng.below(items.len())].clone(),
                };
                items.push(v);
            }
            other => *other = Value::Array(vec![other.take()]),
        },
        4 => {
            if let Some(mut theirs) = theirs {
                let mut j = rng.below(nodes(&theirs));
                *target = nth_mut(&mut theirs, &mut j).expect("j < node count").take();
            }
        }
        5 => {
            // Wrap in arrays or objects many levels deep.
            let depth = 1 + rng.below(300);
            let mut v = target.take();
            for _ in 0..depth {
                v = match rng.one_in(2) {
                    true => Value::Array(vec![v]),
                    false => Value::Object(Map::from_iter([("a".to_string(), v)])),
                };
            }
            *target = v;
        }
        6 => {
            // The same value with another type: a number as a string, a string as a number…
            *target = match target.take() {
                Value::String(s) => s.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
                Value::Number(n) => Value::String(n.to_string()),
                Value::Bool(b) => Value::from(b as u8),
                Value::Null => Value::from(""),
                v @ (Value::Array(_) | Value::Object(_)) => Value::String(v.to_string()),
            }
        }
        _ => {
            let mut data = serde_json::to_vec(&doc).expect("a Value serializes");
            bytes(rng, &mut data, other, dict, len_max);
            return data;
        }
    }
    let mut out = serde_json::to_vec(&doc).expect("a Value serializes");
    out.truncate(len_max);
    out
}

/// A random scalar (or small container): the values request handlers must type-check.
pub fn scalar(rng: &mut Rng, dict: &[Vec<u8>]) -> Value {
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::from(*rng.pick(&[0i64, 1, -1, i64::MAX, i64::MIN, 1 << 53, 2])),
        3 => Value::from(*rng.pick(&[u64::MAX, 1 << 63, 4_294_967_296])),
        4 => Value::from(*rng.pick(&[0.5f64, -0.0, 1e308, -1e308, 1e-320, 3.0])),
        5 => Value::from(*rng.pick(&["", "x", "0", "1", "-1", "true", "null", "\u{0}", "é"])),
        6 => Value::String("x".repeat(1 << (rng.below(17)))),
        7 => Value::Array(Vec::new()),
        8 => Value::Object(Map::new()),
        9 => Value::String(rng.pick(INTERESTING_NUMBERS).to_string()),
        _ if !dict.is_empty() => {
            Value::String(String::from_utf8_lossy(rng.pick(dict).as_slice()).into())
        }
        _ => Value::from(rng.below(100) as u64),
    }
}

fn nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(nodes).sum(),
        Value::Object(map) => map.values().map(nodes).sum(),
        _ => 0,
    }
}

/// The `n`-th node of `v` in pre-order.
fn nth_mut<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(items) => items.iter_mut().find_map(|x| nth_mut(x, n)),
        Value::Object(map) => map.values_mut().find_map(|x| nth_mut(x, n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_every_byte() {
        let s = b"SELECT a, b FROM t WHERE x >= 10.5 AND y = 'it''s'";
        assert_eq!(tokens(s).concat(), s.to_vec());
    }

    #[test]
    fn mutators_are_deterministic_for_a_seed() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let dict = vec![b"SELECT".to_vec()];
            let mut out = Vec::new();
            let mut input = br#"{"sql":"SELECT 1","params":[1,"a"]}"#.to_vec();
            for _ in 0..200 {
                input = json(&mut rng, &input, b"[1]", &dict, 4096);
                out.push(input.clone());
            }
            out
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
