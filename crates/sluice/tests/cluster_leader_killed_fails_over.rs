//! `kill -9` of a cluster leader under `replicated` writers: three `sluice serve`
//! processes (a leader, two followers) over a real 3-node NATS JetStream cluster on
//! loopback. After the kill a follower takes the lapsed lease; clients that retry (on a
//! refused connection, or on `not_leader`, which names the leader) reach it; every write
//! acknowledged as `replicated` — before the kill or after — is on the new leader and on
//! the other follower, and nothing that was never sent appears. Then a NATS node is killed
//! under the same writers, and still no acknowledged write is lost.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Api, Server, TempDir};
use serde_json::{json, Value};
use sluice_cluster::testkit::NatsCluster;

const WRITERS: u64 = 4;

struct Shared {
    nodes: Vec<String>,
    attempted: Mutex<BTreeSet<u64>>,
    acked: Mutex<BTreeSet<u64>>,
    acked_count: AtomicU64,
    stop: AtomicBool,
    /// When the first write after the kill was acknowledged (ms since the kill).
    first_ack_after_kill_ms: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
}

async fn writer(k: u64, shared: Arc<Shared>) {
    let apis: Vec<Api> = shared.nodes.iter().map(|n| Api::new(n)).collect();
    let mut target = 0usize;
    let mut i = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        i += 1;
        let id = k * 1_000_000 + i;
        shared.attempted.lock().unwrap().insert(id);
        let body = json!({"ops": [{"op": "upsert", "table": "t", "row": {"id": id, "v": i}}],
                          "durability": "replicated"});
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                Instant::now() < deadline,
                "write {id} found no leader in 30 s"
            );
            match apis[target].try_post("/v1/mutate", &body).await {
                Ok((200, _)) => {
                    shared.acked.lock().unwrap().insert(id);
                    shared.acked_count.fetch_add(1, Ordering::Relaxed);
                    // Node 0 is the killed leader: an ack from it raced the kill.
                    let killed = *shared.killed_at.lock().unwrap();
                    if let (Some(at), true) = (killed, target != 0) {
                        let ms = at.elapsed().as_millis() as u64;
                        let _ = shared.first_ack_after_kill_ms.compare_exchange(
                            u64::MAX,
                            ms,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                    }
                    break;
                }
                Ok((503, e)) if e["error"]["code"] == "not_leader" => {
                    match e["error"]["leader"]
                        .as_str()
                        .and_then(|l| shared.nodes.iter().position(|n| n == l))
                    {
                        Some(named) if named != target => target = named,
                        _ => {
                            target = (target + 1) % apis.len();
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                // The leader is gone (refused connection), or replication failed there:
                // the write's fate is unknown; retrying the same upsert is safe.
                _ => {
                    target = (target + 1) % apis.len();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    let _ = k;
}

async fn ids(api: &Api) -> BTreeSet<u64> {
    let (status, v) = api
        .post("/v1/query", &json!({"sql": "SELECT id FROM t"}))
        .await;
    assert_eq!(status, 200, "{v}");
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r {
            Value::Array(a) => a[0].as_u64().unwrap(),
            o => o["id"].as_u64().unwrap(),
        })
        .collect()
}

async fn seq(api: &Api) -> Option<u64> {
    let resp = api.client.get(api.url("/health")).send().await.ok()?;
    let v: Value = resp.json().await.ok()?;
    v["seq"].as_u64()
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

async fn wait_acks(shared: &Shared, at_least: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while shared.acked_count.load(Ordering::Relaxed) < at_least {
        assert!(
            Instant::now() < deadline,
            "{what}: only {} acks",
            shared.acked_count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_leader_killed_fails_over() {
    let mut nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let tmp = TempDir::new("cluster-failover");
    let urls = nats.urls();
    let base = [
        "--cluster",
        urls.as_str(),
        "--cluster-database",
        "failover",
        // The default lease. Renewals fail while NATS elects new stream leaders after
        // losing a node, and the leader steps down after 3/4 of the lease: on a loaded
        // machine that can happen (handled below).
        "--lease-ms",
        "3000",
    ];
    let leader = Server::start(&tmp.join("leader"), tmp.path(), &base);
    let (status, v) = leader
        .api()
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let follower_args: Vec<&str> = base.iter().copied().chain(["--follower"]).collect();
    let f1 = Server::start(&tmp.join("f1"), tmp.path(), &follower_args);
    let f2 = Server::start(&tmp.join("f2"), tmp.path(), &follower_args);

    // A second leader is refused with a clear error naming the first.
    let (status, stderr) = Server::start_expecting_failure(&tmp.join("second"), tmp.path(), &base);
    assert!(!status.success());
    assert!(
        stderr.contains("another leader holds the lease") && stderr.contains(&leader.base_url()),
        "{stderr}"
    );

    let shared = Arc::new(Shared {
        nodes: vec![leader.base_url(), f1.base_url(), f2.base_url()],
        attempted: Mutex::new(BTreeSet::new()),
        acked: Mutex::new(BTreeSet::new()),
        acked_count: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        first_ack_after_kill_ms: AtomicU64::new(u64::MAX),
        killed_at: Mutex::new(None),
    });
    let tasks: Vec<_> = (0..WRITERS)
        .map(|k| tokio::spawn(writer(k, shared.clone())))
        .collect();
    wait_acks(&shared, 200, "before the kill").await;

    *shared.killed_at.lock().unwrap() = Some(Instant::now());
    let before_kill = shared.acked_count.load(Ordering::Relaxed);
    leader.kill9();
    wait_acks(&shared, before_kill + 200, "after the kill").await;
    let failover_ms = shared.first_ack_after_kill_ms.load(Ordering::Relaxed);
    eprintln!("failover: first write acknowledged {failover_ms} ms after kill -9 (lease 3000 ms)");

    // A NATS node killed under the writers loses nothing acknowledged either.
    nats.kill(0);
    let after_nats = shared.acked_count.load(Ordering::Relaxed);
    wait_acks(&shared, after_nats + 200, "after a NATS node was killed").await;
    shared.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(40), t)
            .await
            .expect("writers stop")
            .unwrap();
    }

    // A leader whose lease renewals kept failing while the NATS cluster recovered from the
    // lost node (slow on a loaded machine) steps down and takes no more writes; the other
    // node takes over. The documented way back is a restart with `--follower
    // --discard-diverged` (docs/operations.md, "Failover"): every write here is
    // `replicated`, so what it may discard was never acknowledged, and the checks below
    // still hold for it.
    let mut nodes = [Some(f1), Some(f2)];
    for (i, node) in nodes.iter_mut().enumerate() {
        let deposed = node
            .as_ref()
            .is_some_and(|n| n.stderr().contains("lost the leader lease"));
        if deposed {
            let name = ["f1", "f2"][i];
            eprintln!(
                "{name} stepped down while a NATS node was down: restarting it as a follower"
            );
            drop(node.take());
            let args: Vec<&str> = follower_args
                .iter()
                .copied()
                .chain(["--discard-diverged"])
                .collect();
            *node = Some(Server::start(&tmp.join(name), tmp.path(), &args));
        }
    }
    let [Some(f1), Some(f2)] = nodes else {
        unreachable!("both nodes run")
    };
    let (a1, a2) = (f1.api(), f2.api());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s1, s2) = (seq(&a1).await, seq(&a2).await);
        if s1.is_some() && s1 == s2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two nodes did not converge: {s1:?} vs {s2:?}\n--- f1:\n{}\n--- f2:\n{}",
            tail(&f1.stderr()),
            tail(&f2.stderr())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acked = shared.acked.lock().unwrap().clone();
    let attempted = shared.attempted.lock().unwrap().clone();
    for api in [&a1, &a2] {
        let present = ids(api).await;
        let lost: Vec<_> = acked.difference(&present).take(10).collect();
        assert!(
            lost.is_empty(),
            "{}: acknowledged writes lost: {lost:?}",
            api.base
        );
        let phantom: Vec<_> = present.difference(&attempted).take(10).collect();
        assert!(
            phantom.is_empty(),
            "{}: writes that were never sent: {phantom:?}",
            api.base
        );
    }
    drop(f1);
    drop(f2);
}
