//! `kill -9` of the real binary under concurrent load loses no acknowledged write.
//!
//! Several writer tasks mutate rows of one table; every key belongs to exactly one writer,
//! so each writer knows the exact state of its keys: the last acknowledged state, plus at
//! most one mutate in flight when the process died (whose ops apply all or none). After
//! `SIGKILL` at a random moment and a restart on the same data directory, every key must be
//! in its acknowledged state or, for the keys of the in-flight mutate, all of them in the
//! state that mutate would have produced; no row that was never written may appear. The
//! model carries over from cycle to cycle, so an acknowledged write must also survive every
//! later crash. Small segments, a low snapshot threshold and a short changelog window make
//! kills land during segment rolls, snapshots and segment retirement too.
//!
//! The same workload stopped with SIGTERM instead must exit 0 with a final snapshot, so
//! that the restart replays nothing and still has every acknowledged write.
//!
//! `SLUICE_CRASH_CYCLES=100` runs 100 cycles per durability class (default 20);
//! `SLUICE_TEST_SEED` repeats a run's workload and kill moments.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, describe, seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};
use sluice_log::segment::list_segments;
use sluice_log::snapshot::list_snapshots;

const WRITERS: usize = 8;
const CYCLES_DEFAULT: usize = 20;
const SIGTERM_CYCLES: usize = 4;
/// A writer gives up (and fails the test) if the server was not killed by then.
const WRITER_DEADLINE: Duration = Duration::from_secs(60);
const WRITER_MUTATES_MAX: usize = 1_000_000;
/// Above this many live keys, a writer deletes more than it inserts.
const LIVE_KEYS_TARGET: usize = 40;

const CREATE_TABLE: &str =
    "CREATE TABLE kv (id TEXT PRIMARY KEY, writer INTEGER NOT NULL, n INTEGER NOT NULL)";

/// A row as the test expects it: `n` and its version (`None`: no row). A row's version is the
/// seq of the commit that last wrote it; a planned write has `PENDING` until its reply says
/// that seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowState {
    n: i64,
    version: u64,
}

/// The version of a planned write whose commit seq is not known yet.
const PENDING: u64 = 0;

type State = Option<RowState>;

/// One op of a planned mutate: the key's state before and after it.
#[derive(Clone, Debug)]
struct Planned {
    key: String,
    before: State,
    after: State,
    op: Value,
}

struct Writer {
    id: usize,
    rng: Rng,
    /// Every key this writer ever wrote, with its last acknowledged state.
    acked: BTreeMap<String, State>,
    next_key: u64,
    /// The mutate whose response never arrived (the server died first).
    in_flight: Option<Vec<Planned>>,
    /// Highest seq acknowledged to this writer.
    seq_acked_max: u64,
}

impl Writer {
    fn new(id: usize, seed: u64) -> Writer {
        Writer {
            id,
            rng: Rng::new(seed),
            acked: BTreeMap::new(),
            next_key: 0,
            in_flight: None,
            seq_acked_max: 0,
        }
    }

    /// A mutate of 1–3 ops on distinct keys of this writer.
    fn plan(&mut self) -> Vec<Planned> {
        let ops = 1 + self.rng.below(3) as usize;
        let mut plan: Vec<Planned> = Vec::with_capacity(ops);
        for _ in 0..ops {
            let used: BTreeSet<&str> = plan.iter().map(|p| p.key.as_str()).collect();
            let live: Vec<(String, RowState)> = self
                .acked
                .iter()
                .filter(|(k, _)| !used.contains(k.as_str()))
                .filter_map(|(k, s)| s.map(|s| (k.clone(), s)))
                .collect();
            let dead: Vec<String> = self
                .acked
                .iter()
                .filter(|(k, s)| s.is_none() && !used.contains(k.as_str()))
                .map(|(k, _)| k.clone())
                .collect();
            let insert_percent = if live.len() < LIVE_KEYS_TARGET {
                50
            } else {
                15
            };
            let n = self.rng.below(1_000_000) as i64;
            let roll = self.rng.below(100);
            let planned = if live.is_empty() || roll < insert_percent {
                let key = if !dead.is_empty() && self.rng.chance(20) {
                    dead[self.rng.below(dead.len() as u64) as usize].clone()
                } else {
                    self.next_key += 1;
                    format!("w{}-{:06}", self.id, self.next_key)
                };
                Planned {
                    op: json!({"op": "insert", "table": "kv",
                               "row": {"id": key, "writer": self.id, "n": n}}),
                    key,
                    before: None,
                    after: Some(RowState {
                        n,
                        version: PENDING,
                    }),
                }
            } else {
                let (key, old) = live[self.rng.below(live.len() as u64) as usize].clone();
                let kind = self.rng.below(100);
                let (op, after) = if kind < 55 {
                    (
                        json!({"op": "patch", "table": "kv", "id": key, "set": {"n": n},
                               "if_version": old.version}),
                        Some(RowState {
                            n,
                            version: PENDING,
                        }),
                    )
                } else if kind < 70 {
                    (
                        json!({"op": "upsert", "table": "kv", "if_version": old.version,
                               "row": {"id": key, "writer": self.id, "n": n}}),
                        Some(RowState {
                            n,
                            version: PENDING,
                        }),
                    )
                } else {
                    (
                        json!({"op": "delete", "table": "kv", "id": key,
                               "if_version": old.version}),
                        None,
                    )
                };
                Planned {
                    key,
                    before: Some(old),
                    after,
                    op,
                }
            };
            plan.push(planned);
        }
        plan
    }

    /// Mutates until a request gets no response (the server was killed). Any refusal is a
    /// failure: the workload only asks for writes that must succeed.
    async fn run(mut self, api: Api, acked_total: Arc<AtomicU64>) -> Result<Writer, String> {
        let deadline = Instant::now() + WRITER_DEADLINE;
        for _ in 0..WRITER_MUTATES_MAX {
            if Instant::now() > deadline {
                return Err(format!("writer {}: the server was never killed", self.id));
            }
            let plan = self.plan();
            let body = json!({"ops": plan.iter().map(|p| p.op.clone()).collect::<Vec<_>>()});
            let (status, resp) = match api.try_post("/v1/mutate", &body).await {
                Ok(r) => r,
                Err(_) => {
                    self.in_flight = Some(plan);
                    return Ok(self);
                }
            };
            if status == 503 && resp["error"]["code"] == "shutting_down" {
                // Refused during a graceful shutdown: nothing was applied.
                return Ok(self);
            }
            if status != 200 {
                return Err(format!(
                    "writer {}: mutate {body} was refused with {status}: {resp}",
                    self.id
                ));
            }
            let results = resp["results"].as_array().cloned().unwrap_or_default();
            if results.len() != plan.len() {
                return Err(format!("writer {}: mutate {body} answered {resp}", self.id));
            }
            let seq = resp["seq"]
                .as_u64()
                .ok_or_else(|| format!("no seq in {resp}"))?;
            for (p, r) in plan.iter().zip(&results) {
                // A write's version is its commit's seq; a delete reports the version it
                // deleted.
                let after = p.after.map(|a| RowState { version: seq, ..a });
                let version = after.or(p.before).map(|s| s.version);
                if r["version"].as_u64() != version || r["id"].as_str() != Some(p.key.as_str()) {
                    return Err(format!(
                        "writer {}: op {} answered {r}, expected version {version:?}",
                        self.id, p.op
                    ));
                }
                self.acked.insert(p.key.clone(), after);
            }
            self.seq_acked_max = self.seq_acked_max.max(seq);
            acked_total.fetch_add(1, Ordering::Relaxed);
        }
        Err(format!("writer {}: ran out of mutates", self.id))
    }
}

/// Reads every row after a restart and checks it against the writers' models; resolves
/// each in-flight mutate to whichever side the server kept.
async fn verify(api: &Api, writers: &mut [Writer], context: &str) {
    let mut found: BTreeMap<String, (u64, State)> = BTreeMap::new();
    for item in api.scan_all("kv", 1000).await {
        let row = &item["row"];
        let key = row["id"].as_str().expect("id").to_string();
        let state = Some(RowState {
            n: row["n"].as_i64().expect("n"),
            version: item["version"].as_u64().expect("version"),
        });
        let writer = row["writer"].as_u64().expect("writer");
        let dup = found.insert(key.clone(), (writer, state));
        assert!(dup.is_none(), "{context}: row {key} scanned twice");
    }
    let state_of = |key: &str| found.get(key).and_then(|(_, s)| *s);

    let mut known = BTreeSet::new();
    for w in writers.iter_mut() {
        if let Some(plan) = w.in_flight.take() {
            let now: Vec<State> = plan.iter().map(|p| state_of(&p.key)).collect();
            let all_before = plan.iter().zip(&now).all(|(p, s)| *s == p.before);
            // Applied: every written row has the one seq of that commit as its version,
            // above the version it had before.
            let seqs: BTreeSet<u64> = now.iter().flatten().map(|s| s.version).collect();
            let all_after = seqs.len() <= 1
                && plan.iter().zip(&now).all(|(p, s)| match (p.after, s) {
                    (None, None) => true,
                    (Some(a), Some(s)) => {
                        a.n == s.n && p.before.is_none_or(|b| s.version > b.version)
                    }
                    _ => false,
                });
            assert!(
                all_before || all_after,
                "{context}: writer {}'s in-flight mutate was neither applied nor absent:\n\
                 ops {:?}\nbefore {:?}\nafter {:?}\nfound {now:?}",
                w.id,
                plan.iter().map(|p| &p.op).collect::<Vec<_>>(),
                plan.iter().map(|p| p.before).collect::<Vec<_>>(),
                plan.iter().map(|p| p.after).collect::<Vec<_>>(),
            );
            for (p, s) in plan.iter().zip(now) {
                w.acked.insert(p.key.clone(), s);
            }
        }
        for (key, expected) in &w.acked {
            let got = found.get(key);
            if let Some((writer, _)) = got {
                assert_eq!(
                    *writer, w.id as u64,
                    "{context}: row {key} has the wrong writer"
                );
            }
            let got = got.and_then(|(_, s)| *s);
            assert_eq!(
                got, *expected,
                "{context}: writer {}'s key {key}: acknowledged state {expected:?}, found {got:?}",
                w.id
            );
            known.insert(key.clone());
        }
    }
    let strangers: Vec<&String> = found.keys().filter(|k| !known.contains(*k)).collect();
    assert!(
        strangers.is_empty(),
        "{context}: rows that were never written: {strangers:?}"
    );
}

/// How a cycle ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGKILL: no flush, no snapshot.
    Kill,
    /// SIGTERM: graceful shutdown with a final snapshot.
    Term,
}

async fn crash_cycles(durability: &str, stop: Stop, cycles: usize, extra: &[&str]) {
    let seed = seed(&format!("{stop:?} with durability {durability} {extra:?}"));
    let mut rng = Rng::new(seed);
    let root = TempDir::new(&format!("{stop:?}-{durability}{}", extra.concat()));
    let data = root.join("data");
    let mut args = vec![
        "--durability",
        durability,
        "--segment-bytes",
        "8192",
        "--snapshot-log-bytes",
        "16384",
        // Snapshots on the byte interval alone, however large the state: many of them.
        "--snapshot-log-percent",
        "0",
        "--retain-commits",
        "500",
    ];
    args.extend_from_slice(extra);
    let mut writers: Vec<Writer> = (0..WRITERS)
        .map(|i| Writer::new(i, rng.next_u64()))
        .collect();
    let mut seq_acked_max = 0;
    let mut acked_mutates = 0;
    // Segments written over prepared files (the server's default), so that crashes land
    // in them, at their rolls and with their zero tails too.
    let mut prepared_segments = 0.0;
    for cycle in 0..=cycles {
        let context = format!("seed {seed}, durability {durability}, after {stop:?} {cycle}");
        if cycle == cycles {
            // Offline, before recovery repairs anything (a torn tail is allowed).
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
            api.sql(CREATE_TABLE).await;
        } else {
            let seq = api.health_seq().await;
            assert!(
                seq >= seq_acked_max,
                "{context}: recovered seq {seq} is below the acknowledged seq {seq_acked_max}"
            );
            verify(&api, &mut writers, &context).await;
            if stop == Stop::Term {
                let replayed = api.metric("sluice_recovery_replayed").await;
                assert_eq!(
                    replayed, 0.0,
                    "{context}: the final snapshot was not complete"
                );
            }
        }
        if cycle == cycles {
            break;
        }

        let acked = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = writers
            .drain(..)
            .map(|w| tokio::spawn(w.run(api.clone(), acked.clone())))
            .collect();
        // Stop at a random moment: after a random number of acks (so the model is never
        // trivially empty), plus a random delay.
        let acks_wanted = rng.below(300);
        let wait_until = Instant::now() + Duration::from_secs(10);
        while acked.load(Ordering::Relaxed) < acks_wanted && Instant::now() < wait_until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(250))).await;
        prepared_segments += api.metric("sluice_segments_prepared_total").await;
        match stop {
            Stop::Kill => server.kill9(),
            Stop::Term => {
                let (status, stderr) = server.terminate();
                assert!(
                    status.success(),
                    "{context}: exit after SIGTERM: {status}\n{stderr}"
                );
            }
        }
        for task in tasks {
            let w = task
                .await
                .expect("writer task")
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            seq_acked_max = seq_acked_max.max(w.seq_acked_max);
            writers.push(w);
        }
        acked_mutates += acked.load(Ordering::Relaxed);
    }
    eprintln!("{cycles} cycles, {acked_mutates} acknowledged mutates, up to seq {seq_acked_max}");
    assert!(acked_mutates > 0, "no write was ever acknowledged");
    assert!(
        prepared_segments > 0.0,
        "no segment was written over a prepared file"
    );
    if stop == Stop::Kill && cycles >= CYCLES_DEFAULT {
        // The workload is big enough to exercise snapshots and segment retirement.
        assert!(
            !list_snapshots(&data).unwrap().is_empty(),
            "no snapshot was taken"
        );
        assert!(
            list_segments(&data).unwrap()[0].first_seq > 1,
            "no segment was retired"
        );
    }
}

fn crash_cycles_wanted() -> usize {
    std::env::var("SLUICE_CRASH_CYCLES")
        .ok()
        .map(|v| v.parse().expect("SLUICE_CRASH_CYCLES must be a number"))
        .unwrap_or(CYCLES_DEFAULT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_writes_survive_kill_dash_nine() {
    crash_cycles("fsync", Stop::Kill, crash_cycles_wanted(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_writes_survive_kill_dash_nine() {
    crash_cycles("disk", Stop::Kill, crash_cycles_wanted(), &[]).await;
}

/// The same with the prepared segments written around the page cache (`--log-direct-io`):
/// the partial last block of every append is written again with the next, over blocks of
/// 8 KiB segments that roll, seal and are prepared over all the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_writes_with_direct_io_survive_kill_dash_nine() {
    crash_cycles(
        "disk",
        Stop::Kill,
        crash_cycles_wanted(),
        &["--log-direct-io"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_cleanly_and_the_restart_replays_nothing() {
    crash_cycles("fsync", Stop::Term, SIGTERM_CYCLES, &[]).await;
}
