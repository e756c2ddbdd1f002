//! A follower fetching a stored snapshot while the leader stores newer ones (and deletes
//! the oldest, keeping only a few) ends the fetch — with the whole snapshot or with a
//! transient error its join retries — instead of waiting for ever for chunks that were
//! deleted. Against a real `nats-server` on loopback.

use std::time::Duration;

use sluice_cluster::backbone::Backbone;
use sluice_cluster::jetstream::JetStream;
use sluice_cluster::testkit::NatsCluster;
use sluice_cluster::ClusterOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_deleted_while_fetched_fails_instead_of_hanging() {
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let mut opts = ClusterOptions::new(nats.urls());
    opts.database = "deleted".into();
    opts.replicas = 1;
    opts.request_timeout = Duration::from_secs(2);
    let leader = JetStream::connect(&opts).await.expect("connect");
    let follower = JetStream::connect(&opts).await.expect("connect");
    let dir = std::env::temp_dir().join(format!("sluice-deleted-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("source.snap");
    // 24 MiB of distinct bytes: 48 chunks, so the fetch is still running when it is deleted.
    let body: Vec<u8> = (0..24u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&source, &body).unwrap();

    let mut outcomes = (0, 0);
    for round in 0..4u64 {
        let seq = 1 + round * 10;
        leader.put_snapshot(seq, &source).await.expect("store");
        let dest = dir.join(format!("fetched-{round}"));
        let fetch = follower.fetch_snapshot(seq, &dest);
        // The leader stores two newer snapshots meanwhile: `seq` is deleted.
        let newer = async {
            for later in 1..=2 {
                leader
                    .put_snapshot(seq + later, &source)
                    .await
                    .expect("store newer");
            }
        };
        let (fetched, ()) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(fetch, newer)
        })
        .await
        .expect("the fetch ends: it must not wait for ever for deleted chunks");
        match fetched {
            Ok(()) => {
                assert!(
                    std::fs::read(&dest).unwrap() == body,
                    "a fetch that succeeds is whole"
                );
                outcomes.0 += 1;
            }
            Err(e) => {
                assert!(
                    e.is_transient(),
                    "a deleted snapshot is a retryable failure: {e}"
                );
                outcomes.1 += 1;
            }
        }
    }
    eprintln!(
        "fetched whole: {}, failed (retryable): {}",
        outcomes.0, outcomes.1
    );

    // Listing the stored snapshots while the leader stores and deletes them ends too.
    std::fs::write(&source, b"small").unwrap();
    let listing = async {
        let mut lists = (0, 0);
        for _ in 0..200 {
            match follower.snapshots().await {
                Ok(_) => lists.0 += 1,
                Err(e) => {
                    assert!(e.is_transient(), "{e}");
                    lists.1 += 1
                }
            }
        }
        lists
    };
    let storing = async {
        for seq in 100..300 {
            leader.put_snapshot(seq, &source).await.expect("store");
        }
    };
    let (lists, ()) = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(listing, storing)
    })
    .await
    .expect("every list ends: it must not wait for ever for deleted entries");
    eprintln!("listed: {}, failed (retryable): {}", lists.0, lists.1);
    std::fs::remove_dir_all(&dir).ok();
}
