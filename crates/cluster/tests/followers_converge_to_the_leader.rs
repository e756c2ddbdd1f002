//! A 3-node NATS JetStream cluster (R3), a Sluice leader and two followers: random writes
//! in every durability class (and a schema change among them) from concurrent clients;
//! every follower converges to the leader's state — the same rows, the same changelog
//! (seqs and encoded commits), the same live views (checksums at the last seq, reached
//! through each node's own diffs) — and a write sent to a follower is refused naming the
//! leader. A follower restarted mid-stream and a follower added after the writes catch up
//! exactly.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Map, Value};
use sluice_cluster::testkit::NatsCluster;
use sluice_log::Durability;
use sluice_server::{CoreError, Op};

const VIEWS: &[&str] = &[
    "SELECT * FROM items WHERE room = 1",
    "SELECT room, COUNT(*) AS n, SUM(qty) AS total FROM items GROUP BY room",
    "SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 5",
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn row(id: u64, room: u64, qty: u64) -> Map<String, Value> {
    json!({"id": id, "room": room, "qty": qty, "note": format!("n{qty}")})
        .as_object()
        .unwrap()
        .clone()
}

fn random_op(rng: &mut Rng) -> Op {
    let id = rng.below(60);
    match rng.below(4) {
        0 => Op::Upsert {
            table: "items".into(),
            row: row(id, rng.below(4), rng.below(1000)),
            if_version: None,
        },
        1 => Op::Insert {
            table: "items".into(),
            row: row(id, rng.below(4), rng.below(1000)),
            if_version: None,
        },
        2 => Op::Patch {
            table: "items".into(),
            id: json!(id),
            set: json!({"qty": rng.below(1000)}).as_object().unwrap().clone(),
            if_version: None,
        },
        _ => Op::Delete {
            table: "items".into(),
            id: json!(id),
            if_version: None,
        },
    }
}

const CLASSES: [Durability; 4] = [
    Durability::Memory,
    Durability::Disk,
    Durability::Fsync,
    Durability::Replicated,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_converge_to_the_leader() {
    let seed = std::env::var("SLUICE_CLUSTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x005e_edc1_u64);
    eprintln!("seed {seed} (SLUICE_CLUSTER_SEED)");
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let opts = cluster_options(&nats.urls(), "converge");
    let dirs: Vec<TempDir> = (0..4).map(|i| TempDir::new(&format!("node{i}"))).collect();

    let leader = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("the leader");
    ddl(&leader.core, "CREATE TABLE items (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, qty INTEGER NOT NULL, note TEXT)").await;
    let f1 = start_node(dirs[1].path(), opts.clone(), true)
        .await
        .expect("follower 1");
    let mut f2 = Some(
        start_node(dirs[2].path(), opts.clone(), true)
            .await
            .expect("follower 2"),
    );
    let ddl_seq = leader.core.db().seq;
    wait_confirmed(&f1.core, ddl_seq, "follower 1").await;

    // A second leader is refused, naming the first.
    let d = TempDir::new("second");
    match start_node(d.path(), opts.clone(), false).await {
        Err(e) => assert!(e.to_string().contains(&leader.url()), "{e}"),
        Ok(_) => panic!("a second leader must be refused"),
    }

    // Live views on every node, opened before the writes: each follows its own diffs.
    let mut views = Vec::new();
    for node in [&leader, &f1, f2.as_ref().unwrap()] {
        let mut vs = Vec::new();
        for sql in VIEWS {
            vs.push(LiveView::open(&node.url(), sql).await);
        }
        views.push(vs);
    }

    // A write sent to a follower is refused, naming the leader.
    let refused = f1
        .core
        .mutate(
            vec![Op::Upsert {
                table: "items".into(),
                row: row(1, 1, 1),
                if_version: None,
            }],
            None,
        )
        .await;
    match refused {
        Err(CoreError::NotLeader { leader: Some(addr) }) => assert_eq!(addr, leader.url()),
        other => panic!("a follower must refuse writes naming the leader, got {other:?}"),
    }
    let over_http = http()
        .post(format!("{}/v1/mutate", f1.url()))
        .json(&json!({"ops": [{"op": "upsert", "table": "items", "row": {"id": 1, "room": 1, "qty": 1}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(over_http.status(), 503);
    let body: Value = over_http.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_leader");
    assert_eq!(body["error"]["leader"], leader.url());

    // Random writes in every class from 4 concurrent clients; follower 2 is stopped and
    // restarted half-way through.
    let mut tasks = Vec::new();
    for client in 0..4u64 {
        let core = leader.core.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(seed ^ (client + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut acked = 0;
            for _ in 0..120 {
                let ops = (0..1 + rng.below(3)).map(|_| random_op(&mut rng)).collect();
                let class = CLASSES[rng.below(4) as usize];
                match core.mutate(ops, Some(class)).await {
                    Ok(_) => acked += 1,
                    Err(CoreError::Tx(_)) => {}
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    f2.take().unwrap().close().await;
    ddl(&leader.core, "ALTER TABLE items ADD COLUMN tag TEXT").await;
    let f2 = start_node(dirs[2].path(), opts.clone(), true)
        .await
        .expect("follower 2 again");
    let mut acked = 0;
    for t in tasks {
        acked += t.await.unwrap();
    }
    assert!(acked > 100, "most writes commit ({acked})");
    // A last write that every view sees, so each view reaches the final seq by a diff.
    let last = leader
        .core
        .mutate(
            vec![Op::Upsert {
                table: "items".into(),
                row: row(1_000, 1, 5_000),
                if_version: None,
            }],
            Some(Durability::Replicated),
        )
        .await
        .expect("the last write")
        .seq;

    // A follower added now starts from the stream's beginning and catches up.
    let f3 = start_node(dirs[3].path(), opts.clone(), true)
        .await
        .expect("follower 3");
    for (name, f) in [
        ("follower 1", &f1),
        ("follower 2", &f2),
        ("follower 3", &f3),
    ] {
        wait_confirmed(&f.core, last, name).await;
        assert_eq!(
            f.core.db().seq,
            last,
            "{name} applied exactly the leader's commits"
        );
    }
    let want_rows = dump(&leader.core, "items").await;
    let want_log = changelog(&leader.core);
    assert_eq!(want_log.last().unwrap().0, last);
    for (name, f) in [
        ("follower 1", &f1),
        ("follower 2", &f2),
        ("follower 3", &f3),
    ] {
        assert_eq!(dump(&f.core, "items").await, want_rows, "{name}'s rows");
        let log = changelog(&f.core);
        let overlap: Vec<_> = want_log
            .iter()
            .filter(|(s, _)| log.iter().any(|(t, _)| t == s))
            .collect();
        assert!(!overlap.is_empty());
        for (seq, bytes) in overlap {
            let theirs = &log.iter().find(|(t, _)| t == seq).unwrap().1;
            assert_eq!(theirs, bytes, "{name}'s commit {seq}");
        }
    }
    let mut sums = Vec::new();
    for vs in views.iter_mut().take(2) {
        let mut node_sums = Vec::new();
        for v in vs.iter_mut() {
            node_sums.push(v.checksum_at(last).await);
        }
        sums.push(node_sums);
    }
    assert_eq!(sums[0], sums[1], "follower 1's views equal the leader's");
    // Follower 2's first views ended with its restart; views opened on its new life
    // (and on follower 3) must equal the leader's too.
    for node in [&f2, &f3] {
        for (i, sql) in VIEWS.iter().enumerate() {
            let mut v = LiveView::open(&node.url(), sql).await;
            assert_eq!(
                v.checksum_at(last).await,
                sums[0][i],
                "{sql} on {}",
                node.url()
            );
        }
    }
    drop(views);
    f3.close().await;
    f2.close().await;
    f1.close().await;
    leader.close().await;
}
