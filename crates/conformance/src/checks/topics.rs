//! Topics over HTTP and SSE: create/alter/list/delete, append, read with tag filters and
//! horizon, watch with replay, filters, `Last-Event-ID` resume and its end events.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{arr, client, has, names, same, uint};
use crate::client::{Auth, Sse};
use crate::{ensure, fail, show, skip, Ctx, R};

pub(crate) async fn topic(c: &Ctx, body: Value) -> R<String> {
    let name = c.name("tp");
    c.call("PUT", &format!("/v1/topics/{name}"), Some(body))
        .await?
        .ok()?;
    Ok(name)
}

pub(crate) async fn append(c: &Ctx, t: &str, records: Value) -> R<Value> {
    c.post(
        &format!("/v1/topics/{t}/records"),
        json!({"records": records}),
    )
    .await
}

/// Appends one record per tag list, data `{"i": i}`.
async fn append_each(c: &Ctx, t: &str, tags: &[&[&str]]) -> R {
    for (i, tags) in tags.iter().enumerate() {
        append(c, t, json!([{"tags": tags, "data": {"i": i}}])).await?;
    }
    Ok(())
}

const INFO: &[&str] = &[
    "name",
    "first",
    "last",
    "next",
    "records",
    "bytes",
    "retain_records",
    "retain_bytes",
    "retain_secs",
];

pub async fn put_creates_then_alters_and_no_change_has_null_seq(c: Arc<Ctx>) -> R {
    let name = c.name("tp");
    let path = format!("/v1/topics/{name}");
    let v = c
        .call("PUT", &path, Some(json!({"retain_records": 10})))
        .await?
        .ok()?;
    uint(&v, "seq")?;
    same("created", &v["created"], &json!(true))?;
    has(&v["topic"], INFO)?;
    same(
        "topic.retain_records",
        &v["topic"]["retain_records"],
        &json!(10),
    )?;
    let v = c
        .call("PUT", &path, Some(json!({"retain_records": 20})))
        .await?
        .ok()?;
    uint(&v, "seq")?;
    same("created", &v["created"], &json!(false))?;
    same(
        "topic.retain_records",
        &v["topic"]["retain_records"],
        &json!(20),
    )?;
    let v = c
        .call("PUT", &path, Some(json!({"retain_records": 20})))
        .await?
        .ok()?;
    same("seq of a PUT that changes nothing", &v["seq"], &Value::Null)
}

pub async fn get_and_list_answer_topic_info(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let one = c.get(&format!("/v1/topics/{t}")).await?;
    has(&one, INFO)?;
    same("first", &one["first"], &json!(0))?;
    same("last before any append", &one["last"], &Value::Null)?;
    same("next", &one["next"], &json!(0))?;
    append(&c, &t, json!([{"data": 1}, {"data": 2}])).await?;
    let list = c.get("/v1/topics").await?;
    uint(&list, "seq")?;
    let Some(info) = arr(&list, "topics")?.iter().find(|x| x["name"] == json!(t)) else {
        fail!("topic {t} is not listed");
    };
    has(info, INFO)?;
    same("last", &info["last"], &json!(1))?;
    same("next", &info["next"], &json!(2))?;
    same("records", &info["records"], &json!(2))
}

pub async fn bad_topic_name_is_bad_request(c: Arc<Ctx>) -> R {
    let long = format!("{}_{}", c.prefix, "x".repeat(130));
    c.call("PUT", &format!("/v1/topics/{long}"), None)
        .await?
        .err(400, "bad_request")?;
    c.call("PUT", &format!("/v1/topics/{}%21bang", c.prefix), None)
        .await?
        .err(400, "bad_request")?;
    Ok(())
}

pub async fn unknown_topic_is_not_found(c: Arc<Ctx>) -> R {
    let name = c.name("missing");
    c.call("GET", &format!("/v1/topics/{name}"), None)
        .await?
        .err(404, "not_found")?;
    c.call("GET", &format!("/v1/topics/{name}/records"), None)
        .await?
        .err(404, "not_found")?;
    c.call(
        "POST",
        &format!("/v1/topics/{name}/records"),
        Some(json!({"records": [{"data": 1}]})),
    )
    .await?
    .err(404, "not_found")?;
    Ok(())
}

pub async fn delete_answers_seq_then_topic_is_gone(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let v = c
        .call("DELETE", &format!("/v1/topics/{t}"), None)
        .await?
        .ok()?;
    uint(&v, "seq")?;
    c.call("GET", &format!("/v1/topics/{t}"), None)
        .await?
        .err(404, "not_found")?;
    c.call("DELETE", &format!("/v1/topics/{t}"), None)
        .await?
        .err(404, "not_found")?;
    Ok(())
}

pub async fn append_answers_consecutive_offsets(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let v = append(
        &c,
        &t,
        json!([{"tags": ["a"], "data": {"x": 1}}, {"data": 42}, {}]),
    )
    .await?;
    uint(&v, "seq")?;
    same("first", &v["first"], &json!(0))?;
    same("last", &v["last"], &json!(2))?;
    let v = append(&c, &t, json!([{"data": "next"}])).await?;
    same("first of the second append", &v["first"], &json!(3))
}

pub async fn append_with_bad_tag_is_bad_request_with_op(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let e = c
        .call(
            "POST",
            &format!("/v1/topics/{t}/records"),
            Some(json!({"records": [{"tags": ["ok"]}, {"tags": ["bad*"]}]})),
        )
        .await?
        .err(400, "bad_request")?;
    same("op", &e["op"], &json!(1))?;
    let info = c.get(&format!("/v1/topics/{t}")).await?;
    same("next after the refused append", &info["next"], &json!(0))
}

pub async fn record_over_max_record_bytes_is_limit(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    // 1 MiB + 64 KiB of data: over the default --max-record-bytes (1 MiB).
    let big = "r".repeat((1 << 20) + (64 << 10));
    let resp = c
        .call(
            "POST",
            &format!("/v1/topics/{t}/records"),
            Some(json!({"records": [{"data": big}]})),
        )
        .await?;
    if resp.status == 200 {
        skip!("the server takes records over 1 MiB (its --max-record-bytes is larger than the default)");
    }
    let e = resp.err(413, "limit")?;
    names(
        &e,
        &["max-record-bytes", "max-body-bytes", "max-commit-bytes"],
    )
}

pub async fn read_pages_in_offset_order_with_next(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append(&c, &t, json!([{"data": 0}, {"data": 1}, {"data": 2}])).await?;
    let v = c.get(&format!("/v1/topics/{t}/records?limit=2")).await?;
    same("first", &v["first"], &json!(0))?;
    same("next", &v["next"], &json!(2))?;
    let recs = arr(&v, "records")?;
    ensure!(
        recs.len() == 2,
        "a page of limit 2 has {} records",
        recs.len()
    );
    for (i, r) in recs.iter().enumerate() {
        has(r, &["offset", "ts", "tags", "data"])?;
        same("offset", &r["offset"], &json!(i))?;
        same("data", &r["data"], &json!(i))?;
    }
    let v = c.get(&format!("/v1/topics/{t}/records?from=2")).await?;
    same(
        "offsets from 2",
        &json!(arr(&v, "records")?
            .iter()
            .map(|r| r["offset"].clone())
            .collect::<Vec<_>>()),
        &json!([2]),
    )?;
    let v = c.get(&format!("/v1/topics/{t}/records?from=3")).await?;
    same("records at the end", &v["records"], &json!([]))?;
    same("next at the end", &v["next"], &json!(3))
}

pub async fn read_with_tag_filter_returns_only_matching_records(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append_each(
        &c,
        &t,
        &[&["user:1"], &["room:7"], &[], &["user:2", "x"], &["room:8"]],
    )
    .await?;
    let v = c
        .get(&format!("/v1/topics/{t}/records?tag=user:2&tag=room:*"))
        .await?;
    let offsets: Vec<Value> = arr(&v, "records")?
        .iter()
        .map(|r| r["offset"].clone())
        .collect();
    same(
        "offsets matching user:2 or room:*",
        &json!(offsets),
        &json!([1, 3, 4]),
    )?;
    let v = c.get(&format!("/v1/topics/{t}/records?tag=*")).await?;
    same(
        "records matching *",
        &json!(arr(&v, "records")?.len()),
        &json!(5),
    )
}

pub async fn read_below_first_is_horizon_with_first(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({"retain_records": 2})).await?;
    append_each(&c, &t, &[&[], &[], &[], &[]]).await?;
    let e = c
        .call("GET", &format!("/v1/topics/{t}/records?from=0"), None)
        .await?
        .err(410, "horizon")?;
    same("first", &e["first"], &json!(2))
}

pub async fn read_past_next_is_bad_request(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append_each(&c, &t, &[&[]]).await?;
    c.call("GET", &format!("/v1/topics/{t}/records?from=5"), None)
        .await?
        .err(400, "bad_request")?;
    Ok(())
}

async fn watch(c: &Ctx, t: &str, query: &str, headers: &[(&str, &str)]) -> R<Sse> {
    c.sse(
        &format!("/v1/topics/{t}/watch{query}"),
        &Auth::Admin,
        headers,
    )
    .await
}

async fn record(sse: &mut Sse, offset: u64) -> R<Value> {
    let e = sse.expect("record").await?;
    has(&e.data, &["offset", "ts", "tags", "data"])?;
    same("record offset", &e.data["offset"], &json!(offset))?;
    same("record id", &json!(e.id), &json!(offset.to_string()))?;
    Ok(e.data)
}

pub async fn watch_says_watching_then_streams_records(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append_each(&c, &t, &[&["old"]]).await?;
    let mut sse = watch(&c, &t, "", &[]).await?;
    let w = sse.expect("watching").await?;
    same("watching", &w.data, &json!({"topic": t, "next": 1}))?;
    append(&c, &t, json!([{"tags": ["a"], "data": {"text": "hi"}}])).await?;
    let r = record(&mut sse, 1).await?;
    same("tags", &r["tags"], &json!(["a"]))?;
    same("data", &r["data"], &json!({"text": "hi"}))
}

pub async fn watch_replays_from_and_filters_tags(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append_each(&c, &t, &[&["user:1"], &["user:2"], &["room:1"]]).await?;
    let mut sse = watch(&c, &t, "?from=0&tag=user:2&tag=room:*", &[]).await?;
    let w = sse.expect("watching").await?;
    same("watching.next", &w.data["next"], &json!(0))?;
    record(&mut sse, 1).await?;
    record(&mut sse, 2).await?;
    append_each(&c, &t, &[&["user:1"], &["room:9"]]).await?;
    record(&mut sse, 4).await?;
    Ok(())
}

pub async fn watch_resumes_after_last_event_id(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    append_each(&c, &t, &[&[], &[], &[]]).await?;
    // Last-Event-ID wins over from.
    let mut sse = watch(&c, &t, "?from=0", &[("Last-Event-ID", "1")]).await?;
    let w = sse.expect("watching").await?;
    same("watching.next", &w.data["next"], &json!(2))?;
    record(&mut sse, 2).await?;
    Ok(())
}

pub async fn watch_below_first_is_horizon_before_the_stream(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({"retain_records": 1})).await?;
    append_each(&c, &t, &[&[], &[], &[]]).await?;
    let resp = c
        .sse_or_error(&format!("/v1/topics/{t}/watch?from=0"), &Auth::Admin, &[])
        .await?;
    let Err(resp) = resp else {
        fail!("a watch below the horizon opened a stream")
    };
    let e = resp.err(410, "horizon")?;
    same("first", &e["first"], &json!(2))
}

pub async fn watch_of_dropped_topic_ends_with_not_found(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let mut sse = watch(&c, &t, "", &[]).await?;
    sse.expect("watching").await?;
    c.call("DELETE", &format!("/v1/topics/{t}"), None)
        .await?
        .ok()?;
    let e = sse.expect("error").await?;
    same("code", &e.data["error"]["code"], &json!("not_found"))
}

pub async fn lagging_watcher_ends_with_lagging_and_next(c: Arc<Ctx>) -> R {
    let n = match c.opts.server.watch_queue_records {
        Some(n) if n <= 64 => n,
        _ => skip!("needs a server with a small --watch-queue-records (≤ 64), passed to the suite"),
    };
    let t = topic(&c, json!({})).await?;
    let mut sse = watch(&c, &t, "", &[]).await?;
    sse.expect("watching").await?;
    // Without reading: appends of 256 KiB records (over 40 MiB: more than loopback socket
    // buffers hold) until the watcher's queue is full.
    let pad = "w".repeat(256 << 10);
    for _ in 0..(n * 4 + 160) {
        append(&c, &t, json!([{"data": pad}])).await?;
    }
    for _ in 0..10_000 {
        let e = sse.next().await?;
        match e.event.as_str() {
            "record" => continue,
            "error" => {
                same("code", &e.data["error"]["code"], &json!("lagging"))?;
                uint(&e.data["error"], "next")?;
                return Ok(());
            }
            other => fail!("unexpected event {other}: {}", e.raw),
        }
    }
    fail!("the watcher was never cut off")
}

pub async fn client_read_without_rules_is_forbidden(c: Arc<Ctx>) -> R {
    let (token, _) = client(&c, None, json!({}))?;
    let t = topic(&c, json!({})).await?;
    let auth = Auth::Bearer(token);
    c.call_as("GET", &format!("/v1/topics/{t}/records"), None, &auth)
        .await?
        .err(403, "forbidden")?;
    c.call_as(
        "POST",
        &format!("/v1/topics/{t}/records"),
        Some(json!({"records": [{"data": 1}]})),
        &auth,
    )
    .await?
    .err(403, "forbidden")?;
    let resp = c
        .sse_or_error(&format!("/v1/topics/{t}/watch"), &auth, &[])
        .await?;
    let Err(resp) = resp else {
        fail!("a watch without read rules opened a stream")
    };
    resp.err(403, "forbidden")?;
    Ok(())
}

pub async fn client_read_and_append_within_rules(c: Arc<Ctx>) -> R {
    let (token, sub) = client(&c, None, json!({}))?;
    let t = topic(
        &c,
        json!({"read": ["user:{auth.sub}"], "append": ["user:{auth.sub}"]}),
    )
    .await?;
    let info = c.get(&format!("/v1/topics/{t}")).await?;
    same("read rules", &info["read"], &json!(["user:{auth.sub}"]))?;
    same("append rules", &info["append"], &json!(["user:{auth.sub}"]))?;
    let auth = Auth::Bearer(token);
    let mine = format!("user:{sub}");
    let v = c
        .call_as(
            "POST",
            &format!("/v1/topics/{t}/records"),
            Some(json!({"records": [{"tags": [mine], "data": 1}]})),
            &auth,
        )
        .await?
        .ok()?;
    same("first", &v["first"], &json!(0))?;
    let e = c
        .call_as(
            "POST",
            &format!("/v1/topics/{t}/records"),
            Some(json!({"records": [{"tags": ["user:someone-else"], "data": 2}]})),
            &auth,
        )
        .await?
        .err(403, "forbidden")?;
    let _ = show(&e);
    let v = c
        .call_as(
            "GET",
            &format!("/v1/topics/{t}/records?tag={mine}"),
            None,
            &auth,
        )
        .await?
        .ok()?;
    same("records read", &json!(arr(&v, "records")?.len()), &json!(1))?;
    c.call_as("GET", &format!("/v1/topics/{t}/records"), None, &auth)
        .await?
        .err(403, "forbidden")?;
    Ok(())
}

pub async fn record_with_more_than_16_tags_is_limit_with_op(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let tags: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let e = c
        .call(
            "POST",
            &format!("/v1/topics/{t}/records"),
            Some(json!({"records": [{"data": 1}, {"tags": tags}]})),
        )
        .await?
        .err(413, "limit")?;
    same("op", &e["op"], &json!(1))?;
    names(&e, &["tags_per_record_max"])
}

pub async fn bad_tag_pattern_is_bad_request(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    c.call("GET", &format!("/v1/topics/{t}/records?tag=a*b"), None)
        .await?
        .err(400, "bad_request")?;
    let resp = c
        .sse_or_error(&format!("/v1/topics/{t}/watch?tag=a*b"), &Auth::Admin, &[])
        .await?;
    let Err(resp) = resp else {
        fail!("a watch with a bad tag pattern opened a stream")
    };
    resp.err(400, "bad_request")?;
    Ok(())
}

pub async fn read_limit_over_max_page_rows_is_limit(c: Arc<Ctx>) -> R {
    let t = topic(&c, json!({})).await?;
    let e = c
        .call(
            "GET",
            &format!("/v1/topics/{t}/records?limit=100000000"),
            None,
        )
        .await?
        .err(413, "limit")?;
    names(&e, &["max-page-rows"])
}
