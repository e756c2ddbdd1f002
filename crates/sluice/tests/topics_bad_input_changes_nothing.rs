//! Bad topic input against the real binary: each request gets its structured error (`code`,
//! a `message` naming the limit and its flag where one is crossed) and nothing is appended
//! or created — checked with `GET /v1/topics` and a read at the end. Covers unknown topics,
//! bad topic names, bad record tags (`*`, empty, over 128 bytes, over 16 tags), an oversized
//! record (`--max-record-bytes`) and batch (`--max-append-records`), a bad record inside a good
//! batch, bad offsets (past `next`, negative, not a number), bad filters and bad retention —
//! over HTTP, SSE and both WebSocket encodings — plus `--max-topics`, one watch per topic
//! per connection, `--live-subscriptions-per-connection`, and PUTs that change nothing
//! taking no seq.

mod common;

use common::topics::assert_no_panic;

use common::topics::{Enc, Ws};
use common::{Api, Server, TempDir};
use serde_json::{json, Value};

const RECORD_BYTES_MAX: usize = 1000;
const APPEND_RECORDS_MAX: usize = 10;
const BODY_BYTES_MAX: usize = 6000;
const COMMIT_BYTES_MAX: usize = 4000;

/// (what, topic, records, status, code, names in the message).
type BadAppend = (
    String,
    &'static str,
    Value,
    u16,
    &'static str,
    Vec<&'static str>,
);
/// (what, topic name, body, status, code, names in the message).
type DdlCase = (
    &'static str,
    String,
    Option<Value>,
    u16,
    &'static str,
    Vec<&'static str>,
);
/// (what, query pairs, status, code, names in the message).
type ReadCase = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    u16,
    &'static str,
    Vec<&'static str>,
);

/// Asserts a structured error: `status`, `code`, and a message containing each of `names`.
fn assert_error(
    what: &str,
    status: u16,
    body: &Value,
    want_status: u16,
    code: &str,
    names: &[&str],
) {
    assert_eq!(status, want_status, "{what}: {body}");
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: an error has a message: {body}"));
    for n in names {
        assert!(
            message.contains(n),
            "{what}: the message names {n:?}: {body}"
        );
    }
}

fn rec(tags: Value, data: Value) -> Value {
    json!({"tags": tags, "data": data})
}

/// Appends that must be refused over HTTP and both WebSocket encodings:
/// (what, topic, records, status, code, names in the message).
fn bad_appends() -> Vec<BadAppend> {
    let good = rec(json!(["a"]), json!(1));
    let long_tag = "t".repeat(129);
    let many_tags: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let big = "x".repeat(RECORD_BYTES_MAX);
    let batch: Vec<Value> = (0..=APPEND_RECORDS_MAX)
        .map(|i| json!({"data": i}))
        .collect();
    vec![
        (
            "unknown topic".into(),
            "nope",
            json!([good]),
            404,
            "not_found",
            vec!["nope"],
        ),
        (
            "a `*` in a record tag".into(),
            "t",
            json!([rec(json!(["room:*"]), json!(1))]),
            400,
            "bad_request",
            vec!["room:*"],
        ),
        (
            "a lone `*` tag".into(),
            "t",
            json!([rec(json!(["*"]), json!(1))]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "an empty tag".into(),
            "t",
            json!([rec(json!([""]), json!(1))]),
            400,
            "bad_request",
            vec!["128"],
        ),
        (
            "a tag with a space".into(),
            "t",
            json!([rec(json!(["a b"]), json!(1))]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "a non-ASCII tag".into(),
            "t",
            json!([rec(json!(["é"]), json!(1))]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "a 129-byte tag".into(),
            "t",
            json!([rec(json!([long_tag]), json!(1))]),
            400,
            "bad_request",
            vec!["128"],
        ),
        (
            "17 tags".into(),
            "t",
            json!([rec(json!(many_tags), json!(1))]),
            413,
            "limit",
            vec!["16"],
        ),
        (
            "a tag that is not a string".into(),
            "t",
            json!([rec(json!([7]), json!(1))]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "tags not a list".into(),
            "t",
            json!([rec(json!("a"), json!(1))]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "a record with a misspelt field".into(),
            "t",
            json!([{"tags": ["a"], "date": 1}]),
            400,
            "bad_request",
            vec!["date"],
        ),
        (
            "a record that is not an object".into(),
            "t",
            json!([5]),
            400,
            "bad_request",
            vec![],
        ),
        (
            "records not a list".into(),
            "t",
            json!({"data": 1}),
            400,
            "bad_request",
            vec![],
        ),
        (
            "no records".into(),
            "t",
            json!([]),
            400,
            "bad_request",
            vec![],
        ),
        (
            format!("a record over --max-record-bytes ({RECORD_BYTES_MAX})"),
            "t",
            json!([good, rec(json!(["a"]), json!(big))]),
            413,
            "limit",
            vec!["--max-record-bytes"],
        ),
        (
            format!(
                "{} records, over --max-append-records",
                APPEND_RECORDS_MAX + 1
            ),
            "t",
            json!(batch),
            413,
            "limit",
            vec!["--max-append-records"],
        ),
        (
            format!("a batch over --max-body-bytes ({BODY_BYTES_MAX})"),
            "t",
            json!((0..8)
                .map(|_| rec(json!(["a"]), json!("y".repeat(900))))
                .collect::<Vec<_>>()),
            413,
            "limit",
            vec!["--max-body-bytes"],
        ),
        (
            format!("a batch over --max-commit-bytes ({COMMIT_BYTES_MAX})"),
            "t",
            json!((0..5)
                .map(|_| rec(json!(["a"]), json!("z".repeat(900))))
                .collect::<Vec<_>>()),
            413,
            "limit",
            vec!["--max-commit-bytes"],
        ),
        (
            "a bad record after good ones".into(),
            "t",
            json!([good, good, rec(json!(["ok", "bad*"]), json!(1))]),
            400,
            "bad_request",
            vec!["bad*"],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_bad_input_changes_nothing() {
    let dir = TempDir::new("topics-bad");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--max-record-bytes",
            &RECORD_BYTES_MAX.to_string(),
            "--max-append-records",
            &APPEND_RECORDS_MAX.to_string(),
            "--topic-retain-bytes",
            "100000",
            "--max-topics",
            "2",
            "--live-subscriptions-per-connection",
            "1",
            "--max-body-bytes",
            &BODY_BYTES_MAX.to_string(),
            "--max-commit-bytes",
            &COMMIT_BYTES_MAX.to_string(),
        ],
    );
    let api = server.api();
    let (status, body) = api.put_topic("t", None).await;
    assert_eq!(status, 200, "{body}");

    topic_ddl(&api).await;
    appends_over_http(&api).await;
    for enc in [Enc::Json, Enc::MsgPack] {
        appends_and_watches_over_ws(&api, server.addr, enc).await;
    }
    reads_and_watches(&api).await;

    let (s, b) = api.delete_topic("second").await;
    assert_eq!(s, 200, "{b}");
    // Nothing was appended or created by any of it.
    let topics = api.topics().await;
    assert_eq!(topics.keys().collect::<Vec<_>>(), vec!["t"], "{topics:?}");
    let t = &topics["t"];
    assert_eq!(
        (&t["first"], &t["next"], &t["records"]),
        (&json!(0), &json!(0), &json!(0)),
        "{t}"
    );
    let (status, body) = api.read_records("t", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["records"], json!([]), "{body}");
    assert_eq!(body["next"], 0, "{body}");

    // The server is fine: a good append now gets offset 0.
    assert_eq!(
        api.append_ok("t", &json!([{"tags": ["a"], "data": 1}]), None)
            .await,
        (0, 0)
    );
    assert_no_panic(&server);
}

async fn topic_ddl(api: &Api) {
    let seq = api.health_seq().await;
    let cases: Vec<DdlCase> = vec![
        (
            "a name with a space",
            "a%20b".into(),
            None,
            400,
            "bad_request",
            vec!["128"],
        ),
        (
            "a name with a slash-like char",
            "a%2Fb".into(),
            None,
            400,
            "bad_request",
            vec![],
        ),
        (
            "a non-ASCII name",
            "%C3%A9".into(),
            None,
            400,
            "bad_request",
            vec![],
        ),
        (
            "a 129-byte name",
            "n".repeat(129),
            None,
            400,
            "bad_request",
            vec!["128"],
        ),
        (
            "retain_records 0",
            "u".into(),
            Some(json!({"retain_records": 0})),
            400,
            "bad_request",
            vec!["retain_records"],
        ),
        (
            "retain_bytes 0",
            "u".into(),
            Some(json!({"retain_bytes": 0})),
            400,
            "bad_request",
            vec!["retain_bytes"],
        ),
        (
            "negative retain_secs",
            "u".into(),
            Some(json!({"retain_secs": -1})),
            400,
            "bad_request",
            vec!["retain_secs"],
        ),
        (
            "retain_records not a number",
            "u".into(),
            Some(json!({"retain_records": "many"})),
            400,
            "bad_request",
            vec!["retain_records"],
        ),
        (
            "retain_bytes over --topic-retain-bytes",
            "u".into(),
            Some(json!({"retain_bytes": 100_001})),
            413,
            "limit",
            vec!["--topic-retain-bytes"],
        ),
        (
            "an unknown field",
            "u".into(),
            Some(json!({"retain": 5})),
            400,
            "bad_request",
            vec!["retain"],
        ),
        (
            "a body that is not an object",
            "u".into(),
            Some(json!([1])),
            400,
            "bad_request",
            vec![],
        ),
    ];
    for (what, name, body, status, code, names) in cases {
        let (s, b) = api.put_topic(&name, body.as_ref()).await;
        assert_error(&format!("PUT topic: {what}"), s, &b, status, code, &names);
    }
    // --max-topics 2: "t" exists, one more fits, the third is refused by name.
    let (s, b) = api.put_topic("second", None).await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = api.put_topic("third", None).await;
    assert_error(
        "a topic over --max-topics",
        s,
        &b,
        413,
        "limit",
        &["--max-topics"],
    );
    let (s, b) = api.delete_topic("nope").await;
    assert_error(
        "DELETE an unknown topic",
        s,
        &b,
        404,
        "not_found",
        &["nope"],
    );
    let (s, b) = api.get("/v1/topics/nope").await;
    assert_error("GET an unknown topic", s, &b, 404, "not_found", &["nope"]);
    // A PUT that changes nothing takes no seq; a change answers created: false.
    let (s, b) = api.put_topic("t", None).await;
    assert_eq!(
        (s, &b["seq"], &b["created"]),
        (200, &Value::Null, &json!(false)),
        "{b}"
    );
    let (s, b) = api
        .put_topic("t", Some(&json!({"retain_records": 10})))
        .await;
    assert_eq!((s, &b["created"]), (200, &json!(false)), "{b}");
    assert!(b["seq"].as_u64().is_some(), "a change takes a seq: {b}");
    assert_eq!(b["topic"]["retain_records"], 10, "{b}");
    let (s, b) = api
        .put_topic("t", Some(&json!({"retain_records": 10})))
        .await;
    assert_eq!(
        (s, &b["seq"]),
        (200, &Value::Null),
        "the same retention again: {b}"
    );
    let info = api.get_ok("/v1/topics/t").await;
    for field in [
        "name",
        "first",
        "next",
        "records",
        "bytes",
        "retain_records",
        "retain_bytes",
        "retain_secs",
    ] {
        assert!(
            info.get(field).is_some(),
            "GET /v1/topics/t has {field}: {info}"
        );
    }
    // Only the PUT of "second" and the retention change took seqs.
    assert_eq!(api.health_seq().await, seq + 2);
}

async fn appends_over_http(api: &Api) {
    for (what, topic, records, status, code, names) in bad_appends() {
        let (s, b) = api.append(topic, &records, None).await;
        assert_error(&format!("HTTP append: {what}"), s, &b, status, code, &names);
    }
    let cases: Vec<(&str, Value)> = vec![
        (
            "a bad durability",
            json!({"records": [{"data": 1}], "durability": "later"}),
        ),
        (
            "an unknown field",
            json!({"records": [{"data": 1}], "extra": 1}),
        ),
        ("no records field", json!({"data": 1})),
        ("a body that is not an object", json!([{"data": 1}])),
    ];
    for (what, body) in cases {
        let (s, b) = api.post("/v1/topics/t/records", &body).await;
        assert_error(
            &format!("HTTP append: {what}"),
            s,
            &b,
            400,
            "bad_request",
            &[],
        );
    }
    let resp = api
        .client
        .post(api.url("/v1/topics/t/records"))
        .header("content-type", "application/json")
        .body("{\"records\": [{\"data\": 1}")
        .send()
        .await
        .unwrap();
    let s = resp.status().as_u16();
    let b: Value = resp.json().await.expect("a JSON error");
    assert_error(
        "HTTP append: malformed JSON",
        s,
        &b,
        400,
        "bad_request",
        &[],
    );
}

async fn appends_and_watches_over_ws(api: &Api, addr: std::net::SocketAddr, enc: Enc) {
    let mut ws = Ws::connect(addr, enc).await;
    let mut id = 0u64;
    for (what, topic, records, _status, code, names) in bad_appends() {
        id += 1;
        ws.send(json!({"id": id, "type": "append", "topic": topic, "records": records}))
            .await;
        // A frame over --max-body-bytes is not decoded, so its error has "id": null
        // (docs/protocol.md "Errors").
        let reply = ws.next().await.expect("a reply");
        assert!(
            reply["id"] == json!(id) || (reply["id"].is_null() && reply["type"] == "error"),
            "{enc:?} append: {what}: an unexpected message {reply}"
        );
        assert_eq!(reply["type"], "error", "{enc:?} append: {what}: {reply}");
        assert_error(
            &format!("{enc:?} append: {what}"),
            0,
            &reply,
            0,
            code,
            &names,
        );
    }
    let watches: Vec<(&str, Value, &str)> = vec![
        ("an unknown topic", json!({"topic": "nope"}), "not_found"),
        // A name that cannot exist: `not_found` (or `bad_request` naming the rule).
        (
            "a bad topic name",
            json!({"topic": "a b"}),
            "not_found|bad_request",
        ),
        (
            "`*` inside a pattern",
            json!({"topic": "t", "tags": ["a*b"]}),
            "bad_request",
        ),
        (
            "`**`",
            json!({"topic": "t", "tags": ["room:**"]}),
            "bad_request",
        ),
        (
            "an empty pattern",
            json!({"topic": "t", "tags": [""]}),
            "bad_request",
        ),
        (
            "a pattern with a space",
            json!({"topic": "t", "tags": ["a b"]}),
            "bad_request",
        ),
        (
            "tags not a list",
            json!({"topic": "t", "tags": "a"}),
            "bad_request",
        ),
        (
            "from past next",
            json!({"topic": "t", "from": 5}),
            "bad_request",
        ),
        (
            "a negative from",
            json!({"topic": "t", "from": -1}),
            "bad_request",
        ),
        (
            "from not a number",
            json!({"topic": "t", "from": "0"}),
            "bad_request",
        ),
        (
            "65 patterns",
            json!({"topic": "t", "tags": (0..65).map(|i| format!("p{i}")).collect::<Vec<_>>()}),
            "limit",
        ),
        ("no qid", json!({"topic": "t", "qid": null}), "bad_request"),
    ];
    for (what, fields, code) in watches {
        id += 1;
        let mut req = json!({"id": id, "type": "watch", "qid": format!("w{id}")});
        for (k, v) in fields.as_object().unwrap() {
            if v.is_null() {
                req.as_object_mut().unwrap().remove(k);
            } else {
                req[k] = v.clone();
            }
        }
        ws.send(req).await;
        let (reply, others) = ws.until_reply(id).await;
        assert!(others.is_empty(), "{others:?}");
        assert_eq!(reply["type"], "error", "{enc:?} watch: {what}: {reply}");
        let got = reply["error"]["code"].as_str().unwrap_or("");
        assert!(
            code.split('|').any(|c| c == got),
            "{enc:?} watch: {what}: expected {code}: {reply}"
        );
        assert!(reply["error"]["message"].is_string(), "{reply}");
    }
    // One watch per topic per connection.
    id += 1;
    ws.send(json!({"id": id, "type": "watch", "qid": "ok", "topic": "t"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(reply["type"], "watching", "{reply}");
    id += 1;
    ws.send(json!({"id": id, "type": "watch", "qid": "again", "topic": "t"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(
        reply["error"]["code"], "already_exists",
        "a second watch of a topic: {reply}"
    );
    id += 1;
    ws.send(json!({"id": id, "type": "unwatch", "qid": "never"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(reply["type"], "error", "unwatch of an unknown qid: {reply}");
    // --live-subscriptions-per-connection 1: a watch of another topic is one too many …
    id += 1;
    ws.send(json!({"id": id, "type": "watch", "qid": "w2", "topic": "second"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_error(
        &format!("{enc:?}: a watch over --live-subscriptions-per-connection"),
        0,
        &reply,
        0,
        "limit",
        &["--live-subscriptions-per-connection"],
    );
    // … until the first one is unwatched.
    id += 1;
    ws.send(json!({"id": id, "type": "unwatch", "qid": "ok"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(
        (&reply["type"], &reply["qid"]),
        (&json!("unwatched"), &json!("ok")),
        "{reply}"
    );
    id += 1;
    ws.send(json!({"id": id, "type": "watch", "qid": "w2", "topic": "second"}))
        .await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(reply["type"], "watching", "{reply}");
    // The connection still works.
    id += 1;
    ws.send(json!({"id": id, "type": "ping"})).await;
    let (reply, _) = ws.until_reply(id).await;
    assert_eq!(reply["type"], "pong", "{reply}");
    ws.close().await;
    let _ = api;
}

async fn reads_and_watches(api: &Api) {
    // (what, query pairs, status, code, names)
    let cases: Vec<ReadCase> = vec![
        (
            "from past next",
            vec![("from", "1")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "a huge from",
            vec![("from", "18446744073709551615")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "a negative from",
            vec![("from", "-1")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "from not a number",
            vec![("from", "abc")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "an empty from",
            vec![("from", "")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "limit 0",
            vec![("limit", "0")],
            400,
            "bad_request",
            vec!["limit"],
        ),
        (
            "limit not a number",
            vec![("limit", "ten")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "limit over --max-page-rows",
            vec![("limit", "100000000")],
            413,
            "limit",
            vec!["--max-page-rows"],
        ),
        (
            "`*` inside a pattern",
            vec![("tag", "a*b")],
            400,
            "bad_request",
            vec!["a*b"],
        ),
        ("`**`", vec![("tag", "room:**")], 400, "bad_request", vec![]),
        (
            "an empty pattern",
            vec![("tag", "")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "a pattern with a space",
            vec![("tag", "a b")],
            400,
            "bad_request",
            vec![],
        ),
        (
            "a 129-byte pattern",
            vec![("tag", &*Box::leak("p".repeat(129).into_boxed_str()))],
            400,
            "bad_request",
            vec!["128"],
        ),
        (
            "an unknown parameter",
            vec![("frm", "0")],
            400,
            "bad_request",
            vec!["frm"],
        ),
    ];
    for (what, params, status, code, names) in &cases {
        let (s, b) = api.read_records("t", params).await;
        assert_error(&format!("read: {what}"), s, &b, *status, code, names);
        if *what == "limit 0" || what.starts_with("limit") {
            continue; // a watch takes no limit
        }
        let owned: Vec<(&str, String)> = params.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let err = api
            .watch_sse_raw("t", &owned, None)
            .await
            .err()
            .unwrap_or_else(|| panic!("SSE watch: {what}: a stream instead of an error"));
        assert_error(
            &format!("SSE watch: {what}"),
            err.0,
            &err.1,
            *status,
            code,
            names,
        );
    }
    let many: Vec<(&str, String)> = (0..65).map(|i| ("tag", format!("p{i}"))).collect();
    let (s, b) = api
        .read_records(
            "t",
            &many
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        )
        .await;
    assert_error("read: 65 patterns", s, &b, 413, "limit", &["64"]);
    let err = api
        .watch_sse_raw("t", &many, None)
        .await
        .err()
        .expect("an error");
    assert_error(
        "SSE watch: 65 patterns",
        err.0,
        &err.1,
        413,
        "limit",
        &["64"],
    );
    let err = api
        .watch_sse_raw("nope", &[], None)
        .await
        .err()
        .expect("an error");
    assert_error(
        "SSE watch: an unknown topic",
        err.0,
        &err.1,
        404,
        "not_found",
        &["nope"],
    );
    let (s, b) = api.read_records("nope", &[]).await;
    assert_error("read: an unknown topic", s, &b, 404, "not_found", &["nope"]);
    // A Last-Event-ID that is not an offset.
    let resp = api
        .client
        .get(api.url("/v1/topics/t/watch"))
        .header("Last-Event-ID", "soon")
        .send()
        .await
        .unwrap();
    let s = resp.status().as_u16();
    let b: Value = resp.json().await.expect("a JSON error");
    assert_error(
        "SSE watch: a bad Last-Event-ID",
        s,
        &b,
        400,
        "bad_request",
        &["Last-Event-ID"],
    );
}
