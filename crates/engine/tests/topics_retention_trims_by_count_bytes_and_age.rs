//! Retention as docs/api.md "Topics" documents it, through the public engine API with
//! explicit append times: at most `retain_records` records, at most `retain_bytes` bytes, and
//! (with `retain_secs` > 0) nothing older than that; the oldest go first and the newest record
//! always stays. A read below the oldest record kept answers the horizon.

use serde_json::json;
use sluice_engine::{Changelog, Db, ErrorCode, Limits, Retention, TagFilter, TopicConfig};

const SEC: i64 = 1_000_000;
const T0: i64 = 1_700_000_000 * SEC;

fn db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

fn config(records: u64, bytes: u64, secs: u64) -> TopicConfig {
    TopicConfig {
        retain_records: records,
        retain_bytes: bytes,
        retain_secs: secs,
    }
}

/// Appends one record per `(tags, data, ts)` in one transaction each; returns the offsets.
fn append_each(
    db: &mut Db,
    topic: &str,
    records: &[(&[&str], serde_json::Value, i64)],
) -> Vec<u64> {
    records
        .iter()
        .map(|(tags, data, ts)| {
            let mut tx = db.transaction();
            let o = tx
                .append(
                    topic,
                    tags.iter().map(|t| t.to_string()).collect(),
                    data,
                    *ts,
                )
                .expect("append");
            tx.commit().expect("a commit");
            o
        })
        .collect()
}

/// (first, next, offsets kept) of `topic`.
fn kept(db: &Db, topic: &str) -> (u64, u64, Vec<u64>) {
    let t = &db.topics[topic];
    (t.first(), t.next(), t.records().map(|r| r.offset).collect())
}

fn tag_offsets(db: &Db, topic: &str, tag: &str) -> Vec<u64> {
    db.topics[topic]
        .tags()
        .lookup_exact(tag)
        .map(|l| l.iter().copied().collect())
        .unwrap_or_default()
}

#[test]
fn retention_by_count_keeps_the_newest_records() {
    let mut db = db();
    db.put_topic("c", Some(config(3, 1 << 20, 0))).unwrap();
    let recs: Vec<_> = (0..7).map(|i| (&["k"][..], json!(i), T0 + i)).collect();
    assert_eq!(append_each(&mut db, "c", &recs), (0..7).collect::<Vec<_>>());
    assert_eq!(kept(&db, "c"), (4, 7, vec![4, 5, 6]));
    assert_eq!(tag_offsets(&db, "c", "k"), vec![4, 5, 6]);
    // One commit of many records trims to the newest `retain_records` at once.
    let mut tx = db.transaction();
    for i in 0..5 {
        tx.append("c", vec![], &json!(i), T0 + 10).unwrap();
    }
    tx.commit().unwrap();
    assert_eq!(kept(&db, "c"), (9, 12, vec![9, 10, 11]));
    // A read below the oldest record kept answers the horizon; at it, the records.
    let t = &db.topics["c"];
    assert_eq!(t.read(8, 10, &TagFilter::all()).err(), Some(9));
    assert_eq!(t.read(0, 10, &TagFilter::all()).err(), Some(9));
    let (rs, next) = t.read(9, 10, &TagFilter::all()).unwrap();
    assert_eq!(
        rs.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![9, 10, 11]
    );
    assert_eq!(next, 12);
    // Lowering retain_records trims at once; the topic keeps at least the newest record.
    db.put_topic("c", Some(config(1, 1 << 20, 0))).unwrap();
    assert_eq!(kept(&db, "c"), (11, 12, vec![11]));
    assert!(tag_offsets(&db, "c", "k").is_empty());
}

#[test]
fn retention_by_bytes_counts_data_and_tags() {
    let mut db = db();
    // Find what one record of this shape costs, then allow exactly three of them.
    db.put_topic("probe", None).unwrap();
    append_each(&mut db, "probe", &[(&["tag:1"], json!("0123456789"), T0)]);
    let per = db.topics["probe"].bytes();
    assert!(
        per >= ("tag:1".len() + "\"0123456789\"".len()) as u64,
        "a record's bytes count its data and tags: {per}"
    );
    db.put_topic("b", Some(config(1000, 3 * per, 0))).unwrap();
    let recs: Vec<_> = (0..6)
        .map(|i| (&["tag:1"][..], json!("0123456789"), T0 + i))
        .collect();
    append_each(&mut db, "b", &recs);
    assert_eq!(kept(&db, "b"), (3, 6, vec![3, 4, 5]));
    assert_eq!(db.topics["b"].bytes(), 3 * per);
    // One byte less: only two fit.
    db.put_topic("b", Some(config(1000, 3 * per - 1, 0)))
        .unwrap();
    assert_eq!(kept(&db, "b"), (4, 6, vec![4, 5]));
    // A record bigger than retain_bytes alone: it is kept (the newest always stays) and
    // pushes every older record out.
    let big = json!("x".repeat(4 * per as usize));
    append_each(&mut db, "b", &[(&[], big, T0 + 10)]);
    assert_eq!(kept(&db, "b"), (6, 7, vec![6]));
    assert!(db.topics["b"].tags().is_empty());
}

#[test]
fn retention_by_age_drops_records_older_than_retain_secs() {
    let mut db = db();
    db.put_topic("a", Some(config(1000, 1 << 20, 10))).unwrap();
    let recs = [
        (&["old"][..], json!(0), T0),
        (&["old"][..], json!(1), T0 + 5 * SEC),
        (&["mid"][..], json!(2), T0 + 9 * SEC),
    ];
    append_each(&mut db, "a", &recs);
    assert_eq!(
        kept(&db, "a"),
        (0, 3, vec![0, 1, 2]),
        "nothing is 10 s old yet"
    );
    // An append 12 s after the first: records older than 2 s after T0 go.
    append_each(&mut db, "a", &[(&["new"], json!(3), T0 + 12 * SEC)]);
    assert_eq!(kept(&db, "a"), (1, 4, vec![1, 2, 3]));
    assert_eq!(tag_offsets(&db, "a", "old"), vec![1]);
    // Records exactly retain_secs old stay (older than, not as old as).
    append_each(&mut db, "a", &[(&[], json!(4), T0 + 15 * SEC)]);
    assert_eq!(kept(&db, "a"), (1, 5, vec![1, 2, 3, 4]));
    // The writer's periodic age check, with no append: by the clock alone.
    assert_eq!(db.trim_topics(T0 + 20 * SEC), 2);
    assert_eq!(kept(&db, "a"), (3, 5, vec![3, 4]));
    assert!(tag_offsets(&db, "a", "old").is_empty());
    assert!(tag_offsets(&db, "a", "mid").is_empty());
    // Long after: the newest record always stays.
    assert_eq!(db.trim_topics(T0 + 1_000 * SEC), 1);
    assert_eq!(kept(&db, "a"), (4, 5, vec![4]));
    // A topic without an age limit keeps old records.
    db.put_topic("forever", Some(config(1000, 1 << 20, 0)))
        .unwrap();
    append_each(
        &mut db,
        "forever",
        &[(&[], json!(0), T0), (&[], json!(1), T0 + 1)],
    );
    assert_eq!(db.trim_topics(T0 + 1_000_000 * SEC), 0);
    assert_eq!(kept(&db, "forever"), (0, 2, vec![0, 1]));
}

#[test]
fn append_time_never_goes_back_so_age_retention_stays_a_prefix() {
    let mut db = db();
    db.put_topic("a", Some(config(1000, 1 << 20, 10))).unwrap();
    // The caller's clock goes back: the record takes the topic's last time instead.
    append_each(
        &mut db,
        "a",
        &[
            (&[], json!(0), T0 + 20 * SEC),
            (&[], json!(1), T0),
            (&[], json!(2), T0 + 21 * SEC),
        ],
    );
    let ts: Vec<i64> = db.topics["a"].records().map(|r| r.ts_us).collect();
    assert_eq!(ts, vec![T0 + 20 * SEC, T0 + 20 * SEC, T0 + 21 * SEC]);
    assert_eq!(db.trim_topics(T0 + 30 * SEC + 1), 2);
    assert_eq!(kept(&db, "a"), (2, 3, vec![2]));
}

#[test]
fn retention_settings_are_checked_and_name_their_limit() {
    let mut db = Db::new(
        Limits {
            topic_retain_bytes: 1000,
            ..Limits::default()
        },
        Changelog::new(Retention::default()),
    );
    let e = db.put_topic("t", Some(config(0, 100, 0))).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    let e = db.put_topic("t", Some(config(10, 1001, 0))).unwrap_err();
    assert_eq!(e.code, ErrorCode::Limit, "{e}");
    assert!(e.message.contains("--topic-retain-bytes"), "{e}");
    assert!(db.topics.is_empty());
    assert_eq!(db.seq, 0, "a refused topic consumes no seq");
    // Created without a config: the defaults of the limits.
    db.put_topic("t", None).unwrap().expect("created");
    let c = db.topics["t"].config();
    assert_eq!((c.retain_bytes, c.retain_secs), (1000, 0));
    assert!(
        db.put_topic("t", None).unwrap().is_none(),
        "no change, no seq"
    );
    assert!(
        db.put_topic("t", Some(c)).unwrap().is_none(),
        "same config, no seq"
    );
}
