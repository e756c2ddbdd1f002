//! `sluice-engine`: the in-memory database that the single writer mutates.
//!
//! Responsible for: typed values and schemas, tables with their primary-key and secondary
//! B-tree indexes, atomic transactions (apply-with-undo), the changelog of committed
//! changes, the binary encoding of commits and snapshots, and recovery from a data
//! directory. Not responsible for threads, durability waiting or the network — the server
//! drives one [`Db`] from one writer thread and hands encoded commits to `sluice-log`.
//!
//! # Layout
//! - [`value`]: column types, [`Value`], [`Key`], JSON conversion, SQLite-like ordering.
//! - [`thin`]: [`ThinStr`] and [`ThinBytes`], text and bytes in 12 bytes (pointer and u32 length: a
//!   [`Value`] is 16 bytes).
//! - [`schema`]: table schemas and [`SchemaChange`] (what DDL means).
//! - [`cow`]: [`cow::CowMap`], the chunked copy-on-write ordered map that holds rows.
//! - [`table`]: rows and indexes of one table.
//! - [`db`]: [`Db`], [`Tx`] (transactions), [`Commit`] and [`Change`].
//! - [`topic`]: topics — records, tag index, filters, retention.
//! - [`changelog`]: the retained window of commits for catch-up.
//! - [`codec`]: bytes of log records and snapshot frames.
//! - [`recovery`]: load the newest valid snapshot, replay the tail, verify a directory.

mod bulk;
pub mod changelog;
pub mod codec;
pub mod cow;
pub mod db;
pub mod error;
pub mod recovery;
pub mod schema;
pub mod table;
pub mod thin;
pub mod topic;
pub mod value;

pub use changelog::{Changelog, Retention};
pub use db::{
    key_from_json, Change, ChangeOp, Commit, CommitBody, Db, Limits, TopicChange, Tx, TxRef,
    TxState, WriteResult,
};
pub use error::{ErrorCode, TxError};
pub use schema::{ColumnDef, IndexDef, PolicyCommand, PolicyDef, SchemaChange, TableSchema};
pub use sluice_log::critical;
pub use thin::{ThinBytes, ThinStr};
pub use topic::{Appended, Record, TagFilter, TagIndex, Topic, TopicConfig, TopicRules};
pub use value::{ColumnType, Key, Value};
