//! The writer → live thread hand-off is bounded (`--live-handoff-commits`): when the live
//! thread falls that many commits behind, `publish` waits instead of queueing without bound,
//! and the counters say so. The live thread is held up deterministically: a subscribe needs
//! the `Db` read lock, which the test holds (as a long writer round would).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use sluice_engine::{Changelog, Commit, CommitBody, Db, Limits as DbLimits, Retention};
use sluice_live::{Limits, LiveHandle, Sink, Subscribe};
use sluice_query::Params;

fn commit(seq: u64) -> Vec<Arc<Commit>> {
    vec![Arc::new(Commit {
        seq,
        body: CommitBody::Rows(Vec::new()),
        appends: Vec::new(),
    })]
}

#[test]
fn publish_waits_once_the_live_thread_is_handoff_commits_behind() {
    let db = Arc::new(RwLock::new(Db::new(
        DbLimits::default(),
        Changelog::new(Retention::default()),
    )));
    let limits = Limits {
        handoff_commits_max: 2,
        ..Limits::default()
    };
    let live = Arc::new(LiveHandle::spawn(db.clone(), limits.clone()).unwrap());
    // Block the live thread: it will wait for the read lock in this subscribe.
    let held = db.write();
    let (sent_tx, sent) = std::sync::mpsc::channel();
    let subscriber = {
        let live = live.clone();
        let sink = Sink::new(&limits);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let req = Subscribe {
                sql: "SELECT 1".into(),
                params: Params::None,
                since: None,
                claims: None,
            };
            rt.block_on(async move {
                let reply = live.subscribe(req, sink);
                tokio::pin!(reply);
                // The first poll hands the request to the live thread; say so, then wait.
                tokio::select! {
                    biased;
                    _ = &mut reply => panic!("the subscribe finished while the Db was locked"),
                    () = std::future::ready(()) => {}
                }
                sent_tx.send(()).unwrap();
                let _ = reply.await;
            });
        })
    };
    sent.recv().unwrap();
    // The live thread is stuck on that subscribe (it needs the read lock); commits queue
    // behind it. Two fit the bound; the third must wait until the live thread catches up.
    live.publish(commit(1));
    live.publish(commit(2));
    let third = {
        let live = live.clone();
        std::thread::spawn(move || live.publish(commit(3)))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while live.handoff().waits == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the third hand-over never waited: {:?}",
            live.handoff()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(!third.is_finished(), "the third hand-over did not wait");
    let state = live.handoff();
    assert_eq!(state.queued_commits, 2, "{state:?}");
    assert_eq!(state.waits, 1, "{state:?}");
    // Let the live thread go: the waiting hand-over completes and the queue drains.
    drop(held);
    third.join().unwrap();
    subscriber.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while live.handoff().queued_commits > 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", live.handoff());
        std::thread::sleep(Duration::from_millis(5));
    }
    let state = live.handoff();
    assert!(state.queued_commits_peak <= 2, "{state:?}");
}
