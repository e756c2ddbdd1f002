//! A function's value leaves JavaScript as JSON. An array's `length` can be set to 2^31 − 1
//! or 2^32 − 1 with no memory behind it: converting that once aborted the process
//! (a 64 GiB allocation) or panicked (a float length), both fatal on the writer thread.
//! Such a value is refused with a typed error naming the limit, and the module keeps
//! working; an array within the limit, sparse or not, converts as before.

mod support;

use serde_json::json;
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_functions::{FunctionError, FunctionLimits, Functions};
use support::Owned;

const APP: &str = r#"
export function sparse(tx, { length }) { const a = []; a.length = length; return a; }
export function in_a_row(tx, { length }) {
  const a = []; a.length = length;
  return tx.patch("t", 1, { j: { a } });
}
export function small(tx) { const a = [1, 2]; a[4] = 5; return a; }
"#;

fn call(
    functions: &mut Functions,
    name: &str,
    length: u64,
) -> Result<serde_json::Value, FunctionError> {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change = sluice_sql::parse_ddl("CREATE TABLE t (id INTEGER PRIMARY KEY, j JSON)")
        .unwrap()
        .remove(0)
        .change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    tx.insert("t", json!({"id": 1}).as_object().unwrap(), None)
        .unwrap();
    tx.commit().unwrap();
    let st = db.begin();
    functions
        .call(name, &json!({ "length": length }), None, Owned { db, st })
        .1
}

#[test]
fn arrays_longer_than_the_limit_are_refused_and_the_module_keeps_working() {
    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions.load(APP).unwrap();
    for length in [(1u64 << 22) + 1, (1 << 31) - 1, (1 << 32) - 1] {
        for name in ["sparse", "in_a_row"] {
            let err = call(&mut functions, name, length).expect_err("refused");
            let message = err.to_string();
            assert!(
                message.contains(&format!(
                    "an array of {length} items is longer than the 4194304"
                )),
                "{name}({length}): {message}"
            );
        }
    }
    assert_eq!(
        call(&mut functions, "small", 0).unwrap(),
        json!([1, 2, null, null, 5])
    );
    let at_limit = call(&mut functions, "sparse", 1 << 22).unwrap();
    assert_eq!(at_limit.as_array().map(Vec::len), Some(1 << 22));
}
