//! The changelog: the retained window of committed transactions, for catch-up.
//!
//! Entries are dense in seq (`entries[i].seq == first_seq + i`), so a lookup by seq is an
//! index. Old entries fall off the front by count and by approximate bytes; everything at
//! or below [`Changelog::horizon`] is gone and a reader asking for it must re-snapshot.

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

pub struct Changelog {
    entries: VecDeque<(Arc<Commit>, usize)>,
    bytes: usize,
    retention: Retention,
    /// Every seq <= horizon has been dropped.
    horizon: u64,
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
        }
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
