//! `tx.get` and `tx.patch` serve their common calls in raw QuickJS calls and hand every
//! other call to the general path. These tests hold the line between the two: what the
//! fast path serves gives the same values, and what it hands over sees no difference —
//! a getter or proxy trap of a `set` runs exactly once, a function reached through a
//! destructured `tx` still works, a table named by a computed string or keyed by text is
//! found, a schema change between calls shows in the next row, and a module replaced (or
//! dropped) frees what the fast path held.

mod support;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{FunctionLimits, Functions};
use support::Owned;

fn ddl(db: &mut Db, sql: &str) {
    let changes = sluice_sql::parse_ddl(sql)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, sql.into()).unwrap();
}

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    ddl(
        &mut db,
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, note TEXT)",
    );
    ddl(
        &mut db,
        "CREATE TABLE users (name TEXT PRIMARY KEY, age INTEGER, score REAL)",
    );
    let mut tx = db.transaction();
    for (id, balance) in [(1, 10), (2, 20), (3, 4_000_000_000i64)] {
        let row = json!({"id": id, "balance": balance, "note": format!("n{id}")});
        tx.insert("accounts", row.as_object().unwrap(), None)
            .unwrap();
    }
    for (name, age) in [("ada", 36), ("émile", 7)] {
        let row = json!({"name": name, "age": age, "score": 1.5});
        tx.insert("users", row.as_object().unwrap(), None).unwrap();
    }
    tx.commit().unwrap();
    db
}

const APP: &str = r#"
export function get(tx, { table, id }) { return tx.get(table, id); }
export function set_note(tx, { id, note }) {
  tx.patch("accounts", id, { note });
  return tx.get("accounts", id);
}
export function computed_name(tx) { return tx.get(["acc", "ounts"].join(""), 2); }
export function destructured(tx) {
  const { get, patch } = tx;
  patch("accounts", 1, { balance: 11 });
  return get("accounts", 1);
}
export function getter_runs_once(tx) {
  let runs = 0;
  const set = { get balance() { runs++; return 5; } };
  tx.patch("accounts", 1, set);
  return [runs, tx.get("accounts", 1).balance];
}
export function proxy_traps_run_once(tx) {
  const seen = [];
  const set = new Proxy({ balance: 6 }, {
    ownKeys(t) { seen.push("ownKeys"); return Reflect.ownKeys(t); },
    get(t, k) { seen.push("get " + String(k)); return Reflect.get(t, k); },
  });
  let error = null;
  try { tx.patch("accounts", 1, set); } catch (e) { error = e.message; }
  return [seen.length, error, tx.get("accounts", 1).balance];
}
export function mixed_values(tx) {
  tx.patch("accounts", 2, { balance: 2 ** 40, note: "naïve ✓", extra: undefined });
  return tx.get("accounts", 2);
}
export function text_keys(tx) {
  tx.patch("users", "émile", { age: 8, score: 2 });
  return [tx.get("users", "émile"), tx.get("users", "nobody"), tx.get("users", "ada").age];
}
export function errors(tx) {
  const out = [];
  for (const call of [
    () => tx.patch("accounts", 99, { balance: 1 }),
    () => tx.patch("accounts", 1, { nope: 1 }),
    () => tx.patch("accounts", 1, { balance: "x" }),
    () => tx.patch("accounts", 1, { id: 5 }),
    () => tx.patch("nope", 1, { balance: 1 }),
    () => tx.get("nope", 1),
    () => tx.get("accounts", "1"),
    () => tx.get("users", 1),
    () => tx.patch("accounts", 1, [1]),
    () => tx.get("accounts"),
  ]) {
    try { out.push(["ok", call()]); } catch (e) { out.push(["error", e.message]); }
  }
  return out;
}
"#;

fn call(functions: &mut Functions, db: Db, name: &str, args: Json) -> (Db, Json) {
    let st = db.begin();
    let (owned, got) = functions.call(name, &args, None, Owned { db, st });
    (owned.db, got.unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn loaded() -> Functions {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    functions
}

#[test]
fn rows_read_by_the_fast_path_are_the_rows_as_json() {
    let mut functions = loaded();
    let db = db();
    let (db, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "accounts", "id": 1}),
    );
    assert_eq!(got, json!({"id": 1, "balance": 10, "note": "n1"}));
    // Past 32 bits an integer is a JS float, read back exactly.
    let (db, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "accounts", "id": 3}),
    );
    assert_eq!(got["balance"], json!(4_000_000_000i64));
    let (db, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "accounts", "id": 7}),
    );
    assert_eq!(got, Json::Null);
    let (db, got) = call(&mut functions, db, "computed_name", json!(null));
    assert_eq!(got["balance"], json!(20));
    let (_, got) = call(&mut functions, db, "destructured", json!(null));
    assert_eq!(
        got["balance"],
        json!(11),
        "tx's functions work without `this`"
    );
}

#[test]
fn a_set_with_a_getter_or_a_proxy_is_read_once_by_the_general_path() {
    let mut functions = loaded();
    let db = db();
    let (db, got) = call(&mut functions, db, "getter_runs_once", json!(null));
    assert_eq!(got, json!([1, 5]), "[getter runs, balance after]");
    let (_, got) = call(&mut functions, db, "proxy_traps_run_once", json!(null));
    // A proxy is refused before any of its traps runs, as it always was.
    assert_eq!(
        got,
        json!([0, "bad_request: set: a proxy value cannot be stored", 5]),
        "[traps run, error, balance after]"
    );
}

#[test]
fn patches_on_the_fast_path_store_what_json_would() {
    let mut functions = loaded();
    let db = db();
    let (db, got) = call(&mut functions, db, "mixed_values", json!(null));
    assert_eq!(
        got,
        json!({"id": 2, "balance": 1_099_511_627_776i64, "note": "naïve ✓"})
    );
    let (_, got) = call(&mut functions, db, "text_keys", json!(null));
    assert_eq!(
        got,
        json!([{"name": "émile", "age": 8, "score": 2}, null, 36])
    );
}

#[test]
fn refused_calls_keep_their_errors_word_for_word() {
    let mut functions = loaded();
    let (_, got) = call(&mut functions, db(), "errors", json!(null));
    // What the general path answered before the fast path existed, word for word.
    let expected = json!([
        ["error", "not_found: table \"accounts\" has no row with key 99"],
        ["error", "schema: table \"accounts\" has no column \"nope\""],
        ["error", "schema: column \"balance\": expected INTEGER, got a string"],
        ["error", "bad_request: patch cannot set the primary key \"id\" of table \"accounts\" (\"set\" names it); the row is chosen by \"id\" — to change a key, delete and insert"],
        ["error", "not_found: no table named \"nope\""],
        ["error", "not_found: no table named \"nope\""],
        ["error", "schema: id for table \"accounts\": expected INTEGER, got a string"],
        ["error", "schema: id for table \"users\": expected TEXT, got an integer"],
        ["error", "bad_request: set must be an object"],
        ["error", "Error calling function with 1 argument(s) while 2 where expected"],
    ]);
    let got = got.as_array().unwrap();
    for (i, (g, e)) in got.iter().zip(expected.as_array().unwrap()).enumerate() {
        assert_eq!(g, e, "call {i}");
    }
    assert_eq!(got.len(), 10);
}

#[test]
fn a_schema_change_between_calls_shows_in_the_next_row() {
    let mut functions = loaded();
    let db = db();
    let (mut db, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "accounts", "id": 1}),
    );
    assert_eq!(got, json!({"id": 1, "balance": 10, "note": "n1"}));
    ddl(
        &mut db,
        "ALTER TABLE accounts ADD COLUMN tier INTEGER DEFAULT 3",
    );
    let (_, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "accounts", "id": 1}),
    );
    assert_eq!(
        got,
        json!({"id": 1, "balance": 10, "note": "n1", "tier": 3})
    );
}

#[test]
fn a_schema_change_between_patches_is_seen_by_the_next_patch() {
    // Each call committed, as the writer commits it.
    fn set_note(functions: &mut Functions, db: Db, note: &str) -> (Db, Json) {
        let st = db.begin();
        let args = json!({"id": 2, "note": note});
        let (mut owned, got) = functions.call("set_note", &args, None, Owned { db, st });
        let got = got.unwrap_or_else(|e| panic!("set_note: {e}"));
        let commit = owned.db.commit_state(&mut owned.st).expect("a commit");
        let sluice_engine::CommitBody::Rows(changes) = &commit.body else {
            panic!("a row commit");
        };
        // The change carries the table's schema of the moment (its commit is encoded
        // and its live views diffed with it).
        let schema = &owned.db.table("accounts").unwrap().schema;
        assert!(std::sync::Arc::ptr_eq(&changes[0].table, schema));
        (owned.db, got)
    }
    let mut functions = loaded();
    let (mut db, got) = set_note(&mut functions, db(), "before");
    assert_eq!(got, json!({"id": 2, "balance": 20, "note": "before"}));
    ddl(
        &mut db,
        "ALTER TABLE accounts ADD COLUMN tier INTEGER DEFAULT 3",
    );
    let (_, got) = set_note(&mut functions, db, "after");
    assert_eq!(
        got,
        json!({"id": 2, "balance": 20, "note": "after", "tier": 3})
    );
}

#[test]
fn a_replaced_module_frees_what_its_fast_path_held() {
    let mut functions = loaded();
    let db = db();
    let (db, _) = call(&mut functions, db, "text_keys", json!(null));
    functions.load(APP).unwrap();
    let (db, got) = call(
        &mut functions,
        db,
        "get",
        json!({"table": "users", "id": "ada"}),
    );
    assert_eq!(got["age"], json!(36));
    // Dropping the runtime frees every object: QuickJS aborts the process on one left
    // over, so reaching the end of this test is the check.
    drop(functions);
    drop(db);
}

/// Random rows of every column type, under an INTEGER key and under a TEXT key, read by
/// `tx.get` through the fast path and then, with it turned off, through the general one.
#[test]
fn random_rows_read_the_same_through_both_paths() {
    use sluice_fuzzkit::Rng;
    let seed = sluice_fuzzkit::env_u64("GET_DIFF_SEED").unwrap_or(0x5eed_f9e7);
    let mut rng = Rng::new(seed);
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    const COLUMNS: &str = "i INTEGER, r REAL, b BOOLEAN, s TEXT, j JSON, bl BLOB, ts TIMESTAMP";
    ddl(
        &mut db,
        &format!("CREATE TABLE n (id INTEGER PRIMARY KEY, {COLUMNS})"),
    );
    ddl(
        &mut db,
        &format!("CREATE TABLE t (id TEXT PRIMARY KEY, {COLUMNS})"),
    );
    let ints = [
        0i64,
        1,
        -1,
        7,
        i32::MAX as i64,
        i32::MIN as i64,
        1 << 31,
        -(1 << 40),
        1 << 53,
    ];
    let texts = [
        "",
        "a",
        "naïve ✓",
        "line\nbreak",
        "\u{1F600}",
        "x".repeat(300).leak(),
    ];
    let reals = [0.0, -0.0, 1.5, 2.0, -3.25, 1e300, 5e-324];
    let value = |rng: &mut Rng, column: usize| -> Json {
        if rng.one_in(6) {
            return Json::Null;
        }
        match column {
            0 | 6 => json!(*rng.pick(&ints)),
            1 => json!(*rng.pick(&reals)),
            2 => json!(rng.one_in(2)),
            3 => json!(*rng.pick(&texts)),
            4 => json!({"k": [1, *rng.pick(&texts)], "n": null}),
            _ => json!(["", "AA==", "aGVsbG8="][rng.below(3)]),
        }
    };
    let names = ["i", "r", "b", "s", "j", "bl", "ts"];
    let mut tx = db.transaction();
    for id in 0..200i64 {
        for (table, key) in [("n", json!(id)), ("t", json!(format!("k{id}é")))] {
            let mut row = serde_json::Map::new();
            row.insert("id".into(), key);
            for (c, name) in names.iter().enumerate() {
                row.insert((*name).into(), value(&mut rng, c));
            }
            tx.insert(table, &row, None).unwrap();
        }
    }
    tx.commit().unwrap();

    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions
        .load(
            r#"export function all(tx) {
                 const out = [];
                 for (let i = 0; i < 200; i++) {
                   out.push(tx.get("n", i), tx.get("t", "k" + i + "é"));
                 }
                 out.push(tx.get("n", 999), tx.get("t", "nobody"));
                 return out;
               }"#,
        )
        .unwrap();
    let (db, fast) = call(&mut functions, db, "all", json!({}));
    functions.set_raw_host_calls(false);
    let (_, general) = call(&mut functions, db, "all", json!({}));
    let (fast, general) = (fast.as_array().unwrap(), general.as_array().unwrap());
    assert_eq!(fast.len(), 402);
    assert_eq!(general.len(), 402);
    for (i, (f, g)) in fast.iter().zip(general).enumerate() {
        assert_eq!(f, g, "seed {seed:#x}, read {i}: fast vs general");
    }
    assert!(fast[0].is_object() && fast[1].is_object());
    assert!(fast[400].is_null() && fast[401].is_null());
}
