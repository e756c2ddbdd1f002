//! Fan-out routing with many watchers of one topic, each with its own filter (the bench's
//! "each watcher on its own tag" shape, plus overlapping prefixes of several lengths): 160
//! WebSocket watchers (JSON and MessagePack) and 40 SSE watchers, records with random tags
//! appended in batches; every watcher must get exactly the records its filter matches,
//! computed independently of the server, in offset order, each once.
//!
//! `SLUICE_TEST_SEED` repeats a run.

mod common;

use common::topics::assert_no_panic;

use std::collections::BTreeMap;

use common::topics::{filter_matches, Enc, Rec, Ws};
use common::{seed, Rng, Server, TempDir};
use serde_json::{json, Value};

const WS_WATCHERS: usize = 160;
const SSE_WATCHERS: usize = 40;
const BATCHES: usize = 60;

/// Watcher `i`'s filter: its own exact tag, sometimes a prefix of some length over the `p`
/// tags, sometimes a second exact tag; always `end` (the marker every watcher waits for).
fn filter_of(i: usize, rng: &mut Rng) -> Vec<String> {
    let mut f = vec![format!("u:{i}"), "end".to_string()];
    match rng.below(4) {
        0 => f.push(format!("p{}*", &"1234"[..rng.below(4) as usize])),
        1 => f.push(format!(
            "u:{}",
            rng.below((WS_WATCHERS + SSE_WATCHERS) as u64)
        )),
        2 => f.push(format!("p{}*", i % 7)),
        _ => {}
    }
    f
}

fn gen_tags(rng: &mut Rng) -> Vec<String> {
    let n = rng.below(4);
    let mut tags: Vec<String> = Vec::new();
    for _ in 0..n {
        let t = if rng.chance(60) {
            format!("u:{}", rng.below((WS_WATCHERS + SSE_WATCHERS + 20) as u64))
        } else {
            let digits = 1 + rng.below(5) as usize;
            let s: String = (0..digits)
                .map(|_| char::from(b'0' + rng.below(8) as u8))
                .collect();
            format!("p{s}")
        };
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    tags
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_many_watchers_each_get_their_own_records() {
    let seed = seed("topics_many_watchers_each_get_their_own_records");
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("topics-many");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let api = server.api();
    let addr = server.addr;
    let (status, body) = api.put_topic("fan", None).await;
    assert_eq!(status, 200, "{body}");

    let mut tasks = Vec::new();
    for i in 0..WS_WATCHERS + SSE_WATCHERS {
        let filter = filter_of(i, &mut rng);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let f = filter.clone();
        let task = if i < WS_WATCHERS {
            let enc = if i % 2 == 0 { Enc::Json } else { Enc::MsgPack };
            tokio::spawn(async move {
                let mut ws = Ws::connect(addr, enc).await;
                ws.send(json!({"id": 1, "type": "watch", "qid": "w", "topic": "fan", "tags": f}))
                    .await;
                let (reply, _) = ws.until_reply(1).await;
                assert_eq!(
                    (&reply["type"], &reply["next"]),
                    (&json!("watching"), &json!(0)),
                    "{reply}"
                );
                let _ = tx.send(());
                let mut got = Vec::new();
                loop {
                    let m = ws.next().await.expect("a record");
                    assert_eq!(m["type"], "record", "{m}");
                    let r = Rec::from_json(&m);
                    let end = r.data == json!("end");
                    got.push(r);
                    if end {
                        return got;
                    }
                }
            })
        } else {
            let api = api.clone();
            tokio::spawn(async move {
                let tags: Vec<&str> = f.iter().map(String::as_str).collect();
                let mut sse = api
                    .watch_sse("fan", None, &tags, None)
                    .await
                    .expect("a watch");
                let ev = sse.event().await;
                assert_eq!(
                    (ev.event.as_str(), &ev.data["next"]),
                    ("watching", &json!(0)),
                    "{ev:?}"
                );
                let _ = tx.send(());
                let mut got = Vec::new();
                loop {
                    let ev = sse.event().await;
                    assert_eq!(ev.event, "record", "{ev:?}");
                    let r = Rec::from_json(&ev.data);
                    let end = r.data == json!("end");
                    got.push(r);
                    if end {
                        return got;
                    }
                }
            })
        };
        rx.await.expect("the watcher registered");
        tasks.push((filter, task));
    }

    let mut appended: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for b in 0..BATCHES {
        let n = 1 + rng.below(30) as usize;
        let batch: Vec<Vec<String>> = (0..n).map(|_| gen_tags(&mut rng)).collect();
        let records: Vec<Value> = batch
            .iter()
            .enumerate()
            .map(|(k, tags)| json!({"tags": tags, "data": [b, k]}))
            .collect();
        let (first, _) = api.append_ok("fan", &json!(records), Some("memory")).await;
        for (k, tags) in batch.into_iter().enumerate() {
            appended.insert(first + k as u64, tags);
        }
    }
    let (end, _) = api
        .append_ok("fan", &json!([{"tags": ["end"], "data": "end"}]), None)
        .await;
    appended.insert(end, vec!["end".to_string()]);

    let mut delivered = 0;
    for (i, (filter, task)) in tasks.into_iter().enumerate() {
        let got = task
            .await
            .unwrap_or_else(|e| panic!("watcher {i}: {e} (seed {seed})"));
        let patterns: Vec<&str> = filter.iter().map(String::as_str).collect();
        let want: Vec<u64> = appended
            .iter()
            .filter(|(_, tags)| filter_matches(&patterns, tags))
            .map(|(o, _)| *o)
            .collect();
        let got_offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
        assert_eq!(
            got_offsets, want,
            "watcher {i} with {filter:?} (seed {seed})"
        );
        for r in &got {
            assert_eq!(
                r.tags, appended[&r.offset],
                "watcher {i}: record {} tags",
                r.offset
            );
        }
        delivered += got.len();
    }
    eprintln!(
        "seed {seed}: {} records, {delivered} deliveries to {} watchers",
        end + 1,
        WS_WATCHERS + SSE_WATCHERS
    );
    assert!(
        api.metric("sluice_topic_deliveries_total").await >= delivered as f64,
        "the deliveries counter covers what the watchers got"
    );
    assert_no_panic(&server);
}
