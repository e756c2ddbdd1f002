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

/// `prefix` then `n` in decimal, as row text built without a `String` or the formatting
/// machinery (the in-process tasks build millions of rows a second, and `write!` here was
/// 1.6 % of the in-process case's CPU; what [`room`] and [`author`] give).
fn numbered(prefix: &str, n: u64) -> sluice_engine::ThinStr {
    const ROOM_BYTES: usize = 64;
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    let len = prefix.len() + digits.len();
    assert!(len <= ROOM_BYTES, "a short prefix and a u64 fit");
    let mut text = [0u8; ROOM_BYTES];
    text[..prefix.len()].copy_from_slice(prefix.as_bytes());
    text[prefix.len()..len].copy_from_slice(digits);
    sluice_engine::ThinStr::new(std::str::from_utf8(&text[..len]).expect("UTF-8 in, UTF-8 out"))
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
/// this way, as the typed mutate decoder would from [`row_json`]: one allocation for the
/// row, one for the body).
pub fn row_values(id: u64) -> std::sync::Arc<[sluice_engine::Value]> {
    use sluice_engine::Value;
    std::sync::Arc::new([
        Value::Integer(id as i64),
        Value::Text(numbered("room-", id % ROOMS)),
        Value::Text(numbered("user-", id % AUTHORS)),
        Value::Text(body(id).into()),
        Value::Integer(ts(id)),
    ])
}

/// Which rows a case writes: today's 5-column `events`, or the 10-column, ~200-byte
/// `wide_events` (issue 12 asks for both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// `events`: id, room, author, ~100-byte body, ts.
    Events,
    /// `wide_events`: 10 columns, ~200 bytes of values per row.
    Wide,
}

/// Bytes in every `body` of a wide row.
pub const WIDE_BODY_BYTES: usize = 120;
const _: () = assert!(BODY_SOURCE.len() >= BODY_BYTES + WIDE_BODY_BYTES);
const KINDS: [&str; 5] = ["message", "join", "leave", "edit", "react"];
const COUNTRIES: [&str; 6] = ["us", "de", "fr", "jp", "br", "in"];

impl Shape {
    pub const fn table(self) -> &'static str {
        match self {
            Shape::Events => TABLE,
            Shape::Wide => "wide_events",
        }
    }

    pub const fn create_sluice(self) -> &'static str {
        match self {
            Shape::Events => CREATE_SLUICE,
            Shape::Wide => "CREATE TABLE wide_events (id INTEGER PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts INTEGER, kind TEXT, score REAL, flag BOOLEAN, country TEXT, ref_id INTEGER)",
        }
    }

    pub const fn create_postgres(self) -> &'static str {
        match self {
            Shape::Events => CREATE_POSTGRES,
            Shape::Wide => "CREATE TABLE wide_events (id BIGINT PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts BIGINT, kind TEXT, score DOUBLE PRECISION, flag BOOLEAN, country TEXT, ref_id BIGINT)",
        }
    }

    pub const fn columns(self) -> usize {
        match self {
            Shape::Events => 5,
            Shape::Wide => 10,
        }
    }

    /// How the summary names the rows.
    pub fn describe(self) -> String {
        match self {
            Shape::Events => {
                format!("`events` rows (5 columns: id, room, author, ~{BODY_BYTES}-byte body, ts)")
            }
            Shape::Wide => format!(
                "`wide_events` rows (10 columns, ~200 bytes of values: id, room, author, \
                 {WIDE_BODY_BYTES}-byte body, ts, kind, score REAL, flag BOOLEAN, country, ref_id)"
            ),
        }
    }

    /// Row `id` as typed values in the table's column order.
    pub fn row_values(self, id: u64) -> std::sync::Arc<[sluice_engine::Value]> {
        use sluice_engine::Value;
        match self {
            Shape::Events => row_values(id),
            Shape::Wide => std::sync::Arc::new([
                Value::Integer(id as i64),
                Value::Text(numbered("room-", id % ROOMS)),
                Value::Text(numbered("user-", id % AUTHORS)),
                Value::Text(wide_body(id).into()),
                Value::Integer(ts(id)),
                Value::Text(KINDS[(id % 5) as usize].into()),
                Value::Real(score(id)),
                Value::Boolean(id.is_multiple_of(3)),
                Value::Text(COUNTRIES[(id % 6) as usize].into()),
                Value::Integer((id / 2) as i64),
            ]),
        }
    }

    /// The body of `POST /v1/mutate` inserting rows `first..first + count`.
    pub fn mutate_body(self, first: u64, count: u64, durability: Durability) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_mutate_body(first, count, durability, &mut out);
        out
    }

    /// [`Shape::mutate_body`] written into `out` (cleared first), so a client sending one
    /// body after another reuses one buffer. Written byte by byte with `itoa` and `ryu`, not
    /// `write!`: the clients share the machine's CPUs with the server they measure, and the
    /// formatting machinery cost them about 0.2 µs a wide row (measured beside this writer,
    /// which takes half that; `bodies_are_written_as_format_writes_them` holds the two to
    /// the same bytes).
    pub fn write_mutate_body(
        self,
        first: u64,
        count: u64,
        durability: Durability,
        out: &mut Vec<u8>,
    ) {
        match self {
            Shape::Events => write_rows_body("insert", first, count, durability, out),
            Shape::Wide => write_ops(first, count, durability, 330, out, |id, out, n| {
                put(out, br#"{"op":"insert","table":"wide_events","row":{"#);
                put_shared_columns(out, n, id, wide_body(id));
                put(out, br#","kind":""#);
                put(out, KINDS[(id % 5) as usize].as_bytes());
                put(out, br#"","score":"#);
                put(out, n.real.format_finite(score(id)).as_bytes());
                put(out, br#","flag":"#);
                put(
                    out,
                    if id.is_multiple_of(3) {
                        b"true"
                    } else {
                        b"false"
                    },
                );
                put(out, br#","country":""#);
                put(out, COUNTRIES[(id % 6) as usize].as_bytes());
                put(out, br#"","ref_id":"#);
                put(out, n.int.format(id / 2).as_bytes());
                put(out, b"}}");
            }),
        }
    }

    /// `INSERT INTO <table> (...) VALUES (...), ...` with parameters for `rows` rows.
    pub fn postgres_insert(self, rows: usize) -> String {
        if self == Shape::Events {
            return postgres_insert(rows);
        }
        let n = self.columns();
        let mut sql = String::from(
            "INSERT INTO wide_events (id, room, author, body, ts, kind, score, flag, country, ref_id) VALUES ",
        );
        for r in 0..rows {
            if r > 0 {
                sql.push(',');
            }
            let params: Vec<String> = (1..=n).map(|i| format!("${}", r * n + i)).collect();
            let _ = write!(sql, "({})", params.join(","));
        }
        sql
    }

    /// Row `id`'s parameters for [`Shape::postgres_insert`].
    pub fn postgres_params(
        self,
        id: u64,
    ) -> Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> {
        let mut p: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = vec![
            Box::new(id as i64),
            Box::new(room(id)),
            Box::new(author(id)),
        ];
        match self {
            Shape::Events => p.extend([
                Box::new(body(id)) as Box<dyn tokio_postgres::types::ToSql + Sync + Send>,
                Box::new(ts(id)),
            ]),
            Shape::Wide => p.extend([
                Box::new(wide_body(id)) as Box<dyn tokio_postgres::types::ToSql + Sync + Send>,
                Box::new(ts(id)),
                Box::new(KINDS[(id % 5) as usize]),
                Box::new(score(id)),
                Box::new(id.is_multiple_of(3)),
                Box::new(COUNTRIES[(id % 6) as usize]),
                Box::new((id / 2) as i64),
            ]),
        }
        p
    }
}

/// A [`WIDE_BODY_BYTES`]-byte body for wide row `id`.
pub fn wide_body(id: u64) -> &'static str {
    let start = (id % BODY_BYTES as u64) as usize;
    &BODY_SOURCE[start..start + WIDE_BODY_BYTES]
}

fn score(id: u64) -> f64 {
    (id % 1000) as f64 / 8.0
}

/// The body of `POST /v1/mutate` inserting rows `first..first + count`, written directly
/// (no `serde_json::Value` in between) so the client spends little CPU per row.
pub fn mutate_body(first: u64, count: u64, durability: Durability) -> Vec<u8> {
    rows_body("insert", first, count, durability)
}

/// Marsaglia's xorshift64: the next of a cheap, reproducible sequence of `u64`s from
/// `state` (never 0). The bench's writers pick rows with it, and the map benchmark its
/// permutation.
pub fn xorshift64(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// As [`mutate_body`], upserting (rows that exist are replaced by the same values).
pub fn upsert_body(first: u64, count: u64, durability: Durability) -> Vec<u8> {
    rows_body("upsert", first, count, durability)
}

fn rows_body(op: &str, first: u64, count: u64, durability: Durability) -> Vec<u8> {
    let mut out = Vec::new();
    write_rows_body(op, first, count, durability, &mut out);
    out
}

/// The `events` rows `first..first + count` as `op` ops, into `out` (see
/// [`Shape::write_mutate_body`]).
fn write_rows_body(op: &str, first: u64, count: u64, durability: Durability, out: &mut Vec<u8>) {
    write_ops(first, count, durability, 200, out, |id, out, n| {
        put(out, br#"{"op":""#);
        put(out, op.as_bytes());
        put(out, br#"","table":""#);
        put(out, TABLE.as_bytes());
        put(out, br#"","row":{"#);
        put_shared_columns(out, n, id, body(id));
        put(out, b"}}");
    });
}

/// The columns both shapes begin with, `"id":…,"room":…,"author":…,"body":…,"ts":…`.
fn put_shared_columns(out: &mut Vec<u8>, n: &mut Numbers, id: u64, body: &str) {
    put(out, br#""id":"#);
    put(out, n.int.format(id).as_bytes());
    put(out, br#","room":"room-"#);
    put(out, n.int.format(id % ROOMS).as_bytes());
    put(out, br#"","author":"user-"#);
    put(out, n.int.format(id % AUTHORS).as_bytes());
    put(out, br#"","body":""#);
    put(out, body.as_bytes());
    put(out, br#"","ts":"#);
    put(out, n.int.format(ts(id)).as_bytes());
}

/// Number formatters, reused from row to row.
struct Numbers {
    int: itoa::Buffer,
    real: ryu::Buffer,
}

#[inline(always)]
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(bytes);
}

/// `{"durability": …, "ops": [op(first), …, op(first + count - 1)]}` into `out` (cleared
/// first, with room for `count` ops of about `op_bytes`).
fn write_ops(
    first: u64,
    count: u64,
    durability: Durability,
    op_bytes: usize,
    out: &mut Vec<u8>,
    mut op: impl FnMut(u64, &mut Vec<u8>, &mut Numbers),
) {
    out.clear();
    out.reserve(count as usize * op_bytes + 64);
    let mut numbers = Numbers {
        int: itoa::Buffer::new(),
        real: ryu::Buffer::new(),
    };
    put(out, br#"{"durability":""#);
    put(out, durability.as_str().as_bytes());
    put(out, br#"","ops":["#);
    for id in first..first + count {
        if id != first {
            out.push(b',');
        }
        op(id, out, &mut numbers);
    }
    put(out, b"]}");
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

/// Inserts rows `0..rows` into a running server with `disk`-class mutates of `batch` rows,
/// from `clients` HTTP clients taking the next batch as they go.
pub async fn load_over_http(
    server: &crate::server::SluiceServer,
    rows: u64,
    clients: usize,
    batch: u64,
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use anyhow::Context as _;

    let next = Arc::new(AtomicU64::new(0));
    let url = server.url("/v1/mutate");
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (next, url) = (next.clone(), url.clone());
        let client = reqwest::Client::builder()
            .default_headers(crate::server::auth_headers())
            .no_proxy()
            .timeout(std::time::Duration::from_secs(120))
            .build()?;
        tasks.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= rows {
                    return Ok::<(), anyhow::Error>(());
                }
                let n = batch.min(rows - from);
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(mutate_body(from, n, Durability::Disk))
                    .send()
                    .await?;
                let status = resp.status();
                let text = resp.text().await?;
                anyhow::ensure!(status.is_success(), "mutate answered {status}: {text}");
            }
        }));
    }
    for t in tasks {
        t.await.context("a load task panicked")??;
    }
    Ok(())
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
    fn wide_mutate_body_is_the_json_of_the_typed_rows() {
        let v: Value =
            serde_json::from_slice(&Shape::Wide.mutate_body(7, 3, Durability::Disk)).unwrap();
        let ops = v["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 3);
        for (i, op) in ops.iter().enumerate() {
            let id = 7 + i as u64;
            let row = op["row"].as_object().unwrap();
            assert_eq!(row.len(), 10);
            let values = Shape::Wide.row_values(id);
            for (value, (_, json)) in values.iter().zip(row) {
                assert_eq!(&value.to_json(), json);
            }
            let bytes: usize = values.iter().map(|v| v.encoded_len()).sum();
            assert!((170..=230).contains(&bytes), "{bytes} bytes");
        }
        assert_eq!(
            Shape::Wide.postgres_insert(1),
            "INSERT INTO wide_events (id, room, author, body, ts, kind, score, flag, country, ref_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"
        );
    }

    /// The byte writers write exactly what `write!` wrote before them, for both shapes,
    /// both ops, every durability, ids of every length, and into a buffer that held a
    /// longer body.
    #[test]
    fn bodies_are_written_as_format_writes_them() {
        fn by_format(shape: Shape, op: &str, first: u64, count: u64, d: Durability) -> String {
            let mut s = format!(r#"{{"durability":"{}","ops":["#, d.as_str());
            for id in first..first + count {
                if id != first {
                    s.push(',');
                }
                let (room, author) = (id % ROOMS, id % AUTHORS);
                let _ = match shape {
                    Shape::Events => write!(
                        s,
                        r#"{{"op":"{op}","table":"{TABLE}","row":{{"id":{id},"room":"room-{room}","author":"user-{author}","body":"{}","ts":{}}}}}"#,
                        body(id),
                        ts(id)
                    ),
                    Shape::Wide => write!(
                        s,
                        r#"{{"op":"insert","table":"wide_events","row":{{"id":{id},"room":"room-{room}","author":"user-{author}","body":"{}","ts":{},"kind":"{}","score":{:?},"flag":{},"country":"{}","ref_id":{}}}}}"#,
                        wide_body(id),
                        ts(id),
                        KINDS[(id % 5) as usize],
                        score(id),
                        id.is_multiple_of(3),
                        COUNTRIES[(id % 6) as usize],
                        id / 2
                    ),
                };
            }
            s.push_str("]}");
            s
        }
        let mut out = vec![b'x'; 100_000];
        for d in [Durability::Memory, Durability::Disk, Durability::Fsync] {
            for (first, count) in [
                (0, 1),
                (7, 3),
                (995, 20),
                (123_456_789, 50),
                (u32::MAX as u64, 2),
            ] {
                for shape in [Shape::Events, Shape::Wide] {
                    let want = by_format(shape, "insert", first, count, d);
                    shape.write_mutate_body(first, count, d, &mut out);
                    assert_eq!(String::from_utf8_lossy(&out), want);
                    assert_eq!(shape.mutate_body(first, count, d), want.as_bytes());
                }
                let want = by_format(Shape::Events, "upsert", first, count, d);
                assert_eq!(upsert_body(first, count, d), want.as_bytes());
            }
        }
    }

    #[test]
    fn typed_rows_are_the_json_rows() {
        let columns = ["id", "room", "author", "body", "ts"];
        for id in [0, 7, 999, 1_000, 10_000, 123_456_789, u32::MAX as u64] {
            let json = row_json(id);
            let values = row_values(id);
            assert_eq!(values.len(), columns.len());
            for (value, column) in values.iter().zip(columns) {
                assert_eq!(value.to_json(), json[column], "row {id}, {column}");
            }
        }
        assert_eq!(numbered("user-", 0).as_str(), "user-0");
        assert_eq!(numbered("r", u64::MAX).as_str(), format!("r{}", u64::MAX));
    }

    #[test]
    fn postgres_insert_numbers_every_parameter() {
        assert_eq!(
            postgres_insert(2),
            "INSERT INTO events (id, room, author, body, ts) VALUES ($1,$2,$3,$4,$5),($6,$7,$8,$9,$10)"
        );
    }
}
