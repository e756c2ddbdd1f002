//! Topic rules (docs/security.md "Topic rules"): read and append rules are tag patterns in
//! which `{auth.<claim>}` is the caller's claim. A client watching (SSE, WebSocket) or
//! reading with a tag filter that does not lie within its read rules — another user's tag,
//! a wider prefix, no filter at all without `*`, a topic without rules — is refused with 403
//! `forbidden` naming the pattern, before anything is sent; an allowed watcher sees exactly
//! the records its filter matches, so only records carrying a tag it may read, across
//! several users at once. An append with one record whose tag is not allowed (or an untagged
//! record without `*`) is refused naming the record and the tag, and appends nothing. A `*`
//! inside a claim is literal. Clients list only topics with a read rule, and see `append`
//! entries in `/v1/changes` only for topics they may read entirely. Rules are checked when a
//! read or watch starts: narrowed rules refuse new watches, an open watch keeps going.

mod common;
mod sec;

use std::time::Duration;

use common::TempDir;
use sec::{assert_forbidden, token, Client, Sse, Ws};
use serde_json::{json, Value};

/// Records the admin appends: (tags, data).
fn records() -> Vec<(Vec<&'static str>, Value)> {
    vec![
        (vec!["user:alice"], json!("to alice")),
        (vec!["user:bob"], json!("to bob")),
        (vec!["room:7"], json!("in room 7")),
        (vec!["room:8", "user:alice"], json!("room 8 and alice")),
        (vec![], json!("untagged")),
        (vec!["user:bob", "room:7"], json!("bob in room 7")),
        (vec!["user:carol"], json!("to carol")),
        (vec!["room:9"], json!("in room 9")),
        (vec!["user:alice"], json!("alice again")),
    ]
}

/// Does a record with `tags` match the filter `patterns` (docs/api.md "Names and tags")?
fn matches(patterns: &[&str], tags: &[&str]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => tags.iter().any(|t| t.starts_with(prefix)),
        None => tags.contains(p),
    })
}

async fn collect_sse(sse: &mut Sse, n: usize, who: &str) -> Vec<Value> {
    let mut got = Vec::new();
    while got.len() < n {
        let (event, data) = sse.event().await;
        assert_eq!(event, "record", "{who}: {data}");
        got.push(data);
    }
    // A stray record would show up as the next event read later in the test (the records
    // each watcher gets next are checked one by one).
    got
}

async fn collect_ws(ws: &mut Ws, n: usize, who: &str) -> Vec<Value> {
    let mut got = Vec::new();
    while got.len() < n {
        let v = ws.next().await;
        assert_eq!(v["type"], "record", "{who}: {v}");
        got.push(v);
    }
    got
}

fn check_records(got: &[Value], filter: &[&str], readable: &[&str], who: &str) {
    let want: Vec<(Vec<&str>, Value)> = records()
        .into_iter()
        .filter(|(tags, _)| matches(filter, tags))
        .collect();
    let got_pairs: Vec<(Vec<String>, Value)> = got
        .iter()
        .map(|r| {
            let tags = r["tags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
            (tags, r["data"].clone())
        })
        .collect();
    let want_pairs: Vec<(Vec<String>, Value)> = want
        .iter()
        .map(|(t, d)| (t.iter().map(|s| s.to_string()).collect(), d.clone()))
        .collect();
    assert_eq!(
        got_pairs, want_pairs,
        "{who}: the records of filter {filter:?}"
    );
    for r in got {
        let tags: Vec<&str> = r["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert!(
            matches(readable, &tags),
            "{who}: LEAK: a record without a tag it may read: {r}"
        );
    }
}

#[tokio::test]
async fn watchers_and_readers_see_only_what_their_rules_allow() {
    let dir = TempDir::new("topic-rules");
    let server = sec::start(&dir.join("data"), dir.path(), &[]);
    let admin = Client::admin(&server);
    let (status, body) = admin
        .put(
            "/v1/topics/chat",
            &json!({"read": ["room:*", "user:{auth.sub}"], "append": ["user:{auth.sub}", "room:{auth.room}"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin.put("/v1/topics/private", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin
        .put(
            "/v1/topics/public",
            &json!({"read": ["*"], "append": ["*"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let alice = Client::new(&server, &token("alice", json!({"room": 7})));
    let bob = Client::new(&server, &token("bob", json!({"room": "8"})));
    let carol = Client::new(&server, &token("carol", json!({})));
    // A `*` in a claim is literal: "user:{auth.sub}" is the tag "user:e*", not a prefix.
    let eve = Client::new(&server, &token("e*", json!({})));

    // Refusals, before anything is sent: SSE watches and reads.
    let refusals: Vec<(&str, &Client, &str, Vec<&str>, &str)> = vec![
        ("alice", &alice, "chat", vec!["user:bob"], "user:bob"),
        ("alice", &alice, "chat", vec!["user:*"], "user:*"),
        (
            "alice",
            &alice,
            "chat",
            vec!["user:alice", "user:bob"],
            "user:bob",
        ),
        ("alice", &alice, "chat", vec!["*"], "*"),
        ("alice", &alice, "chat", vec![], "*"),
        ("alice", &alice, "chat", vec!["room"], "room"),
        ("carol", &carol, "private", vec!["user:carol"], "user:carol"),
        ("e*", &eve, "chat", vec!["user:eve"], "user:eve"),
        ("e*", &eve, "chat", vec!["user:e*"], "user:e*"),
    ];
    for (who, client, topic, tags, pattern) in &refusals {
        let what = format!("{who} watching {topic} with {tags:?}");
        let params: Vec<(&str, &str)> = tags.iter().map(|t| ("tag", *t)).collect();
        match client
            .sse(&format!("/v1/topics/{topic}/watch"), &params)
            .await
        {
            Ok(_) => panic!("{what}: the watch was not refused"),
            Err((status, body)) => {
                let err = assert_forbidden(status, &body, &what);
                if !tags.is_empty() {
                    assert!(
                        err["message"].as_str().unwrap().contains(pattern),
                        "{what}: the message names {pattern}: {body}"
                    );
                }
            }
        }
        let (status, body) = client
            .get_with(&format!("/v1/topics/{topic}/records"), &params)
            .await;
        let err = assert_forbidden(status, &body, &format!("{what} (read)"));
        if !tags.is_empty() {
            assert!(
                err["message"].as_str().unwrap().contains(pattern),
                "{what} (read): the message names {pattern}: {body}"
            );
        }
    }
    // The same over WebSocket; the connection stays usable.
    let mut alice_ws = alice.ws().await;
    for (id, (tags, pattern)) in [
        (vec!["user:bob"], "user:bob"),
        (vec!["room:7", "user:*"], "user:*"),
    ]
    .into_iter()
    .enumerate()
    {
        let reply = alice_ws
            .request(
                id as u64 + 1,
                json!({"type": "watch", "qid": format!("w{id}"), "topic": "chat", "tags": tags}),
            )
            .await;
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains(pattern),
            "the message names {pattern}: {reply}"
        );
    }

    // Allowed watchers, several users at once.
    let mut alice_sse = alice
        .sse("/v1/topics/chat/watch", &[("tag", "user:alice")])
        .await
        .unwrap_or_else(|e| panic!("alice's watch: {e:?}"));
    let (event, _) = alice_sse.event().await;
    assert_eq!(event, "watching");
    let reply = alice_ws
        .request(
            10,
            json!({"type": "watch", "qid": "mine", "topic": "chat", "tags": ["user:alice", "room:7"]}),
        )
        .await;
    assert_eq!(reply["type"], "watching", "{reply}");
    let mut bob_ws = bob.ws().await;
    let reply = bob_ws
        .request(
            1,
            json!({"type": "watch", "qid": "b", "topic": "chat", "tags": ["user:bob"]}),
        )
        .await;
    assert_eq!(reply["type"], "watching", "{reply}");
    let mut carol_sse = carol
        .sse("/v1/topics/chat/watch", &[("tag", "room:*")])
        .await
        .unwrap_or_else(|e| panic!("carol's watch: {e:?}"));
    let (event, _) = carol_sse.event().await;
    assert_eq!(event, "watching");
    let mut public_sse = carol
        .sse("/v1/topics/public/watch", &[])
        .await
        .unwrap_or_else(|e| panic!("carol's watch of public: {e:?}"));
    let (event, _) = public_sse.event().await;
    assert_eq!(event, "watching");

    for (tags, data) in records() {
        let (status, body) = admin
            .post(
                "/v1/topics/chat/records",
                &json!({"records": [{"tags": tags, "data": data}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let count = |filter: &[&str]| records().iter().filter(|(t, _)| matches(filter, t)).count();

    let got = collect_sse(&mut alice_sse, count(&["user:alice"]), "alice SSE").await;
    check_records(
        &got,
        &["user:alice"],
        &["room:*", "user:alice"],
        "alice SSE",
    );
    let got = collect_ws(&mut alice_ws, count(&["user:alice", "room:7"]), "alice WS").await;
    check_records(
        &got,
        &["user:alice", "room:7"],
        &["room:*", "user:alice"],
        "alice WS",
    );
    let got = collect_ws(&mut bob_ws, count(&["user:bob"]), "bob WS").await;
    check_records(&got, &["user:bob"], &["room:*", "user:bob"], "bob WS");
    let got = collect_sse(&mut carol_sse, count(&["room:*"]), "carol SSE").await;
    check_records(&got, &["room:*"], &["room:*", "user:carol"], "carol SSE");
    // The public topic had no appends: nothing for its watcher yet.
    assert!(
        public_sse
            .event_within(Duration::from_millis(300))
            .await
            .is_none(),
        "no chat record reaches a watcher of another topic"
    );

    // Paged reads with an allowed filter: exactly the matching records.
    let (status, body) = bob
        .get_with(
            "/v1/topics/chat/records",
            &[("tag", "user:bob"), ("from", "0")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    check_records(
        body["records"].as_array().unwrap(),
        &["user:bob"],
        &["room:*", "user:bob"],
        "bob's read",
    );

    // Append rules: one forbidden record refuses the batch and appends nothing.
    let next_before = topic_next(&admin, "chat").await;
    let seq = admin.health_seq().await;
    let append_refusals: Vec<(&str, &Client, Value, u64, &str)> = vec![
        (
            "alice",
            &alice,
            json!([{"tags": ["user:alice"], "data": 1}, {"tags": ["user:bob"], "data": 2}]),
            1,
            "user:bob",
        ),
        (
            "alice",
            &alice,
            json!([{"tags": ["room:8"], "data": 3}]),
            0,
            "room:8",
        ),
        (
            "alice",
            &alice,
            json!([{"tags": ["user:alice", "room:9"], "data": 3}]),
            0,
            "room:9",
        ),
        (
            "bob",
            &bob,
            json!([{"tags": ["room:8"]}, {"data": "untagged"}]),
            1,
            "",
        ),
        (
            "carol",
            &carol,
            json!([{"tags": ["room:7"], "data": 4}]),
            0,
            "room:7",
        ),
        (
            "e*",
            &eve,
            json!([{"tags": ["user:eve"], "data": 5}]),
            0,
            "user:eve",
        ),
    ];
    for (who, client, recs, index, tag) in &append_refusals {
        let what = format!("{who} appending {recs}");
        let (status, body) = client
            .post("/v1/topics/chat/records", &json!({"records": recs}))
            .await;
        let err = assert_forbidden(status, &body, &what);
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains(tag),
            "{what}: the message names {tag:?}: {body}"
        );
        assert!(
            err.get("op") == Some(&json!(index)) || message.contains(&format!("record {index}")),
            "{what}: the error names record {index}: {body}"
        );
        assert_eq!(admin.health_seq().await, seq, "{what}: the seq moved");
        assert_eq!(
            topic_next(&admin, "chat").await,
            next_before,
            "{what}: something was appended"
        );
    }
    // Over WebSocket too.
    let reply = alice_ws
        .request(
            20,
            json!({"type": "append", "topic": "chat", "records": [{"tags": ["user:alice"]}, {"tags": ["user:bob"]}]}),
        )
        .await;
    assert_eq!(reply["type"], "error", "{reply}");
    assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
    assert_eq!(admin.health_seq().await, seq, "WS append: the seq moved");
    assert_eq!(topic_next(&admin, "chat").await, next_before);

    // Allowed appends: alice to her own tag and her room (the claim is a number), bob to his
    // room (the claim is a string); each reaches exactly the watchers whose filter matches.
    let (status, body) = alice
        .post(
            "/v1/topics/chat/records",
            &json!({"records": [{"tags": ["user:alice", "room:7"], "data": "from alice"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = bob
        .post(
            "/v1/topics/chat/records",
            &json!({"records": [{"tags": ["room:8"], "data": "from bob"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, r) = alice_sse.event().await;
    assert_eq!(r["data"], "from alice", "{r}");
    let r = alice_ws.next().await;
    assert_eq!(r["data"], "from alice", "{r}");
    let (_, r) = carol_sse.event().await;
    assert_eq!(r["data"], "from alice", "{r}");
    let (_, r) = carol_sse.event().await;
    assert_eq!(r["data"], "from bob", "{r}");
    // Bob's watcher of user:bob saw neither; a public append reaches the public watcher and
    // only now does bob's socket get something (nothing before).
    let (status, _) = alice
        .post(
            "/v1/topics/public/records",
            &json!({"records": [{"data": "hello"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, r) = public_sse.event().await;
    assert_eq!(r["data"], "hello");
    assert!(
        bob_ws
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "bob's watch of user:bob gets no record of others"
    );

    // Clients list only topics with a read rule.
    let (status, body) = alice.get("/v1/topics").await;
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<&str> = body["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["chat", "public"], "{body}");

    // /v1/changes: append entries only for topics the client may read entirely.
    let (status, body) = alice.get_with("/v1/changes", &[("since", "0")]).await;
    assert_eq!(status, 200, "{body}");
    for e in body["changes"].as_array().unwrap() {
        if e["op"] == "append" {
            assert_eq!(
                e["topic"], "public",
                "alice sees appends of public only: {e}"
            );
        }
    }
    assert!(
        body["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["op"] == "append" && e["topic"] == "public"),
        "alice sees the public append: {body}"
    );

    // Topic PUT and DELETE are the admin's.
    let (status, body) = alice.put("/v1/topics/mine", &json!({"read": ["*"]})).await;
    assert_forbidden(status, &body, "a client creating a topic");
    let (status, body) = alice.delete("/v1/topics/chat").await;
    assert_forbidden(status, &body, "a client dropping a topic");

    // Rules are checked when a read or watch starts: after the admin narrows the read rules,
    // a new watch of user:alice is refused while the one already open keeps going.
    let (status, body) = admin
        .put(
            "/v1/topics/chat",
            &json!({"read": ["room:*"], "append": ["user:{auth.sub}", "room:{auth.room}"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    match alice
        .sse("/v1/topics/chat/watch", &[("tag", "user:alice")])
        .await
    {
        Ok(_) => panic!("a watch of user:alice after the rule was removed was not refused"),
        Err((status, body)) => {
            assert_forbidden(
                status,
                &body,
                "alice watching user:alice under the new rules",
            );
        }
    }
    let (status, body) = alice
        .post(
            "/v1/topics/chat/records",
            &json!({"records": [{"tags": ["user:alice"], "data": "still mine"}]}),
        )
        .await;
    assert_eq!(
        status, 200,
        "the append rules still allow user:alice: {body}"
    );
    let (_, r) = alice_sse.event().await;
    assert_eq!(r["data"], "still mine", "the open watch keeps going: {r}");
}

/// The `next` offset of a topic, as the admin reads it.
async fn topic_next(admin: &Client, name: &str) -> u64 {
    let (status, body) = admin.get(&format!("/v1/topics/{name}")).await;
    assert_eq!(status, 200, "{body}");
    body["next"].as_u64().expect("next")
}
