//! A throwaway Redis: `redis-server` (Debian package `redis-server`) on a free loopback
//! port in a temp dir, stopped by its own pid on drop (SIGTERM, then SIGKILL after
//! [`STOP_TIMEOUT`]) and its directory removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::resp::{Conn, Value};
use crate::sys::{free_port, stop_child, tail, TempDir};

/// How long redis-server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

const NOT_FOUND: &str = "redis-server not found on PATH (nor at /usr/bin/redis-server). \
    Install it (Debian/Ubuntu: apt-get install redis-server), set REDIS_SERVER to the binary, \
    or run with --no-peers to skip the Redis peer";

/// Durability of the append-only file, the peer of Sluice's classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Aof {
    /// No persistence (the peer of `memory`).
    Off,
    /// `appendonly yes`, `appendfsync everysec` (the peer of `disk`).
    EverySec,
    /// `appendonly yes`, `appendfsync always` (the peer of `fsync`).
    Always,
}

/// `$REDIS_SERVER`, else `redis-server` on the PATH, else `/usr/bin/redis-server`.
pub fn find_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("REDIS_SERVER") {
        let p = PathBuf::from(p);
        anyhow::ensure!(p.is_file(), "{}: {NOT_FOUND}", p.display());
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .context(NOT_FOUND)
}

/// A running redis-server owned by the bench.
#[derive(Debug)]
pub struct Redis {
    child: Child,
    pub port: u16,
    /// `INFO server` → `redis_version`.
    pub version: String,
    log_path: PathBuf,
    _dir: TempDir,
}

impl Redis {
    /// Starts redis-server with `aof` persistence and room for `max_clients` connections.
    pub async fn start(bin: &Path, aof: Aof, max_clients: u32) -> anyhow::Result<Redis> {
        let dir = TempDir::new("redis")?;
        let port = free_port()?;
        let log_path = dir.path().join("redis.log");
        let log = std::fs::File::create(&log_path)?;
        let (appendonly, fsync) = match aof {
            Aof::Off => ("no", "no"),
            Aof::EverySec => ("yes", "everysec"),
            Aof::Always => ("yes", "always"),
        };
        let child = Command::new(bin)
            .current_dir(dir.path())
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--save", "", "--appendonly", appendonly])
            .args(["--appendfsync", fsync])
            .args(["--maxclients", &max_clients.to_string()])
            // Subscribers of the fan-out suite may fall behind for a moment; never cut
            // them off for it (Sluice's watch queue is also sized for the run).
            .args(["--client-output-buffer-limit", "pubsub 0 0 0"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut redis = Redis {
            child,
            port,
            version: String::new(),
            log_path,
            _dir: dir,
        };
        let started = Instant::now();
        let mut conn = loop {
            if let Ok(Some(status)) = redis.child.try_wait() {
                anyhow::bail!(
                    "redis-server exited with {status} during startup:\n{}",
                    tail(&redis.log_path, 20)
                );
            }
            let ping = match Conn::connect(port).await {
                Ok(mut c) => c.call(&[b"PING"]).await.map(|_| c),
                Err(e) => Err(e),
            };
            match ping {
                Ok(c) => break c,
                Err(_) if started.elapsed() > READY_TIMEOUT => anyhow::bail!(
                    "redis-server did not answer PING within {READY_TIMEOUT:?}:\n{}",
                    tail(&redis.log_path, 20)
                ),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let info = conn.call(&[b"INFO", b"server"]).await?;
        let info = String::from_utf8_lossy(info.as_bytes().unwrap_or_default()).into_owned();
        redis.version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        let got = conn.call(&[b"CONFIG", b"GET", b"appendfsync"]).await?;
        if aof != Aof::Off {
            let items = got.items();
            anyhow::ensure!(
                items.get(1).and_then(Value::as_bytes) == Some(fsync.as_bytes()),
                "redis runs with appendfsync {:?}, expected {fsync}",
                items.get(1)
            );
        }
        Ok(redis)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn connect(&self) -> anyhow::Result<Conn> {
        Conn::connect(self.port).await
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        stop_child(&mut self.child, "redis-server", STOP_TIMEOUT);
    }
}
