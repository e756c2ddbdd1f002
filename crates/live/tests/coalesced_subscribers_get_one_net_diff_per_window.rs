//! `coalesce_ms`: a coalescing subscriber gets at most one diff per window, the net change
//! of every commit in it, labelled with the last folded diff's seq and that seq's checksum;
//! resuming from that seq is exact. (The random differential against SQLite,
//! `live_views_match_sqlite.rs`, also runs coalescing subscribers of every shape.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_live::{EventKind, Live, Sink, Subscribe};
use sluice_query::Params;

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let sql = "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT, ts INTEGER, body TEXT); CREATE INDEX msg_room ON msg (room);";
    let changes = sluice_sql::parse_ddl(sql)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, sql.into()).unwrap().unwrap();
    db
}

fn put(db: &mut Db, live: &mut Live, rows: &[Json]) -> u64 {
    let mut tx = db.transaction();
    for r in rows {
        tx.upsert("msg", r.as_object().unwrap(), None).unwrap();
    }
    let commit = tx.commit().unwrap();
    live.apply(&commit, || &*db);
    commit.seq
}

fn del(db: &mut Db, live: &mut Live, id: i64) -> u64 {
    let mut tx = db.transaction();
    tx.delete("msg", &json!(id), None).unwrap();
    let commit = tx.commit().unwrap();
    live.apply(&commit, || &*db);
    commit.seq
}

fn sub(live: &mut Live, db: &Db, sql: &str, coalesce_ms: u32, since: Option<u64>) -> Arc<Sink> {
    let sink = Sink::coalescing(live.limits(), coalesce_ms);
    live.subscribe(
        db,
        &Subscribe {
            sql: sql.into(),
            params: Params::from_json(Some(&json!(["a"]))).unwrap(),
            since,
            claims: None,
        },
        sink.clone(),
    )
    .unwrap();
    sink
}

/// Every event queued, as (kind, body).
fn drain(sink: &Sink) -> Vec<(EventKind, Json)> {
    std::iter::from_fn(|| sink.try_recv())
        .map(|e| (e.kind, serde_json::from_str(&e.json).unwrap()))
        .collect()
}

fn m(id: i64, ts: i64, body: &str) -> Json {
    json!({"id": id, "room": "a", "ts": ts, "body": body})
}

/// A client's rows: the ordered array of (key, row), changed as `docs/protocol.md` says.
#[derive(Clone, Debug, Default, PartialEq)]
struct Client {
    rows: Vec<(Json, Json)>,
    seq: u64,
    checksum: Json,
}

impl Client {
    fn take(&mut self, kind: EventKind, body: &Json) {
        match kind {
            EventKind::Snapshot => {
                let keys = body["keys"].as_array().unwrap();
                let rows = body["rows"].as_array().unwrap();
                self.rows = keys.iter().cloned().zip(rows.iter().cloned()).collect();
            }
            EventKind::Diff => {
                for c in body["changes"].as_array().unwrap() {
                    if let Some(at) = self.rows.iter().position(|(k, _)| *k == c["key"]) {
                        self.rows.remove(at);
                    }
                    if c["op"] != "remove" {
                        let at = c["index"].as_u64().map_or(self.rows.len(), |i| i as usize);
                        self.rows.insert(at, (c["key"].clone(), c["row"].clone()));
                    }
                }
            }
            EventKind::Error => panic!("error event {body}"),
        }
        self.seq = body["seq"].as_u64().unwrap();
        self.checksum = body["checksum"].clone();
    }

    /// The rows as a set (for unordered views).
    fn set(&self) -> BTreeMap<String, Json> {
        self.rows
            .iter()
            .map(|(k, r)| (k.to_string(), r.clone()))
            .collect()
    }
}

/// Past every window: flushing at it closes them all.
fn later() -> Instant {
    Instant::now() + Duration::from_millis(u64::from(sluice_live::COALESCE_MS_MAX) + 1)
}

#[test]
fn a_hot_row_changed_ten_times_is_one_change_and_added_then_removed_is_nothing() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    put(&mut db, &mut live, &[m(1, 10, "x"), m(2, 20, "y")]);
    let sql = "SELECT * FROM msg WHERE room = $1";
    let plain = sub(&mut live, &db, sql, 0, None);
    let folded = sub(&mut live, &db, sql, 10, None);
    let (mut p, mut f) = (Client::default(), Client::default());
    for (k, b) in drain(&plain) {
        p.take(k, &b);
    }
    for (k, b) in drain(&folded) {
        f.take(k, &b);
    }
    assert_eq!(p, f);

    let mut last = 0;
    for i in 0..10 {
        last = put(&mut db, &mut live, &[m(1, 100 + i, &format!("v{i}"))]);
    }
    put(&mut db, &mut live, &[m(3, 30, "new")]);
    last = last.max(del(&mut db, &mut live, 3));
    // Another room: not this view's.
    put(
        &mut db,
        &mut live,
        &[json!({"id": 9, "room": "b", "ts": 1, "body": "z"})],
    );
    let plain_diffs = drain(&plain);
    assert_eq!(plain_diffs.len(), 12);
    for (k, b) in &plain_diffs {
        p.take(*k, b);
    }

    // Before the window is due: nothing, and the thread learns when it is due.
    let due = live.flush_folds(Instant::now());
    assert!(due.is_some_and(|d| d <= Instant::now() + Duration::from_millis(10)));
    assert!(folded.try_recv().is_none());
    assert_eq!(live.flush_folds(later()), None);
    let got = drain(&folded);
    assert_eq!(got.len(), 1, "one diff per window: {got:?}");
    let (kind, diff) = &got[0];
    assert_eq!(*kind, EventKind::Diff);
    assert_eq!(
        diff["changes"],
        json!([{"op": "change", "key": 1, "row": {"id": 1, "room": "a", "ts": 109, "body": "v9"}}])
    );
    assert_eq!(
        diff["seq"],
        json!(last),
        "labelled with the window's last seq"
    );
    f.take(*kind, diff);
    assert_eq!(f.set(), p.set());
    assert_eq!(f.checksum, p.checksum, "the checksum at the last seq");
    let stats = live.stats();
    assert_eq!((stats.folds_sent, stats.diffs_folded), (1, 12));

    // A window whose commits cancel out sends nothing.
    put(&mut db, &mut live, &[m(4, 40, "brief")]);
    del(&mut db, &mut live, 4);
    live.flush_folds(later());
    assert!(folded.try_recv().is_none());
}

#[test]
fn a_folded_ordered_window_applies_in_order_and_resumes_exactly() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    let rows: Vec<Json> = (1..=20).map(|i| m(i, i * 10, "r")).collect();
    put(&mut db, &mut live, &rows);
    let mut present: std::collections::BTreeSet<i64> = (1..=20).collect();
    for sql in [
        "SELECT id, ts FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 5",
        "SELECT id, ts, body FROM msg WHERE room = $1 ORDER BY ts",
        "SELECT id, ts FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 4 OFFSET 3",
    ] {
        let plain = sub(&mut live, &db, sql, 0, None);
        let folded = sub(&mut live, &db, sql, 50, None);
        let (mut p, mut f) = (Client::default(), Client::default());
        let mut plain_log: Vec<(EventKind, Json)> = Vec::new();
        for (k, b) in drain(&plain) {
            p.take(k, &b);
        }
        for (k, b) in drain(&folded) {
            f.take(k, &b);
        }
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        let mut below = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut folded_seqs = Vec::new();
        for round in 0..40 {
            // A burst of moves, inserts and deletes, then the window closes.
            for _ in 0..1 + below(6) {
                let id = 1 + below(30) as i64;
                if below(4) == 0 && present.contains(&id) {
                    del(&mut db, &mut live, id);
                    present.remove(&id);
                } else {
                    present.insert(id);
                    let ts = below(400) as i64;
                    put(&mut db, &mut live, &[m(id, ts, &format!("b{round}"))]);
                }
            }
            for (k, b) in drain(&plain) {
                p.take(k, &b);
                plain_log.push((k, b));
            }
            live.flush_folds(later());
            for (k, b) in drain(&folded) {
                assert_eq!(k, EventKind::Diff);
                f.take(k, &b);
                folded_seqs.push(f.seq);
                // At every seq the folded subscriber reports, it holds what the plain one
                // held at that seq (which is the plain one's latest state).
                assert_eq!(f.seq, p.seq, "{sql}");
                assert_eq!(f.rows, p.rows, "{sql}");
                assert_eq!(f.checksum, p.checksum, "{sql}");
            }
        }
        // And what a one-shot query says.
        let plan = sluice_query::prepare(sql, &db).unwrap();
        let result = plan
            .execute(&db, &Params::from_json(Some(&json!(["a"]))).unwrap())
            .unwrap();
        let ids: Vec<Json> = result.rows.iter().map(|r| r[0].to_json()).collect();
        let mine: Vec<Json> = f.rows.iter().map(|(_, r)| r["id"].clone()).collect();
        assert_eq!(mine, ids, "{sql}");

        // Resume from a folded seq: exactly the plain diffs after it, no snapshot.
        assert!(folded_seqs.len() >= 10, "{sql}: {folded_seqs:?}");
        let since = folded_seqs[folded_seqs.len() - 3];
        let resumed = sub(&mut live, &db, sql, 50, Some(since));
        let got = drain(&resumed);
        let want: Vec<&(EventKind, Json)> = plain_log
            .iter()
            .filter(|(_, b)| b["seq"].as_u64().unwrap() > since)
            .collect();
        assert!(!want.is_empty());
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "{sql}");
    }
}
