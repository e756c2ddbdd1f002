//! Policies are part of the database (docs/security.md "Row policies"): created and dropped
//! through `POST /v1/sql` with the admin token, listed by `GET /v1/policies`, shown in
//! `/v1/changes` as `create_policy` / `drop_policy`, and recovered after `kill -9` from the
//! log and from a snapshot (plus the log after it): a client reads the same rows before and
//! after. A client token may not create, drop or list policies (403 `forbidden`). When a
//! policy on a table is created or dropped, client subscriptions reading it (SSE and
//! WebSocket) follow with a reset snapshot under the new rules, or — when the new rules read
//! a claim the views did not bind — end with `rules_changed`, and resubscribing with `since`
//! reads under the new rules (a reset snapshot); a subscription on another table goes on.
//! `DROP TABLE` drops the table's policies.

mod common;
mod sec;

use common::TempDir;
use sec::{assert_forbidden, token, Client};
use serde_json::{json, Value};

const NOTES_BY_ID: &str = "SELECT id FROM notes ORDER BY id";

async fn ids(client: &Client) -> Vec<i64> {
    client
        .query(NOTES_BY_ID)
        .await
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

async fn policies(admin: &Client) -> Value {
    let (status, body) = admin.get("/v1/policies").await;
    assert_eq!(status, 200, "{body}");
    let mut list = body["policies"].as_array().expect("policies").clone();
    list.sort_by_key(|p| format!("{}/{}", p["table"], p["name"]));
    Value::Array(list)
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}.{}",
                p["table"].as_str().unwrap(),
                p["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// The policy entries of `/v1/changes?since=0` as the admin reads them: (op, table, name).
async fn policy_entries(admin: &Client) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut since = 0u64;
    let last = admin.health_seq().await;
    for _ in 0..10_000 {
        let (status, body) = admin
            .get_with("/v1/changes", &[("since", &since.to_string())])
            .await;
        assert_eq!(status, 200, "{body}");
        for e in body["changes"].as_array().unwrap() {
            // Whether `DROP TABLE` logs a `drop_policy` for its policies is not said: the
            // dropped table `gone` is left out.
            if matches!(e["op"].as_str(), Some("create_policy" | "drop_policy"))
                && e["table"] != "gone"
            {
                out.push((
                    e["op"].as_str().unwrap().to_string(),
                    e["table"].as_str().unwrap_or_default().to_string(),
                    e["name"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        let next = body["next"].as_u64().unwrap();
        if next >= last || next == since {
            break;
        }
        since = next;
    }
    out
}

fn entry(op: &str, table: &str, name: &str) -> (String, String, String) {
    (op.into(), table.into(), name.into())
}

#[tokio::test]
async fn policies_are_logged_snapshotted_and_recovered() {
    let dir = TempDir::new("policies-restart");
    let data = dir.join("data");
    let server = sec::start(&data, dir.path(), &[]);
    let admin = Client::admin(&server);
    admin
        .sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, team INTEGER, body TEXT); CREATE TABLE other (id INTEGER PRIMARY KEY, v INTEGER)")
        .await;
    admin
        .mutate_ok(json!([
            {"op": "insert", "table": "notes", "row": {"id": 1, "owner": "alice", "team": 1}},
            {"op": "insert", "table": "notes", "row": {"id": 2, "owner": "bob", "team": 2}},
            {"op": "insert", "table": "notes", "row": {"id": 3, "owner": "bob", "team": 1, "body": "public"}},
            {"op": "insert", "table": "notes", "row": {"id": 4, "owner": "carol", "team": 2}},
            {"op": "insert", "table": "notes", "row": {"id": 5, "owner": "alice"}},
            {"op": "insert", "table": "notes", "row": {"id": 6, "owner": "dave", "team": 1}},
            {"op": "insert", "table": "other", "row": {"id": 1, "v": 1}},
        ]))
        .await;
    admin
        .sql("CREATE POLICY own_notes ON notes FOR SELECT USING (owner = auth.sub)")
        .await;
    admin
        .sql("CREATE POLICY team_read ON notes FOR SELECT USING (team = auth.team)")
        .await;
    admin
        .sql("CREATE POLICY tmp ON notes FOR SELECT USING (1 = 1)")
        .await;
    admin
        .sql("CREATE POLICY other_all ON other FOR SELECT USING (1 = 1)")
        .await;
    admin.sql("DROP POLICY tmp ON notes").await;
    admin.sql("DROP POLICY IF EXISTS never_was ON notes").await;
    // DROP TABLE drops the table's policies.
    admin
        .sql("CREATE TABLE gone (id INTEGER PRIMARY KEY); CREATE POLICY gone_read ON gone FOR SELECT USING (1 = 1)")
        .await;
    admin.sql("DROP TABLE gone").await;

    let alice_token = token("alice", json!({"team": 2}));
    let alice = Client::new(&server, &alice_token);
    assert_eq!(ids(&alice).await, [1, 2, 4, 5], "own notes or team 2");
    assert_eq!(
        ids(&admin).await,
        [1, 2, 3, 4, 5, 6],
        "the admin reads everything"
    );
    let list = policies(&admin).await;
    assert_eq!(
        names(&list),
        ["notes.own_notes", "notes.team_read", "other.other_all"],
        "{list}"
    );

    // A client may not create, drop or list policies.
    let (status, body) = alice
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE POLICY mine ON notes FOR SELECT USING (1 = 1)"}),
        )
        .await;
    assert_forbidden(status, &body, "a client creating a policy");
    let (status, body) = alice
        .post("/v1/sql", &json!({"sql": "DROP POLICY own_notes ON notes"}))
        .await;
    assert_forbidden(status, &body, "a client dropping a policy");
    let (status, body) = alice.get("/v1/policies").await;
    assert_forbidden(status, &body, "a client listing policies");
    assert_eq!(policies(&admin).await, list, "the refusals changed nothing");
    // Table names and schemas hold no data: a client reads them.
    let (status, body) = alice.get("/v1/tables").await;
    assert_eq!(status, 200, "a client listing tables: {body}");
    let mut tables: Vec<&str> = body["tables"]
        .as_array()
        .expect("tables")
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    tables.sort();
    assert_eq!(tables, ["notes", "other"], "{body}");

    admin
        .sql("CREATE POLICY extra ON notes FOR SELECT USING (body = 'public')")
        .await;
    assert_eq!(
        ids(&alice).await,
        [1, 2, 3, 4, 5],
        "own notes, team 2 or public"
    );
    // A policy on a claim of the client's own choosing survives too.
    admin
        .sql("CREATE POLICY by_nick ON notes FOR SELECT USING (owner = auth.nick)")
        .await;
    let dave_token = token("dave", json!({"nick": "carol"}));
    let dave = Client::new(&server, &dave_token);
    assert_eq!(
        ids(&dave).await,
        [3, 4, 6],
        "his own note, carol's by nick, and the public one"
    );

    let want_entries = vec![
        entry("create_policy", "notes", "own_notes"),
        entry("create_policy", "notes", "team_read"),
        entry("create_policy", "notes", "tmp"),
        entry("create_policy", "other", "other_all"),
        entry("drop_policy", "notes", "tmp"),
        entry("create_policy", "notes", "extra"),
        entry("create_policy", "notes", "by_nick"),
    ];
    let entries = policy_entries(&admin).await;
    assert_eq!(entries, want_entries, "policy entries in /v1/changes");

    // kill -9 and restart: recovered from the log.
    let list = policies(&admin).await;
    assert_eq!(
        names(&list),
        [
            "notes.by_nick",
            "notes.extra",
            "notes.own_notes",
            "notes.team_read",
            "other.other_all"
        ]
    );
    server.kill9();
    let server = sec::start(&data, dir.path(), &[]);
    let admin = Client::admin(&server);
    let alice = Client::new(&server, &alice_token);
    assert_eq!(policies(&admin).await, list, "the policies after a restart");
    assert_eq!(
        ids(&Client::new(&server, &dave_token)).await,
        [3, 4, 6],
        "dave reads the same rows"
    );
    assert_eq!(
        ids(&alice).await,
        [1, 2, 3, 4, 5],
        "alice reads the same rows"
    );
    assert_eq!(
        policy_entries(&admin).await,
        want_entries,
        "the changes after a restart"
    );
    let bob = Client::new(&server, &token("bob", json!({})));
    assert_eq!(
        ids(&bob).await,
        [2, 3],
        "bob's own notes and the public one"
    );

    // A snapshot, then kill -9: recovered from the snapshot.
    let (status, body) = admin.post("/v1/admin/snapshot", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    server.kill9();
    let server = sec::start(&data, dir.path(), &[]);
    let admin = Client::admin(&server);
    let alice = Client::new(&server, &alice_token);
    assert_eq!(policies(&admin).await, list, "the policies from a snapshot");
    assert_eq!(
        ids(&alice).await,
        [1, 2, 3, 4, 5],
        "alice reads the same rows"
    );

    // Changes after the snapshot: recovered from the snapshot plus the log after it.
    admin.sql("DROP POLICY team_read ON notes").await;
    admin
        .sql("CREATE POLICY after_snap ON notes FOR SELECT USING (owner = 'dave')")
        .await;
    assert_eq!(ids(&alice).await, [1, 3, 5, 6]);
    let list = policies(&admin).await;
    assert_eq!(
        names(&list),
        [
            "notes.after_snap",
            "notes.by_nick",
            "notes.extra",
            "notes.own_notes",
            "other.other_all"
        ]
    );
    server.kill9();
    let server = sec::start(&data, dir.path(), &[]);
    let admin = Client::admin(&server);
    let alice = Client::new(&server, &alice_token);
    assert_eq!(
        policies(&admin).await,
        list,
        "the policies from a snapshot and the log"
    );
    assert_eq!(ids(&alice).await, [1, 3, 5, 6], "alice reads the same rows");
    let entries = policy_entries(&admin).await;
    assert_eq!(
        entries[entries.len() - 2..],
        [
            entry("drop_policy", "notes", "team_read"),
            entry("create_policy", "notes", "after_snap"),
        ],
        "the last policy entries after a restart: {entries:?}"
    );
}

#[tokio::test]
async fn a_policy_change_resets_or_ends_the_client_subscriptions_reading_its_table() {
    let dir = TempDir::new("policies-rules-changed");
    let server = sec::start(&dir.join("data"), dir.path(), &[]);
    let admin = Client::admin(&server);
    admin
        .sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, team INTEGER, body TEXT); CREATE TABLE other (id INTEGER PRIMARY KEY, v INTEGER)")
        .await;
    admin
        .mutate_ok(json!([
            {"op": "insert", "table": "notes", "row": {"id": 1, "owner": "alice", "team": 1}},
            {"op": "insert", "table": "notes", "row": {"id": 2, "owner": "bob", "team": 2}},
            {"op": "insert", "table": "notes", "row": {"id": 3, "owner": "bob", "team": 1, "body": "public"}},
            {"op": "insert", "table": "notes", "row": {"id": 4, "owner": "carol", "team": 2}},
            {"op": "insert", "table": "notes", "row": {"id": 5, "owner": "alice"}},
            {"op": "insert", "table": "other", "row": {"id": 1, "v": 1}},
        ]))
        .await;
    admin
        .sql("CREATE POLICY own_notes ON notes FOR SELECT USING (owner = auth.sub); CREATE POLICY team_read ON notes FOR SELECT USING (team = auth.team); CREATE POLICY other_all ON other FOR SELECT USING (1 = 1)")
        .await;
    let alice = Client::new(
        &server,
        &token("alice", json!({"team": 2, "nick": "carol"})),
    );

    let mut sse = alice
        .sse("/v1/live", &[("sql", NOTES_BY_ID)])
        .await
        .unwrap_or_else(|e| panic!("alice's live query: {e:?}"));
    let (event, snap) = sse.event().await;
    assert_eq!(event, "snapshot", "{snap}");
    assert_eq!(snap["keys"], json!([1, 2, 4, 5]), "{snap}");
    let mut ws = alice.ws().await;
    ws.send(json!({"id": 1, "type": "subscribe", "qid": "n", "sql": NOTES_BY_ID}))
        .await;
    let snap = ws.next().await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    ws.send(json!({"id": 2, "type": "subscribe", "qid": "o", "sql": "SELECT * FROM other"}))
        .await;
    let snap = ws.next().await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    assert_eq!(snap["qid"], "o", "{snap}");

    // A policy that reads no claim the views did not bind: each subscription reading notes
    // follows at once with a reset snapshot under the new rules — on create and on drop.
    for (sql, keys) in [
        (
            "CREATE POLICY extra ON notes FOR SELECT USING (body = 'public')",
            json!([1, 2, 3, 4, 5]),
        ),
        ("DROP POLICY extra ON notes", json!([1, 2, 4, 5])),
        // Claims the views already bind (`auth.team`, `auth.sub`), read once more.
        (
            "CREATE POLICY team_or_own ON notes FOR SELECT USING (team = auth.team OR owner = auth.sub)",
            json!([1, 2, 4, 5]),
        ),
        ("DROP POLICY team_or_own ON notes", json!([1, 2, 4, 5])),
    ] {
        admin.sql(sql).await;
        let (event, snap) = sse.event().await;
        assert_eq!(event, "snapshot", "SSE after {sql}: {snap}");
        assert_eq!(snap["reset"], true, "SSE after {sql}: {snap}");
        assert_eq!(snap["keys"], keys, "SSE after {sql}: {snap}");
        let snap = ws.next().await;
        assert_eq!(snap["type"], "snapshot", "WS after {sql}: {snap}");
        assert_eq!(snap["qid"], "n", "WS after {sql}: {snap}");
        assert_eq!(snap["reset"], true, "WS after {sql}: {snap}");
        assert_eq!(snap["keys"], keys, "WS after {sql}: {snap}");
    }
    let ws_seq = admin.health_seq().await;

    // A policy that reads a claim the views did not bind (`auth.nick`) ends them with
    // `rules_changed`; the subscription to another table goes on.
    admin
        .sql("CREATE POLICY by_nick ON notes FOR SELECT USING (owner = auth.nick)")
        .await;
    let (event, err) = sse.event().await;
    assert_eq!(event, "error", "{err}");
    assert_eq!(err["error"]["code"], "rules_changed", "{err}");
    assert!(
        sse.ends_within(sec::WAIT).await,
        "the SSE stream ends after rules_changed"
    );
    let err = ws.next().await;
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["qid"], "n", "{err}");
    assert_eq!(err["error"]["code"], "rules_changed", "{err}");
    admin
        .mutate_ok(json!([{"op": "insert", "table": "other", "row": {"id": 2, "v": 2}}]))
        .await;
    let diff = ws.next().await;
    assert_eq!(diff["type"], "diff", "{diff}");
    assert_eq!(diff["qid"], "o", "{diff}");
    // Resubscribing with `since` reads under the new rules, as a reset snapshot; over SSE
    // with `since` as well.
    ws.send(json!({"id": 3, "type": "subscribe", "qid": "n", "sql": NOTES_BY_ID, "since": ws_seq}))
        .await;
    let snap = ws.next().await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    assert_eq!(snap["reset"], true, "{snap}");
    assert_eq!(snap["keys"], json!([1, 2, 4, 5]), "{snap}");
    let mut sse = alice
        .sse(
            "/v1/live",
            &[("sql", NOTES_BY_ID), ("since", &ws_seq.to_string())],
        )
        .await
        .unwrap_or_else(|e| panic!("alice's live query: {e:?}"));
    let (event, snap) = sse.event().await;
    assert_eq!(event, "snapshot", "{snap}");
    assert_eq!(snap["reset"], true, "{snap}");
    assert_eq!(snap["keys"], json!([1, 2, 4, 5]), "{snap}");
    // And the new rule applies to new rows.
    admin
        .mutate_ok(json!([{"op": "insert", "table": "notes", "row": {"id": 6, "owner": "carol", "team": 1}}]))
        .await;
    let (event, diff) = sse.event().await;
    assert_eq!(event, "diff", "{diff}");
    assert_eq!(diff["changes"][0]["key"], 6, "{diff}");
}

/// docs/security.md: a subscription ends with `rules_changed` only when the new rules read a
/// claim the old ones did not. Here the query reads two tables; the new policy is on the
/// second and reads `auth.team`, which the first table's rules already read: a reset snapshot.
#[tokio::test]
async fn a_new_policy_on_a_claim_the_query_already_reads_resets_its_subscriptions() {
    let dir = TempDir::new("policies-same-claims");
    let server = sec::start(&dir.join("data"), dir.path(), &[]);
    let admin = Client::admin(&server);
    admin
        .sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, team INTEGER); CREATE TABLE tags (id INTEGER PRIMARY KEY, team INTEGER)")
        .await;
    admin
        .mutate_ok(json!([
            {"op": "insert", "table": "notes", "row": {"id": 1, "owner": "alice", "team": 1}},
            {"op": "insert", "table": "notes", "row": {"id": 2, "owner": "bob", "team": 2}},
            {"op": "insert", "table": "notes", "row": {"id": 3, "owner": "alice", "team": 2}},
            {"op": "insert", "table": "tags", "row": {"id": 1, "team": 1}},
            {"op": "insert", "table": "tags", "row": {"id": 2, "team": 2}},
            {"op": "insert", "table": "tags", "row": {"id": 3, "team": 1}},
        ]))
        .await;
    admin
        .sql("CREATE POLICY own ON notes FOR SELECT USING (owner = auth.sub OR team = auth.team); CREATE POLICY all_tags ON tags FOR SELECT USING (1 = 1)")
        .await;
    let alice = Client::new(&server, &token("alice", json!({"team": 2})));
    let sql = "SELECT id FROM notes WHERE id IN (SELECT id FROM tags) ORDER BY id";
    let mut sse = alice
        .sse("/v1/live", &[("sql", sql)])
        .await
        .unwrap_or_else(|e| panic!("alice's live query: {e:?}"));
    let (event, snap) = sse.event().await;
    assert_eq!(event, "snapshot", "{snap}");
    assert_eq!(snap["keys"], json!([1, 2, 3]), "{snap}");

    admin.sql("DROP POLICY all_tags ON tags").await;
    let (event, snap) = sse.event().await;
    assert_eq!(event, "snapshot", "after dropping all_tags: {snap}");
    assert_eq!(snap["reset"], true, "{snap}");
    assert_eq!(snap["keys"], json!([]), "{snap}");
    admin
        .sql("CREATE POLICY team_tags ON tags FOR SELECT USING (team = auth.team)")
        .await;
    let (event, snap) = sse.event().await;
    assert_eq!(
        event, "snapshot",
        "a policy reading auth.team, which the query's rules already read: {snap}"
    );
    assert_eq!(snap["reset"], true, "{snap}");
    assert_eq!(snap["keys"], json!([2]), "{snap}");
}
