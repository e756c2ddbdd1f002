//! A follower (`sluice serve --cluster … --follower`) killed with `kill -9` while the
//! leader keeps taking writes in every durability class, then restarted on its own data
//! dir: it catches up exactly — schema, rows and the whole changelog equal the leader's, its
//! live views equal the leader's and a one-shot query. A client that held live views on it
//! reconnects and resumes each from the last seq it applied: what follows is a `reset`
//! snapshot at or after that seq (a restarted server has no diff history to resume from,
//! docs/protocol.md "Resume") and then a diff for every later commit, none twice, none
//! skipped — checked exactly on a view that every commit changes.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::*;
use common::{seed, Api, Rng, Server, TempDir};
use serde_json::json;
use sluice_cluster::testkit::NatsCluster;

/// Every commit of the writers changes this view (each write sets a fresh `seq_no`).
const ALL: &str = "SELECT * FROM items";
const VIEWS: &[&str] = &[
    ALL,
    "SELECT * FROM items WHERE room = 1",
    "SELECT room, COUNT(*) AS n, SUM(qty) AS total FROM items GROUP BY room",
    "SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 5",
];
const WRITERS: u64 = 2;

async fn wait_acked(acked: &AtomicU64, at_least: u64, what: &str) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while acked.load(Ordering::Relaxed) < at_least {
        assert!(
            Instant::now() < deadline,
            "{what}: only {} writes acknowledged",
            acked.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_follower_killed_catches_up_exactly() {
    let seed = seed("cluster_follower_killed_catches_up_exactly");
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let tmp = TempDir::new("cluster-follower-killed");
    let urls = nats.urls();
    let leader_args = cluster_args(&urls, "killed", false);
    let follower_args = cluster_args(&urls, "killed", true);
    let leader = Server::start(&tmp.join("leader"), tmp.path(), &as_strs(&leader_args));
    let api = leader.api();
    api.sql(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, \
         qty INTEGER NOT NULL, seq_no INTEGER NOT NULL)",
    )
    .await;
    let follower_dir = tmp.join("follower");
    let follower = Server::start(&follower_dir, tmp.path(), &as_strs(&follower_args));
    let start = api.health_seq().await;
    wait_node_seq(&follower.api(), start, "the follower before the writes").await;

    // The same views on the leader and on the follower, before the writes.
    let mut on_leader = Views::connect(&leader.base_url()).await;
    let mut client = Views::connect(&follower.base_url()).await;
    for (q, sql) in VIEWS.iter().enumerate() {
        on_leader.subscribe(q as u64, sql, None).await;
        client.subscribe(q as u64, sql, None).await;
    }
    on_leader.wait_all_at(start, "the leader's snapshots").await;
    client.wait_all_at(start, "the follower's snapshots").await;

    // Continuous writers on the leader, every class, every write a change of `ALL`.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let stamp = Arc::new(AtomicU64::new(1));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (api, stop, acked, stamp) = (api.clone(), stop.clone(), acked.clone(), stamp.clone());
        tasks.push(tokio::spawn(async move {
            const CLASSES: [&str; 4] = ["memory", "disk", "fsync", "replicated"];
            let mut rng = Rng::new(seed ^ (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            while !stop.load(Ordering::Relaxed) {
                let id = rng.below(200);
                let body = json!({"ops": [{"op": "upsert", "table": "items", "row": {
                    "id": id, "room": rng.below(4), "qty": rng.below(1000),
                    "seq_no": stamp.fetch_add(1, Ordering::Relaxed)}}],
                    "durability": CLASSES[rng.below(4) as usize]});
                let (status, reply) = api.post("/v1/mutate", &body).await;
                assert_eq!(status, 200, "{body}: {reply}");
                acked.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    wait_acked(&acked, 150, "before the kill").await;
    // The client has applied some of those commits on the follower.
    client
        .wait("the follower's views follow the writes", |v| {
            v.get(&0).is_some_and(|l| l.events.len() > 20)
        })
        .await;

    let pid = follower.pid();
    follower.kill9();
    client.wait_closed("the killed follower's connection").await;
    let resume_from: Vec<(u64, u64)> = client.qids().iter().map(|&q| (q, client.seq(q))).collect();
    let before_kill = client.with(0, |l| l.events.clone());
    // Every commit between the first snapshot and the kill reached the client as one diff.
    for w in before_kill.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1, "a gap before the kill: {w:?}");
    }
    let killed_at = acked.load(Ordering::Relaxed);
    wait_acked(&acked, killed_at + 150, "while the follower is down").await;

    // Restarted on its own data dir, while the writers go on.
    let follower = Server::start(&follower_dir, tmp.path(), &as_strs(&follower_args));
    assert_ne!(follower.pid(), pid);
    let mut resumed = Views::connect(&follower.base_url()).await;
    for &(q, since) in &resume_from {
        resumed.subscribe(q, VIEWS[q as usize], Some(since)).await;
    }
    let restarted_at = acked.load(Ordering::Relaxed);
    wait_acked(&acked, restarted_at + 150, "after the restart").await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("the writers stop")
            .expect("a writer");
    }
    // A last write that changes every view.
    let last = api
        .mutate(json!([{"op": "upsert", "table": "items",
                        "row": {"id": 1000, "room": 1, "qty": 5000, "seq_no": 0}}]))
        .await["seq"]
        .as_u64()
        .unwrap();
    let fapi: Api = follower.api();
    wait_node_seq(&fapi, last, "the restarted follower").await;
    let want = state(&api, &["items"]).await;
    let got = state(&fapi, &["items"]).await;
    assert_same_state(&want, &got, "the restarted follower");

    on_leader.wait_all_at(last, "the leader's views").await;
    resumed.wait_all_at(last, "the resumed views").await;
    let want_sums = on_leader.check(&api, "the leader's views").await;
    let sums = resumed.check(&fapi, "the resumed views").await;
    assert_eq!(
        sums, want_sums,
        "the resumed views differ from the leader's"
    );

    // Resumed exactly: a reset snapshot at or after the last applied seq, then one diff per
    // commit (every commit changes `ALL`), none twice, none skipped.
    for &(q, since) in &resume_from {
        resumed.with(q, |l| {
            let first = l.events[0];
            assert!(
                first.snapshot && first.reset && first.seq >= since,
                "view {q} resumed from {since} with {first:?}"
            );
            assert!(
                l.events[1..].iter().all(|e| !e.snapshot),
                "view {q}: a second snapshot"
            );
        });
    }
    resumed.with(0, |l| {
        let seqs: Vec<u64> = l.events.iter().map(|e| e.seq).collect();
        let want: Vec<u64> = (seqs[0]..=last).collect();
        assert_eq!(seqs, want, "the resumed view missed or repeated a commit");
        eprintln!(
            "resumed from seq {} with a reset snapshot at {}, then {} diffs to {last}; {} diffs before the kill",
            resume_from[0].1,
            seqs[0],
            seqs.len() - 1,
            before_kill.len() - 1
        );
    });
    drop((client, resumed, on_leader));
    drop((follower, leader));
}
