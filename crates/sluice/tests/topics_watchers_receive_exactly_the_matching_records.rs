//! Topic watchers over SSE and WebSocket (JSON and MessagePack) against the real binary
//! (docs/api.md and docs/protocol.md, "Topics").
//!
//! Watchers with no filter, exact filters and prefix filters are registered; then two
//! appenders send batches of records with mixed tags, in every durability class, over HTTP
//! and over the WebSocket `append` (and some of the same batches to another topic, which
//! must reach none of these watchers). Each watcher drops its connection on purpose now and
//! then and resumes (SSE: `Last-Event-ID`, sometimes with a conflicting `from` it must
//! ignore, or `from`; WS: `from`, on a new connection or after `unwatch` on the same one).
//! Late watchers join at random moments, with and without `from`. Each must
//! receive exactly the records its filter matches — computed here from what was appended,
//! independently of the server — in offset order, with no gap and no duplicate, and each
//! record equal to what `GET …/records` pages out. Past retention (a topic with
//! `retain_records` 5) a read, a watch `from` and a resume get `horizon` with `first`; and
//! dropping a topic ends its watches with `not_found`, and SIGTERM with `shutting_down`.
//!
//! `SLUICE_TEST_SEED` repeats a run's workload; `SLUICE_TOPIC_BATCHES` makes it longer.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use common::topics::{filter_matches, Enc, Rec, Ws};
use common::{seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};

const TAG_POOL: &[&str] = &[
    "user:1", "user:2", "user:13", "room:1", "room:2", "room:10", "x",
];
const DURABILITIES: &[Option<&str>] = &[None, Some("memory"), Some("disk"), Some("fsync")];

#[derive(Clone, Copy, Debug)]
enum Transport {
    Sse,
    Ws(Enc),
}

#[derive(Clone, Debug)]
enum SseResume {
    LastEventId,
    /// `Last-Event-ID` and a `from=0` the header must win over.
    LastEventIdOverFrom,
    From,
}

#[derive(Clone, Debug)]
struct Spec {
    name: String,
    transport: Transport,
    tags: Vec<&'static str>,
    from: Option<u64>,
    /// Received-record counts at which the watcher drops its connection and resumes.
    drop_at: Vec<usize>,
    resume: SseResume,
}

/// One connection of a watcher: what it yields per record, or its end.
enum Conn {
    Sse(common::topics::Sse),
    Ws(Ws),
}

/// Opens a watch and checks its `watching` greeting; returns the connection.
async fn open_watch(
    api: &Api,
    addr: SocketAddr,
    spec: &Spec,
    last_seen: Option<u64>,
    expect_next: Option<u64>,
    reuse: Option<Ws>,
) -> (Conn, u64) {
    let what = format!("watcher {} (last seen {last_seen:?})", spec.name);
    let (conn, next) = match spec.transport {
        Transport::Sse => {
            let (from, header) = match (last_seen, &spec.resume) {
                (None, _) => (spec.from, None),
                (Some(l), SseResume::LastEventId) => (None, Some(l)),
                (Some(l), SseResume::LastEventIdOverFrom) => (Some(0), Some(l)),
                (Some(l), SseResume::From) => (Some(l + 1), None),
            };
            let mut sse = api
                .watch_sse("feed", from, &spec.tags, header)
                .await
                .unwrap_or_else(|e| panic!("{what}: the watch was refused: {e:?}"));
            let ev = sse.event().await;
            assert_eq!(ev.event, "watching", "{what}: the first event: {ev:?}");
            assert_eq!(ev.data["topic"], "feed", "{what}: {ev:?}");
            let next = ev.data["next"]
                .as_u64()
                .unwrap_or_else(|| panic!("{what}: {ev:?}"));
            (Conn::Sse(sse), next)
        }
        Transport::Ws(enc) => {
            let mut ws = match reuse {
                Some(ws) => ws,
                None => Ws::connect(addr, enc).await,
            };
            let mut req = json!({"id": 1, "type": "watch", "qid": "w", "topic": "feed"});
            if let Some(f) = last_seen.map(|l| l + 1).or(spec.from) {
                req["from"] = json!(f);
            }
            if !spec.tags.is_empty() {
                req["tags"] = json!(spec.tags);
            }
            ws.send(req).await;
            let (reply, before) = ws.until_reply(1).await;
            assert!(
                before.is_empty(),
                "{what}: messages before the reply: {before:?}"
            );
            assert_eq!(reply["type"], "watching", "{what}: {reply}");
            assert_eq!(
                (&reply["qid"], &reply["topic"]),
                (&json!("w"), &json!("feed")),
                "{what}: {reply}"
            );
            let next = reply["next"]
                .as_u64()
                .unwrap_or_else(|| panic!("{what}: {reply}"));
            (Conn::Ws(ws), next)
        }
    };
    if let Some(want) = last_seen.map(|l| l + 1).or(expect_next) {
        assert_eq!(next, want, "{what}: the offset the watch starts from");
    }
    (conn, next)
}

/// The next record of a connection (its other messages are errors of the test).
async fn next_record(conn: &mut Conn, what: &str) -> Rec {
    match conn {
        Conn::Sse(sse) => {
            let ev = sse.event().await;
            assert_eq!(ev.event, "record", "{what}: {ev:?}");
            let rec = Rec::from_json(&ev.data);
            assert_eq!(
                ev.id,
                Some(rec.offset.to_string()),
                "{what}: an SSE record's id is its offset"
            );
            rec
        }
        Conn::Ws(ws) => {
            let m = ws
                .next()
                .await
                .unwrap_or_else(|| panic!("{what}: the connection ended"));
            assert_eq!(m["type"], "record", "{what}: {m}");
            assert_eq!(m["topic"], "feed", "{what}: a record names its topic: {m}");
            assert!(
                m.get("qid").is_none(),
                "{what}: a record is shared, without a qid: {m}"
            );
            Rec::from_json(&m)
        }
    }
}

/// Runs one watcher until it sees the end marker; returns every record it received.
async fn run_watcher(
    api: Api,
    addr: SocketAddr,
    spec: Spec,
    ready: tokio::sync::oneshot::Sender<u64>,
    expect_next: Option<u64>,
) -> Vec<Rec> {
    let mut got: Vec<Rec> = Vec::new();
    let mut ready = Some(ready);
    let mut drops = spec.drop_at.iter().copied().peekable();
    let mut reuse: Option<Ws> = None;
    loop {
        let last_seen = got.last().map(|r| r.offset);
        let (mut conn, next) =
            open_watch(&api, addr, &spec, last_seen, expect_next, reuse.take()).await;
        if let Some(r) = ready.take() {
            let _ = r.send(next);
        }
        loop {
            let what = format!("watcher {} after {} records", spec.name, got.len());
            let rec = next_record(&mut conn, &what).await;
            let end = rec.data["end"] == json!(true);
            got.push(rec);
            if end {
                if let Conn::Ws(ws) = conn {
                    ws.close().await;
                }
                return got;
            }
            if drops.peek() == Some(&got.len()) {
                drops.next();
                break; // drop the connection on purpose; resume on the next turn
            }
        }
        // Some WebSocket watchers `unwatch` and watch again on the same connection instead:
        // records sent before the `unwatched` reply still count, none may follow it.
        if let (Conn::Ws(mut ws), SseResume::LastEventIdOverFrom) = (conn, &spec.resume) {
            ws.send(json!({"id": 2, "type": "unwatch", "qid": "w"}))
                .await;
            loop {
                let m = ws.next().await.expect("the unwatch reply");
                if m["id"] == 2 {
                    assert_eq!(
                        (&m["type"], &m["qid"]),
                        (&json!("unwatched"), &json!("w")),
                        "{m}"
                    );
                    break;
                }
                assert_eq!(
                    m["type"], "record",
                    "watcher {}: before unwatched: {m}",
                    spec.name
                );
                let rec = Rec::from_json(&m);
                let end = rec.data["end"] == json!(true);
                got.push(rec);
                if end {
                    return got;
                }
            }
            reuse = Some(ws);
        }
    }
}

fn gen_tags(rng: &mut Rng) -> Vec<String> {
    let mut pool: Vec<&str> = TAG_POOL.to_vec();
    rng.shuffle(&mut pool);
    let n = rng.below(4) as usize;
    pool[..n].iter().map(|t| t.to_string()).collect()
}

/// Appends `batches` batches to `feed`, half of them over a WebSocket; returns the records
/// as appended (offset → (tags, data)).
async fn appender(
    api: Api,
    addr: SocketAddr,
    id: u64,
    seed: u64,
    batches: usize,
) -> Vec<(u64, Vec<String>, Value)> {
    let mut rng = Rng::new(seed);
    let mut ws = Ws::connect(
        addr,
        if id.is_multiple_of(2) {
            Enc::Json
        } else {
            Enc::MsgPack
        },
    )
    .await;
    let mut out = Vec::new();
    for b in 0..batches {
        let span = if rng.chance(20) { 60 } else { 8 };
        let n = 1 + rng.below(span) as usize;
        let records: Vec<(Vec<String>, Value)> = (0..n)
            .map(|i| {
                let data = match rng.below(4) {
                    0 => json!({"a": id, "b": b, "i": i}),
                    1 => json!([id, b, i, "ü"]),
                    2 => json!(format!("{id}/{b}/{i}")),
                    _ => json!(id * 1_000_000 + (b * 1000 + i) as u64),
                };
                (gen_tags(&mut rng), data)
            })
            .collect();
        let body: Vec<Value> = records
            .iter()
            .map(|(tags, data)| {
                if tags.is_empty() && rng.chance(50) {
                    json!({ "data": data })
                } else {
                    json!({ "tags": tags, "data": data })
                }
            })
            .collect();
        let durability = *DURABILITIES
            .get(rng.below(DURABILITIES.len() as u64) as usize)
            .unwrap();
        if rng.chance(30) {
            // The same records to another topic: they must reach no watcher of `feed`.
            api.append_ok("other", &json!(body), durability).await;
        }
        let (first, last) = if rng.chance(50) {
            api.append_ok("feed", &json!(body), durability).await
        } else {
            let mut req = json!({"id": b + 1, "type": "append", "topic": "feed", "records": body});
            if let Some(d) = durability {
                req["durability"] = json!(d);
            }
            ws.send(req).await;
            let (reply, others) = ws.until_reply(b as u64 + 1).await;
            assert!(others.is_empty(), "appender {id}: {others:?}");
            assert_eq!(reply["type"], "result", "appender {id}: {reply}");
            assert!(reply["seq"].as_u64().is_some(), "{reply}");
            (
                reply["first"].as_u64().unwrap(),
                reply["last"].as_u64().unwrap(),
            )
        };
        assert_eq!(
            last + 1 - first,
            n as u64,
            "appender {id}: a batch of {n} gets {n} consecutive offsets"
        );
        if rng.chance(20) {
            // Acknowledged means readable, whatever the durability class.
            let (f, l) = (first.to_string(), (last + 1 - first).to_string());
            let (status, page) = api
                .read_records("feed", &[("from", f.as_str()), ("limit", l.as_str())])
                .await;
            assert_eq!(status, 200, "{page}");
            let got: Vec<Value> = page["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["data"].clone())
                .collect();
            let want: Vec<Value> = records.iter().map(|(_, d)| d.clone()).collect();
            assert_eq!(
                got, want,
                "appender {id}: batch {first}..={last} read after its reply ({durability:?})"
            );
        }
        for (k, (tags, data)) in records.into_iter().enumerate() {
            out.push((first + k as u64, tags, data));
        }
    }
    ws.close().await;
    out
}

fn watcher_specs(rng: &mut Rng) -> Vec<Spec> {
    let filters: Vec<Vec<&'static str>> = vec![
        vec![],
        vec!["user:1"],
        vec!["room:*"],
        vec!["user:2", "room:1*"],
        vec!["x", "user:1*"],
        vec!["*"],
        vec!["nobody", "room:2"],
    ];
    let transports = [
        Transport::Sse,
        Transport::Ws(Enc::Json),
        Transport::Ws(Enc::MsgPack),
    ];
    let mut specs = Vec::new();
    for (i, tags) in filters.iter().enumerate() {
        for (j, transport) in transports.iter().enumerate() {
            let mut drop_at: Vec<usize> = (0..rng.below(4))
                .map(|_| 1 + rng.below(120) as usize)
                .collect();
            drop_at.sort_unstable();
            drop_at.dedup();
            let resume = match (i + j) % 3 {
                0 => SseResume::LastEventId,
                1 => SseResume::LastEventIdOverFrom,
                _ => SseResume::From,
            };
            specs.push(Spec {
                name: format!("{transport:?} {tags:?}"),
                transport: *transport,
                tags: tags.clone(),
                from: (rng.chance(50)).then_some(0),
                drop_at,
                resume,
            });
        }
    }
    specs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_watchers_receive_exactly_the_matching_records() {
    let seed = seed("topics_watchers_receive_exactly_the_matching_records");
    let mut rng = Rng::new(seed);
    let batches: usize = std::env::var("SLUICE_TOPIC_BATCHES")
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(40);
    let dir = TempDir::new("topics-watch");
    let data = dir.join("data");
    let server = Server::start(&data, dir.path(), &["--live-heartbeat-ms", "100"]);
    let api = server.api();
    let addr = server.addr;
    let (status, body) = api.put_topic("feed", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["created"], true, "{body}");
    let (status, body) = api.put_topic("other", None).await;
    assert_eq!(status, 200, "{body}");

    // Every watcher registers before the first append, so one without `from` starts at 0.
    let specs = watcher_specs(&mut rng);
    let mut watchers = Vec::new();
    for spec in specs.clone() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        watchers.push(tokio::spawn(run_watcher(
            api.clone(),
            addr,
            spec,
            tx,
            Some(0),
        )));
        rx.await.expect("the watcher registered");
    }

    // Two appenders; a late watcher joins with `from` once a first part is in.
    let a0 = tokio::spawn(appender(api.clone(), addr, 0, rng.next_u64(), batches));
    let a1 = tokio::spawn(appender(api.clone(), addr, 1, rng.next_u64(), batches));
    let mut late_from = 0;
    for _ in 0..10_000 {
        let t = api.topics().await;
        late_from = t["feed"]["next"].as_u64().unwrap();
        if late_from >= 30 || a0.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let late_from = late_from / 2;
    let late = Spec {
        name: format!("late SSE from {late_from}"),
        transport: Transport::Sse,
        tags: vec!["room:*", "x"],
        from: Some(late_from),
        drop_at: vec![5],
        resume: SseResume::LastEventId,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let late_task = tokio::spawn(run_watcher(
        api.clone(),
        addr,
        late.clone(),
        tx,
        Some(late_from),
    ));
    rx.await.expect("the late watcher registered");
    // More watchers join at random moments, with random filters and transports, half of
    // them with `from` (replay, then live), half without (from the next record).
    let mut joiners = Vec::new();
    let all_specs = watcher_specs(&mut rng);
    for k in 0..8 {
        tokio::time::sleep(std::time::Duration::from_millis(rng.below(40))).await;
        let next = api.topics().await["feed"]["next"].as_u64().unwrap();
        let mut spec = all_specs[rng.below(all_specs.len() as u64) as usize].clone();
        spec.from = rng.chance(50).then(|| rng.below(next + 1));
        spec.name = format!(
            "joiner {k} {:?} {:?} from {:?}",
            spec.transport, spec.tags, spec.from
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run_watcher(api.clone(), addr, spec.clone(), tx, spec.from));
        // Without `from` the watch starts where the server says (`watching` next): records
        // confirmed but not yet routed when it registered may come before or after that
        // point, so only the greeting decides what it must get.
        let start = rx.await.expect("the joiner registered");
        joiners.push((spec, task, start));
    }
    let late_ws = Spec {
        name: format!("late WS from {late_from}"),
        transport: Transport::Ws(Enc::MsgPack),
        ..late.clone()
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let late_ws_task = tokio::spawn(run_watcher(
        api.clone(),
        addr,
        late_ws.clone(),
        tx,
        Some(late_from),
    ));
    rx.await.expect("the late watcher registered");

    let mut appended: BTreeMap<u64, (Vec<String>, Value)> = BTreeMap::new();
    for task in [a0, a1] {
        for (offset, tags, data) in task.await.expect("an appender") {
            assert!(
                appended.insert(offset, (tags, data)).is_none(),
                "offset {offset} given twice"
            );
        }
    }
    // The end marker matches every filter of the test.
    let end_tags = vec![
        "user:1".to_string(),
        "room:1".to_string(),
        "x".to_string(),
        "nobody".to_string(),
    ];
    let (end, _) = api
        .append_ok(
            "feed",
            &json!([{"tags": end_tags, "data": {"end": true}}]),
            Some("fsync"),
        )
        .await;
    appended.insert(end, (end_tags, json!({"end": true})));
    let offsets: Vec<u64> = appended.keys().copied().collect();
    assert_eq!(
        offsets,
        (0..=end).collect::<Vec<_>>(),
        "offsets are dense from 0 (seed {seed})"
    );

    // Every record as the server keeps it, paged with random limits.
    let all = read_all(&api, "feed", &[], &mut rng).await;
    assert_eq!(all.len() as u64, end + 1, "seed {seed}");
    for r in &all {
        let (tags, data) = &appended[&r.offset];
        assert_eq!(
            (&r.tags, &r.data),
            (tags, data),
            "record {} read back (seed {seed})",
            r.offset
        );
    }
    assert!(
        all.windows(2).all(|w| w[0].ts <= w[1].ts),
        "ts never decreases"
    );
    let by_offset: BTreeMap<u64, Rec> = all.iter().map(|r| (r.offset, r.clone())).collect();

    let mut tasks: Vec<(Spec, tokio::task::JoinHandle<Vec<Rec>>, u64)> = specs
        .into_iter()
        .zip(watchers)
        .map(|(s, t)| (s, t, 0))
        .collect();
    tasks.push((late, late_task, late_from));
    tasks.push((late_ws, late_ws_task, late_from));
    tasks.extend(joiners);
    let mut delivered = 0;
    for (spec, task, from) in tasks {
        let got = task
            .await
            .unwrap_or_else(|e| panic!("watcher {}: {e} (seed {seed})", spec.name));
        let want: Vec<&Rec> = by_offset
            .range(from..)
            .map(|(_, r)| r)
            .filter(|r| filter_matches(&spec.tags, &r.tags))
            .collect();
        let got_offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
        let want_offsets: Vec<u64> = want.iter().map(|r| r.offset).collect();
        assert_eq!(
            got_offsets, want_offsets,
            "watcher {} {spec:?}: the offsets received vs the matching ones (seed {seed})",
            spec.name
        );
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                &g, w,
                "watcher {}: record {} (seed {seed})",
                spec.name, w.offset
            );
        }
        delivered += got.len();

        // A filtered read pages out the same records.
        let read = read_all(&api, "feed", &spec.tags, &mut rng).await;
        let read: Vec<&Rec> = read.iter().filter(|r| r.offset >= from).collect();
        assert_eq!(read, want, "read with {:?} (seed {seed})", spec.tags);
    }
    eprintln!(
        "seed {seed}: {} records appended, {delivered} delivered to the watchers",
        end + 1
    );

    horizon(&api, addr).await;

    // A graceful shutdown ends the watches with `shutting_down`.
    let mut sse = api
        .watch_sse("feed", None, &[], None)
        .await
        .expect("a watch");
    assert_eq!(sse.event().await.event, "watching");
    let mut ws = Ws::connect(addr, Enc::MsgPack).await;
    ws.send(json!({"id": 1, "type": "watch", "qid": "s", "topic": "feed"}))
        .await;
    assert_eq!(ws.until_reply(1).await.0["type"], "watching");
    server.signal_term();
    let ev = sse.event().await;
    assert_eq!(ev.event, "error", "{ev:?}");
    assert_eq!(ev.data["error"]["code"], "shutting_down", "{ev:?}");
    assert!(
        sse.next_event().await.is_none(),
        "the stream ends after its error"
    );
    // The WebSocket is closed (1001, docs/protocol.md); a watch error may come first.
    while let Some(m) = ws.next().await {
        assert_eq!(m["type"], "error", "after SIGTERM: {m}");
        assert_eq!(m["error"]["code"], "shutting_down", "{m}");
    }
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(
        !stderr.contains("panicked"),
        "the server logged a panic:\n{stderr}"
    );
}

/// Every record of `topic` matching `tags`, following `next` with random page sizes; checks
/// the paging rules on the way.
async fn read_all(api: &Api, topic: &str, tags: &[&str], rng: &mut Rng) -> Vec<Rec> {
    let mut out: Vec<Rec> = Vec::new();
    let mut from: Option<u64> = None;
    for _ in 0..100_000 {
        let limit = (1 + rng.below(50)).to_string();
        let from_s = from.map(|f| f.to_string());
        let mut params: Vec<(&str, &str)> = vec![("limit", &limit)];
        if let Some(f) = &from_s {
            params.push(("from", f));
        }
        for t in tags {
            params.push(("tag", t));
        }
        let (status, body) = api.read_records(topic, &params).await;
        assert_eq!(status, 200, "read {params:?}: {body}");
        assert_eq!(body["first"], 0, "nothing was trimmed: {body}");
        let page: Vec<Rec> = body["records"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(Rec::from_json)
            .collect();
        assert!(
            page.len() <= limit.parse().unwrap(),
            "a page holds at most limit records"
        );
        let next = body["next"].as_u64().unwrap_or_else(|| panic!("{body}"));
        if let Some(last) = page.last() {
            assert!(next > last.offset, "next is past the page: {body}");
        }
        for r in &page {
            assert!(filter_matches(tags, &r.tags), "{tags:?} read {r:?}");
            assert!(
                out.last().is_none_or(|l| l.offset < r.offset),
                "offset order: {body}"
            );
        }
        let empty = page.is_empty();
        out.extend(page);
        if empty {
            return out;
        }
        from = Some(next);
    }
    panic!("paging {topic} did not end");
}

/// Past retention: reads, watches from an old offset and resumes get `horizon` with `first`.
async fn horizon(api: &Api, addr: SocketAddr) {
    let (status, body) = api
        .put_topic("small", Some(&json!({"retain_records": 5})))
        .await;
    assert_eq!(status, 200, "{body}");
    // A watcher that saw offsets 0..=2 and then dropped.
    let mut sse = api
        .watch_sse("small", None, &[], None)
        .await
        .expect("a watch");
    assert_eq!(sse.event().await.event, "watching");
    for batch in 0..4 {
        let records: Vec<Value> = (0..5).map(|i| json!({"data": batch * 5 + i})).collect();
        api.append_ok("small", &json!(records), Some("disk")).await;
    }
    for want in 0..3u64 {
        let ev = sse.event().await;
        assert_eq!(
            (ev.event.as_str(), ev.id.clone()),
            ("record", Some(want.to_string())),
            "{ev:?}"
        );
    }
    drop(sse);
    let info = &api.topics().await["small"];
    assert_eq!(
        (&info["first"], &info["next"], &info["records"]),
        (&json!(15), &json!(20), &json!(5)),
        "{info}"
    );
    assert_eq!(info["retain_records"], 5, "{info}");

    let check = |what: &str, status: u16, body: &Value| {
        assert_eq!(status, 410, "{what}: {body}");
        assert_eq!(body["error"]["code"], "horizon", "{what}: {body}");
        let first = body["error"].get("first").or(body.get("first"));
        assert_eq!(
            first,
            Some(&json!(15)),
            "{what}: the oldest offset kept: {body}"
        );
    };
    let (status, body) = api.read_records("small", &[("from", "0")]).await;
    check("read from 0", status, &body);
    let (status, body) = api.read_records("small", &[("from", "14")]).await;
    check("read from 14", status, &body);
    let (status, body) = api.read_records("small", &[("from", "15")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["records"].as_array().map(Vec::len), Some(5), "{body}");
    let e = api
        .watch_sse("small", Some(3), &[], None)
        .await
        .err()
        .expect("refused");
    check("SSE watch from 3", e.0, &e.1);
    let e = api
        .watch_sse("small", None, &[], Some(2))
        .await
        .err()
        .expect("refused");
    check("SSE resume after 2", e.0, &e.1);
    let e = api
        .watch_sse("small", None, &["user:*"], Some(2))
        .await
        .err()
        .expect("refused");
    check("SSE filtered resume after 2", e.0, &e.1);
    // The resume point exactly at the horizon is fine.
    let mut sse = api
        .watch_sse("small", None, &[], Some(14))
        .await
        .expect("a resume at first");
    let ev = sse.event().await;
    assert_eq!(
        (ev.event.as_str(), &ev.data["next"]),
        ("watching", &json!(15)),
        "{ev:?}"
    );
    let ev = sse.event().await;
    assert_eq!(ev.id.as_deref(), Some("15"), "{ev:?}");

    for enc in [Enc::Json, Enc::MsgPack] {
        let mut ws = Ws::connect(addr, enc).await;
        ws.send(json!({"id": 1, "type": "watch", "qid": "h", "topic": "small", "from": 2}))
            .await;
        let (reply, _) = ws.until_reply(1).await;
        assert_eq!(reply["type"], "error", "{enc:?}: {reply}");
        assert_eq!(reply["error"]["code"], "horizon", "{enc:?}: {reply}");
        let first = reply["error"].get("first").or(reply.get("first"));
        assert_eq!(first, Some(&json!(15)), "{enc:?}: {reply}");
        // The connection stays usable: a watch from the horizon replays the kept records.
        ws.send(json!({"id": 2, "type": "watch", "qid": "h", "topic": "small", "from": 15}))
            .await;
        let (reply, _) = ws.until_reply(2).await;
        assert_eq!(
            (&reply["type"], &reply["next"]),
            (&json!("watching"), &json!(15)),
            "{reply}"
        );
        for want in 15..20u64 {
            let m = ws.next().await.expect("a record");
            assert_eq!(
                (&m["type"], &m["offset"]),
                (&json!("record"), &json!(want)),
                "{m}"
            );
        }
        ws.close().await;
    }

    // Dropping the topic ends its watches with `not_found`.
    let mut sse = api
        .watch_sse("small", None, &[], None)
        .await
        .expect("a watch");
    assert_eq!(sse.event().await.event, "watching");
    let mut ws = Ws::connect(addr, Enc::Json).await;
    ws.send(json!({"id": 1, "type": "watch", "qid": "d", "topic": "small"}))
        .await;
    let (reply, _) = ws.until_reply(1).await;
    assert_eq!(reply["type"], "watching", "{reply}");
    let (status, body) = api.delete_topic("small").await;
    assert_eq!(status, 200, "{body}");
    let ev = sse.event().await;
    assert_eq!(ev.event, "error", "{ev:?}");
    assert_eq!(ev.data["error"]["code"], "not_found", "{ev:?}");
    assert!(
        sse.next_event().await.is_none(),
        "the stream ends after its error"
    );
    let m = ws.next().await.expect("an error message");
    assert_eq!(
        (&m["type"], &m["qid"]),
        (&json!("error"), &json!("d")),
        "{m}"
    );
    assert_eq!(m["error"]["code"], "not_found", "{m}");
    ws.close().await;
}
