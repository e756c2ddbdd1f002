//! Reads and catch-up through the real binary: rows by key, keyset paging in key order,
//! `/v1/changes` paging and filtering, the retention horizon, and a graceful restart
//! (SIGTERM writes a final snapshot, exits 0, and the restart replays nothing but still
//! serves the retained changelog window).

mod common;

use std::collections::BTreeSet;

use common::{seed, Api, Rng, Server, TempDir};
use serde_json::{json, Value};
use sluice_log::segment::list_segments;
use sluice_log::snapshot::list_snapshots;

/// Percent-encodes one URL path segment.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Pages through `table` with `limit`, checking page sizes; returns the keys in order.
async fn page_keys(api: &Api, table: &str, pk: &str, limit: usize) -> Vec<Value> {
    let path = format!("/v1/tables/{table}/rows");
    let limit_text = limit.to_string();
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let mut params = vec![("limit", limit_text.as_str())];
        if let Some(a) = &after {
            params.push(("after", a.as_str()));
        }
        let (status, body) = api.get_with(&path, &params).await;
        assert_eq!(status, 200, "{table} limit {limit} after {after:?}: {body}");
        let rows = body["rows"].as_array().unwrap();
        assert!(
            rows.len() <= limit,
            "{table}: page of {} > limit {limit}",
            rows.len()
        );
        keys.extend(rows.iter().map(|r| r["row"][pk].clone()));
        match &body["next"] {
            Value::Null => return keys,
            next => {
                assert_eq!(
                    rows.len(),
                    limit,
                    "{table}: a short page says there is more"
                );
                assert_eq!(next, keys.last().unwrap(), "{table}: next is the last key");
                after = Some(match next {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
        }
    }
    panic!("paging {table} did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_read_by_key_and_paged_in_key_order() {
    let seed = seed("reads");
    let mut rng = Rng::new(seed);
    let root = TempDir::new("reads");
    let server = Server::start(
        &root.join("data"),
        root.path(),
        &["--durability", "disk", "--max-page-rows", "50"],
    );
    let api = server.api();
    api.sql("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL); CREATE TABLE words (w TEXT PRIMARY KEY, n INTEGER)")
        .await;

    let mut ints: BTreeSet<i64> = [i64::MIN, -1000, -5, -1, 0, 1, 7, 10, 100, i64::MAX].into();
    while ints.len() < 60 {
        ints.insert(rng.below(2001) as i64 - 1000);
    }
    // TEXT keys sort by bytes: upper case before lower case, "10" before "9", "ä" after "z".
    let mut texts: BTreeSet<String> = [
        "", "a", "A", "aa", "ab", "b", "B", "10", "9", "a b", "x/y", "ä", "z", "%", "?&=#", "日本",
    ]
    .map(String::from)
    .into();
    while texts.len() < 60 {
        let len = 1 + rng.below(5);
        texts.insert(
            (0..len)
                .map(|_| (b'a' + rng.below(26) as u8) as char)
                .collect(),
        );
    }
    let mut order: Vec<i64> = ints.iter().copied().collect();
    rng.shuffle(&mut order);
    for chunk in order.chunks(5) {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|id| json!({"op": "insert", "table": "users", "row": {"id": id, "name": format!("user {id}")}}))
            .collect();
        api.mutate(Value::Array(ops)).await;
    }
    let mut order: Vec<&String> = texts.iter().collect();
    rng.shuffle(&mut order);
    for chunk in order.chunks(5) {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|w| json!({"op": "insert", "table": "words", "row": {"w": w, "n": w.len()}}))
            .collect();
        api.mutate(Value::Array(ops)).await;
    }

    // Reads need a token: none is 401 `missing`, a wrong one 401 `malformed`; only
    // `/health` answers without one.
    for (token, reason) in [
        (None, "missing"),
        (Some("not-the-admin-token"), "malformed"),
    ] {
        let stranger = server.api_as(token);
        let (status, body) = stranger.get("/v1/tables/users/rows/7").await;
        assert_eq!(status, 401, "{token:?}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert_eq!(body["error"]["reason"], reason, "{body}");
        let (status, body) = stranger.get("/v1/tables/users/rows").await;
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(
            body.get("rows").is_none(),
            "no rows without a token: {body}"
        );
        let (status, body) = stranger.get("/health").await;
        assert_eq!(status, 200, "{body}");
    }

    let int_keys: Vec<Value> = ints.iter().map(|i| json!(i)).collect();
    let text_keys: Vec<Value> = texts.iter().map(|t| json!(t)).collect();
    for limit in [1, 7, 50] {
        assert_eq!(
            page_keys(&api, "users", "id", limit).await,
            int_keys,
            "seed {seed}"
        );
        assert_eq!(
            page_keys(&api, "words", "w", limit).await,
            text_keys,
            "seed {seed}"
        );
    }
    // `after` need not be a key that exists.
    let (status, body) = api
        .get_with("/v1/tables/users/rows", &[("after", "-3"), ("limit", "50")])
        .await;
    assert_eq!(status, 200, "{body}");
    let first = body["rows"][0]["row"]["id"].as_i64().unwrap();
    assert_eq!(first, *ints.range(-2..).next().unwrap());
    let (status, body) = api
        .get_with("/v1/tables/words/rows", &[("after", "a"), ("limit", "1")])
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["row"]["w"], "a b");

    // Page limits are bounded and named.
    let (status, body) = api.get("/v1/tables/users/rows?limit=51").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("limit")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-page-rows"),
        "{body}"
    );
    let body = api.get_ok("/v1/tables/users/rows").await;
    assert_eq!(
        body["rows"].as_array().unwrap().len(),
        50,
        "no limit: a page of the most allowed"
    );
    assert_eq!(body["next"], int_keys[49]);
    let (status, body) = api.get("/v1/tables/users/rows?limit=0").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );

    // Rows by key.
    for id in &ints {
        let body = api.get_ok(&format!("/v1/tables/users/rows/{id}")).await;
        assert_eq!(body["row"], json!({"id": id, "name": format!("user {id}")}));
        // A row's version is the seq of the commit that wrote it.
        let version = body["version"].as_u64().expect("version");
        assert!(
            (1..=body["seq"].as_u64().unwrap()).contains(&version),
            "{body}"
        );
    }
    for w in texts.iter().filter(|w| !w.is_empty()) {
        let body = api
            .get_ok(&format!("/v1/tables/words/rows/{}", segment(w)))
            .await;
        assert_eq!(body["row"], json!({"w": w, "n": w.len()}), "key {w:?}");
        let version = body["version"].as_u64().expect("version");
        assert!(
            (1..=body["seq"].as_u64().unwrap()).contains(&version),
            "{body}"
        );
    }
    for path in [
        "/v1/tables/users/rows/5000",
        "/v1/tables/words/rows/no-such-word",
        "/v1/tables/nope/rows/1",
        "/v1/tables/nope/rows",
    ] {
        let (status, body) = api.get(path).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{path}: {body}"
        );
    }
    let (status, body) = api.get("/v1/tables/users/rows/abc").await;
    assert_eq!(status, 400, "{body}");

    // A row's version is the seq of the commit that last wrote it; a deleted row is gone.
    let first = api
        .mutate(json!([{"op": "patch", "table": "users", "id": 7, "set": {"name": "seven"}}]))
        .await;
    assert_eq!(first["results"][0]["version"], first["seq"]);
    let second = api.mutate(json!([{"op": "patch", "table": "users", "id": 7, "set": {"name": "SEVEN"}, "if_version": first["seq"]}]))
        .await;
    let body = api.get_ok("/v1/tables/users/rows/7").await;
    assert_eq!(
        (&body["row"]["name"], &body["version"]),
        (&json!("SEVEN"), &second["seq"])
    );
    api.mutate(json!([{"op": "delete", "table": "users", "id": 7}]))
        .await;
    let (status, _) = api.get("/v1/tables/users/rows/7").await;
    assert_eq!(status, 404);

    // Inserted again, the key starts above every version it had (no ABA): a compare-and-set
    // with the version read before the delete is refused.
    let again = api
        .mutate(json!([{"op": "insert", "table": "users", "row": {"id": 7, "name": "again"}}]))
        .await;
    assert!(
        again["results"][0]["version"].as_u64() > second["seq"].as_u64(),
        "{again}"
    );
    let stale = json!({"ops": [{"op": "patch", "table": "users", "id": 7, "set": {"name": "x"}, "if_version": second["seq"]}]});
    let (status, body) = api.post("/v1/mutate", &stale).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
}

fn change(seq: u64, table: &str, op: &str, id: Value, row: Value, version: u64) -> Value {
    json!({"seq": seq, "table": table, "op": op, "id": id, "row": row, "version": version})
}

/// Pages through `/v1/changes` from `since`; returns the pages and the final `next`.
/// Checks that a commit is never split across pages and that `next` moves forward.
async fn change_pages(
    api: &Api,
    since: u64,
    limit: usize,
    tables: Option<&str>,
) -> (Vec<Vec<Value>>, u64) {
    let mut pages: Vec<Vec<Value>> = Vec::new();
    let mut since = since;
    let limit = limit.to_string();
    for _ in 0..10_000 {
        let since_text = since.to_string();
        let mut params = vec![("since", since_text.as_str()), ("limit", limit.as_str())];
        if let Some(t) = tables {
            params.push(("tables", t));
        }
        let (status, body) = api.get_with("/v1/changes", &params).await;
        assert_eq!(status, 200, "changes {params:?}: {body}");
        let changes = body["changes"].as_array().unwrap().clone();
        let next = body["next"].as_u64().unwrap();
        if changes.is_empty() {
            return (pages, next);
        }
        for c in &changes {
            let seq = c["seq"].as_u64().unwrap();
            assert!(
                seq > since && seq <= next,
                "{c} on a page since {since} next {next}"
            );
        }
        if let Some(prev) = pages.last() {
            let prev_seq = &prev.last().unwrap()["seq"];
            assert_ne!(
                prev_seq, &changes[0]["seq"],
                "a commit was split across pages"
            );
        }
        pages.push(changes);
        since = next;
    }
    panic!("paging changes did not end");
}

async fn all_changes(api: &Api, since: u64, limit: usize, tables: Option<&str>) -> Vec<Value> {
    change_pages(api, since, limit, tables).await.0.concat()
}

/// The SQL text of schema changes is the parser's rendering: check it names the index,
/// then compare the rest exactly.
fn normalise_sql(mut changes: Vec<Value>) -> Vec<Value> {
    for c in &mut changes {
        if c["op"] == "schema" {
            let sql = c["sql"].as_str().unwrap().to_lowercase();
            assert!(sql.contains("users_by_name"), "{c}");
            c["sql"] = json!("<index users_by_name>");
        }
    }
    changes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_pages_changes_in_order_and_survives_a_graceful_restart() {
    const RETAIN: u64 = 10;
    let root = TempDir::new("catch-up");
    let data = root.join("data");
    let args = [
        "--retain-commits",
        "10",
        "--segment-bytes",
        "512",
        "--durability",
        "fsync",
    ];
    let server = Server::start(&data, root.path(), &args);
    let api = server.api();
    api.sql("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL); CREATE TABLE words (w TEXT PRIMARY KEY, n INTEGER)")
        .await;
    for id in 1..=15 {
        api.mutate(json!([{"op": "insert", "table": "users", "row": {"id": id, "name": format!("u{id}")}}]))
            .await;
    }
    let horizon = api.health_seq().await;
    assert_eq!(horizon, 16);

    // The retained window: RETAIN commits over both tables, one of them DDL.
    let s = |i: u64| horizon + i;
    let mut expected = Vec::new();
    let users = |id: i64, name: &str| json!({"id": id, "name": name});
    let words = |w: &str, n: i64| json!({"w": w, "n": n});

    api.mutate(json!([
        {"op": "insert", "table": "users", "row": users(100, "a")},
        {"op": "insert", "table": "users", "row": users(101, "b")}]))
        .await;
    expected.push(change(
        s(1),
        "users",
        "insert",
        json!(100),
        users(100, "a"),
        s(1),
    ));
    expected.push(change(
        s(1),
        "users",
        "insert",
        json!(101),
        users(101, "b"),
        s(1),
    ));
    api.mutate(json!([{"op": "insert", "table": "words", "row": words("k1", 1)}]))
        .await;
    expected.push(change(
        s(2),
        "words",
        "insert",
        json!("k1"),
        words("k1", 1),
        s(2),
    ));
    api.mutate(json!([{"op": "patch", "table": "users", "id": 100, "set": {"name": "a2"}}]))
        .await;
    expected.push(change(
        s(3),
        "users",
        "update",
        json!(100),
        users(100, "a2"),
        s(3),
    ));
    api.sql("CREATE INDEX users_by_name ON users (name)").await;
    expected.push(
        json!({"seq": s(4), "table": "users", "op": "schema", "sql": "<index users_by_name>"}),
    );
    api.mutate(json!([{"op": "delete", "table": "users", "id": 101}]))
        .await;
    expected.push(change(
        s(5),
        "users",
        "delete",
        json!(101),
        Value::Null,
        s(1),
    ));
    api.mutate(json!([
        {"op": "insert", "table": "words", "row": words("k2", 2)},
        {"op": "patch", "table": "words", "id": "k1", "set": {"n": 10}},
        {"op": "insert", "table": "users", "row": users(102, "c")}]))
        .await;
    expected.push(change(
        s(6),
        "words",
        "insert",
        json!("k2"),
        words("k2", 2),
        s(6),
    ));
    expected.push(change(
        s(6),
        "words",
        "update",
        json!("k1"),
        words("k1", 10),
        s(6),
    ));
    expected.push(change(
        s(6),
        "users",
        "insert",
        json!(102),
        users(102, "c"),
        s(6),
    ));
    api.mutate(json!([{"op": "upsert", "table": "users", "row": users(100, "a3")}]))
        .await;
    expected.push(change(
        s(7),
        "users",
        "update",
        json!(100),
        users(100, "a3"),
        s(7),
    ));
    api.mutate(json!([{"op": "delete", "table": "words", "id": "k2"}]))
        .await;
    expected.push(change(
        s(8),
        "words",
        "delete",
        json!("k2"),
        Value::Null,
        s(6),
    ));
    api.mutate(json!([{"op": "insert", "table": "users", "row": users(103, "d")}]))
        .await;
    expected.push(change(
        s(9),
        "users",
        "insert",
        json!(103),
        users(103, "d"),
        s(9),
    ));
    api.mutate(json!([
        {"op": "patch", "table": "users", "id": 103, "set": {"name": "d2"}},
        {"op": "patch", "table": "words", "id": "k1", "set": {"n": 11}}]))
        .await;
    expected.push(change(
        s(10),
        "users",
        "update",
        json!(103),
        users(103, "d2"),
        s(10),
    ));
    expected.push(change(
        s(10),
        "words",
        "update",
        json!("k1"),
        words("k1", 11),
        s(10),
    ));
    let head = api.health_seq().await;
    assert_eq!(head, horizon + RETAIN);

    let only = |table: &str| -> Vec<Value> {
        expected
            .iter()
            .filter(|c| c["table"] == table)
            .cloned()
            .collect()
    };
    for limit in [1, 3, 100] {
        let (pages, next) = change_pages(&api, horizon, limit, None).await;
        assert_eq!(next, head);
        assert_eq!(normalise_sql(pages.concat()), expected, "limit {limit}");
    }
    assert_eq!(
        normalise_sql(all_changes(&api, horizon, 2, Some("users")).await),
        only("users")
    );
    assert_eq!(
        all_changes(&api, horizon, 2, Some("words")).await,
        only("words")
    );
    assert_eq!(
        normalise_sql(all_changes(&api, horizon, 2, Some("words,users")).await),
        expected
    );
    assert_eq!(
        all_changes(&api, horizon, 2, Some("nope")).await,
        Vec::<Value>::new()
    );
    let later = all_changes(&api, s(6), 100, None).await;
    assert_eq!(
        later,
        expected[expected.len() - 5..].to_vec(),
        "since {}",
        s(6)
    );
    let (pages, next) = change_pages(&api, head, 10, None).await;
    assert!(pages.is_empty());
    assert_eq!(next, head);

    // Older than the horizon: a clear 410 naming the horizon.
    for since in [0, horizon - 1] {
        let (status, body) = api.get(&format!("/v1/changes?since={since}")).await;
        assert_eq!(status, 410, "since {since}: {body}");
        assert_eq!(body["error"]["code"], "horizon", "{body}");
        assert_eq!(body["error"]["horizon"], horizon, "{body}");
    }

    let rows_before = (
        api.scan_all("users", 100).await,
        api.scan_all("words", 100).await,
    );

    // SIGTERM: a final snapshot, exit 0.
    let (status, stderr) = server.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}\n{stderr}");
    let snapshots = list_snapshots(&data).unwrap();
    assert_eq!(snapshots.last().map(|s| s.0), Some(head), "{snapshots:?}");
    let first_segment = list_segments(&data).unwrap()[0].first_seq;
    assert!(
        first_segment > 1 && first_segment <= horizon + 1,
        "the snapshot should retire segments before the window only: first is {first_segment}"
    );

    // The restart replays nothing, yet still serves the same window.
    let server = Server::start(&data, root.path(), &args);
    let api = server.api();
    assert_eq!(api.metric("sluice_recovery_replayed").await, 0.0);
    assert_eq!(
        api.metric("sluice_recovery_whole_log").await,
        0.0,
        "the log no longer starts at seq 1, so the snapshot must have been loaded"
    );
    assert_eq!(api.health_seq().await, head);
    assert_eq!(
        (
            api.scan_all("users", 100).await,
            api.scan_all("words", 100).await
        ),
        rows_before
    );
    for limit in [1, 3, 100] {
        let (pages, next) = change_pages(&api, horizon, limit, None).await;
        assert_eq!(next, head);
        assert_eq!(
            normalise_sql(pages.concat()),
            expected,
            "after restart, limit {limit}"
        );
    }
    assert_eq!(
        all_changes(&api, horizon, 2, Some("words")).await,
        only("words")
    );
    let (status, body) = api.get(&format!("/v1/changes?since={}", horizon - 1)).await;
    assert_eq!(
        (status, &body["error"]["horizon"]),
        (410, &json!(horizon)),
        "{body}"
    );

    // And it goes on from there.
    let resp = api
        .mutate(json!([{"op": "insert", "table": "words", "row": words("k3", 3)}]))
        .await;
    assert_eq!(resp["seq"], head + 1);
    assert_eq!(
        all_changes(&api, head, 10, None).await,
        vec![change(
            head + 1,
            "words",
            "insert",
            json!("k3"),
            words("k3", 3),
            head + 1
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_after_a_restart_keeps_changes_made_before_an_add_column() {
    let root = TempDir::new("catch-up-alter");
    let data = root.join("data");
    let server = Server::start(&data, root.path(), &[]);
    let api = server.api();
    api.sql("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        .await;
    api.mutate(json!([{"op": "insert", "table": "users", "row": {"id": 1, "name": "one"}}]))
        .await;
    api.sql("ALTER TABLE users ADD COLUMN age INTEGER").await;
    api.mutate(
        json!([{"op": "insert", "table": "users", "row": {"id": 2, "name": "two", "age": 30}}]),
    )
    .await;
    api.mutate(json!([{"op": "patch", "table": "users", "id": 1, "set": {"age": 5}}]))
        .await;
    let before = all_changes(&api, 0, 100, None).await;
    assert_eq!(before.len(), 5, "{before:?}");

    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status}\n{stderr}");
    let server = Server::start(&data, root.path(), &[]);
    let api = server.api();
    let after = all_changes(&api, 0, 100, None).await;

    let identity = |c: &Value| json!([c["seq"], c["table"], c["op"], c["id"], c["version"]]);
    assert_eq!(
        after.iter().map(identity).collect::<Vec<_>>(),
        before.iter().map(identity).collect::<Vec<_>>(),
        "the same changes must be served before and after a restart:\nbefore {before:#?}\nafter {after:#?}"
    );
    // A row written before the column existed may gain it (as null), but nothing else.
    for (b, a) in before.iter().zip(&after) {
        if let Value::Object(row) = &b["row"] {
            for (column, value) in row {
                assert_eq!(&a["row"][column], value, "{b} became {a}");
            }
        }
    }
}
