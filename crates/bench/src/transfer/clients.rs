//! The load clients: closed-loop workers that send transfers and count what comes back.
//!
//! - [`ws_worker`]: one WebSocket connection speaking the binary MessagePack protocol
//!   (`sluice.msgpack.v1`, `docs/protocol.md`) with `pipeline` calls in flight. Each
//!   in-flight slot is a request id: when the reply for id `s` arrives, the next transfer
//!   goes out with id `s`, so at most `pipeline` ids exist and lookups are an index.
//!   Replies that are ready together are answered together and flushed once.
//! - [`http_worker`]: one task doing request/response over a keep-alive HTTP/1.1
//!   connection (`POST /v1/call/transfer`): the same for `sluice-http` and the RPC servers
//!   in front of PostgreSQL and SQLite. HTTP/1.1 cannot pipeline in practice, so "N in
//!   flight per client" means N such tasks, each on its own connection.
//!
//! Both count a transfer once its success reply arrives ([`Meter::acked`]), and a refused
//! transfer by the kind of failure ([`Failures`]). A transport error stops the run. Every
//! transfer also goes into the [`Ledger`]: acknowledged ones move the expected balances,
//! refused ones do not, and one whose outcome the client cannot know (a transport error, a
//! reply that does not say, a request still in flight when the client ends) is recorded as
//! unknown ([`outcome_known`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{FutureExt, SinkExt, StreamExt};
use serde::Deserialize;
#[cfg(test)]
use serde::Serialize;
use sluice_log::Durability;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::http1::Http1;
use super::ledger::{ClientGuard, Ledger, Transfer};
use super::workload::{Pairs, AMOUNT};
use crate::hist::Latency;
use crate::load::{Meter, Worker};

/// The subprotocol of binary MessagePack frames.
pub const MSGPACK_PROTOCOL: &str = "sluice.msgpack.v1";
/// How long one HTTP request may take before the client gives up (and the run fails).
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

/// Refused transfers by kind, counted during the measured window only.
#[derive(Debug, Default)]
pub struct Failures {
    // A std mutex: failures are rare (none at all in the standard workload) and the
    // critical section is one map update.
    counts: Mutex<BTreeMap<String, u64>>,
}

impl Failures {
    pub fn record(&self, kind: &str) {
        let mut counts = self.counts.lock().expect("failure counts poisoned");
        *counts.entry(kind.to_string()).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().expect("failure counts poisoned").clone()
    }
}

/// The kind of a refused transfer: the bank module's `same_account`, `missing_account` or
/// `insufficient_funds` when the message names one, else the error code (for example
/// `serialization_failure` from the PostgreSQL RPC server after its retries, or `busy`).
pub fn failure_kind(code: &str, message: &str) -> String {
    for kind in ["same_account", "missing_account", "insufficient_funds"] {
        if message.contains(kind) {
            return kind.to_string();
        }
    }
    code.to_string()
}

/// Whether an error reply with `code` says that the transfer did not apply. The codes of a
/// refusal decided before anything changed (`docs/api.md`: "a refused request changes
/// nothing"; the RPC servers roll back first): bad input, the bank module's refusals,
/// conflicts, limits, `busy`, PostgreSQL's `serialization_failure` after its retries. Not
/// `log_poisoned`, `shutting_down` or `internal` (the commit may have reached the log
/// first), nor anything unrecognised: those transfers are unknown.
pub fn outcome_known(code: &str) -> bool {
    matches!(
        code,
        "bad_request"
            | "schema"
            | "unsupported"
            | "not_found"
            | "method_not_allowed"
            | "already_exists"
            | "conflict"
            | "limit"
            | "function_error"
            | "busy"
            | "serialization_failure"
    )
}

/// What every worker of one case shares.
#[derive(Clone, Debug)]
pub struct Shared {
    pub meter: Arc<Meter>,
    pub failures: Arc<Failures>,
    pub pairs: Arc<Pairs>,
    pub durability: Durability,
    /// The target's ledger, kept across its cases (its balances carry over).
    pub ledger: Arc<Ledger>,
}

impl Shared {
    fn refused(&self, kind: &str) {
        if self.meter.measuring() {
            self.failures.record(kind);
        }
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket, MessagePack, pipelined.

pub type WsStream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A transfer's call frame as serde writes it: the reference [`write_call`] is held to.
#[cfg(test)]
#[derive(Serialize)]
struct CallFrame<'a> {
    id: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'static str,
    args: TransferArgs,
    durability: &'a str,
}

#[cfg(test)]
#[derive(Serialize)]
struct TransferArgs {
    from: u32,
    to: u32,
    amount: i64,
}

/// Writes the call frame of one transfer into `out`: the bytes `rmp_serde` makes of
/// [`CallFrame`] (a test holds the two equal), its constant parts copied whole. The bench
/// shares the machine's CPUs with the server it measures: with this and [`result_id`], the
/// client's task went from ~4 960 to ~3 470 instructions per transfer (callgrind of the
/// bench process over a 20 s `sluice-ws` run; rmp_serde's frame took ~1 270 of them, this
/// takes ~240).
fn write_call(out: &mut Vec<u8>, id: u32, from: u32, to: u32, durability: &str) {
    use sluice_live::chunked::mp;
    out.clear();
    // {"id": id, "type": "call", "name": "transfer", "args": {"from": from, "to": to,
    // "amount": AMOUNT}, "durability": durability}: the keys and constants as their bytes.
    out.extend_from_slice(b"\x85\xa2id");
    mp::uint(id.into(), out);
    out.extend_from_slice(b"\xa4type\xa4call\xa4name\xa8transfer\xa4args\x83\xa4from");
    mp::uint(from.into(), out);
    out.extend_from_slice(b"\xa2to");
    mp::uint(to.into(), out);
    out.extend_from_slice(b"\xa6amount");
    mp::int(AMOUNT, out);
    out.extend_from_slice(b"\xaadurability");
    mp::str(durability, out);
}

/// The request id of a `result` reply, read with the server's MessagePack token reader
/// (every other field is checked and skipped, whatever its order); `None` for any other
/// frame — an `error` reply, a field twice, bytes after the map — which serde reads.
fn result_id(bytes: &[u8]) -> Option<u32> {
    use sluice_functions::msgpack::{Reader, Token};
    let mut r = Reader::new(bytes);
    let Token::Map(fields) = r.token()? else {
        return None;
    };
    let (mut id, mut result) = (None, false);
    for _ in 0..fields {
        let Token::Str(key) = r.token()? else {
            return None;
        };
        match key {
            b"type" if !result => {
                if r.token()? != Token::Str(b"result") {
                    return None;
                }
                result = true;
            }
            b"id" if id.is_none() => match r.token()? {
                Token::Int(i) => id = Some(u32::try_from(i).ok()?),
                _ => return None,
            },
            b"type" | b"id" => return None,
            _ => r.check_value()?,
        }
    }
    (result && r.position() == bytes.len())
        .then_some(id)
        .flatten()
}

#[derive(Deserialize)]
struct ReplyFrame<'a> {
    id: Option<u32>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    error: Option<ErrorBody<'a>>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(borrow)]
    code: Cow<'a, str>,
    #[serde(borrow, default)]
    message: Cow<'a, str>,
}

/// Opens `/v1/ws` at `url` (`ws://host:port/v1/ws`) with the admin token asking for
/// `protocol` (`sluice.json.v1` or `sluice.msgpack.v1`), with Nagle off, and checks that the
/// server agreed to it.
pub async fn connect_ws(url: &str, protocol: &'static str) -> anyhow::Result<WsStream> {
    connect_ws_as(url, protocol, crate::server::admin_token()).await
}

/// [`connect_ws`] with `token` as the bearer token (a client token, say).
pub async fn connect_ws_as(
    url: &str,
    protocol: &'static str,
    token: &str,
) -> anyhow::Result<WsStream> {
    let request = crate::server::ws_request(url, token, Some(protocol))?;
    let config = crate::server::ws_config();
    let (ws, response) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .with_context(|| format!("cannot open a WebSocket to {url}"))?;
    let agreed = response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .and_then(|v| v.to_str().ok());
    anyhow::ensure!(
        agreed == Some(protocol),
        "the server answered subprotocol {agreed:?}, not {protocol}"
    );
    Ok(ws)
}

/// One pipelined WebSocket client: starts at pair `start`, keeps `pipeline` calls in
/// flight until the meter stops, then waits for the last replies.
pub fn ws_worker(ws: WsStream, shared: Shared, start: usize, pipeline: usize) -> Worker {
    assert!(
        (1..=u32::MAX as usize).contains(&pipeline),
        "pipeline out of range"
    );
    tokio::spawn(async move {
        let meter = shared.meter.clone();
        let mut client = WsClient {
            ws,
            durability: shared.durability.as_str(),
            guard: shared.ledger.client(),
            shared,
            next_pair: start,
            sent_at: vec![None; pipeline],
            in_flight: 0,
            latency: Latency::new(),
            frame: Vec::with_capacity(96),
        };
        let result = client.run().await;
        if result.is_err() {
            meter.stop();
        }
        result.map(|()| client.latency)
    })
}

struct WsClient {
    ws: WsStream,
    shared: Shared,
    /// The transfer in each slot, for the ledger (unknown if the client ends first).
    guard: ClientGuard,
    durability: &'static str,
    next_pair: usize,
    /// When the request in each slot (= request id) was sent; `None`: slot free.
    sent_at: Vec<Option<Instant>>,
    in_flight: usize,
    latency: Latency,
    frame: Vec<u8>,
}

impl WsClient {
    async fn run(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.sent_at.len() {
            self.send(slot).await?;
        }
        self.ws.flush().await?;
        while self.in_flight > 0 {
            let message = self.ws.next().await;
            self.on_message(message).await?;
            // Answer every reply that is already here before flushing once.
            while let Some(message) = self.ws.next().now_or_never() {
                self.on_message(message).await?;
            }
            self.ws.flush().await?;
        }
        let _ = self.ws.close(None).await;
        Ok(())
    }

    /// Queues the next transfer in `slot` (not flushed).
    async fn send(&mut self, slot: usize) -> anyhow::Result<()> {
        let (from, to) = self.shared.pairs.get(self.next_pair);
        self.next_pair = self.next_pair.wrapping_add(1);
        write_call(&mut self.frame, slot as u32, from, to, self.durability);
        self.sent_at[slot] = Some(Instant::now());
        self.guard.sent(
            slot,
            Transfer {
                from,
                to,
                amount: AMOUNT,
            },
        );
        self.in_flight += 1;
        self.ws
            .feed(Message::binary(self.frame.clone()))
            .await
            .context("cannot send on the WebSocket")?;
        Ok(())
    }

    async fn on_message(
        &mut self,
        message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    ) -> anyhow::Result<()> {
        let bytes = match message {
            None => anyhow::bail!("the server closed the WebSocket"),
            Some(Err(e)) => return Err(anyhow::Error::new(e).context("WebSocket read failed")),
            Some(Ok(Message::Binary(bytes))) => bytes,
            Some(Ok(Message::Text(text))) => {
                anyhow::bail!("unexpected text frame on a MessagePack connection: {text}")
            }
            Some(Ok(Message::Close(frame))) => {
                anyhow::bail!("the server closed the WebSocket: {frame:?}")
            }
            Some(Ok(_)) => return Ok(()), // ping, pong: tungstenite answers pings itself
        };
        // A `result` is read directly; anything else (an error) by serde.
        let (id, reply): (_, Option<ReplyFrame<'_>>) = match result_id(&bytes) {
            Some(id) => (Some(id), None),
            None => {
                let reply: ReplyFrame<'_> =
                    rmp_serde::from_slice(&bytes).context("undecodable MessagePack reply")?;
                (reply.id, Some(reply))
            }
        };
        let slot = match id {
            Some(id) if (id as usize) < self.sent_at.len() => id as usize,
            _ => anyhow::bail!(
                "a reply without a request of ours (id {id:?}): {:?}",
                reply
                    .and_then(|r| r.error)
                    .map(|e| format!("{}: {}", e.code, e.message))
            ),
        };
        let sent = self.sent_at[slot]
            .take()
            .with_context(|| format!("a second reply for request id {slot}"))?;
        self.in_flight -= 1;
        let (kind, error) = match reply {
            None => (Cow::Borrowed("result"), None),
            Some(r) => (r.kind, r.error),
        };
        match (kind.as_ref(), error) {
            ("result", _) => {
                self.guard.answered(slot, true);
                self.shared
                    .meter
                    .acked(1, sent.elapsed(), &mut self.latency)
            }
            ("error", Some(e)) => {
                if outcome_known(&e.code) {
                    self.guard.answered(slot, false);
                } else {
                    self.guard.unknown(slot);
                }
                self.shared.refused(&failure_kind(&e.code, &e.message))
            }
            (other, _) => anyhow::bail!("unexpected reply type {other:?}"),
        }
        if !self.shared.meter.stopped() {
            self.send(slot).await?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// HTTP request/response.

/// A keep-alive connection to `url` for one [`http_worker`] (see [`super::http1`] for why
/// not `reqwest`).
pub async fn http_connect(url: &str) -> anyhow::Result<Http1> {
    let authorization = crate::server::bearer(crate::server::admin_token());
    Http1::connect(url, &authorization, HTTP_TIMEOUT).await
}

/// The body of `POST /v1/call/transfer`, written directly.
pub fn call_body(from: u32, to: u32, durability: Durability) -> String {
    format!(
        r#"{{"args":{{"from":{from},"to":{to},"amount":{AMOUNT}}},"durability":"{}"}}"#,
        durability.as_str()
    )
}

/// One request/response task: takes the next pair from its client's `cursor`, posts it,
/// waits for the answer, until the meter stops.
pub fn http_worker(
    mut client: Http1,
    url: Arc<str>,
    shared: Shared,
    cursor: Arc<AtomicUsize>,
) -> Worker {
    tokio::spawn(async move {
        let mut latency = Latency::new();
        // One request at a time: id 0. On a transport error the guard records the transfer
        // in flight as unknown.
        let mut guard = shared.ledger.client();
        while !shared.meter.stopped() {
            let (from, to) = shared.pairs.get(cursor.fetch_add(1, Ordering::Relaxed));
            guard.sent(
                0,
                Transfer {
                    from,
                    to,
                    amount: AMOUNT,
                },
            );
            let body = call_body(from, to, shared.durability);
            let t = Instant::now();
            let answer = client.post_json(body.as_bytes()).await;
            let (status, bytes) = match answer {
                Ok(a) => a,
                Err(e) => {
                    shared.meter.stop();
                    return Err(e.context(format!("POST {url}")));
                }
            };
            if (200..300).contains(&status) {
                guard.answered(0, true);
                shared.meter.acked(1, t.elapsed(), &mut latency);
                continue;
            }
            #[derive(Deserialize)]
            struct ErrorReply<'a> {
                #[serde(borrow)]
                error: ErrorBody<'a>,
            }
            match serde_json::from_slice::<ErrorReply<'_>>(bytes) {
                Ok(r) => {
                    if outcome_known(&r.error.code) {
                        guard.answered(0, false);
                    } else {
                        guard.unknown(0);
                    }
                    shared.refused(&failure_kind(&r.error.code, &r.error.message))
                }
                Err(_) => {
                    guard.unknown(0);
                    shared.refused(&format!("http_{status}"))
                }
            }
        }
        Ok(latency)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_the_thrown_message() {
        assert_eq!(
            failure_kind(
                "function_error",
                "Error: insufficient_funds: account 3 has 0"
            ),
            "insufficient_funds"
        );
        assert_eq!(
            failure_kind("function_error", "same_account: cannot transfer"),
            "same_account"
        );
        assert_eq!(failure_kind("busy", "try again"), "busy");
    }

    #[test]
    fn only_refusals_decided_before_a_change_make_an_outcome_known() {
        for code in [
            "function_error",
            "conflict",
            "limit",
            "serialization_failure",
        ] {
            assert!(outcome_known(code), "{code}");
        }
        for code in ["log_poisoned", "shutting_down", "internal", "http_502", ""] {
            assert!(!outcome_known(code), "{code}");
        }
    }

    #[test]
    fn call_frames_round_trip_through_messagepack() {
        let bytes = rmp_serde::to_vec_named(&CallFrame {
            id: 7,
            kind: "call",
            name: "transfer",
            args: TransferArgs {
                from: 1,
                to: 2,
                amount: 1,
            },
            durability: "fsync",
        })
        .unwrap();
        // The server decodes frames as generic values: the same shapes as JSON.
        let v: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": 7, "type": "call", "name": "transfer",
                "args": {"from": 1, "to": 2, "amount": 1}, "durability": "fsync"})
        );
        let reply = rmp_serde::to_vec_named(&serde_json::json!({
            "id": 7, "type": "error",
            "error": {"code": "function_error", "message": "missing_account: no account 9"}
        }))
        .unwrap();
        let r: ReplyFrame<'_> = rmp_serde::from_slice(&reply).unwrap();
        assert_eq!((r.id, r.kind.as_ref()), (Some(7), "error"));
        let e = r.error.unwrap();
        assert_eq!(failure_kind(&e.code, &e.message), "missing_account");
        let ok = rmp_serde::to_vec_named(
            &serde_json::json!({"id": 3, "type": "result", "seq": 12, "result": null}),
        )
        .unwrap();
        let r: ReplyFrame<'_> = rmp_serde::from_slice(&ok).unwrap();
        assert_eq!(
            (r.id, r.kind.as_ref(), r.error.is_none()),
            (Some(3), "result", true)
        );
    }

    #[test]
    fn a_hand_written_call_frame_is_the_bytes_rmp_serde_writes() {
        // Every width of MessagePack's unsigned integers, on both sides of each boundary.
        let edges = [
            0u32,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u32::MAX - 1,
            u32::MAX,
        ];
        let mut out = Vec::new();
        for (i, &id) in edges.iter().enumerate() {
            let (from, to) = (edges[(i + 3) % edges.len()], edges[(i + 7) % edges.len()]);
            for durability in ["fsync", "disk", "memory"] {
                write_call(&mut out, id, from, to, durability);
                let args = TransferArgs {
                    from,
                    to,
                    amount: AMOUNT,
                };
                let frame = CallFrame {
                    id,
                    kind: "call",
                    name: "transfer",
                    args,
                    durability,
                };
                assert_eq!(
                    out,
                    rmp_serde::to_vec_named(&frame).unwrap(),
                    "{id} {from} {to}"
                );
            }
        }
    }

    #[test]
    fn result_replies_are_read_directly_and_everything_else_is_left_to_serde() {
        let frame = |v: serde_json::Value| rmp_serde::to_vec_named(&v).unwrap();
        use serde_json::json;
        // The server's reply, any field order, any result.
        for (reply, id) in [
            (
                json!({"type": "result", "seq": 12, "result": null, "id": 3}),
                3,
            ),
            (
                json!({"id": 70000, "type": "result", "seq": 1, "result": {"a": [1, "x"]}}),
                70000,
            ),
            (
                json!({"type": "result", "id": 0, "result": 2.5, "seq": u64::MAX}),
                0,
            ),
        ] {
            assert_eq!(result_id(&frame(reply.clone())), Some(id), "{reply}");
        }
        let error = json!({"id": 7, "type": "error", "error": {"code": "limit", "message": "m"}});
        for other in [
            error,
            json!({"type": "result", "seq": 1, "result": null}),
            json!({"type": "result", "id": -1}),
            json!({"type": "result", "id": 4_294_967_296u64}),
            json!({"type": "result", "id": "3"}),
            json!([1, 2]),
        ] {
            assert_eq!(result_id(&frame(other.clone())), None, "{other}");
        }
        // A field twice, and bytes after the map.
        let mut twice = vec![0x83];
        for (k, v) in [("type", "result"), ("id", ""), ("id", "")] {
            rmp_serde::encode::write(&mut twice, k).unwrap();
            if v.is_empty() {
                twice.push(0x01);
            } else {
                rmp_serde::encode::write(&mut twice, v).unwrap();
            }
        }
        assert_eq!(result_id(&twice), None);
        let mut trailing = frame(json!({"type": "result", "id": 1}));
        assert_eq!(result_id(&trailing), Some(1));
        trailing.push(0xc0);
        assert_eq!(result_id(&trailing), None);
    }

    #[test]
    fn call_bodies_are_json() {
        let v: serde_json::Value =
            serde_json::from_str(&call_body(4, 5, Durability::Fsync)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"args": {"from": 4, "to": 5, "amount": 1}, "durability": "fsync"})
        );
    }
}
