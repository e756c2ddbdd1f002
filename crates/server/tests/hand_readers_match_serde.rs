//! Differential tests of the two readers of a mutate body: for JSON, the hand-written one
//! (`read_mutate_json`, which `decode_mutate` tries first) against the `serde_json` one
//! (`read_mutate_serde`, which reads whatever the first is not sure of); for a MessagePack
//! WebSocket request, `read_mutate_msgpack` against `rmp_serde` (`read_mutate_msgpack_serde`),
//! on the same requests encoded as MessagePack (see `hand_msgpack_reader_matches_rmp_serde`).
//!
//! Random bodies — HTTP bodies and WebSocket `mutate` requests, with an `"id"` of any kind
//! — are built as values, then spelled out at random: whitespace between any two tokens,
//! characters written as escapes (`\u00e9`, surrogate pairs, `\/`), numbers at every
//! boundary of `i64` and `u64` and in float spellings, JSON column values of any shape,
//! keys in any order, and now and then broken (a lone surrogate, a raw control character,
//! a bad escape, a cut, a flipped byte, invalid UTF-8, a repeated or unknown key, a wrong
//! type). For every body:
//! - whatever the hand reader accepts, the serde reader accepts too, as the same ops,
//!   durability and id (compared by `Debug`: the same values, to the bits of a REAL);
//! - a body built without a fault, a value nested past the hand reader's depth or a table
//!   named after its row, that the serde reader accepts, the hand reader accepts too (so
//!   it does serve the common case).
//!
//! `SLUICE_DECODE_SEED=n` replays one seed; `SLUICE_DECODE_CASES=n` sets the number of
//! bodies (default 20 000).

mod common;

use common::TempDir;
use sluice_engine::Db;
use sluice_fuzzkit::{env_u64, Rng};
use sluice_log::Durability;
use sluice_server::decode::{
    read_call_json, read_mutate_json, read_mutate_msgpack, read_mutate_msgpack_serde,
    read_mutate_serde,
};
use sluice_server::{Config, Core};

const OPS_MAX: usize = 5;

const SCHEMA: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER, \
    r REAL, b BOOLEAN, ts TIMESTAMP, j JSON, bl BLOB, d INTEGER DEFAULT 7, \"é t\" TEXT); \
    CREATE TABLE s (k TEXT PRIMARY KEY, v INTEGER NOT NULL DEFAULT 0, note TEXT)";

/// A JSON value to be spelled out; `Num` and `Raw` are already text.
#[derive(Clone)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
    /// Text put in as it is (a broken value).
    Raw(String),
}

/// What a generated body holds that lets the hand reader pass it on.
#[derive(Default)]
struct Made {
    /// Whether this body may be broken (about half are not).
    noisy: bool,
    /// A WebSocket `mutate` request (with `"type"` and `"id"`), not an HTTP body.
    ws: bool,
    /// Anything broken or of the wrong type.
    fault: bool,
    /// A JSON value nested deeper than the hand reader takes, an `if_version` past 19
    /// digits, or an op naming its table after its row, set or id.
    handed_on: bool,
}

const INTEGERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "42",
    "1700000000000000",
    "9223372036854775807",
    "-9223372036854775808",
    "999999999999999999",
    "1000000000000000000",
    "-999999999999999999",
];

/// Integer spellings that `serde_json` reads as something else, or refuses.
const ODD_INTEGERS: &[&str] = &[
    "-0",
    "01",
    "-01",
    "00",
    "1.0",
    "1e2",
    "1E2",
    "-",
    "+1",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999",
    "1.",
    ".5",
];

const REALS: &[&str] = &[
    "0.5",
    "-2.25",
    "3",
    "-7",
    "0",
    "-0",
    "-0.0",
    "1e10",
    "1E-5",
    "2.5e+3",
    "0.1",
    "124.875",
    "1.7976931348623157e308",
    "4.9e-324",
    "2.2250738585072014e-308",
    "123456789012345678901234567890",
    "18446744073709551616",
    "0.30000000000000004",
    "9007199254740993",
    "1e400",
    "1e",
    "1.5.2",
    "--1",
];

const TEXTS: &[&str] = &[
    "",
    "a",
    "room-7",
    "user-1234",
    "exactly8",
    "seven77",
    "nine99999",
    "fifteen-chars!!",
    "sixteen-chars!!!",
    "seventeen-chars!!",
    "é",
    "日本語のテキスト",
    "😀 emoji",
    "quote \" inside",
    "back \\ slash",
    "tab\there",
    "nul\u{0}byte",
    "line\nbreak",
    "slash / here",
    "the quick brown fox jumps over the lazy dog while the sluice keeps every write in order",
];

impl Made {
    /// `one_in(n)` for a fault, which only a noisy body gets.
    fn fault(&mut self, rng: &mut Rng, n: usize) -> bool {
        let fault = self.noisy && rng.one_in(n);
        self.fault |= fault;
        fault
    }
}

fn ws(rng: &mut Rng, out: &mut String) {
    if rng.one_in(6) {
        out.push_str(rng.pick::<&str>(&[" ", "\n", "\t", "\r\n  ", "  "]));
    }
}

/// `text` as a JSON string: characters that must be escaped are, others sometimes.
fn spell_str(rng: &mut Rng, text: &str, out: &mut String, made: &mut Made) {
    out.push('"');
    let escapes = rng.one_in(4);
    for c in text.chars() {
        let must = c == '"' || c == '\\' || (c as u32) < 0x20;
        if !(must || escapes && rng.one_in(3)) {
            out.push(c);
            continue;
        }
        match c {
            '"' if rng.one_in(2) => out.push_str("\\\""),
            '\\' if rng.one_in(2) => out.push_str("\\\\"),
            '\n' if rng.one_in(2) => out.push_str("\\n"),
            '\t' if rng.one_in(2) => out.push_str("\\t"),
            '/' if rng.one_in(2) => out.push_str("\\/"),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    if rng.one_in(2) {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            }
        }
    }
    if made.fault(rng, 60) {
        out.push_str(rng.pick::<&str>(&[
            "\\ud83d",
            "\\ud83dx",
            "\\ude00",
            "\\ud83d\\u0041",
            "\\x",
            "\\u12",
            "\u{1}",
            "\\",
        ]));
    }
    out.push('"');
}

fn spell(rng: &mut Rng, j: &J, out: &mut String, made: &mut Made) {
    ws(rng, out);
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(n) | J::Raw(n) => out.push_str(n),
        J::Str(s) => spell_str(rng, s, out, made),
        J::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    ws(rng, out);
                    out.push(',');
                }
                spell(rng, item, out, made);
            }
            ws(rng, out);
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    ws(rng, out);
                    out.push(',');
                }
                ws(rng, out);
                spell_str(rng, k, out, made);
                ws(rng, out);
                out.push(':');
                spell(rng, v, out, made);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// A value for a column of type `ty`: mostly of that type, now and then anything.
fn value(rng: &mut Rng, ty: &str, nullable: bool, made: &mut Made) -> J {
    if made.fault(rng, 25) {
        return match rng.below(6) {
            0 => J::Num(rng.pick(ODD_INTEGERS).to_string()),
            1 => J::Str(rng.pick(TEXTS).to_string()),
            2 => J::Bool(true),
            3 => J::Arr(vec![J::Num("1".into())]),
            4 => J::Raw(rng.pick(&["nul", "tru", "True", "NaN", "'a'"]).to_string()),
            _ => J::Num(rng.pick(REALS).to_string()),
        };
    }
    if nullable && rng.one_in(12) {
        return J::Null;
    }
    match ty {
        "int" | "ts" => J::Num(rng.pick(INTEGERS).to_string()),
        "real" => {
            let broken = |r: &str| {
                r.starts_with("1e4") || r.contains("--") || r.ends_with('e') || r == "1.5.2"
            };
            let mut r = rng.pick(REALS).to_string();
            while broken(&r) && !made.noisy {
                r = rng.pick(REALS).to_string();
            }
            made.fault |= broken(&r);
            J::Num(r)
        }
        "bool" => J::Bool(rng.one_in(2)),
        "text" => J::Str(rng.pick(TEXTS).to_string()),
        "blob" => {
            let b = if made.fault(rng, 6) {
                *rng.pick(&["!!", "aGk"])
            } else {
                *rng.pick(&["aGk=", "", "AAEC", "aGVsbG8gd29ybGQ="])
            };
            J::Str(b.into())
        }
        "json" => any_json(rng, 4, made),
        _ => unreachable!("{ty}"),
    }
}

/// Any JSON value, nested up to `depth` levels (now and then far deeper than the hand
/// reader takes: 70 levels).
fn any_json(rng: &mut Rng, depth: usize, made: &mut Made) -> J {
    if depth == 4 && rng.one_in(100) {
        made.handed_on = true;
        let mut deep = J::Num("1".into());
        for _ in 0..70 {
            deep = J::Arr(vec![deep]);
        }
        return deep;
    }
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => J::Null,
        1 => J::Bool(rng.one_in(2)),
        2 => J::Num(rng.pick(INTEGERS).to_string()),
        3 => J::Num({
            let numbers = if made.fault(rng, 10) {
                ODD_INTEGERS
            } else {
                REALS
            };
            rng.pick(numbers).to_string()
        }),
        4 => J::Str(rng.pick(TEXTS).to_string()),
        5 => J::Arr(
            (0..rng.below(4))
                .map(|_| any_json(rng, depth - 1, made))
                .collect(),
        ),
        _ => J::Obj(
            (0..rng.below(4))
                .map(|_| {
                    let key = rng.pick(&["a", "b", "é", "k\"q", ""]).to_string();
                    (key, any_json(rng, depth - 1, made))
                })
                .collect(),
        ),
    }
}

/// Table name, (column, type) beside the key, key column, key type.
type TableSpec = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
);

const TABLES: &[TableSpec] = &[
    (
        "t",
        &[
            ("name", "text"),
            ("n", "int"),
            ("r", "real"),
            ("b", "bool"),
            ("ts", "ts"),
            ("j", "json"),
            ("bl", "blob"),
            ("d", "int"),
            ("é t", "text"),
        ],
        "id",
        "int",
    ),
    ("s", &[("v", "int"), ("note", "text")], "k", "text"),
];

fn shuffle_some<T>(rng: &mut Rng, items: &mut [T]) {
    if items.len() > 1 && rng.one_in(3) {
        for i in (1..items.len()).rev() {
            items.swap(i, rng.below(i + 1));
        }
    }
}

fn key_value(rng: &mut Rng, ty: &str, made: &mut Made) -> J {
    if made.fault(rng, 30) {
        return value(rng, if ty == "int" { "text" } else { "int" }, false, made);
    }
    match ty {
        "int" => J::Num(rng.below(20).to_string()),
        _ => J::Str(rng.pick(&["a", "b", "é", "k\"q"]).to_string()),
    }
}

fn row(rng: &mut Rng, spec: &TableSpec, with_key: bool, made: &mut Made) -> J {
    let (_, cols, pk, pk_ty) = *spec;
    let mut members = Vec::new();
    if with_key {
        members.push((pk.to_string(), key_value(rng, pk_ty, made)));
    }
    for (c, ty) in cols {
        // `j` (JSON) mostly left out, so most rows stay with the hand reader.
        let required = *c == "name" && with_key;
        if (rng.one_in(4) && (!required || made.fault(rng, 2))) || (*ty == "json" && rng.one_in(2))
        {
            continue;
        }
        members.push((c.to_string(), value(rng, ty, *c != "name", made)));
    }
    if made.fault(rng, 40) {
        members.push(("bogus".into(), J::Num("1".into())));
    }
    if !members.is_empty() && made.fault(rng, 40) {
        let dup = members[rng.below(members.len())].clone();
        members.push(dup);
    }
    shuffle_some(rng, &mut members);
    J::Obj(members)
}

fn op(rng: &mut Rng, made: &mut Made) -> J {
    let spec = if rng.one_in(3) {
        &TABLES[1]
    } else {
        &TABLES[0]
    };
    let kind = *rng.pick(&["insert", "insert", "upsert", "patch", "delete"]);
    let mut members = vec![
        ("op".to_string(), J::Str(kind.into())),
        ("table".to_string(), J::Str(spec.0.into())),
    ];
    match kind {
        "patch" => {
            members.push(("id".into(), key_value(rng, spec.3, made)));
            members.push(("set".into(), row(rng, spec, false, made)));
        }
        "delete" => members.push(("id".into(), key_value(rng, spec.3, made))),
        _ => members.push(("row".into(), row(rng, spec, true, made))),
    }
    if rng.one_in(6) {
        let v = if made.fault(rng, 4) {
            rng.pick(&["-1", "1.0", "-0"])
        } else {
            rng.pick(&["null", "0", "3", "18446744073709551615"])
        };
        if v.len() > 19 {
            // Past the hand reader's 19 digits: `serde_json` reads it.
            made.handed_on = true;
        }
        members.push(("if_version".into(), J::Num(v.to_string())));
    }
    match if made.noisy { rng.below(40) } else { 99 } {
        0 => {
            made.fault = true;
            members.remove(rng.below(members.len()));
        }
        1 => {
            made.fault = true;
            members.push(("extra".into(), J::Num("1".into())));
        }
        2 => {
            made.fault = true;
            members.push(("op".into(), J::Str("insert".into())));
        }
        3 => {
            made.fault = true;
            members[0].1 = J::Str(rng.pick(&["replace", "Insert", ""]).to_string());
        }
        _ => {}
    }
    let table_at = |m: &[(String, J)]| m.iter().position(|(k, _)| k == "table");
    shuffle_some(rng, &mut members);
    let data_before_table = members
        .iter()
        .position(|(k, _)| ["row", "set", "id"].contains(&k.as_str()))
        .zip(table_at(&members))
        .is_some_and(|(d, t)| d < t);
    if data_before_table {
        made.handed_on = true;
    }
    J::Obj(members)
}

fn body(rng: &mut Rng, made: &mut Made) -> Vec<u8> {
    let request = request(rng, made);
    let mut out = String::new();
    spell(rng, &request, &mut out, made);
    let mut bytes = out.into_bytes();
    if !bytes.is_empty() && made.fault(rng, 8) {
        let at = rng.below(bytes.len());
        match rng.below(4) {
            0 => bytes.truncate(at),
            1 => bytes[at] = *rng.pick(b"{}[],:\"\\ 0a-\xff\x01"),
            2 => bytes.insert(at, *rng.pick(b"\xc3\xff\x80,}")),
            _ => bytes.extend_from_slice(rng.pick::<&[u8]>(&[b",", b"x", b"{}", b"\xff"])),
        }
    }
    bytes
}

/// A body or WebSocket request as a value, before it is spelled out.
fn request(rng: &mut Rng, made: &mut Made) -> J {
    let count = 1 + rng.below(OPS_MAX) + usize::from(made.fault(rng, 10));
    let ops: Vec<J> = (0..count).map(|_| op(rng, made)).collect();
    let mut members = vec![("ops".to_string(), J::Arr(ops))];
    if made.ws {
        // A WebSocket request: its type (now and then a wrong, missing or repeated one)
        // and, mostly, an id of any kind.
        match if made.noisy { rng.below(12) } else { 99 } {
            0 => made.fault = true,
            1 => {
                made.fault = true;
                members.push(("type".into(), J::Str("call".into())));
            }
            2 => {
                made.fault = true;
                members.push(("type".into(), J::Num("1".into())));
            }
            3 => {
                made.fault = true;
                members.push(("type".into(), J::Str("mutate".into())));
                members.push(("type".into(), J::Str("mutate".into())));
            }
            _ => members.push(("type".into(), J::Str("mutate".into()))),
        }
        if !rng.one_in(4) {
            members.push(("id".into(), any_json(rng, 4, made)));
        }
    }
    if rng.one_in(3) {
        let d = if made.fault(rng, 5) {
            "bogus".to_string()
        } else {
            rng.pick(&["memory", "disk", "fsync", "null"]).to_string()
        };
        let v = if d == "null" { J::Null } else { J::Str(d) };
        members.push(("durability".into(), v));
    }
    shuffle_some(rng, &mut members);
    J::Obj(members)
}

#[test]
fn hand_json_reader_matches_serde() {
    differential(
        "JSON",
        body,
        |body, schemas, ws| read_mutate_json(body, schemas, OPS_MAX, ws),
        |body, schemas, ws| read_mutate_serde(body, schemas, OPS_MAX, ws),
    );
}

/// The same for the two readers of a MessagePack WebSocket `mutate` request: the hand-written
/// one (`read_mutate_msgpack`) against `rmp_serde` (`read_mutate_msgpack_serde`). The same
/// requests, encoded with every width of integer, string, array and map marker (and
/// `float 32` where it holds the value), and now and then broken in MessagePack's own ways:
/// a string sent as `bin`, text that is not UTF-8, a key that is not a string, a NaN, an
/// `ext` value, a cut or a flipped byte. Bytes after the request are no fault: both readers
/// leave them be.
#[test]
fn hand_msgpack_reader_matches_rmp_serde() {
    differential(
        "MessagePack",
        |rng, made| {
            made.ws = true;
            let request = request(rng, made);
            let mut out = Vec::new();
            pack(rng, &request, &mut out, made);
            if !out.is_empty() && made.fault(rng, 8) {
                let at = rng.below(out.len());
                match rng.below(2) {
                    0 => out.truncate(at),
                    _ => out[at] = *rng.pick(&[0xc1, 0xc4, 0xd4, 0x00, 0xff, 0x80, 0x90]),
                }
            }
            if rng.one_in(10) {
                out.extend_from_slice(rng.pick::<&[u8]>(&[b"\xc0", b"\x81", b"junk"]));
            }
            out
        },
        |frame, schemas, _| read_mutate_msgpack(frame, schemas, OPS_MAX),
        |frame, schemas, _| read_mutate_msgpack_serde(frame, schemas, OPS_MAX),
    );
}

/// The hand reader of a `POST /v1/call` body (`read_call_json`, which transcodes the
/// arguments to MessagePack) takes only bodies the general path takes, and reads them as it
/// does: the same durability, and arguments that read back (`Args::to_json`, the value the
/// functions build their JS value from) to the `serde_json` value of the same text, key
/// order and float bits included. And it takes every plain body: no key twice in an
/// object, no integer only a `u64` holds, nothing nested past its depth.
#[test]
fn hand_call_reader_matches_serde() {
    let seed = env_u64("SLUICE_DECODE_SEED").unwrap_or(0xca11_b0d1);
    let cases = env_u64("SLUICE_DECODE_CASES").unwrap_or(20_000);
    let mut rng = Rng::new(seed);
    let (mut taken, mut plain) = (0, 0);
    for case in 0..cases {
        let mut made = Made {
            noisy: rng.one_in(2),
            ..Made::default()
        };
        let mut members = Vec::new();
        if !rng.one_in(8) {
            members.push(("args".to_string(), any_json(&mut rng, 4, &mut made)));
        }
        if rng.one_in(2) {
            let class = if made.fault(&mut rng, 6) {
                J::Str(rng.pick(&["eventually", "FSYNC", ""]).to_string())
            } else if rng.one_in(5) {
                J::Null
            } else {
                J::Str(
                    rng.pick(&["memory", "disk", "fsync", "replicated"])
                        .to_string(),
                )
            };
            members.push(("durability".to_string(), class));
        }
        if made.fault(&mut rng, 10) {
            members.push(("argz".to_string(), J::Num("1".into())));
        }
        if !members.is_empty() && made.fault(&mut rng, 10) {
            let again = members[rng.below(members.len())].clone();
            members.push(again);
        }
        shuffle_some(&mut rng, &mut members);
        let body_json = J::Obj(members);
        let mut text = String::new();
        spell(&mut rng, &body_json, &mut text, &mut made);
        let mut body = text.into_bytes();
        if made.fault(&mut rng, 20) {
            body.truncate(rng.below(body.len() + 1));
        }
        let shown = || {
            format!(
                "case {case} (seed {seed:#x}): {}",
                String::from_utf8_lossy(&body)
            )
        };

        // The general path: a JSON object of `args` and `durability` only.
        let general = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| match v {
                serde_json::Value::Object(mut m) => Some(m.remove("args").unwrap_or_default())
                    .filter(|_| m.keys().all(|k| k == "durability"))
                    .and_then(|args| match m.get("durability") {
                        None | Some(serde_json::Value::Null) => Some((args, None)),
                        Some(serde_json::Value::String(s)) => {
                            s.parse::<Durability>().ok().map(|d| (args, Some(d)))
                        }
                        Some(_) => None,
                    }),
                _ => None,
            });
        let hand = read_call_json(&body);
        if let Some((args, durability)) = &hand {
            taken += 1;
            let (want_args, want_durability) = general
                .as_ref()
                .unwrap_or_else(|| panic!("taken here, refused by serde_json: {}", shown()));
            assert_eq!(
                serde_json::to_string(&args.to_json()).unwrap(),
                serde_json::to_string(want_args).unwrap(),
                "{}",
                shown()
            );
            assert_eq!(durability, want_durability, "{}", shown());
        }
        if general.is_some() && !made.handed_on && plain_json(&body_json) {
            plain += 1;
            assert!(
                hand.is_some(),
                "a plain body the hand reader refuses: {}",
                shown()
            );
        }
    }
    eprintln!("hand call reader: seed {seed:#x}, {cases} bodies, {plain} plain, {taken} taken");
    assert!(
        plain > cases / 4 && taken >= plain,
        "only {plain} plain bodies and {taken} taken of {cases}"
    );
}

/// No object with a key twice and no integer beyond `i64` (or `-0`, a float to serde_json).
fn plain_json(j: &J) -> bool {
    match j {
        J::Num(n) if !n.contains(['.', 'e', 'E']) => n != "-0" && n.parse::<i64>().is_ok(),
        J::Raw(_) => false,
        J::Arr(items) => items.iter().all(plain_json),
        J::Obj(members) => members
            .iter()
            .enumerate()
            .all(|(i, (k, v))| members[..i].iter().all(|(other, _)| other != k) && plain_json(v)),
        _ => true,
    }
}

/// A reader under test: the body, the schemas, and whether it is a WebSocket request.
type ReadBody = fn(&[u8], &mut &Db, bool) -> Option<sluice_server::decode::Body>;

/// Builds random bodies with `make` and holds the hand reader `hand` to the serde reader
/// `serde` (see the module's doc).
fn differential(
    what: &str,
    mut make: impl FnMut(&mut Rng, &mut Made) -> Vec<u8>,
    hand: ReadBody,
    serde: ReadBody,
) {
    let seed = env_u64("SLUICE_DECODE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64
    });
    let cases = env_u64("SLUICE_DECODE_CASES").unwrap_or(20_000);
    eprintln!(
        "hand {what} reader differential: seed {seed} (SLUICE_DECODE_SEED={seed}), {cases} bodies"
    );
    let dir = TempDir::new("hand-reader");
    let mut config = Config::new(dir.path());
    config.durability = Durability::Memory;
    let core = Core::open(config).expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let changes = sluice_sql::parse_ddl(SCHEMA)
            .expect("the DDL parses")
            .into_iter()
            .map(|d| d.change)
            .collect();
        core.ddl(changes, SCHEMA.into(), None)
            .await
            .expect("the DDL");
    });
    let db = core.db();
    let mut rng = Rng::new(seed);
    let (mut by_hand, mut by_serde, mut clean) = (0u64, 0u64, 0u64);
    // Plain bodies the serde reader read (so the hand reader had to).
    let mut plain_read = 0u64;
    for case in 0..cases {
        let mut made = Made {
            noisy: rng.one_in(2),
            ws: rng.one_in(3),
            ..Made::default()
        };
        let body = make(&mut rng, &mut made);
        let mut schemas: &Db = &db;
        let hand = hand(&body, &mut schemas, made.ws);
        let serde = serde(&body, &mut schemas, made.ws);
        let text = String::from_utf8_lossy(&body);
        match (&hand, &serde) {
            (Some(h), Some(s)) => assert_eq!(
                format!("{h:?}"),
                format!("{s:?}"),
                "case {case} (seed {seed}): the readers disagree on {text} ({body:x?})"
            ),
            (Some(h), None) => panic!(
                "case {case} (seed {seed}): the hand reader accepted what serde did not: {text} ({body:x?})\n{h:?}"
            ),
            _ => {}
        }
        if !made.fault && !made.handed_on {
            clean += 1;
            plain_read += u64::from(serde.is_some());
            assert!(
                serde.is_none() || hand.is_some(),
                "case {case} (seed {seed}): the hand reader passed on a plain body: {text} ({body:x?})"
            );
        }
        by_hand += u64::from(hand.is_some());
        by_serde += u64::from(serde.is_some());
    }
    eprintln!(
        "{cases} bodies: {clean} plain ({plain_read} read), serde read {by_serde}, the hand reader {by_hand}"
    );
    // The bodies must be worth comparing: many read, and many plain ones read by hand.
    assert!(
        by_serde * 4 > cases,
        "serde read only {by_serde} of {cases}"
    );
    assert!(
        plain_read * 5 > cases,
        "only {plain_read} plain bodies of {cases} were read"
    );
}

/// `j` in MessagePack, each marker of a random width that holds it; a noisy request is now
/// and then broken (see [`hand_msgpack_reader_matches_rmp_serde`]).
fn pack(rng: &mut Rng, j: &J, out: &mut Vec<u8>, made: &mut Made) {
    match j {
        J::Null => out.push(0xc0),
        J::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        J::Num(text) => match serde_json::from_str::<serde_json::Number>(text) {
            Ok(_) if made.fault(rng, 40) => {
                // A NaN where the number was.
                out.push(0xcb);
                out.extend_from_slice(&f64::NAN.to_be_bytes());
            }
            Ok(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => pack_int(rng, i, out),
                (None, Some(u)) => {
                    out.push(0xcf);
                    out.extend_from_slice(&u.to_be_bytes());
                }
                _ => {
                    let f = n.as_f64().expect("a JSON number is an f64");
                    if (f as f32) as f64 == f && rng.one_in(2) {
                        out.push(0xca);
                        out.extend_from_slice(&(f as f32).to_be_bytes());
                    } else {
                        out.push(0xcb);
                        out.extend_from_slice(&f.to_be_bytes());
                    }
                }
            },
            // A number JSON cannot hold (say `1e400`): `bin`, which both refuse.
            Err(_) => pack_bin(text.as_bytes(), out),
        },
        J::Str(text) => {
            if made.fault(rng, 60) {
                pack_bin(text.as_bytes(), out);
            } else if made.fault(rng, 60) {
                let mut bytes = text.as_bytes().to_vec();
                bytes.push(0xff);
                pack_str(rng, &bytes, out);
            } else {
                pack_str(rng, text.as_bytes(), out);
            }
        }
        J::Raw(text) => {
            made.fault = true;
            pack_bin(text.as_bytes(), out);
        }
        J::Arr(items) => {
            pack_len(rng, items.len(), [0x90, 0xdc, 0xdd], 15, out);
            items.iter().for_each(|item| pack(rng, item, out, made));
        }
        J::Obj(members) => {
            // Repeated keys: `serde_json` keeps the last value where the hand reader's
            // check of a JSON value passes the whole request on.
            let keys: std::collections::HashSet<&str> =
                members.iter().map(|(k, _)| k.as_str()).collect();
            if keys.len() < members.len() {
                made.handed_on = true;
            }
            pack_len(rng, members.len(), [0x80, 0xde, 0xdf], 15, out);
            for (key, value) in members {
                if made.fault(rng, 200) {
                    pack_int(rng, 7, out);
                } else if made.fault(rng, 200) {
                    // An `ext` value in place of the key.
                    out.extend_from_slice(&[0xd4, 0x01, 0x00]);
                } else {
                    pack_str(rng, key.as_bytes(), out);
                }
                pack(rng, value, out, made);
            }
        }
    }
}

/// An array's or map's length marker: `markers` are the fix, 16- and 32-bit forms.
fn pack_len(rng: &mut Rng, len: usize, markers: [u8; 3], fix_max: usize, out: &mut Vec<u8>) {
    match rng.below(3) {
        0 if len <= fix_max => out.push(markers[0] | len as u8),
        0 | 1 => {
            out.push(markers[1]);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(markers[2]);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

fn pack_str(rng: &mut Rng, bytes: &[u8], out: &mut Vec<u8>) {
    let len = bytes.len();
    match rng.below(4) {
        0 if len < 32 => out.push(0xa0 | len as u8),
        0 | 1 if len < 256 => out.extend_from_slice(&[0xd9, len as u8]),
        0..=2 => {
            out.push(0xda);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdb);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(bytes);
}

fn pack_bin(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&[0xc4, bytes.len() as u8]);
    out.extend_from_slice(bytes);
}

/// `i` in the narrowest marker that holds it, or a wider one.
fn pack_int(rng: &mut Rng, i: i64, out: &mut Vec<u8>) {
    let wide = rng.one_in(3);
    if !wide && (0..=0x7f).contains(&i) {
        out.push(i as u8);
    } else if !wide && (-32..0).contains(&i) {
        out.push(i as i8 as u8);
    } else if i >= 0 && rng.one_in(2) {
        match i {
            0..=0xff if rng.one_in(2) => out.extend_from_slice(&[0xcc, i as u8]),
            0..=0xffff if rng.one_in(2) => {
                out.push(0xcd);
                out.extend_from_slice(&(i as u16).to_be_bytes());
            }
            0..=0xffff_ffff if rng.one_in(2) => {
                out.push(0xce);
                out.extend_from_slice(&(i as u32).to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend_from_slice(&(i as u64).to_be_bytes());
            }
        }
    } else {
        match i {
            -0x80..=0x7f if rng.one_in(2) => out.extend_from_slice(&[0xd0, i as i8 as u8]),
            -0x8000..=0x7fff if rng.one_in(2) => {
                out.push(0xd1);
                out.extend_from_slice(&(i as i16).to_be_bytes());
            }
            -0x8000_0000..=0x7fff_ffff if rng.one_in(2) => {
                out.push(0xd2);
                out.extend_from_slice(&(i as i32).to_be_bytes());
            }
            _ => {
                out.push(0xd3);
                out.extend_from_slice(&i.to_be_bytes());
            }
        }
    }
}
