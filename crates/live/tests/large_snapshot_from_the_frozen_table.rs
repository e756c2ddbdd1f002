//! A large snapshot of a view built just now is encoded from the frozen version of the
//! table the view was built from, not from a copy of the view's rows: it must hold exactly
//! the rows at the view's seq — every row the `WHERE` takes, projected, none twice — however
//! the table changes while the chunks are encoded, with the checksum of those rows; and a
//! later subscriber of the same view (whose snapshot is copied from the view) gets the
//! same rows at its own seq.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention, Value};
use sluice_live::checksum::{checksum, render};
use sluice_live::chunked::Cursor;
use sluice_live::{Event, Live, Sink, Subscribe};
use sluice_query::Params;

const ROWS: i64 = 30_000;

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let sql = "CREATE TABLE msg (id INTEGER PRIMARY KEY, room TEXT, ts INTEGER, body TEXT)";
    let changes = sluice_sql::parse_ddl(sql)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, sql.into()).unwrap().unwrap();
    db
}

fn row(id: i64, gen: i64) -> Json {
    json!({"id": id, "room": format!("r{}", id % 7), "ts": id * 3 + gen, "body": format!("m{id} \"g{gen}\"")})
}

/// Upserts `rows` (and deletes `gone`) in commits of 5 000, each handed to `live`.
fn write(db: &mut Db, live: &mut Live, rows: &[Json], gone: &[i64]) {
    for part in rows.chunks(5_000) {
        let mut tx = db.transaction();
        for r in part {
            tx.upsert("msg", r.as_object().unwrap(), None).unwrap();
        }
        let commit = tx.commit().unwrap();
        live.apply(&commit, || &*db);
    }
    if !gone.is_empty() {
        let mut tx = db.transaction();
        for id in gone {
            tx.delete("msg", &json!(id), None).unwrap();
        }
        let commit = tx.commit().unwrap();
        live.apply(&commit, || &*db);
    }
}

fn sub(live: &mut Live, db: &Db, sql: &str) -> Arc<Sink> {
    let sink = Sink::new(live.limits());
    let req = Subscribe {
        sql: sql.into(),
        params: Params::from_json(None).unwrap(),
        since: None,
        claims: None,
    };
    live.subscribe(db, &req, sink.clone()).unwrap();
    sink
}

/// Every chunk of the snapshot in `sink`, in both encodings: (seq, keys, rows, checksum,
/// chunks) from the JSON chunks, checked against the MessagePack ones.
fn snapshot(sink: &Sink, source: &str) -> (u64, Vec<Json>, Vec<Json>, Json, usize) {
    let e: Arc<Event> = sink.try_recv().expect("a snapshot");
    let s = e.chunked.as_ref().expect("a chunked snapshot").clone();
    assert!(
        format!("{s:?}").contains(&format!("source: {source}(")),
        "encoded from its {source}: {s:?}"
    );
    let (mut keys, mut rows, mut sum, mut n) = (Vec::new(), Vec::new(), Json::Null, 0);
    let mut cursor = Cursor::default();
    let qid = json!("q");
    while !cursor.done() {
        let c: Json = serde_json::from_str(&s.json_chunk(&mut cursor, Some(&qid))).unwrap();
        assert_eq!(c["seq"], e.seq);
        assert_eq!(c.get("more").is_some(), !cursor.done());
        keys.extend(c["keys"].as_array().unwrap().iter().cloned());
        rows.extend(c["rows"].as_array().unwrap().iter().cloned());
        if cursor.done() {
            sum = c["checksum"].clone();
        }
        n += 1;
    }
    // The MessagePack chunks are cut from the same rows (their content is checked
    // against the JSON chunks' in the unit tests): they end, each one a map.
    let mut cursor = Cursor::default();
    let mut mp_chunks = 0;
    while !cursor.done() {
        let bytes = s.msgpack_chunk(&mut cursor, &qid);
        assert!(matches!(bytes[0], 0x88 | 0x89), "a map of 8 or 9 fields");
        mp_chunks += 1;
        assert!(mp_chunks <= keys.len(), "the MessagePack chunks end");
    }
    (e.seq, keys, rows, sum, n)
}

/// What the view holds when the table holds `table`: (key, projected row) by key.
fn expected(table: &BTreeMap<i64, Json>, star: bool) -> BTreeMap<i64, Json> {
    table
        .iter()
        .filter(|(_, r)| star || r["ts"].as_i64().unwrap() % 3 != 1)
        .map(|(&id, r)| {
            let out = if star {
                r.clone()
            } else {
                json!({"id": r["id"], "body": r["body"]})
            };
            (id, out)
        })
        .collect()
}

fn check(got: &(u64, Vec<Json>, Vec<Json>, Json, usize), want: &BTreeMap<i64, Json>, star: bool) {
    let (_, keys, rows, sum, chunks) = got;
    assert!(*chunks >= 3, "{chunks} chunk(s)");
    assert_eq!(keys.len(), want.len(), "rows in the snapshot");
    let mut seen = BTreeMap::new();
    for (k, r) in keys.iter().zip(rows) {
        assert_eq!(k, &r["id"], "keys[i] is rows[i]'s key");
        assert!(
            seen.insert(k.as_i64().unwrap(), r.clone()).is_none(),
            "a key twice"
        );
    }
    assert!(
        &seen == want,
        "the snapshot's rows are the view's at its seq"
    );
    let values: Vec<Vec<Value>> = want
        .values()
        .map(|r| {
            let mut v = vec![Value::Integer(r["id"].as_i64().unwrap())];
            if star {
                v.push(Value::Text(r["room"].as_str().unwrap().into()));
                v.push(Value::Integer(r["ts"].as_i64().unwrap()));
            }
            v.push(Value::Text(r["body"].as_str().unwrap().into()));
            v
        })
        .collect();
    assert_eq!(sum, &json!(render(checksum(values.iter().map(|v| &v[..])))));
}

#[test]
fn a_new_views_chunked_snapshot_is_the_tables_rows_at_its_seq() {
    for (sql, star) in [
        ("SELECT * FROM msg", true),
        ("SELECT id, body FROM msg WHERE ts % 3 <> 1", false),
    ] {
        let mut db = db();
        let mut live = Live::new(sluice_live::Limits::default());
        let mut table: BTreeMap<i64, Json> = BTreeMap::new();
        let first: Vec<Json> = (1..=ROWS).map(|i| row(i, 0)).collect();
        for r in &first {
            table.insert(r["id"].as_i64().unwrap(), r.clone());
        }
        write(&mut db, &mut live, &first, &[]);
        let built = sub(&mut live, &db, sql);
        let at_build = expected(&table, star);
        // The table changes before a chunk is encoded: updates that move rows in and out
        // of the WHERE, deletes, inserts past the end.
        let later: Vec<Json> = (1..=ROWS / 2)
            .map(|i| row(i * 2, 1))
            .chain((ROWS + 1..ROWS + 3_000).map(|i| row(i, 0)))
            .collect();
        let gone: Vec<i64> = (1..ROWS).step_by(5).collect();
        write(&mut db, &mut live, &later, &gone);
        for r in &later {
            table.insert(r["id"].as_i64().unwrap(), r.clone());
        }
        for id in &gone {
            table.remove(id);
        }
        let got = snapshot(&built, "Table");
        check(&got, &at_build, star);
        // A subscriber joining the view now: its snapshot is the view's rows at the
        // view's (later) seq.
        let joined = sub(&mut live, &db, sql);
        let got_joined = snapshot(&joined, "Rows");
        assert!(got_joined.0 > got.0);
        check(&got_joined, &expected(&table, star), star);
    }
}

/// Polls `f` once.
fn poll_once<F: std::future::Future>(f: F) -> std::task::Poll<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.as_mut().poll(&mut cx)
}

/// A `SELECT *` view's snapshot streams before the view is built (the live thread answers
/// the subscribe first): every chunk but the last can be encoded at once, the last waits
/// for the build's checksum, and a commit the thread takes next finishes the build first,
/// so the view starts exactly at the snapshot's seq.
#[test]
fn a_streamed_snapshot_waits_for_the_builds_checksum_only_at_its_end() {
    let mut db = db();
    let mut live = Live::new(sluice_live::Limits::default());
    let mut table: BTreeMap<i64, Json> = BTreeMap::new();
    let first: Vec<Json> = (1..=ROWS).map(|i| row(i, 0)).collect();
    for r in &first {
        table.insert(r["id"].as_i64().unwrap(), r.clone());
    }
    write(&mut db, &mut live, &first, &[]);
    let sink = Sink::new(live.limits());
    let req = Subscribe {
        sql: "SELECT * FROM msg".into(),
        params: Params::from_json(None).unwrap(),
        since: None,
        claims: None,
    };
    live.subscribe_streaming(|| &db, &req, sink.clone())
        .unwrap();
    assert_eq!(live.stats().views, 1, "the pending view is counted");
    let e: Arc<Event> = sink.try_recv().expect("the snapshot, before the build");
    let s = e.chunked.as_ref().unwrap().clone();
    let qid = json!(1);
    let mut cursor = Cursor::default();
    let mut rows = 0;
    while let std::task::Poll::Ready(ready) = poll_once(s.ready(&cursor)) {
        assert!(ready);
        let c: Json = serde_json::from_str(&s.json_chunk(&mut cursor, Some(&qid))).unwrap();
        assert_eq!(c["more"], true, "no last chunk before the build");
        rows += c["rows"].as_array().unwrap().len();
    }
    assert!(
        rows > 0 && rows < ROWS as usize,
        "{rows} rows before the wait"
    );
    // The next commit: the live thread builds the pending view before applying it.
    let seq = e.seq;
    write(&mut db, &mut live, &[row(1, 9)], &[]);
    assert!(matches!(
        poll_once(s.ready(&cursor)),
        std::task::Poll::Ready(true)
    ));
    let mut sum = Json::Null;
    while !cursor.done() {
        let c: Json = serde_json::from_str(&s.json_chunk(&mut cursor, Some(&qid))).unwrap();
        rows += c["rows"].as_array().unwrap().len();
        sum = c["checksum"].clone();
    }
    assert_eq!(rows, ROWS as usize);
    let values: Vec<Vec<Value>> = table
        .values()
        .map(|r| {
            vec![
                Value::Integer(r["id"].as_i64().unwrap()),
                Value::Text(r["room"].as_str().unwrap().into()),
                Value::Integer(r["ts"].as_i64().unwrap()),
                Value::Text(r["body"].as_str().unwrap().into()),
            ]
        })
        .collect();
    assert_eq!(sum, json!(render(checksum(values.iter().map(|v| &v[..])))));
    // Then exactly the commit after the snapshot, as a diff.
    let d: Arc<Event> = sink.try_recv().expect("the diff after the snapshot");
    assert_eq!(d.seq, seq + 1);
    let d: Json = serde_json::from_str(&d.json).unwrap();
    assert_eq!(d["changes"][0]["op"], "change");
    assert_eq!(d["changes"][0]["key"], 1);
    assert!(sink.try_recv().is_none());
}
