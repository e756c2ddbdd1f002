//! `tx.insert` / `tx.upsert` read their row straight from JavaScript into typed values; the
//! old path made a JSON object first and wrote with that. A differential test: random rows
//! (every column type, wrong types, defaults, NOT NULL, a missing or wrong key, unknown
//! columns, skipped values) inserted or upserted through JavaScript on one database and
//! through the engine's JSON `insert` / `upsert` on another; the outcome (version or error,
//! word for word) and every row must agree.
//!
//! `PUT_DIFF_CASES` sets the number of cases (default 800); a failure prints its seed, and
//! `PUT_DIFF_SEED` replays it.

mod support;

use serde_json::{json, Map, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{FunctionError, FunctionLimits, Functions};
use sluice_fuzzkit::Rng;
use support::{Owned, VALUES};

const DDL: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, i INTEGER, r REAL DEFAULT -1.5, \
                   b BOOLEAN DEFAULT true, s TEXT, j JSON DEFAULT '{\"a\":1}', bl BLOB, \
                   ts TIMESTAMP, nn INTEGER NOT NULL, nd TEXT NOT NULL DEFAULT 'x')";

const APP: &str = r#"
export function insert(tx, { row }) {
  return tx.insert("t", eval("(" + row + ")"));
}
export function upsert(tx, { row }) {
  return tx.upsert("t", eval("(" + row + ")"));
}
export function insert_caught(tx, { row }) {
  try { tx.insert("t", eval("(" + row + ")")); return "ok"; }
  catch (e) { return String(e.message); }
}
export function upsert_caught(tx, { row }) {
  try { tx.upsert("t", eval("(" + row + ")")); return "ok"; }
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

const COLUMNS: &[&str] = &["i", "r", "b", "s", "j", "bl", "ts", "nn", "nd", "zz"];

/// A value for column `name`: mostly one that fits (so most cases take the typed path),
/// else any of [`support::VALUES`]. Returns its source and its JSON (`None`: skipped).
fn value(rng: &mut Rng, name: &str) -> (String, Option<String>) {
    if name == "id" && rng.below(2) == 0 {
        // A key most likely new, so inserts keep succeeding however long the run.
        let id = rng.below(1 << 40).to_string();
        return (id.clone(), Some(id));
    }
    if rng.below(4) > 0 {
        let fitting: &[&str] = match name {
            "id" => &[
                "1",
                "2",
                "5",
                "6",
                "7",
                "8",
                "9",
                "-9",
                "2147483648",
                "null",
            ],
            "i" | "ts" | "nn" => &["5", "-9", "2147483648", "null"],
            "r" => &["2.25", "4", "null"],
            "b" => &["true", "false", "null"],
            _ => &["\"text\"", "\"\"", "null"],
        };
        let v = fitting[rng.below(fitting.len())];
        (v.to_string(), Some(v.to_string()))
    } else {
        let (src, json) = VALUES[rng.below(VALUES.len())];
        (src.to_string(), json.map(str::to_string))
    }
}

/// One random case: (row source, row JSON). The key is usually there and `nn` often.
fn case(rng: &mut Rng) -> (String, Map<String, Json>) {
    let mut src = Vec::new();
    let mut map = Map::new();
    let mut names: Vec<&str> = COLUMNS.to_vec();
    let mut add = |name: &str, rng: &mut Rng| {
        let (v_src, v_json) = value(rng, name);
        src.push(format!("{name}: {v_src}"));
        if let Some(j) = v_json {
            map.insert(name.to_string(), serde_json::from_str(&j).unwrap());
        }
    };
    let with_key = rng.below(8) > 0;
    let key_first = rng.below(2) == 0;
    if with_key && key_first {
        add("id", rng);
    }
    if rng.below(3) > 0 {
        names.retain(|n| *n != "nn");
        add("nn", rng);
    }
    for _ in 0..rng.below(5) {
        let name = names.remove(rng.below(names.len()));
        add(name, rng);
    }
    if with_key && !key_first {
        add("id", rng);
    }
    (format!("{{{}}}", src.join(", ")), map)
}

fn rows(db: &Db) -> String {
    format!("{:?}", db.table("t").unwrap().rows)
}

#[test]
fn insert_and_upsert_from_javascript_match_the_json_path_on_random_rows() {
    let cases: u64 = std::env::var("PUT_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(800);
    let seed: u64 = std::env::var("PUT_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_9876_0123);
    let mut rng = Rng::new(seed);
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    let (mut via_js, mut via_json) = (db(), db());
    let (mut written, mut refused) = (0, 0);
    for n in 0..cases {
        let (row_src, row) = case(&mut rng);
        let replace = rng.below(2) == 0;
        let caught = rng.below(4) == 0;
        let name = match (replace, caught) {
            (false, false) => "insert",
            (true, false) => "upsert",
            (false, true) => "insert_caught",
            (true, true) => "upsert_caught",
        };
        let args = json!({ "row": row_src });
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
        let outcome = if replace {
            tx.upsert("t", &row, None)
        } else {
            tx.insert("t", &row, None)
        };
        let expected = match outcome {
            Ok(w) => {
                written += 1;
                Ok(if caught {
                    json!("ok")
                } else {
                    json!(w.version)
                })
            }
            Err(e) => {
                refused += 1;
                let message = format!("{}: {}", e.code.as_str(), e.message);
                if caught {
                    Ok(json!(message))
                } else {
                    Err(FunctionError::Thrown(message))
                }
            }
        };
        if expected.is_ok() && (!caught || expected.as_ref().unwrap() == "ok") {
            via_json.commit_state(&mut st);
        } else {
            via_json.rollback_state(&mut st);
        }
        assert_eq!(
            got, expected,
            "case {n} (seed {seed}): tx.{name}(\"t\", {row_src})"
        );
        assert_eq!(
            rows(&via_js),
            rows(&via_json),
            "case {n} (seed {seed}): rows after tx.{name}(\"t\", {row_src})"
        );
        assert_eq!(via_js.seq, via_json.seq, "case {n} (seed {seed})");
    }
    // Both outcomes were exercised.
    assert!(
        written > cases / 10 && refused > cases / 10,
        "{written} written, {refused} refused"
    );
}

#[test]
fn a_row_that_is_not_an_object_or_names_no_table_is_refused_as_before() {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions
        .load(
            r#"
export function go(tx) {
  const out = [];
  for (const [table, row] of [["t", [1]], ["t", 5], ["nope", {id: 1}], [7, {id: 1}]]) {
    try { tx.insert(table, row); out.push("ok"); } catch (e) { out.push(String(e.message)); }
  }
  return out;
}
"#,
        )
        .unwrap();
    let db = db();
    let st = db.begin();
    let (_, got) = functions.call("go", &json!(null), None, Owned { db, st });
    let got = got.unwrap();
    let got: Vec<&str> = got
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(got[0], "bad_request: row must be an object", "{got:?}");
    assert_eq!(got[1], "bad_request: row must be an object", "{got:?}");
    assert!(got[2].contains("nope"), "{got:?}");
    assert!(got[3].contains("string"), "{got:?}");
}
