//! `sluice-cluster`: Sluice beyond one node — the changelog replicated through NATS
//! JetStream, a leader that publishes every commit, followers that apply them and serve
//! reads and live views, and the `replicated` durability class.
//!
//! Responsible for: the [`Backbone`](backbone::Backbone) trait (a replicated log and a
//! leader lease, narrow so another backbone could be added) and its JetStream
//! implementation; the leader's publisher (fencing, pipelining, recovery after a failed
//! append); the follower's reader (position checks, batches into the core); starting a
//! node in its role; a loopback NATS cluster for tests and benchmarks.
//! Not responsible for: applying commits, logging them or acknowledging them (the core in
//! `sluice-server` does, through its `replication` hook), consensus (JetStream's).
//!
//! # Layout
//! - [`backbone`]: the trait, entries, log state, the lease holder.
//! - [`jetstream`]: [`JetStream`](jetstream::JetStream) and [`ClusterOptions`](jetstream::ClusterOptions).
//! - [`leader`]: the publisher fed by the writer's rounds.
//! - [`follower`]: position checks and the reading loop.
//! - [`node`]: [`prepare`](node::prepare) a node's data directory, then
//!   [`start`](node::start) it as leader or follower.
//! - [`snapshots`]: where a node starts — the leader's stored snapshots, a follower
//!   started from one.
//! - [`testkit`]: [`NatsCluster`](testkit::NatsCluster), `nats-server` processes on loopback.

pub mod backbone;
pub mod follower;
pub mod jetstream;
pub mod leader;
pub mod node;
pub mod snapshots;
pub mod testkit;

mod error;

pub use error::ClusterError;
pub use jetstream::ClusterOptions;
pub use node::{Node, NodeOptions};
