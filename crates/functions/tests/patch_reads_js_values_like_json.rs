//! `tx.patch` reads its `set` straight from JavaScript into typed values; the old path made
//! a JSON object first and patched with that. A differential test: random `set` objects
//! (every column type, wrong types, the key, unknown columns, skipped values) and ids, each
//! patched through JavaScript on one database and through the engine's JSON `patch` on
//! another; the outcome (version or error, word for word) and every row must agree. Every
//! other case runs with the raw fast path of `tx.patch` off, so both of its paths are held
//! to the JSON one.
//!
//! `PATCH_DIFF_CASES` sets the number of cases (default 600); a failure prints its seed,
//! and `PATCH_DIFF_SEED` replays it.

mod support;

use serde_json::{json, Map, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{FunctionError, FunctionLimits, Functions};
use sluice_fuzzkit::Rng;
use support::{Owned, VALUES};

const DDL: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, i INTEGER, r REAL, b BOOLEAN, \
                   s TEXT, j JSON, bl BLOB, ts TIMESTAMP, nn INTEGER NOT NULL)";

const APP: &str = r#"
export function patch(tx, { id, set }) {
  return tx.patch("t", eval("(" + id + ")"), eval("(" + set + ")"));
}
export function patch_caught(tx, { id, set }) {
  try { tx.patch("t", eval("(" + id + ")"), eval("(" + set + ")")); return "ok"; }
  catch (e) { return String(e.message); }
}
"#;

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change = sluice_sql::parse_ddl(DDL).unwrap().remove(0).change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    for id in 0..4 {
        let row = json!({"id": id, "i": id, "s": format!("row {id}"), "nn": 1});
        tx.insert("t", row.as_object().unwrap(), None).unwrap();
    }
    tx.commit().unwrap();
    db
}

const COLUMNS: &[&str] = &["i", "r", "b", "s", "j", "bl", "ts", "nn", "id", "zz"];

const IDS: &[(&str, &str)] = &[
    ("0", "0"),
    ("1", "1"),
    ("3", "3"),
    ("9", "9"),
    ("\"1\"", "\"1\""),
    ("1.5", "1.5"),
    ("null", "null"),
];

/// A value for column `name`: mostly one that fits (so most cases take the typed path),
/// else any of [`support::VALUES`]. Returns its source and its JSON (`None`: skipped).
fn value(rng: &mut Rng, name: &str) -> (String, Option<String>) {
    if rng.below(3) > 0 {
        let fitting: &[&str] = match name {
            "i" | "ts" | "nn" | "id" => &["5", "-9", "2147483648", "null"],
            "r" => &["2.25", "4", "null"],
            "b" => &["true", "false"],
            _ => &["\"text\"", "\"\"", "null"],
        };
        let v = fitting[rng.below(fitting.len())];
        (v.to_string(), Some(v.to_string()))
    } else {
        let (src, json) = VALUES[rng.below(VALUES.len())];
        (src.to_string(), json.map(str::to_string))
    }
}

/// One random case: (id source, id JSON, set source, set JSON).
fn case(rng: &mut Rng) -> (String, Json, String, Map<String, Json>) {
    let (id_src, id_json) = IDS[rng.below(IDS.len())];
    let mut src = Vec::new();
    let mut map = Map::new();
    let mut names: Vec<&str> = COLUMNS.to_vec();
    for _ in 0..rng.below(4) {
        let name = names.remove(rng.below(names.len()));
        let (v_src, v_json) = value(rng, name);
        src.push(format!("{name}: {v_src}"));
        if let Some(j) = v_json {
            map.insert(name.to_string(), serde_json::from_str(&j).unwrap());
        }
    }
    (
        id_src.to_string(),
        serde_json::from_str(id_json).unwrap(),
        format!("{{{}}}", src.join(", ")),
        map,
    )
}

fn rows(db: &Db) -> String {
    format!("{:?}", db.table("t").unwrap().rows)
}

#[test]
fn patch_from_javascript_matches_the_json_patch_on_random_sets() {
    let cases: u64 = std::env::var("PATCH_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("PATCH_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd);
    let mut rng = Rng::new(seed);
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    let (mut via_js, mut via_json) = (db(), db());
    let (mut typed, mut refused) = (0, 0);
    for n in 0..cases {
        let (id_src, id, set_src, set) = case(&mut rng);
        let name = if rng.below(4) == 0 {
            "patch_caught"
        } else {
            "patch"
        };
        let args = json!({"id": id_src, "set": set_src});
        // Every other case with `tx.patch`'s raw fast path off: both paths answer to JSON.
        functions.set_raw_host_calls(n % 2 == 0);
        let st = via_js.begin();
        let (mut owned, got) = functions.call(name, &args, None, Owned { db: via_js, st });
        let got = match got {
            Ok(v) => {
                owned.db.commit_state(&mut owned.st);
                Ok(v)
            }
            Err(e) => {
                owned.db.rollback_state(&mut owned.st);
                Err(e)
            }
        };
        via_js = owned.db;

        let mut st = via_json.begin();
        let mut tx = via_json.tx(&mut st);
        let expected = match tx.patch("t", &id, &set, None) {
            Ok(w) => {
                typed += 1;
                Ok(match name {
                    "patch" => json!(w.version),
                    _ => json!("ok"),
                })
            }
            Err(e) => {
                refused += 1;
                let message = format!("{}: {}", e.code.as_str(), e.message);
                match name {
                    "patch" => Err(FunctionError::Thrown(message)),
                    _ => Ok(json!(message)),
                }
            }
        };
        if expected.is_ok() && (name == "patch" || expected.as_ref().unwrap() == "ok") {
            via_json.commit_state(&mut st);
        } else {
            via_json.rollback_state(&mut st);
        }
        assert_eq!(
            got, expected,
            "case {n} (seed {seed}): tx.patch(\"t\", {id_src}, {set_src})"
        );
        assert_eq!(
            rows(&via_js),
            rows(&via_json),
            "case {n} (seed {seed}): rows after tx.patch(\"t\", {id_src}, {set_src})"
        );
        assert_eq!(via_js.seq, via_json.seq, "case {n} (seed {seed})");
    }
    // Both outcomes were exercised.
    assert!(
        typed > cases / 10 && refused > cases / 10,
        "{typed} written, {refused} refused"
    );
}

#[test]
fn non_ascii_table_and_column_names_are_matched_exactly() {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change =
        sluice_sql::parse_ddl("CREATE TABLE \"ü\" (id INTEGER PRIMARY KEY, \"é\" INTEGER)")
            .unwrap()
            .remove(0)
            .change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    tx.insert("ü", json!({"id": 1, "é": 2}).as_object().unwrap(), None)
        .unwrap();
    tx.commit().unwrap();
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions
        .load(
            r#"
export function go(tx) {
  const before = tx.get("ü", 1);
  tx.patch("ü", 1, { "é": before["é"] + 1 });
  let wrong;
  try { tx.patch("ü", 1, { "Ã©": 7 }); } catch (e) { wrong = e.message; }
  let table;
  try { tx.get("Ã¼", 1); } catch (e) { table = e.message; }
  return { before, after: tx.get("ü", 1), wrong, table };
}
"#,
        )
        .unwrap();
    let st = db.begin();
    let (_, got) = functions.call("go", &json!(null), None, Owned { db, st });
    let got = got.unwrap();
    assert_eq!(got["before"], json!({"id": 1, "é": 2}));
    assert_eq!(got["after"], json!({"id": 1, "é": 3}));
    assert!(
        got["wrong"]
            .as_str()
            .unwrap()
            .contains("has no column \"Ã©\""),
        "{got}"
    );
    assert!(got["table"].as_str().unwrap().contains("Ã¼"), "{got}");
}
