//! `sluice-log`: the write-ahead log and snapshot files.
//!
//! This crate owns bytes on disk: checksummed frames, segment files, the group-commit
//! thread that writes and syncs them, and snapshot files. It knows nothing about tables or
//! rows — a frame's payload is opaque here; `sluice-engine` defines what it means. Each
//! frame is tagged with the `seq` of the commit it carries so segments can be named and
//! retired by sequence number.
//!
//! It is *not* responsible for deciding when to snapshot or what a snapshot contains.
//!
//! # Layout
//! - [`frame`]: the frame format (length, inverted length, XXH3-64) — encode and decode.
//! - [`segment`]: segment file names, scanning, torn-tail classification.
//! - [`writer`]: [`Log`], the group-commit thread; durability classes; poisoning.
//! - [`snapshot`]: snapshot file writer and reader (framed, written atomically).
//! - [`critical`]: threads whose panic ends the process (and the test hook that injects one).
//! - [`latency`]: lock-free latency histograms for `/metrics`.
//! - [`io`]: the file abstraction the writer syncs through, with a fault-injecting variant.
//! - `direct` (Linux): prepared segments written around the page cache (`--log-direct-io`).
//! - [`sim`]: a simulated in-memory disk (power loss, crashes, torn and failed writes,
//!   failed syncs) for simulation tests.

pub mod critical;
#[cfg(target_os = "linux")]
pub mod direct;
pub mod frame;
pub mod io;
pub mod latency;
pub mod segment;
pub mod sim;
pub mod snapshot;
pub mod writer;

mod durability;
mod error;

pub use durability::Durability;
pub use error::LogError;
pub use writer::{Log, LogConfig, LogStats, Progress, Waiter};
