//! A module can make JavaScript run *inside* a `tx` call: a setter defined on
//! `Object.prototype` runs when `tx.get` fills the row object it returns, and a getter of a
//! JSON value's object runs likewise. If that code calls `tx` again, the call must fail as
//! a JavaScript error (the function fails, its writes roll back) — never a Rust panic,
//! which on the writer thread would stop the whole server.

mod support;

use serde_json::json;
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{FunctionLimits, Functions};
use support::Owned;

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change = sluice_sql::parse_ddl(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, meta JSON)",
    )
    .unwrap()
    .remove(0)
    .change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    for id in 1..=2 {
        let row = json!({"id": id, "balance": 10, "meta": {"note": "x"}});
        tx.insert("accounts", row.as_object().unwrap(), None)
            .unwrap();
    }
    tx.commit().unwrap();
    db
}

const APP: &str = r#"
export function setter_reenters(tx) {
  tx.patch("accounts", 2, { balance: 0 });
  Object.defineProperty(Object.prototype, "balance", {
    set(v) { tx.get("accounts", 2); },
    configurable: true,
  });
  try { return tx.get("accounts", 1); }
  finally { delete Object.prototype.balance; }
}
export function setter_reenters_caught(tx) {
  Object.defineProperty(Object.prototype, "note", {
    set(v) { tx.patch("accounts", 2, { balance: 5 }); },
    configurable: true,
  });
  try { tx.get("accounts", 1); return "no error"; }
  catch (e) { return String(e.message); }
  finally { delete Object.prototype.note; }
}
export function plain(tx) {
  return tx.get("accounts", 1);
}
"#;

#[test]
fn a_tx_call_from_a_setter_inside_tx_get_fails_the_function_instead_of_panicking() {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();

    let db = db();
    let st = db.begin();
    let (owned, got) = functions.call("setter_reenters", &json!(null), None, Owned { db, st });
    let err = got.expect_err("re-entering tx from a setter must fail the call");
    assert!(
        err.to_string().contains("tx"),
        "the error names the re-entered tx: {err}"
    );
    // Caught inside the module, the error is an ordinary exception …
    let st = owned.db.begin();
    let (owned, got) = functions.call(
        "setter_reenters_caught",
        &json!(null),
        None,
        Owned { db: owned.db, st },
    );
    let message = got.unwrap();
    assert_ne!(message, json!("no error"), "the inner tx call must throw");
    // … and the module keeps working afterwards.
    let st = owned.db.begin();
    let (_, got) = functions.call("plain", &json!(null), None, Owned { db: owned.db, st });
    assert_eq!(got.unwrap()["balance"], json!(10));
}
