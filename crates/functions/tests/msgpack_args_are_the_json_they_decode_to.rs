//! A call's MessagePack arguments, kept as bytes and built into JavaScript straight from
//! them (`Args::Msgpack`), must give the function exactly the value it got when the bytes
//! were first decoded into a `serde_json::Value` (`rmp_serde`) and built from that: the same
//! types, numbers (`-0`, integers past 32 bits, floats), text, key order, prototypes (a
//! `__proto__` key) — for the function and for `allow`'s copy. Random values, encoded as
//! the clients' MessagePack encoder does, are read both ways.

mod support;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{Args, FunctionLimits, Functions, Msgpack};
use sluice_fuzzkit::Rng;
use support::Owned;

/// Describes a value so that any difference a function could see shows.
const APP: &str = r#"
function d(v) {
  if (v === null) return "null";
  if (v === undefined) return "undefined";
  if (Array.isArray(v)) return "[" + v.map(d).join(",") + "]";
  switch (typeof v) {
    case "number": return Object.is(v, -0) ? "-0" : "n" + String(v) + (Number.isSafeInteger(v) ? "i" : "");
    case "string": return JSON.stringify(v);
    case "boolean": return String(v);
    case "object": {
      const proto = Object.getPrototypeOf(v);
      const p = proto === Object.prototype ? "" : proto === null ? "(null)" : "(" + d(proto) + ")";
      return p + "{" + Reflect.ownKeys(v).map((k) => {
        const desc = Object.getOwnPropertyDescriptor(v, k);
        const flags = (desc.writable ? "w" : "") + (desc.enumerable ? "e" : "") + (desc.configurable ? "c" : "");
        return JSON.stringify(k) + flags + ":" + d(v[k]);
      }).join(",") + "}";
    }
  }
  return "?" + typeof v;
}
let seen = null;
export function allow(auth, name, args) { seen = d(args); return true; }
export function describe(tx, args) {
  const out = [seen, d(args)];
  seen = null;
  return out;
}
"#;

fn text(rng: &mut Rng) -> String {
    const PARTS: &[&str] = &[
        "a",
        "from",
        "to",
        "amount",
        "__proto__",
        "é",
        "☃",
        "\"",
        "\\",
        "\n",
        "\u{0}",
        "𝄞",
        "toString",
        "0",
        "12",
        "length",
        "constructor",
    ];
    (0..rng.below(4)).map(|_| *rng.pick(PARTS)).collect()
}

fn value(rng: &mut Rng, depth: usize) -> Json {
    let kinds = if depth >= 4 { 7 } else { 9 };
    match rng.below(kinds) {
        0 => Json::Null,
        1 => Json::Bool(rng.below(2) == 1),
        2 => {
            const INTS: &[i64] = &[
                0,
                1,
                -1,
                127,
                128,
                -32,
                -33,
                255,
                65_536,
                i32::MAX as i64,
                i32::MAX as i64 + 1,
                i32::MIN as i64,
                i32::MIN as i64 - 1,
                1 << 53,
                (1 << 53) + 1,
                i64::MAX,
                i64::MIN,
            ];
            json!(*rng.pick(INTS))
        }
        3 => json!(*rng.pick(&[u64::MAX, i64::MAX as u64 + 1])),
        4 => {
            const FLOATS: &[f64] = &[0.0, -0.0, 1.5, -2.25, 3.0, 1e300, 5e-324, 2147483648.0];
            json!(*rng.pick(FLOATS))
        }
        5 | 6 => Json::String(text(rng)),
        7 => Json::Array((0..rng.below(5)).map(|_| value(rng, depth + 1)).collect()),
        _ => {
            let mut map = serde_json::Map::new();
            for _ in 0..rng.below(6) {
                map.insert(text(rng), value(rng, depth + 1));
            }
            Json::Object(map)
        }
    }
}

fn db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

fn describe(functions: &mut Functions, args: &Args, client: bool) -> Json {
    let auth = json!({"sub": "u", "claims": {}});
    let st_db = db();
    let st = st_db.begin();
    let (_, got) = functions.call_args(
        "describe",
        args,
        client.then_some(&auth),
        Owned { db: st_db, st },
    );
    got.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn random_arguments_read_from_messagepack_are_the_json_they_decode_to() {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    let mut rng = Rng::new(0x5eed_cafe_f00d_0001);
    let (mut taken, mut cases) = (0, 0);
    for case in 0..3000 {
        let mut json = value(&mut rng, 0);
        // Most calls pass an object, as clients do.
        if case % 3 != 0 {
            json = json!({"from": json, "to": value(&mut rng, 1), "amount": 5});
        }
        let bytes = rmp_serde::to_vec(&json).unwrap();
        let decoded: Json = rmp_serde::from_slice(&bytes).unwrap();
        cases += 1;
        let Some((kept, end)) = Msgpack::read(&bytes, 0) else {
            continue;
        };
        taken += 1;
        assert_eq!(end, bytes.len());
        assert_eq!(kept.to_json(), decoded, "{json}");
        let client = case % 2 == 0;
        let from_json = describe(&mut functions, &Args::Json(decoded.clone()), client);
        let from_bytes = describe(&mut functions, &Args::Msgpack(kept), client);
        assert_eq!(from_bytes, from_json, "{json}");
        if client {
            assert_eq!(
                from_bytes[0], from_bytes[1],
                "allow saw what the function saw"
            );
        }
    }
    // Only repeated keys (which random text makes) are left to the general decoder.
    assert!(taken > cases * 9 / 10, "only {taken} of {cases} taken");
}

#[test]
fn a_proto_key_and_a_float32_read_alike_both_ways() {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    // {"__proto__": {"x": 1}, "y": <float32 0.5>}
    let mut bytes = vec![0x82, 0xa9];
    bytes.extend_from_slice(b"__proto__");
    bytes.extend_from_slice(&[0x81, 0xa1, b'x', 0x01, 0xa1, b'y', 0xca]);
    bytes.extend_from_slice(&0.5f32.to_be_bytes());
    let decoded: Json = rmp_serde::from_slice(&bytes).unwrap();
    let (kept, _) = Msgpack::read(&bytes, 0).unwrap();
    let from_json = describe(&mut functions, &Args::Json(decoded), false);
    let from_bytes = describe(&mut functions, &Args::Msgpack(kept), false);
    assert_eq!(from_bytes, from_json);
    // What both see: the key set the prototype, as `JS_SetProperty` does.
    assert_eq!(from_bytes[1], json!("({\"x\"wec:n1i}){\"y\"wec:n0.5}"));
}
