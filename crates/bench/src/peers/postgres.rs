//! A throwaway PostgreSQL cluster: `initdb` into a temp dir, `postgres` on a free loopback
//! port with `synchronous_commit=on` and `fsync=on`, stopped by its own pid on drop
//! (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and its directory removed.
//!
//! PostgreSQL refuses to run as root. When the bench runs as root, `initdb` and `postgres`
//! run as the `postgres` system user (created by the Debian package): the temp dir is
//! chowned to it and the child drops to its uid/gid before `exec`, so the pid we hold is
//! the postmaster's own pid (no `su` in between).

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::sys::{free_port, kill_and_reap, stop_child, tail, wait_timeout, TempDir};

/// How long `initdb` may take.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the postmaster may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a SIGTERM (smart shutdown) may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Room for the bench's clients plus an admin connection.
const MAX_CONNECTIONS: u32 = 200;

const NOT_FOUND: &str = "PostgreSQL server binaries not found: looked for initdb and postgres \
    under /usr/lib/postgresql/*/bin. Install them (Debian/Ubuntu: apt-get install postgresql), \
    pass --pg-bin DIR or set PG_BIN, or run with --no-peers to skip the PostgreSQL peer";

/// The directory holding `initdb` and `postgres`: `--pg-bin`, else `$PG_BIN`, else the
/// newest `/usr/lib/postgresql/<major>/bin`.
pub fn find_bin_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(dir) = flag
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("PG_BIN").map(PathBuf::from))
    {
        anyhow::ensure!(has_both(&dir), "{}: {NOT_FOUND}", dir.display());
        return Ok(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let major = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    let bin = e.path().join("bin");
                    has_both(&bin).then_some((major, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().map(|(_, bin)| bin).context(NOT_FOUND)
}

/// Uid and gid of the `postgres` system user, from `/etc/passwd`.
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("cannot read /etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.first() != Some(&"postgres") || fields.len() < 4 {
                return None;
            }
            Some((fields[2].parse().ok()?, fields[3].parse().ok()?))
        })
        .context(
            "running as root, but there is no `postgres` system user to run PostgreSQL as \
             (PostgreSQL refuses to run as root); install the postgresql package or run the \
             bench as an ordinary user",
        )
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A running PostgreSQL cluster owned by the bench.
#[derive(Debug)]
pub struct Postgres {
    child: Child,
    pub port: u16,
    /// `SHOW server_version`.
    pub version: String,
    log_path: PathBuf,
    // Dropped after the process is stopped (fields drop in order, after `Drop::drop`).
    _dir: TempDir,
}

impl Postgres {
    /// Creates a cluster with `initdb` and starts it; returns once it accepts connections.
    pub async fn start(bin_dir: &Path) -> anyhow::Result<Postgres> {
        Postgres::start_with(bin_dir, &[]).await
    }

    /// [`Postgres::start`] with extra `-c name=value` settings (for example
    /// `default_transaction_isolation=serializable`), each checked with `SHOW` once the
    /// server is up.
    pub async fn start_with(bin_dir: &Path, settings: &[(&str, &str)]) -> anyhow::Result<Postgres> {
        let dir = TempDir::new("postgres")?;
        let data = dir.path().join("data");
        let as_user = if running_as_root() {
            let (uid, gid) = postgres_user()?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).with_context(|| {
                format!("cannot chown {} to the postgres user", dir.path().display())
            })?;
            Some((uid, gid))
        } else {
            None
        };
        let command = |program: &str| {
            let mut c = Command::new(bin_dir.join(program));
            c.current_dir(dir.path()).stdin(Stdio::null());
            if let Some((uid, gid)) = as_user {
                c.uid(uid).gid(gid);
            }
            c
        };
        let log_file = |name: &str| -> anyhow::Result<(std::fs::File, PathBuf)> {
            let path = dir.path().join(name);
            Ok((std::fs::File::create(&path)?, path))
        };

        let (initdb_log, initdb_log_path) = log_file("initdb.log")?;
        let mut initdb = command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(initdb_log.try_clone()?)
            .stderr(initdb_log)
            .spawn()
            .context("cannot run initdb")?;
        if !wait_timeout(&mut initdb, INITDB_TIMEOUT) {
            kill_and_reap(&mut initdb);
            anyhow::bail!("initdb did not finish within {INITDB_TIMEOUT:?}");
        }
        let status = initdb.wait()?;
        anyhow::ensure!(
            status.success(),
            "initdb failed ({status}):\n{}",
            tail(&initdb_log_path, 20)
        );

        let port = free_port()?;
        let (log, log_path) = log_file("postgres.log")?;
        let child = command("postgres")
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "synchronous_commit=on", "-c", "fsync=on"])
            .args(["-c", &format!("max_connections={MAX_CONNECTIONS}")])
            .args(
                settings
                    .iter()
                    .flat_map(|(name, value)| ["-c".to_string(), format!("{name}={value}")]),
            )
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start postgres")?;
        let mut pg = Postgres {
            child,
            port,
            version: String::new(),
            log_path,
            _dir: dir,
        };
        let started = Instant::now();
        let client = loop {
            if let Ok(Some(status)) = pg.child.try_wait() {
                anyhow::bail!(
                    "postgres exited with {status} during startup:\n{}",
                    tail(&pg.log_path, 20)
                );
            }
            match pg.connect().await {
                Ok(client) => break client,
                Err(e) if started.elapsed() > READY_TIMEOUT => {
                    anyhow::bail!(
                        "postgres did not accept connections within {READY_TIMEOUT:?} ({e:#}):\n{}",
                        tail(&pg.log_path, 20)
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let row = client.query_one("SHOW server_version", &[]).await?;
        pg.version = row.get::<_, String>(0);
        let expected = [("synchronous_commit", "on"), ("fsync", "on")];
        for (setting, want) in expected.iter().chain(settings) {
            let v: String = client
                .query_one(&format!("SHOW {setting}"), &[])
                .await?
                .get(0);
            anyhow::ensure!(
                v == *want,
                "postgres runs with {setting}={v}, expected {want}"
            );
        }
        Ok(pg)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn conn_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres application_name=sluice-bench",
            self.port
        )
    }

    /// A new connection; its driver task runs on the current tokio runtime.
    pub async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) =
            tokio_postgres::connect(&self.conn_string(), tokio_postgres::NoTls)
                .await
                .context("cannot connect to postgres")?;
        tokio::spawn(async move {
            // The connection ends with an error when postgres stops; nothing to do then.
            let _ = connection.await;
        });
        Ok(client)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        stop_child(&mut self.child, "postgres", STOP_TIMEOUT);
    }
}
