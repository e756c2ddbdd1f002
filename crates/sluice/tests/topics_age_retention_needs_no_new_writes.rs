//! Retention by age (`retain_secs`) drops records older than that (docs/api.md "Topics") by
//! the clock, not only when the next write arrives: a topic appended to once and then left
//! alone loses its old records (the newest always stays), a read from the old offset answers
//! `horizon`, and after a restart nothing old comes back.
//!
//! Every wait is a bounded poll (20 s for a 1 s age limit), never an assertion about speed.

mod common;

use common::topics::assert_no_panic;

use std::time::{Duration, Instant};

use common::{Api, Server, TempDir};
use serde_json::json;

/// Polls `GET /v1/topics` until topic `name` has `first == want` or `within` passes;
/// returns the last `first` seen.
async fn wait_first(api: &Api, name: &str, want: u64, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let first = api.topics().await[name]["first"].as_u64().unwrap();
        if first == want || Instant::now() >= deadline {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_age_retention_needs_no_new_writes() {
    let dir = TempDir::new("topics-age");
    let data = dir.join("data");
    let server = Server::start(&data, dir.path(), &[]);
    let api = server.api();
    let (status, body) = api
        .put_topic("aged", Some(&json!({"retain_secs": 1})))
        .await;
    assert_eq!(status, 200, "{body}");
    let records: Vec<_> = (0..3).map(|i| json!({"data": i})).collect();
    assert_eq!(
        api.append_ok("aged", &json!(records), Some("fsync")).await,
        (0, 2)
    );

    // No write from here on: only reads. The two older records must go; the newest stays.
    let first = wait_first(&api, "aged", 2, Duration::from_secs(20)).await;
    assert_eq!(
        first, 2,
        "records older than retain_secs 1 are still kept 20 s later with no new write"
    );
    let (status, body) = api.read_records("aged", &[("from", "0")]).await;
    assert_eq!(status, 410, "{body}");
    let (status, body) = api.read_records("aged", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["records"].as_array().map(Vec::len),
        Some(1),
        "the newest stays: {body}"
    );

    // After kill -9 and recovery the old records stay gone.
    assert_no_panic(&server);
    server.kill9();
    let server = Server::start(&data, dir.path(), &[]);
    let api = server.api();
    let info = &api.topics().await["aged"];
    assert_eq!(
        (&info["first"], &info["next"]),
        (&json!(2), &json!(3)),
        "{info}"
    );
}
