//! The changelog: the retained window of committed transactions, for catch-up.
//!
//! Entries are dense in seq (`entries[i].seq == first_seq + i`), so a lookup by seq is an
//! index. Old entries fall off the front by count and by approximate bytes; everything at
//! or below [`Changelog::horizon`] is gone and a reader asking for it must re-snapshot.
//!
//! An evicted commit is usually its last reference, and by then cold in cache: dropping
//! it (its changes, their row images) cost the writer 6–7 % of its time in the uniform
//! transfer workload. An owner on a hot path can [`Changelog::defer_drops`] and hand what
//! [`Changelog::take_evicted`] returns to another thread; at most [`DEFERRED_MAX`] wait,
//! beyond that they are dropped on the spot, so an owner that never takes them only loses
//! the saving.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::db::{Commit, CommitBody};
use crate::value::Value;

/// How much of the changelog to keep in memory (and on disk, for catch-up across restarts).
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub commits_max: usize,
    pub bytes_max: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            commits_max: 100_000,
            bytes_max: 64 << 20,
        }
    }
}

/// Most evicted commits kept for [`Changelog::take_evicted`].
pub const DEFERRED_MAX: usize = 1 << 16;

pub struct Changelog {
    entries: VecDeque<(Arc<Commit>, usize)>,
    bytes: usize,
    retention: Retention,
    /// Every seq <= horizon has been dropped.
    horizon: u64,
    /// Evicted commits waiting to be dropped elsewhere (`Some` after `defer_drops`).
    deferred: Option<Vec<Arc<Commit>>>,
}

fn approx_bytes(commit: &Commit) -> usize {
    let records: usize = commit
        .appends
        .iter()
        .flat_map(|a| &a.records)
        .map(|r| r.bytes() as usize)
        .sum();
    records
        + match &commit.body {
            CommitBody::Rows(changes) => changes
                .iter()
                .map(|c| {
                    64 + c
                        .row
                        .as_ref()
                        .map_or(0, |r| r.iter().map(Value::encoded_len).sum())
                })
                .sum(),
            CommitBody::Schema { sql, .. } => 64 + sql.len(),
            CommitBody::Topic(_) => 64,
        }
}

impl Changelog {
    pub fn new(retention: Retention) -> Self {
        Changelog {
            entries: VecDeque::new(),
            bytes: 0,
            retention,
            horizon: 0,
            deferred: None,
        }
    }

    /// From now on evicted commits wait in [`Changelog::take_evicted`] (up to
    /// [`DEFERRED_MAX`]) instead of being dropped during [`Changelog::push`].
    pub fn defer_drops(&mut self) {
        self.deferred.get_or_insert_with(Vec::new);
    }

    /// How many evicted commits wait for [`Changelog::take_evicted`].
    pub fn evicted_len(&self) -> usize {
        self.deferred.as_ref().map_or(0, Vec::len)
    }

    /// The evicted commits waiting to be dropped (empty unless [`Changelog::defer_drops`]).
    pub fn take_evicted(&mut self) -> Vec<Arc<Commit>> {
        self.deferred
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Starts an empty changelog whose first entry will be `seq + 1`.
    pub fn reset_to(&mut self, seq: u64) {
        self.entries.clear();
        self.bytes = 0;
        self.horizon = seq;
    }

    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    pub fn retention(&self) -> Retention {
        self.retention
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn push(&mut self, commit: Arc<Commit>) {
        let expected = self.horizon + self.entries.len() as u64 + 1;
        assert_eq!(commit.seq, expected, "changelog entries must be dense");
        let bytes = approx_bytes(&commit);
        self.bytes += bytes;
        self.entries.push_back((commit, bytes));
        while self.entries.len() > self.retention.commits_max
            || (self.bytes > self.retention.bytes_max && self.entries.len() > 1)
        {
            let (old, b) = self.entries.pop_front().expect("non-empty");
            self.bytes -= b;
            self.horizon = old.seq;
            if let Some(deferred) = &mut self.deferred {
                if deferred.len() < DEFERRED_MAX {
                    deferred.push(old);
                }
            }
        }
    }

    /// Sets the before-image of change `change` of commit `seq`, if it is retained
    /// (recovery's bulk build learns before-images after the commits were pushed).
    pub fn set_old(&mut self, seq: u64, change: usize, old: Option<Arc<[Value]>>) {
        let Some(i) = seq.checked_sub(self.horizon + 1) else {
            return;
        };
        let Some((commit, _)) = self.entries.get_mut(i as usize) else {
            return;
        };
        if let CommitBody::Rows(changes) = &mut Arc::make_mut(commit).body {
            if let Some(c) = changes.get_mut(change) {
                c.old = old;
            }
        }
    }

    /// Commits with seq > `since`, in order; `Err(horizon)` if some of them are no longer
    /// retained.
    pub fn since(&self, since: u64) -> Result<impl Iterator<Item = &Arc<Commit>>, u64> {
        if since < self.horizon {
            return Err(self.horizon);
        }
        let start = (since - self.horizon) as usize;
        Ok(self.entries.iter().skip(start).map(|(c, _)| c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(seq: u64) -> Arc<Commit> {
        Arc::new(Commit {
            seq,
            body: CommitBody::Schema {
                changes: Vec::new(),
                sql: format!("-- {seq}"),
            },
            appends: Vec::new(),
        })
    }

    fn log_of(commits_max: usize) -> Changelog {
        Changelog::new(Retention {
            commits_max,
            bytes_max: 1 << 40,
        })
    }

    #[test]
    fn evicted_commits_are_dropped_at_once_unless_deferred() {
        let mut log = log_of(2);
        let first = commit(1);
        log.push(first.clone());
        log.push(commit(2));
        log.push(commit(3));
        assert_eq!(log.horizon(), 1);
        assert_eq!(Arc::strong_count(&first), 1, "the changelog let go of it");
        assert!(log.take_evicted().is_empty());
    }

    #[test]
    fn deferred_evictions_wait_in_order_until_taken() {
        let mut log = log_of(2);
        log.defer_drops();
        let commits: Vec<_> = (1..=5).map(commit).collect();
        for c in &commits {
            log.push(c.clone());
        }
        assert_eq!(log.evicted_len(), 3);
        let evicted = log.take_evicted();
        assert_eq!(evicted.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(log.evicted_len(), 0);
        assert_eq!(
            Arc::strong_count(&commits[0]),
            2,
            "held by the taker, not the log"
        );
        assert!(log.take_evicted().is_empty(), "taken once");
        // What is still retained reads as before.
        let seqs: Vec<u64> = log.since(3).unwrap().map(|c| c.seq).collect();
        assert_eq!(seqs, [4, 5]);
    }

    #[test]
    fn deferred_evictions_are_bounded() {
        let mut log = log_of(1);
        log.defer_drops();
        for seq in 1..=(DEFERRED_MAX as u64 + 10) {
            log.push(commit(seq));
        }
        assert_eq!(log.evicted_len(), DEFERRED_MAX);
        let evicted = log.take_evicted();
        assert_eq!(evicted.len(), DEFERRED_MAX);
        assert_eq!(evicted.last().map(|c| c.seq), Some(DEFERRED_MAX as u64));
    }
}
