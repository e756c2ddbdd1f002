//! `sluice-server`: the running database — the single writer, durability pipeline and
//! HTTP API around a `sluice-engine` [`Db`](sluice_engine::Db) and a `sluice-log` log.
//!
//! Responsible for: recovery at start, the writer thread that applies transactions in seq
//! order, handing frames to the log and releasing acknowledgements and reads only once a
//! commit reached its durability class ("confirmed reads"), background snapshots and
//! segment retirement, graceful shutdown, limits, `/metrics`, and the axum router.
//! Not responsible for: what a row or a log frame looks like (engine, log), SQL (sql).
//!
//! # Layout
//! - [`config`]: [`Config`] with every limit and its default.
//! - [`core`]: [`Core`], the handle the API and the bench use: `mutate`, `ddl`, reads.
//! - `writer`: the writer thread; `confirm`: which seqs reached their class.
//! - `snapshotter`: the background snapshot thread.
//! - [`decode`]: mutate bodies decoded straight into typed rows (off the writer thread).
//! - [`point`]: point reads (by primary key, through an index) under the read lock,
//!   confirmed without waiting when the row's own commit already is.
//! - [`error`]: [`CoreError`], the core's own errors; each transport maps them.
//! - [`api`]: request parsing, [`ApiError`](api::ApiError) and the axum [`router`](api::router).
//! - [`topics`]: topic requests, paged reads, and the fan-out of records to watchers.
//! - `live`, `live_chunks`: live queries over SSE, and large snapshots sent in chunks.
//! - `metrics`: Prometheus text rendering.
//! - [`coalesce`]: `coalesce_ms`, the opt-in window of live subscriptions and watches.
//! - [`replication`]: the cluster's hook — a node's [`Role`](replication::Role), the
//!   leader's [`Replicator`](replication::Replicator), `replicated` acknowledgements.
//! - [`serve`]: the accept loop — hyper's HTTP/1.1 with `--http-idle-timeout-ms`, graceful
//!   shutdown.
//! - [`stall`]: connections whose client stopped reading are closed (`--write-timeout-ms`).
//! - [`static_files`]: the embedded console, `--public DIR`, and response compression.

pub mod api;
pub mod auth;
pub mod coalesce;
pub mod config;
pub mod core;
pub mod decode;
pub mod error;
pub mod point;

mod confirm;
mod encoder;
mod live;
mod live_chunks;
mod metrics;
mod prefetch;
pub mod replication;
mod rules;
pub mod serve;
mod snapshotter;
pub mod stall;
pub mod static_files;
pub mod topics;
mod topics_api;
mod writer;
pub mod ws;

pub use crate::auth::{AuthConfig, Caller, Claims};
pub use crate::config::Config;
pub use crate::core::{CallOk, Core, MutateOk, Op};
pub use crate::error::CoreError;
pub use crate::metrics::add_metrics_hook;
pub use crate::topics::{AppendOk, NewRecord, PutTopicOk, TopicInfo, TopicSpec, Watch, WireRecord};
