//! Large snapshots, frozen once and sent in chunks ([`ChunkedSnapshot`]).
//!
//! A view's snapshot of up to [`SNAPSHOT_MESSAGE_ROWS_MAX`] rows is one message, rendered once
//! on the live thread as it always was. A larger one is not rendered there: the live thread
//! only takes the visible rows — their keys and `Arc`'d values, in order — with the seq and
//! checksum, and each subscriber's connection task encodes that frozen list chunk by chunk
//! ([`ChunkedSnapshot::json_chunk`], [`ChunkedSnapshot::msgpack_chunk`]) straight from the
//! typed values, asking for the next chunk only once the previous one was taken by the
//! socket. So the live thread spends O(rows) pointer copies instead of JSON rendering, no
//! connection ever holds the whole encoded snapshot (a slow reader holds one chunk and the
//! transport's bounded queue), and a MessagePack subscriber's bytes are not first rendered
//! as JSON and parsed back.
//!
//! On the wire (docs/protocol.md, "Large snapshots"), every chunk is a `snapshot` message
//! with the same `seq`, `columns` and `types`, and its share of `keys` and `rows`; every chunk
//! but the last carries `"more": true`, and only the last carries the `checksum` (of all the
//! rows) and `reset`. A client appends the rows of each chunk and replaces its rows with them
//! when the last arrives.

use std::sync::Arc;

use serde_json::Value as Json;
use sluice_engine::Value;

use crate::checksum::render;
use crate::view::RKey;

/// Writes anything serde_json can write (writing to a `Vec` cannot fail).
macro_rules! push_json {
    ($v:expr, $out:expr) => {
        serde_json::to_writer(&mut *$out, $v).expect("writing JSON to a Vec cannot fail")
    };
}

/// Snapshots of at most this many rows are sent as one message (byte for byte as before
/// chunking existed); larger ones in chunks.
pub const SNAPSHOT_MESSAGE_ROWS_MAX: usize = 8_192;
/// A chunk ends once its keys and rows take this many encoded bytes…
pub const CHUNK_BYTES_TARGET: usize = 256 << 10;
/// …or hold this many rows, whichever comes first.
pub const CHUNK_ROWS_MAX: usize = SNAPSHOT_MESSAGE_ROWS_MAX;

/// The rows of one snapshot at one seq, frozen (the values are the view's `Arc`s, or the
/// table's).
#[derive(Debug)]
pub struct ChunkedSnapshot {
    pub seq: u64,
    pub reset: bool,
    columns: Arc<[String]>,
    types: Arc<Json>,
    /// `"name":` of each column, escaped once.
    names_json: Vec<String>,
    /// Each column's name as a MessagePack string, encoded once.
    names_mp: Vec<Vec<u8>>,
    source: Source,
    /// Rows in the whole snapshot.
    len: usize,
    checksum: Checksum,
}

/// The checksum of all the rows, for the last chunk: known when the snapshot is made, or —
/// a snapshot streamed while its view is built ([`ChunkedSnapshot::streaming`]) — once the
/// build has hashed the rows. `None` inside: the build failed and the snapshot is abandoned
/// (its subscriber is sent an error instead).
#[derive(Debug, Default)]
struct Checksum {
    value: std::sync::OnceLock<Option<u64>>,
    set: tokio::sync::Notify,
}

impl Checksum {
    fn known(sum: u64) -> Checksum {
        let c = Checksum::default();
        let _ = c.value.set(Some(sum));
        c
    }
}

/// Where a snapshot's rows come from.
enum Source {
    /// Copied out of the view: its visible rows, in order (a view that was already there,
    /// an ordered or windowed one, a reset).
    Rows(Vec<(RKey, Arc<[Value]>)>),
    /// The frozen version of its one table the view was just built from (an unordered
    /// filter over a full scan): each chunk tests and projects the table's rows as the
    /// build did, so the live thread copies nothing for the snapshot — a 5 M-row view's
    /// snapshot was 5 M key allocations and a 200 MB vec on the live thread.
    Table(FrozenTable),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Rows(rows) => write!(f, "Rows({})", rows.len()),
            Source::Table(t) => write!(f, "Table({})", t.rows.len()),
        }
    }
}

/// A frozen version of a table's rows and the filter that picks and projects a view's rows
/// from it ([`crate::operator::RowPick`]).
pub(crate) struct FrozenTable {
    pub(crate) rows: crate::operator::FrozenRows,
    pub(crate) pick: crate::operator::RowPick,
}

/// How far one subscriber's connection has sent a [`ChunkedSnapshot`]: each transport
/// keeps its own (the snapshot is shared by every subscriber of the event).
#[derive(Clone, Debug, Default)]
pub struct Cursor {
    /// The next row ([`Source::Rows`]).
    next: usize,
    /// The key of the next table row to look at ([`Source::Table`]; `None`: the first).
    key: Option<sluice_engine::Key>,
    /// Rows encoded so far.
    sent: usize,
    done: bool,
}

impl Cursor {
    /// The last chunk was encoded.
    pub fn done(&self) -> bool {
        self.done
    }
}

impl ChunkedSnapshot {
    pub fn new(
        seq: u64,
        reset: bool,
        columns: Arc<[String]>,
        types: Arc<Json>,
        rows: Vec<(RKey, Arc<[Value]>)>,
        checksum: u64,
    ) -> ChunkedSnapshot {
        let len = rows.len();
        let checksum = Checksum::known(checksum);
        Self::with_source(
            seq,
            reset,
            columns,
            types,
            Source::Rows(rows),
            len,
            checksum,
        )
    }

    /// A snapshot of the `len` rows `table.pick` takes from `table.rows`, made before the
    /// view is built from the same rows — so its chunks go out while the live thread builds
    /// — and whose checksum the build supplies ([`ChunkedSnapshot::set_checksum`]). A
    /// transport waits for it before a chunk that may be the last ([`ChunkedSnapshot::ready`]).
    pub(crate) fn streaming(
        seq: u64,
        reset: bool,
        columns: Arc<[String]>,
        types: Arc<Json>,
        table: FrozenTable,
        len: usize,
    ) -> ChunkedSnapshot {
        let checksum = Checksum::default();
        Self::with_source(
            seq,
            reset,
            columns,
            types,
            Source::Table(table),
            len,
            checksum,
        )
    }

    /// The build's checksum of all the rows (`None`: the build failed; the snapshot will
    /// not be finished).
    pub(crate) fn set_checksum(&self, sum: Option<u64>) {
        let _ = self.checksum.value.set(sum);
        self.checksum.set.notify_waiters();
    }

    /// Waits, if the chunk at `cursor` may be the last, until the checksum is known.
    /// `false`: the snapshot was abandoned (send the subscriber's next event instead).
    pub async fn ready(&self, cursor: &Cursor) -> bool {
        loop {
            // Registered before the check, so a `set_checksum` between the two wakes it.
            let set = self.checksum.set.notified();
            if let Some(sum) = self.checksum.value.get() {
                return sum.is_some();
            }
            if self.len.saturating_sub(cursor.sent) > CHUNK_ROWS_MAX {
                return true;
            }
            set.await;
        }
    }

    /// The checksum the last chunk carries.
    fn final_checksum(&self) -> u64 {
        self.checksum
            .value
            .get()
            .copied()
            .flatten()
            .expect("a transport waits for ChunkedSnapshot::ready before a last chunk")
    }

    /// A snapshot of the `len` rows `table.pick` takes from `table.rows`, in key order.
    pub(crate) fn from_table(
        seq: u64,
        reset: bool,
        columns: Arc<[String]>,
        types: Arc<Json>,
        table: FrozenTable,
        len: usize,
        checksum: u64,
    ) -> ChunkedSnapshot {
        let checksum = Checksum::known(checksum);
        Self::with_source(
            seq,
            reset,
            columns,
            types,
            Source::Table(table),
            len,
            checksum,
        )
    }

    fn with_source(
        seq: u64,
        reset: bool,
        columns: Arc<[String]>,
        types: Arc<Json>,
        source: Source,
        len: usize,
        checksum: Checksum,
    ) -> ChunkedSnapshot {
        let names_json = columns
            .iter()
            .map(|c| format!("{}:", Json::from(c.as_str())))
            .collect();
        let names_mp = columns
            .iter()
            .map(|c| {
                let mut b = Vec::with_capacity(c.len() + 5);
                mp::str(c, &mut b);
                b
            })
            .collect();
        ChunkedSnapshot {
            seq,
            reset,
            columns,
            types,
            names_json,
            names_mp,
            source,
            len,
            checksum,
        }
    }

    /// Rows in the whole snapshot.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `encode(key, row)` for the rows of the chunk at `cursor`, until it returns the
    /// chunk's encoded bytes at or past [`CHUNK_BYTES_TARGET`] or [`CHUNK_ROWS_MAX`] rows
    /// were taken; moves the cursor past them. Returns the rows taken and whether the chunk
    /// is the last.
    fn chunk_rows(
        &self,
        cursor: &mut Cursor,
        mut encode: impl FnMut(&[Value], &[Value]) -> usize,
    ) -> (usize, bool) {
        let mut taken = 0;
        match &self.source {
            Source::Rows(rows) => {
                let from = cursor.next.min(rows.len());
                let end = (from + CHUNK_ROWS_MAX).min(rows.len());
                let mut at = from;
                while at < end {
                    let (k, r) = &rows[at];
                    at += 1;
                    if encode(k, r) >= CHUNK_BYTES_TARGET {
                        break;
                    }
                }
                taken = at - from;
                cursor.next = at;
                cursor.done = at >= rows.len();
            }
            Source::Table(t) => {
                let mut rows = match &cursor.key {
                    None => t.rows.iter(),
                    Some(k) => t.rows.range(k..),
                };
                let mut full = false;
                let mut key = [Value::Null];
                cursor.done = true;
                for (k, entry) in rows.by_ref() {
                    let Some(row) = t.pick.pick(&entry.values) else {
                        continue;
                    };
                    if full {
                        // The next chunk starts at the next row this view takes.
                        cursor.key = Some(k.clone());
                        cursor.done = false;
                        break;
                    }
                    key[0] = k.to_value();
                    taken += 1;
                    full = encode(&key, &row) >= CHUNK_BYTES_TARGET || taken == CHUNK_ROWS_MAX;
                }
            }
        }
        cursor.sent += taken;
        (taken, cursor.done)
    }

    /// The JSON message of the chunk at `cursor`, which it moves past it (see
    /// [`Cursor::done`]). With `qid`, in the WebSocket form (`"type"` and `"qid"` first);
    /// without, the SSE form.
    pub fn json_chunk(&self, cursor: &mut Cursor, qid: Option<&Json>) -> String {
        let mut keys = Vec::with_capacity(CHUNK_BYTES_TARGET / 8);
        let mut rows = Vec::with_capacity(CHUNK_BYTES_TARGET + CHUNK_BYTES_TARGET / 8);
        let (_, last) = self.chunk_rows(cursor, |k, r| {
            if !rows.is_empty() {
                keys.push(b',');
                rows.push(b',');
            }
            json_key(k, &mut keys);
            rows.push(b'{');
            for (c, (name, v)) in self.names_json.iter().zip(r.iter()).enumerate() {
                if c > 0 {
                    rows.push(b',');
                }
                rows.extend_from_slice(name.as_bytes());
                json_value(v, &mut rows);
            }
            rows.push(b'}');
            keys.len() + rows.len()
        });
        let mut out = Vec::with_capacity(keys.len() + rows.len() + 256);
        out.push(b'{');
        if let Some(qid) = qid {
            out.extend_from_slice(b"\"type\":\"snapshot\",\"qid\":");
            push_json!(qid, &mut out);
            out.push(b',');
        }
        out.extend_from_slice(b"\"seq\":");
        push_json!(&self.seq, &mut out);
        out.extend_from_slice(b",\"columns\":");
        push_json!(&*self.columns, &mut out);
        out.extend_from_slice(b",\"types\":");
        push_json!(&*self.types, &mut out);
        out.extend_from_slice(b",\"keys\":[");
        out.extend_from_slice(&keys);
        out.extend_from_slice(b"],\"rows\":[");
        out.extend_from_slice(&rows);
        out.push(b']');
        if !last {
            out.extend_from_slice(b",\"more\":true");
        } else {
            out.extend_from_slice(b",\"checksum\":");
            push_json!(&render(self.final_checksum()), &mut out);
            if self.reset {
                out.extend_from_slice(b",\"reset\":true");
            }
        }
        out.push(b'}');
        String::from_utf8(out).expect("JSON is written from UTF-8 text only")
    }

    /// The MessagePack message (WebSocket form, `"type"` and `"qid"` first) of the chunk at
    /// `cursor`, which it moves past it: the same map as [`ChunkedSnapshot::json_chunk`]'s,
    /// with MessagePack integers, floats and strings, and `rows` before `keys` (a map's
    /// order means nothing). The rows — nearly all of the bytes — are written straight into
    /// the message (their array's length is filled in after them, in the fixed 5-byte
    /// form); only the keys go through a second, small buffer. (With the keys first, the
    /// rows' ~256 KiB were copied once more per chunk: 819 MB of `memmove` at 5 M rows.)
    pub fn msgpack_chunk(&self, cursor: &mut Cursor, qid: &Json) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHUNK_BYTES_TARGET + CHUNK_BYTES_TARGET / 4);
        let mut keys = Vec::with_capacity(CHUNK_ROWS_MAX * 3);
        // The map's length is known once the chunk is: a fixmap either way, patched below.
        out.push(0x80);
        mp::str("type", &mut out);
        mp::str("snapshot", &mut out);
        mp::str("qid", &mut out);
        mp::json(qid, &mut out);
        mp::str("seq", &mut out);
        mp::uint(self.seq, &mut out);
        mp::str("columns", &mut out);
        mp::array_len(self.columns.len(), &mut out);
        for c in self.names_mp.iter() {
            out.extend_from_slice(c);
        }
        mp::str("types", &mut out);
        mp::json(&self.types, &mut out);
        mp::str("rows", &mut out);
        let rows_len_at = out.len();
        out.extend_from_slice(&[0xdd, 0, 0, 0, 0]);
        let rows_from = out.len();
        let columns = self.columns.len();
        let (n, last) = self.chunk_rows(cursor, |k, r| {
            match k {
                [one] => mp::value(one, &mut keys),
                many => {
                    mp::array_len(many.len(), &mut keys);
                    for v in many {
                        mp::value(v, &mut keys);
                    }
                }
            }
            mp::map_len(columns.min(r.len()), &mut out);
            for (name, v) in self.names_mp.iter().zip(r.iter()) {
                out.extend_from_slice(name);
                mp::value(v, &mut out);
            }
            (out.len() - rows_from) + keys.len()
        });
        out[rows_len_at + 1..rows_len_at + 5].copy_from_slice(&(n as u32).to_be_bytes());
        mp::str("keys", &mut out);
        mp::array_len(n, &mut out);
        out.extend_from_slice(&keys);
        drop(keys);
        let fields = 7 + if last { 1 + usize::from(self.reset) } else { 1 };
        out[0] = 0x80 | fields as u8;
        if last {
            mp::str("checksum", &mut out);
            mp::str(&render(self.final_checksum()), &mut out);
            if self.reset {
                mp::str("reset", &mut out);
                mp::bool(true, &mut out);
            }
        } else {
            mp::str("more", &mut out);
            mp::bool(true, &mut out);
        }
        out
    }
}

/// Strings as a JSON array (the column names).
pub(crate) fn json_strs(v: &[String], out: &mut Vec<u8>) {
    push_json!(v, out);
}

/// A JSON value (the types).
pub(crate) fn json_json(v: &Json, out: &mut Vec<u8>) {
    push_json!(v, out);
}

/// A JSON string.
pub(crate) fn json_str(s: &str, out: &mut Vec<u8>) {
    push_json!(s, out);
}

/// A result key as the protocol sends it: the bare value for a one-part key, else an array.
pub(crate) fn json_key(k: &[Value], out: &mut Vec<u8>) {
    match k {
        [one] => json_value(one, out),
        many => {
            out.push(b'[');
            for (i, v) in many.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_value(v, out);
            }
            out.push(b']');
        }
    }
}

/// `v` as [`Value::to_json`] renders it, written without building a `serde_json::Value`
/// for the common types.
pub(crate) fn json_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Integer(i) | Value::Timestamp(i) => push_json!(i, out),
        Value::Real(r) if r.is_finite() => push_json!(r, out),
        Value::Real(_) => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Text(s) => push_json!(&**s, out),
        Value::Blob(_) | Value::Json(_) => push_json!(&v.to_json(), out),
    }
}

/// The MessagePack writers the chunks need, each picking the shortest form (as `rmp`
/// does), so a value encodes as the JSON-then-MessagePack path encoded it. The server's
/// hand-written replies and its JSON-to-MessagePack call arguments use them too.
pub mod mp {
    use serde_json::Value as Json;
    use sluice_engine::Value;

    pub fn uint(n: u64, out: &mut Vec<u8>) {
        match n {
            0..=0x7f => out.push(n as u8),
            0x80..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
            0x100..=0xffff => {
                out.push(0xcd);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                out.push(0xce);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
    }

    pub fn int(n: i64, out: &mut Vec<u8>) {
        if n >= 0 {
            return uint(n as u64, out);
        }
        match n {
            -32..=-1 => out.push(n as u8),
            -128..=-33 => out.extend_from_slice(&[0xd0, n as u8]),
            -32_768..=-129 => {
                out.push(0xd1);
                out.extend_from_slice(&(n as i16).to_be_bytes());
            }
            -2_147_483_648..=-32_769 => {
                out.push(0xd2);
                out.extend_from_slice(&(n as i32).to_be_bytes());
            }
            _ => {
                out.push(0xd3);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
    }

    pub fn f64(x: f64, out: &mut Vec<u8>) {
        out.push(0xcb);
        out.extend_from_slice(&x.to_bits().to_be_bytes());
    }

    pub fn bool(b: bool, out: &mut Vec<u8>) {
        out.push(if b { 0xc3 } else { 0xc2 });
    }

    pub fn str(s: &str, out: &mut Vec<u8>) {
        let n = s.len();
        match n {
            0..=31 => out.push(0xa0 | n as u8),
            32..=0xff => out.extend_from_slice(&[0xd9, n as u8]),
            0x100..=0xffff => {
                out.push(0xda);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                out.push(0xdb);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        out.extend_from_slice(s.as_bytes());
    }

    fn len(n: usize, fix: u8, m16: u8, m32: u8, out: &mut Vec<u8>) {
        match n {
            0..=15 => out.push(fix | n as u8),
            16..=0xffff => {
                out.push(m16);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                out.push(m32);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
    }

    pub fn array_len(n: usize, out: &mut Vec<u8>) {
        len(n, 0x90, 0xdc, 0xdd, out);
    }

    pub fn map_len(n: usize, out: &mut Vec<u8>) {
        len(n, 0x80, 0xde, 0xdf, out);
    }

    /// A JSON value (parameters, JSON columns, `types`) as MessagePack.
    pub fn json(v: &Json, out: &mut Vec<u8>) {
        match v {
            Json::Null => out.push(0xc0),
            Json::Bool(b) => bool(*b, out),
            Json::Number(n) => {
                if let Some(u) = n.as_u64() {
                    uint(u, out);
                } else if let Some(i) = n.as_i64() {
                    int(i, out);
                } else {
                    f64(n.as_f64().unwrap_or(0.0), out);
                }
            }
            Json::String(s) => str(s, out),
            Json::Array(items) => {
                array_len(items.len(), out);
                for item in items {
                    json(item, out);
                }
            }
            Json::Object(m) => {
                map_len(m.len(), out);
                for (k, item) in m {
                    str(k, out);
                    json(item, out);
                }
            }
        }
    }

    /// A typed value as its JSON form would be sent in MessagePack.
    pub fn value(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Null => out.push(0xc0),
            Value::Integer(i) | Value::Timestamp(i) => int(*i, out),
            Value::Real(r) if r.is_finite() => f64(*r, out),
            Value::Real(_) => out.push(0xc0),
            Value::Boolean(b) => bool(*b, out),
            Value::Text(s) => str(s, out),
            Value::Blob(_) | Value::Json(_) => json(&v.to_json(), out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(n: usize, reset: bool) -> ChunkedSnapshot {
        let rows: Vec<(RKey, Arc<[Value]>)> = (0..n as i64)
            .map(|i| {
                let row: Arc<[Value]> = vec![
                    Value::Integer(i - 5),
                    Value::Text(format!("name \"{i}\" ✓").into()),
                    Value::Real(i as f64 / 3.0),
                    Value::Null,
                    Value::Boolean(i % 2 == 0),
                    Value::Json(r#"{"b":[1,2.5,"x"],"a":null}"#.into()),
                    Value::Timestamp(-i * 1_000_000_007),
                ]
                .into();
                (vec![Value::Integer(i - 5)], row)
            })
            .collect();
        let columns: Arc<[String]> = ["id", "name", "score", "none", "flag", "doc", "at"]
            .map(String::from)
            .into();
        let types = Arc::new(serde_json::json!([
            "integer",
            "text",
            "real",
            null,
            "boolean",
            "json",
            "timestamp"
        ]));
        ChunkedSnapshot::new(42, reset, columns, types, rows, 0x0123_4567_89ab_cdef)
    }

    /// The body the one-message path renders for the same rows (`Materialized::snapshot_json`).
    fn one_message(s: &ChunkedSnapshot) -> Json {
        let Source::Rows(source) = &s.source else {
            panic!("the test's snapshots hold rows")
        };
        let keys: Vec<Json> = source
            .iter()
            .map(|(k, _)| crate::view::key_json(k))
            .collect();
        let rows: Vec<Json> = source
            .iter()
            .map(|(_, r)| {
                let mut m = serde_json::Map::new();
                for (c, v) in s.columns.iter().zip(r.iter()) {
                    m.insert(c.clone(), v.to_json());
                }
                Json::Object(m)
            })
            .collect();
        serde_json::json!({"keys": keys, "rows": rows})
    }

    /// Concatenates the chunks' keys and rows; checks the flags and common fields.
    fn assemble(chunks: Vec<Json>, s: &ChunkedSnapshot) -> Json {
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        let n = chunks.len();
        for (i, c) in chunks.into_iter().enumerate() {
            assert_eq!(c["type"], "snapshot");
            assert_eq!(c["qid"], "q1");
            assert_eq!(c["seq"], 42);
            assert_eq!(c["columns"].as_array().unwrap().len(), 7);
            assert_eq!(c["types"][5], "json");
            let last = i + 1 == n;
            assert_eq!(c.get("more").is_some(), !last, "{i}/{n}");
            assert_eq!(c.get("checksum").is_some(), last);
            assert_eq!(c.get("reset").is_some(), last && s.reset);
            if last {
                assert_eq!(c["checksum"], render(s.final_checksum()));
            }
            let k = c["keys"].as_array().unwrap().clone();
            let r = c["rows"].as_array().unwrap().clone();
            assert_eq!(k.len(), r.len());
            assert!(!r.is_empty() || n == 1);
            keys.extend(k);
            rows.extend(r);
        }
        serde_json::json!({"keys": keys, "rows": rows})
    }

    #[test]
    fn json_chunks_add_up_to_the_one_message_rows() {
        for (n, reset) in [(0, false), (1, true), (3_000, false), (40_000, true)] {
            let s = snapshot(n, reset);
            let qid = Json::from("q1");
            let mut chunks = Vec::new();
            let mut cursor = Cursor::default();
            loop {
                let text = s.json_chunk(&mut cursor, Some(&qid));
                chunks.push(serde_json::from_str::<Json>(&text).expect("valid JSON"));
                if cursor.done() {
                    break;
                }
            }
            if n == 40_000 {
                assert!(chunks.len() > 2, "{} chunks", chunks.len());
            }
            // Both sides through the same float parser (the test's serde_json does not round-trip).
            let want: Json = serde_json::from_str(&one_message(&s).to_string()).unwrap();
            let got = assemble(chunks, &s);
            assert_eq!(got["keys"], want["keys"]);
            let (got, want) = (
                got["rows"].as_array().unwrap(),
                want["rows"].as_array().unwrap(),
            );
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g, w);
            }
            // The SSE form is the same body without type and qid.
            let sse = s.json_chunk(&mut Cursor::default(), None);
            let sse: Json = serde_json::from_str(&sse).unwrap();
            assert!(sse.get("type").is_none() && sse.get("qid").is_none());
        }
    }

    #[test]
    fn msgpack_chunks_decode_to_the_json_chunks() {
        for (n, reset) in [(0, true), (2, false), (40_000, true)] {
            let s = snapshot(n, reset);
            let qid = Json::from("q1");
            let (mut at_mp, mut at_json) = (Cursor::default(), Cursor::default());
            let (mut mp_chunks, mut json_chunks) = (Vec::new(), Vec::new());
            loop {
                let bytes = s.msgpack_chunk(&mut at_mp, &qid);
                // Through the same float parser as the JSON side.
                let decoded = decode(&bytes).to_string();
                mp_chunks.push(serde_json::from_str::<Json>(&decoded).unwrap());
                if at_mp.done() {
                    break;
                }
            }
            loop {
                let text = s.json_chunk(&mut at_json, Some(&qid));
                json_chunks.push(serde_json::from_str::<Json>(&text).unwrap());
                if at_json.done() {
                    break;
                }
            }
            // Chunk boundaries follow each encoding's bytes; the rows they add up to do not.
            let (mp, json) = (assemble(mp_chunks, &s), assemble(json_chunks, &s));
            assert_eq!(mp["keys"], json["keys"]);
            let (mp, json) = (
                mp["rows"].as_array().unwrap(),
                json["rows"].as_array().unwrap(),
            );
            assert_eq!(mp.len(), n);
            for (a, b) in mp.iter().zip(json) {
                assert_eq!(a, b);
            }
        }
    }

    /// A small MessagePack reader for the test (maps with string keys, as the chunks use).
    fn decode(bytes: &[u8]) -> Json {
        fn read(b: &[u8], at: &mut usize) -> Json {
            let m = b[*at];
            *at += 1;
            let mut take = |n: usize| {
                let s = &b[*at..*at + n];
                *at += n;
                s.to_vec()
            };
            let be = |s: Vec<u8>| s.iter().fold(0u64, |a, &x| (a << 8) | x as u64);
            let string = |n: usize, at: &mut usize| {
                let s = std::str::from_utf8(&b[*at..*at + n]).unwrap().to_string();
                *at += n;
                Json::String(s)
            };
            match m {
                0x00..=0x7f => Json::from(m),
                0x80..=0x8f => map(b, at, (m & 0x0f) as usize),
                0x90..=0x9f => array(b, at, (m & 0x0f) as usize),
                0xa0..=0xbf => string((m & 0x1f) as usize, at),
                0xc0 => Json::Null,
                0xc2 => Json::Bool(false),
                0xc3 => Json::Bool(true),
                0xcb => Json::from(f64::from_bits(be(take(8)))),
                0xcc => Json::from(be(take(1))),
                0xcd => Json::from(be(take(2))),
                0xce => Json::from(be(take(4))),
                0xcf => Json::from(be(take(8))),
                0xd0 => Json::from(take(1)[0] as i8),
                0xd1 => Json::from(be(take(2)) as u16 as i16),
                0xd2 => Json::from(be(take(4)) as u32 as i32),
                0xd3 => Json::from(be(take(8)) as i64),
                0xd9 => {
                    let n = be(take(1)) as usize;
                    string(n, at)
                }
                0xda => {
                    let n = be(take(2)) as usize;
                    string(n, at)
                }
                0xdc => {
                    let n = be(take(2)) as usize;
                    array(b, at, n)
                }
                0xdd => {
                    let n = be(take(4)) as usize;
                    array(b, at, n)
                }
                0xde => {
                    let n = be(take(2)) as usize;
                    map(b, at, n)
                }
                0xe0..=0xff => Json::from(m as i8),
                other => panic!("marker {other:#x} not expected"),
            }
        }
        fn array(b: &[u8], at: &mut usize, n: usize) -> Json {
            Json::Array((0..n).map(|_| read(b, at)).collect())
        }
        fn map(b: &[u8], at: &mut usize, n: usize) -> Json {
            let mut m = serde_json::Map::new();
            for _ in 0..n {
                let Json::String(k) = read(b, at) else {
                    panic!("a non-string key")
                };
                m.insert(k, read(b, at));
            }
            Json::Object(m)
        }
        let mut at = 0;
        let v = read(bytes, &mut at);
        assert_eq!(at, bytes.len(), "trailing bytes");
        v
    }
}
