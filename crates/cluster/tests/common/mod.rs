//! Shared by the cluster tests: in-process Sluice nodes (a `Core` served on a loopback
//! port and joined to a NATS cluster of real `nats-server` processes), live views read
//! over SSE, and table dumps to compare nodes by.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use sluice_cluster::{ClusterOptions, Node, NodeOptions};
use sluice_server::{Config, Core};
use tokio::sync::watch;

pub const ADMIN_TOKEN: &str = "sluice_admin_cluster_test_0123456789";

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "sluice-cluster-test-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One Sluice node: its core, HTTP address and cluster task.
pub struct TestNode {
    pub core: Core,
    pub addr: std::net::SocketAddr,
    pub node: Option<Node>,
    server: tokio::task::JoinHandle<()>,
}

impl TestNode {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the cluster task and the HTTP server, and shuts the core down.
    pub async fn close(mut self) {
        if let Some(node) = self.node.take() {
            let _ = node.stop().await;
        }
        self.server.abort();
        let _ = self.core.shutdown().await;
    }
}

pub fn cluster_options(urls: &str, database: &str) -> ClusterOptions {
    let mut o = ClusterOptions::new(urls);
    o.database = database.into();
    o.lease_ttl = Duration::from_secs(2);
    o
}

/// Opens a core in `dir`, serves it on a loopback port and joins it to the cluster.
pub async fn start_node(
    dir: &Path,
    cluster: ClusterOptions,
    follower: bool,
) -> Result<TestNode, sluice_cluster::ClusterError> {
    let mut config = Config::new(dir);
    config.auth.admin_token = Some(ADMIN_TOKEN.into());
    config.follower = follower;
    let core = tokio::task::spawn_blocking(move || Core::open(config))
        .await
        .unwrap()
        .expect("open the database");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = sluice_server::api::router(core.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let node = sluice_cluster::node::start(
        core.clone(),
        NodeOptions {
            cluster,
            follower,
            address: format!("http://{addr}"),
            takeover: false,
        },
    )
    .await;
    match node {
        Ok(node) => Ok(TestNode {
            core,
            addr,
            node: Some(node),
            server,
        }),
        Err(e) => {
            server.abort();
            let _ = core.shutdown().await;
            Err(e)
        }
    }
}

pub fn http() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// The latest (seq, checksum) of a live view read over SSE.
pub struct LiveView {
    pub latest: watch::Receiver<(u64, String)>,
    task: tokio::task::JoinHandle<()>,
}

impl LiveView {
    pub async fn open(base: &str, sql: &str) -> LiveView {
        let url =
            reqwest::Url::parse_with_params(&format!("{base}/v1/live"), &[("sql", sql)]).unwrap();
        let mut resp = http().get(url).send().await.unwrap();
        assert_eq!(resp.status(), 200, "live subscription {sql}");
        let (tx, latest) = watch::channel((0, String::new()));
        let task = tokio::spawn(async move {
            let mut buf = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    for line in event.lines() {
                        if let Some(data) = line.strip_prefix("data: ") {
                            let v: Value = serde_json::from_str(data).unwrap();
                            if let (Some(seq), Some(sum)) =
                                (v["seq"].as_u64(), v["checksum"].as_str())
                            {
                                tx.send_replace((seq, sum.to_string()));
                            }
                        }
                    }
                }
            }
        });
        LiveView { latest, task }
    }

    /// The view's checksum once it reached `seq` (bounded wait).
    pub async fn checksum_at(&mut self, seq: u64) -> String {
        let mut rx = self.latest.clone();
        let waited =
            tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|(s, _)| *s >= seq)).await;
        let r = match waited {
            Ok(r) => r.expect("the view's stream").clone(),
            Err(_) => panic!(
                "the view did not reach seq {seq}: at {:?}",
                *self.latest.borrow()
            ),
        };
        assert_eq!(r.0, seq, "the view skipped past seq {seq}");
        r.1.clone()
    }
}

impl Drop for LiveView {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `core` confirmed `seq` (bounded).
pub async fn wait_confirmed(core: &Core, seq: u64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while core.confirmed_seq() < seq {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} stayed at seq {} below {seq}",
            core.confirmed_seq()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every row of `table` in key order (as debug text: types and values both compared).
pub async fn dump(core: &Core, table: &str) -> Vec<String> {
    let (result, _) = core
        .query_as(
            &sluice_server::Caller::Admin,
            &format!("SELECT * FROM {table} ORDER BY id"),
            &Default::default(),
        )
        .await
        .expect("the dump query");
    result.rows.iter().map(|r| format!("{r:?}")).collect()
}

/// The encoded commits the changelog holds, by seq.
pub fn changelog(core: &Core) -> Vec<(u64, Vec<u8>)> {
    let db = core.db();
    let horizon = db.changelog.horizon();
    db.changelog
        .since(horizon)
        .expect("from the horizon")
        .map(|c| {
            let mut out = Vec::new();
            sluice_engine::codec::encode_commit(c, &mut out);
            (c.seq, out)
        })
        .collect()
}

/// Applies DDL through the core.
pub async fn ddl(core: &Core, sql: &str) {
    let changes = sluice_sql::parse_ddl(sql)
        .expect("the DDL parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    core.ddl(changes, sql.into(), None)
        .await
        .expect("the DDL applies");
}

/// Prepares `dir` as a follower's data directory ([`sluice_cluster::node::prepare`]: a
/// snapshot from the object store when the stream no longer holds what it lacks), then
/// starts the follower on it.
pub async fn start_prepared_follower(
    dir: &Path,
    cluster: ClusterOptions,
) -> Result<(sluice_cluster::snapshots::Start, TestNode), sluice_cluster::ClusterError> {
    let start = sluice_cluster::node::prepare(
        dir,
        &NodeOptions {
            cluster: cluster.clone(),
            follower: true,
            address: String::new(),
            takeover: false,
        },
    )
    .await?;
    let node = start_node(dir, cluster, true).await?;
    Ok((start, node))
}

/// The cluster's log as a test sees it (its own connection).
pub async fn backbone(cluster: &ClusterOptions) -> sluice_cluster::jetstream::JetStream {
    sluice_cluster::jetstream::JetStream::connect(cluster)
        .await
        .expect("connect to the cluster's log")
}

/// Waits until the object store holds a snapshot of at least `seq` (bounded).
pub async fn wait_stored_snapshot(cluster: &ClusterOptions, seq: u64) -> u64 {
    use sluice_cluster::backbone::Backbone;
    let log = backbone(cluster).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        // A list racing the leader's deletion of an old snapshot times out; try again.
        let stored = match log.snapshots().await {
            Ok(stored) => stored,
            Err(e) if e.is_transient() => Vec::new(),
            Err(e) => panic!("list the stored snapshots: {e}"),
        };
        if let Some(&newest) = stored.last().filter(|&&s| s >= seq) {
            return newest;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stored snapshot of seq {seq} or later: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts `follower` holds exactly the leader's state at seq `last`: the same rows of
/// `table`, and a changelog that is the leader's from its own horizon on (every seq, the
/// same encoded commits).
pub async fn assert_same_state(leader: &Core, follower: &Core, table: &str, last: u64, name: &str) {
    wait_confirmed(follower, last, name).await;
    assert_eq!(
        follower.db().seq,
        last,
        "{name} applied exactly the leader's commits"
    );
    assert_eq!(
        dump(follower, table).await,
        dump(leader, table).await,
        "{name}'s rows"
    );
    let theirs = changelog(follower);
    let ours = changelog(leader);
    if theirs.is_empty() {
        // Started from a snapshot of the last commit: nothing to compare yet.
        assert_eq!(
            follower.db().changelog.horizon(),
            last,
            "{name}'s changelog"
        );
        return;
    }
    let first = theirs[0].0;
    let seqs: Vec<u64> = theirs.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs,
        (first..=last).collect::<Vec<_>>(),
        "{name}'s changelog seqs are dense up to the last commit"
    );
    for (seq, bytes) in &theirs {
        if let Some((_, mine)) = ours.iter().find(|(s, _)| s == seq) {
            assert_eq!(bytes, mine, "{name}'s commit {seq}");
        }
    }
    assert!(
        ours.iter().any(|(s, _)| *s == last),
        "the leader's changelog holds the last commit"
    );
}
