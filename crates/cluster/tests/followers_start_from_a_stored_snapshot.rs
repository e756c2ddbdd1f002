//! Where a node starts, once the stream's retention has dropped its head: a 3-node NATS
//! cluster (R3) whose stream keeps 40 commits, a leader that stores snapshots in the
//! object store, random writes in every durability class. A follower added after the
//! stream dropped seq 1 starts from the newest stored snapshot and the stream's tail; a
//! follower stopped mid-stream that fell behind the retained head starts from a snapshot
//! too, its old log and snapshots moved aside (not deleted). Both end with exactly the
//! leader's rows, changelog (dense seqs, the same encoded commits) and live views, and
//! keep following the writes after they joined.

mod common;

use common::*;
use serde_json::{json, Map, Value};
use sluice_cluster::backbone::Backbone;
use sluice_cluster::snapshots::Start;
use sluice_cluster::testkit::NatsCluster;
use sluice_log::Durability;
use sluice_server::{CoreError, Op};

const RETAIN: i64 = 40;

const VIEWS: &[&str] = &[
    "SELECT * FROM items WHERE room = 1",
    "SELECT room, COUNT(*) AS n, SUM(qty) AS total FROM items GROUP BY room",
    "SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 5",
];

const CLASSES: [Durability; 4] = [
    Durability::Memory,
    Durability::Disk,
    Durability::Fsync,
    Durability::Replicated,
];

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn row(id: u64, room: u64, qty: u64) -> Map<String, Value> {
    json!({"id": id, "room": room, "qty": qty, "note": format!("n{qty}")})
        .as_object()
        .unwrap()
        .clone()
}

fn random_op(rng: &mut Rng) -> Op {
    let id = rng.below(50);
    match rng.below(3) {
        0 => Op::Upsert {
            table: "items".into(),
            row: row(id, rng.below(4), rng.below(1000)),
            if_version: None,
        },
        1 => Op::Patch {
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

/// `n` random commits in random classes; returns the last seq committed.
async fn write(core: &sluice_server::Core, rng: &mut Rng, n: usize) -> u64 {
    let mut last = 0;
    let mut done = 0;
    while done < n {
        let ops = (0..1 + rng.below(3)).map(|_| random_op(rng)).collect();
        match core.mutate(ops, Some(CLASSES[rng.below(4) as usize])).await {
            Ok(ok) => {
                last = ok.seq;
                done += 1;
            }
            // A patch or delete of a missing row.
            Err(CoreError::Tx(_)) => {}
            Err(e) => panic!("write failed: {e}"),
        }
    }
    last
}

async fn view_sums(url: &str, seq: u64) -> Vec<String> {
    let mut sums = Vec::new();
    for sql in VIEWS {
        sums.push(LiveView::open(url, sql).await.checksum_at(seq).await);
    }
    sums
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_start_from_a_stored_snapshot() {
    let nats = NatsCluster::start(3).await.expect("a NATS cluster");
    let mut opts = cluster_options(&nats.urls(), "snap");
    opts.retain_commits = RETAIN;
    // The default: a snapshot every quarter of the retained commits.
    assert_eq!(opts.snapshot_interval(), 10);
    let dirs: Vec<TempDir> = (0..3).map(|i| TempDir::new(&format!("snap{i}"))).collect();
    let mut rng = Rng(0x05ee_d5a9);

    let leader = start_node(dirs[0].path(), opts.clone(), false)
        .await
        .expect("the leader");
    ddl(&leader.core, "CREATE TABLE items (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, qty INTEGER NOT NULL, note TEXT)").await;
    // Follower 1 joins while the stream still holds seq 1: it starts from its own (empty)
    // data, as before.
    let (start, f1) = start_prepared_follower(dirs[1].path(), opts.clone())
        .await
        .expect("follower 1");
    assert_eq!(start, Start::Local { applied: 0 });
    let mut last = write(&leader.core, &mut rng, 30).await;
    wait_confirmed(&f1.core, last, "follower 1").await;
    let f1_applied = f1.core.db().seq;
    f1.close().await;

    // Far past the retention, with a schema change among the writes.
    last = write(&leader.core, &mut rng, 60).await;
    ddl(&leader.core, "ALTER TABLE items ADD COLUMN tag TEXT").await;
    last = last.max(write(&leader.core, &mut rng, 60).await);
    last = last.max(leader.core.db().seq);
    // Once the leader has stored a snapshot within one interval of the end, no other is
    // due; if it is the last commit's, one more (not enough to make one due) makes sure
    // the followers below read a tail from the stream.
    let interval = opts.snapshot_interval();
    let newest = wait_stored_snapshot(&opts, last + 1 - interval).await;
    if newest + interval > last + 1 {
        last = write(&leader.core, &mut rng, 1).await;
    }
    let log = backbone(&opts).await;
    let state = log.state().await.expect("the stream's state");
    assert_eq!(state.last_seq, last);
    assert_eq!(
        state.first_seq,
        last + 1 - RETAIN as u64,
        "the stream keeps only the last {RETAIN} commits"
    );
    assert!(
        f1_applied + 1 < state.first_seq,
        "follower 1 fell behind the retained head"
    );
    let stored = wait_stored_snapshot(&opts, state.first_seq - 1).await;
    assert!(stored < last, "no snapshot was due after the last commit");
    assert!(
        log.snapshots().await.unwrap().len() <= sluice_cluster::backbone::SNAPSHOTS_STORED,
        "older stored snapshots are dropped"
    );

    // A new follower: from the newest stored snapshot, then the stream's tail.
    let (start, f2) = start_prepared_follower(dirs[2].path(), opts.clone())
        .await
        .expect("a new follower");
    let Start::Snapshot {
        seq,
        applied: 0,
        displaced: None,
    } = start
    else {
        panic!("a new follower starts from a snapshot, got {start:?}");
    };
    assert!(
        seq >= stored && seq + 1 >= state.first_seq && seq < last,
        "snapshot {seq}: covers the stream's dropped head, and a tail is read after it"
    );
    assert_eq!(f2.core.recovery().snapshot_seq, Some(seq));
    assert_same_state(&leader.core, &f2.core, "items", last, "the new follower").await;

    // Follower 1, back after falling behind the retained head: from a snapshot too, its
    // old data moved aside.
    let (start, f1) = start_prepared_follower(dirs[1].path(), opts.clone())
        .await
        .expect("follower 1 again");
    let Start::Snapshot {
        seq,
        applied,
        displaced: Some(aside),
    } = start
    else {
        panic!("a follower behind the stream starts from a snapshot, got {start:?}");
    };
    assert!(
        applied >= f1_applied && seq + 1 >= state.first_seq && seq < last,
        "{applied} {seq}"
    );
    let kept: Vec<_> = std::fs::read_dir(&aside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.iter()
            .any(|n| n.ends_with(".snap") || n.ends_with(".seg") || n.ends_with(".log")),
        "the old log and snapshots are kept in {}: {kept:?}",
        aside.display()
    );
    assert_same_state(&leader.core, &f1.core, "items", last, "follower 1").await;

    // Both go on following the leader.
    last = write(&leader.core, &mut rng, 25).await;
    assert_same_state(&leader.core, &f1.core, "items", last, "follower 1").await;
    assert_same_state(&leader.core, &f2.core, "items", last, "the new follower").await;
    let want = view_sums(&leader.url(), last).await;
    assert_eq!(view_sums(&f1.url(), last).await, want, "follower 1's views");
    assert_eq!(
        view_sums(&f2.url(), last).await,
        want,
        "the new follower's views"
    );

    f2.close().await;
    f1.close().await;
    leader.close().await;
}
