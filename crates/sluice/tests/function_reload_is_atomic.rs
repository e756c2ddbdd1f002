//! `PUT /v1/functions` replaces the module between calls, never during one.
//!
//! Clients call `bump` continuously while the module is replaced, over and over, by v1
//! (`bump` adds 1 to two counters and answers "v1") or v2 (adds 1000 and answers "v2"), with
//! now and then a module that does not compile. Every call's reply names the version that
//! ran and the counter value it wrote; in seq order, each call's value is the previous one
//! plus exactly its version's step, and the final counters equal Σ(1 per v1 reply) +
//! Σ(1000 per v2 reply) — no call ran half of one version or a mix of two. A call sent after
//! a `PUT` was acknowledged and answered before the next `PUT` was sent ran the module that
//! `PUT` loaded. A module that does not compile is refused with `compile_error` and the line
//! of the error, and the previous module keeps serving; `GET /v1/functions` lists the
//! exports of the module in place.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};

const CALLERS: usize = 8;
const RELOADS: usize = 60;
/// A caller stops after this many calls even if the reloads are not done.
const CALLS_PER_CALLER_MAX: usize = 2_000;

const CREATE: &str = "CREATE TABLE counters (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)";

/// v1 and v2 differ in the step, the answer and one export. Each writes two rows, so a
/// call that ran half of a version would leave the counters apart.
fn module(version: u32) -> String {
    let step = if version == 1 { 1 } else { 1000 };
    let extra = if version == 1 {
        "export function only_in_v1(tx) { return 1; }"
    } else {
        "export function only_in_v2(tx) { return 2; }"
    };
    format!(
        r#"const STEP = {step};
const VERSION = "v{version}";
export function bump(tx) {{
  const a = tx.get("counters", 1);
  tx.patch("counters", 1, {{ n: a.n + STEP }});
  const b = tx.get("counters", 2);
  tx.patch("counters", 2, {{ n: b.n + STEP }});
  return {{ version: VERSION, n: a.n + STEP }};
}}
export function version(tx) {{ return VERSION; }}
{extra}
"#
    )
}

/// Does not compile: a syntax error on line 4.
const BROKEN: &str = "export function bump(tx) {\n  return \"broken\";\n}\nconst oops = ;\nexport function version(tx) { return \"broken\"; }\n";
const BROKEN_LINE: u64 = 4;
/// Compiles, but its top level throws on line 3: refused as well.
const THROWS: &str =
    "export function bump(tx) { return \"throws\"; }\n\nthrow new Error(\"top-level failure\");\n";

fn step(version: &str) -> i64 {
    match version {
        "v1" => 1,
        "v2" => 1000,
        other => panic!("unknown version {other:?}"),
    }
}

/// One answered call.
#[derive(Debug)]
struct Bump {
    sent: Instant,
    answered: Instant,
    seq: u64,
    version: String,
    n: i64,
}

/// One `PUT` of a good module: which version, when sent and when acknowledged.
#[derive(Debug)]
struct Reload {
    sent: Instant,
    acked: Instant,
    version: String,
}

async fn caller(api: Api, done: Arc<AtomicBool>) -> Result<Vec<Bump>, String> {
    let mut out = Vec::new();
    for _ in 0..CALLS_PER_CALLER_MAX {
        if done.load(Ordering::Relaxed) {
            break;
        }
        let sent = Instant::now();
        let (status, body) = api.call("bump", &json!(null)).await;
        let answered = Instant::now();
        if status != 200 {
            return Err(format!("bump answered {status}: {body}"));
        }
        let version = body["result"]["version"].as_str().unwrap_or("").to_string();
        if version != "v1" && version != "v2" {
            return Err(format!("bump answered {body}"));
        }
        out.push(Bump {
            sent,
            answered,
            seq: body["seq"].as_u64().ok_or(format!("no seq: {body}"))?,
            version,
            n: body["result"]["n"]
                .as_i64()
                .ok_or(format!("no n: {body}"))?,
        });
    }
    Ok(out)
}

async fn exports(api: &Api) -> Vec<String> {
    let body = api.get_ok("/v1/functions").await;
    body["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("GET /v1/functions: {body}"))
        .iter()
        .map(|e| e.as_str().expect("an export name").to_string())
        .collect()
}

async fn counter(api: &Api, id: u64) -> i64 {
    let body = api.get_ok(&format!("/v1/tables/counters/rows/{id}")).await;
    body["row"]["n"].as_i64().expect("n")
}

fn assert_refused_with_line(status: u16, body: &Value, context: &str) {
    assert_eq!(status, 400, "{context}: {body}");
    assert_eq!(body["error"]["code"], "compile_error", "{context}: {body}");
    assert_eq!(
        body["error"]["line"].as_u64(),
        Some(BROKEN_LINE),
        "{context}: the error must name line {BROKEN_LINE}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_reload_is_atomic() {
    let seed = seed("function_reload_is_atomic");
    let context = format!("seed {seed}");
    let mut rng = Rng::new(seed);
    let root = TempDir::new("reload");
    let v1_path = root.join("v1.js");
    std::fs::write(&v1_path, module(1)).unwrap();
    let server = Server::start(
        &root.join("data"),
        root.path(),
        &["--functions", v1_path.to_str().unwrap()],
    );
    let api = server.api();
    api.sql(CREATE).await;
    api.mutate(json!([
        {"op": "insert", "table": "counters", "row": {"id": 1, "n": 0}},
        {"op": "insert", "table": "counters", "row": {"id": 2, "n": 0}},
    ]))
    .await;
    assert_eq!(exports(&api).await, ["bump", "only_in_v1", "version"]);

    // Before the load starts: a broken module is refused and v1 keeps serving.
    let (status, body) = api.put_functions(BROKEN).await;
    assert_refused_with_line(status, &body, &context);
    assert_eq!(exports(&api).await, ["bump", "only_in_v1", "version"]);
    let (status, body) = api.put_functions(THROWS).await;
    assert_eq!(status, 400, "{context}: {body}");
    assert_eq!(body["error"]["code"], "compile_error", "{context}: {body}");
    assert_eq!(body["error"]["line"].as_u64(), Some(3), "{context}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("top-level failure"),
        "{context}: the message is the thrown one: {body}"
    );
    assert_eq!(exports(&api).await, ["bump", "only_in_v1", "version"]);
    let (status, body) = api.call("version", &json!(null)).await;
    assert_eq!((status, &body["result"]), (200, &json!("v1")), "{body}");
    let (status, body) = api.call("bump", &json!(null)).await;
    assert_eq!(status, 200, "{context}: {body}");
    assert_eq!(
        body["result"],
        json!({"version": "v1", "n": 1}),
        "{context}"
    );

    let done = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| tokio::spawn(caller(api.clone(), done.clone())))
        .collect();
    let mut reloads = vec![Reload {
        sent: Instant::now(),
        acked: Instant::now(),
        version: "v1".into(),
    }];
    let mut refused = 0;
    for i in 0..RELOADS {
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
        if rng.chance(15) {
            let (status, body) = api.put_functions(BROKEN).await;
            assert_refused_with_line(status, &body, &format!("{context}, reload {i}"));
            refused += 1;
            continue;
        }
        let version = if rng.chance(50) { 1 } else { 2 };
        let sent = Instant::now();
        let (status, body) = api.put_functions(&module(version)).await;
        let acked = Instant::now();
        assert_eq!(status, 200, "{context}: PUT v{version}: {body}");
        let mut expected = vec!["bump", "version", ""];
        expected[2] = if version == 1 {
            "only_in_v1"
        } else {
            "only_in_v2"
        };
        expected.sort();
        assert_eq!(
            body["exports"],
            json!(expected),
            "{context}: PUT v{version}"
        );
        reloads.push(Reload {
            sent,
            acked,
            version: format!("v{version}"),
        });
    }
    done.store(true, Ordering::Relaxed);
    let mut bumps = Vec::new();
    for c in callers {
        bumps.extend(
            c.await
                .expect("caller task")
                .unwrap_or_else(|e| panic!("{context}: {e}")),
        );
    }

    // In seq order, each call's value is the previous one plus its own version's step.
    bumps.sort_by_key(|b| b.seq);
    let mut n = 1; // the one v1 call before the load
    let mut last_seq = 0;
    for b in &bumps {
        assert!(b.seq > last_seq, "{context}: two calls share seq {}", b.seq);
        n += step(&b.version);
        assert_eq!(
            b.n, n,
            "{context}: call at seq {} answered {} with n {}, expected {n}",
            b.seq, b.version, b.n
        );
        last_seq = b.seq;
    }
    let v1 = bumps.iter().filter(|b| b.version == "v1").count() as i64;
    let v2 = bumps.len() as i64 - v1;
    let expected = 1 + v1 + 1000 * v2;
    assert_eq!(counter(&api, 1).await, expected, "{context}: counter 1");
    assert_eq!(counter(&api, 2).await, expected, "{context}: counter 2");

    // A call wholly between one acknowledged PUT and the next PUT ran that PUT's module.
    let mut checked = 0;
    for (k, r) in reloads.iter().enumerate() {
        let next_sent = reloads.get(k + 1).map(|n| n.sent);
        for b in bumps
            .iter()
            .filter(|b| b.sent > r.acked && next_sent.is_none_or(|s| b.answered < s))
        {
            assert_eq!(
                b.version, r.version,
                "{context}: a call sent after the PUT of {} was acknowledged (and answered \
                 before the next PUT) ran {}",
                r.version, b.version
            );
            checked += 1;
        }
    }

    // After all that, the module in place is the last one loaded, and still serves.
    let last = &reloads.last().unwrap().version;
    let (status, body) = api.call("version", &json!(null)).await;
    assert_eq!((status, &body["result"]), (200, &json!(last)), "{body}");
    let only = if last == "v1" {
        "only_in_v1"
    } else {
        "only_in_v2"
    };
    let mut listed = vec!["bump", "version", only];
    listed.sort();
    assert_eq!(exports(&api).await, listed, "{context}");
    let (status, body) = api
        .call(
            if last == "v1" {
                "only_in_v2"
            } else {
                "only_in_v1"
            },
            &json!(null),
        )
        .await;
    assert_eq!(
        status, 404,
        "{context}: an export of the replaced module: {body}"
    );
    assert_eq!(body["error"]["code"], "not_found", "{context}: {body}");

    eprintln!(
        "{} calls ({v1} v1, {v2} v2) across {} reloads and {refused} refused modules; \
         {checked} calls checked against the reload they followed",
        bumps.len(),
        reloads.len() - 1
    );
    assert!(
        v1 > 0 && v2 > 0,
        "{context}: the calls did not see both versions"
    );
}
