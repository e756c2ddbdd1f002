//! Fuzz targets for function module source and call arguments: `Functions::load` must answer
//! any text with exports or `Compile`, and a call must return a result or a typed error with
//! any JSON arguments and any caller (the admin, or a client through `allow`) — never panic,
//! never leave the transaction half-open. Each call's effects are committed or rolled back as
//! the server does, and the database must take a write afterwards. `SLUICE_FUZZ_EXECS` /
//! `SLUICE_FUZZ_SEED` run a long mode; `--nocapture` shows executions and panics per target.

use std::time::Duration;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention, TxRef, TxState};
use sluice_functions::{FunctionError, FunctionLimits, Functions, TxAccess};
use sluice_fuzzkit::{corpus, Fuzzer, Kind};

struct Owned {
    db: Db,
    st: TxState,
}

impl TxAccess for Owned {
    fn tx(&mut self) -> TxRef<'_> {
        self.db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        1_700_000_000_000_000
    }
    fn seed(&self) -> u64 {
        7
    }
}

fn seeded_db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let changes = sluice_sql::parse_ddl(corpus::SCHEMA)
        .expect("the seed schema parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, "schema".into()).unwrap();
    let mut tx = db.transaction();
    for id in 0..4 {
        let row = json!({"id": id, "balance": 100});
        tx.insert("accounts", row.as_object().unwrap(), None)
            .unwrap();
    }
    tx.commit();
    db
}

/// Short limits: a mutated module loops or allocates often, and each run must stay quick.
fn functions() -> Functions {
    Functions::new(FunctionLimits {
        time_max: Duration::from_millis(20),
        memory_bytes_max: 16 << 20,
    })
    .expect("a runtime")
}

/// Calls `name` with `args` as the writer does: commit on `Ok`, roll back on `Err`.
fn call(
    functions: &mut Functions,
    db: Db,
    name: &str,
    args: &Json,
    auth: Option<&Json>,
) -> (Db, String) {
    let st = db.begin();
    let (mut owned, result) = functions.call(name, args, auth, Owned { db, st });
    let outcome = match &result {
        Ok(_) => {
            owned.db.commit_state(&mut owned.st);
            "ok".to_string()
        }
        Err(e) => {
            owned.db.rollback_state(&mut owned.st);
            error_kind(e)
        }
    };
    (owned.db, outcome)
}

fn error_kind(e: &FunctionError) -> String {
    match e {
        FunctionError::Compile { line, .. } => format!("compile {}", line.is_some()),
        FunctionError::NotFound(_) => "not_found".into(),
        FunctionError::Forbidden(_) => "forbidden".into(),
        FunctionError::Thrown(m) => format!("thrown {}", m.split(':').next().unwrap_or("")),
        FunctionError::Timeout(_) => "timeout".into(),
        FunctionError::OutOfMemory(_) => "memory".into(),
        FunctionError::Value(m) => format!("value {}", m.split(':').next().unwrap_or("")),
    }
}

/// The database still takes a write after whatever the call did.
fn assert_takes_a_write(db: &mut Db) {
    let mut tx = db.transaction();
    let row = json!({"id": 1_000_000, "balance": 1});
    tx.upsert("accounts", row.as_object().unwrap(), None)
        .expect("a write after a call");
    drop(tx); // rolled back: the state stays as the call left it
}

const ARGS: &[&str] = &[
    "null",
    r#"{"from": 1, "to": 2, "amount": 5}"#,
    r#"{"id": 9, "balance": 1}"#,
    r#"3"#,
    r#"{"n": 10, "rows": 2}"#,
];

#[test]
fn fuzz_function_module_source() {
    let mut functions = functions();
    let mut db = Some(seeded_db());
    Fuzzer::new("functions_module", 5_000, Kind::Text)
        .seeds(corpus::MODULES.iter().copied())
        .dictionary(corpus::JS_WORDS)
        .len_max(1 << 14)
        .run(|input| {
            let source = String::from_utf8_lossy(input);
            let exports = match functions.load(&source) {
                Ok(exports) => exports.to_vec(),
                Err(e) => return error_kind(&e),
            };
            let mut outcome = format!("loaded {}", exports.len().min(3));
            for (i, name) in exports.iter().take(3).enumerate() {
                let args: Json = serde_json::from_str(ARGS[i % ARGS.len()]).unwrap();
                let (after, o) = call(&mut functions, db.take().unwrap(), name, &args, None);
                db = Some(after);
                outcome.push(' ');
                outcome.push_str(&o);
            }
            assert_takes_a_write(db.as_mut().unwrap());
            outcome
        });
}

#[test]
fn fuzz_function_call_args() {
    let mut functions = functions();
    // Client calls (a request with an `"auth"`) go through this `allow`, which reads the
    // caller and the arguments whatever their shape.
    let allow = r#"
export function allow(auth, name, args) {
  return auth.claims.role === "teller" || (name === "now" && args !== null && auth.sub.length > 0);
}
"#;
    let module = [
        corpus::MODULES[0],
        corpus::MODULES[1],
        corpus::MODULES[2],
        allow,
    ]
    .concat();
    let exports = functions
        .load(&module)
        .expect("the seed modules load")
        .to_vec();
    let mut db = Some(seeded_db());
    let auths = [
        json!({"sub": "alice", "claims": {"sub": "alice", "role": "teller", "exp": 1}}),
        json!({"sub": "bob", "claims": {"sub": "bob", "exp": 1, "teams": [1, {"x": null}]}}),
    ];
    let seeds = ARGS.iter().enumerate().map(|(i, a)| {
        let args: Json = serde_json::from_str(a).unwrap();
        match i % 3 {
            0 => json!({"name": exports[0], "args": args}),
            n => json!({"name": exports[i % exports.len()], "args": args, "auth": auths[n - 1]}),
        }
        .to_string()
    });
    let mut words: Vec<&str> = exports.iter().map(String::as_str).collect();
    words.extend(["allow", "auth", "claims", "sub", "role", "teller"]);
    Fuzzer::new("functions_args", 10_000, Kind::Json)
        .seeds(seeds)
        .dictionary(&words)
        .run(|input| {
            let Ok(request) = serde_json::from_slice::<Json>(input) else {
                return "not json".into();
            };
            let name = request["name"].as_str().unwrap_or("transfer");
            let auth = request.get("auth");
            let (after, outcome) = call(
                &mut functions,
                db.take().unwrap(),
                name,
                &request["args"],
                auth,
            );
            db = Some(after);
            assert_takes_a_write(db.as_mut().unwrap());
            outcome
        });
}
