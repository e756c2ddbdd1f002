//! The rows every ingest path writes: chat-like `events` with ~100-byte bodies.
//!
//! Row `id` is fully determined by its id, so Sluice (in-process and over HTTP) and
//! PostgreSQL take byte-for-byte the same data.

use std::fmt::Write as _;

use serde_json::{Map, Value};
use sluice_log::Durability;

pub const TABLE: &str = "events";
pub const CREATE_SLUICE: &str = "CREATE TABLE events (id INTEGER PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts INTEGER)";
pub const CREATE_POSTGRES: &str = "CREATE TABLE events (id BIGINT PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts BIGINT)";

/// Bytes in every `body`.
pub const BODY_BYTES: usize = 100;
const ROOMS: u64 = 1_000;
const AUTHORS: u64 = 10_000;
/// 2023-11-14T22:13:20Z in µs; row `id` is stamped `id` ms later.
const TS_BASE_US: i64 = 1_700_000_000_000_000;

/// Twice [`BODY_BYTES`] of plain ASCII (no quote, no backslash: it needs no JSON escaping).
const BODY_SOURCE: &str = "the quick brown fox jumps over the lazy dog while the sluice keeps every write in order and durable; pack my box with five dozen liquor jugs, then sphinx of black quartz judge my vow; how vexingly quick daft zebras jump over fences. ";
const _: () = assert!(BODY_SOURCE.len() >= 2 * BODY_BYTES);

pub fn room(id: u64) -> String {
    format!("room-{}", id % ROOMS)
}

pub fn author(id: u64) -> String {
    format!("user-{}", id % AUTHORS)
}

/// A [`BODY_BYTES`]-byte slice of [`BODY_SOURCE`] starting at an offset derived from `id`.
pub fn body(id: u64) -> &'static str {
    let start = (id % BODY_BYTES as u64) as usize;
    &BODY_SOURCE[start..start + BODY_BYTES]
}

pub fn ts(id: u64) -> i64 {
    TS_BASE_US + id as i64 * 1_000
}

/// Row `id` as the JSON object of an insert op.
pub fn row_json(id: u64) -> Map<String, Value> {
    let mut row = Map::with_capacity(5);
    row.insert("id".into(), Value::from(id));
    row.insert("room".into(), Value::from(room(id)));
    row.insert("author".into(), Value::from(author(id)));
    row.insert("body".into(), Value::from(body(id)));
    row.insert("ts".into(), Value::from(ts(id)));
    row
}

/// Row `id` as typed values in the table's column order (the in-process cases build rows
/// this way, as the typed mutate decoder would from [`row_json`]).
pub fn row_values(id: u64) -> Vec<sluice_engine::Value> {
    use sluice_engine::Value;
    vec![
        Value::Integer(id as i64),
        Value::Text(room(id).into()),
        Value::Text(author(id).into()),
        Value::Text(body(id).into()),
        Value::Integer(ts(id)),
    ]
}

/// The body of `POST /v1/mutate` inserting rows `first..first + count`, written directly
/// (no `serde_json::Value` in between) so the client spends little CPU per row.
pub fn mutate_body(first: u64, count: u64, durability: Durability) -> Vec<u8> {
    let mut s = String::with_capacity(count as usize * 200 + 64);
    s.push_str(r#"{"durability":""#);
    s.push_str(durability.as_str());
    s.push_str(r#"","ops":["#);
    for id in first..first + count {
        if id != first {
            s.push(',');
        }
        let _ = write!(
            s,
            r#"{{"op":"insert","table":"{TABLE}","row":{{"id":{id},"room":"room-{}","author":"user-{}","body":"{}","ts":{}}}}}"#,
            id % ROOMS,
            id % AUTHORS,
            body(id),
            ts(id)
        );
    }
    s.push_str("]}");
    s.into_bytes()
}

/// `INSERT INTO events (...) VALUES ($1,...,$5), ... ` for `rows` rows.
pub fn postgres_insert(rows: usize) -> String {
    let mut sql = String::from("INSERT INTO events (id, room, author, body, ts) VALUES ");
    for r in 0..rows {
        let p = r * 5;
        if r > 0 {
            sql.push(',');
        }
        let _ = write!(
            sql,
            "(${},${},${},${},${})",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5
        );
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutate_body_is_the_json_of_the_rows() {
        let v: Value = serde_json::from_slice(&mutate_body(7, 3, Durability::Disk)).unwrap();
        assert_eq!(v["durability"], "disk");
        let ops = v["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 3);
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op["op"], "insert");
            assert_eq!(op["table"], TABLE);
            assert_eq!(op["row"], Value::Object(row_json(7 + i as u64)));
        }
        assert_eq!(body(12345).len(), BODY_BYTES);
    }

    #[test]
    fn postgres_insert_numbers_every_parameter() {
        assert_eq!(
            postgres_insert(2),
            "INSERT INTO events (id, room, author, body, ts) VALUES ($1,$2,$3,$4,$5),($6,$7,$8,$9,$10)"
        );
    }
}
