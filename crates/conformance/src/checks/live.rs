//! Live queries over Server-Sent Events (`GET /v1/live`): snapshot, diffs, keys, index,
//! checksum, resume, resets, heartbeats and errors.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{arr, has, names, same, string, table, uint};
use crate::client::{Auth, Event, Sse};
use crate::{ensure, fail, show, skip, Ctx, R};

/// `/v1/live?sql=…` with the query percent-encoded.
pub(crate) fn live_path(sql: &str, extra: &str) -> String {
    format!("/v1/live?sql={}{extra}", encode(sql))
}

pub(crate) fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A client-side materialisation of a live result: rows by key, in order.
#[derive(Default, Debug)]
pub(crate) struct View {
    pub columns: Vec<String>,
    pub types: Vec<Value>,
    pub rows: Vec<(Value, Value)>,
    pub seq: u64,
}

impl View {
    /// Replaces the rows with a snapshot's and verifies its checksum.
    pub fn snapshot(&mut self, d: &Value) -> R {
        has(d, &["seq", "columns", "keys", "rows", "checksum"])?;
        self.seq = uint(d, "seq")?;
        self.columns = arr(d, "columns")?
            .iter()
            .map(|c| c.as_str().unwrap_or("").to_string())
            .collect();
        self.types = d["types"].as_array().cloned().unwrap_or_default();
        let keys = arr(d, "keys")?;
        let rows = arr(d, "rows")?;
        ensure!(
            keys.len() == rows.len(),
            "{} keys for {} rows",
            keys.len(),
            rows.len()
        );
        self.rows = keys.iter().cloned().zip(rows.iter().cloned()).collect();
        self.verify(d)
    }

    /// Applies a diff's changes in order and verifies its checksum.
    pub fn diff(&mut self, d: &Value) -> R {
        has(d, &["seq", "changes", "checksum"])?;
        let s = uint(d, "seq")?;
        ensure!(
            s > self.seq,
            "diff seq {s} is not above the previous event's seq {}",
            self.seq
        );
        self.seq = s;
        for ch in arr(d, "changes")? {
            let op = string(ch, "op")?;
            let key = ch
                .get("key")
                .cloned()
                .ok_or_else(|| format!("a change without `key`: {}", show(ch)))?;
            if op == "remove" || op == "change" {
                let Some(at) = self.rows.iter().position(|(k, _)| *k == key) else {
                    fail!("`{op}` of key {key} that the client does not hold");
                };
                if op == "remove" {
                    if let Some(i) = ch.get("index").and_then(Value::as_u64) {
                        ensure!(
                            i as usize == at,
                            "remove of key {key} at index {i}, but it is at {at}"
                        );
                    }
                }
                self.rows.remove(at);
            }
            if op == "add" || op == "change" {
                let row = ch
                    .get("row")
                    .cloned()
                    .ok_or_else(|| format!("`{op}` without `row`: {}", show(ch)))?;
                let at = match ch.get("index").and_then(Value::as_u64) {
                    Some(i) => i as usize,
                    None => self.rows.len(),
                };
                ensure!(
                    at <= self.rows.len(),
                    "index {at} past the end ({} rows)",
                    self.rows.len()
                );
                self.rows.insert(at, (key, row));
            }
            if !["add", "remove", "change"].contains(&op) {
                fail!("unknown change op {op:?}");
            }
        }
        self.verify(d)
    }

    fn verify(&self, d: &Value) -> R {
        let want = string(d, "checksum")?;
        let got =
            crate::rows_checksum(self.rows.iter().map(|(_, r)| r), &self.columns, &self.types)?;
        ensure!(
            got == want,
            "checksum {want} from the server, {got} recomputed over the client's {} rows {}",
            self.rows.len(),
            show(&json!(self
                .rows
                .iter()
                .map(|(_, r)| r.clone())
                .collect::<Vec<_>>()))
        );
        Ok(())
    }

    pub fn row_values(&self) -> Value {
        json!(self.rows.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>())
    }
}

/// The event's `id:` must be its `seq`.
fn id_is_seq(e: &Event) -> R {
    let s = uint(&e.data, "seq")?;
    ensure!(
        e.id.as_deref() == Some(s.to_string().as_str()),
        "`id: {:?}` is not the seq {s}",
        e.id
    );
    Ok(())
}

async fn open(c: &Ctx, sql: &str, extra: &str, headers: &[(&str, &str)]) -> R<Sse> {
    c.sse(&live_path(sql, extra), &Auth::Admin, headers).await
}

async fn items(c: &Ctx) -> R<String> {
    table(
        c,
        "items",
        "id INTEGER PRIMARY KEY, label TEXT, score REAL, done BOOLEAN, n INTEGER",
    )
    .await
}

async fn put(c: &Ctx, t: &str, id: i64, label: &str, n: i64) -> R<u64> {
    let v = c
        .mutate(json!([{"op": "upsert", "table": t, "row": {"id": id, "label": label, "n": n}}]))
        .await?;
    uint(&v, "seq")
}

pub async fn first_event_is_a_snapshot_with_id_equal_to_seq(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    put(&c, &t, 1, "a", 1).await?;
    let mut sse = open(&c, &format!("SELECT id, label FROM {t}"), "", &[]).await?;
    let e = sse.expect("snapshot").await?;
    id_is_seq(&e)?;
    ensure!(
        e.data.get("reset").is_none_or(|r| r == &json!(false)),
        "a first subscription without since has no reset: {}",
        e.raw
    );
    let mut v = View::default();
    v.snapshot(&e.data)?;
    same("columns", &json!(v.columns), &json!(["id", "label"]))?;
    same("keys", &e.data["keys"], &json!([1]))?;
    same("rows", &v.row_values(), &json!([{"id": 1, "label": "a"}]))
}

pub async fn snapshot_carries_column_types(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let mut sse = open(
        &c,
        &format!("SELECT id, label, score, done FROM {t}"),
        "",
        &[],
    )
    .await?;
    let e = sse.expect("snapshot").await?;
    same(
        "types",
        &e.data["types"],
        &json!(["integer", "text", "real", "boolean"]),
    )
}

pub async fn insert_update_delete_send_add_change_remove(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let mut sse = open(
        &c,
        &format!("SELECT id, label FROM {t} WHERE n > 0"),
        "",
        &[],
    )
    .await?;
    let mut v = View::default();
    v.snapshot(&sse.expect("snapshot").await?.data)?;
    let s = put(&c, &t, 1, "a", 1).await?;
    let e = sse.expect("diff").await?;
    id_is_seq(&e)?;
    same("diff seq", &e.data["seq"], &json!(s))?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "add", "key": 1, "row": {"id": 1, "label": "a"}}]),
    )?;
    v.diff(&e.data)?;
    put(&c, &t, 1, "b", 1).await?;
    let e = sse.expect("diff").await?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "change", "key": 1, "row": {"id": 1, "label": "b"}}]),
    )?;
    v.diff(&e.data)?;
    // Leaving the filter is a remove.
    put(&c, &t, 1, "b", 0).await?;
    let e = sse.expect("diff").await?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "remove", "key": 1}]),
    )?;
    v.diff(&e.data)?;
    // A write that does not change the result sends nothing; the next one does.
    put(&c, &t, 2, "x", 0).await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 3, "label": "c", "n": 1}}]))
        .await?;
    let e = sse.expect("diff").await?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "add", "key": 3, "row": {"id": 3, "label": "c"}}]),
    )?;
    v.diff(&e.data)?;
    c.mutate(json!([{"op": "delete", "table": t, "id": 3}]))
        .await?;
    let e = sse.expect("diff").await?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "remove", "key": 3}]),
    )?;
    v.diff(&e.data)
}

pub async fn ordered_view_diffs_carry_index(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    for (id, n) in [(1, 10), (2, 30)] {
        put(&c, &t, id, "x", n).await?;
    }
    let mut sse = open(
        &c,
        &format!("SELECT id, n FROM {t} ORDER BY n DESC LIMIT 3"),
        "",
        &[],
    )
    .await?;
    let mut v = View::default();
    v.snapshot(&sse.expect("snapshot").await?.data)?;
    same(
        "snapshot rows",
        &v.row_values(),
        &json!([{"id": 2, "n": 30}, {"id": 1, "n": 10}]),
    )?;
    put(&c, &t, 3, "x", 20).await?;
    let e = sse.expect("diff").await?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "add", "key": 3, "row": {"id": 3, "n": 20}, "index": 1}]),
    )?;
    v.diff(&e.data)?;
    // A fourth row above the others pushes the last one out of the window.
    put(&c, &t, 4, "x", 40).await?;
    let e = sse.expect("diff").await?;
    v.diff(&e.data)?;
    same(
        "rows",
        &v.row_values(),
        &json!([{"id": 4, "n": 40}, {"id": 2, "n": 30}, {"id": 3, "n": 20}]),
    )?;
    for ch in arr(&e.data, "changes")? {
        ensure!(
            ch.get("index").is_some(),
            "a change of an ordered view without index: {}",
            show(ch)
        );
    }
    Ok(())
}

pub async fn aggregate_view_keys_are_group_values(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    put(&c, &t, 1, "a", 1).await?;
    let mut total = open(&c, &format!("SELECT COUNT(*) AS k FROM {t}"), "", &[]).await?;
    let e = total.expect("snapshot").await?;
    same(
        "keys of an aggregate without GROUP BY",
        &e.data["keys"],
        &json!([[]]),
    )?;
    let mut grouped = open(
        &c,
        &format!("SELECT label, COUNT(*) AS k FROM {t} GROUP BY label"),
        "",
        &[],
    )
    .await?;
    let mut v = View::default();
    let e = grouped.expect("snapshot").await?;
    v.snapshot(&e.data)?;
    same(
        "keys of GROUP BY one column",
        &e.data["keys"],
        &json!(["a"]),
    )?;
    put(&c, &t, 2, "a", 1).await?;
    let e = grouped.expect("diff").await?;
    v.diff(&e.data)?;
    same("rows", &v.row_values(), &json!([{"label": "a", "k": 2}]))
}

pub async fn checksum_matches_rows_after_every_event(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    c.mutate(json!([
        {"op": "insert", "table": t, "row": {"id": 1, "label": "é ü", "score": 1.5, "done": true, "n": -7}},
        {"op": "insert", "table": t, "row": {"id": 2, "label": null, "score": 0.25, "done": false, "n": 0}}]))
        .await?;
    let mut sse = open(
        &c,
        &format!("SELECT id, label, score, done, n FROM {t} WHERE id < 100"),
        "",
        &[],
    )
    .await?;
    let mut v = View::default();
    v.snapshot(&sse.expect("snapshot").await?.data)?;
    let writes = [
        json!([{"op": "insert", "table": t, "row": {"id": 3, "label": "", "score": -2.5, "done": null, "n": 9007199254740993i64}}]),
        json!([{"op": "patch", "table": t, "id": 1, "set": {"score": 3.0, "label": "x"}}]),
        json!([{"op": "delete", "table": t, "id": 2}, {"op": "insert", "table": t, "row": {"id": 4, "n": 1}}]),
        json!([{"op": "upsert", "table": t, "row": {"id": 3, "label": "again", "n": 3}}]),
    ];
    for w in writes {
        c.mutate(w).await?;
        v.diff(&sse.expect("diff").await?.data)?;
    }
    let q = c
        .post(
            "/v1/query",
            json!({"sql": format!("SELECT id, label, score, done, n FROM {t} WHERE id < 100")}),
        )
        .await?;
    let mut want: Vec<Value> = arr(&q, "rows")?.clone();
    let mut got: Vec<Value> = v.rows.iter().map(|(_, r)| r.clone()).collect();
    want.sort_by_key(|r| r["id"].as_i64());
    got.sort_by_key(|r| r["id"].as_i64());
    same(
        "the live rows against a one-shot query",
        &json!(got),
        &json!(want),
    )
}

/// Subscribes, takes one diff, drops the stream, writes twice while away, and returns the
/// seq of the last event seen and of the two missed writes.
async fn miss_two(c: &Ctx, t: &str, sql: &str) -> R<(u64, u64, u64)> {
    let mut sse = open(c, sql, "", &[]).await?;
    let mut v = View::default();
    v.snapshot(&sse.expect("snapshot").await?.data)?;
    put(c, t, 1, "a", 1).await?;
    let e = sse.expect("diff").await?;
    let last = uint(&e.data, "seq")?;
    drop(sse);
    let s1 = put(c, t, 2, "b", 1).await?;
    let s2 = put(c, t, 1, "a2", 1).await?;
    Ok((last, s1, s2))
}

async fn resumed_exactly(mut sse: Sse, s1: u64, s2: u64) -> R {
    let e = sse.next().await?;
    ensure!(
        e.event == "diff",
        "expected the missed diffs, got `event: {}` {}",
        e.event,
        e.raw
    );
    same("first resumed seq", &e.data["seq"], &json!(s1))?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "add", "key": 2, "row": {"id": 2, "label": "b"}}]),
    )?;
    let e = sse.expect("diff").await?;
    same("second resumed seq", &e.data["seq"], &json!(s2))?;
    same(
        "changes",
        &e.data["changes"],
        &json!([{"op": "change", "key": 1, "row": {"id": 1, "label": "a2"}}]),
    )
}

pub async fn resume_with_since_sends_exactly_the_missed_diffs(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let sql = format!("SELECT id, label FROM {t}");
    let (last, s1, s2) = miss_two(&c, &t, &sql).await?;
    let sse = open(&c, &sql, &format!("&since={last}"), &[]).await?;
    resumed_exactly(sse, s1, s2).await
}

pub async fn resume_with_last_event_id_sends_exactly_the_missed_diffs(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let sql = format!("SELECT id, label FROM {t}");
    let (last, s1, s2) = miss_two(&c, &t, &sql).await?;
    let last = last.to_string();
    let sse = open(&c, &sql, "", &[("Last-Event-ID", last.as_str())]).await?;
    resumed_exactly(sse, s1, s2).await
}

async fn reset_for(c: &Ctx, since: &str) -> R {
    let t = items(c).await?;
    put(c, &t, 1, "a", 1).await?;
    let sql = format!("SELECT id, label FROM {t}");
    let mut warm = open(c, &sql, "", &[]).await?;
    warm.expect("snapshot").await?;
    put(c, &t, 2, "b", 1).await?;
    warm.expect("diff").await?;
    let since = since.replace("AHEAD", &(super::seq(c).await? + 1_000_000).to_string());
    let mut sse = open(c, &sql, &format!("&since={since}"), &[]).await?;
    let e = sse.expect("snapshot").await?;
    same("reset", &e.data["reset"], &json!(true))?;
    let mut v = View::default();
    v.snapshot(&e.data)?;
    same("rows", &json!(v.rows.len()), &json!(2))
}

pub async fn since_zero_is_a_reset_snapshot(c: Arc<Ctx>) -> R {
    reset_for(&c, "0").await
}

pub async fn since_ahead_of_the_view_is_a_reset_snapshot(c: Arc<Ctx>) -> R {
    reset_for(&c, "AHEAD").await
}

pub async fn alter_table_sends_a_reset_snapshot(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    put(&c, &t, 1, "a", 1).await?;
    let mut sse = open(&c, &format!("SELECT * FROM {t}"), "", &[]).await?;
    sse.expect("snapshot").await?;
    c.sql(&format!("ALTER TABLE {t} ADD COLUMN extra TEXT"))
        .await?;
    let e = sse.expect("snapshot").await?;
    same("reset", &e.data["reset"], &json!(true))?;
    ensure!(
        arr(&e.data, "columns")?.contains(&json!("extra")),
        "the reset snapshot does not have the new column: {}",
        e.raw
    );
    let mut v = View::default();
    v.snapshot(&e.data)
}

pub async fn drop_table_ends_the_stream_with_an_error_event(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let mut sse = open(&c, &format!("SELECT id FROM {t}"), "", &[]).await?;
    sse.expect("snapshot").await?;
    c.sql(&format!("DROP TABLE {t}")).await?;
    let e = sse.expect("error").await?;
    ensure!(
        e.data
            .pointer("/error/code")
            .and_then(Value::as_str)
            .is_some(),
        "no error code: {}",
        e.raw
    );
    ensure!(
        e.data
            .pointer("/error/message")
            .and_then(Value::as_str)
            .is_some(),
        "no message: {}",
        e.raw
    );
    Ok(())
}

pub async fn idle_stream_sends_heartbeat_comments(c: Arc<Ctx>) -> R {
    let wait = match c.opts.server.live_heartbeat_ms {
        Some(ms) => Duration::from_millis(ms.saturating_mul(3).max(200)),
        None => Duration::from_secs(3),
    };
    if wait > Duration::from_secs(15) {
        skip!("--live-heartbeat-ms is {wait:?}/3: too slow to wait for");
    }
    let t = items(&c).await?;
    let mut sse = open(&c, &format!("SELECT id FROM {t}"), "", &[]).await?;
    sse.expect("snapshot").await?;
    match sse.next_any(wait).await {
        Ok(Some(e)) if e.is_comment() => Ok(()),
        Ok(Some(e)) => fail!("expected a `:` heartbeat on an idle stream, got {}", e.raw),
        Ok(None) => fail!("the stream ended"),
        Err(_) if c.opts.server.live_heartbeat_ms.is_none() => {
            skip!("no heartbeat within {wait:?} (the server's --live-heartbeat-ms is longer; pass it to wait for it)")
        }
        Err(e) => Err(e),
    }
}

pub async fn backlog_becomes_a_reset_snapshot(c: Arc<Ctx>) -> R {
    match c.opts.server.live_queue_events {
        Some(n) if n <= 16 => {}
        _ => skip!("needs a server with a small --live-queue-events (≤ 16), passed to the suite"),
    }
    let t = table(&c, "big", "id INTEGER PRIMARY KEY, pad TEXT").await?;
    let sql = format!("SELECT id, pad FROM {t}");
    let mut sse = open(&c, &sql, "", &[]).await?;
    let mut v = View::default();
    v.snapshot(&sse.expect("snapshot").await?.data)?;
    // Fill the socket buffers and the subscriber's queue without reading. Loopback TCP
    // autotunes its receive buffer up to `tcp_rmem`'s maximum (32 MiB on some kernels), so
    // send twice what both socket buffers can hold, plus a margin, in diffs of 512 KiB. The
    // pad is pseudo-random hex so that no compression on the way shrinks it.
    let buffers_bytes = socket_buffers_max_bytes();
    let diffs = (2 * buffers_bytes + (16 << 20)).div_ceil(PAD_BYTES);
    let pad = incompressible_hex(PAD_BYTES);
    for i in 0..diffs {
        c.mutate(
            json!([{"op": "upsert", "table": t, "row": {"id": i % 8, "pad": format!("{i}{pad}")}}]),
        )
        .await?;
    }
    let last = super::seq(&c).await?;
    // The live thread may still be behind the writes (each diff renders half a MiB of
    // JSON): a second subscriber that reads until it saw the last write makes sure every
    // diff was pushed to the first one's queue before that one starts reading.
    let mut probe = open(&c, &sql, "", &[]).await?;
    let mut caught_up = View::default();
    caught_up.snapshot(&probe.expect("snapshot").await?.data)?;
    while caught_up.seq < last {
        let e = probe.next().await?;
        match e.event.as_str() {
            "diff" => caught_up.diff(&e.data)?,
            "snapshot" => caught_up.snapshot(&e.data)?,
            other => fail!("unexpected event {other} on the second subscription"),
        }
    }
    drop(probe);
    let mut saw_reset = false;
    for _ in 0..400 {
        let e = sse.next().await?;
        match e.event.as_str() {
            "snapshot" => {
                same("reset", &e.data["reset"], &json!(true))?;
                saw_reset = true;
                v.snapshot(&e.data)?;
            }
            "diff" => v.diff(&e.data)?,
            "error" => {
                same("code", &e.data["error"]["code"], &json!("slow_subscriber"))?;
                return Ok(());
            }
            other => fail!("unexpected event {other}"),
        }
        if v.seq >= last {
            break;
        }
    }
    ensure!(
        saw_reset,
        "{diffs} unread diffs of {} KiB never turned into a reset snapshot",
        PAD_BYTES >> 10
    );
    Ok(())
}

/// The size of each row written by [`backlog_becomes_a_reset_snapshot`].
const PAD_BYTES: usize = 512 << 10; // half the default --max-row-bytes

/// The most a loopback connection can buffer in its two sockets: the kernel's receive and
/// send buffer maxima (Linux `tcp_rmem` / `tcp_wmem`), or 8 MiB each where they cannot be read.
fn socket_buffers_max_bytes() -> usize {
    let max = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.split_whitespace().nth(2)?.parse::<usize>().ok())
            .unwrap_or(8 << 20)
    };
    max("/proc/sys/net/ipv4/tcp_rmem") + max("/proc/sys/net/ipv4/tcp_wmem")
}

/// `len` hex digits from a xorshift generator: text that neither gzip nor zstd can shrink
/// much below half.
fn incompressible_hex(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x >> 60) as usize])
        })
        .collect()
}

pub async fn unsupported_query_is_a_json_error_before_the_stream(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let resp = c
        .sse_or_error(
            &live_path(&format!("SELECT id FROM {t} UNION SELECT id FROM {t}"), ""),
            &Auth::Admin,
            &[],
        )
        .await?;
    let Err(resp) = resp else {
        fail!("an unsupported query opened a stream")
    };
    let e = resp.err(400, "unsupported")?;
    names(&e, &["UNION", "union"])
}

pub async fn unknown_table_is_not_found_before_the_stream(c: Arc<Ctx>) -> R {
    let resp = c
        .sse_or_error(
            &live_path(&format!("SELECT id FROM {}", c.name("missing")), ""),
            &Auth::Admin,
            &[],
        )
        .await?;
    let Err(resp) = resp else {
        fail!("a query of a missing table opened a stream")
    };
    resp.err(404, "not_found")?;
    Ok(())
}

pub async fn bad_params_is_bad_request_before_the_stream(c: Arc<Ctx>) -> R {
    let t = items(&c).await?;
    let resp = c
        .sse_or_error(
            &live_path(&format!("SELECT id FROM {t} WHERE n = $1"), "&params=%5B1"),
            &Auth::Admin,
            &[],
        )
        .await?;
    let Err(resp) = resp else {
        fail!("malformed params opened a stream")
    };
    resp.err(400, "bad_request")?;
    Ok(())
}
