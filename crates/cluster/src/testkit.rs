//! A NATS JetStream cluster on loopback, for tests and `sluice bench cluster`: `n`
//! `nats-server` processes on ports picked here, their config files and stores in a
//! temp dir, routes between them, started and stopped by pid.
//!
//! [`NatsCluster::start`] returns once the JetStream meta group has a leader and its leader
//! sees every other node current (so an R3 stream can be placed); [`NatsCluster::kill`] ends a node with SIGKILL and [`NatsCluster::restart`]
//! starts it again on the same ports and store. Dropping the cluster kills every node and
//! removes the temp dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where Debian's `nats-server` package installs the server (falls back to `$PATH`).
const NATS_SERVER_DEBIAN: &str = "/usr/sbin/nats-server";

/// How long a cluster may take to elect its JetStream meta leader.
const META_LEADER_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("nats-server is not installed (Debian package `nats-server`): {0}")]
    Missing(std::io::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("the NATS cluster has no JetStream meta leader after {0:?}: {1}")]
    NoMetaLeader(Duration, String),
    #[error("the NATS cluster's meta leader does not see all {0} nodes current after {1:?}: {2}")]
    PeersMissing(usize, Duration, String),
    #[error("nats-server {0} exited while the cluster formed ({1}); its log ends with:\n{2}")]
    NodeExited(String, String, String),
}

struct Node {
    name: String,
    client_port: u16,
    /// The HTTP monitoring port (`/jsz`).
    monitor_port: u16,
    config: PathBuf,
    child: Option<Child>,
}

/// `n` `nats-server` processes clustered on loopback.
pub struct NatsCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    bin: PathBuf,
}

/// How many times [`NatsCluster::start`] picks fresh ports when a node could not bind its own.
const START_ATTEMPTS: usize = 3;

/// The lowest port [`free_ports`] hands out (below it live well-known services).
const PORT_FLOOR: u16 = 10_000;

/// `count` distinct loopback ports that were free a moment ago, below the kernel's ephemeral
/// range. A port bound to 0 and released comes from that range, so any outgoing connection
/// made meanwhile may take it as its local port: CI saw node 1's route connection to node 2
/// take node 3's not-yet-bound route port ("bind: address already in use"). Below the range
/// only listeners compete, and the ports stay bound until all are picked, so none repeats.
pub fn free_ports(count: usize) -> Result<Vec<u16>, TestkitError> {
    let ceiling = ephemeral_range_start();
    let span = ceiling.saturating_sub(PORT_FLOOR);
    let mut held = Vec::with_capacity(count);
    if span as usize >= count * 100 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos())
            ^ std::process::id().wrapping_mul(2_654_435_761);
        let mut offset = (seed % u32::from(span)) as u16;
        for _ in 0..span {
            if held.len() == count {
                break;
            }
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", PORT_FLOOR + offset)) {
                held.push(l);
            }
            offset = (offset + 1) % span;
        }
    }
    while held.len() < count {
        // No room below the ephemeral range on this machine: let the kernel choose.
        held.push(
            std::net::TcpListener::bind("127.0.0.1:0")
                .map_err(|e| TestkitError::Io("bind 127.0.0.1:0".into(), e))?,
        );
    }
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| TestkitError::Io("local_addr".into(), e))
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; Linux's default
/// where it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

impl NatsCluster {
    /// Starts `n` nodes (3 for an R3 stream) and waits for the JetStream meta leader.
    /// A node that exits because one of its ports was taken meanwhile is retried on fresh
    /// ports, up to [`START_ATTEMPTS`] times.
    pub async fn start(n: usize) -> Result<NatsCluster, TestkitError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(n).await {
                Err(TestkitError::NodeExited(_, _, log))
                    if attempt < START_ATTEMPTS && log.contains("address already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(n: usize) -> Result<NatsCluster, TestkitError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-nats-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| TestkitError::Io(format!("create {}", dir.display()), e))?;
        let bin = if Path::new(NATS_SERVER_DEBIAN).exists() {
            PathBuf::from(NATS_SERVER_DEBIAN)
        } else {
            PathBuf::from("nats-server")
        };
        let picked = free_ports(3 * n)?;
        let ports: Vec<(u16, u16, u16)> =
            picked.chunks_exact(3).map(|p| (p[0], p[1], p[2])).collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, route, _)| format!("\"nats-route://127.0.0.1:{route}\""))
            .collect();
        let mut nodes = Vec::new();
        for (i, (client, route, monitor)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let store = dir.join(&name);
            let config = dir.join(format!("{name}.conf"));
            let text = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:{client}\"\nhttp: \"127.0.0.1:{monitor}\"\n\
                 jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 256MB\n  max_file_store: 4GB\n}}\n\
                 cluster {{\n  name: sluice\n  listen: \"127.0.0.1:{route}\"\n  routes: [{}]\n}}\n",
                store.display(),
                routes.join(", ")
            );
            std::fs::write(&config, text)
                .map_err(|e| TestkitError::Io(format!("write {}", config.display()), e))?;
            nodes.push(Node {
                name,
                client_port: *client,
                monitor_port: *monitor,
                config,
                child: None,
            });
        }
        let mut cluster = NatsCluster { dir, nodes, bin };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_for_meta_leader().await?;
        cluster.wait_for_every_peer().await?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), TestkitError> {
        let node = &mut self.nodes[i];
        let log = self.dir.join(format!("{}.log", node.name));
        let log = std::fs::File::create(&log)
            .map_err(|e| TestkitError::Io(format!("create {}", log.display()), e))?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => TestkitError::Missing(e),
                _ => TestkitError::Io(format!("start {}", self.bin.display()), e),
            })?;
        node.child = Some(child);
        Ok(())
    }

    /// Every node's client URL, comma-separated (what `--cluster` takes).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// Node `i`'s pid, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Ends node `i` with SIGKILL (its pid only) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again (same ports, same store).
    pub fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        self.kill(i);
        self.spawn(i)
    }

    /// Waits until the meta leader's `/jsz` lists every other node as current and online.
    /// A meta leader needs only a quorum (two of three), and a stream of three replicas
    /// cannot be placed until the third is known: CI once saw a node's stream creation
    /// answered "no suitable peers for placement" for 60 s after the leader was elected.
    async fn wait_for_every_peer(&mut self) -> Result<(), TestkitError> {
        let started = Instant::now();
        let mut last = String::from("no answer yet");
        while started.elapsed() < META_LEADER_WAIT {
            self.check_alive()?;
            for node in &self.nodes {
                match jsz(node.monitor_port).await {
                    Ok(jsz) => {
                        let meta = &jsz["meta_cluster"];
                        let Some(replicas) = meta["replicas"].as_array() else {
                            continue; // not the leader: it lists no replicas
                        };
                        let current = replicas
                            .iter()
                            .filter(|r| r["current"] == true && r["offline"] != true)
                            .count();
                        if current + 1 >= self.nodes.len() {
                            return Ok(());
                        }
                        last = format!("leader {}: {meta}", node.name);
                    }
                    Err(e) => last = format!("{}: {e}", node.name),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(TestkitError::PeersMissing(
            self.nodes.len(),
            META_LEADER_WAIT,
            last,
        ))
    }

    /// An error naming the first node whose process has exited, with its log's end.
    fn check_alive(&mut self) -> Result<(), TestkitError> {
        for node in &mut self.nodes {
            let Some(child) = node.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join(format!("{}.log", node.name)))
                    .unwrap_or_default();
                let start = log.len().saturating_sub(2000);
                let tail = log.get(start..).unwrap_or(&log).to_string();
                return Err(TestkitError::NodeExited(
                    node.name.clone(),
                    status.to_string(),
                    tail,
                ));
            }
        }
        Ok(())
    }

    /// Waits until the JetStream meta group has a leader: account info answers only then.
    pub async fn wait_for_meta_leader(&self) -> Result<(), TestkitError> {
        let started = Instant::now();
        let mut last = String::from("no answer yet");
        while started.elapsed() < META_LEADER_WAIT {
            let attempt = async {
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(Duration::from_millis(500))
                    .connect(
                        self.urls()
                            .split(',')
                            .filter_map(|u| u.parse::<async_nats::ServerAddr>().ok())
                            .collect::<Vec<_>>(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                // Account info is answered by the meta leader (a raw request: the
                // client's typed reply expects fields newer servers add).
                let reply = client
                    .request("$JS.API.INFO", bytes::Bytes::new())
                    .await
                    .map_err(|e| e.to_string())?;
                let info: serde_json::Value =
                    serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
                match info.get("error") {
                    Some(e) => Err(e.to_string()),
                    None => Ok::<(), String>(()),
                }
            };
            match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e,
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(TestkitError::NoMetaLeader(META_LEADER_WAIT, last))
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `GET /jsz` from the monitoring port `port` (an HTTP/1.0 request: the server closes the
/// connection after the reply).
async fn jsz(port: u16) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /jsz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        let body = reply
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|at| &reply[at + 4..])
            .ok_or("no HTTP body")?;
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "timed out".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ceiling = ephemeral_range_start();
        let ports = free_ports(9).unwrap();
        assert_eq!(ports.len(), 9);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 9, "a port repeats: {ports:?}");
        let listeners: Vec<_> = ports
            .iter()
            .map(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).unwrap())
            .collect();
        assert_eq!(listeners.len(), 9);
        if ceiling >= PORT_FLOOR + 900 {
            for p in ports {
                assert!(
                    (PORT_FLOOR..ceiling).contains(&p),
                    "{p} not in {PORT_FLOOR}..{ceiling}"
                );
            }
        }
    }
}
