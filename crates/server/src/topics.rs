//! Topics in the core: appends and topic DDL through the writer, paged reads, and the
//! fan-out of new records to watchers.
//!
//! ```text
//!  writer round ── commits with appends or topic DDL ──► topics thread (one, `sluice-topics`)
//!                                                         │ wait until the commit is confirmed
//!                                                         │ route each record by tag
//!                                                         ▼
//!     per watcher: bounded queue of Arc<WireRecord> ──► its task ──► SSE / WebSocket
//! ```
//!
//! A [`WireRecord`] is shared by every watcher it reaches and encodes itself at most once
//! per wire form (SSE frame, WebSocket JSON, WebSocket MessagePack), on first use. Routing
//! costs the watchers a record can reach: watchers of every record, watchers of one of its
//! exact tags, and watchers of a prefix of one of its tags (looked up by the prefix lengths
//! in use). The hub never waits for a watcher: a full queue cuts that watcher off with
//! `lagging` and the offset to resume from.
//!
//! A watch first replays kept records from the `Db` (those the hub routed before the watch
//! registered), then takes its queue: at registration the hub notes how far it has routed
//! the topic, and that offset splits the two sources, so no record is missed or repeated.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::extract::ws::Utf8Bytes;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value as Json;
use sluice_engine::{Commit, CommitBody, Record, TagFilter, TopicChange, TopicConfig, TxError};
use sluice_log::Durability;
use tokio::sync::mpsc;

use crate::auth::Caller;
use crate::core::Core;
use crate::error::CoreError;
use crate::writer::Request;

/// Records read from the `Db` per step while a watch replays kept records.
const REPLAY_PAGE_RECORDS: usize = 256;
/// Writer rounds queued for the topics thread before the writer waits.
pub(crate) const HUB_FEED_ROUNDS_MAX: usize = 4096;

/// A topic as listed by `GET /v1/topics`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub first: u64,
    /// The newest offset, `None` while the topic never had a record.
    pub last: Option<u64>,
    pub next: u64,
    pub records: u64,
    pub bytes: u64,
    pub retain_records: u64,
    pub retain_bytes: u64,
    pub retain_secs: u64,
    /// Tag patterns clients may read (`docs/security.md`, "Topic rules").
    pub read: Vec<String>,
    /// Tag patterns clients may append.
    pub append: Vec<String>,
}

impl TopicInfo {
    pub(crate) fn of(t: &sluice_engine::Topic) -> Self {
        let c = t.config();
        TopicInfo {
            name: t.name().to_string(),
            first: t.first(),
            last: t.next().checked_sub(1),
            next: t.next(),
            records: t.len() as u64,
            bytes: t.bytes(),
            retain_records: c.retain_records,
            retain_bytes: c.retain_bytes,
            retain_secs: c.retain_secs,
            read: t.rules().read.clone(),
            append: t.rules().append.clone(),
        }
    }
}

/// Retention asked for by `PUT /v1/topics/{name}`; a missing field keeps the topic's value
/// (or takes the default when creating).
#[derive(Clone, Debug, Default)]
pub struct TopicSpec {
    pub retain_records: Option<u64>,
    pub retain_bytes: Option<u64>,
    pub retain_secs: Option<u64>,
    /// Client read rules; `None` keeps the current ones.
    pub read: Option<Vec<String>>,
    /// Client append rules; `None` keeps the current ones.
    pub append: Option<Vec<String>>,
}

#[derive(Clone, Debug)]
pub struct PutTopicOk {
    /// `None` when nothing changed.
    pub seq: Option<u64>,
    pub created: bool,
    /// The topic as it now is; `None` after a drop.
    pub topic: Option<TopicInfo>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOk {
    pub seq: u64,
    pub first: u64,
    pub last: u64,
}

/// One record to append: its tags and its data as JSON text.
#[derive(Clone, Debug)]
pub struct NewRecord {
    pub tags: Vec<String>,
    /// Valid JSON without raw line breaks (they would split an SSE `data:` line): see
    /// [`NewRecord::from_raw`].
    pub data: Box<str>,
}

impl NewRecord {
    pub fn new(tags: Vec<String>, data: &Json) -> Self {
        NewRecord {
            tags,
            data: data.to_string().into_boxed_str(),
        }
    }

    /// From the raw JSON text of a request. The text must parse as a JSON value the way
    /// every reader will parse it (a number beyond f64, a lone surrogate escape are refused
    /// here rather than served as something else later); it is kept as it is unless it has
    /// line breaks (only possible as whitespace between tokens), which are printed away.
    pub fn from_raw(
        tags: Vec<String>,
        data: &serde_json::value::RawValue,
    ) -> Result<Self, serde_json::Error> {
        let text = data.get();
        let value: Json = serde_json::from_str(text)?;
        let data = if text.bytes().any(|b| b == b'\n' || b == b'\r') {
            value.to_string().into_boxed_str()
        } else {
            text.into()
        };
        Ok(NewRecord { tags, data })
    }
}

/// A page of `GET /v1/topics/{name}/records`.
pub struct ReadPage {
    pub records: Vec<Arc<Record>>,
    pub next: u64,
    pub first: u64,
}

pub(crate) enum TopicOp {
    Put { name: String, spec: TopicSpec },
    Drop { name: String },
}

/// The writer's work for a topic request; runs under its write lock.
pub(crate) fn apply_topic_op(
    db: &mut sluice_engine::Db,
    op: TopicOp,
) -> Result<(Vec<Arc<Commit>>, PutTopicOk), TxError> {
    match op {
        TopicOp::Put { name, spec } => {
            let base = db
                .topics
                .get(&name)
                .map_or_else(|| db.limits.default_topic_config(), |t| t.config());
            let config = TopicConfig {
                retain_records: spec.retain_records.unwrap_or(base.retain_records),
                retain_bytes: spec.retain_bytes.unwrap_or(base.retain_bytes),
                retain_secs: spec.retain_secs.unwrap_or(base.retain_secs),
            };
            let existed = db.topics.contains_key(&name);
            if spec.read.is_some() || spec.append.is_some() {
                // Checked before anything changes: a bad rule creates no topic.
                sluice_engine::TopicRules {
                    read: spec.read.clone().unwrap_or_default(),
                    append: spec.append.clone().unwrap_or_default(),
                }
                .check()?;
            }
            let mut commits: Vec<Arc<Commit>> =
                db.put_topic(&name, Some(config))?.into_iter().collect();
            if spec.read.is_some() || spec.append.is_some() {
                let current = db.topics[&name].rules().clone();
                let rules = sluice_engine::TopicRules {
                    read: spec.read.unwrap_or_else(|| current.read.clone()),
                    append: spec.append.unwrap_or_else(|| current.append.clone()),
                };
                commits.extend(db.set_topic_rules(&name, rules)?);
            }
            let ok = PutTopicOk {
                seq: commits.last().map(|c| c.seq),
                created: !existed,
                topic: Some(TopicInfo::of(&db.topics[&name])),
            };
            Ok((commits, ok))
        }
        TopicOp::Drop { name } => {
            let commit = db.drop_topic(&name)?;
            let ok = PutTopicOk {
                seq: Some(commit.seq),
                created: false,
                topic: None,
            };
            Ok((vec![commit], ok))
        }
    }
}

// ---------------------------------------------------------------------------------------
// The wire form of a record, encoded once per form

/// A record on its way to watchers, with its encodings made on first use and shared.
pub struct WireRecord {
    topic: Arc<str>,
    record: Arc<Record>,
    sse: OnceLock<Bytes>,
    ws_json: OnceLock<Utf8Bytes>,
    ws_msgpack: OnceLock<Bytes>,
}

impl WireRecord {
    pub fn new(topic: Arc<str>, record: Arc<Record>) -> Self {
        WireRecord {
            topic,
            record,
            sse: OnceLock::new(),
            ws_json: OnceLock::new(),
            ws_msgpack: OnceLock::new(),
        }
    }

    pub fn offset(&self) -> u64 {
        self.record.offset
    }

    pub fn record(&self) -> &Arc<Record> {
        &self.record
    }

    /// `{"offset","ts","tags","data"}` (the SSE event data and a read page's item).
    fn fields_json(&self, out: &mut String) {
        record_fields_json(&self.record, out);
    }

    /// The whole SSE event: `event: record`, `id: <offset>`, `data: {…}`.
    pub fn sse(&self) -> &Bytes {
        self.sse.get_or_init(|| {
            let mut s = String::with_capacity(self.record.data.len() + 96);
            s.push_str("event: record\nid: ");
            s.push_str(&self.record.offset.to_string());
            s.push_str("\ndata: {");
            self.fields_json(&mut s);
            s.push_str("}\n\n");
            Bytes::from(s)
        })
    }

    /// The WebSocket `record` message in JSON.
    pub fn ws_json(&self) -> &Utf8Bytes {
        self.ws_json.get_or_init(|| {
            let mut s = String::with_capacity(self.record.data.len() + 128);
            s.push_str("{\"type\":\"record\",\"topic\":");
            s.push_str(&serde_json::to_string(&*self.topic).expect("a string serializes"));
            s.push(',');
            self.fields_json(&mut s);
            s.push('}');
            Utf8Bytes::from(s)
        })
    }

    /// The WebSocket `record` message in MessagePack.
    pub fn ws_msgpack(&self) -> &Bytes {
        self.ws_msgpack.get_or_init(|| {
            let value: Json =
                serde_json::from_str(self.ws_json().as_str()).expect("our own JSON parses");
            Bytes::from(rmp_serde::to_vec_named(&value).expect("JSON values encode"))
        })
    }

    /// The record as a JSON object's text `{"offset","ts","tags","data"}`: the very text
    /// of its SSE event's data, so reads and watches serve a record's data alike.
    pub fn json_text(record: &Record, out: &mut String) {
        out.push('{');
        record_fields_json(record, out);
        out.push('}');
    }
}

/// The fields of a record as JSON text (`"offset":…,"ts":…,"tags":[…],"data":…`); the data
/// is its stored text, printed by nobody again.
fn record_fields_json(r: &Record, out: &mut String) {
    out.push_str("\"offset\":");
    out.push_str(&r.offset.to_string());
    out.push_str(",\"ts\":");
    out.push_str(&r.ts_us.to_string());
    out.push_str(",\"tags\":");
    out.push_str(&serde_json::to_string(&tag_strs(&r.tags)).expect("strings serialize"));
    out.push_str(",\"data\":");
    out.push_str(&r.data);
}

fn tag_strs(tags: &[sluice_engine::topic::Tag]) -> Vec<&str> {
    tags.iter().map(|t| &**t).collect()
}

// ---------------------------------------------------------------------------------------
// The hub: routing confirmed records to watchers

/// Why a watch ended from the server's side.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ended {
    Lagging,
    Dropped,
    Poisoned(String),
}

/// Shared between the hub and one watch: set once, read by the watch's task. The hub sets
/// it and then drops the watch's queue sender, so a waiting watch wakes to a closed queue.
#[derive(Default)]
struct EndSlot {
    ended: AtomicBool,
    why: Mutex<Option<Ended>>,
}

impl EndSlot {
    fn end(&self, why: Ended) {
        let mut slot = self.why.lock();
        if slot.is_none() {
            *slot = Some(why);
            self.ended.store(true, Ordering::Release);
        }
    }
}

struct Slot {
    queue: mpsc::Sender<Arc<WireRecord>>,
    end: Arc<EndSlot>,
    filter: TagFilter,
    /// Offset of the last record pushed (a record matching several patterns goes once).
    last: Option<u64>,
}

/// One topic's watchers and how far its records have been routed.
#[derive(Default)]
struct Routes {
    /// Offset after the last record routed (records below it come from the `Db`).
    routed_next: u64,
    all: Vec<usize>,
    exact: HashMap<Box<str>, Vec<usize>>,
    prefixes: HashMap<Box<str>, Vec<usize>>,
    /// Prefix lengths in use, with how many watchers use each.
    prefix_lens: BTreeMap<usize, usize>,
    watchers: usize,
}

#[derive(Default)]
struct HubState {
    topics: HashMap<Arc<str>, Routes>,
    slots: Vec<Option<(Arc<str>, Slot)>>,
    free: Vec<usize>,
    /// Set when the log is poisoned: nothing more will be confirmed.
    poisoned: Option<String>,
}

/// Counters of the fan-out, in `/metrics`.
#[derive(Default)]
pub(crate) struct HubCounters {
    pub records_routed: AtomicU64,
    pub deliveries: AtomicU64,
    pub lagging: AtomicU64,
    pub watchers: AtomicU64,
    pub watches_opened: AtomicU64,
}

/// A watcher's registration: its slot, queue and end slot, and the offset from which the
/// queue carries records.
struct Registered {
    id: usize,
    queue: mpsc::Receiver<Arc<WireRecord>>,
    end: Arc<EndSlot>,
    routed_next: u64,
}

pub(crate) struct Hub {
    state: Mutex<HubState>,
    queue_max: usize,
    pub counters: HubCounters,
}

impl Hub {
    /// A hub for the recovered `db`: every kept record counts as routed.
    pub fn new(db: &sluice_engine::Db, queue_max: usize) -> Self {
        let mut state = HubState::default();
        for t in db.topics.values() {
            state.topics.insert(
                t.name().clone(),
                Routes {
                    routed_next: t.next(),
                    ..Routes::default()
                },
            );
        }
        Hub {
            state: Mutex::new(state),
            queue_max: queue_max.max(1),
            counters: HubCounters::default(),
        }
    }

    /// Registers a watcher of `topic`; returns its slot, queue, end slot, and the offset
    /// from which the queue will carry records.
    fn register(&self, topic: &Arc<str>, filter: TagFilter) -> Result<Registered, CoreError> {
        let (tx, rx) = mpsc::channel(self.queue_max);
        let end = Arc::new(EndSlot::default());
        let mut st = self.state.lock();
        if let Some(reason) = &st.poisoned {
            return Err(CoreError::Poisoned(reason.clone()));
        }
        let id = match st.free.pop() {
            Some(id) => id,
            None => {
                st.slots.push(None);
                st.slots.len() - 1
            }
        };
        let routes = st.topics.entry(topic.clone()).or_default();
        if filter.is_all() {
            routes.all.push(id);
        }
        for t in filter.exact() {
            routes.exact.entry(t.clone()).or_default().push(id);
        }
        for p in filter.prefixes() {
            routes.prefixes.entry(p.clone()).or_default().push(id);
            *routes.prefix_lens.entry(p.len()).or_default() += 1;
        }
        routes.watchers += 1;
        let routed_next = routes.routed_next;
        st.slots[id] = Some((
            topic.clone(),
            Slot {
                queue: tx,
                end: end.clone(),
                filter,
                last: None,
            },
        ));
        drop(st);
        self.counters.watchers.fetch_add(1, Ordering::Relaxed);
        self.counters.watches_opened.fetch_add(1, Ordering::Relaxed);
        Ok(Registered {
            id,
            queue: rx,
            end,
            routed_next,
        })
    }

    /// Removes watcher `id` if it is still the one that holds `end` (a watcher the hub cut
    /// off is already gone, and its slot may serve another watcher by now).
    fn unregister(&self, id: usize, end: &Arc<EndSlot>) {
        let mut st = self.state.lock();
        let ours = matches!(st.slots.get(id), Some(Some((_, slot))) if Arc::ptr_eq(&slot.end, end));
        if ours {
            self.remove_locked(&mut st, id);
        }
    }

    /// Takes watcher `id` out of its slot and routes (dropping its queue's sender, so a
    /// waiting watch wakes to a closed queue) and out of the watchers gauge.
    fn remove_locked(&self, st: &mut HubState, id: usize) {
        let Some((topic, slot)) = st.slots.get_mut(id).and_then(Option::take) else {
            return;
        };
        self.counters.watchers.fetch_sub(1, Ordering::Relaxed);
        st.free.push(id);
        if let Some(routes) = st.topics.get_mut(&topic) {
            routes.all.retain(|w| *w != id);
            for t in slot.filter.exact() {
                if let Some(list) = routes.exact.get_mut(t) {
                    list.retain(|w| *w != id);
                    if list.is_empty() {
                        routes.exact.remove(t);
                    }
                }
            }
            for p in slot.filter.prefixes() {
                if let Some(list) = routes.prefixes.get_mut(p) {
                    list.retain(|w| *w != id);
                    if list.is_empty() {
                        routes.prefixes.remove(p);
                    }
                }
                if let Some(n) = routes.prefix_lens.get_mut(&p.len()) {
                    *n -= 1;
                    if *n == 0 {
                        routes.prefix_lens.remove(&p.len());
                    }
                }
            }
            routes.watchers -= 1;
        }
    }

    /// Routes one confirmed commit: topic DDL updates the routes, appends go to watchers.
    fn route(&self, commit: &Commit) {
        let mut st = self.state.lock();
        if let CommitBody::Topic(change) = &commit.body {
            match change {
                TopicChange::Put {
                    name,
                    created: true,
                    ..
                } => {
                    // Watchers may already wait for a topic whose creation was not yet
                    // confirmed: keep them.
                    st.topics
                        .entry(Arc::from(name.as_str()))
                        .or_default()
                        .routed_next = 0;
                }
                TopicChange::Put { .. } | TopicChange::Trim { .. } | TopicChange::Rules { .. } => {}
                TopicChange::Drop { name } => {
                    if st.topics.get(name.as_str()).is_some_and(|r| r.watchers > 0) {
                        let ids: Vec<usize> = st
                            .slots
                            .iter()
                            .enumerate()
                            .filter_map(|(id, s)| match s {
                                Some((t, slot)) if **t == **name => {
                                    slot.end.end(Ended::Dropped);
                                    Some(id)
                                }
                                _ => None,
                            })
                            .collect();
                        for id in ids {
                            self.remove_locked(&mut st, id);
                        }
                    }
                    st.topics.remove(name.as_str());
                }
            }
        }
        let mut cut: Vec<usize> = Vec::new();
        let HubState { topics, slots, .. } = &mut *st;
        for batch in &commit.appends {
            let Some(routes) = topics.get_mut(&batch.topic) else {
                continue;
            };
            let Some(last) = batch.records.last() else {
                continue;
            };
            routes.routed_next = last.offset + 1;
            self.counters
                .records_routed
                .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
            if routes.watchers == 0 {
                continue;
            }
            for record in &batch.records {
                // The lists are walked in place (no copy of 10 000 ids per record); a
                // watcher reached by several of them takes the record once (`Slot::last`).
                let mut offer = Offer {
                    topic: &batch.topic,
                    record,
                    wire: None,
                    delivered: 0,
                    slots: &mut *slots,
                    cut: &mut cut,
                    lagging: &self.counters.lagging,
                };
                offer.to(&routes.all);
                for tag in record.tags.iter() {
                    if let Some(list) = routes.exact.get(&**tag) {
                        offer.to(list);
                    }
                    for (&len, _) in routes.prefix_lens.range(..=tag.len()) {
                        if let Some(list) = routes.prefixes.get(&tag[..len]) {
                            offer.to(list);
                        }
                    }
                }
                self.counters
                    .deliveries
                    .fetch_add(offer.delivered, Ordering::Relaxed);
            }
        }
        // A lagging watcher leaves the routes at once, even if its connection is stuck and
        // its task cannot run to notice.
        for id in cut {
            self.remove_locked(&mut st, id);
        }
    }

    fn poison(&self, reason: String) {
        let mut st = self.state.lock();
        st.poisoned = Some(reason.clone());
        for id in 0..st.slots.len() {
            if let Some((_, slot)) = &st.slots[id] {
                slot.end.end(Ended::Poisoned(reason.clone()));
                self.remove_locked(&mut st, id);
            }
        }
    }
}

/// One record being offered to the watchers of its topic's route lists.
struct Offer<'a> {
    topic: &'a Arc<str>,
    record: &'a Arc<Record>,
    /// Made on the first watcher reached, shared by all.
    wire: Option<Arc<WireRecord>>,
    delivered: u64,
    slots: &'a mut [Option<(Arc<str>, Slot)>],
    cut: &'a mut Vec<usize>,
    lagging: &'a AtomicU64,
}

impl Offer<'_> {
    fn to(&mut self, ids: &[usize]) {
        let offset = self.record.offset;
        for &id in ids {
            let Some((_, slot)) = self.slots.get_mut(id).and_then(Option::as_mut) else {
                continue;
            };
            if slot.last == Some(offset) || slot.end.ended.load(Ordering::Relaxed) {
                continue;
            }
            slot.last = Some(offset);
            let wire = self.wire.get_or_insert_with(|| {
                Arc::new(WireRecord::new(self.topic.clone(), self.record.clone()))
            });
            match slot.queue.try_send(wire.clone()) {
                Ok(()) => self.delivered += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.lagging.fetch_add(1, Ordering::Relaxed);
                    slot.end.end(Ended::Lagging);
                    self.cut.push(id);
                }
                // The watch is gone; it unregisters itself.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
    }
}

/// The writer's end of the topics thread: rounds of commits that touch topics.
pub(crate) struct HubFeed {
    tx: std::sync::mpsc::SyncSender<Vec<Arc<Commit>>>,
}

impl HubFeed {
    /// Hands the topic-touching commits of one round to the topics thread (waits when it
    /// is `HUB_FEED_ROUNDS_MAX` rounds behind: back-pressure, not memory).
    pub fn publish(&self, commits: &[Arc<Commit>]) {
        let touched: Vec<Arc<Commit>> = commits
            .iter()
            .filter(|c| !c.appends.is_empty() || matches!(c.body, CommitBody::Topic(_)))
            .cloned()
            .collect();
        if !touched.is_empty() {
            // The thread only stops with the process (it is critical).
            let _ = self.tx.send(touched);
        }
    }
}

type Rounds = std::sync::mpsc::Receiver<Vec<Arc<Commit>>>;

/// The writer's feed to the topics thread and the thread's end of it.
pub(crate) fn hub_channel() -> (HubFeed, Rounds) {
    let (tx, rx) = std::sync::mpsc::sync_channel(HUB_FEED_ROUNDS_MAX);
    (HubFeed { tx }, rx)
}

/// Starts the topics thread; it routes each commit once it is confirmed.
pub(crate) fn spawn_hub(
    rx: Rounds,
    hub: Arc<Hub>,
    confirm: Arc<crate::confirm::Confirmations>,
    poisoned: impl Fn() -> Option<String> + Send + 'static,
) -> std::io::Result<()> {
    sluice_log::critical::spawn("topics", move || {
        while let Ok(round) = rx.recv() {
            sluice_log::critical::injected_panic_point("topics");
            for commit in round {
                loop {
                    if confirm.wait_blocking(commit.seq, std::time::Duration::from_millis(100)) {
                        break;
                    }
                    if let Some(reason) = poisoned() {
                        hub.poison(reason);
                        // Nothing more will be confirmed; keep draining so the writer
                        // never waits on this thread.
                        while rx.recv().is_ok() {}
                        return;
                    }
                }
                hub.route(&commit);
            }
        }
    })?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A watch

/// One watcher of one topic: replays kept records from its start, then follows new ones.
pub struct Watch {
    core: Core,
    hub: Arc<Hub>,
    id: usize,
    topic: Arc<str>,
    filter: TagFilter,
    start: u64,
    /// Offset after the last record handed out (where a resume should start).
    next: u64,
    /// Replay position in the `Db` (records below `routed_from` come from there).
    scan: u64,
    routed_from: u64,
    page: VecDeque<Arc<WireRecord>>,
    queue: mpsc::Receiver<Arc<WireRecord>>,
    end: Arc<EndSlot>,
    /// `coalesce_ms` (see [`Watch::coalesce`]): records are handed out in batches, at most
    /// one batch per window. `None`: each as soon as it is there.
    coalesce: Option<Coalesce>,
}

/// A coalescing watch's window. Kept in the watch (not in [`Watch::next`]'s future) so a
/// caller that drops a pending `next` (a heartbeat won a `select!`) loses no record.
struct Coalesce {
    window: std::time::Duration,
    /// Records taken for the current batch, handed out before any new one is awaited.
    held: VecDeque<Arc<WireRecord>>,
    /// When the open window closes (a first record arrived and waits in `held`).
    closes: Option<tokio::time::Instant>,
}

/// Records one coalesced batch takes at most; more waiting records follow in the next.
pub const COALESCED_BATCH_RECORDS_MAX: usize = 65_536;

impl Drop for Watch {
    fn drop(&mut self) {
        self.hub.unregister(self.id, &self.end);
    }
}

impl Watch {
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The offset the watch started from.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The offset to resume from: after the last record handed out.
    pub fn resume_from(&self) -> u64 {
        self.next
    }

    /// Hands records out in batches, at most one per `window` (`coalesce_ms`): the first
    /// record of a batch waits until the window closes, then every record ready by then (up
    /// to [`COALESCED_BATCH_RECORDS_MAX`]) is handed out at once. Records are never dropped
    /// or merged; offsets and resume are as without coalescing.
    pub fn coalesce(&mut self, window: std::time::Duration) {
        self.coalesce = (!window.is_zero()).then(|| Coalesce {
            window,
            held: VecDeque::new(),
            closes: None,
        });
    }

    /// The next record, or why the watch ended (`Lagging`, `Horizon`, not found when the
    /// topic was dropped, `Poisoned`). Cancel-safe.
    pub async fn next(&mut self) -> Result<Arc<WireRecord>, CoreError> {
        if self.coalesce.is_none() {
            return self.next_record().await;
        }
        loop {
            let c = self.coalesce.as_mut().expect("coalescing");
            if let Some(closes) = c.closes {
                tokio::time::sleep_until(closes).await;
                let mut n = self.coalesce.as_ref().map_or(0, |c| c.held.len());
                // An error is noticed again by the next `next_record`.
                while n < COALESCED_BATCH_RECORDS_MAX {
                    let Some(Ok(r)) = futures_util::FutureExt::now_or_never(self.next_record())
                    else {
                        break;
                    };
                    self.coalesce
                        .as_mut()
                        .expect("coalescing")
                        .held
                        .push_back(r);
                    n += 1;
                }
                self.coalesce.as_mut().expect("coalescing").closes = None;
                continue;
            }
            if let Some(r) = c.held.pop_front() {
                return Ok(r);
            }
            let first = self.next_record().await?;
            let c = self.coalesce.as_mut().expect("coalescing");
            c.held.push_back(first);
            c.closes = Some(tokio::time::Instant::now() + c.window);
        }
    }

    async fn next_record(&mut self) -> Result<Arc<WireRecord>, CoreError> {
        loop {
            if self.end.ended.load(Ordering::Acquire) {
                return Err(self.ended());
            }
            if let Some(r) = self.page.pop_front() {
                self.next = r.offset() + 1;
                return Ok(r);
            }
            if self.scan < self.routed_from {
                self.replay_page()?;
                continue;
            }
            match self.queue.recv().await {
                Some(r) if r.offset() < self.next => continue,
                Some(r) => {
                    self.next = r.offset() + 1;
                    return Ok(r);
                }
                None => return Err(self.ended()),
            }
        }
    }

    fn ended(&self) -> CoreError {
        match self.end.why.lock().clone() {
            Some(Ended::Lagging) => CoreError::Lagging {
                next: self.next,
                queue_max: self.hub.queue_max,
            },
            Some(Ended::Dropped) => CoreError::Tx(TxError::new(
                sluice_engine::ErrorCode::NotFound,
                format!("topic {:?} was dropped", self.topic),
            )),
            Some(Ended::Poisoned(reason)) => CoreError::Poisoned(reason),
            None => CoreError::ShuttingDown,
        }
    }

    /// Reads the next page of kept records below `routed_from` from the `Db`.
    fn replay_page(&mut self) -> Result<(), CoreError> {
        let db = self.core.db();
        let topic = db.topics.get(&*self.topic).ok_or_else(|| {
            CoreError::Tx(TxError::new(
                sluice_engine::ErrorCode::NotFound,
                format!("topic {:?} was dropped", self.topic),
            ))
        })?;
        let (records, next) = topic
            .read(self.scan, REPLAY_PAGE_RECORDS, &self.filter)
            .map_err(|first| CoreError::Horizon {
                from: self.scan,
                first,
            })?;
        drop(db);
        for r in records {
            if r.offset >= self.routed_from {
                break;
            }
            self.page
                .push_back(Arc::new(WireRecord::new(self.topic.clone(), r)));
        }
        // Always forward, even if the topic was dropped and made again meanwhile (the hub
        // ends this watch then).
        self.scan = next.max(self.scan + 1).min(self.routed_from);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The core's topic requests

impl Core {
    /// Creates a topic or changes its retention.
    pub async fn put_topic(
        &self,
        name: String,
        spec: TopicSpec,
        durability: Option<Durability>,
    ) -> Result<PutTopicOk, CoreError> {
        let durability = durability.unwrap_or(self.config().durability);
        let ok = self
            .call(|reply| Request::Topic {
                op: TopicOp::Put { name, spec },
                durability,
                reply,
            })
            .await?;
        if ok.seq.is_none() {
            let seq = self.db().seq;
            self.wait_confirmed(seq).await?;
        }
        Ok(ok)
    }

    /// Drops a topic and its records; returns the commit's seq.
    pub async fn drop_topic(
        &self,
        name: String,
        durability: Option<Durability>,
    ) -> Result<u64, CoreError> {
        let durability = durability.unwrap_or(self.config().durability);
        let ok = self
            .call(|reply| Request::Topic {
                op: TopicOp::Drop { name },
                durability,
                reply,
            })
            .await?;
        Ok(ok.seq.expect("a drop is a commit"))
    }

    /// The topics `caller` may see: all for the admin, those with a read rule for a client.
    pub async fn topics_as(&self, caller: &Caller) -> Result<(Vec<TopicInfo>, u64), CoreError> {
        let client = !caller.is_admin();
        self.read(|db| {
            Ok(db
                .topics
                .values()
                .filter(|t| !client || !t.rules().read.is_empty())
                .map(TopicInfo::of)
                .collect())
        })
        .await
    }

    /// One topic; a client sees only a topic with a read rule.
    pub async fn topic_as(&self, caller: &Caller, name: &str) -> Result<TopicInfo, CoreError> {
        let client = !caller.is_admin();
        let (info, _) = self
            .read(|db| {
                let t = db.topics.get(name).ok_or_else(|| no_topic(name))?;
                if client && t.rules().read.is_empty() {
                    return Ok(Err(CoreError::Forbidden {
                        message: format!("topic {name} has no read rules: clients may not read it"),
                        op: None,
                        command: "read",
                        target: name.to_string(),
                        policies: Vec::new(),
                    }));
                }
                Ok(Ok(TopicInfo::of(t)))
            })
            .await?;
        info
    }

    /// Appends for `caller`: a client's records must pass the topic's append rules.
    pub async fn append_as(
        &self,
        caller: &Caller,
        topic: String,
        records: Vec<NewRecord>,
        durability: Option<Durability>,
    ) -> Result<AppendOk, CoreError> {
        let durability = durability.unwrap_or(self.config().durability);
        self.call(|reply| Request::Append {
            topic,
            records,
            claims: caller.claims().cloned(),
            durability,
            reply,
        })
        .await
    }

    /// [`Core::read_records`] for `caller`: a client's filter must lie within the topic's
    /// read rules.
    pub async fn read_records_as(
        &self,
        caller: &Caller,
        topic: &str,
        from: Option<u64>,
        limit: usize,
        filter: &TagFilter,
    ) -> Result<ReadPage, CoreError> {
        self.check_topic_read(caller, topic, filter).await?;
        self.read_records(topic, from, limit, filter).await
    }

    /// [`Core::watch`] for `caller`: a client's filter must lie within the topic's read
    /// rules (checked when the watch starts).
    pub async fn watch_as(
        &self,
        caller: &Caller,
        topic: &str,
        from: Option<u64>,
        filter: TagFilter,
    ) -> Result<Watch, CoreError> {
        self.check_topic_read(caller, topic, &filter).await?;
        self.watch(topic, from, filter).await
    }

    async fn check_topic_read(
        &self,
        caller: &Caller,
        topic: &str,
        filter: &TagFilter,
    ) -> Result<(), CoreError> {
        let Some(claims) = caller.claims() else {
            return Ok(());
        };
        let (checked, _) = self
            .read(|db| {
                let t = db.topics.get(topic).ok_or_else(|| no_topic(topic))?;
                Ok(crate::rules::check_topic_read(t, filter, &claims.all))
            })
            .await?;
        checked
    }

    /// Every topic, at one confirmed seq.
    pub async fn topics(&self) -> Result<(Vec<TopicInfo>, u64), CoreError> {
        self.topics_as(&Caller::Admin).await
    }

    /// One topic, at one confirmed seq.
    pub async fn topic(&self, name: &str) -> Result<TopicInfo, CoreError> {
        self.topic_as(&Caller::Admin, name).await
    }

    /// Appends `records` to `topic` in one commit.
    pub async fn append(
        &self,
        topic: String,
        records: Vec<NewRecord>,
        durability: Option<Durability>,
    ) -> Result<AppendOk, CoreError> {
        self.append_as(&Caller::Admin, topic, records, durability)
            .await
    }

    /// Up to `limit` records of `topic` from `from` (default: the oldest kept) matching
    /// `filter`, once confirmed.
    pub async fn read_records(
        &self,
        topic: &str,
        from: Option<u64>,
        limit: usize,
        filter: &TagFilter,
    ) -> Result<ReadPage, CoreError> {
        let (page, _) = self
            .read(|db| {
                let t = db.topics.get(topic).ok_or_else(|| no_topic(topic))?;
                let from = from.unwrap_or(t.first());
                if from > t.next() {
                    return Ok(Err(past_end(from, t.next())));
                }
                Ok(match t.read(from, limit, filter) {
                    Ok((records, next)) => Ok(ReadPage {
                        records,
                        next,
                        first: t.first(),
                    }),
                    Err(first) => Err(CoreError::Horizon { from, first }),
                })
            })
            .await?;
        page
    }

    /// Starts watching `topic` from `from` (default: the next record appended).
    pub async fn watch(
        &self,
        topic: &str,
        from: Option<u64>,
        filter: TagFilter,
    ) -> Result<Watch, CoreError> {
        let (start, name) = {
            let db = self.db();
            let t = db.topics.get(topic).ok_or_else(|| no_topic(topic))?;
            let start = from.unwrap_or(t.next());
            if start > t.next() {
                return Err(past_end(start, t.next()));
            }
            if start < t.first() {
                return Err(CoreError::Horizon {
                    from: start,
                    first: t.first(),
                });
            }
            (start, t.name().clone())
        };
        let hub = self.shared.hub.clone();
        let r = hub.register(&name, filter.clone())?;
        Ok(Watch {
            core: self.clone(),
            hub,
            id: r.id,
            topic: name,
            filter,
            start,
            next: start,
            scan: start,
            routed_from: r.routed_next.max(start),
            page: VecDeque::new(),
            queue: r.queue,
            end: r.end,
            coalesce: None,
        })
    }
}

fn no_topic(name: &str) -> TxError {
    TxError::new(
        sluice_engine::ErrorCode::NotFound,
        format!("no topic named {name:?}"),
    )
}

fn past_end(from: u64, next: u64) -> CoreError {
    CoreError::Tx(TxError::new(
        sluice_engine::ErrorCode::BadRequest,
        format!("offset {from} is past the end of the topic (its next offset is {next})"),
    ))
}
