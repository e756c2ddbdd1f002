//! [`JetStream`]: the [`Backbone`] on NATS JetStream.
//!
//! - The changelog of database `D` is the stream `sluice-D` (subject `sluice.D.log`),
//!   replicated `--cluster-replicas` ways (R3 by default), on file storage, bounded by
//!   `--cluster-retain-commits` / `--cluster-retain-bytes` (oldest dropped first).
//! - Entry `seq` is the message with stream sequence `seq - base`, where `base` is 0 unless
//!   the cluster was started from a leader that already held commits `1..=base` (NATS 2.9
//!   cannot start a stream past sequence 1): then the stream's description records it
//!   (`sluice: commit seq = stream seq + <base>`, set once, while the stream was never
//!   written) and the leader's snapshot of `base` is the stored snapshot that starts every
//!   follower. Each append carries
//!   `Nats-Expected-Last-Sequence: seq - base - 1` (a leader that is not at the stream's end is
//!   refused) and `Nats-Msg-Id: <term>-<seq>` (a retry of the same append is taken as a
//!   duplicate within the 2-minute window; another leader's entry at that seq is *not* a
//!   duplicate of it, so it is refused by the expected-last-sequence check instead).
//! - The leader lease is the key `leader` of the key-value bucket `sluice-D-lease`, whose
//!   `max_age` is the lease's time to live: a holder that stops renewing loses the key
//!   when it ages out. Its revision when created is the new leader's term.
//! - Snapshots are objects `snapshot-<seq:020>` of the object store bucket
//!   `sluice-D-snapshots` (stream `OBJ_sluice-D-snapshots`, same replicas): the engine's
//!   snapshot file, byte for byte, in chunks of [`SNAPSHOT_CHUNK_BYTES`]. The newest
//!   [`SNAPSHOTS_STORED`] are kept.

use std::time::Duration;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_nats::jetstream::{self, consumer, kv, object_store, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::backbone::{
    AckFuture, Backbone, Entries, Entry, Holder, Lease, LogState, SNAPSHOTS_STORED,
};
use crate::ClusterError;

/// How to reach and shape the cluster's log.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// NATS URLs, comma-separated (`nats://127.0.0.1:4222,nats://…`).
    pub urls: String,
    /// The database's name in the cluster (stream `sluice-<database>`).
    pub database: String,
    /// Copies of each commit JetStream keeps (1, 3 or 5; R3 survives one node).
    pub replicas: usize,
    /// Commits the stream keeps (older ones are dropped; a follower further behind needs
    /// a snapshot).
    pub retain_commits: i64,
    /// Bytes the stream keeps.
    pub retain_bytes: i64,
    /// The leader lease's time to live: a leader that has not renewed it for this long
    /// loses it (failover time is about this).
    pub lease_ttl: Duration,
    /// How long a request to NATS may take before it counts as failed.
    pub request_timeout: Duration,
    /// The leader stores a snapshot in the object store once the stream has this many
    /// commits past the newest stored one (sooner when the stream's retention is about to
    /// drop commits the newest snapshot does not cover); `None`: a quarter of
    /// `retain_commits`; `Some(0)`: never (a follower can then join only while the stream
    /// still holds the commit after its own last). `--cluster-snapshot-commits`.
    pub snapshot_commits: Option<u64>,
    /// (follower) A node whose data diverged from the stream (a deposed leader's
    /// unreplicated commits, or commits past the stream's end) moves its log and snapshots
    /// aside and starts from the cluster's snapshot, instead of refusing to start.
    /// `--discard-diverged`.
    pub discard_diverged: bool,
}

impl ClusterOptions {
    pub fn new(urls: impl Into<String>) -> Self {
        ClusterOptions {
            urls: urls.into(),
            database: "default".into(),
            replicas: 3,
            retain_commits: 1_000_000,
            retain_bytes: 1 << 30,
            lease_ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            snapshot_commits: None,
            discard_diverged: false,
        }
    }

    /// Commits between two stored snapshots (0: none are stored): `snapshot_commits`, or a
    /// quarter of `retain_commits` (at least 1).
    pub fn snapshot_interval(&self) -> u64 {
        self.snapshot_commits
            .unwrap_or_else(|| (self.retain_commits.max(4) / 4) as u64)
    }
}

/// Bytes of one object-store chunk (one NATS message; the default `max_payload` is 1 MiB).
pub const SNAPSHOT_CHUNK_BYTES: usize = 512 << 10;

fn snapshot_name(seq: u64) -> String {
    format!("snapshot-{seq:020}")
}

fn snapshot_seq(name: &str) -> Option<u64> {
    name.strip_prefix("snapshot-")?.parse().ok()
}

const LEASE_KEY: &str = "leader";
/// How long opening the stream and buckets may be retried while the cluster settles its
/// peers ("no suitable peers for placement" until every server of an R3 stream is known):
/// 20 s was once not enough for a fresh 3-server cluster on a loaded 2-core CI machine.
const CREATE_WAIT: Duration = Duration::from_secs(60);

/// `step` until it succeeds, retried every 200 ms until [`CREATE_WAIT`] has passed since
/// `started` (tried at least once): while a cluster settles — servers joining, or a meta
/// leader elected again after a server went down — JetStream answers "no suitable peers"
/// or nothing at all. A node that joins then waits instead of exiting (CI once saw a
/// follower restarted while a NATS server was down give up after one 5 s timeout).
async fn settling<T, E, F, Fut>(
    what: &'static str,
    started: std::time::Instant,
    mut step: F,
) -> Result<T, ClusterError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    loop {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() < CREATE_WAIT => {
                tracing::debug!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(ClusterError::js(what, e)),
        }
    }
}

/// The JetStream backbone of one database.
#[derive(Clone)]
pub struct JetStream {
    js: jetstream::Context,
    stream: String,
    subject: String,
    lease: kv::Store,
    snapshots: object_store::ObjectStore,
    /// Commit seq = stream sequence + base (see the module docs); read with the stream's
    /// info.
    base: Arc<AtomicU64>,
    /// How long one answer may take: each message of a streamed reply (a snapshot's
    /// chunks, the list of snapshots) as well as each request. A stream whose next message
    /// never comes (an object deleted while it is read) fails after this instead of
    /// waiting for ever.
    request_timeout: Duration,
}

/// How the stream's description records its base.
const BASE_DESCRIPTION: &str = "sluice: commit seq = stream seq + ";

fn base_of(info: &stream::Info) -> u64 {
    info.config
        .description
        .as_deref()
        .and_then(|d| d.strip_prefix(BASE_DESCRIPTION))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn valid_database(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl JetStream {
    /// Connects to the NATS cluster and opens (creating if missing) the database's stream
    /// and lease bucket. Fails with [`ClusterError::Unreachable`] if no server answers.
    pub async fn connect(opts: &ClusterOptions) -> Result<JetStream, ClusterError> {
        if !valid_database(&opts.database) {
            return Err(ClusterError::Config(format!(
                "bad database name {:?}: 1–64 letters, digits, '-' or '_'",
                opts.database
            )));
        }
        let addrs = opts
            .urls
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ClusterError::Config(format!("bad --cluster URL {:?}: {e}", opts.urls)))?;
        if addrs.is_empty() {
            return Err(ClusterError::Config("--cluster names no NATS URL".into()));
        }
        let unreachable = |reason: String| ClusterError::Unreachable {
            urls: opts.urls.clone(),
            reason,
        };
        let client = tokio::time::timeout(
            opts.request_timeout,
            async_nats::ConnectOptions::new()
                .connection_timeout(opts.request_timeout)
                .name("sluice")
                .connect(addrs),
        )
        .await
        .map_err(|_| unreachable(format!("no answer within {:?}", opts.request_timeout)))?
        .map_err(|e| unreachable(e.to_string()))?;
        // A publish ack lost with a NATS node (its connection gone) fails after this, and
        // the publisher recovers; the client's default (30 s) would stall writes that long.
        let js = jetstream::ContextBuilder::new()
            .timeout(opts.request_timeout)
            .ack_timeout(opts.request_timeout)
            .build(client);
        let stream = format!("sluice-{}", opts.database);
        let subject = format!("sluice.{}.log", opts.database);
        let started = std::time::Instant::now();
        settling("stream creation", started, || {
            js.get_or_create_stream(stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                num_replicas: opts.replicas,
                storage: stream::StorageType::File,
                max_messages: opts.retain_commits,
                max_bytes: opts.retain_bytes,
                discard: stream::DiscardPolicy::Old,
                duplicate_window: Duration::from_secs(120),
                allow_direct: true,
                ..Default::default()
            })
        })
        .await?;
        let bucket = format!("sluice-{}-lease", opts.database);
        // The bucket's stream made as the client's `create_key_value` would (which first
        // asks for account info in a shape nats-server 2.9 does not send).
        settling("lease bucket creation", started, || {
            js.get_or_create_stream(stream::Config {
                name: format!("KV_{bucket}"),
                subjects: vec![format!("$KV.{bucket}.>")],
                max_messages_per_subject: 1,
                max_age: opts.lease_ttl,
                storage: stream::StorageType::File,
                allow_rollup: true,
                deny_delete: true,
                allow_direct: true,
                num_replicas: opts.replicas,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            })
        })
        .await?;
        let lease = settling("lease bucket", started, || js.get_key_value(&bucket)).await?;
        let bucket = format!("sluice-{}-snapshots", opts.database);
        // Made as the client's `create_object_store` would, but kept if it exists.
        settling("snapshot bucket creation", started, || {
            js.get_or_create_stream(stream::Config {
                name: format!("OBJ_{bucket}"),
                subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
                storage: stream::StorageType::File,
                num_replicas: opts.replicas,
                discard: stream::DiscardPolicy::New,
                allow_rollup: true,
                allow_direct: true,
                ..Default::default()
            })
        })
        .await?;
        let snapshots =
            settling("snapshot bucket", started, || js.get_object_store(&bucket)).await?;
        let this = JetStream {
            js,
            stream,
            subject,
            lease,
            snapshots,
            base: Arc::new(AtomicU64::new(0)),
            request_timeout: opts.request_timeout,
        };
        this.info().await?;
        Ok(this)
    }

    /// `step`'s output, or a (transient) [`ClusterError::JetStream`] naming `what` if it
    /// takes longer than the request timeout.
    async fn within<T>(
        &self,
        what: &'static str,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, ClusterError> {
        tokio::time::timeout(self.request_timeout, step)
            .await
            .map_err(|_| {
                ClusterError::js(what, format!("no answer within {:?}", self.request_timeout))
            })
    }

    async fn stream(&self) -> Result<stream::Stream, ClusterError> {
        self.js
            .get_stream(&self.stream)
            .await
            .map_err(|e| ClusterError::js("stream lookup", e))
    }

    /// The stream's info (and its base, remembered).
    async fn info(&self) -> Result<stream::Info, ClusterError> {
        let info = self
            .stream()
            .await?
            .get_info()
            .await
            .map_err(|e| ClusterError::js("stream info", e))?;
        self.base.store(base_of(&info), Ordering::Release);
        Ok(info)
    }

    fn base(&self) -> u64 {
        self.base.load(Ordering::Acquire)
    }

    /// The stream sequence of commit `seq`.
    fn stream_seq(&self, seq: u64) -> Result<u64, ClusterError> {
        let base = self.base();
        if seq <= base {
            return Err(ClusterError::JetStream {
                what: "log read",
                reason: format!(
                    "commit {seq} is before the cluster's stream, which starts after seq {base} (the leader it was started from held commits up to there: start from its stored snapshot)"
                ),
            });
        }
        Ok(seq - base)
    }
}

fn term_of(headers: Option<&async_nats::HeaderMap>) -> u64 {
    headers
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .and_then(|id| id.as_str().split_once('-'))
        .and_then(|(term, _)| term.parse().ok())
        .unwrap_or(0)
}

impl Backbone for JetStream {
    async fn append(&self, seq: u64, term: u64, frame: Bytes) -> Result<AckFuture, ClusterError> {
        let stream_seq = self.stream_seq(seq)?;
        let publish = jetstream::message::PublishMessage::build()
            .payload(frame)
            .message_id(format!("{term}-{seq}"))
            .expected_last_sequence(stream_seq - 1);
        let ack = self
            .js
            .send_publish(self.subject.clone(), publish)
            .await
            .map_err(|e| ClusterError::js("publish", e))?;
        Ok(Box::pin(async move {
            let ack = ack.await.map_err(|e| ClusterError::js("publish ack", e))?;
            if ack.sequence != stream_seq {
                return Err(ClusterError::JetStream {
                    what: "publish ack",
                    reason: format!(
                        "commit {seq} was stored at stream sequence {}, not {stream_seq}",
                        ack.sequence
                    ),
                });
            }
            Ok(())
        }))
    }

    async fn state(&self) -> Result<LogState, ClusterError> {
        let info = self.info().await?;
        let base = base_of(&info);
        let s = info.state;
        Ok(if s.messages == 0 {
            LogState {
                first_seq: base + s.last_sequence + 1,
                last_seq: base + s.last_sequence,
            }
        } else {
            LogState {
                first_seq: base + s.first_sequence,
                last_seq: base + s.last_sequence,
            }
        })
    }

    async fn start_after(&self, seq: u64) -> Result<(), ClusterError> {
        let info = self.info().await?;
        let base = base_of(&info);
        if base == seq {
            return Ok(());
        }
        if info.state.last_sequence != 0 {
            return Err(ClusterError::Config(format!(
                "the cluster's stream already holds commits up to seq {}: it cannot start after seq {seq}",
                base + info.state.last_sequence
            )));
        }
        let mut config = info.config;
        config.description = Some(format!("{BASE_DESCRIPTION}{seq}"));
        let updated = self
            .js
            .update_stream(&config)
            .await
            .map_err(|e| ClusterError::js("stream update", e))?;
        self.base.store(base_of(&updated), Ordering::Release);
        Ok(())
    }

    async fn entry(&self, seq: u64) -> Result<Entry, ClusterError> {
        let stream_seq = self.stream_seq(seq)?;
        let m = self
            .stream()
            .await?
            .get_raw_message(stream_seq)
            .await
            .map_err(|e| ClusterError::js("message read", e))?;
        Ok(Entry {
            seq: m.sequence + self.base(),
            term: term_of(Some(&m.headers)),
            frame: m.payload,
        })
    }

    async fn read_from(&self, seq: u64) -> Result<Entries, ClusterError> {
        let consumer = self
            .stream()
            .await?
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: self.stream_seq(seq)?,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| ClusterError::js("consumer creation", e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| ClusterError::js("consumer", e))?;
        let base = self.base();
        Ok(Box::pin(messages.map(move |m| {
            let m = m.map_err(|e| ClusterError::js("consumer", e))?;
            let seq = base
                + m.info()
                    .map_err(|e| ClusterError::js("message info", e))?
                    .stream_sequence;
            Ok(Entry {
                seq,
                term: term_of(m.headers.as_ref()),
                frame: m.payload.clone(),
            })
        })))
    }

    async fn acquire_lease(&self, address: &str) -> Result<Lease, ClusterError> {
        let mut holder = Holder {
            term: 0,
            address: address.to_string(),
        };
        let value = serde_json::to_vec(&holder).expect("a holder serializes");
        match self.lease.create(LEASE_KEY, value.into()).await {
            Ok(revision) => {
                // The creating revision is the term: above every earlier leader's.
                holder.term = revision;
                let lease = Lease { holder, revision };
                self.renew_lease(&lease).await
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let current = self.holder().await?;
                let (term, address) = current
                    .map(|h| (h.term, h.address))
                    .unwrap_or((0, "an unknown address".into()));
                Err(ClusterError::SecondLeader {
                    database: self.stream.trim_start_matches("sluice-").to_string(),
                    term,
                    address,
                })
            }
            Err(e) => Err(ClusterError::js("lease", e)),
        }
    }

    async fn renew_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        let value = serde_json::to_vec(&lease.holder).expect("a holder serializes");
        let revision = self
            .lease
            .update(LEASE_KEY, value.into(), lease.revision)
            .await
            .map_err(|e| ClusterError::js("lease renewal", e))?;
        Ok(Lease {
            holder: lease.holder.clone(),
            revision,
        })
    }

    async fn holder(&self) -> Result<Option<Holder>, ClusterError> {
        let entry = self
            .lease
            .entry(LEASE_KEY)
            .await
            .map_err(|e| ClusterError::js("lease read", e))?;
        Ok(entry.and_then(|e| match e.operation {
            kv::Operation::Put => serde_json::from_slice::<Holder>(&e.value)
                .ok()
                .map(|mut h| {
                    if h.term == 0 {
                        h.term = e.revision;
                    }
                    h
                }),
            _ => None,
        }))
    }

    async fn put_snapshot(&self, seq: u64, path: &Path) -> Result<(), ClusterError> {
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ClusterError::Local(format!("open {}: {e}", path.display())))?;
        self.snapshots
            .put(
                object_store::ObjectMetadata {
                    name: snapshot_name(seq),
                    description: Some(format!("the state after commit {seq}")),
                    chunk_size: Some(SNAPSHOT_CHUNK_BYTES),
                    ..Default::default()
                },
                &mut file,
            )
            .await
            .map_err(|e| ClusterError::js("snapshot store", e))?;
        let stored = self.snapshots().await?;
        let excess = stored.len().saturating_sub(SNAPSHOTS_STORED);
        for old in &stored[..excess] {
            self.snapshots
                .delete(snapshot_name(*old))
                .await
                .map_err(|e| ClusterError::js("snapshot delete", e))?;
        }
        Ok(())
    }

    async fn snapshots(&self) -> Result<Vec<u64>, ClusterError> {
        let mut list = self
            .snapshots
            .list()
            .await
            .map_err(|e| ClusterError::js("snapshot list", e))?;
        let mut seqs = Vec::new();
        while let Some(info) = self.within("snapshot list", list.next()).await? {
            let info = info.map_err(|e| ClusterError::js("snapshot list", e))?;
            if let Some(seq) = snapshot_seq(&info.name) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        seqs.dedup();
        Ok(seqs)
    }

    async fn fetch_snapshot(&self, seq: u64, dest: &Path) -> Result<(), ClusterError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut object = self
            .within("snapshot fetch", self.snapshots.get(snapshot_name(seq)))
            .await?
            .map_err(|e| ClusterError::js("snapshot fetch", e))?;
        let local =
            |e: std::io::Error| ClusterError::Local(format!("write {}: {e}", dest.display()));
        let mut file = tokio::fs::File::create(dest).await.map_err(local)?;
        // The object's reader checks the SHA-256 digest it was stored with at its end. Each
        // read is bounded: an object deleted while it is read (the leader keeps only the
        // newest few) never sends its next chunk.
        let mut chunk = vec![0u8; SNAPSHOT_CHUNK_BYTES];
        loop {
            let read = self
                .within("snapshot fetch", object.read(&mut chunk))
                .await?
                .map_err(|e| ClusterError::js("snapshot fetch", e))?;
            if read == 0 {
                break;
            }
            file.write_all(&chunk[..read]).await.map_err(local)?;
        }
        file.sync_all().await.map_err(local)?;
        Ok(())
    }
}
