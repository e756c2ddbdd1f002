//! Which seqs have reached the durability class they were written with.
//!
//! `confirmed` is the largest seq S such that every commit <= S reached its class: a
//! `memory` commit once applied, `disk` once written, `fsync` once synced, `replicated`
//! once written *and* acknowledged by the cluster's replicated log. Reads and
//! catch-up never show state past `confirmed` ("confirmed reads"). It is a prefix, so a
//! `memory` commit behind a not-yet-synced `fsync` commit waits for it.

use std::collections::VecDeque;
use std::sync::Mutex;

use sluice_log::{Durability, Progress};
use tokio::sync::watch;

#[derive(Default)]
struct State {
    applied: u64,
    progress: Progress,
    /// Seqs of `disk` commits not yet written, ascending.
    disk: VecDeque<u64>,
    /// Seqs of `fsync` commits not yet synced, ascending.
    fsync: VecDeque<u64>,
    /// Every seq up to this one is held by the cluster's replicated log (a quorum).
    replicated_seq: u64,
    /// Seqs of `replicated` commits not yet both written and replicated, ascending.
    replicated: VecDeque<u64>,
}

impl State {
    fn confirmed(&mut self) -> u64 {
        while self
            .disk
            .front()
            .is_some_and(|&s| s <= self.progress.written_seq)
        {
            self.disk.pop_front();
        }
        while self
            .fsync
            .front()
            .is_some_and(|&s| s <= self.progress.synced_seq)
        {
            self.fsync.pop_front();
        }
        let both = self.progress.written_seq.min(self.replicated_seq);
        while self.replicated.front().is_some_and(|&s| s <= both) {
            self.replicated.pop_front();
        }
        let mut c = self.applied;
        if let Some(&s) = self.replicated.front() {
            c = c.min(s - 1);
        }
        if let Some(&s) = self.disk.front() {
            c = c.min(s - 1);
        }
        if let Some(&s) = self.fsync.front() {
            c = c.min(s - 1);
        }
        c
    }
}

pub(crate) struct Confirmations {
    state: Mutex<State>,
    /// The confirmed seq as one atomic load (every point read checks it): set before the
    /// watch below, which waiters subscribe to.
    latest: std::sync::atomic::AtomicU64,
    tx: watch::Sender<u64>,
    /// Woken on every advance, for threads that wait without a runtime (`wait_blocking`).
    advanced: std::sync::Condvar,
}

impl Confirmations {
    /// Starts with everything up to `seq` (recovered state) confirmed.
    pub fn new(seq: u64) -> Self {
        let state = State {
            applied: seq,
            progress: Progress {
                written_seq: seq,
                synced_seq: seq,
            },
            replicated_seq: seq,
            ..State::default()
        };
        Confirmations {
            state: Mutex::new(state),
            latest: std::sync::atomic::AtomicU64::new(seq),
            tx: watch::channel(seq).0,
            advanced: std::sync::Condvar::new(),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    pub fn confirmed(&self) -> u64 {
        self.latest.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The writer applied commits up to `applied`; `waiting` are the (seq, class) of those
    /// that still wait for the log, ascending.
    pub fn applied(&self, applied: u64, waiting: &[(u64, Durability)]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.applied = applied;
        for &(seq, class) in waiting {
            match class {
                Durability::Memory => {}
                Durability::Disk => s.disk.push_back(seq),
                Durability::Fsync => s.fsync.push_back(seq),
                Durability::Replicated => s.replicated.push_back(seq),
            }
        }
        let c = s.confirmed();
        drop(s);
        self.publish(c);
    }

    pub fn progressed(&self, progress: Progress) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.progress = progress;
        let c = s.confirmed();
        drop(s);
        self.publish(c);
    }

    /// The cluster's replicated log holds every commit up to `seq`.
    pub fn replicated(&self, seq: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.replicated_seq = s.replicated_seq.max(seq);
        let c = s.confirmed();
        drop(s);
        self.publish(c);
    }

    fn publish(&self, c: u64) {
        self.latest
            .fetch_max(c, std::sync::atomic::Ordering::AcqRel);
        let advanced = self.tx.send_if_modified(|v| {
            if c > *v {
                *v = c;
                true
            } else {
                false
            }
        });
        if advanced {
            // Taking the lock orders this wake-up after any waiter's check (see wait_blocking).
            drop(self.state.lock().unwrap_or_else(|e| e.into_inner()));
            self.advanced.notify_all();
        }
    }

    /// Blocks until `seq` is confirmed (true) or `timeout` passes (false).
    pub fn wait_blocking(&self, seq: u64, timeout: std::time::Duration) -> bool {
        if self.confirmed() >= seq {
            return true;
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.confirmed() >= seq {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .advanced
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirmed_is_a_prefix_over_classes() {
        let c = Confirmations::new(0);
        c.applied(
            4,
            &[
                (1, Durability::Disk),
                (2, Durability::Fsync),
                (4, Durability::Disk),
            ],
        );
        assert_eq!(c.confirmed(), 0);
        c.progressed(Progress {
            written_seq: 4,
            synced_seq: 0,
        });
        assert_eq!(c.confirmed(), 1, "seq 2 is written but not synced");
        c.progressed(Progress {
            written_seq: 4,
            synced_seq: 4,
        });
        assert_eq!(c.confirmed(), 4);
        c.applied(5, &[]);
        assert_eq!(
            c.confirmed(),
            5,
            "a memory commit is confirmed when applied"
        );
    }

    #[test]
    fn replicated_needs_the_write_and_the_quorum() {
        let c = Confirmations::new(0);
        c.applied(
            3,
            &[(1, Durability::Replicated), (3, Durability::Replicated)],
        );
        assert_eq!(c.confirmed(), 0);
        c.replicated(3);
        assert_eq!(c.confirmed(), 0, "replicated but not yet written locally");
        c.progressed(Progress {
            written_seq: 1,
            synced_seq: 0,
        });
        assert_eq!(
            c.confirmed(),
            2,
            "seq 2 (memory) follows the confirmed seq 1"
        );
        c.progressed(Progress {
            written_seq: 3,
            synced_seq: 0,
        });
        assert_eq!(c.confirmed(), 3);
        c.applied(4, &[(4, Durability::Replicated)]);
        c.progressed(Progress {
            written_seq: 4,
            synced_seq: 4,
        });
        assert_eq!(c.confirmed(), 3, "written and synced, not replicated");
        c.replicated(4);
        assert_eq!(c.confirmed(), 4);
    }
}
