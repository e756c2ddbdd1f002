//! Concurrent bank transfers, run as server functions, keep the sum of balances — with the
//! server running, and across `kill -9`.
//!
//! Clients are a mix of HTTP (`POST /v1/call/transfer`, one call at a time) and WebSocket
//! MessagePack connections (`/v1/ws`, many calls pipelined per connection), all transferring
//! between the same accounts, some with amounts large enough to be refused for insufficient
//! funds, a few to the same account (refused too).
//!
//! - `transfers_keep_the_sum_of_balances`: `examples/bank.js` as shipped. Afterwards every
//!   account holds exactly initial + received − sent over the acknowledged transfers, the seq
//!   advanced by exactly the number of acknowledged transfers (a refused transfer commits
//!   nothing), every acknowledged transfer has its own seq, and replaying the acknowledged
//!   transfers in seq order never overdraws an account (the order the server chose is a
//!   valid serial order).
//! - `transfers_survive_kill_dash_nine`: the same transfers, plus a ledger row written by
//!   the same function, so that after `kill -9` at a random moment and a restart the set of
//!   transfers the server kept is known exactly. Then: every acknowledged transfer is in the
//!   ledger, every ledger row is an acknowledged or an in-flight transfer (never a refused
//!   one), and every balance equals initial + the net of the ledger — so a transfer was kept
//!   whole or not at all. The model carries over the cycles.
//!
//! `SLUICE_TEST_SEED` repeats a run's workload and kill moments; `SLUICE_CRASH_CYCLES`
//! changes the number of kill cycles (default 5).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, describe, repo_file, seed, Api, Rng, Server, TempDir};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const ACCOUNTS: u64 = 200;
const INITIAL_BALANCE: i64 = 1_000;
const HTTP_CLIENTS: usize = 24;
const WS_CLIENTS: usize = 8;
/// Calls in flight at once on one WebSocket connection.
const WS_WINDOW: usize = 16;
/// A reply must arrive within this long while the server is up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

const CREATE_ACCOUNTS: &str =
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)";
const CREATE_LEDGER: &str = "CREATE TABLE ledger (id INTEGER PRIMARY KEY, src INTEGER NOT NULL, \
     dst INTEGER NOT NULL, amount INTEGER NOT NULL)";

/// `examples/bank.js`'s transfer, which also records the transfer in `ledger` (between its
/// two patches, so a half-kept transfer would show).
const BANK_WITH_LEDGER: &str = r#"
export function transfer(tx, { id, from, to, amount }) {
  if (from === to) throw new Error("same_account: cannot transfer to the same account");
  const a = tx.get("accounts", from);
  if (a === null) throw new Error(`missing_account: no account ${from}`);
  const b = tx.get("accounts", to);
  if (b === null) throw new Error(`missing_account: no account ${to}`);
  if (a.balance < amount) throw new Error(`insufficient_funds: account ${from} has ${a.balance}`);
  tx.patch("accounts", from, { balance: a.balance - amount });
  tx.insert("ledger", { id, src: from, dst: to, amount });
  tx.patch("accounts", to, { balance: b.balance + amount });
  return null;
}
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Transfer {
    id: u64,
    from: u64,
    to: u64,
    amount: i64,
}

impl Transfer {
    fn args(&self) -> Value {
        json!({"id": self.id, "from": self.from, "to": self.to, "amount": self.amount})
    }
}

/// What one client saw in one run.
#[derive(Default)]
struct Outcome {
    /// Acknowledged transfers with the seq of their commit.
    acked: Vec<(Transfer, u64)>,
    /// Sent, but the server died before replying.
    in_flight: Vec<Transfer>,
    /// Refused (`function_error`): must leave no trace.
    refused: Vec<(Transfer, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Http,
    WsMsgpack,
}

struct Client {
    index: usize,
    kind: Kind,
    rng: Rng,
    /// Transfer ids are unique over the whole test: `index * 10^7 + n`.
    next: u64,
}

impl Client {
    fn new(index: usize, kind: Kind, seed: u64) -> Client {
        Client {
            index,
            kind,
            rng: Rng::new(seed),
            next: 0,
        }
    }

    /// A random transfer: mostly small; about one in ten larger than a typical balance (so
    /// some are refused for insufficient funds); one in fifty to the same account.
    fn plan(&mut self) -> Transfer {
        self.next += 1;
        let from = self.rng.below(ACCOUNTS);
        let to = if self.rng.chance(2) {
            from
        } else {
            (from + 1 + self.rng.below(ACCOUNTS - 1)) % ACCOUNTS
        };
        let amount = if self.rng.chance(10) {
            1_000 + self.rng.below(2_000) as i64
        } else {
            1 + self.rng.below(300) as i64
        };
        Transfer {
            id: self.index as u64 * 10_000_000 + self.next,
            from,
            to,
            amount,
        }
    }

    /// Runs up to `count` transfers; stops early (recording what is in flight) if the
    /// server goes away.
    async fn run(
        mut self,
        api: Api,
        ws_url: String,
        count: usize,
        acked_total: Arc<AtomicU64>,
    ) -> Result<(Client, Outcome), String> {
        let mut out = Outcome::default();
        match self.kind {
            Kind::Http => self.run_http(&api, count, &acked_total, &mut out).await?,
            Kind::WsMsgpack => self.run_ws(&ws_url, count, &acked_total, &mut out).await?,
        }
        Ok((self, out))
    }

    async fn run_http(
        &mut self,
        api: &Api,
        count: usize,
        acked_total: &AtomicU64,
        out: &mut Outcome,
    ) -> Result<(), String> {
        for _ in 0..count {
            let t = self.plan();
            let Ok((status, body)) = api.try_call("transfer", &t.args()).await else {
                out.in_flight.push(t);
                return Ok(());
            };
            let reply = if status == 200 {
                json!({"type": "result", "seq": body["seq"], "result": body["result"]})
            } else {
                json!({"type": "error", "error": body["error"], "status": status})
            };
            record(t, &reply, out, acked_total)
                .map_err(|e| format!("HTTP client {}: {e}", self.index))?;
        }
        Ok(())
    }

    async fn run_ws(
        &mut self,
        url: &str,
        count: usize,
        acked_total: &AtomicU64,
        out: &mut Outcome,
    ) -> Result<(), String> {
        let request = common::ws_request(url, Some("sluice.msgpack.v1"));
        let mut ws = match tokio_tungstenite::connect_async(request).await {
            Ok((ws, _)) => ws,
            // The server died before this client connected: nothing was sent.
            Err(_) => return Ok(()),
        };
        let mut pending: BTreeMap<u64, Transfer> = BTreeMap::new();
        let mut sent = 0;
        loop {
            while sent < count && pending.len() < WS_WINDOW {
                let t = self.plan();
                let request = json!({"id": t.id, "type": "call", "name": "transfer",
                                     "args": t.args()});
                let bytes = rmp_serde::to_vec_named(&request).expect("encode MessagePack");
                sent += 1;
                pending.insert(t.id, t);
                if ws.send(Message::Binary(bytes.into())).await.is_err() {
                    out.in_flight.extend(pending.into_values());
                    return Ok(());
                }
            }
            if pending.is_empty() {
                let _ = ws.close(None).await;
                return Ok(());
            }
            let message = tokio::time::timeout(REPLY_TIMEOUT, ws.next())
                .await
                .map_err(|_| {
                    format!(
                        "WS client {}: no reply within {REPLY_TIMEOUT:?}",
                        self.index
                    )
                })?;
            let reply: Value = match message {
                Some(Ok(Message::Binary(b))) => rmp_serde::from_slice(&b)
                    .map_err(|e| format!("WS client {}: bad MessagePack: {e}", self.index))?,
                Some(Ok(Message::Text(t))) => {
                    return Err(format!(
                        "WS client {}: a text frame on a MessagePack connection: {t}",
                        self.index
                    ))
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                // Closed or cut: the server went away.
                _ => {
                    out.in_flight.extend(pending.into_values());
                    return Ok(());
                }
            };
            let id = reply["id"]
                .as_u64()
                .ok_or_else(|| format!("WS client {}: reply without id: {reply}", self.index))?;
            let t = pending.remove(&id).ok_or_else(|| {
                format!(
                    "WS client {}: reply for id {id}, which is not pending: {reply}",
                    self.index
                )
            })?;
            record(t, &reply, out, acked_total)
                .map_err(|e| format!("WS client {}: {e}", self.index))?;
        }
    }
}

/// Files one reply (`{"type": "result", "seq"}` or `{"type": "error", "error"}`).
fn record(
    t: Transfer,
    reply: &Value,
    out: &mut Outcome,
    acked_total: &AtomicU64,
) -> Result<(), String> {
    match reply["type"].as_str() {
        Some("result") => {
            let seq = reply["seq"]
                .as_u64()
                .ok_or_else(|| format!("{t:?}: result without seq: {reply}"))?;
            if !reply["result"].is_null() {
                return Err(format!("{t:?}: transfer returned {reply}"));
            }
            out.acked.push((t, seq));
            acked_total.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Some("error") => {
            let code = reply["error"]["code"].as_str().unwrap_or_default();
            let message = reply["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let expected = if t.from == t.to {
                "same_account"
            } else {
                "insufficient_funds"
            };
            // Over HTTP, a function error is a 400 (WebSocket replies carry no status).
            let status_ok = reply.get("status").is_none_or(|s| s == 400);
            if code != "function_error" || !message.starts_with(expected) || !status_ok {
                return Err(format!(
                    "{t:?} was refused with {reply}; expected function_error {expected}"
                ));
            }
            out.refused.push((t, message));
            Ok(())
        }
        _ => Err(format!("{t:?}: unexpected reply {reply}")),
    }
}

fn make_clients(rng: &mut Rng) -> Vec<Client> {
    (0..HTTP_CLIENTS + WS_CLIENTS)
        .map(|i| {
            let kind = if i < HTTP_CLIENTS {
                Kind::Http
            } else {
                Kind::WsMsgpack
            };
            Client::new(i, kind, rng.next_u64())
        })
        .collect()
}

async fn create_accounts(api: &Api) {
    api.sql(CREATE_ACCOUNTS).await;
    let ops: Vec<Value> = (0..ACCOUNTS)
        .map(|id| {
            json!({"op": "insert", "table": "accounts",
                   "row": {"id": id, "balance": INITIAL_BALANCE}})
        })
        .collect();
    api.mutate(json!(ops)).await;
}

/// Every account's balance, by id; asserts all accounts exist and none is negative.
async fn balances(api: &Api, context: &str) -> Vec<i64> {
    let rows = api.scan_all("accounts", 1000).await;
    assert_eq!(
        rows.len() as u64,
        ACCOUNTS,
        "{context}: accounts were created or lost"
    );
    let mut out = vec![0; ACCOUNTS as usize];
    for (i, item) in rows.iter().enumerate() {
        let row = &item["row"];
        assert_eq!(row["id"].as_u64(), Some(i as u64), "{context}: {row}");
        let balance = row["balance"].as_i64().expect("balance");
        assert!(balance >= 0, "{context}: account {i} is overdrawn: {row}");
        out[i] = balance;
    }
    out
}

/// The balances the transfers `kept` lead to from the initial ones.
fn expected_balances<'a>(kept: impl IntoIterator<Item = &'a Transfer>) -> Vec<i64> {
    let mut b = vec![INITIAL_BALANCE; ACCOUNTS as usize];
    for t in kept {
        b[t.from as usize] -= t.amount;
        b[t.to as usize] += t.amount;
    }
    b
}

fn assert_balances(found: &[i64], expected: &[i64], context: &str) {
    let total: i64 = found.iter().sum();
    assert_eq!(
        total,
        INITIAL_BALANCE * ACCOUNTS as i64,
        "{context}: the sum of balances changed"
    );
    let wrong: Vec<String> = (0..found.len())
        .filter(|&i| found[i] != expected[i])
        .map(|i| format!("account {i}: {} (expected {})", found[i], expected[i]))
        .collect();
    assert!(
        wrong.is_empty(),
        "{context}: balances not explained by the acknowledged transfers:\n{}",
        wrong.join("\n")
    );
}

fn ws_url(server: &Server) -> String {
    format!("ws://{}/v1/ws", server.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_keep_the_sum_of_balances() {
    const TRANSFERS_PER_HTTP_CLIENT: usize = 150;
    const TRANSFERS_PER_WS_CLIENT: usize = 500;

    let seed = seed("transfers_keep_the_sum_of_balances");
    let context = format!("seed {seed}");
    let mut rng = Rng::new(seed);
    let root = TempDir::new("transfers");
    let bank = repo_file("examples/bank.js");
    let server = Server::start(
        &root.join("data"),
        root.path(),
        &[
            "--durability",
            "fsync",
            "--functions",
            bank.to_str().unwrap(),
        ],
    );
    let api = server.api();
    create_accounts(&api).await;
    let seq_before = api.health_seq().await;

    let acked_total = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = make_clients(&mut rng)
        .into_iter()
        .map(|c| {
            let count = match c.kind {
                Kind::Http => TRANSFERS_PER_HTTP_CLIENT,
                Kind::WsMsgpack => TRANSFERS_PER_WS_CLIENT,
            };
            tokio::spawn(c.run(api.clone(), ws_url(&server), count, acked_total.clone()))
        })
        .collect();
    let mut acked: Vec<(Transfer, u64)> = Vec::new();
    let mut refused: Vec<(Transfer, String)> = Vec::new();
    for task in tasks {
        let (client, out) = task
            .await
            .expect("client task")
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        assert!(
            out.in_flight.is_empty(),
            "{context}: client {} lost its connection with {} calls in flight: {:?}",
            client.index,
            out.in_flight.len(),
            server.stderr()
        );
        acked.extend(out.acked);
        refused.extend(out.refused);
    }

    let found = balances(&api, &context).await;
    assert_balances(
        &found,
        &expected_balances(acked.iter().map(|(t, _)| t)),
        &context,
    );

    // A refused transfer commits nothing: the seq moved once per acknowledged transfer,
    // and each acknowledged transfer has its own seq in that range.
    let seq_after = api.health_seq().await;
    assert_eq!(
        seq_after - seq_before,
        acked.len() as u64,
        "{context}: {} transfers acknowledged, but the seq moved from {seq_before} to {seq_after}",
        acked.len()
    );
    acked.sort_by_key(|(_, seq)| *seq);
    let seqs: BTreeSet<u64> = acked.iter().map(|(_, seq)| *seq).collect();
    assert_eq!(
        seqs.len(),
        acked.len(),
        "{context}: two transfers share a seq"
    );
    assert!(
        acked.first().is_none_or(|(_, s)| *s > seq_before)
            && acked.last().is_none_or(|(_, s)| *s <= seq_after),
        "{context}: a transfer's seq is outside {seq_before}..={seq_after}"
    );

    // The seq order is a valid serial order: replayed in it, no transfer overdraws.
    let mut b = vec![INITIAL_BALANCE; ACCOUNTS as usize];
    for (t, seq) in &acked {
        assert!(
            b[t.from as usize] >= t.amount,
            "{context}: acknowledged transfer {t:?} at seq {seq} overdraws account {} ({})",
            t.from,
            b[t.from as usize]
        );
        b[t.from as usize] -= t.amount;
        b[t.to as usize] += t.amount;
    }

    let insufficient = refused
        .iter()
        .filter(|(_, m)| m.starts_with("insufficient_funds"))
        .count();
    let same = refused.len() - insufficient;
    eprintln!(
        "{} transfers acknowledged, {insufficient} refused for insufficient funds, {same} to the same account",
        acked.len()
    );
    assert!(
        insufficient > 0,
        "{context}: the workload never hit insufficient funds"
    );
    assert!(
        acked.len() > refused.len(),
        "{context}: most transfers were refused"
    );
}

/// The test's knowledge of which transfers the server holds.
#[derive(Default)]
struct Model {
    /// Transfers the server must hold: acknowledged, or in flight and found after a restart.
    kept: BTreeMap<u64, Transfer>,
    /// In flight when the server was killed: may or may not have been kept.
    in_flight: BTreeMap<u64, Transfer>,
    /// Refused, or in flight and not found after a restart: must never appear.
    gone: BTreeSet<u64>,
    seq_acked_max: u64,
    /// In-flight transfers found after a restart.
    in_flight_kept: usize,
}

impl Model {
    /// Checks the restarted server against the model and settles the in-flight transfers.
    async fn verify(&mut self, api: &Api, context: &str) {
        let seq = api.health_seq().await;
        assert!(
            seq >= self.seq_acked_max,
            "{context}: recovered seq {seq} is below the acknowledged seq {}",
            self.seq_acked_max
        );
        let mut ledger: BTreeMap<u64, Transfer> = BTreeMap::new();
        for item in api.scan_all("ledger", 10_000).await {
            let row = &item["row"];
            let t = Transfer {
                id: row["id"].as_u64().expect("id"),
                from: row["src"].as_u64().expect("src"),
                to: row["dst"].as_u64().expect("dst"),
                amount: row["amount"].as_i64().expect("amount"),
            };
            ledger.insert(t.id, t);
        }
        for (id, t) in &ledger {
            let known = self.kept.get(id).or_else(|| self.in_flight.get(id));
            assert_eq!(
                known,
                Some(t),
                "{context}: ledger row {t:?} is not an acknowledged or in-flight transfer{}",
                if self.gone.contains(id) {
                    " (it was refused, or lost in an earlier crash)"
                } else {
                    ""
                }
            );
        }
        let lost: Vec<&Transfer> = self
            .kept
            .values()
            .filter(|t| !ledger.contains_key(&t.id))
            .collect();
        assert!(
            lost.is_empty(),
            "{context}: {} acknowledged transfers were lost, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
        let found = balances(api, context).await;
        assert_balances(&found, &expected_balances(ledger.values()), context);
        for (id, t) in std::mem::take(&mut self.in_flight) {
            if ledger.contains_key(&id) {
                self.in_flight_kept += 1;
                self.kept.insert(id, t);
            } else {
                self.gone.insert(id);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_survive_kill_dash_nine() {
    const TRANSFERS_PER_CLIENT_MAX: usize = 1_000;

    let cycles: usize = std::env::var("SLUICE_CRASH_CYCLES")
        .ok()
        .map(|v| v.parse().expect("SLUICE_CRASH_CYCLES must be a number"))
        .unwrap_or(5);
    let seed = seed("transfers_survive_kill_dash_nine");
    let mut rng = Rng::new(seed);
    let root = TempDir::new("transfers-kill");
    let data = root.join("data");
    let module = root.join("bank-with-ledger.js");
    std::fs::write(&module, BANK_WITH_LEDGER).unwrap();
    let args = [
        "--durability",
        "fsync",
        "--functions",
        module.to_str().unwrap(),
        // Kills also land during segment rolls and snapshots.
        "--segment-bytes",
        "65536",
        "--snapshot-log-bytes",
        "262144",
        // Snapshots on the byte interval alone, however large the state: many of them.
        "--snapshot-log-percent",
        "0",
    ];
    let mut clients = make_clients(&mut rng);
    let mut model = Model::default();
    let mut refused_total = 0;
    let mut in_flight_total = 0;
    for cycle in 0..=cycles {
        let context = format!("seed {seed}, after kill {cycle}");
        if cycle == cycles {
            let out = check(&data);
            assert!(
                out.status.success(),
                "{context}: sluice check:\n{}",
                describe(&out)
            );
        }
        let server = Server::start(&data, root.path(), &args);
        let api = server.api();
        if cycle == 0 {
            create_accounts(&api).await;
            api.sql(CREATE_LEDGER).await;
        } else {
            model.verify(&api, &context).await;
        }
        if cycle == cycles {
            break;
        }

        let acked_now = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = clients
            .drain(..)
            .map(|c| {
                tokio::spawn(c.run(
                    api.clone(),
                    ws_url(&server),
                    TRANSFERS_PER_CLIENT_MAX,
                    acked_now.clone(),
                ))
            })
            .collect();
        // Kill at a random moment: after a random number of acknowledgements, plus a
        // random delay.
        let acks_wanted = 20 + rng.below(1_500);
        let wait_until = Instant::now() + Duration::from_secs(15);
        while acked_now.load(Ordering::Relaxed) < acks_wanted
            && Instant::now() < wait_until
            && !tasks.iter().all(|t| t.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
        server.kill9();

        for task in tasks {
            let (client, out) = task
                .await
                .expect("client task")
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            for (t, seq) in out.acked {
                model.kept.insert(t.id, t);
                model.seq_acked_max = model.seq_acked_max.max(seq);
            }
            in_flight_total += out.in_flight.len();
            for t in out.in_flight {
                model.in_flight.insert(t.id, t);
            }
            refused_total += out.refused.len();
            model.gone.extend(out.refused.iter().map(|(t, _)| t.id));
            clients.push(client);
        }
        clients.sort_by_key(|c| c.index);
    }
    eprintln!(
        "{cycles} kills: {} transfers kept, {in_flight_total} in flight at a kill \
         ({} of them kept), {refused_total} refused",
        model.kept.len(),
        model.in_flight_kept
    );
    assert!(
        in_flight_total > 0,
        "seed {seed}: no kill landed while transfers were in flight"
    );
    assert!(
        model.kept.len() > cycles * 20,
        "seed {seed}: too few transfers were acknowledged to mean anything"
    );
}
