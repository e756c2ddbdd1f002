//! The peers' application tier: an HTTP RPC server in front of PostgreSQL or SQLite, the
//! keynote's "client → web server → database" architecture.
//!
//! It answers `POST /v1/call/transfer {"args": {"from", "to", "amount"}}` exactly as
//! `sluice serve` does — `{"result": null}`, or a 400 with
//! `{"error": {"code": "function_error", "message": "insufficient_funds: …"}}` — so the very
//! same HTTP client drives all three. The transfer is the bank module's logic
//! (`examples/bank.js`): refuse the same account, a missing account, or a short balance;
//! else move the amount, in one transaction:
//!
//! - [`Backend::Postgres`]: a pool of connections ([`PgPool`]), `BEGIN` (the cluster runs
//!   with `default_transaction_isolation = serializable`), `SELECT id, balance … FOR
//!   UPDATE` of both rows in id order, two `UPDATE`s, `COMMIT`; retried on 40001, 40P01
//!   and 55P03 ([`PG_ATTEMPTS_MAX`] attempts, full-jitter backoff, as the keynote's
//!   `retry.ts`).
//! - [`Backend::Sqlite`]: one connection in WAL mode with `synchronous=FULL`, owned by a
//!   dedicated thread ([`SqliteDb`]); `BEGIN IMMEDIATE`, `SELECT`, two `UPDATE`s, `COMMIT`.
//!
//! The server runs on its own tokio runtime (its own threads), so its work is not
//! scheduled among the load clients' tasks; it is stopped by dropping [`RpcServer`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};

use super::workload::{CREATE_SQLITE, INITIAL_BALANCE};

/// Attempts of one PostgreSQL transfer (the first and up to nine retries).
pub const PG_ATTEMPTS_MAX: u32 = 10;
/// Backoff cap before retry `n` is `min(PG_BACKOFF_MAX, PG_BACKOFF_BASE × 2^n)`; the
/// delay is uniform in [0, cap) (full jitter).
const PG_BACKOFF_BASE: Duration = Duration::from_millis(5);
const PG_BACKOFF_MAX: Duration = Duration::from_millis(200);
/// Transfers queued for the SQLite thread before handlers wait.
const SQLITE_QUEUE_MAX: usize = 4096;
/// Accounts per INSERT statement batch while loading SQLite (one transaction in all).
const SQLITE_LOAD_BATCH: u32 = 10_000;

/// Why a transfer did not happen.
#[derive(Debug)]
pub enum Refusal {
    /// The bank's rules said no, or PostgreSQL kept failing to serialize: a 400
    /// `function_error` (or `serialization_failure`) to the client.
    Refused { code: &'static str, message: String },
    /// The database failed: a 500.
    Internal(String),
}

impl Refusal {
    fn bank(kind: &str, detail: impl std::fmt::Display) -> Refusal {
        Refusal::Refused {
            code: "function_error",
            message: format!("{kind}: {detail}"),
        }
    }
}

/// The database behind the RPC server.
pub enum Backend {
    Postgres(PgPool),
    Sqlite(SqliteDb),
}

impl Backend {
    pub async fn transfer(&self, from: i64, to: i64, amount: i64) -> Result<(), Refusal> {
        if from == to {
            return Err(Refusal::bank(
                "same_account",
                "cannot transfer to the same account",
            ));
        }
        match self {
            Backend::Postgres(pool) => pool.transfer(from, to, amount).await,
            Backend::Sqlite(db) => db.transfer(from, to, amount).await,
        }
    }

    /// Transactions retried after a serialization failure or deadlock (PostgreSQL only).
    pub fn retries(&self) -> Option<u64> {
        match self {
            Backend::Postgres(pool) => Some(pool.retries.load(Ordering::Relaxed)),
            Backend::Sqlite(_) => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The HTTP server.

/// A running RPC server on a loopback port, on its own runtime.
pub struct RpcServer {
    pub url: String,
    pub backend: Arc<Backend>,
    _runtime: BackgroundRuntime,
}

/// A runtime shut down in the background when dropped: dropping a runtime the ordinary
/// way blocks, which is not allowed inside another runtime's task (where the bench is).
struct BackgroundRuntime(Option<tokio::runtime::Runtime>);

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer").field("url", &self.url).finish()
    }
}

#[derive(Deserialize)]
struct CallBody {
    args: CallArgs,
    /// Accepted for the same request shape as Sluice; every commit here is durable.
    #[serde(default)]
    #[allow(dead_code)]
    durability: Option<String>,
}

#[derive(Deserialize)]
struct CallArgs {
    from: i64,
    to: i64,
    amount: i64,
}

async fn call_transfer(
    State(backend): State<Arc<Backend>>,
    Json(body): Json<CallBody>,
) -> Response {
    let CallArgs { from, to, amount } = body.args;
    match backend.transfer(from, to, amount).await {
        Ok(()) => Json(json!({ "result": null })).into_response(),
        Err(Refusal::Refused { code, message }) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"code": code, "message": message}})),
        )
            .into_response(),
        Err(Refusal::Internal(message)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": {"code": "internal", "message": message}})),
        )
            .into_response(),
    }
}

impl RpcServer {
    /// Builds the backend with `make` on the server's runtime (so PostgreSQL connection
    /// tasks live there too), then serves on a free loopback port.
    pub async fn start<F>(label: &str, make: F) -> anyhow::Result<RpcServer>
    where
        F: std::future::Future<Output = anyhow::Result<Backend>> + Send + 'static,
    {
        let runtime = BackgroundRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .thread_name(format!("rpc-{label}"))
                .enable_all()
                .build()?,
        ));
        let rt = runtime.0.as_ref().expect("just built");
        let backend = Arc::new(rt.spawn(make).await??);
        let app = Router::new()
            .route("/v1/call/transfer", post(call_transfer))
            .route("/health", get(|| async { "ok" }))
            .with_state(backend.clone());
        let addr = rt
            .spawn(async move {
                use axum::serve::ListenerExt;
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let addr = listener.local_addr()?;
                // Nagle off, as Node's HTTP server does by default.
                let listener = listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                });
                anyhow::Ok(addr)
            })
            .await??;
        Ok(RpcServer {
            url: format!("http://{addr}"),
            backend,
            _runtime: runtime,
        })
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL.

struct PgConn {
    client: Client,
    select: Statement,
    update: Statement,
}

/// A fixed pool of connections: a semaphore counts the free ones, a mutex guards the
/// list (held only to push or pop, never across an await).
pub struct PgPool {
    conns: Mutex<Vec<PgConn>>,
    free: Semaphore,
    retries: AtomicU64,
    /// State of the backoff jitter's PRNG (splitmix64).
    jitter: AtomicU64,
}

struct PgLease<'a> {
    pool: &'a PgPool,
    conn: Option<PgConn>,
    // Released after the connection is back in the list (fields drop after `drop`).
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for PgLease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.conns.lock().expect("pool poisoned").push(conn);
        }
    }
}

fn retryable(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::LOCK_NOT_AVAILABLE
    })
}

impl PgPool {
    /// Opens `size` connections to `conn_string` and prepares the transfer's statements on
    /// each. Must run on the runtime that will use them (their driver tasks spawn there).
    pub async fn connect(conn_string: &str, size: usize) -> anyhow::Result<PgPool> {
        let mut conns = Vec::with_capacity(size);
        for _ in 0..size {
            let (client, connection) = tokio_postgres::connect(conn_string, tokio_postgres::NoTls)
                .await
                .context("cannot connect to postgres")?;
            tokio::spawn(async move {
                // Ends with an error when postgres stops; nothing to do then.
                let _ = connection.await;
            });
            let select = client
                .prepare(
                    "SELECT id, balance FROM accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE",
                )
                .await?;
            let update = client
                .prepare("UPDATE accounts SET balance = $1 WHERE id = $2")
                .await?;
            conns.push(PgConn {
                client,
                select,
                update,
            });
        }
        Ok(PgPool {
            conns: Mutex::new(conns),
            free: Semaphore::new(size),
            retries: AtomicU64::new(0),
            jitter: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        })
    }

    async fn lease(&self) -> PgLease<'_> {
        let permit = self.free.acquire().await.expect("the pool is never closed");
        let conn = self.conns.lock().expect("pool poisoned").pop();
        PgLease {
            pool: self,
            conn: Some(conn.expect("a permit means a free connection")),
            _permit: permit,
        }
    }

    /// A uniform fraction in [0, 1) for the backoff jitter.
    fn jitter(&self) -> f64 {
        let mut z = self
            .jitter
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn transfer(&self, from: i64, to: i64, amount: i64) -> Result<(), Refusal> {
        let (from32, to32) = match (i32::try_from(from), i32::try_from(to)) {
            (Ok(f), Ok(t)) => (f, t),
            _ => return Err(Refusal::bank("missing_account", "id out of range")),
        };
        let mut attempt = 1;
        loop {
            let result = {
                // A connection per attempt, returned during the backoff (as a pool does).
                let mut lease = self.lease().await;
                let conn = lease.conn.as_mut().expect("leased");
                transfer_once(conn, from32, to32, amount).await
            };
            match result {
                Ok(outcome) => return outcome,
                Err(e) if retryable(&e) && attempt < PG_ATTEMPTS_MAX => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    let cap = PG_BACKOFF_BASE
                        .saturating_mul(1 << attempt.min(16))
                        .min(PG_BACKOFF_MAX);
                    tokio::time::sleep(cap.mul_f64(self.jitter())).await;
                    attempt += 1;
                }
                Err(e) if retryable(&e) => {
                    return Err(Refusal::Refused {
                        code: "serialization_failure",
                        message: format!("gave up after {attempt} attempts: {e}"),
                    })
                }
                Err(e) => return Err(Refusal::Internal(format!("postgres: {e}"))),
            }
        }
    }
}

/// One attempt: the outer error is PostgreSQL's (maybe retryable), the inner the bank's.
async fn transfer_once(
    conn: &mut PgConn,
    from: i32,
    to: i32,
    amount: i64,
) -> Result<Result<(), Refusal>, tokio_postgres::Error> {
    // A transaction dropped before commit sends ROLLBACK ahead of the connection's next
    // query, so an error anywhere below leaves the connection clean for the next lease.
    let tx = conn.client.transaction().await?;
    let rows = tx.query(&conn.select, &[&from, &to]).await?;
    let (mut from_balance, mut to_balance) = (None, None);
    for row in &rows {
        let id: i32 = row.get(0);
        let balance: i64 = row.get(1);
        if id == from {
            from_balance = Some(balance);
        } else if id == to {
            to_balance = Some(balance);
        }
    }
    let (Some(from_balance), Some(to_balance)) = (from_balance, to_balance) else {
        tx.rollback().await?;
        let missing = if from_balance.is_none() { from } else { to };
        return Ok(Err(Refusal::bank(
            "missing_account",
            format!("no account {missing}"),
        )));
    };
    if from_balance < amount {
        tx.rollback().await?;
        return Ok(Err(Refusal::bank(
            "insufficient_funds",
            format!("account {from} has {from_balance}"),
        )));
    }
    tx.execute(&conn.update, &[&(from_balance - amount), &from])
        .await?;
    tx.execute(&conn.update, &[&(to_balance + amount), &to])
        .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

// ---------------------------------------------------------------------------------------
// SQLite.

enum Job {
    Transfer {
        from: i64,
        to: i64,
        amount: i64,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    /// Every (id, balance).
    Balances {
        reply: oneshot::Sender<Result<Vec<(i64, i64)>, String>>,
    },
}

/// One SQLite connection owned by a dedicated thread; requests queue for it.
pub struct SqliteDb {
    jobs: mpsc::Sender<Job>,
    pub path: PathBuf,
}

impl SqliteDb {
    /// Creates the database at `path` (WAL, `synchronous=FULL`), loads `accounts`
    /// accounts, and starts the thread that serves transfers.
    pub async fn open(path: &Path, accounts: u32) -> anyhow::Result<SqliteDb> {
        let (jobs, rx) = mpsc::channel(SQLITE_QUEUE_MAX);
        let (ready_tx, ready_rx) = oneshot::channel();
        let db_path = path.to_path_buf();
        std::thread::Builder::new()
            .name("sqlite".into())
            .spawn(move || match sqlite_open(&db_path, accounts) {
                Ok(conn) => {
                    let _ = ready_tx.send(Ok(()));
                    sqlite_serve(conn, rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        ready_rx
            .await
            .context("the SQLite thread died while opening")??;
        Ok(SqliteDb {
            jobs,
            path: path.to_path_buf(),
        })
    }

    async fn transfer(&self, from: i64, to: i64, amount: i64) -> Result<(), Refusal> {
        let (reply, rx) = oneshot::channel();
        let stopped = || Refusal::Internal("the SQLite thread stopped".into());
        self.jobs
            .send(Job::Transfer {
                from,
                to,
                amount,
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Every `(id, balance)`, read through the serving connection.
    pub async fn balances(&self) -> anyhow::Result<Vec<(i64, i64)>> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job::Balances { reply })
            .await
            .map_err(|_| anyhow::anyhow!("the SQLite thread stopped"))?;
        rx.await
            .context("the SQLite thread stopped")?
            .map_err(|e| anyhow::anyhow!("SQLite balances: {e}"))
    }
}

fn sqlite_open(path: &Path, accounts: u32) -> anyhow::Result<rusqlite::Connection> {
    let mut conn = rusqlite::Connection::open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    anyhow::ensure!(
        mode.eq_ignore_ascii_case("wal"),
        "SQLite refused WAL mode ({mode})"
    );
    conn.execute_batch("PRAGMA synchronous=FULL")?;
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    anyhow::ensure!(
        sync == 2,
        "SQLite runs with synchronous={sync}, expected 2 (FULL)"
    );
    conn.execute_batch(CREATE_SQLITE)?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare("INSERT INTO accounts (id, balance) VALUES (?1, ?2)")?;
        let mut id = 0;
        while id < accounts {
            let end = (id + SQLITE_LOAD_BATCH).min(accounts);
            for i in id..end {
                insert.execute(rusqlite::params![i, INITIAL_BALANCE])?;
            }
            id = end;
        }
    }
    tx.commit()?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    Ok(conn)
}

fn sqlite_serve(mut conn: rusqlite::Connection, mut jobs: mpsc::Receiver<Job>) {
    while let Some(job) = jobs.blocking_recv() {
        match job {
            Job::Transfer {
                from,
                to,
                amount,
                reply,
            } => {
                let outcome = sqlite_transfer(&mut conn, from, to, amount)
                    .unwrap_or_else(|e| Err(Refusal::Internal(format!("sqlite: {e}"))));
                let _ = reply.send(outcome);
            }
            Job::Balances { reply } => {
                let read = || -> rusqlite::Result<Vec<(i64, i64)>> {
                    let mut select = conn.prepare_cached("SELECT id, balance FROM accounts")?;
                    let rows = select.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    rows.collect()
                };
                let _ = reply.send(read().map_err(|e| e.to_string()));
            }
        }
    }
}

fn sqlite_transfer(
    conn: &mut rusqlite::Connection,
    from: i64,
    to: i64,
    amount: i64,
) -> rusqlite::Result<Result<(), Refusal>> {
    // Dropped without commit (a refusal, an error): rolled back.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let (mut from_balance, mut to_balance) = (None, None);
    {
        let mut select =
            tx.prepare_cached("SELECT id, balance FROM accounts WHERE id IN (?1, ?2)")?;
        let mut rows = select.query(rusqlite::params![from, to])?;
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            let balance: i64 = row.get(1)?;
            if id == from {
                from_balance = Some(balance);
            } else if id == to {
                to_balance = Some(balance);
            }
        }
    }
    let (Some(from_balance), Some(to_balance)) = (from_balance, to_balance) else {
        let missing = if from_balance.is_none() { from } else { to };
        return Ok(Err(Refusal::bank(
            "missing_account",
            format!("no account {missing}"),
        )));
    };
    if from_balance < amount {
        return Ok(Err(Refusal::bank(
            "insufficient_funds",
            format!("account {from} has {from_balance}"),
        )));
    }
    {
        let mut update = tx.prepare_cached("UPDATE accounts SET balance = ?1 WHERE id = ?2")?;
        update.execute(rusqlite::params![from_balance - amount, from])?;
        update.execute(rusqlite::params![to_balance + amount, to])?;
    }
    tx.commit()?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::TempDir;

    #[tokio::test]
    async fn sqlite_backend_moves_money_and_refuses_like_the_bank_module() {
        let dir = TempDir::new("sqlite-rpc-test").unwrap();
        let db = SqliteDb::open(&dir.path().join("bank.db"), 3)
            .await
            .unwrap();
        let backend = Backend::Sqlite(db);
        backend.transfer(0, 1, 5).await.unwrap();
        let kind = |r: Result<(), Refusal>| match r {
            Err(Refusal::Refused { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert!(kind(backend.transfer(2, 2, 1).await).starts_with("same_account"));
        assert!(kind(backend.transfer(0, 9, 1).await).starts_with("missing_account"));
        assert!(kind(backend.transfer(1, 0, INITIAL_BALANCE + 6).await)
            .starts_with("insufficient_funds"));
        let Backend::Sqlite(db) = &backend else {
            unreachable!()
        };
        let mut balances = db.balances().await.unwrap();
        balances.sort_unstable();
        assert_eq!(
            balances,
            vec![
                (0, INITIAL_BALANCE - 5),
                (1, INITIAL_BALANCE + 5),
                (2, INITIAL_BALANCE)
            ]
        );
    }

    #[tokio::test]
    async fn the_rpc_server_answers_in_sluices_shape() {
        let dir = TempDir::new("sqlite-rpc-http-test").unwrap();
        let path = dir.path().join("bank.db");
        let server = RpcServer::start("test", async move {
            Ok(Backend::Sqlite(SqliteDb::open(&path, 2).await?))
        })
        .await
        .unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let call = |from: u32, to: u32| {
            http.post(format!("{}/v1/call/transfer", server.url))
                .header("content-type", "application/json")
                .body(super::super::clients::call_body(
                    from,
                    to,
                    sluice_log::Durability::Fsync,
                ))
                .send()
        };
        let ok = call(0, 1).await.unwrap();
        assert_eq!(ok.status(), 200);
        assert_eq!(
            ok.json::<serde_json::Value>().await.unwrap(),
            json!({"result": null})
        );
        let refused = call(0, 7).await.unwrap();
        assert_eq!(refused.status(), 400);
        let v: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(v["error"]["code"], "function_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("missing_account"));
        drop(server);
    }
}
