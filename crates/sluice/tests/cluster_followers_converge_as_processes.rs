//! A 3-node NATS JetStream cluster (R3) and three `sluice serve` processes — a leader and
//! two followers — on loopback. Clients write at random over HTTP and WebSocket in every
//! durability class (`memory`, `disk`, `fsync`, `replicated`), with a schema change among
//! the writes. Live views — a filter, an aggregate, a top-k and a join — are subscribed on
//! every node over WebSocket before the writes and again while they run. In the end every
//! follower's schema, rows and whole changelog (`/v1/changes`) equal the leader's, and every
//! view on every node equals the leader's and a one-shot query of the same SQL (its
//! checksum recomputed by the client at every event and compared with the server's).

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cluster::*;
use common::{seed, Api, Rng, Server, TempDir};
use serde_json::json;
use sluice_cluster::testkit::NatsCluster;

const VIEWS: &[&str] = &[
    "SELECT * FROM items WHERE room = 1",
    "SELECT room, COUNT(*) AS n, SUM(qty) AS total FROM items GROUP BY room",
    "SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 5",
    "SELECT i.id, i.qty, r.name FROM items i JOIN rooms r ON i.room = r.id",
];

/// Writes per client; three clients over HTTP and one over WebSocket.
const WRITES_PER_CLIENT: u64 = 120;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_followers_converge_as_processes() {
    let seed = seed("cluster_followers_converge_as_processes");
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let tmp = TempDir::new("cluster-converge");
    let urls = nats.urls();
    let leader_args = cluster_args(&urls, "converge", false);
    let follower_args = cluster_args(&urls, "converge", true);
    let leader = Server::start(&tmp.join("leader"), tmp.path(), &as_strs(&leader_args));
    let api = leader.api();
    api.sql(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, \
         qty INTEGER NOT NULL, note TEXT); \
         CREATE TABLE rooms (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
    )
    .await;
    api.mutate(json!((0..4)
        .map(|r| json!({"op": "insert", "table": "rooms", "row": {"id": r, "name": format!("room {r}")}}))
        .collect::<Vec<_>>()))
    .await;
    let f1 = Server::start(&tmp.join("f1"), tmp.path(), &as_strs(&follower_args));
    let f2 = Server::start(&tmp.join("f2"), tmp.path(), &as_strs(&follower_args));
    let nodes = [&leader, &f1, &f2];
    let apis: Vec<Api> = nodes.iter().map(|n| n.api()).collect();
    let start = api.health_seq().await;
    for (i, a) in apis.iter().enumerate().skip(1) {
        wait_node_seq(a, start, &format!("follower {i} before the writes")).await;
    }

    // Views on every node before the writes.
    let mut before = Vec::new();
    for n in nodes {
        let mut v = Views::connect(&n.base_url()).await;
        for (q, sql) in VIEWS.iter().enumerate() {
            v.subscribe(q as u64, sql, None).await;
        }
        v.wait_all_at(start, &format!("{}: first snapshots", n.base_url()))
            .await;
        before.push(v);
    }

    // Four clients write at random in every class; three over HTTP, one over WebSocket.
    let acked = Arc::new(AtomicU64::new(0));
    let altered = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..4u64 {
        let (api, acked, altered) = (api.clone(), acked.clone(), altered.clone());
        let base = leader.base_url();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ (client + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut ws = if client == 3 {
                Some(WsWriter::connect(&base).await)
            } else {
                None
            };
            for n in 0..WRITES_PER_CLIENT {
                let body = random_write(&mut rng, n, altered.load(Ordering::Relaxed));
                let ok = match &mut ws {
                    None => {
                        let (status, reply) = api.post("/v1/mutate", &body).await;
                        assert!(
                            status == 200 || expected_refusal(status, &reply),
                            "{body}: {status} {reply}"
                        );
                        status == 200
                    }
                    Some(ws) => {
                        let reply = ws.mutate(&body).await;
                        assert!(
                            reply["type"] == "result" || expected_refusal(400, &reply),
                            "{body}: {reply}"
                        );
                        reply["type"] == "result"
                    }
                };
                if ok {
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // While they write: the schema change, then the same views subscribed again.
    let deadline = std::time::Instant::now() + CONVERGE_TIMEOUT;
    while acked.load(Ordering::Relaxed) < 60 {
        assert!(std::time::Instant::now() < deadline, "the writers stalled");
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    api.sql("ALTER TABLE items ADD COLUMN tag TEXT").await;
    altered.store(true, Ordering::Relaxed);
    let mut during = Vec::new();
    for n in nodes {
        let mut v = Views::connect(&n.base_url()).await;
        for (q, sql) in VIEWS.iter().enumerate() {
            v.subscribe(q as u64, sql, None).await;
        }
        during.push(v);
    }
    for t in tasks {
        t.await.expect("a writer");
    }
    let acked = acked.load(Ordering::Relaxed);
    assert!(acked > 100, "most writes commit ({acked})");

    // A last write that changes every view, so each reaches the final seq by a diff.
    let last = api
        .mutate(json!([{"op": "upsert", "table": "items",
                        "row": {"id": 1000, "room": 1, "qty": 5000, "note": "last"}}]))
        .await["seq"]
        .as_u64()
        .unwrap();
    for (i, a) in apis.iter().enumerate().skip(1) {
        wait_node_seq(a, last, &format!("follower {i}")).await;
    }

    let want = state(&apis[0], &["items", "rooms"]).await;
    eprintln!(
        "{acked} writes acknowledged, last seq {last}, {} changelog entries compared",
        want.changes.len()
    );
    assert!(
        want.changes.iter().any(|c| c["op"] == "schema"),
        "the changelog holds the schema change"
    );
    for (i, a) in apis.iter().enumerate().skip(1) {
        let got = state(a, &["items", "rooms"]).await;
        assert_same_state(&want, &got, &format!("follower {i}"));
    }

    let mut leader_sums = None;
    for (i, views) in before.iter_mut().chain(during.iter_mut()).enumerate() {
        let node = i % 3;
        let what = format!(
            "node {node} ({}), views opened {}",
            views.base,
            if i < 3 {
                "before the writes"
            } else {
                "during them"
            }
        );
        views.wait_all_at(last, &what).await;
        let sums = views.check(&apis[node], &what).await;
        match &leader_sums {
            None => leader_sums = Some(sums),
            Some(want) => assert_eq!(&sums, want, "{what}: the views differ from the leader's"),
        }
        // The views opened before the writes saw the schema change as a reset snapshot.
        if i < 3 {
            views.with(0, |l| {
                assert!(
                    l.events.iter().any(|e| e.reset),
                    "{what}: no reset after the schema change: {:?}",
                    l.events
                )
            });
        }
    }
    drop((before, during));
    drop((f1, f2, leader));
}
