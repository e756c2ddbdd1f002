//! [`Core`]: one open database — recovered state, the writer thread, the log.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use parking_lot::{RwLock, RwLockReadGuard};
use std::time::Duration;

use serde_json::{Map, Value as Json};
use sluice_engine::recovery::{recover_checking_snapshot_later, RecoveryError, RecoveryOptions};
use sluice_engine::{Db, SchemaChange, TxError, WriteResult};
use sluice_log::{Durability, Log, LogConfig, LogError};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::Config;
use crate::confirm::Confirmations;
use crate::error::{CoreError, WriterResult};
use crate::writer::{Ack, Request, Writer};

/// One write op of a mutate, already checked for shape (not yet against the schema).
#[derive(Clone, Debug)]
pub enum Op {
    Insert {
        table: String,
        row: Map<String, Json>,
        if_version: Option<u64>,
    },
    Upsert {
        table: String,
        row: Map<String, Json>,
        if_version: Option<u64>,
    },
    Patch {
        table: String,
        id: Json,
        set: Map<String, Json>,
        if_version: Option<u64>,
    },
    Delete {
        table: String,
        id: Json,
        if_version: Option<u64>,
    },
}

/// The ops of a mutate request, as the writer takes them.
#[derive(Debug)]
pub(crate) enum MutateOps {
    /// Checked for shape; converted by the schema on the writer.
    Json(Vec<Op>),
    /// Decoded by the schema on the request's task (`crate::decode`).
    Typed(crate::decode::TypedMutate),
}

/// A committed mutate.
#[derive(Clone, Debug)]
pub struct MutateOk {
    pub seq: u64,
    pub results: Vec<WriteResult>,
}

/// A `POST /v1/sql` script that ran (committed, or wrote nothing).
#[derive(Clone, Debug)]
pub struct SqlOk {
    /// The script's commit, or when it wrote nothing the seq of the state it read.
    pub seq: u64,
    pub wrote: bool,
    pub outcomes: Vec<sluice_query::script::Outcome>,
}

/// A committed (or read-only) function call.
#[derive(Clone, Debug)]
pub struct CallOk {
    /// The call's commit, or for a call that wrote nothing, the seq of the state it read.
    pub seq: u64,
    pub wrote: bool,
    pub result: Json,
}

/// Counters for `/metrics` kept outside the log.
#[derive(Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub rejected: AtomicU64,
    pub snapshots: AtomicU64,
    pub snapshot_failures: AtomicU64,
    /// Bytes of the newest snapshot on disk (0: none yet): the next automatic snapshot
    /// waits for a log of at least `snapshot_log_percent` of it (see `writer::snapshot_due`).
    pub snapshot_bytes: AtomicU64,
    pub writer_batches: AtomicU64,
    pub calls: AtomicU64,
    pub call_failures: AtomicU64,
    pub ws_connections: AtomicU64,
    /// Connections closed because a write to them stalled (`crate::stall`).
    pub stalled_connections: Arc<AtomicU64>,
    /// WebSocket requests read and not yet answered, over all connections.
    pub ws_inflight: AtomicU64,
    /// Mutates from the moment they are queued for the writer until their reply (or
    /// refusal) is settled: the server's share of a client's ack latency.
    pub mutate_latency: sluice_log::latency::LatencyHistogram,
    /// Writer rounds: lock, apply, unlock, hand the frames to the log, reply to `memory`
    /// commits (a submit that waits on back-pressure included).
    pub writer_round_latency: sluice_log::latency::LatencyHistogram,
    /// The nice value the writer thread runs at (`--writer-nice` while backlogged).
    pub writer_nice: AtomicI32,
    /// Times the writer raised its priority for a backlog.
    pub writer_boosts: AtomicU64,
}

/// Facts from startup, for logs and `/metrics`.
#[derive(Clone, Debug)]
pub struct RecoveryInfo {
    pub seq: u64,
    pub snapshot_seq: Option<u64>,
    /// The whole log was replayed in place of the snapshot at `snapshot_seq` (it was cheaper:
    /// the changelog window needed every commit of the log anyway).
    pub whole_log: bool,
    pub replayed: u64,
    pub duration: Duration,
    /// Where `duration` went (`sluice_recovery_*_seconds`).
    pub phases: sluice_engine::recovery::RecoveryPhases,
    pub torn_tail: Option<String>,
    pub skipped_snapshots: Vec<String>,
}

pub(crate) struct Shared {
    pub config: Config,
    /// `Arc` so the writer can lend an owned write guard to a JavaScript call.
    pub db: Arc<RwLock<Db>>,
    pub log: Log<Ack>,
    pub confirm: Arc<Confirmations>,
    pub counters: Counters,
    /// The live-query thread; the writer hands it every commit after applying it.
    pub live: sluice_live::LiveHandle,
    /// Set when a graceful shutdown begins: live streams and WebSockets end with a reason.
    pub closing: watch::Sender<bool>,
    /// Routes confirmed records to watchers.
    pub hub: Arc<crate::topics::Hub>,
    /// The writer hands the hub's thread every commit that touches a topic.
    pub hub_feed: crate::topics::HubFeed,
    /// Checks bearer tokens.
    pub auth: crate::auth::Authenticator,
    /// Row policies compiled per table.
    pub rules: crate::rules::RulesCache,
    /// Table schemas for the typed mutate decoder (`crate::decode`).
    pub schemas: crate::decode::SchemaCache,
    /// The node's cluster role and the `replicated` commits waiting for the quorum.
    pub cluster: crate::replication::ClusterState,
    /// Encodes large snapshots' chunks off the runtime's workers.
    pub encoder: crate::encoder::Encoder,
    /// The check of the snapshot startup's whole-log replay stood in for, run after ready;
    /// the snapshotter waits for it before it lists the snapshots it keeps.
    pub startup_check: Arc<crate::snapshotter::StartupCheck>,
}

/// An open database. Cheap to clone; all clones share the one writer.
#[derive(Clone)]
pub struct Core {
    pub(crate) shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    recovery: Arc<RecoveryInfo>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("recovery failed: {0}")]
    Recovery(#[from] RecoveryError),
    #[error("cannot open the log: {0}")]
    Log(#[from] LogError),
    #[error("the functions module does not load: {0}")]
    Functions(#[from] sluice_functions::FunctionError),
    #[error("cannot start a thread: {source}")]
    Thread { source: std::io::Error },
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read or create the admin token {path}: {source}")]
    AdminToken {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// How long a read waits for the database lock on the thread it runs on before handing that
/// thread's other work elsewhere ([`Core::db`]): longer than an ordinary writer round, so the
/// hand-off (a thread switch) is paid only for long ones.
pub const READ_LOCK_WAIT_ON_WORKER: Duration = Duration::from_millis(2);

impl Core {
    /// Recovers the data directory and starts the writer. Blocking; call it before serving.
    pub fn open(config: Config) -> Result<Core, OpenError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::DataDir {
            path: dir.clone(),
            source,
        })?;
        remove_temp_files(&dir);
        let (recovered, unchecked) = recover_checking_snapshot_later(
            &dir,
            &RecoveryOptions {
                limits: config.limits.clone(),
                retention: config.retention,
                repair: true,
                keep_zero_tail: config.log_prepare_segments && config.log_files.0.prepares(),
            },
        )?;
        let seq = recovered.db.seq;
        let log_bytes_since_snapshot = recovered.replayed_bytes;
        let info = RecoveryInfo {
            seq,
            snapshot_seq: recovered.snapshot_seq,
            whole_log: recovered.whole_log,
            replayed: recovered.replayed,
            duration: recovered.duration,
            phases: recovered.phases,
            torn_tail: recovered.torn_tail,
            skipped_snapshots: recovered.skipped_snapshots,
        };
        let confirm = Arc::new(Confirmations::new(seq));
        let mut log_config = LogConfig::new(&dir);
        log_config.segment_bytes_max = config.segment_bytes_max;
        log_config.pending_bytes_max = config.log_pending_bytes_max;
        log_config.sync_threads = config.log_sync_threads;
        log_config.sync_inline_below = config.log_sync_inline_below;
        log_config.prepare_segments = config.log_prepare_segments;
        log_config.resume_newest_at = recovered.newest_zero_tail_at;
        log_config.files = config.log_files.0.clone();
        let progress_confirm = confirm.clone();
        let log = Log::open(log_config, seq, move |p| progress_confirm.progressed(p))?;
        let (tx, rx) = mpsc::channel(config.writer_queue_max);
        let hub = Arc::new(crate::topics::Hub::new(
            &recovered.db,
            config.watch_queue_records,
        ));
        let (hub_feed, hub_rounds) = crate::topics::hub_channel();
        let db = Arc::new(RwLock::new(recovered.db));
        let live = sluice_live::LiveHandle::spawn(db.clone(), config.live.clone())
            .map_err(|source| OpenError::Thread { source })?;
        let auth = crate::auth::Authenticator::new(&config.auth, &dir).map_err(|source| {
            OpenError::AdminToken {
                path: dir.join(crate::auth::ADMIN_TOKEN_FILE),
                source,
            }
        })?;
        let cluster = crate::replication::ClusterState::default();
        if config.follower {
            // From the start, so the writer never commits anything of its own (the
            // ticker's topic expiry) before the cluster's commits arrive.
            *cluster.role.write() = crate::replication::Role::Follower { leader: None };
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let encoder = crate::encoder::Encoder::start(crate::encoder::Encoder::threads_for(cores))
            .map_err(|source| OpenError::Thread { source })?;
        // The newest snapshot's size paces the next one (`Config::snapshot_log_percent`).
        let snapshot_bytes = sluice_log::snapshot::list_snapshots(&config.data_dir)
            .ok()
            .and_then(|s| s.last().and_then(|(_, path)| std::fs::metadata(path).ok()))
            .map_or(0, |m| m.len());
        let shared = Arc::new(Shared {
            encoder,
            auth,
            rules: Default::default(),
            schemas: Default::default(),
            config,
            db,
            log,
            confirm,
            counters: Counters {
                snapshot_bytes: snapshot_bytes.into(),
                ..Counters::default()
            },
            live,
            closing: watch::Sender::new(false),
            hub,
            hub_feed,
            cluster,
            startup_check: Arc::default(),
        });
        if let Some(unchecked) = unchecked {
            let dir = shared.config.data_dir.clone();
            crate::snapshotter::StartupCheck::start(&shared.startup_check, dir, unchecked)
                .map_err(|source| OpenError::Thread { source })?;
        }
        let weak = Arc::downgrade(&shared);
        crate::topics::spawn_hub(
            hub_rounds,
            shared.hub.clone(),
            shared.confirm.clone(),
            move || weak.upgrade().and_then(|s| s.log.poisoned()),
        )
        .map_err(|source| OpenError::Thread { source })?;
        let writer = Writer::spawn(shared.clone(), rx, tx.downgrade(), log_bytes_since_snapshot)?;
        crate::writer::spawn_ticker(tx.downgrade())
            .map_err(|source| OpenError::Thread { source })?;
        Ok(Core {
            shared,
            requests: tx,
            writer: Arc::new(Mutex::new(Some(writer))),
            recovery: Arc::new(info),
        })
    }

    pub(crate) fn authenticator(&self) -> &crate::auth::Authenticator {
        &self.shared.auth
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// `listener` with this server's `--write-timeout-ms` on every connection it accepts
    /// (see [`crate::stall`]); closures count in `sluice_stalled_connections_total`.
    pub fn stall_guard<L: axum::serve::Listener>(
        &self,
        listener: L,
    ) -> crate::stall::StallGuard<L> {
        crate::stall::StallGuard::new(
            listener,
            self.shared.config.write_timeout,
            self.shared.counters.stalled_connections.clone(),
        )
    }

    /// The live-query engine's thread.
    pub fn live(&self) -> &sluice_live::LiveHandle {
        &self.shared.live
    }

    pub fn recovery(&self) -> &RecoveryInfo {
        &self.recovery
    }

    /// Tells the core that its server listens: work deferred until then begins (the check
    /// of the snapshot startup replayed the whole log in place of, `snapshotter::StartupCheck`;
    /// without this call it begins a second after `Core::open`).
    pub fn serving(&self) {
        self.shared.startup_check.go();
    }

    /// Returns once the snapshot startup replayed the whole log in place of (if any) has been
    /// checked (`snapshotter::StartupCheck`, a few ms after the server listens, at once if it
    /// had not begun; about a second for a GiB snapshot): from then on the recovery figures
    /// in `/metrics` are final.
    pub async fn startup_checked(&self) {
        let check = self.shared.startup_check.clone();
        if check.is_pending() {
            let _ = tokio::task::spawn_blocking(move || check.wait()).await;
        }
    }

    /// Seq of the newest commit that reached its durability class (what reads show).
    pub fn confirmed_seq(&self) -> u64 {
        self.shared.confirm.confirmed()
    }

    pub fn poisoned(&self) -> Option<String> {
        self.shared.log.poisoned()
    }

    /// Queues a request for the writer (waiting while the queue is full) and returns the
    /// receiver of its reply. Requests queued in order are applied in that order.
    pub(crate) async fn enqueue<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<WriterResult<T>>) -> Request,
    ) -> Result<oneshot::Receiver<WriterResult<T>>, CoreError> {
        let (reply, rx) = oneshot::channel();
        self.requests
            .send(make(reply))
            .await
            .map_err(|_| CoreError::ShuttingDown)?;
        Ok(rx)
    }

    /// The writer's reply to a queued request. A refusal decided on the database's state is
    /// returned only once that state is confirmed — like a success — so a `conflict` or a
    /// `not_found` never contradicts what recovery will show; if the log fails first, the
    /// caller gets that failure instead.
    pub(crate) async fn settle<T>(
        &self,
        rx: oneshot::Receiver<WriterResult<T>>,
    ) -> Result<T, CoreError> {
        match rx.await {
            Err(_) => Err(CoreError::ShuttingDown),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(refusal)) => {
                if refusal.read_seq > 0 && refusal.error.read_state() {
                    self.wait_confirmed(refusal.read_seq).await?;
                }
                Err(refusal.error)
            }
        }
    }

    pub(crate) async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<WriterResult<T>>) -> Request,
    ) -> Result<T, CoreError> {
        let rx = self.enqueue(make).await?;
        self.settle(rx).await
    }

    /// Applies `ops` atomically; returns once the commit reached `durability`.
    pub async fn mutate(
        &self,
        ops: Vec<Op>,
        durability: Option<Durability>,
    ) -> Result<MutateOk, CoreError> {
        self.mutate_as(&crate::auth::Caller::Admin, ops, durability)
            .await
    }

    /// [`Core::mutate`] for `caller`: a client's changes must pass the table's write
    /// policies, or the whole mutate is refused with `forbidden`.
    pub async fn mutate_as(
        &self,
        caller: &crate::auth::Caller,
        ops: Vec<Op>,
        durability: Option<Durability>,
    ) -> Result<MutateOk, CoreError> {
        self.mutate_ops(caller, MutateOps::Json(ops), durability)
            .await
    }

    /// Sends mutate ops to the writer and waits for their outcome, timed for
    /// `sluice_mutate_seconds` (queued for the writer → reply settled).
    async fn mutate_ops(
        &self,
        caller: &crate::auth::Caller,
        ops: MutateOps,
        durability: Option<Durability>,
    ) -> Result<MutateOk, CoreError> {
        let durability = durability.unwrap_or(self.shared.config.durability);
        let claims = caller.claims().cloned();
        let started = std::time::Instant::now();
        let result = self
            .call(|reply| Request::Mutate {
                ops,
                claims,
                durability,
                reply,
            })
            .await;
        self.shared
            .counters
            .mutate_latency
            .record(started.elapsed());
        result
    }

    /// Decodes a mutate body (`{"ops": [...], "durability"?}` JSON) straight into rows by
    /// the tables' schemas, on the calling task. `None` when the general path
    /// ([`crate::api::parse_ops`] and [`Core::mutate_as`]) must decide: anything unusual,
    /// including every body it would refuse.
    pub fn decode_mutate(&self, body: axum::body::Bytes) -> Option<crate::decode::TypedMutate> {
        self.decode_with(|schemas, ops_max| {
            crate::decode::decode_mutate(body.clone(), schemas, ops_max)
        })
    }

    /// [`Core::decode_mutate`] for a WebSocket `mutate` request (a JSON text or MessagePack
    /// frame): its `id` and ops, or `None` when the general path must decide.
    pub fn decode_ws_mutate(
        &self,
        frame: crate::decode::KeptBody,
    ) -> Option<(serde_json::Value, crate::decode::TypedMutate)> {
        self.decode_with(|schemas, ops_max| {
            crate::decode::decode_ws_mutate(frame.clone(), schemas, ops_max)
        })
    }

    /// Runs a typed decoder against the schema cache; if it gives up while the cache may be
    /// stale (a column added since it was read, say), reads the schemas again and tries once
    /// more — if the database lock is free: a request task never waits for the writer's
    /// round here (`None` sends the request the general way; see
    /// [`crate::decode::SchemaCache`]).
    fn decode_with<T>(
        &self,
        decode: impl Fn(&mut dyn crate::decode::Schemas, usize) -> Option<T>,
    ) -> Option<T> {
        let cache = &self.shared.schemas;
        let mut schemas = crate::decode::CachedSchemas {
            cache,
            db: &self.shared.db,
            map: cache.get(),
            refreshed: false,
        };
        let ops_max = self.shared.config.ops_per_mutate_max;
        if let Some(decoded) = decode(&mut schemas, ops_max) {
            return Some(decoded);
        }
        if schemas.refreshed {
            return None;
        }
        let db = self.shared.db.try_read()?;
        if cache.is_current(&db) {
            return None;
        }
        schemas.map = cache.refresh(&db);
        drop(db);
        schemas.refreshed = true;
        decode(&mut schemas, ops_max)
    }

    /// [`Core::mutate_as`] with ops from [`Core::decode_mutate`] (durability: the body's,
    /// else the server's default).
    pub async fn mutate_decoded_as(
        &self,
        caller: &crate::auth::Caller,
        decoded: crate::decode::TypedMutate,
    ) -> Result<MutateOk, CoreError> {
        let durability = decoded.durability;
        self.mutate_ops(caller, MutateOps::Typed(decoded), durability)
            .await
    }

    /// The compiled row rules of `table` in `db` (cached per schema state).
    pub(crate) fn rules(
        &self,
        db: &Db,
        table: &str,
    ) -> Result<Arc<sluice_query::rules::TableRules>, CoreError> {
        self.shared.rules.get(db, table)
    }

    /// Runs exported function `name` as a transaction; returns once its commit reached
    /// `durability` (a call that wrote nothing returns once the state it read is confirmed).
    pub async fn call_function(
        &self,
        name: String,
        args: Json,
        durability: Option<Durability>,
    ) -> Result<CallOk, CoreError> {
        self.call_function_as(&crate::auth::Caller::Admin, name, args, durability)
            .await
    }

    /// [`Core::call_function`] for `caller`: a client may call only what the module's
    /// `allow` export lets it; the function sees the caller as `tx.auth`.
    pub async fn call_function_as(
        &self,
        caller: &crate::auth::Caller,
        name: String,
        args: impl Into<sluice_functions::Args>,
        durability: Option<Durability>,
    ) -> Result<CallOk, CoreError> {
        let durability = durability.unwrap_or(self.shared.config.durability);
        let claims = caller.claims().cloned();
        let args = args.into();
        let ok = self
            .call(|reply| Request::Call {
                name,
                args,
                claims,
                durability,
                reply,
            })
            .await?;
        if !ok.wrote {
            self.wait_confirmed(ok.seq).await?;
        }
        Ok(ok)
    }

    /// Replaces the functions module; on a compile error the old module stays.
    pub async fn load_functions(&self, source: String) -> Result<Vec<String>, CoreError> {
        self.call(|reply| Request::LoadFunctions { source, reply })
            .await
    }

    /// Names the loaded module exports.
    pub async fn functions(&self) -> Result<Vec<String>, CoreError> {
        self.call(|reply| Request::ListFunctions { reply }).await
    }

    /// Applies schema changes as one transaction. `Ok(None)`: nothing to do (IF [NOT] EXISTS).
    pub async fn ddl(
        &self,
        changes: Vec<SchemaChange>,
        sql: String,
        durability: Option<Durability>,
    ) -> Result<Option<u64>, CoreError> {
        let durability = durability.unwrap_or(self.shared.config.durability);
        self.call(|reply| Request::Schema {
            changes,
            sql,
            durability,
            reply,
        })
        .await
    }

    /// Runs `f` on the current state and returns its result with the seq it reflects,
    /// once that seq is confirmed (so nothing not yet durable at its class is shown) — its
    /// error too.
    pub async fn read<T>(
        &self,
        f: impl FnOnce(&Db) -> Result<T, TxError>,
    ) -> Result<(T, u64), CoreError> {
        let (value, seq) = {
            let db = self.db();
            (f(&db), db.seq)
        };
        // A read's refusal (`not_found`, say) is decided on this state too: it waits for it
        // like a result does, so it never contradicts what recovery will show.
        self.wait_confirmed(seq).await?;
        Ok((value?, seq))
    }

    /// One `SELECT` over one confirmed seq, as `caller` may see it: a client reads every
    /// table through its `SELECT` policies.
    pub async fn query_as(
        &self,
        caller: &crate::auth::Caller,
        sql: &str,
        params: &sluice_query::Params,
    ) -> Result<(sluice_query::QueryResult, u64), CoreError> {
        let claims = caller.claims().map(|c| &c.all);
        let (result, seq) = self
            .read(|db| {
                Ok(sluice_query::prepare_as(sql, db, claims.is_some())
                    .and_then(|plan| plan.execute_as(db, params, claims)))
            })
            .await?;
        Ok((result?, seq))
    }

    /// Runs a script of data statements (`POST /v1/sql`) as `caller`: a read-only script
    /// over one confirmed seq, anything else as one transaction in the writer.
    pub async fn sql_as(
        &self,
        caller: &crate::auth::Caller,
        script: Arc<sluice_query::script::Script>,
        params: sluice_query::Params,
        durability: Option<Durability>,
    ) -> Result<SqlOk, CoreError> {
        let claims = caller.claims().cloned();
        if script.is_read_only() {
            let (results, seq) = self
                .read(|db| Ok(script.read(db, &params, claims.as_deref().map(|c| &c.all))))
                .await?;
            let results = results.map_err(|f| CoreError::Statement {
                statement: f.statement,
                error: Box::new(f.error.into()),
            })?;
            return Ok(SqlOk {
                seq,
                wrote: false,
                outcomes: results
                    .into_iter()
                    .map(sluice_query::script::Outcome::Rows)
                    .collect(),
            });
        }
        let durability = durability.unwrap_or(self.shared.config.durability);
        let ok = self
            .call(|reply| Request::Sql {
                script,
                params,
                claims,
                durability,
                reply,
            })
            .await?;
        if !ok.wrote {
            self.wait_confirmed(ok.seq).await?;
        }
        Ok(ok)
    }

    /// Waits until every commit up to `seq` reached its durability class.
    pub async fn wait_confirmed(&self, seq: u64) -> Result<(), CoreError> {
        // The common case on the fan-out path (every live event) needs no watch receiver.
        if self.shared.confirm.confirmed() >= seq {
            return Ok(());
        }
        let mut rx: watch::Receiver<u64> = self.shared.confirm.subscribe();
        loop {
            let waited =
                tokio::time::timeout(Duration::from_millis(100), rx.wait_for(|&c| c >= seq)).await;
            match waited {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(_)) => return Err(CoreError::ShuttingDown),
                Err(_) => {
                    if let Some(reason) = self.poisoned() {
                        return Err(CoreError::Poisoned(reason));
                    }
                }
            }
        }
    }

    /// Read access to the state *as applied* (may include unconfirmed commits): what every
    /// read takes ([`Core::read`], point reads, topics, metrics).
    ///
    /// The writer holds the lock for whole rounds, and a round can last as long as a server
    /// function's time limit or a DDL over a large table. A request task waiting for it
    /// holds its runtime worker, and with as many such reads as workers, every request
    /// (`/health` included) waits for the round. So a read waits at most
    /// [`READ_LOCK_WAIT_ON_WORKER`] as it is; past that, on a multi-threaded runtime, the wait
    /// goes through [`tokio::task::block_in_place`], which hands the worker's other tasks to
    /// another thread first.
    pub fn db(&self) -> RwLockReadGuard<'_, Db> {
        if let Some(db) = self.shared.db.try_read_for(READ_LOCK_WAIT_ON_WORKER) {
            return db;
        }
        let on_workers = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_workers {
            tokio::task::block_in_place(|| self.shared.db.read())
        } else {
            self.shared.db.read()
        }
    }

    /// Asks the writer for a snapshot now and waits until it is durable.
    pub async fn snapshot(&self) -> Result<u64, CoreError> {
        self.call(|reply| Request::Snapshot { reply }).await
    }

    /// Starts a graceful shutdown: every live stream gets a final `shutting_down` error event
    /// and every WebSocket a close frame (1001, going away), so their connections end and
    /// the server can stop within its grace period. Writes still work until [`Core::shutdown`].
    pub fn begin_shutdown(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Whether [`Core::begin_shutdown`] was called; `changed()` wakes on it.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.shared.closing.subscribe()
    }

    /// Stops taking requests, lets the writer finish what is queued, writes a final
    /// snapshot, and syncs and closes the log.
    pub async fn shutdown(&self) -> Result<(), CoreError> {
        self.begin_shutdown();
        let result = self.call(|reply| Request::Shutdown { reply }).await;
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        result
    }

    /// This node's cluster role.
    pub fn role(&self) -> crate::replication::Role {
        self.shared.cluster.role()
    }

    /// Makes this node a follower: client writes are refused with `not_leader` naming
    /// `leader`; commits come in through [`Core::apply_replicated`].
    pub fn set_follower(&self, leader: Option<String>) {
        *self.shared.cluster.role.write() = crate::replication::Role::Follower { leader };
    }

    /// Makes this node the leader: from the next writer round on, every round's frames go
    /// to `replicator`. Returns the applied seq S at the switch (under the write lock, so
    /// no round straddles it): the replicator gets every commit after S, and the
    /// cluster's log **must** hold S's commit already.
    pub fn set_leader(&self, replicator: Arc<dyn crate::replication::Replicator>) -> u64 {
        let db = self.shared.db.write();
        *self.shared.cluster.role.write() = crate::replication::Role::Leader(replicator);
        db.seq
    }

    /// The cluster's replicated log holds every commit up to `seq` (a quorum acknowledged
    /// it): `replicated` commits up to there are acknowledged once also written locally.
    pub fn replicated(&self, seq: u64) {
        self.shared.confirm.replicated(seq);
        self.shared.cluster.replicated(seq);
    }

    /// The replicated log refused or lost this leader's commits (`reason`): every
    /// `replicated` commit still waiting fails, and the node stops taking writes (it is a
    /// follower that knows no leader) — a deposed leader's later commits would never
    /// reach the cluster.
    pub fn replication_failed(&self, reason: String) {
        self.set_follower(None);
        self.shared
            .cluster
            .fail_waiting(&CoreError::Replication(reason));
    }

    /// A follower's commits: whole log frames from the cluster, in seq order. Applied on
    /// the writer thread (frames at or below the applied seq are skipped); returns the
    /// applied seq. An error means this node's state and the cluster's diverged.
    pub async fn apply_replicated(&self, frames: Vec<bytes::Bytes>) -> Result<u64, CoreError> {
        let rx = self
            .enqueue(|reply| Request::Replicate { frames, reply })
            .await?;
        match rx.await {
            Err(_) => Err(CoreError::ShuttingDown),
            Ok(result) => result.map_err(|r| r.error),
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    pub(crate) fn log_stats(&self) -> sluice_log::LogStats {
        self.shared.log.stats()
    }

    pub(crate) fn log_append_latency(&self) -> &sluice_log::latency::LatencyHistogram {
        self.shared.log.append_latency()
    }

    pub(crate) fn log_round_latency(&self) -> &sluice_log::latency::LatencyHistogram {
        self.shared.log.round_latency()
    }

    pub fn commits(&self) -> u64 {
        self.shared.counters.commits.load(Ordering::Relaxed)
    }

    pub fn syncs(&self) -> u64 {
        self.shared.log.stats().syncs
    }
}

fn remove_temp_files(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
