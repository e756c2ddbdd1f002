//! Retention is part of a topic's durable state: after `kill -9` and a restart (recovery
//! replays the log) every topic has the same `first`, `next` and records it had before — a
//! trimmed record never comes back, so a read that answered `horizon` keeps answering it.
//! Covers retention by count, by bytes and by age (an age limit later lifted, so only the
//! trim done at append time, or by the clock while idle, can have removed the old records).

mod common;

use common::topics::assert_no_panic;

use std::time::Duration;

use common::{Api, Server, TempDir};
use serde_json::{json, Value};

/// (first, next, records) of every topic, and each topic's records as read.
async fn topics_state(api: &Api) -> Vec<(String, Value, Value, Value, Value)> {
    let mut out = Vec::new();
    for (name, info) in api.topics().await {
        let (status, body) = api.read_records(&name, &[("limit", "1000")]).await;
        assert_eq!(status, 200, "{body}");
        out.push((
            name,
            info["first"].clone(),
            info["next"].clone(),
            info["records"].clone(),
            body["records"].clone(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_retention_survives_restart() {
    let dir = TempDir::new("topics-retention");
    let data = dir.join("data");
    let server = Server::start(&data, dir.path(), &[]);
    let api = server.api();

    let put = |name: &'static str, body: Value| {
        let api = api.clone();
        async move {
            let (status, reply) = api.put_topic(name, Some(&body)).await;
            assert_eq!(status, 200, "PUT {name} {body}: {reply}");
        }
    };
    put("count", json!({"retain_records": 3})).await;
    put("bytes", json!({"retain_bytes": 400})).await;
    put("age", json!({"retain_secs": 1})).await;
    for i in 0..10 {
        api.append_ok("count", &json!([{"tags": ["c"], "data": i}]), Some("fsync"))
            .await;
        api.append_ok("bytes", &json!([{"data": "b".repeat(100)}]), Some("fsync"))
            .await;
    }
    api.append_ok(
        "age",
        &json!([{"tags": ["old"], "data": "old"}]),
        Some("fsync"),
    )
    .await;
    // More than retain_secs later, the next append trims the old record by age …
    tokio::time::sleep(Duration::from_millis(1500)).await;
    api.append_ok(
        "age",
        &json!([{"tags": ["new"], "data": "new"}]),
        Some("fsync"),
    )
    .await;
    let info = &api.topics().await["age"];
    assert_eq!(
        (&info["first"], &info["next"]),
        (&json!(1), &json!(2)),
        "{info}"
    );
    // … and lifting the age limit afterwards does not bring it back.
    put("age", json!({"retain_secs": 0})).await;
    // The same with records dropped by the clock alone (no later append), then the limit
    // lifted.
    put("idle", json!({"retain_secs": 1})).await;
    let records: Vec<Value> = (0..3).map(|i| json!({"data": i})).collect();
    api.append_ok("idle", &json!(records), Some("fsync")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while api.topics().await["idle"]["first"] != 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = &api.topics().await["idle"];
    assert_eq!(
        info["first"], 2,
        "the clock drops the older records: {info}"
    );
    put("idle", json!({"retain_secs": 0})).await;

    let before = topics_state(&api).await;
    let count = &before.iter().find(|t| t.0 == "count").unwrap();
    assert_eq!((&count.1, &count.2), (&json!(7), &json!(10)), "{count:?}");
    let bytes = &before.iter().find(|t| t.0 == "bytes").unwrap();
    assert!(
        bytes.1.as_u64().unwrap() > 0,
        "retain_bytes trimmed: {bytes:?}"
    );
    let (status, body) = api.read_records("age", &[("from", "0")]).await;
    assert_eq!(status, 410, "{body}");

    assert_no_panic(&server);
    server.kill9();
    let server = Server::start(&data, dir.path(), &[]);
    let api = server.api();
    let after = topics_state(&api).await;
    let diffs: Vec<String> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| a != b)
        .map(|(b, a)| {
            format!(
                "topic {:?}: before {b:?}\n  after kill -9 and recovery {a:?}",
                b.0
            )
        })
        .collect();
    assert!(
        diffs.is_empty(),
        "(first, next, count, records) differ:\n{}",
        diffs.join("\n")
    );
    assert_eq!(after.len(), before.len());
    let (status, body) = api.read_records("age", &[("from", "0")]).await;
    assert_eq!(
        status, 410,
        "a trimmed record stays trimmed after recovery: {body}"
    );

    // A graceful restart (with its final snapshot) keeps the same state.
    let (exit, stderr) = server.terminate();
    assert!(exit.success(), "{stderr}");
    let server = Server::start(&data, dir.path(), &[]);
    assert_eq!(
        topics_state(&server.api()).await,
        before,
        "after a graceful restart"
    );
}
