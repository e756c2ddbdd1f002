//! Topic appends travel through the same bytes as row writes: a commit's records (and topic
//! DDL) decode and replay into the same topics, a snapshot of topics loads back exactly, and a
//! rolled-back transaction leaves no record behind.

use serde_json::json;
use sluice_engine::codec::{decode_commit, encode_commit, encode_snapshot, SnapshotLoader};
use sluice_engine::{Changelog, Db, Limits, Retention, TagFilter, TopicConfig};
use sluice_log::frame::{decode, Decoded};

fn db() -> Db {
    Db::new(Limits::default(), Changelog::new(Retention::default()))
}

/// (offset, ts, tags, data, seq) of one record.
type Kept = (u64, i64, Vec<String>, String, u64);

/// (name, first, next, records) of every topic.
fn topics(db: &Db) -> Vec<(String, u64, u64, Vec<Kept>)> {
    db.topics
        .iter()
        .map(|(name, t)| {
            let records = t
                .records()
                .map(|r| {
                    let tags = r.tags.iter().map(|s| s.to_string()).collect();
                    (r.offset, r.ts_us, tags, r.data.to_string(), r.seq)
                })
                .collect();
            (name.clone(), t.first(), t.next(), records)
        })
        .collect()
}

fn write_history(source: &mut Db, log: &mut Vec<Vec<u8>>) {
    let mut keep = |c: std::sync::Arc<sluice_engine::Commit>| {
        let mut out = Vec::new();
        encode_commit(&c, &mut out);
        log.push(out);
    };
    keep(source.put_topic("chat", None).unwrap().unwrap());
    let small = TopicConfig {
        retain_records: 3,
        retain_bytes: 1 << 20,
        retain_secs: 0,
    };
    keep(source.put_topic("small", Some(small)).unwrap().unwrap());
    keep(source.put_topic("gone", None).unwrap().unwrap());
    for i in 0..10i64 {
        let mut tx = source.transaction();
        tx.append(
            "chat",
            vec![format!("user:{}", i % 3), "room:1".into()],
            &json!({"i": i}),
            100 + i,
        )
        .unwrap();
        tx.append("small", vec![], &json!(i), 100 + i).unwrap();
        if i % 2 == 0 {
            tx.append("chat", vec![], &json!("second"), 50).unwrap();
        }
        keep(tx.commit().unwrap());
    }
    keep(source.drop_topic("gone").unwrap());
    // A rolled-back transaction leaves nothing.
    let before = topics(source);
    {
        let mut tx = source.transaction();
        tx.append("chat", vec!["x".into()], &json!(1), 1_000)
            .unwrap();
        tx.append("small", vec![], &json!(1), 1_000).unwrap();
    }
    assert_eq!(
        topics(source),
        before,
        "a dropped transaction appends nothing"
    );
}

#[test]
fn appends_replay_from_their_log_records_to_the_same_topics() {
    let mut source = db();
    let mut log = Vec::new();
    write_history(&mut source, &mut log);
    let mut replayed = db();
    for payload in &log {
        let (seq, body) = decode_commit(payload).expect("an encoded commit decodes");
        replayed.replay(seq, body).expect("replays");
    }
    assert_eq!(topics(&replayed), topics(&source));
    assert_eq!(replayed.seq, source.seq);
    let small = &source.topics["small"];
    assert_eq!((small.first(), small.next(), small.len()), (7, 10, 3));
    // ts never goes back within a topic, even when the caller's clock does.
    let chat = &source.topics["chat"];
    let ts: Vec<i64> = chat.records().map(|r| r.ts_us).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    let (hits, next) = chat
        .read(0, 100, &TagFilter::parse(&["user:1"]).unwrap())
        .unwrap();
    assert_eq!(hits.len(), 3);
    assert_eq!(next, chat.next());
}

#[test]
fn a_snapshot_holds_every_topic_exactly() {
    let mut source = db();
    write_history(&mut source, &mut Vec::new());
    let mut loaded = db();
    let mut loader = SnapshotLoader::new();
    for frame in encode_snapshot(&source) {
        let Decoded::Frame { payload, .. } = decode(&frame, 0) else {
            panic!("encode_snapshot makes whole frames");
        };
        loader.frame(&mut loaded, payload).expect("loads");
    }
    assert!(loader.finished());
    assert_eq!(topics(&loaded), topics(&source));
    let tags = |db: &Db| db.topics["chat"].tags().lookup_prefix("user:").count();
    assert_eq!(tags(&loaded), tags(&source));
}

#[test]
fn a_corrupted_record_is_refused_not_replayed() {
    let mut source = db();
    let mut log = Vec::new();
    write_history(&mut source, &mut log);
    // Flip the data of the first append so it is no longer JSON.
    let payload = &mut log[3];
    let at = payload.iter().rposition(|b| *b == b'}').unwrap();
    payload[at] = b'{';
    assert!(decode_commit(payload).is_err());
}
