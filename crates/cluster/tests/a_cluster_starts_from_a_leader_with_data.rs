//! A database that already holds commits becomes a cluster's leader: the new stream starts
//! after them (its base is recorded beside it: commit seq = stream seq + base), the leader
//! stores its snapshot of them, a new follower starts from that snapshot and then follows
//! the stream — the same rows, changelog and live views as the leader.

mod common;

use common::*;
use serde_json::json;
use sluice_cluster::backbone::Backbone;
use sluice_cluster::snapshots::Start;
use sluice_cluster::testkit::NatsCluster;
use sluice_log::Durability;
use sluice_server::{Config, Core, Op};

fn upsert(id: u64, qty: u64) -> Op {
    Op::Upsert {
        table: "t".into(),
        row: json!({"id": id, "qty": qty}).as_object().unwrap().clone(),
        if_version: None,
    }
}

const VIEW: &str = "SELECT id, qty FROM t WHERE qty > 10 ORDER BY qty DESC, id LIMIT 7";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_starts_from_a_leader_with_data() {
    let dirs: Vec<TempDir> = (0..2).map(|i| TempDir::new(&format!("based{i}"))).collect();
    // A standalone database with 31 commits.
    let local_last = {
        let dir = dirs[0].path().to_path_buf();
        let core = tokio::task::spawn_blocking(move || Core::open(Config::new(dir)))
            .await
            .unwrap()
            .unwrap();
        ddl(
            &core,
            "CREATE TABLE t (id INTEGER PRIMARY KEY, qty INTEGER NOT NULL)",
        )
        .await;
        let mut last = 0;
        for id in 0..30 {
            last = core
                .mutate(vec![upsert(id, id * 3)], Some(Durability::Fsync))
                .await
                .unwrap()
                .seq;
        }
        core.shutdown().await.unwrap();
        last
    };
    assert_eq!(local_last, 31);

    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let opts = cluster_options(&nats.urls(), "based");
    let leader = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("a leader with data starts the cluster");
    let log = backbone(&opts).await;
    let state = log.state().await.unwrap();
    assert_eq!(
        (state.first_seq, state.last_seq),
        (local_last + 1, local_last),
        "the stream starts after the leader's commits"
    );
    // Its snapshot of them, stored when it started leading.
    assert!(wait_stored_snapshot(&opts, local_last).await >= local_last);

    // Commits after the base go to the stream at their own seqs.
    let mut last = 0;
    for id in 25..40 {
        last = leader
            .core
            .mutate(vec![upsert(id, id * 5)], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    assert_eq!(last, local_last + 15);
    let state = log.state().await.unwrap();
    assert_eq!((state.first_seq, state.last_seq), (local_last + 1, last));
    assert_eq!(log.entry(last).await.unwrap().seq, last);

    let (start, follower) = start_prepared_follower(dirs[1].path(), opts.clone())
        .await
        .expect("a follower");
    let Start::Snapshot { seq, .. } = start else {
        panic!("the follower starts from the leader's snapshot, got {start:?}");
    };
    assert!((local_last..=last).contains(&seq), "{seq}");
    assert_same_state(&leader.core, &follower.core, "t", last, "the follower").await;
    for id in 40..50 {
        last = leader
            .core
            .mutate(vec![upsert(id, id)], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    assert_same_state(&leader.core, &follower.core, "t", last, "the follower").await;
    let mut on_leader = LiveView::open(&leader.url(), VIEW).await;
    let mut on_follower = LiveView::open(&follower.url(), VIEW).await;
    assert_eq!(
        on_follower.checksum_at(last).await,
        on_leader.checksum_at(last).await,
        "the view on the follower"
    );
    drop((on_leader, on_follower));
    follower.close().await;
    leader.close().await;
}
