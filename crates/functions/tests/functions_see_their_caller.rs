//! Functions see their caller as `tx.auth`, and the module's `allow` export decides which
//! client may call which function: admin vs client, `allow` true / false / throwing /
//! missing, `allow` not callable, a caller that no call can change for a later one, and a
//! refused call that touches nothing.
//!
//! `SLUICE_AUTH_SEED=<n>` reruns the seeded round-trip test with one seed;
//! `SLUICE_AUTH_CASES=<n>` runs more cases.

use std::time::Duration;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Key, Limits, Retention, TxRef, TxState, Value};
use sluice_functions::{FunctionError, FunctionLimits, Functions, TxAccess};

/// The transaction lent to a call, counting how often the function reached for it.
struct Owned {
    db: Db,
    st: TxState,
    touched: usize,
}

impl TxAccess for Owned {
    fn tx(&mut self) -> TxRef<'_> {
        self.touched += 1;
        self.db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        1_700_000_000_000_000
    }
    fn seed(&self) -> u64 {
        42
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

/// What a call did: its result, whether it reached for the transaction, and the database
/// after **committing** whatever the transaction staged — so a refused call that staged
/// anything would show here.
struct Outcome {
    db: Db,
    result: Result<Json, FunctionError>,
    touched: usize,
}

fn call(f: &mut Functions, db: Db, name: &str, args: Json, auth: Option<&Json>) -> Outcome {
    let st = db.begin();
    let lent = Owned { db, st, touched: 0 };
    let (mut owned, result) = f.call(name, &args, auth, lent);
    owned.db.commit_state(&mut owned.st);
    Outcome {
        db: owned.db,
        result,
        touched: owned.touched,
    }
}

fn balances(db: &Db) -> Vec<i64> {
    let t = db.table("accounts").unwrap();
    (0..4)
        .map(|id| match &t.rows[&Key::Int(id)].values[1] {
            Value::Integer(b) => *b,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn functions(source: &str) -> Functions {
    let mut f = Functions::new(FunctionLimits {
        time_max: Duration::from_millis(200),
        memory_bytes_max: 16 << 20,
    })
    .unwrap();
    f.load(source).unwrap();
    f
}

fn alice() -> Json {
    json!({"sub": "alice", "claims": {"sub": "alice", "exp": 1_790_000_000, "role": "teller", "teams": [7, 9]}})
}

fn bob() -> Json {
    json!({"sub": "bob", "claims": {"sub": "bob", "exp": 1_790_000_000, "role": "customer"}})
}

fn forbidden(result: Result<Json, FunctionError>) -> String {
    match result {
        Err(FunctionError::Forbidden(message)) => message,
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

const BANK: &str = r#"
export function allow(auth, name, args) {
  if (name === "whoami") return true;
  if (name === "transfer") return auth.claims.role === "teller" && args.amount <= 50;
  if (name === "refuse_with") return args.verdict;
  if (name === "throws") throw new Error("no " + auth.sub + " here");
  return false;
}
export function whoami(tx) { return tx.auth; }
export function transfer(tx, { from, to, amount }) {
  const a = tx.get("accounts", from);
  const b = tx.get("accounts", to);
  tx.patch("accounts", from, { balance: a.balance - amount });
  tx.patch("accounts", to, { balance: b.balance + amount });
  return tx.auth === null ? "admin" : tx.auth.sub;
}
export function refuse_with(tx) { tx.patch("accounts", 0, { balance: 0 }); return "ran"; }
export function throws(tx) { tx.patch("accounts", 0, { balance: 0 }); return "ran"; }
export function secret(tx) { tx.patch("accounts", 0, { balance: 0 }); return "ran"; }
"#;

#[test]
fn tx_auth_is_null_for_the_admin_and_the_callers_object_for_a_client() {
    let mut f = functions(BANK);
    let out = call(&mut f, accounts_db(), "whoami", json!(null), None);
    assert_eq!(out.result.unwrap(), Json::Null);
    let out = call(&mut f, out.db, "whoami", json!(null), Some(&alice()));
    assert_eq!(out.result.unwrap(), alice());
    let out = call(&mut f, out.db, "whoami", json!(null), Some(&bob()));
    assert_eq!(out.result.unwrap(), bob());
    let out = call(&mut f, out.db, "whoami", json!(null), None);
    assert_eq!(out.result.unwrap(), Json::Null, "the admin after a client");
}

#[test]
fn allow_returning_true_lets_the_client_call_run_and_commit() {
    let mut f = functions(BANK);
    let args = json!({"from": 0, "to": 1, "amount": 30});
    let out = call(&mut f, accounts_db(), "transfer", args, Some(&alice()));
    assert_eq!(out.result.unwrap(), json!("alice"));
    assert_eq!(balances(&out.db), [70, 130, 100, 100]);
}

#[test]
fn allow_sees_the_caller_the_name_and_the_arguments() {
    let mut f = functions(BANK);
    let db = accounts_db();
    let seq = db.seq;
    // A customer may not transfer; a teller may not transfer more than 50.
    let out = call(
        &mut f,
        db,
        "transfer",
        json!({"from": 0, "to": 1, "amount": 30}),
        Some(&bob()),
    );
    assert!(forbidden(out.result).contains("\"transfer\""));
    let out = call(
        &mut f,
        out.db,
        "transfer",
        json!({"from": 0, "to": 1, "amount": 51}),
        Some(&alice()),
    );
    assert!(forbidden(out.result).contains("\"transfer\""));
    assert_eq!((out.db.seq, balances(&out.db)), (seq, vec![100; 4]));
}

#[test]
fn allow_returning_anything_but_true_is_forbidden_naming_the_function() {
    let mut f = functions(BANK);
    let mut db = accounts_db();
    let seq = db.seq;
    let verdicts = [
        json!(false),
        json!(null),
        json!(1),
        json!("true"),
        json!([true]),
        json!({"ok": true}),
    ];
    for verdict in verdicts {
        let args = json!({ "verdict": verdict });
        let out = call(&mut f, db, "refuse_with", args, Some(&alice()));
        let message = forbidden(out.result);
        assert!(message.contains("\"refuse_with\""), "{verdict}: {message}");
        assert!(
            message.contains("did not return true"),
            "{verdict}: {message}"
        );
        assert_eq!(out.touched, 0, "{verdict}: the function ran");
        db = out.db;
    }
    // Missing `verdict`: `allow` returns undefined.
    let out = call(&mut f, db, "refuse_with", json!({}), Some(&alice()));
    forbidden(out.result);
    assert_eq!((out.db.seq, balances(&out.db)), (seq, vec![100; 4]));
    // `true` itself runs it.
    let args = json!({ "verdict": true });
    let out = call(&mut f, out.db, "refuse_with", args, Some(&alice()));
    assert_eq!(out.result.unwrap(), json!("ran"));
}

#[test]
fn allow_that_throws_is_forbidden_with_the_thrown_message() {
    let mut f = functions(BANK);
    let out = call(&mut f, accounts_db(), "throws", json!(null), Some(&bob()));
    let message = forbidden(out.result);
    assert!(message.contains("\"throws\""), "{message}");
    assert!(message.contains("no bob here"), "{message}");
    assert_eq!(out.touched, 0);
    assert_eq!(balances(&out.db), [100; 4]);
}

#[test]
fn a_module_without_allow_lets_clients_call_nothing_and_the_admin_everything() {
    let mut f = functions(
        r#"export function whoami(tx) { return tx.auth; }
           export const allow = true; // not a function: no rule"#,
    );
    assert!(!f.has_allow());
    assert_eq!(f.exports(), ["whoami"]);
    let out = call(&mut f, accounts_db(), "whoami", json!(null), Some(&alice()));
    let message = forbidden(out.result);
    assert!(message.contains("\"whoami\""), "{message}");
    assert!(message.contains("exports no allow"), "{message}");
    let out = call(&mut f, out.db, "whoami", json!(null), None);
    assert_eq!(out.result.unwrap(), Json::Null);
    // No module loaded at all: the admin gets NotFound, a client Forbidden.
    let mut empty = Functions::new(FunctionLimits::default()).unwrap();
    let out = call(&mut empty, out.db, "whoami", json!(null), Some(&alice()));
    forbidden(out.result);
    let out = call(&mut empty, out.db, "whoami", json!(null), None);
    assert_eq!(
        out.result.unwrap_err(),
        FunctionError::NotFound("whoami".into())
    );
}

#[test]
fn the_admin_skips_allow() {
    let mut f = functions(BANK);
    let args = json!({"from": 0, "to": 1, "amount": 99});
    let out = call(&mut f, accounts_db(), "transfer", args, None);
    assert_eq!(out.result.unwrap(), json!("admin"));
    let out = call(&mut f, out.db, "throws", json!(null), None);
    assert_eq!(out.result.unwrap(), json!("ran"));
}

#[test]
fn allow_is_not_callable_by_the_admin_or_a_client() {
    let mut f = functions(BANK);
    assert!(f.has_allow());
    assert!(
        !f.exports().iter().any(|e| e == "allow"),
        "{:?}",
        f.exports()
    );
    assert_eq!(
        f.exports(),
        ["refuse_with", "secret", "throws", "transfer", "whoami"]
    );
    let out = call(&mut f, accounts_db(), "allow", json!(null), None);
    assert_eq!(
        out.result.unwrap_err(),
        FunctionError::NotFound("allow".into())
    );
    let out = call(&mut f, out.db, "allow", json!(null), Some(&alice()));
    forbidden(out.result);
}

#[test]
fn a_client_cannot_tell_an_unknown_function_from_a_refused_one() {
    let mut f = functions(BANK);
    let out = call(&mut f, accounts_db(), "secret", json!(null), Some(&alice()));
    let refused = forbidden(out.result);
    let out = call(&mut f, out.db, "no_such", json!(null), Some(&alice()));
    let unknown = forbidden(out.result);
    assert_eq!(
        refused.replace("\"secret\"", "NAME"),
        unknown.replace("\"no_such\"", "NAME")
    );
    let out = call(&mut f, out.db, "no_such", json!(null), None);
    assert_eq!(
        out.result.unwrap_err(),
        FunctionError::NotFound("no_such".into())
    );
    assert_eq!(balances(&out.db), [100; 4]);
}

#[test]
fn a_function_cannot_change_what_a_later_call_sees_as_tx_auth() {
    let mut f = functions(
        r#"
export function allow(auth, name, args) {
  // `allow` cannot change what the function sees either.
  try { auth.sub = "mallory"; } catch (e) {}
  try { auth.claims.role = "admin"; } catch (e) {}
  try { args.amount = 1000000; } catch (e) {}
  return true;
}
export function tamper(tx) {
  const tries = [
    () => { tx.auth.sub = "mallory"; },
    () => { tx.auth.claims.role = "admin"; },
    () => { tx.auth.claims.teams.push(1); },
    () => { tx.auth = { sub: "mallory" }; },
    () => { delete tx.auth; },
    () => { Object.defineProperty(tx, "auth", { value: { sub: "mallory" } }); },
    () => { tx.get = () => ({ id: 0, balance: 1e9 }); },
  ];
  let refused = 0;
  for (const t of tries) { try { t(); } catch (e) { refused++; } }
  globalThis.stashedTx = tx;
  globalThis.stashedAuth = tx.auth;
  return { refused, auth: tx.auth };
}
export function look(tx, args) {
  return {
    auth: tx.auth,
    stashed: globalThis.stashedTx.auth,
    args,
    balance: tx.get("accounts", 0).balance,
  };
}
"#,
    );
    let out = call(&mut f, accounts_db(), "tamper", json!(null), Some(&alice()));
    let seen = out.result.unwrap();
    assert_eq!(seen["refused"], json!(7), "{seen}");
    assert_eq!(seen["auth"], alice(), "allow changed the caller");
    for (auth, expected) in [(Some(bob()), bob()), (None, Json::Null)] {
        let args = json!({"amount": 5});
        let out = call(&mut f, accounts_db(), "look", args, auth.as_ref());
        let seen = out.result.unwrap();
        assert_eq!(seen["auth"], expected, "{seen}");
        assert_eq!(
            seen["stashed"], expected,
            "a stashed tx reads the current caller"
        );
        assert_eq!(
            seen["args"],
            json!({"amount": 5}),
            "allow changed the arguments"
        );
        assert_eq!(seen["balance"], json!(100));
    }
}

#[test]
fn a_forbidden_call_leaves_the_db_unchanged_even_if_allow_reaches_for_a_stashed_tx() {
    let mut f = functions(
        r#"
export function allow(auth, name) {
  if (name === "stash") return true;
  if (name === "write_in_allow") {
    globalThis.stashed.insert("accounts", { id: 99, balance: 1 });
    return true;
  }
  try { globalThis.stashed.patch("accounts", 0, { balance: 0 }); } catch (e) {}
  return false;
}
export function stash(tx) { globalThis.stashed = tx; return null; }
export function drain(tx) { tx.patch("accounts", 0, { balance: 0 }); return null; }
export function write_in_allow(tx) { return null; }
"#,
    );
    let db = accounts_db();
    let seq = db.seq;
    let out = call(&mut f, db, "stash", json!(null), Some(&alice()));
    out.result.unwrap();
    let out = call(&mut f, out.db, "drain", json!(null), Some(&alice()));
    forbidden(out.result);
    assert_eq!(out.touched, 0);
    assert_eq!((out.db.seq, balances(&out.db)), (seq, vec![100; 4]));
    // Outside a function call `tx` is unusable: `allow`'s write throws, so it is refused.
    let out = call(
        &mut f,
        out.db,
        "write_in_allow",
        json!(null),
        Some(&alice()),
    );
    let message = forbidden(out.result);
    assert!(message.contains("allow threw"), "{message}");
    assert!(
        message.contains("only usable during a function call"),
        "{message}"
    );
    assert_eq!(out.touched, 0);
    assert_eq!(out.db.seq, seq);
    assert!(out.db.table("accounts").unwrap().rows.len() == 4);
}

#[test]
fn allow_runs_within_the_time_limit_of_the_call() {
    let mut f = functions(
        r#"
export function allow(auth, name) { if (name === "slow") for (;;) {} return true; }
export function slow(tx) { tx.patch("accounts", 0, { balance: 0 }); return null; }
export function fast(tx) { return tx.auth.sub; }
"#,
    );
    let out = call(&mut f, accounts_db(), "slow", json!(null), Some(&alice()));
    let err = out.result.unwrap_err();
    assert_eq!(err, FunctionError::Timeout(200));
    assert!(err.to_string().contains("--function-time-ms"));
    assert_eq!(out.touched, 0);
    assert_eq!(balances(&out.db), [100; 4]);
    let out = call(&mut f, out.db, "fast", json!(null), Some(&bob()));
    assert_eq!(
        out.result.unwrap(),
        json!("bob"),
        "usable after the timeout"
    );
}

#[test]
fn reloading_replaces_the_rule() {
    let mut f = functions(BANK);
    let out = call(&mut f, accounts_db(), "whoami", json!(null), Some(&alice()));
    out.result.unwrap();
    f.load("export function whoami(tx) { return tx.auth; }")
        .unwrap();
    assert!(!f.has_allow());
    let out = call(&mut f, out.db, "whoami", json!(null), Some(&alice()));
    forbidden(out.result);
    f.load("export function whoami(tx) { return tx.auth.sub; }\nexport const allow = () => true;")
        .unwrap();
    let out = call(&mut f, out.db, "whoami", json!(null), Some(&bob()));
    assert_eq!(out.result.unwrap(), json!("bob"));
}

/// A small deterministic generator (xorshift64*), so a failing case reruns from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_json(rng: &mut Rng, depth: usize) -> Json {
    let leaf = depth >= 3;
    match rng.below(if leaf { 5 } else { 7 }) {
        0 => Json::Null,
        1 => Json::Bool(rng.below(2) == 0),
        2 => json!(rng.below(1 << 40) as i64 - (1 << 39)),
        3 => json!(rng.below(1000) as f64 + 0.5),
        4 => {
            let words = ["", "alice", "ü", "a\"b", "{auth.sub}", "null", "0"];
            json!(words[rng.below(words.len() as u64) as usize])
        }
        5 => Json::Array(
            (0..rng.below(4))
                .map(|_| random_json(rng, depth + 1))
                .collect(),
        ),
        _ => Json::Object(
            (0..rng.below(4))
                .map(|i| (format!("k{i}"), random_json(rng, depth + 1)))
                .collect(),
        ),
    }
}

#[test]
fn any_caller_reaches_the_function_exactly_and_frozen_at_every_depth() {
    let cases: u64 = std::env::var("SLUICE_AUTH_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seeds: Vec<u64> = match std::env::var("SLUICE_AUTH_SEED") {
        Ok(seed) => vec![seed.parse().expect("SLUICE_AUTH_SEED is a number")],
        Err(_) => (1..=cases).collect(),
    };
    let mut f = functions(
        r#"
function frozen(v) {
  if (v === null || typeof v !== "object") return true;
  return Object.isFrozen(v) && Object.values(v).every(frozen);
}
export function allow(auth) { return frozen(auth); }
export function echo(tx) { return { auth: tx.auth, frozen: frozen(tx.auth) }; }
"#,
    );
    let mut db = accounts_db();
    for seed in seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut claims = serde_json::Map::new();
        claims.insert("sub".into(), json!(format!("user{seed}")));
        for i in 0..rng.below(5) {
            claims.insert(format!("c{i}"), random_json(&mut rng, 0));
        }
        let auth = json!({"sub": format!("user{seed}"), "claims": claims});
        let out = call(&mut f, db, "echo", json!(null), Some(&auth));
        let got = out
            .result
            .unwrap_or_else(|e| panic!("seed {seed}: {e} for {auth}"));
        assert_eq!(got, json!({"auth": auth, "frozen": true}), "seed {seed}");
        db = out.db;
    }
}

#[test]
fn a_failed_client_call_leaves_no_caller_behind_for_the_admin() {
    let mut f = functions(
        r#"
export function allow() { return true; }
export function boom(tx) { throw new Error("boom " + tx.auth.sub); }
export function spin(tx) { for (;;) {} }
export function whoami(tx) { return tx.auth; }
"#,
    );
    let out = call(&mut f, accounts_db(), "boom", json!(null), Some(&alice()));
    assert_eq!(
        out.result.unwrap_err(),
        FunctionError::Thrown("boom alice".into())
    );
    let out = call(&mut f, out.db, "whoami", json!(null), None);
    assert_eq!(out.result.unwrap(), Json::Null);
    let out = call(&mut f, out.db, "spin", json!(null), Some(&alice()));
    assert_eq!(out.result.unwrap_err(), FunctionError::Timeout(200));
    let out = call(&mut f, out.db, "whoami", json!(null), None);
    assert_eq!(out.result.unwrap(), Json::Null);
}
