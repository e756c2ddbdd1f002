//! `POST /v1/sql` with data statements (docs/api.md, "SQL"): several statements are one
//! transaction with one seq, a failing statement is named and changes nothing, the rows a
//! request writes are bounded by `--max-ops`, and a client's statements read and write
//! through the row policies.

mod common;

use std::time::Duration;

use axum::http::Method;
use common::{TempDir, TestDb};
use serde_json::{json, Value};

const SECRET: &str = "sql-test-secret";

fn open(dir: &TempDir) -> TestDb {
    TestDb::open(dir.path(), |c| {
        c.ops_per_mutate_max = 5;
        c.auth.jwt_secret = Some(SECRET.into());
    })
}

fn token(sub: &str) -> String {
    sluice_server::auth::mint_hs256(
        SECRET,
        sub,
        &serde_json::Map::new(),
        Duration::from_secs(600),
    )
}

async fn sql(db: &TestDb, token: Option<&str>, body: Value) -> common::Reply {
    match token {
        None => db.post("/v1/sql", body.to_string()).await,
        Some(t) => {
            db.request_as(Some(t), Method::POST, "/v1/sql", body.to_string())
                .await
        }
    }
}

async fn rows(db: &TestDb) -> Value {
    db.post_ok(
        "/v1/query",
        r#"{"sql": "SELECT id, owner, n FROM notes ORDER BY id"}"#,
    )
    .await["rows"]
        .clone()
}

async fn setup(db: &TestDb) {
    let ddl = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, n INTEGER DEFAULT 0, at TIMESTAMP DEFAULT 0);
               CREATE POLICY own ON notes FOR ALL USING (owner = auth.sub) WITH CHECK (owner = auth.sub)";
    db.post_ok("/v1/sql", &json!({ "sql": ddl }).to_string())
        .await;
}

#[tokio::test]
async fn statements_share_one_commit_and_see_each_other() {
    let dir = TempDir::new("sql-one-commit");
    let db = open(&dir);
    setup(&db).await;
    let before = db.get_ok("/health").await["seq"].as_u64().unwrap();
    let reply = sql(
        &db,
        None,
        json!({"sql": "INSERT INTO notes (id, owner) VALUES (1, 'alice'), (2, $1);
                       UPDATE notes SET n = n + 10 WHERE owner = 'alice';
                       SELECT id, n, at, COUNT(*) OVER () IS NULL AS x FROM notes",
               "params": ["bob"]}),
    )
    .await;
    // A window function is not supported: the whole request fails at statement 2 …
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(reply.json["error"]["statement"], 2, "{}", reply.text);
    // … and nothing of statements 0 and 1 is kept.
    assert_eq!(rows(&db).await, json!([]));
    assert_eq!(db.get_ok("/health").await["seq"].as_u64().unwrap(), before);

    let reply = sql(
        &db,
        None,
        json!({"sql": "INSERT INTO notes (id, owner) VALUES (1, 'alice'), (2, $1);
                       UPDATE notes SET n = n + 10 WHERE owner = 'alice';
                       SELECT id, n, at, n * 2 AS twice FROM notes ORDER BY id",
               "params": ["bob"]}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let seq = reply.json["seq"].as_u64().unwrap();
    assert_eq!(seq, before + 1, "three statements are one commit");
    let results = &reply.json["results"];
    assert_eq!(results[0]["kind"], "insert");
    assert_eq!(results[0]["count"], 2);
    assert_eq!(
        results[0]["results"][1],
        json!({"table": "notes", "id": 2, "version": seq})
    );
    assert_eq!(results[1]["kind"], "update");
    assert_eq!(results[1]["count"], 1);
    assert_eq!(results[2]["kind"], "select");
    assert_eq!(
        results[2]["rows"],
        json!([{"id": 1, "n": 10, "at": 0, "twice": 20}, {"id": 2, "n": 0, "at": 0, "twice": 0}]),
        "the SELECT sees the writes before it"
    );
    assert_eq!(
        results[2]["types"],
        json!(["integer", "integer", "timestamp", null])
    );
    // One commit in the changelog holds every change.
    let changes = db.get_ok(&format!("/v1/changes?since={before}")).await;
    let seqs: Vec<u64> = changes["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![seq, seq, seq]);

    // SQL's TRUE/FALSE reach a BOOLEAN column as booleans.
    db.post_ok(
        "/v1/sql",
        r#"{"sql": "CREATE TABLE flags (id INTEGER PRIMARY KEY, on_ BOOLEAN)"}"#,
    )
    .await;
    let reply = sql(
        &db,
        None,
        json!({"sql": "INSERT INTO flags VALUES (1, true), (2, false); UPDATE flags SET on_ = NOT on_ WHERE id = 2; SELECT * FROM flags ORDER BY id"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        reply.json["results"][2]["rows"],
        json!([{"id": 1, "on_": true}, {"id": 2, "on_": true}])
    );
    let seq = reply.json["seq"].clone();

    // A read-only request consumes no seq; SELECT without FROM works.
    let reply = sql(
        &db,
        None,
        json!({"sql": "SELECT 1 + 2 AS three; SELECT COUNT(*) AS n FROM notes"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json["seq"], seq);
    assert_eq!(reply.json["results"][0]["rows"], json!([{"three": 3}]));
    assert_eq!(reply.json["results"][1]["rows"], json!([{"n": 2}]));
    assert_eq!(reply.json["results"][1]["types"], json!(["integer"]));
    db.close().await;
}

#[tokio::test]
async fn a_failing_statement_is_named_and_changes_nothing() {
    let dir = TempDir::new("sql-fails");
    let db = open(&dir);
    setup(&db).await;
    db.post_ok(
        "/v1/sql",
        r#"{"sql": "INSERT INTO notes (id, owner) VALUES (1, 'a')"}"#,
    )
    .await;
    let before = rows(&db).await;
    let seq = db.get_ok("/health").await["seq"].clone();
    for (body, statement, code) in [
        (
            "UPDATE notes SET n = 1; INSERT INTO notes (id, owner) VALUES (1, 'b')",
            1,
            "already_exists",
        ),
        ("DELETE FROM notes; UPDATE notes SET nope = 1", 1, "schema"),
        (
            "DELETE FROM notes; INSERT INTO notes (id) VALUES (7)",
            1,
            "schema",
        ),
        ("UPDATE notes SET id = 2", 0, "bad_request"),
        (
            "DELETE FROM notes; CREATE TABLE x (id INTEGER PRIMARY KEY)",
            1,
            "unsupported",
        ),
        (
            "INSERT INTO notes (id, owner) SELECT id, owner FROM notes",
            0,
            "unsupported",
        ),
        ("DELETE FROM notes RETURNING id", 0, "unsupported"),
        ("DELETE FROM nowhere", 0, "not_found"),
    ] {
        let reply = sql(&db, None, json!({"sql": body})).await;
        assert_eq!(reply.json["error"]["code"], code, "{body}: {}", reply.text);
        assert_eq!(
            reply.json["error"]["statement"], statement,
            "{body}: {}",
            reply.text
        );
        assert_eq!(rows(&db).await, before, "{body} changed rows");
        assert_eq!(
            db.get_ok("/health").await["seq"],
            seq,
            "{body} moved the seq"
        );
    }

    // The rows one request writes are bounded by --max-ops (5 here), named in the error.
    let reply = sql(
        &db,
        None,
        json!({"sql": "INSERT INTO notes (id, owner) VALUES (2, 'a'), (3, 'a'), (4, 'a'), (5, 'a'); UPDATE notes SET n = 1"}),
    )
    .await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    assert!(
        reply.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-ops"),
        "{}",
        reply.text
    );
    assert_eq!(reply.json["error"]["statement"], 1);
    assert_eq!(rows(&db).await, before);
    db.close().await;
}

#[tokio::test]
async fn a_client_reads_and_writes_through_the_policies() {
    let dir = TempDir::new("sql-rules");
    let db = open(&dir);
    setup(&db).await;
    db.post_ok(
        "/v1/sql",
        r#"{"sql": "INSERT INTO notes (id, owner) VALUES (1, 'alice'), (2, 'bob'), (3, 'alice')"}"#,
    )
    .await;
    let alice = token("alice");

    // Reads see only alice's rows; an UPDATE without WHERE touches only those.
    let reply = sql(
        &db,
        Some(&alice),
        json!({"sql": "UPDATE notes SET n = n + 1; SELECT id FROM notes ORDER BY id"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json["results"][0]["count"], 2);
    assert_eq!(
        reply.json["results"][1]["rows"],
        json!([{"id": 1}, {"id": 3}])
    );
    assert_eq!(
        rows(&db).await,
        json!([{"id": 1, "owner": "alice", "n": 1}, {"id": 2, "owner": "bob", "n": 0}, {"id": 3, "owner": "alice", "n": 1}])
    );

    // Writing a row for someone else is refused, naming the statement and the policy.
    let before = rows(&db).await;
    for body in [
        "INSERT INTO notes (id, owner) VALUES (9, 'alice'); INSERT INTO notes (id, owner) VALUES (10, 'bob')",
        "UPDATE notes SET n = 5; UPDATE notes SET owner = 'bob' WHERE id = 1",
    ] {
        let reply = sql(&db, Some(&alice), json!({"sql": body})).await;
        assert_eq!(reply.status, 403, "{body}: {}", reply.text);
        assert_eq!(reply.json["error"]["statement"], 1, "{}", reply.text);
        assert_eq!(reply.json["error"]["policies"], json!(["own"]), "{}", reply.text);
        assert_eq!(rows(&db).await, before, "{body} changed rows");
    }
    // An upsert may not update a row its caller cannot read.
    let reply = sql(
        &db,
        Some(&alice),
        json!({"sql": "INSERT INTO notes (id, owner) VALUES (2, 'alice') ON CONFLICT (id) DO UPDATE SET n = 99"}),
    )
    .await;
    assert_eq!(
        reply.json["error"]["code"], "already_exists",
        "{}",
        reply.text
    );
    // DELETE sees only readable rows.
    let reply = sql(&db, Some(&alice), json!({"sql": "DELETE FROM notes"})).await;
    assert_eq!(reply.json["results"][0]["count"], 2, "{}", reply.text);
    assert_eq!(rows(&db).await, json!([{"id": 2, "owner": "bob", "n": 0}]));

    // Schema statements and "as" are the admin's.
    let reply = sql(&db, Some(&alice), json!({"sql": "DROP TABLE notes"})).await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    let reply = sql(
        &db,
        Some(&alice),
        json!({"sql": "SELECT * FROM notes", "as": {"sub": "bob"}}),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    // The admin previews what a client would see.
    let preview = db
        .post_ok(
            "/v1/query",
            r#"{"sql": "SELECT id FROM notes", "as": {"sub": "bob"}}"#,
        )
        .await;
    assert_eq!(preview["rows"], json!([{"id": 2}]));
    let preview = db
        .post_ok(
            "/v1/query",
            r#"{"sql": "SELECT id FROM notes", "as": {"sub": "carol"}}"#,
        )
        .await;
    assert_eq!(preview["rows"], json!([]));
    db.close().await;
}
