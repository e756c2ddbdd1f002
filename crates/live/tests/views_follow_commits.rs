//! Hand-written cases for the live engine: each shape's snapshot, diffs with positions,
//! sharing, resume and reset, driven through the real `Db` transaction API.

use std::sync::Arc;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_live::{Event, EventKind, Live, Sink, Subscribe};
use sluice_query::Params;

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    ddl(&mut db, "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT, ts INTEGER, body TEXT); CREATE INDEX msg_room ON msg (room);");
    db
}

/// Applies DDL to `db`; returns its commit.
fn ddl(db: &mut Db, sql: &str) -> Arc<sluice_engine::Commit> {
    let changes = sluice_sql::parse_ddl(sql)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, sql.into()).unwrap().unwrap()
}

fn put(db: &mut Db, live: &mut Live, rows: &[Json]) {
    let mut tx = db.transaction();
    for r in rows {
        tx.upsert("msg", r.as_object().unwrap(), None).unwrap();
    }
    let commit = tx.commit().unwrap();
    live.apply(&commit, || &*db);
}

fn del(db: &mut Db, live: &mut Live, id: i64) {
    let mut tx = db.transaction();
    tx.delete("msg", &json!(id), None).unwrap();
    let commit = tx.commit().unwrap();
    live.apply(&commit, || &*db);
}

fn sub(live: &mut Live, db: &Db, sql: &str, params: Json, since: Option<u64>) -> Arc<Sink> {
    let sink = Sink::new(live.limits());
    live.subscribe(
        db,
        &Subscribe {
            sql: sql.into(),
            params: Params::from_json(Some(&params)).unwrap(),
            since,
            claims: None,
        },
        sink.clone(),
    )
    .unwrap();
    sink
}

fn next(sink: &Sink) -> (EventKind, Json) {
    let e: Arc<Event> = sink.try_recv().expect("an event");
    (e.kind, serde_json::from_str(&e.json).unwrap())
}

fn m(id: i64, room: &str, ts: i64) -> Json {
    json!({"id": id, "room": room, "ts": ts, "body": format!("m{id}")})
}

#[test]
fn top_k_window_reports_positions_and_refills() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    for i in 1..=5 {
        put(&mut db, &mut live, &[m(i, "a", i * 10)]);
    }
    let sql = "SELECT id, ts FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 3";
    let s = sub(&mut live, &db, sql, json!(["a"]), None);
    let (kind, snap) = next(&s);
    assert_eq!(kind, EventKind::Snapshot);
    assert_eq!(snap["keys"], json!([5, 4, 3]));
    assert_eq!(live.operator_of(sql), Some("filter"));

    // A newer message enters at the top; the oldest of the window leaves.
    put(&mut db, &mut live, &[m(6, "a", 60)]);
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "remove", "key": 3, "index": 2}, {"op": "add", "key": 6, "row": {"id": 6, "ts": 60}, "index": 0}])
    );
    // Another room: nothing.
    put(&mut db, &mut live, &[m(7, "b", 70)]);
    assert!(s.try_recv().is_none());
    // Deleting the top refills from below.
    del(&mut db, &mut live, 6);
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "remove", "key": 6, "index": 0}, {"op": "add", "key": 3, "row": {"id": 3, "ts": 30}, "index": 2}])
    );
    // Moving a row from room b into room a reaches the view through the routing index.
    put(&mut db, &mut live, &[m(7, "a", 45)]);
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "remove", "key": 3, "index": 2}, {"op": "add", "key": 7, "row": {"id": 7, "ts": 45}, "index": 1}])
    );
    // And out again.
    put(&mut db, &mut live, &[m(7, "b", 45)]);
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"][0],
        json!({"op": "remove", "key": 7, "index": 1})
    );
}

/// Applies a diff's changes to the keys a client shows, as `docs/protocol.md` says.
fn apply_keys(keys: &mut Vec<i64>, diff: &Json) {
    for c in diff["changes"].as_array().unwrap() {
        let key = c["key"].as_i64().unwrap();
        if let Some(at) = keys.iter().position(|k| *k == key) {
            keys.remove(at);
        }
        if c["op"] != "remove" {
            keys.insert(c["index"].as_u64().unwrap() as usize, key);
        }
    }
}

#[test]
fn top_k_keeps_its_window_plus_spare_rows_and_refills_from_the_table() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits {
        top_k_spare_rows: 2,
        ..sluice_live::Limits::default()
    });
    let rows: Vec<Json> = (1..=100).map(|i| m(i, "a", i * 10)).collect();
    put(&mut db, &mut live, &rows);
    let sql = "SELECT id, ts FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 3";
    let s = sub(&mut live, &db, sql, json!(["a"]), None);
    let (_, snap) = next(&s);
    let mut shown: Vec<i64> = serde_json::from_value(snap["keys"].clone()).unwrap();
    assert_eq!(shown, vec![100, 99, 98]);
    // The window and two spare rows, not the room's hundred.
    assert_eq!(live.view_rows_of(sql), Some(5));

    // Newer messages push into the top; the kept rows are trimmed back as they grow.
    let mut present: Vec<i64> = (1..=100).collect();
    for i in 101..=110 {
        put(&mut db, &mut live, &[m(i, "a", i * 10)]);
        present.push(i);
        apply_keys(&mut shown, &next(&s).1);
        assert_eq!(shown, vec![i, i - 1, i - 2]);
        assert!(live.view_rows_of(sql).unwrap() <= 3 + 2 + 2);
    }
    // Deleting from the top runs through the spare rows, then reads the room again.
    for _ in 0..30 {
        let top = present.pop().unwrap();
        del(&mut db, &mut live, top);
        apply_keys(&mut shown, &next(&s).1);
        let n = present.len();
        assert_eq!(
            shown,
            present[n - 3..].iter().rev().copied().collect::<Vec<_>>()
        );
        assert!(live.view_rows_of(sql).unwrap() <= 3 + 2 + 2);
    }
    assert!(live.stats().refills >= 5, "{:?}", live.stats());
    // A row changed below the kept rows moves into the window when it sorts first.
    let low = present[0];
    put(&mut db, &mut live, &[m(low, "a", 100_000)]);
    apply_keys(&mut shown, &next(&s).1);
    let n = present.len();
    assert_eq!(shown, vec![low, present[n - 1], present[n - 2]]);
    // Down to fewer rows than the window: the view holds them all. (Deleting a row the
    // window does not show sends nothing.)
    for id in present.clone() {
        if id != low {
            del(&mut db, &mut live, id);
            while let Some(e) = s.try_recv() {
                apply_keys(&mut shown, &serde_json::from_str(&e.json).unwrap());
            }
        }
    }
    assert_eq!(shown, vec![low]);
    assert_eq!(live.view_rows_of(sql), Some(1));
}

#[test]
fn aggregates_update_their_groups_only() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    put(
        &mut db,
        &mut live,
        &[m(1, "a", 1), m(2, "a", 5), m(3, "b", 7)],
    );
    let sql =
        "SELECT room, COUNT(*) AS n, MAX(ts) AS last FROM msg GROUP BY room HAVING COUNT(*) > 1";
    let s = sub(&mut live, &db, sql, Json::Null, None);
    let (_, snap) = next(&s);
    assert_eq!(snap["rows"], json!([{"room": "a", "n": 2, "last": 5}]));
    assert_eq!(live.operator_of(sql), Some("aggregate"));
    put(&mut db, &mut live, &[m(4, "b", 2)]);
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "add", "key": "b", "row": {"room": "b", "n": 2, "last": 7}}])
    );
    del(&mut db, &mut live, 2);
    let (_, d) = next(&s);
    assert_eq!(d["changes"], json!([{"op": "remove", "key": "a"}]));
}

#[test]
fn identical_queries_share_a_view_and_resume_from_history() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    let sql = "SELECT * FROM msg WHERE room = 'a'";
    let a = sub(&mut live, &db, sql, Json::Null, None);
    let b = sub(
        &mut live,
        &db,
        "select *   from msg where room = 'a'",
        Json::Null,
        None,
    );
    assert_eq!(live.stats().views, 1);
    next(&a);
    next(&b);
    put(&mut db, &mut live, &[m(1, "a", 1)]);
    put(&mut db, &mut live, &[m(2, "a", 2)]);
    let (_, d1) = next(&a);
    let (_, d2) = next(&a);
    assert_eq!(next(&b).1, d1);
    // A client that saw d1 resumes with exactly d2.
    let c = sub(
        &mut live,
        &db,
        sql,
        Json::Null,
        Some(d1["seq"].as_u64().unwrap()),
    );
    assert_eq!(next(&c).1, d2);
    assert!(c.try_recv().is_none());
    // A client from before the view existed gets a reset snapshot.
    let d = sub(&mut live, &db, sql, Json::Null, Some(0));
    let (kind, snap) = next(&d);
    assert_eq!(kind, EventKind::Snapshot);
    assert_eq!(snap["reset"], json!(true));
    assert_eq!(snap["rows"].as_array().unwrap().len(), 2);
    assert_eq!(snap["checksum"], d2["checksum"]);
}

#[test]
fn idle_views_stay_warm_for_the_ttl_then_go() {
    let mut db = db();
    let limits = sluice_live::Limits {
        idle_ttl: std::time::Duration::from_millis(50),
        ..Default::default()
    };
    let mut live = Live::new(limits);
    let sql = "SELECT * FROM msg WHERE room = 'a'";
    let sink = Sink::new(live.limits());
    let sub_id = live
        .subscribe(
            &db,
            &Subscribe {
                sql: sql.into(),
                params: Params::None,
                since: None,
                claims: None,
            },
            sink.clone(),
        )
        .unwrap();
    next(&sink);
    put(&mut db, &mut live, &[m(1, "a", 1)]);
    let (_, d) = next(&sink);
    live.unsubscribe(sub_id);
    assert!(sink.is_closed());
    // Still warm: it follows commits and a returning client resumes without a snapshot.
    assert_eq!(live.expire(std::time::Instant::now(), false), 0);
    put(&mut db, &mut live, &[m(2, "a", 2)]);
    let back = Sink::new(live.limits());
    let back_id = live
        .subscribe(
            &db,
            &Subscribe {
                sql: sql.into(),
                params: Params::None,
                since: d["seq"].as_u64(),
                claims: None,
            },
            back.clone(),
        )
        .unwrap();
    let (kind, missed) = next(&back);
    assert_eq!(kind, EventKind::Diff);
    assert_eq!(missed["changes"][0]["key"], json!(2));
    let later = std::time::Instant::now() + std::time::Duration::from_secs(1);
    assert_eq!(
        live.expire(later, false),
        0,
        "a view with a subscriber stays"
    );
    // Idle past the TTL: dropped; the next subscriber from that seq gets a reset snapshot.
    live.unsubscribe(back_id);
    let later = std::time::Instant::now() + std::time::Duration::from_secs(1);
    assert_eq!(live.expire(later, false), 1);
    assert_eq!(live.stats().views, 0);
    let fresh = sub(&mut live, &db, sql, Json::Null, missed["seq"].as_u64());
    let (kind, snap) = next(&fresh);
    assert_eq!(kind, EventKind::Snapshot);
    assert_eq!(snap["reset"], json!(true));
    assert_eq!(snap["keys"], json!([1, 2]));
}

#[test]
fn limits_are_named_in_their_errors() {
    let mut db = db();
    for i in 1..=20 {
        let mut tx = db.transaction();
        tx.upsert("msg", m(i, "a", i).as_object().unwrap(), None)
            .unwrap();
        tx.commit().unwrap();
    }
    let limits = sluice_live::Limits {
        view_rows_max: 10,
        view_tables_max: 2,
        views_max: 2,
        ..Default::default()
    };
    let mut live = Live::new(limits);
    let try_sub = |live: &mut Live, sql: &str| {
        live.subscribe(
            &db,
            &Subscribe {
                sql: sql.into(),
                params: Params::None,
                since: None,
                claims: None,
            },
            Sink::new(&sluice_live::Limits::default()),
        )
    };
    let err = try_sub(&mut live, "SELECT * FROM msg").unwrap_err();
    assert!(err.to_string().contains("view_rows_max"), "{err}");
    let err = try_sub(
        &mut live,
        "SELECT a.id FROM msg a JOIN msg b ON a.id = b.id JOIN msg c ON b.id = c.id",
    )
    .unwrap_err();
    assert!(err.to_string().contains("view_tables_max"), "{err}");
    try_sub(&mut live, "SELECT * FROM msg WHERE id = 1").unwrap();
    try_sub(&mut live, "SELECT * FROM msg WHERE id = 2").unwrap();
    let err = try_sub(&mut live, "SELECT * FROM msg WHERE id = 3").unwrap_err();
    assert!(err.to_string().contains("views_max"), "{err}");
    let err = try_sub(&mut live, "SELECT DISTINCT room FROM msg").unwrap_err();
    assert_eq!(sluice_live::error_code(&err), "unsupported");
    assert!(err.to_string().to_lowercase().contains("distinct"), "{err}");
}

#[test]
fn a_view_that_outgrows_its_limit_ends_with_an_error() {
    let mut db = db();
    let limits = sluice_live::Limits {
        view_rows_max: 3,
        ..Default::default()
    };
    let mut live = Live::new(limits);
    let s = sub(&mut live, &db, "SELECT * FROM msg", Json::Null, None);
    next(&s);
    for i in 1..=3 {
        put(&mut db, &mut live, &[m(i, "a", i)]);
        assert_eq!(next(&s).0, EventKind::Diff);
    }
    put(&mut db, &mut live, &[m(4, "a", 4)]);
    let (kind, e) = next(&s);
    assert_eq!(kind, EventKind::Error);
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("view_rows_max"));
    assert!(s.try_recv().is_none() && s.is_closed());
    assert_eq!(live.stats().views, 0);
}

#[test]
fn ddl_on_a_read_table_resets_or_ends_the_view() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    put(&mut db, &mut live, &[m(1, "a", 1)]);
    let s = sub(&mut live, &db, "SELECT * FROM msg", Json::Null, None);
    next(&s);
    let commit = ddl(&mut db, "ALTER TABLE msg ADD COLUMN likes INTEGER");
    live.apply(&commit, || &db);
    let (kind, snap) = next(&s);
    assert_eq!(kind, EventKind::Snapshot);
    assert_eq!(snap["reset"], json!(true));
    assert_eq!(
        snap["columns"],
        json!(["id", "room", "ts", "body", "likes"])
    );
    let commit = ddl(&mut db, "DROP TABLE msg");
    live.apply(&commit, || &db);
    let (kind, e) = next(&s);
    assert_eq!(kind, EventKind::Error);
    assert_eq!(e["error"]["code"], json!("not_found"), "{e}");
}

#[test]
fn joins_follow_changes_on_either_side_through_their_anchors() {
    let mut db = db();
    ddl(&mut db, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); ALTER TABLE msg ADD COLUMN author INTEGER");
    let mut live = Live::new(sluice_live::Limits::default());
    let write = |db: &mut Db, live: &mut Live, table: &str, row: Json| {
        let mut tx = db.transaction();
        tx.upsert(table, row.as_object().unwrap(), None).unwrap();
        let commit = tx.commit().unwrap();
        live.apply(&commit, || &*db);
    };
    write(&mut db, &mut live, "users", json!({"id": 1, "name": "ann"}));
    write(
        &mut db,
        &mut live,
        "msg",
        json!({"id": 10, "room": "a", "ts": 1, "author": 1}),
    );
    write(
        &mut db,
        &mut live,
        "msg",
        json!({"id": 11, "room": "a", "ts": 2, "author": 2}),
    );
    let sql = "SELECT m.id, u.name FROM msg m LEFT JOIN users u ON m.author = u.id ORDER BY m.id";
    let s = sub(&mut live, &db, sql, Json::Null, None);
    assert_eq!(live.operator_of(sql), Some("join"));
    let (_, snap) = next(&s);
    assert_eq!(snap["keys"], json!([[10, 1], [11, null]]));
    // A user appears: the message that pointed at nobody now has a name.
    write(&mut db, &mut live, "users", json!({"id": 2, "name": "bob"}));
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "remove", "key": [11, null], "index": 1},
               {"op": "add", "key": [11, 2], "row": {"id": 11, "name": "bob"}, "index": 1}])
    );
    // Renaming a user changes only the rows that join it.
    write(
        &mut db,
        &mut live,
        "users",
        json!({"id": 1, "name": "ann2"}),
    );
    let (_, d) = next(&s);
    assert_eq!(
        d["changes"],
        json!([{"op": "change", "key": [10, 1], "row": {"id": 10, "name": "ann2"}, "index": 0}])
    );
    // A user nobody points at: no diff.
    write(&mut db, &mut live, "users", json!({"id": 3, "name": "cy"}));
    assert!(s.try_recv().is_none());
}

#[test]
fn a_view_comparing_across_types_is_routed_by_the_converted_value() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    // `ts` is INTEGER: the text "30" (a literal or a text parameter) compares as 30;
    // `room` is TEXT: the number 7 compares as the text '7'.
    let by_literal = "SELECT id FROM msg WHERE ts = '30'";
    let by_param = "SELECT id FROM msg WHERE ts = $1";
    let by_number = "SELECT id FROM msg WHERE room = 7";
    let by_is = "SELECT id FROM msg WHERE ts IS '30'";
    let sinks: Vec<Arc<Sink>> = [
        (by_literal, json!(null)),
        (by_param, json!(["30"])),
        (by_number, json!(null)),
        (by_is, json!(null)),
    ]
    .into_iter()
    .map(|(sql, p)| {
        let s = sub(&mut live, &db, sql, p, None);
        let (kind, snap) = next(&s);
        assert_eq!(
            (kind, &snap["keys"]),
            (EventKind::Snapshot, &json!([])),
            "{sql}"
        );
        s
    })
    .collect();
    assert_eq!(live.operator_of(by_param), Some("filter"));
    put(&mut db, &mut live, &[m(1, "7", 30)]);
    for (s, sql) in sinks.iter().zip([by_literal, by_param, by_number, by_is]) {
        let (_, d) = next(s);
        assert_eq!(d["changes"][0]["key"], json!(1), "{sql}: {d}");
    }
    // And out again when the value changes.
    put(&mut db, &mut live, &[m(1, "8", 31)]);
    for (s, sql) in sinks.iter().zip([by_literal, by_param, by_number, by_is]) {
        let (_, d) = next(s);
        assert_eq!(d["changes"][0]["op"], json!("remove"), "{sql}: {d}");
    }
}
