//! The systems under test, each started by the bench on loopback and loaded with the same
//! accounts: start, serve the run, read every balance back afterwards, stop (Sluice: also
//! `kill -9` and restart on the same data dir, for the check after recovery).
//!
//! - `sluice-ws` / `sluice-http`: the real `sluice serve --functions bank.js` binary (a
//!   fresh data dir each), accounts inserted by batched `POST /v1/mutate`.
//! - `postgres`: a throwaway cluster ([`Postgres`]) with
//!   `default_transaction_isolation=serializable`, behind the RPC server ([`RpcServer`]).
//! - `sqlite`: a WAL database file with `synchronous=FULL`, behind the same RPC server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use sluice_log::Durability;

use super::rpc::{Backend, PgPool, RpcServer, SqliteDb};
use super::workload::{BANK_JS, CREATE_POSTGRES, CREATE_SLUICE, INITIAL_BALANCE};
use super::Target;
use crate::load::{no_probe, Counts, Probe};
use crate::peers::postgres::Postgres;
use crate::server::SluiceServer;
use crate::sys::TempDir;

/// Accounts per `POST /v1/mutate` while loading Sluice (under the default `--max-ops`).
const SLUICE_LOAD_BATCH: u32 = 5_000;
/// Rows per page when reading Sluice's balances (the default `--max-page-rows`).
const SLUICE_PAGE_ROWS: usize = 10_000;
/// Settings the PostgreSQL peer runs with, besides the peer's durable defaults.
pub const PG_SETTINGS: [(&str, &str); 1] = [("default_transaction_isolation", "serializable")];

/// A started, loaded target.
pub enum Running {
    Sluice {
        server: Arc<SluiceServer>,
        http: reqwest::Client,
        dir: TempDir,
        /// How the server was started, to start it again on the same data dir.
        bin: PathBuf,
        flags: Vec<String>,
    },
    Postgres {
        rpc: RpcServer,
        admin: tokio_postgres::Client,
        pg: Box<Postgres>,
    },
    Sqlite {
        rpc: RpcServer,
        dir: TempDir,
    },
}

/// Every balance, read after the load stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balances {
    /// Rows read.
    pub accounts: u64,
    pub sum: i128,
    /// The balance of account `id` at index `id`; `None`: no such row.
    pub by_id: Vec<Option<i64>>,
    /// Ids read outside `0..accounts`, or read twice.
    pub extra: Vec<i64>,
}

impl Balances {
    /// Files `(id, balance)` rows of a table that should hold ids `0..accounts`.
    pub fn from_rows(accounts: u32, rows: impl IntoIterator<Item = (i64, i64)>) -> Balances {
        let mut b = Balances {
            accounts: 0,
            sum: 0,
            by_id: vec![None; accounts as usize],
            extra: Vec::new(),
        };
        for (id, balance) in rows {
            b.accounts += 1;
            b.sum += i128::from(balance);
            match usize::try_from(id).ok().and_then(|i| b.by_id.get_mut(i)) {
                Some(slot @ None) => *slot = Some(balance),
                _ => b.extra.push(id),
            }
        }
        b
    }
}

impl Running {
    /// Starts `target` and loads `accounts` accounts with [`INITIAL_BALANCE`] each.
    pub async fn start(
        target: Target,
        accounts: u32,
        durability: Durability,
        sluice_bin: &Path,
        pg_bin: Option<&Path>,
        pg_pool: usize,
    ) -> anyhow::Result<Running> {
        match target {
            Target::SluiceWs | Target::SluiceHttp => {
                start_sluice(sluice_bin, accounts, durability).await
            }
            Target::Postgres => {
                let pg_bin = pg_bin.context("the postgres target needs PostgreSQL")?;
                start_postgres(pg_bin, accounts, pg_pool).await
            }
            Target::Sqlite => {
                let dir = TempDir::new("transfer-sqlite")?;
                let path = dir.path().join("bank.db");
                let rpc = RpcServer::start("sqlite", async move {
                    Ok(Backend::Sqlite(SqliteDb::open(&path, accounts).await?))
                })
                .await?;
                Ok(Running::Sqlite { rpc, dir })
            }
        }
    }

    /// Where HTTP clients post transfers.
    pub fn call_url(&self) -> String {
        match self {
            Running::Sluice { server, .. } => server.url("/v1/call/transfer"),
            Running::Postgres { rpc, .. } | Running::Sqlite { rpc, .. } => {
                format!("{}/v1/call/transfer", rpc.url)
            }
        }
    }

    /// The WebSocket endpoint (Sluice only).
    pub fn ws_url(&self) -> Option<String> {
        match self {
            Running::Sluice { server, .. } => Some(format!(
                "{}/v1/ws",
                server.base_url.replacen("http://", "ws://", 1)
            )),
            _ => None,
        }
    }

    /// The database server's pid (Sluice, or the postmaster); `None` for SQLite, which
    /// runs inside the bench process.
    pub fn server_pid(&self) -> Option<u32> {
        match self {
            Running::Sluice { server, .. } => Some(server.pid()),
            Running::Postgres { pg, .. } => Some(pg.pid()),
            Running::Sqlite { .. } => None,
        }
    }

    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Running::Sluice { server, dir, .. } => format!(
                "sluice serve on {} (pid {}, data in {})",
                server.base_url,
                server.pid(),
                dir.path().display()
            ),
            Running::Postgres { rpc, pg, .. } => format!(
                "PostgreSQL {} on 127.0.0.1:{} (pid {}), RPC server on {}",
                pg.version,
                pg.port,
                pg.pid(),
                rpc.url
            ),
            Running::Sqlite { rpc, dir } => format!(
                "SQLite {} in {}, RPC server on {}",
                rusqlite::version(),
                dir.path().display(),
                rpc.url
            ),
        }
    }

    /// Transactions the RPC server retried (PostgreSQL), so far.
    pub fn retries(&self) -> Option<u64> {
        match self {
            Running::Postgres { rpc, .. } => rpc.backend.retries(),
            _ => None,
        }
    }

    /// Commits and syncs from Sluice's `/metrics`; nothing for the peers.
    pub fn probe(&self) -> Probe {
        let Running::Sluice { server, .. } = self else {
            return no_probe();
        };
        let server = server.clone();
        Box::new(move || {
            let s = server.clone();
            Box::pin(async move {
                let m = s.metrics().await.ok()?;
                Some(Counts {
                    commits: m.get("sluice_commits_total") as u64,
                    syncs: m.get("sluice_log_syncs_total") as u64,
                    synced_commits: Some(m.get("sluice_log_synced_commits_total") as u64),
                    snapshots: Some(m.get("sluice_snapshots_total") as u64),
                    writer_rounds: Some(m.histogram("sluice_writer_round_seconds")),
                })
            })
        })
    }

    /// Reads every account's balance (Sluice: by paging through
    /// `GET /v1/tables/accounts/rows`; the peers: `SELECT id, balance FROM accounts`).
    pub async fn balances(&self, accounts: u32) -> anyhow::Result<Balances> {
        match self {
            Running::Sluice { server, http, .. } => sluice_balances(server, http, accounts).await,
            Running::Postgres { admin, .. } => {
                let rows = admin.query("SELECT id, balance FROM accounts", &[]).await?;
                Ok(Balances::from_rows(
                    accounts,
                    rows.iter()
                        .map(|r| (i64::from(r.get::<_, i32>(0)), r.get::<_, i64>(1))),
                ))
            }
            Running::Sqlite { rpc, .. } => {
                let Backend::Sqlite(db) = &*rpc.backend else {
                    unreachable!("the sqlite target runs a SQLite backend")
                };
                Ok(Balances::from_rows(accounts, db.balances().await?))
            }
        }
    }

    /// Sluice only: sets one account's balance directly (a fsync `patch`), outside the
    /// transfers; for testing the bench's own check.
    pub async fn set_balance(&self, id: u32, balance: i64) -> anyhow::Result<()> {
        let Running::Sluice { server, http, .. } = self else {
            anyhow::bail!("only the Sluice targets can be tampered with");
        };
        let body = format!(
            r#"{{"durability":"fsync","ops":[{{"op":"patch","table":"accounts","id":{id},"set":{{"balance":{balance}}}}}]}}"#
        );
        let resp = http
            .post(server.url("/v1/mutate"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        anyhow::ensure!(
            status.is_success(),
            "setting account {id}'s balance: {status}: {}",
            resp.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// Sluice only: `kill -9` the server (by the pid of the process the bench started),
    /// start it again on the same data dir with the same flags, and return the time from
    /// the new process's spawn to its first good `/health` (recovery included).
    pub async fn kill9_and_restart(&mut self) -> anyhow::Result<Duration> {
        let Running::Sluice {
            server,
            dir,
            bin,
            flags,
            ..
        } = self
        else {
            anyhow::bail!("only the Sluice targets are restarted");
        };
        Arc::get_mut(server)
            .context("the server is still in use by a probe")?
            .kill9_in_place();
        let (restarted, ready) = SluiceServer::start(bin, &dir.path().join("data"), flags)
            .await
            .context("restarting sluice serve after kill -9")?;
        *server = Arc::new(restarted);
        Ok(ready)
    }

    /// Stops everything this target started (by pid) and removes its files.
    pub async fn stop(self) {
        match self {
            Running::Sluice { server, dir, .. } => {
                // SIGKILL (on drop): a graceful stop writes a final snapshot the run does
                // not measure.
                drop(server);
                let _ = tokio::task::spawn_blocking(move || drop(dir)).await;
            }
            Running::Postgres { rpc, admin, pg } => {
                drop(rpc);
                drop(admin);
                // SIGTERM and a bounded wait: blocking, so off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || drop(pg)).await;
            }
            Running::Sqlite { rpc, dir } => {
                drop(rpc);
                // Give the SQLite thread a moment to finish its last job and close.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tokio::task::spawn_blocking(move || drop(dir)).await;
            }
        }
    }
}

async fn start_sluice(
    bin: &Path,
    accounts: u32,
    durability: Durability,
) -> anyhow::Result<Running> {
    let dir = TempDir::new("transfer-sluice")?;
    let module = dir.path().join("bank.js");
    std::fs::write(&module, BANK_JS)
        .with_context(|| format!("cannot write {}", module.display()))?;
    let flags = [
        "--functions".to_string(),
        module.to_string_lossy().into_owned(),
        "--durability".to_string(),
        durability.to_string(),
    ];
    let flags = flags.to_vec();
    let (server, _) = SluiceServer::start(bin, &dir.path().join("data"), &flags).await?;
    server.sql(CREATE_SLUICE).await?;
    let http = reqwest::Client::builder()
        .default_headers(crate::server::auth_headers())
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()?;
    let url = server.url("/v1/mutate");
    let mut first = 0u32;
    while first < accounts {
        let end = (first + SLUICE_LOAD_BATCH).min(accounts);
        let mut body = String::with_capacity((end - first) as usize * 72 + 64);
        // Disk durability while loading: it survives a crash of the server, which is all
        // the run needs; the transfers themselves use the class under test.
        body.push_str(r#"{"durability":"disk","ops":["#);
        for id in first..end {
            if id != first {
                body.push(',');
            }
            body.push_str(&format!(
                r#"{{"op":"insert","table":"accounts","row":{{"id":{id},"balance":{INITIAL_BALANCE}}}}}"#
            ));
        }
        body.push_str("]}");
        crate::live::client::post_json(&http, &url, body)
            .await
            .with_context(|| format!("loading accounts {first}..{end}"))?;
        first = end;
    }
    Ok(Running::Sluice {
        server: Arc::new(server),
        http,
        dir,
        bin: bin.to_path_buf(),
        flags,
    })
}

async fn sluice_balances(
    server: &SluiceServer,
    http: &reqwest::Client,
    accounts: u32,
) -> anyhow::Result<Balances> {
    let mut read = Vec::with_capacity(accounts as usize);
    let mut after: Option<String> = None;
    loop {
        let mut url = server.url(&format!(
            "/v1/tables/accounts/rows?limit={SLUICE_PAGE_ROWS}"
        ));
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let resp = http.get(&url).send().await?;
        let status = resp.status();
        let page: Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "GET {url}: {status}: {page}");
        let rows = page["rows"]
            .as_array()
            .with_context(|| format!("a page without rows: {page}"))?;
        for r in rows {
            let id = r["row"]["id"]
                .as_i64()
                .with_context(|| format!("a row without an integer id: {r}"))?;
            let balance = r["row"]["balance"]
                .as_i64()
                .with_context(|| format!("a row without an integer balance: {r}"))?;
            read.push((id, balance));
        }
        match &page["next"] {
            Value::Null => return Ok(Balances::from_rows(accounts, read)),
            next => after = Some(next.to_string()),
        }
    }
}

async fn start_postgres(pg_bin: &Path, accounts: u32, pool: usize) -> anyhow::Result<Running> {
    let pg = Postgres::start_with(pg_bin, &PG_SETTINGS).await?;
    let admin = pg.connect().await?;
    admin.batch_execute(CREATE_POSTGRES).await?;
    admin
        .execute(
            "INSERT INTO accounts (id, balance) SELECT g, $2 FROM generate_series(0, $1 - 1) AS g",
            &[&i32::try_from(accounts)?, &INITIAL_BALANCE],
        )
        .await?;
    // Statistics and a clean checkpoint, so the run starts from a settled table.
    admin.batch_execute("VACUUM ANALYZE accounts").await?;
    admin.batch_execute("CHECKPOINT").await?;
    let conn_string = pg.conn_string();
    let rpc = RpcServer::start("postgres", async move {
        Ok(Backend::Postgres(
            PgPool::connect(&conn_string, pool).await?,
        ))
    })
    .await?;
    Ok(Running::Postgres {
        rpc,
        admin,
        pg: Box::new(pg),
    })
}
