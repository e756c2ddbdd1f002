//! Server configuration. Every limit has a default here, a `sluice serve` flag, and its
//! name in the error that enforces it.

use std::path::PathBuf;

use sluice_engine::{Limits, Retention};
use sluice_log::Durability;

/// Default of [`Config::snapshot_log_percent`]: a log as large as the last snapshot.
pub const SNAPSHOT_LOG_PERCENT_DEFAULT: u64 = 100;

/// Default of [`Config::writer_nice`]: the nice the writer takes while it has a backlog
/// (see `writer::Boost` for why only then). Nice −5 weighs about 3× a nice-0 thread: enough
/// to keep the writer on a core, not enough to starve the threads that carry its
/// acknowledgements. Measured in alternating 10 s pairs of `sluice bench transfer` (α = 0, 2
/// cores): `sluice-ws` 239 K / 224 K TPS against 213 K / 211 K at 0; `sluice-http` (never
/// backlogged) 53.8 K / 52.2 K against 52.3 K / 53.7 K.
pub const WRITER_NICE_DEFAULT: i32 = -5;

#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Durability class of requests that do not name one (`--durability`).
    pub durability: Durability,
    /// Start as a cluster follower (`--follower`): client writes are refused from the
    /// first moment, and commits come only from the cluster (`sluice-cluster`).
    pub follower: bool,
    /// Request body size (`--max-body-bytes`).
    pub body_bytes_max: usize,
    /// Ops in one mutate (`--max-ops`).
    pub ops_per_mutate_max: usize,
    /// Row size and columns per table (`--max-row-bytes`, `--max-columns`).
    pub limits: Limits,
    /// Rows in one page of a table scan or changes in one page of catch-up
    /// (`--max-page-rows`).
    pub page_rows_max: usize,
    /// Changelog window kept for catch-up (`--retain-commits`, `--retain-bytes`).
    pub retention: Retention,
    /// A snapshot is taken once this many log bytes were written since the last one
    /// (`--snapshot-log-bytes`) …
    pub snapshot_log_bytes: u64,
    /// … and at least this percent of the last snapshot's size (`--snapshot-log-percent`;
    /// 0: the byte count alone). A snapshot costs in proportion to the state, so a fixed
    /// log interval makes a large table snapshot back to back; in proportion, the bytes
    /// snapshots write stay within `100 / percent` times the log's (Redis rewrites its
    /// append-only file on the same rule, `auto-aof-rewrite-percentage`).
    pub snapshot_log_percent: u64,
    /// Segment size at which the log starts a new segment (`--segment-bytes`).
    pub segment_bytes_max: u64,
    /// Requests queued for the writer before callers wait (back-pressure).
    pub writer_queue_max: usize,
    /// Log bytes submitted and not yet written before the writer waits (`--log-pending-bytes`).
    pub log_pending_bytes_max: usize,
    /// Nice value the writer thread takes while it has a backlog (`--writer-nice`; equal to
    /// the process's own: never). Below 0 needs privilege (root, `CAP_SYS_NICE` or
    /// `RLIMIT_NICE`); a refusal is logged once and the writer keeps the process's
    /// priority. See [`WRITER_NICE_DEFAULT`].
    pub writer_nice: i32,
    /// Log syncs that may run at once (`--log-sync-threads`, see `sluice_log::writer`); 0:
    /// the log thread syncs itself.
    pub log_sync_threads: usize,
    /// Recent sync latency below which the log thread syncs rounds itself even with sync
    /// threads (`--log-sync-inline-below-us`, see `sluice_log::writer::LogConfig`).
    pub log_sync_inline_below: std::time::Duration,
    /// Write log segments over files prepared (zero-filled and synced) in the background
    /// (`--log-unprepared-segments` turns it off; see `sluice_log::io::PreparedFile`).
    pub log_prepare_segments: bool,
    /// Requests in flight on one WebSocket connection before the server stops reading it
    /// (`--ws-inflight-requests`).
    pub ws_inflight_max: usize,
    /// Messages (replies and live events) queued for one WebSocket connection's socket
    /// (`--ws-outbound-messages`).
    pub ws_outbound_max: usize,
    /// A write to a client that takes no byte for this long closes the connection
    /// (`--write-timeout-ms`; see [`crate::stall`]).
    pub write_timeout: std::time::Duration,
    /// A connection must send a whole request head within this long after connecting and
    /// after each response (`--http-idle-timeout-ms`; see [`crate::serve`]).
    pub http_idle_timeout: std::time::Duration,
    /// Segment files are opened through this (tests swap in slow or failing disks).
    pub log_files: LogFiles,
    /// Source of the JavaScript functions module loaded at start (`--functions FILE`).
    pub functions_source: Option<String>,
    /// Time and memory of one function call (`--function-time-ms`, `--function-memory-bytes`).
    pub function_limits: sluice_functions::FunctionLimits,
    /// Bounds of the live-query engine (`--live-*` flags).
    pub live: sluice_live::Limits,
    /// Interval of SSE heartbeat comments on idle live streams (`--live-heartbeat-ms`).
    pub live_heartbeat: std::time::Duration,
    /// Live subscriptions one WebSocket connection may hold
    /// (`--live-subscriptions-per-connection`).
    pub live_subscriptions_per_connection_max: usize,
    /// Records one append may carry (`--max-append-records`).
    pub append_records_max: usize,
    /// Records queued for one watcher before it is cut off with `lagging`
    /// (`--watch-queue-records`).
    pub watch_queue_records: usize,
    /// How tokens are checked (docs/security.md).
    pub auth: crate::auth::AuthConfig,
    /// Directory whose files are served without a token on every path outside `/v1/`,
    /// `/console/`, `/metrics` and `/health` (`--public DIR`); checked at start by
    /// [`check_public_dir`](crate::static_files::check_public_dir).
    pub public_dir: Option<PathBuf>,
    /// Origins whose pages may call the API from the browser (`--cors-origin`): exact
    /// origins such as `http://localhost:5173`, or `*` for any. Empty: same origin only.
    pub cors_origins: Vec<String>,
}

impl Config {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            durability: Durability::Fsync,
            follower: false,
            body_bytes_max: 16 << 20,
            ops_per_mutate_max: 10_000,
            limits: Limits::default(),
            page_rows_max: 10_000,
            retention: Retention::default(),
            snapshot_log_bytes: 256 << 20,
            snapshot_log_percent: SNAPSHOT_LOG_PERCENT_DEFAULT,
            segment_bytes_max: 64 << 20,
            writer_queue_max: 65_536,
            log_pending_bytes_max: 64 << 20,
            writer_nice: WRITER_NICE_DEFAULT,
            log_sync_threads: sluice_log::writer::SYNC_THREADS_DEFAULT,
            log_sync_inline_below: sluice_log::writer::SYNC_INLINE_BELOW_DEFAULT,
            log_prepare_segments: true,
            ws_inflight_max: 1024,
            ws_outbound_max: 64,
            write_timeout: crate::stall::WRITE_TIMEOUT_DEFAULT,
            http_idle_timeout: crate::serve::HTTP_IDLE_TIMEOUT_DEFAULT,
            log_files: LogFiles::default(),
            functions_source: None,
            function_limits: sluice_functions::FunctionLimits::default(),
            live: sluice_live::Limits::default(),
            live_heartbeat: std::time::Duration::from_secs(15),
            live_subscriptions_per_connection_max: 1024,
            append_records_max: 10_000,
            watch_queue_records: 4096,
            auth: crate::auth::AuthConfig::default(),
            public_dir: None,
            cors_origins: Vec::new(),
        }
    }
}

/// The factory that opens log segment files: real files unless a test injects another.
#[derive(Clone)]
pub struct LogFiles(pub std::sync::Arc<dyn sluice_log::io::LogFileFactory>);

impl Default for LogFiles {
    fn default() -> Self {
        LogFiles(std::sync::Arc::new(sluice_log::io::RealFiles))
    }
}

impl std::fmt::Debug for LogFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogFiles")
    }
}
