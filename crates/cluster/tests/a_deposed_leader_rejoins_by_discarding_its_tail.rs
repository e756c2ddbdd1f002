//! A deposed leader whose log holds commits the cluster's stream does not (written after
//! it lost the lease) cannot follow: without `discard_diverged` it is refused naming the
//! seq, its data left as it was; with it, its log and snapshots are moved aside (kept, not
//! deleted) and it starts from the new leader's stored snapshot and the stream's tail,
//! ending with exactly the new leader's state.

mod common;

use common::*;
use serde_json::json;
use sluice_cluster::snapshots::Start;
use sluice_cluster::testkit::NatsCluster;
use sluice_cluster::ClusterError;
use sluice_log::Durability;
use sluice_server::{Config, Core, Op};

fn upsert(id: u64, note: &str) -> Op {
    Op::Upsert {
        table: "t".into(),
        row: json!({"id": id, "note": note}).as_object().unwrap().clone(),
        if_version: None,
    }
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposed_leader_rejoins_by_discarding_its_tail() {
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let mut opts = cluster_options(&nats.urls(), "deposed");
    // A snapshot is stored every 10 commits, so the new leader's is recent.
    opts.snapshot_commits = Some(10);
    let dirs: Vec<TempDir> = (0..2)
        .map(|i| TempDir::new(&format!("deposed{i}")))
        .collect();

    // Leader A and follower B agree up to `agreed`.
    let a = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("leader A");
    ddl(
        &a.core,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, note TEXT)",
    )
    .await;
    let (_, b) = start_prepared_follower(dirs[1].path(), opts.clone())
        .await
        .expect("follower B");
    let mut agreed = 0;
    for id in 0..20 {
        agreed = a
            .core
            .mutate(vec![upsert(id, "a")], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    wait_confirmed(&b.core, agreed, "follower B").await;
    a.close().await;
    // A, cut off from the cluster, commits 3 more of its own (never replicated).
    {
        let dir = dirs[0].path().to_path_buf();
        let core = tokio::task::spawn_blocking(move || Core::open(Config::new(dir)))
            .await
            .unwrap()
            .unwrap();
        for id in 100..103 {
            core.mutate(vec![upsert(id, "lost")], Some(Durability::Fsync))
                .await
                .unwrap();
        }
        assert_eq!(core.db().seq, agreed + 3);
        core.shutdown().await.unwrap();
    }
    // B becomes the leader once A's lease lapsed, and writes other commits at those seqs.
    b.close().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let b = loop {
        match start_node(dirs[1].path(), opts.clone(), false).await {
            Ok(b) => break b,
            Err(ClusterError::SecondLeader { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("B leads once A's lease lapsed: {e}"),
        }
    };
    let mut last = 0;
    for id in 200..225 {
        last = b
            .core
            .mutate(vec![upsert(id, "b")], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    wait_stored_snapshot(&opts, agreed + 1).await;

    // A as a follower: refused, naming the seq where it diverged; its data untouched.
    let before = files(dirs[0].path());
    match start_prepared_follower(dirs[0].path(), opts.clone()).await {
        Err(e @ ClusterError::Diverged { seq }) => {
            assert_eq!(seq, agreed + 3);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("commit {seq}")) && msg.contains("--discard-diverged"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected diverged, got {e}"),
        Ok(_) => panic!("a diverged node must not follow"),
    }
    assert_eq!(
        files(dirs[0].path()),
        before,
        "a refused node's data is left as it was"
    );

    // With discard_diverged: its data moved aside, it starts from B's snapshot.
    let mut discarding = opts.clone();
    discarding.discard_diverged = true;
    let (start, a) = start_prepared_follower(dirs[0].path(), discarding)
        .await
        .expect("A rejoins discarding its tail");
    let Start::Snapshot {
        seq,
        applied,
        displaced: Some(aside),
    } = start
    else {
        panic!("A starts from a snapshot, got {start:?}");
    };
    assert_eq!(applied, agreed + 3);
    assert!(seq > agreed && seq <= last, "{seq}");
    let kept = files(&aside);
    assert_eq!(
        kept,
        before
            .iter()
            .filter(|n| n.ends_with(".log") || n.ends_with(".snap"))
            .cloned()
            .collect::<Vec<_>>(),
        "A's log and snapshots are kept in {}",
        aside.display()
    );
    assert_same_state(&b.core, &a.core, "t", last, "A").await;
    assert!(
        !dump(&a.core, "t").await.iter().any(|r| r.contains("lost")),
        "none of A's unreplicated commits remain"
    );
    // And it follows B from there.
    last = b
        .core
        .mutate(vec![upsert(300, "b")], Some(Durability::Replicated))
        .await
        .unwrap()
        .seq;
    assert_same_state(&b.core, &a.core, "t", last, "A").await;
    a.close().await;
    b.close().await;
}
