//! What server functions write from `tx.random()` and `tx.now()` comes back exactly after a
//! crash (replayed from the log) and after a graceful restart (from the final snapshot);
//! the non-deterministic globals (`Math.random`, `Date.now`, `new Date()`) fail the call
//! with `function_error` and write nothing.
//!
//! A concurrent workload of calls inserts, patches, upserts and deletes rows whose values
//! come from `tx.random()` and `tx.now()` (REAL, INTEGER, TIMESTAMP, TEXT and JSON columns).
//! The test records every table's full contents (rows and versions) through the scan API and
//! the seq; `kill -9` (with a snapshot threshold so large that no snapshot is ever taken, so
//! the restart replays the whole log) and restart: the same contents and seq. Then SIGTERM
//! (final snapshot) and restart: the same again, with nothing replayed.

mod common;

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};

const TASKS: usize = 8;
const CALLS_PER_TASK: usize = 150;
const IDS: u64 = 120;

const CREATE: &str = "CREATE TABLE draws (id INTEGER PRIMARY KEY, a REAL NOT NULL, \
     b INTEGER NOT NULL, at TIMESTAMP NOT NULL, note TEXT, extra JSON)";

const MODULE: &str = r#"
function draw(tx) { return Math.floor(tx.random() * 1e9); }

export function roll(tx, { id }) {
  const a = tx.random();
  const row = { id, a, b: draw(tx), at: tx.now(), note: "n" + draw(tx),
                extra: { r: [tx.random(), tx.random()], k: draw(tx) % 7 } };
  tx.upsert("draws", row);
  return { a: row.a, b: row.b, at: row.at };
}

export function reroll(tx, { id }) {
  const r = tx.get("draws", id);
  if (r === null) throw new Error(`no_row: ${id}`);
  if (tx.random() < 0.25) { tx.delete("draws", id); return "deleted"; }
  tx.patch("draws", id, { a: tx.random(), b: r.b + draw(tx) % 1000, at: tx.now() });
  return "patched";
}

// Touches a random number of random rows: what it writes, and where, comes from tx.random().
export function scatter(tx, { ids }) {
  const n = 1 + Math.floor(tx.random() * 4);
  for (let i = 0; i < n; i++) {
    const id = Math.floor(tx.random() * ids);
    tx.upsert("draws", { id, a: tx.random(), b: draw(tx), at: tx.now() + i, note: null });
  }
  return n;
}

export function dice(tx, { id }) {
  tx.insert("draws", { id, a: 0.5, b: 0, at: 0 });
  return Math.random();
}
export function clock(tx, { id }) {
  tx.insert("draws", { id, a: 0.5, b: 0, at: 0 });
  return Date.now();
}
export function new_date(tx, { id }) {
  tx.insert("draws", { id, a: 0.5, b: 0, at: 0 });
  return new Date().getTime();
}
"#;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Runs random calls; checks each reply's shape and what it says about `tx.random()` and
/// `tx.now()`. Returns the `a` values `roll` drew.
async fn workload(api: Api, seed: u64) -> Result<Vec<f64>, String> {
    let mut rng = Rng::new(seed);
    let mut drawn = Vec::new();
    for _ in 0..CALLS_PER_TASK {
        let id = rng.below(IDS);
        let roll = rng.below(100);
        let (name, args) = if roll < 50 {
            ("roll", json!({"id": id}))
        } else if roll < 80 {
            ("reroll", json!({"id": id}))
        } else {
            ("scatter", json!({"ids": IDS}))
        };
        let before = now_us();
        let (status, body) = api.call(name, &args).await;
        let after = now_us();
        if status != 200 {
            if name == "reroll" && body["error"]["code"] == "function_error" {
                let message = body["error"]["message"].as_str().unwrap_or("");
                if message.starts_with("no_row") {
                    continue;
                }
            }
            return Err(format!("{name}({args}) answered {status}: {body}"));
        }
        if name == "roll" {
            let r = &body["result"];
            let a = r["a"].as_f64().ok_or(format!("roll answered {body}"))?;
            let at = r["at"].as_i64().ok_or(format!("roll answered {body}"))?;
            if !(0.0..1.0).contains(&a) {
                return Err(format!("tx.random() gave {a}"));
            }
            // The server's clock, fixed per transaction: within the call (with slack).
            if at < before - 1_000_000 || at > after + 1_000_000 {
                return Err(format!(
                    "tx.now() gave {at}, outside the call ({before}..{after})"
                ));
            }
            drawn.push(a);
        }
    }
    Ok(drawn)
}

/// Every row of every table (with its version), the table list, and the seq.
async fn state(api: &Api) -> (Value, Vec<Value>, u64) {
    let seq = api.health_seq().await;
    let tables = api.get_ok("/v1/tables").await["tables"].clone();
    let rows = api.scan_all("draws", 37).await;
    (tables, rows, seq)
}

fn assert_same_state(
    got: &(Value, Vec<Value>, u64),
    want: &(Value, Vec<Value>, u64),
    context: &str,
) {
    assert_eq!(got.2, want.2, "{context}: the seq differs");
    assert_eq!(got.0, want.0, "{context}: the tables differ");
    assert_eq!(
        got.1.len(),
        want.1.len(),
        "{context}: the number of rows differs"
    );
    for (g, w) in got.1.iter().zip(&want.1) {
        assert_eq!(g, w, "{context}: a row differs");
    }
}

/// A call that uses a non-deterministic global fails with `function_error`, and the row it
/// inserted first is not kept.
async fn assert_refused(api: &Api, name: &str, id: u64, hint: &str) {
    let seq = api.health_seq().await;
    let (status, body) = api.call(name, &json!({"id": id})).await;
    assert_eq!(status, 400, "{name}: {body}");
    assert_eq!(body["error"]["code"], "function_error", "{name}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(hint),
        "{name}: the message should point to {hint}: {body}"
    );
    let (status, body) = api.get(&format!("/v1/tables/draws/rows/{id}")).await;
    assert_eq!(status, 404, "{name} kept its insert: {body}");
    assert_eq!(api.health_seq().await, seq, "{name} moved the seq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_effects_replay_to_the_same_state() {
    let seed = seed("function_effects_replay_to_the_same_state");
    let context = format!("seed {seed}");
    let mut rng = Rng::new(seed);
    let root = TempDir::new("replay");
    let data = root.join("data");
    let module = root.join("app.js");
    std::fs::write(&module, MODULE).unwrap();
    let args = [
        "--functions",
        module.to_str().unwrap(),
        // Never snapshot on the way: the crash restart replays the whole log.
        "--snapshot-log-bytes",
        "1099511627776",
    ];
    let server = Server::start(&data, root.path(), &args);
    let api = server.api();
    api.sql(CREATE).await;

    // Non-deterministic globals are refused and write nothing (ids above the workload's).
    assert_refused(&api, "dice", 1_000, "tx.random()").await;
    assert_refused(&api, "clock", 1_001, "tx.now()").await;
    assert_refused(&api, "new_date", 1_002, "tx.now()").await;

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| tokio::spawn(workload(api.clone(), rng.next_u64())))
        .collect();
    let mut drawn = Vec::new();
    for t in tasks {
        drawn.extend(
            t.await
                .expect("workload task")
                .unwrap_or_else(|e| panic!("{context}: {e}")),
        );
    }
    // Each transaction draws from its own seed: no two calls drew the same first number.
    let distinct: BTreeSet<u64> = drawn.iter().map(|a| a.to_bits()).collect();
    assert_eq!(
        distinct.len(),
        drawn.len(),
        "{context}: two calls drew the same tx.random()"
    );
    assert!(drawn.len() > 10, "{context}: too few rolls");

    let before = state(&api).await;
    assert!(
        before.1.len() > 20,
        "{context}: the workload left too few rows"
    );
    eprintln!(
        "{} rows at seq {}, e.g. {}",
        before.1.len(),
        before.2,
        before.1[0]
    );
    server.kill9();

    let server = Server::start(&data, root.path(), &args);
    let api = server.api();
    let replayed = api.metric("sluice_recovery_replayed").await;
    assert_eq!(
        replayed, before.2 as f64,
        "{context}: the restart should have replayed every commit from the log"
    );
    assert_same_state(
        &state(&api).await,
        &before,
        &format!("{context}, after kill -9"),
    );

    let (status, stderr) = server.terminate();
    assert!(
        status.success(),
        "{context}: exit after SIGTERM: {status}\n{stderr}"
    );
    let server = Server::start(&data, root.path(), &args);
    let api = server.api();
    assert_eq!(
        api.metric("sluice_recovery_replayed").await,
        0.0,
        "{context}: after SIGTERM the restart should load the final snapshot"
    );
    assert_same_state(
        &state(&api).await,
        &before,
        &format!("{context}, after SIGTERM"),
    );

    // And the functions still run (and still refuse the clock) after both restarts.
    let (status, body) = api.call("roll", &json!({"id": 7})).await;
    assert_eq!(status, 200, "{context}: {body}");
    assert_refused(&api, "clock", 1_003, "tx.now()").await;
}
