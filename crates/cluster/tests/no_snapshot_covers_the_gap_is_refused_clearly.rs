//! A follower whose gap neither the stream nor a stored snapshot covers is refused with an
//! error that names the seqs (what it applied, where the stream starts, what a snapshot
//! would have to cover, the newest stored one) and the flags — and its data directory is
//! left as it was.

mod common;

use common::*;
use serde_json::json;
use sluice_cluster::backbone::Backbone;
use sluice_cluster::testkit::NatsCluster;
use sluice_cluster::ClusterError;
use sluice_log::Durability;
use sluice_server::Op;

fn upsert(id: u64) -> Op {
    Op::Upsert {
        table: "t".into(),
        row: json!({"id": id}).as_object().unwrap().clone(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_snapshot_covers_the_gap_is_refused_clearly() {
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let mut opts = cluster_options(&nats.urls(), "nosnap");
    opts.retain_commits = 10;
    // The leader stores no snapshots.
    opts.snapshot_commits = Some(0);
    let dirs: Vec<TempDir> = (0..3)
        .map(|i| TempDir::new(&format!("nosnap{i}")))
        .collect();
    let leader = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("the leader");
    ddl(&leader.core, "CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    // A follower that holds the first commits, then stops.
    let (_, f1) = start_prepared_follower(dirs[1].path(), opts.clone())
        .await
        .expect("follower 1");
    let mut last = 0;
    for id in 0..5 {
        last = leader
            .core
            .mutate(vec![upsert(id)], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    wait_confirmed(&f1.core, last, "follower 1").await;
    let f1_applied = f1.core.db().seq;
    f1.close().await;
    for id in 5..40 {
        last = leader
            .core
            .mutate(vec![upsert(id)], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    let first = last - 9;
    let log = backbone(&opts).await;
    assert_eq!(log.state().await.unwrap().first_seq, first);
    assert_eq!(log.snapshots().await.unwrap(), Vec::<u64>::new());

    // A new follower and the stopped one: neither the stream nor a snapshot covers them.
    for (dir, applied) in [(&dirs[2], 0), (&dirs[1], f1_applied)] {
        let before = files(dir.path());
        match start_prepared_follower(dir.path(), opts.clone()).await {
            Err(
                e @ ClusterError::NoSnapshot {
                    applied: a,
                    first: f,
                    newest: None,
                },
            ) => {
                assert_eq!((a, f), (applied, first));
                let msg = e.to_string();
                for part in [
                    format!("applied up to seq {applied}"),
                    format!("from seq {first} on"),
                    format!("covers seq {}", first - 1),
                    "none (no snapshot stored)".to_string(),
                    "--cluster-retain-commits".to_string(),
                    "--cluster-snapshot-commits".to_string(),
                ] {
                    assert!(msg.contains(&part), "{part:?} in {msg}");
                }
            }
            Err(e) => panic!("expected no snapshot, got {e}"),
            Ok(_) => panic!("a follower behind the stream without a snapshot must be refused"),
        }
        assert_eq!(
            files(dir.path()),
            before,
            "a refused follower's data is left as it was"
        );
    }
    leader.close().await;
}
