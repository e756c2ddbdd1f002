//! `sluice-live`: live SQL queries — views kept up to date commit by commit and pushed to
//! subscribers as snapshots and diffs.
//!
//! Responsible for: the registry of views (shared by normalised query + parameters, kept
//! warm for a TTL after the last subscriber leaves), routing each committed change only to
//! the views it can affect (by table, and by `(table, column, value)` for views with an
//! equality predicate), maintaining each view's result incrementally ([`operator`]), turning
//! result changes into ordered diffs with an O(change) checksum ([`view`], [`checksum`]),
//! per-view diff history for exact resume, and bounded per-subscriber queues that coalesce
//! into a reset or disconnect a subscriber that does not keep up ([`sink`]).
//! Not responsible for: confirmation (the server delivers an event once its seq is
//! confirmed), transports (SSE and WebSocket live in the server), one-shot queries
//! (`sluice-query`, whose planner and expression evaluation this crate reuses).
//!
//! # Layout
//! - [`engine`]: [`Live`], the registry: subscribe / resume / unsubscribe / apply / expire.
//! - [`operator`]: filter, aggregate and re-evaluating operators.
//! - [`view`]: the materialised result, ordering, windows, diffs and their JSON.
//! - [`checksum`]: the documented multiset hash.
//! - [`chunked`]: large snapshots, frozen once and encoded chunk by chunk by the transport.
//! - `compact`: the registry's per-view indexes in compact form (a million idle views).
//! - [`sink`]: events and subscriber queues.
//! - [`fold`]: opt-in coalescing (`coalesce_ms`): one net diff per subscriber per window.
//! - [`thread`]: the live thread that owns a [`Live`] next to a server's writer.

pub mod checksum;
pub mod chunked;
mod compact;
pub mod engine;
pub mod fold;
pub mod operator;
mod ranked;
pub mod sink;
pub mod store;
pub mod thread;
pub mod view;

use std::time::Duration;

pub use engine::{Live, LiveStats, SubId, Subscribe};
pub use fold::COALESCE_MS_MAX;
pub use sink::{Event, EventKind, Ready, Sink};
pub use thread::{HandoffState, LiveHandle};

use sluice_query::QueryError;

/// Every bound of the live engine; each is named in the error that reports it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Views held at once (subscribed or warm).
    pub views_max: usize,
    /// Rows one view may hold (its full result, before any `LIMIT` window).
    pub view_rows_max: usize,
    /// Tables one live query may read, counting joins and subqueries.
    pub view_tables_max: usize,
    /// Events waiting for one subscriber before its backlog becomes a reset.
    pub subscriber_queue_max: usize,
    /// Bytes waiting for one subscriber before its backlog becomes a reset.
    pub subscriber_queue_bytes_max: usize,
    /// Diffs a view keeps for resuming subscribers.
    pub history_diffs_max: usize,
    /// Bytes of diffs a view keeps for resuming subscribers.
    pub history_bytes_max: usize,
    /// How long a view with no subscribers stays warm.
    pub idle_ttl: Duration,
    /// Planned queries cached (the cache is cleared when full and on DDL).
    pub plans_max: usize,
    /// Rows a top-k view (one table, `ORDER BY … LIMIT n`) keeps beyond `OFFSET + LIMIT`,
    /// and may gain before it is trimmed back: more means fewer refills from the table
    /// when rows leave the window, fewer means less memory per view.
    pub top_k_spare_rows: usize,
    /// Commits handed over by the writer and not yet applied by the live thread before
    /// the writer waits (`--live-handoff-commits`): back-pressure instead of a queue that
    /// grows without bound when views cannot keep up with writes.
    pub handoff_commits_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            views_max: 1_000_000,
            view_rows_max: 2_000_000,
            view_tables_max: 8,
            subscriber_queue_max: 1024,
            subscriber_queue_bytes_max: 16 << 20,
            history_diffs_max: 256,
            history_bytes_max: 1 << 20,
            idle_ttl: Duration::from_secs(60),
            plans_max: 10_000,
            top_k_spare_rows: 16,
            handoff_commits_max: 65_536,
        }
    }
}

/// The error code the API uses for a query error.
pub fn error_code(e: &QueryError) -> &'static str {
    match e {
        QueryError::Unsupported(_) => "unsupported",
        QueryError::Schema(_) => "schema",
        QueryError::NotFound(_) => "not_found",
        QueryError::Limit(_) => "limit",
        QueryError::RulesChanged(_) => "rules_changed",
        _ => "bad_request",
    }
}
