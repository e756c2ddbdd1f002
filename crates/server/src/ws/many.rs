//! `subscribe_many`: many live subscriptions in one frame and one live-thread round trip,
//! so one connection can subscribe at ≥ 100 K/s (a `subscribe` per frame pays a round trip
//! to the live thread each).
//!
//! ```jsonc
//! {"id": 1, "type": "subscribe_many",
//!  "subs": [{"qid": "r1", "sql": "SELECT …", "params": [ … ], "since": 41, "coalesce_ms": 10}, …]}
//! ```
//! The whole frame is checked first (shape, qids unique on the connection, the count
//! against [`SUBSCRIBE_MANY_MAX`] and `--live-subscriptions-per-connection`): if any entry
//! is malformed nothing is subscribed. Then each entry is subscribed; one the live engine
//! refuses (its SQL does not plan, …) gets its own `error` with its `qid`, the others go
//! on. The reply `{"type": "subscribed_many", "id", "subscribed": n, "failed": k}` follows
//! the errors; each snapshot arrives as an event, as for `subscribe`.

use std::collections::HashSet;

use serde_json::{json, Map, Value};
use sluice_live::Subscribe;
use tokio::sync::mpsc;

use super::{error_reply, Encoding, Subscriptions, Watches};
use crate::api::ApiError;
use crate::auth::Caller;
use crate::core::Core;
use axum::extract::ws::Message;

/// Subscriptions one `subscribe_many` frame may carry (`subscribe_many_max`).
pub const SUBSCRIBE_MANY_MAX: usize = 10_000;

/// One entry of the frame, checked.
struct Entry {
    name: String,
    qid: Value,
    req: Subscribe,
    coalesce_ms: u32,
}

fn entry(i: usize, item: &Value, caller: &Caller) -> Result<Entry, ApiError> {
    let at = |m: &str| ApiError::bad_request(format!("subs[{i}]: {m}"));
    let Value::Object(item) = item else {
        return Err(at("each subscription must be an object"));
    };
    let qid = item
        .get("qid")
        .filter(|q| q.is_string() || q.is_number())
        .ok_or_else(|| at("a subscription needs \"qid\" (a string or number)"))?
        .clone();
    let Some(Value::String(sql)) = item.get("sql") else {
        return Err(at("a subscription needs \"sql\""));
    };
    let params = sluice_query::Params::from_json(item.get("params"))
        .map_err(|e| at(&ApiError::from(e).message))?;
    let since = match item.get("since") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| at("\"since\" must be a seq (an integer ≥ 0)"))?,
        ),
    };
    let coalesce_ms = crate::coalesce::coalesce_ms(item.get("coalesce_ms")).map_err(|e| {
        let mut e = e;
        e.message = format!("subs[{i}]: {}", e.message);
        e
    })?;
    Ok(Entry {
        name: qid.to_string(),
        qid,
        req: Subscribe {
            sql: sql.clone(),
            params,
            since,
            claims: caller.claims().map(|c| c.all.clone()),
        },
        coalesce_ms,
    })
}

impl Subscriptions {
    /// Forgets the subscriptions that ended by themselves — only when one has: a visit to
    /// every subscription on every subscribe made subscribing a connection's n-th view O(n)
    /// (250 K views on a connection were ~6 M visits, each taking a lock).
    pub(super) fn prune_finished(&mut self) {
        if self.forwarder.as_ref().is_some_and(|f| f.any_ended()) {
            self.by_qid.retain(|_, task| !task.is_finished());
        }
    }

    /// Subscribes every entry of a `subscribe_many` request; returns the replies to send (an
    /// error per refused entry, then `subscribed_many`). `Err`: the frame was refused as a
    /// whole and nothing was subscribed.
    pub(super) async fn subscribe_many(
        &mut self,
        core: &Core,
        caller: &Caller,
        request: &Map<String, Value>,
        events: &mpsc::Sender<Message>,
        encoding: Encoding,
        watches: &Watches,
    ) -> Result<Vec<Value>, ApiError> {
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let Some(Value::Array(items)) = request.get("subs") else {
            return Err(ApiError::bad_request(
                "a subscribe_many needs \"subs\": [{\"qid\", \"sql\", \"params\"?, \"since\"?, \"coalesce_ms\"?}, …]",
            ));
        };
        if items.len() > SUBSCRIBE_MANY_MAX {
            return Err(ApiError::limit(format!(
                "a subscribe_many of {} subscriptions; subscribe_many_max is {SUBSCRIBE_MANY_MAX}",
                items.len()
            )));
        }
        self.prune_finished();
        let max = core.config().live_subscriptions_per_connection_max;
        let held = self.by_qid.len() + watches.len();
        if held + items.len() > max {
            return Err(ApiError::limit(format!(
                "this connection has {held} live subscriptions and watches and asked for {} more; subscriptions_per_connection_max (--live-subscriptions-per-connection) is {max}",
                items.len()
            )));
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(items.len());
        let mut names = HashSet::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let e = entry(i, item, caller)?;
            if self.by_qid.contains_key(&e.name)
                || watches.has_qid(&e.name)
                || !names.insert(e.name.clone())
            {
                return Err(ApiError::bad_request(format!(
                    "subs[{i}]: qid {} is already subscribed on this connection (or twice in this request); unsubscribe it first",
                    e.name
                )));
            }
            entries.push(e);
        }
        let limits = core.live().limits();
        let forwarder = self.forwarder(core, events, encoding);
        let mut reqs = Vec::with_capacity(entries.len());
        let mut kept = Vec::with_capacity(entries.len());
        for e in entries {
            let (sink, token) = forwarder.sink(limits, e.coalesce_ms);
            reqs.push((e.req, sink.clone()));
            kept.push((e.name, e.qid, sink, token));
        }
        let results = core.live().subscribe_many(reqs).await;
        let mut replies = Vec::new();
        let mut subscribed = 0;
        let mut names = Vec::with_capacity(kept.len());
        let mut added = Vec::with_capacity(kept.len());
        for ((name, qid, sink, token), result) in kept.into_iter().zip(results) {
            match result {
                Ok(sub) => {
                    // `name` is the qid's JSON text.
                    added.push((token, super::forward::Entry::new(&name, sub, sink)));
                    names.push(name);
                    subscribed += 1;
                }
                Err(e) => {
                    self.forwarder(core, events, encoding).release(token);
                    let e = ApiError::from(e);
                    super::note_refusal(core, &e);
                    let mut reply = error_reply(&id, e);
                    reply["qid"] = qid;
                    replies.push(reply);
                }
            }
        }
        // The whole batch goes to the forwarding task in one command.
        let handles = self.forwarder(core, events, encoding).add(added);
        self.by_qid.extend(names.into_iter().zip(handles));
        let failed = replies.len();
        replies.push(json!({"type": "subscribed_many", "id": id, "subscribed": subscribed, "failed": failed}));
        Ok(replies)
    }
}
