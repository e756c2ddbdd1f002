//! Bad cluster configurations give clear errors and change nothing: an unreachable NATS
//! cluster (names the URLs), a follower further behind than the stream retains (names
//! both seqs and the flag), a node whose data holds commits the stream does not (names
//! both seqs), and `replicated` on a node without a cluster.

mod common;

use common::*;
use serde_json::json;
use sluice_cluster::testkit::NatsCluster;
use sluice_cluster::ClusterError;
use sluice_log::Durability;
use sluice_server::{Config, Core, CoreError, Op};

fn upsert(id: u64) -> Op {
    Op::Upsert {
        table: "t".into(),
        row: json!({"id": id}).as_object().unwrap().clone(),
        if_version: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_configuration_is_refused_clearly() {
    // Unreachable NATS.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = TempDir::new("unreachable");
    let mut o = cluster_options(&format!("nats://127.0.0.1:{port}"), "bad");
    o.request_timeout = std::time::Duration::from_secs(2);
    match start_node(d.path(), o, false).await {
        Err(e @ ClusterError::Unreachable { .. }) => {
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}")
        }
        Err(e) => panic!("expected unreachable, got {e}"),
        Ok(_) => panic!("nothing listens there"),
    }

    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let mut opts = cluster_options(&nats.urls(), "bad");
    opts.retain_commits = 10;
    let dirs: Vec<TempDir> = (0..3).map(|i| TempDir::new(&format!("bad{i}"))).collect();
    let leader = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("the leader");
    ddl(&leader.core, "CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    let mut last = 0;
    for id in 0..40 {
        last = leader
            .core
            .mutate(vec![upsert(id)], Some(Durability::Replicated))
            .await
            .unwrap()
            .seq;
    }
    // A new follower needs seq 1, but the stream keeps only the last 10 commits.
    match start_node(dirs[1].path(), opts.clone(), true).await {
        Err(e @ ClusterError::TooFarBehind { applied: 0, first }) => {
            assert_eq!(first, last - 9);
            assert!(e.to_string().contains("--cluster-retain-commits"), "{e}");
        }
        Err(e) => panic!("expected too far behind, got {e}"),
        Ok(_) => panic!("a follower behind the retained stream must be refused"),
    }
    // A node with commits of its own (a standalone database) cannot follow this cluster.
    {
        let core = tokio::task::spawn_blocking({
            let dir = dirs[2].path().to_path_buf();
            move || Core::open(Config::new(dir))
        })
        .await
        .unwrap()
        .unwrap();
        ddl(&core, "CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
        for id in 0..(last + 5) {
            core.mutate(vec![upsert(id)], Some(Durability::Memory))
                .await
                .unwrap();
        }
        // `replicated` needs a cluster.
        match core
            .mutate(vec![upsert(1)], Some(Durability::Replicated))
            .await
        {
            Err(CoreError::Tx(e)) => assert!(e.message.contains("--cluster"), "{e}"),
            other => panic!("replicated without a cluster must be refused, got {other:?}"),
        }
        core.shutdown().await.unwrap();
    }
    match start_node(dirs[2].path(), opts.clone(), true).await {
        Err(e @ ClusterError::Ahead { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("seq {}", last + 5 + 1))
                    && msg.contains(&format!("seq {last}")),
                "{msg}"
            );
        }
        Err(e) => panic!("expected ahead, got {e}"),
        Ok(_) => panic!("a node ahead of the stream must be refused"),
    }
    leader.close().await;
}
