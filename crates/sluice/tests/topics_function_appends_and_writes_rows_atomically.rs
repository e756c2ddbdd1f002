//! A server function that inserts a row and appends a record (`tx.append`) commits both or
//! neither — a transactional outbox — also across `kill -9` of the real binary.
//!
//! First, calls that throw after both writes leave neither (no row, no offset consumed),
//! interleaved with calls that succeed (their offsets stay dense). Then several tasks call
//! the function with `fsync` durability while the process is killed with SIGKILL at a random
//! moment, and restarted on the same data directory, for several cycles. After each restart:
//! every acknowledged call's row and record are there (the record at the offset the call
//! returned), no thrown call left anything, and rows and records match one to one — a call in
//! flight at the kill is either wholly there or wholly absent. An SSE watcher follows the
//! topic across the kills (resuming with `Last-Event-ID`): every record it was sent had
//! reached `fsync`, so each must be there, unchanged, after the restart.
//!
//! `SLUICE_CRASH_CYCLES` sets the number of kill cycles (default 4); `SLUICE_TEST_SEED`
//! repeats a run's workload and kill moments.

mod common;

use common::topics::assert_no_panic;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::topics::Rec;
use common::{seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};

const MODULE: &str = r#"
export function note(tx, { id, writer, fail }) {
  tx.insert("notes", { id, writer });
  const offset = tx.append("events", { tags: [`w:${writer}`, "note"], data: { id, writer } });
  if (fail) throw new Error("after_both: failing on purpose after the insert and the append");
  return offset;
}
export function append_to_unknown(tx, { id }) {
  tx.insert("notes", { id, writer: 7 });
  return tx.append("nope", { data: { id } });
}
export function append_too_big(tx, { id }) {
  tx.insert("notes", { id, writer: 7 });
  return tx.append("events", { tags: ["note"], data: "x".repeat(2000000) });
}
export function append_bad_tag(tx, { id }) {
  tx.insert("notes", { id, writer: 7 });
  return tx.append("events", { tags: ["room:*"], data: 1 });
}
"#;

const WRITERS: u64 = 4;
const CALLS_PER_WRITER_MAX: u64 = 100_000;

/// What a writer task knows after a cycle.
#[derive(Default, Debug)]
struct Outcome {
    /// Acknowledged calls: id → the offset they returned.
    acked: BTreeMap<String, u64>,
    /// Calls refused because the function threw.
    thrown: BTreeSet<String>,
    /// Calls with no answer (in flight at the kill): either wholly there or absent.
    unknown: BTreeSet<String>,
}

async fn call(api: &Api, args: Value) -> Result<(u16, Value), common::NoResponse> {
    api.try_post(
        "/v1/call/note",
        &json!({"args": args, "durability": "fsync"}),
    )
    .await
}

async fn writer(api: Api, w: u64, cycle: u64, seed: u64, stop: Arc<AtomicBool>) -> Outcome {
    let mut rng = Rng::new(seed);
    let mut out = Outcome::default();
    for n in 0..CALLS_PER_WRITER_MAX {
        if stop.load(Ordering::SeqCst) && n > 0 {
            break;
        }
        let id = format!("c{cycle}-w{w}-{n}");
        let fail = rng.chance(15);
        match call(&api, json!({"id": id, "writer": w, "fail": fail})).await {
            Ok((200, body)) => {
                assert!(!fail, "a throwing call succeeded: {body}");
                let offset = body["result"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("the offset as the result: {body}"));
                out.acked.insert(id, offset);
            }
            Ok((status, body)) if fail => {
                assert_eq!(body["error"]["code"], "function_error", "{status} {body}");
                out.thrown.insert(id);
            }
            Ok((status, body)) => panic!("call {id}: {status} {body}"),
            Err(_) => {
                out.unknown.insert(id);
                break; // the server is gone
            }
        }
    }
    out
}

/// All rows of `notes` (id → writer) and all records of `events` (offset → (id, writer,
/// tags)), checking that offsets are dense from the first one kept.
async fn state(api: &Api) -> (BTreeMap<String, u64>, BTreeMap<u64, (String, u64, Value)>) {
    let rows: BTreeMap<String, u64> = api
        .scan_all("notes", 500)
        .await
        .into_iter()
        .map(|r| {
            let row = &r["row"];
            (
                row["id"].as_str().expect("an id").to_string(),
                row["writer"].as_u64().expect("a writer"),
            )
        })
        .collect();
    let mut records = BTreeMap::new();
    let mut from = 0u64;
    loop {
        let f = from.to_string();
        let (status, body) = api
            .read_records("events", &[("from", &f), ("limit", "500")])
            .await;
        assert_eq!(status, 200, "{body}");
        let page = body["records"].as_array().expect("records").clone();
        if page.is_empty() {
            break;
        }
        for r in &page {
            let offset = r["offset"].as_u64().unwrap();
            assert_eq!(offset, from, "offsets are dense: {r}");
            from += 1;
            let id = r["data"]["id"].as_str().expect("data.id").to_string();
            let w = r["data"]["writer"].as_u64().expect("data.writer");
            records.insert(offset, (id, w, r["tags"].clone()));
        }
        assert_eq!(body["next"], from, "{body}");
    }
    (rows, records)
}

/// Rows and records must match one to one, every acknowledged call be there and no thrown
/// call left anything.
fn verify(
    what: &str,
    rows: &BTreeMap<String, u64>,
    records: &BTreeMap<u64, (String, u64, Value)>,
    acked: &BTreeMap<String, u64>,
    thrown: &BTreeSet<String>,
) {
    let mut by_id: BTreeMap<&str, u64> = BTreeMap::new();
    for (offset, (id, w, tags)) in records {
        assert!(
            by_id.insert(id, *offset).is_none(),
            "{what}: call {id} has two records"
        );
        assert_eq!(
            rows.get(id),
            Some(w),
            "{what}: record {offset} (call {id}) has no matching row: half a transaction"
        );
        assert_eq!(
            tags,
            &json!([format!("w:{w}"), "note"]),
            "{what}: record {offset}"
        );
    }
    for id in rows.keys() {
        assert!(
            by_id.contains_key(id.as_str()),
            "{what}: row {id} has no record: half a transaction"
        );
    }
    for (id, offset) in acked {
        assert_eq!(
            by_id.get(id.as_str()),
            Some(offset),
            "{what}: acknowledged call {id} (offset {offset}) is missing or moved"
        );
    }
    for id in thrown {
        assert!(
            !rows.contains_key(id),
            "{what}: thrown call {id} left a row"
        );
        assert!(
            !by_id.contains_key(id.as_str()),
            "{what}: thrown call {id} left a record"
        );
    }
}

fn start(data: &std::path::Path, logs: &std::path::Path, module: &std::path::Path) -> Server {
    Server::start(
        data,
        logs,
        &[
            "--functions",
            module.to_str().unwrap(),
            "--snapshot-log-bytes",
            "65536",
            // Snapshots on the byte interval alone, however large the state: many of them.
            "--snapshot-log-percent",
            "0",
            "--segment-bytes",
            "32768",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_function_appends_and_writes_rows_atomically() {
    let seed = seed("topics_function_appends_and_writes_rows_atomically");
    let mut rng = Rng::new(seed);
    let cycles: u64 = std::env::var("SLUICE_CRASH_CYCLES")
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(4);
    let dir = TempDir::new("topics-fn");
    let data = dir.join("data");
    let module = dir.join("note.js");
    std::fs::write(&module, MODULE).unwrap();
    let server = start(&data, dir.path(), &module);
    let api = server.api();
    api.sql("CREATE TABLE notes (id TEXT PRIMARY KEY, writer INTEGER NOT NULL)")
        .await;
    let (status, body) = api.put_topic("events", None).await;
    assert_eq!(status, 200, "{body}");

    // Throwing after both writes leaves neither; offsets stay dense across the refusals.
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut thrown: BTreeSet<String> = BTreeSet::new();
    for n in 0..30u64 {
        let id = format!("first-{n}");
        let fail = n % 3 == 1;
        let (status, body) = call(&api, json!({"id": id, "writer": 9, "fail": fail}))
            .await
            .expect("a response");
        if fail {
            assert_eq!(status, 400, "{body}");
            assert_eq!(body["error"]["code"], "function_error", "{body}");
            let message = body["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains("after_both"), "the thrown message: {body}");
            thrown.insert(id);
        } else {
            assert_eq!(status, 200, "{body}");
            assert_eq!(
                body["result"],
                json!(acked.len()),
                "a call's record takes the next offset; thrown calls take none: {body}"
            );
            acked.insert(id, acked.len() as u64);
        }
    }
    // A refused append inside a function refuses the whole call, naming why.
    for (name, code, names) in [
        ("append_to_unknown", "not_found", vec!["nope"]),
        ("append_too_big", "limit", vec!["--max-record-bytes"]),
        ("append_bad_tag", "bad_request", vec!["room:*"]),
    ] {
        let id = format!("refused-{name}");
        let (status, body) = api
            .try_post(&format!("/v1/call/{name}"), &json!({"args": {"id": id}}))
            .await
            .expect("a response");
        assert_ne!(status, 200, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            body["error"]["code"] == code || body["error"]["code"] == "function_error",
            "{name}: {body}"
        );
        for n in names {
            assert!(
                message.contains(n),
                "{name}: the message names {n:?}: {body}"
            );
        }
        thrown.insert(id);
    }
    let (rows, records) = state(&api).await;
    assert_eq!(rows.len(), 20);
    verify("after the throwing calls", &rows, &records, &acked, &thrown);
    let info = &api.topics().await["events"];
    assert_eq!(info["next"], 20, "{info}");

    // Kill -9 during a stream of acknowledged calls; restart; check; repeat.
    let mut server = Some(server);
    let mut unknown_total = 0;
    // A watcher follows the topic across the kills, resuming with Last-Event-ID: every
    // record it was sent had reached fsync, so it must be there after the restart.
    let mut seen: Vec<(u64, String, Value)> = Vec::new();
    for cycle in 0..cycles {
        let srv = server.take().expect("a running server");
        let api = srv.api();
        let last_seen = seen.last().map(|s| s.0);
        let mut sse = api
            .watch_sse("events", last_seen.is_none().then_some(0), &[], last_seen)
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: the watch was refused: {e:?}"));
        let hello = sse.event().await;
        assert_eq!(hello.event, "watching", "{hello:?}");
        assert_eq!(
            hello.data["next"],
            json!(last_seen.map_or(0, |l| l + 1)),
            "{hello:?}"
        );
        let follower = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(ev) = sse.next_event().await {
                if ev.event != "record" {
                    break;
                }
                let r = Rec::from_json(&ev.data);
                let id = r.data["id"].as_str().expect("data.id").to_string();
                got.push((r.offset, id, json!(r.tags)));
            }
            got
        });
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(writer(api.clone(), w, cycle, rng.next_u64(), stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(50 + rng.below(400))).await;
        assert_no_panic(&srv);
        srv.kill9();
        stop.store(true, Ordering::SeqCst);
        let mut unknown = BTreeSet::new();
        let mut acked_now = 0;
        for t in tasks {
            let out = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a writer ends after the kill")
                .expect("a writer");
            acked_now += out.acked.len();
            acked.extend(out.acked);
            thrown.extend(out.thrown);
            unknown.extend(out.unknown);
        }
        unknown_total += unknown.len();
        let followed = tokio::time::timeout(Duration::from_secs(60), follower)
            .await
            .expect("the watch ends with the process")
            .expect("the follower");
        seen.extend(followed);
        let restarted = start(&data, dir.path(), &module);
        let (rows, records) = state(&restarted.api()).await;
        let what = format!("cycle {cycle} (seed {seed})");
        verify(&what, &rows, &records, &acked, &thrown);
        for (i, (offset, id, tags)) in seen.iter().enumerate() {
            assert_eq!(
                *offset, i as u64,
                "{what}: the watcher saw offsets in order, no gap"
            );
            let (rid, _, rtags) = records.get(offset).unwrap_or_else(|| {
                panic!("{what}: the watcher was sent record {offset} (call {id}), lost by the kill")
            });
            assert_eq!(
                (rid, rtags),
                (id, tags),
                "{what}: record {offset} as sent vs recovered"
            );
        }
        for id in rows.keys() {
            assert!(
                acked.contains_key(id) || unknown.contains(id),
                "{what}: row {id} was never acknowledged nor in flight"
            );
        }
        // Calls in flight at the kill that made it are acknowledged from now on.
        for (offset, (id, _, _)) in &records {
            if unknown.contains(id) {
                acked.insert(id.clone(), *offset);
            }
        }
        eprintln!(
            "cycle {cycle}: {acked_now} calls acknowledged, {} in flight at the kill; {} rows, {} records, {} seen by the watcher",
            unknown.len(),
            rows.len(),
            records.len(),
            seen.len()
        );
        server = Some(restarted);
    }
    eprintln!(
        "seed {seed}: {cycles} kill -9 cycles, {} acknowledged calls, {} thrown, {unknown_total} in flight at a kill",
        acked.len(),
        thrown.len()
    );
    if let Some(s) = &server {
        assert_no_panic(s);
    }
    drop(server);
}
