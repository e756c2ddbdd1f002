//! Server functions: commit on return, roll back on throw, limits, reload, determinism.

use std::time::Duration;

use serde_json::json;
use sluice_engine::{Changelog, Db, Limits, Retention, TxRef, TxState};
use sluice_functions::{FunctionError, FunctionLimits, Functions, TxAccess};

struct Owned {
    db: Db,
    st: TxState,
    seed: u64,
}

impl TxAccess for Owned {
    fn tx(&mut self) -> TxRef<'_> {
        self.db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        1_700_000_000_000_000
    }
    fn seed(&self) -> u64 {
        self.seed
    }
}

fn accounts_db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change = sluice_sql::parse_ddl(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    )
    .unwrap()
    .remove(0)
    .change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    for id in 0..4 {
        tx.insert(
            "accounts",
            json!({"id": id, "balance": 100}).as_object().unwrap(),
            None,
        )
        .unwrap();
    }
    tx.commit().unwrap();
    db
}

const APP: &str = r#"
export function transfer(tx, { from, to, amount }) {
  if (from === to) throw new Error("same account");
  const a = tx.get("accounts", from);
  const b = tx.get("accounts", to);
  if (!a || !b) throw new Error("no such account");
  if (a.balance < amount) throw new Error("insufficient funds");
  tx.patch("accounts", from, { balance: a.balance - amount });
  tx.patch("accounts", to, { balance: b.balance + amount });
  return { from: a.balance - amount, to: b.balance + amount };
}
export function half_then_fail(tx, { from }) {
  tx.patch("accounts", from, { balance: 0 });
  throw new Error("changed my mind");
}
export function spin(tx) { for (;;) {} }
export function hog(tx) { const a = []; for (;;) a.push(new Array(100000).fill(1)); }
export function draws(tx) { return [tx.random(), tx.random(), tx.now()]; }
export function clock(tx) { return Date.now(); }
export function dice(tx) { return Math.random(); }
"#;

fn call(
    f: &mut Functions,
    db: Db,
    name: &str,
    args: serde_json::Value,
) -> (Db, Result<serde_json::Value, FunctionError>) {
    let st = db.begin();
    let (mut owned, result) = f.call(name, &args, None, Owned { db, st, seed: 42 });
    if result.is_ok() {
        owned.db.commit_state(&mut owned.st);
    } else {
        owned.db.rollback_state(&mut owned.st);
    }
    (owned.db, result)
}

fn balance(db: &Db, id: i64) -> i64 {
    let t = db.table("accounts").unwrap();
    match &t.rows[&sluice_engine::Key::Int(id)].values[1] {
        sluice_engine::Value::Integer(b) => *b,
        other => panic!("{other:?}"),
    }
}

fn loaded() -> Functions {
    let mut f = Functions::new(FunctionLimits {
        time_max: Duration::from_millis(200),
        memory_bytes_max: 16 << 20,
    })
    .unwrap();
    f.load(APP).unwrap();
    f
}

#[test]
fn returning_commits_the_writes() {
    let mut f = loaded();
    let (db, r) = call(
        &mut f,
        accounts_db(),
        "transfer",
        json!({"from": 0, "to": 1, "amount": 30}),
    );
    assert_eq!(r.unwrap(), json!({"from": 70, "to": 130}));
    assert_eq!((balance(&db, 0), balance(&db, 1)), (70, 130));
    assert_eq!(db.seq, 3);
}

#[test]
fn throwing_rolls_back_every_write() {
    let mut f = loaded();
    let before = accounts_db();
    let seq = before.seq;
    let (db, r) = call(&mut f, before, "half_then_fail", json!({"from": 2}));
    assert_eq!(
        r.unwrap_err(),
        FunctionError::Thrown("changed my mind".into())
    );
    assert_eq!(balance(&db, 2), 100);
    assert_eq!(db.seq, seq);
    let (db, r) = call(
        &mut f,
        db,
        "transfer",
        json!({"from": 0, "to": 1, "amount": 1000}),
    );
    assert_eq!(
        r.unwrap_err(),
        FunctionError::Thrown("insufficient funds".into())
    );
    assert_eq!(db.seq, seq);
}

#[test]
fn a_failed_tx_op_reaches_the_caller_with_its_code() {
    let mut f = loaded();
    let src = r#"export function bad(tx) { tx.insert("accounts", { id: 0, balance: 1 }); }"#;
    f.load(src).unwrap();
    let (_, r) = call(&mut f, accounts_db(), "bad", json!(null));
    let FunctionError::Thrown(message) = r.unwrap_err() else {
        panic!()
    };
    assert!(message.starts_with("already_exists:"), "{message}");
}

#[test]
fn a_runaway_function_is_stopped_at_the_time_limit() {
    let mut f = loaded();
    let (db, r) = call(&mut f, accounts_db(), "spin", json!(null));
    let err = r.unwrap_err();
    assert_eq!(err, FunctionError::Timeout(200));
    assert!(err.to_string().contains("--function-time-ms"));
    // The runtime is still usable afterwards.
    let (_, r) = call(
        &mut f,
        db,
        "transfer",
        json!({"from": 0, "to": 1, "amount": 1}),
    );
    assert!(r.is_ok());
}

#[test]
fn a_memory_hog_is_stopped_at_the_memory_limit() {
    let mut f = loaded();
    let (db, r) = call(&mut f, accounts_db(), "hog", json!(null));
    let err = r.unwrap_err();
    assert_eq!(err, FunctionError::OutOfMemory(16 << 20), "{err}");
    assert!(err.to_string().contains("--function-memory-bytes"));
    let (_, r) = call(
        &mut f,
        db,
        "transfer",
        json!({"from": 0, "to": 1, "amount": 1}),
    );
    assert!(r.is_ok());
}

#[test]
fn a_module_with_a_syntax_error_is_refused_with_its_line_and_the_old_one_stays() {
    let mut f = loaded();
    let err = f
        .load("export function ok(tx) { return 1; }\n\nexport function broken(tx) {\n  return 1 +;\n}\n")
        .unwrap_err();
    let FunctionError::Compile { line, message } = err else {
        panic!()
    };
    assert_eq!(line, Some(4), "{message}");
    assert!(f.exports().contains(&"transfer".to_string()));
    let (_, r) = call(
        &mut f,
        accounts_db(),
        "transfer",
        json!({"from": 0, "to": 1, "amount": 1}),
    );
    assert!(r.is_ok());
}

#[test]
fn clock_and_randomness_come_only_from_tx() {
    let mut f = loaded();
    let (db, a) = call(&mut f, accounts_db(), "draws", json!(null));
    let (_, b) = call(&mut f, db, "draws", json!(null));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "same seed, same draws");
    assert_ne!(a[0], a[1]);
    assert_eq!(a[2], json!(1_700_000_000_000_000i64));
    for name in ["clock", "dice"] {
        let (_, r) = call(&mut f, accounts_db(), name, json!(null));
        assert!(matches!(r, Err(FunctionError::Thrown(_))), "{name}: {r:?}");
    }
}

#[test]
fn an_unknown_function_is_not_found() {
    let mut f = loaded();
    let (_, r) = call(&mut f, accounts_db(), "nope", json!(null));
    assert_eq!(r.unwrap_err(), FunctionError::NotFound("nope".into()));
}
