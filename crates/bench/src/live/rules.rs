//! Family 4: **rules**. N users, each with its own client token (an HS256 JWT with
//! `sub = user<i>`, minted with the server's `--jwt-secret`), each subscribed over its own
//! WebSocket to the same text, `SELECT * FROM notes ORDER BY ts DESC LIMIT 20`, which the
//! row policy `own` (`USING (owner = auth.sub)`) turns into "my 20 newest notes". Writes
//! (admin token, one at a time) insert a note for one random user; the sample is write →
//! diff at that user's subscriber. Every diff any subscriber receives is attributed to the
//! write of its seq: a diff at a user who was not written is a **foreign diff** (a rule
//! leak, or work done per subscriber that the contract says is not done), and must be 0.
//!
//! Memory: the server's RSS and live heap (`sluice_alloc_bytes`, `--count-allocations`)
//! before the users connect, once every WebSocket is open, and once every user is
//! subscribed; the subscription's cost per user is (subscribed − connected) / N, the
//! connection's (connected − before) / N.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::client::{result_checksum, Api, Mat, Note, WsConn};
use super::{
    finish, heap, settled_rss, signed_us, us, Case, Ctx, Family, Rng, Run, Verify, PRELOAD_BATCH,
    TOP_K,
};

pub const NOTES_SCHEMA: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, \
    ts INTEGER NOT NULL, body TEXT); CREATE INDEX notes_owner ON notes (owner)";
pub const NOTES_POLICY: &str = "CREATE POLICY own ON notes FOR SELECT USING (owner = auth.sub)";
/// What every user subscribes to; the policy scopes it to the user's own notes.
pub const NOTES_VIEW: &str = "SELECT * FROM notes ORDER BY ts DESC LIMIT 20";
/// The same rows written out, run with the admin token to check the rewritten views.
pub const OWN_NOTES: &str = "SELECT * FROM notes WHERE owner = $1 ORDER BY ts DESC LIMIT 20";
/// WebSocket handshakes in flight at once while the users connect.
pub const CONNECT_CONCURRENCY: usize = 64;
/// Lifetime of the users' tokens (longer than any case).
const TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);
/// Users whose views are compared with one-shot queries after a case, at most.
const USERS_CHECKED_MAX: usize = 200;
/// How long to keep listening for late (foreign) diffs after the last write.
pub const LATE_DIFFS_WAIT: Duration = Duration::from_millis(300);

/// The `sub` of user `i`.
pub fn sub(i: usize) -> String {
    format!("user{i}")
}

fn note_row(id: usize, user: usize) -> String {
    format!(
        "{{\"id\":{id},\"owner\":\"{}\",\"ts\":{id},\"body\":\"note {id}\"}}",
        sub(user)
    )
}

fn insert_note(id: usize, user: usize) -> String {
    format!(
        "{{\"ops\":[{{\"op\":\"insert\",\"table\":\"notes\",\"row\":{}}}]}}",
        note_row(id, user)
    )
}

/// Server memory in a rules case (see the module docs).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RulesMemory {
    pub rss_before: u64,
    pub rss_connected: u64,
    pub rss_subscribed: u64,
    pub heap_before: Option<i64>,
    pub heap_connected: Option<i64>,
    pub heap_subscribed: Option<i64>,
    /// (RSS subscribed − RSS connected) / users.
    pub rss_bytes_per_user: f64,
    /// (heap subscribed − heap connected) / users: the subscription under the rule.
    pub heap_bytes_per_user: Option<f64>,
    pub heap_blocks_per_user: Option<f64>,
    /// (heap connected − heap before) / users: one open, idle WebSocket.
    pub connection_heap_bytes_per_user: Option<f64>,
    /// `sluice_live_views` / `sluice_live_subscribers` once every user was subscribed.
    pub views_gauge: f64,
    pub subscribers_gauge: f64,
}

/// What a rules case adds to [`Case`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct RulesStats {
    pub users: usize,
    pub notes_per_user: usize,
    /// Every WebSocket opened (handshake with the user's token), s.
    pub connect_s: f64,
    /// First subscribe sent → last snapshot received, s.
    pub subscribe_s: f64,
    /// Writes made while the users were subscribed (warm-up included).
    pub writes: u64,
    /// Diffs received by the user each write was for.
    pub own_diffs: u64,
    /// Diffs received by any other user: must be 0.
    pub foreign_diffs: u64,
    /// Distinct users that received a foreign diff, and the first few such events.
    pub foreign_users: usize,
    pub foreign_examples: Vec<String>,
    pub memory: RulesMemory,
}

/// Attributes every diff to the write of its seq.
#[derive(Default)]
struct Tally {
    /// seq → the user that seq's write was for.
    targets: HashMap<u64, u64>,
    own: u64,
    foreign: u64,
    foreign_users: BTreeSet<u64>,
    examples: Vec<String>,
}

impl Tally {
    fn diff(&mut self, qid: u64, seq: u64) {
        match self.targets.get(&seq) {
            Some(&user) if user == qid => self.own += 1,
            target => {
                self.foreign += 1;
                self.foreign_users.insert(qid);
                if self.examples.len() < 5 {
                    self.examples.push(match target {
                        Some(t) => format!(
                            "{} got the diff of seq {seq}, a write for {}",
                            sub(qid as usize),
                            sub(*t as usize)
                        ),
                        None => format!(
                            "{} got a diff of seq {seq}, which no bench write made",
                            sub(qid as usize)
                        ),
                    });
                }
            }
        }
    }
}

/// How waiting for one write's diff ended.
enum Waited {
    Diff(Instant),
    Reset,
    Timeout,
}

/// Reads notes until `user` receives the diff of `seq`, attributing every diff on the way.
async fn wait_user_diff(
    notes: &mut mpsc::UnboundedReceiver<Note>,
    user: u64,
    seq: u64,
    tally: &mut Tally,
) -> anyhow::Result<Waited> {
    let deadline = tokio::time::Instant::now() + super::DIFF_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, notes.recv()).await {
            Err(_) => return Ok(Waited::Timeout),
            Ok(None) => anyhow::bail!("every subscriber ended"),
            Ok(Some(Note::Diff { qid, seq: s, at })) => {
                tally.diff(qid, s);
                if qid == user && s == seq {
                    return Ok(Waited::Diff(at));
                }
            }
            Ok(Some(Note::Snapshot {
                qid, seq: s, reset, ..
            })) => {
                if reset && qid == user && s >= seq {
                    return Ok(Waited::Reset);
                }
            }
            Ok(Some(Note::Failed { qid, message })) => {
                anyhow::bail!("the subscription of user {qid:?} failed: {message}")
            }
        }
    }
}

/// Attributes whatever diffs are already queued.
fn drain(notes: &mut mpsc::UnboundedReceiver<Note>, tally: &mut Tally) -> anyhow::Result<()> {
    while let Ok(note) = notes.try_recv() {
        match note {
            Note::Diff { qid, seq, .. } => tally.diff(qid, seq),
            Note::Failed { qid, message } => {
                anyhow::bail!("the subscription of user {qid:?} failed: {message}")
            }
            Note::Snapshot { .. } => {}
        }
    }
    Ok(())
}

/// Mints user `i`'s token.
fn token(secret: &str, i: usize) -> String {
    sluice_server::auth::mint_hs256(secret, &sub(i), &serde_json::Map::new(), TOKEN_TTL)
}

async fn rules_case(ctx: &Ctx<'_>, n: usize, case: &mut Case) -> anyhow::Result<()> {
    let p = ctx.params;
    let per = p.notes_per_user;
    // Each user holds one WebSocket: both processes need a file per user and some spare.
    let want = n as u64 + 1024;
    let nofile = crate::harness::raise_nofile_limit(want);
    anyhow::ensure!(
        nofile >= want,
        "{n} users need {want} open files, the limit is {nofile} (raise ulimit -n, or lower --users)"
    );
    let secret = crate::server::random_hex(32);
    let (server, api, _dir) = ctx.start(&["--jwt-secret", secret.as_str()]).await?;
    api.sql(NOTES_SCHEMA).await?;
    api.sql(NOTES_POLICY).await?;
    api.preload(
        "notes",
        (0..n * per).map(|id| note_row(id, id % n)),
        PRELOAD_BATCH,
    )
    .await?;
    let tokens: Vec<String> = (0..n).map(|i| token(&secret, i)).collect();
    let rss_before = settled_rss(server.pid()).await?;
    let heap_before = heap(&api).await?;

    // Every user connects with its own token.
    let (tx, mut notes) = mpsc::unbounded_channel();
    let connecting = Instant::now();
    let base = api.base.clone();
    let mut conns: Vec<WsConn> = futures_util::stream::iter(0..n)
        .map(|i| {
            let (tx, base, token) = (tx.clone(), base.clone(), tokens[i].clone());
            async move {
                WsConn::connect_as(&base, &token, tx)
                    .await
                    .with_context(|| format!("{} cannot connect", sub(i)))
            }
        })
        .buffered(CONNECT_CONCURRENCY)
        .try_collect()
        .await?;
    drop(tx);
    let connect_s = connecting.elapsed().as_secs_f64();
    let rss_connected = settled_rss(server.pid()).await?;
    let heap_connected = heap(&api).await?;

    // Every user subscribes to the same text; the rule scopes it.
    let subscribing = Instant::now();
    let sends = conns
        .iter_mut()
        .enumerate()
        .map(|(i, conn)| conn.subscribe_many(NOTES_VIEW, std::iter::once((i as u64, json!([])))));
    let counting = super::await_snapshots(&mut notes, n, "users", &ctx.progress);
    let (sent, last) = tokio::join!(futures_util::future::try_join_all(sends), counting);
    sent?;
    let subscribe_s = (last? - subscribing).as_secs_f64();
    let rss_subscribed = settled_rss(server.pid()).await?;
    let heap_subscribed = heap(&api).await?;
    let per_user = |a: i64, b: i64| (b - a) as f64 / n as f64;
    let memory = RulesMemory {
        rss_before,
        rss_connected,
        rss_subscribed,
        heap_before: heap_before.map(|h| h.0),
        heap_connected: heap_connected.map(|h| h.0),
        heap_subscribed: heap_subscribed.map(|h| h.0),
        rss_bytes_per_user: (rss_subscribed as f64 - rss_connected as f64) / n as f64,
        heap_bytes_per_user: heap_connected
            .zip(heap_subscribed)
            .map(|(a, b)| per_user(a.0, b.0)),
        heap_blocks_per_user: heap_connected
            .zip(heap_subscribed)
            .map(|(a, b)| per_user(a.1, b.1)),
        connection_heap_bytes_per_user: heap_before
            .zip(heap_connected)
            .map(|(a, b)| per_user(a.0, b.0)),
        views_gauge: api.metric("sluice_live_views").await?,
        subscribers_gauge: api.metric("sluice_live_subscribers").await?,
    };
    ctx.progress.say(format!(
        "  {n} users connected in {connect_s:.1}s and subscribed in {subscribe_s:.1}s; \
         per user: subscription {} heap ({:.0} B RSS), WebSocket {} heap; \
         sluice_live_views {}, sluice_live_subscribers {}",
        memory
            .heap_bytes_per_user
            .map_or("?".into(), |b| format!("{b:.0} B")),
        memory.rss_bytes_per_user,
        memory
            .connection_heap_bytes_per_user
            .map_or("?".into(), |b| format!("{b:.0} B")),
        memory.views_gauge,
        memory.subscribers_gauge
    ));

    // Timed writes, one at a time, each for one random user.
    let mut tally = Tally::default();
    let mut writes_to = vec![0u64; n];
    let mut rng = Rng(0x5eed_0004 + n as u64);
    let mut next_id = n * per;
    let mut written = BTreeSet::new();
    let mut run = Run::new(ctx.budget());
    let mut resets = 0;
    while run.next()?.is_some() {
        let user = rng.below(n);
        next_id += 1;
        let body = insert_note(next_id, user);
        let t0 = Instant::now();
        let (seq, acked) = api.mutate(body).await?;
        tally.targets.insert(seq, user as u64);
        writes_to[user] += 1;
        if written.len() < USERS_CHECKED_MAX {
            written.insert(user);
        }
        let sample = match wait_user_diff(&mut notes, user as u64, seq, &mut tally).await? {
            Waited::Diff(at) => Some((us(at - t0), signed_us(acked, at), us(acked - t0))),
            Waited::Reset => {
                resets += 1;
                continue;
            }
            Waited::Timeout => None,
        };
        run.record(sample)?;
    }
    let mut samples = std::mem::take(&mut run.s);
    samples.unexpected = 0;
    samples.resets = resets;
    case.take(samples);
    // Late diffs still count: listen a little longer, then close every connection.
    tokio::time::sleep(LATE_DIFFS_WAIT).await;
    drain(&mut notes, &mut tally)?;
    let mut mats: HashMap<u64, Mat> = HashMap::new();
    for conn in conns {
        mats.extend(conn.close().await?);
    }
    drain(&mut notes, &mut tally)?;
    drop(notes);
    case.unexpected = tally.foreign as usize;

    // Each user's own count of diffs agrees with the writes made for it.
    let mut details = Vec::new();
    let (mut extra, mut missing) = (0u64, 0u64);
    for (i, &w) in writes_to.iter().enumerate() {
        let got = mats.get(&(i as u64)).map_or(0, |m| m.diffs);
        extra += got.saturating_sub(w);
        missing += w.saturating_sub(got);
    }
    if extra > 0 {
        details.push(format!(
            "users' readers counted {extra} diff(s) more than the writes made for them"
        ));
    }
    // Compare the written users' views (and a few others) with one-shot queries: as the
    // user (the rewritten query) and as the admin (the policy's rows written out).
    for _ in 0..50 {
        written.insert(rng.below(n));
    }
    let mut verify = Verify {
        method: "content",
        content_match: Some(true),
        ..Verify::default()
    };
    if mats.len() != n {
        details.push(format!("{} of {n} views materialised", mats.len()));
    }
    for m in mats.values() {
        verify.checksums_checked += m.checked;
        verify.checksum_mismatches += m.mismatches;
        case.resets += m.resets as usize;
    }
    for &user in &written {
        let as_user = Api::with_token(&api.base, &tokens[user])?;
        let (rows, sum) = result_checksum(&as_user.query(NOTES_VIEW, &json!([])).await?)?;
        let (admin_rows, admin_sum) =
            result_checksum(&api.query(OWN_NOTES, &json!([sub(user)])).await?)?;
        let (seen, seen_sum) = mats
            .get(&(user as u64))
            .map_or((0, 0), |m| (m.len(), m.sum));
        verify.rows_seen += seen;
        verify.rows_expected += admin_rows;
        if (rows, sum) != (seen, seen_sum) || (admin_rows, admin_sum) != (seen, seen_sum) {
            verify.content_match = Some(false);
            details.push(format!(
                "{}: {seen} rows seen, {rows} by its own one-shot query, {admin_rows} by the admin's",
                sub(user)
            ));
        }
    }
    verify.ok = mats.len() == n
        && verify.content_match == Some(true)
        && verify.rows_seen == verify.rows_expected
        && verify.checksum_mismatches == 0
        && verify.checksums_checked > 0
        && tally.foreign == 0
        && extra == 0;
    if tally.foreign > 0 {
        details.push(format!(
            "{} FOREIGN diff(s) at {} user(s): {}",
            tally.foreign,
            tally.foreign_users.len(),
            tally.examples.join("; ")
        ));
    }
    verify.detail = format!(
        "{} views materialised; {} writes, {} diffs at the written user, {} foreign; {} \
         users compared with one-shot queries as themselves and as the admin ({} rows seen, \
         {} expected); {} of {} event checksums disagreed; {missing} write(s) without a diff \
         at its user (timeouts or resets){}",
        mats.len(),
        writes_to.iter().sum::<u64>(),
        tally.own,
        tally.foreign,
        written.len(),
        verify.rows_seen,
        verify.rows_expected,
        verify.checksum_mismatches,
        verify.checksums_checked,
        if details.is_empty() {
            String::new()
        } else {
            format!("; {}", details.join("; "))
        }
    );
    case.verify = verify;
    case.view_rows = mats
        .values()
        .map(|m| m.len())
        .sum::<usize>()
        .checked_div(mats.len())
        .unwrap_or(0)
        .min(TOP_K);
    case.rules = Some(RulesStats {
        users: n,
        notes_per_user: per,
        connect_s,
        subscribe_s,
        writes: writes_to.iter().sum(),
        own_diffs: tally.own,
        foreign_diffs: tally.foreign,
        foreign_users: tally.foreign_users.len(),
        foreign_examples: tally.examples,
        memory,
    });
    ctx.progress.say(format!(
        "  foreign diffs: {} (over {} writes to {n} users)",
        tally.foreign,
        writes_to.iter().sum::<u64>()
    ));
    drop(mats);
    drop(server);
    Ok(())
}

pub(super) async fn rules_family(ctx: &Ctx<'_>, cases: &mut Vec<Case>) {
    for &n in &ctx.params.users {
        let mut case = Case::new(Family::Rules, "sluice", "ws", NOTES_VIEW);
        case.users = Some(n);
        case.durability = "memory".into();
        case.operator = Some("filter, top-k window, routed by owner = auth.sub");
        ctx.progress.say(format!(
            "case: {n} users under the row policy `owner = auth.sub`, one WebSocket and one \
             token each, {} notes each",
            ctx.params.notes_per_user
        ));
        let outcome = rules_case(ctx, n, &mut case).await;
        finish(&ctx.progress, &mut case, outcome);
        cases.push(case);
    }
}
