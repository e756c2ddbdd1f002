//! Bad input is refused clearly and changes nothing.
//!
//! Every malformed or invalid request gets the right HTTP status and
//! `{"error": {"code", "message", …}}` — with the failing `op` (mutate) or `statement` (DDL)
//! where one failed, and the flag name of any limit it hit — and afterwards `/health`'s seq,
//! every table's schema and rows, the commit counter and the changelog are exactly as
//! before. Reopening the data directory shows the same state, so nothing reached the log
//! either. Runs in process through the router with small limits.

mod common;

use axum::http::Method;
use common::{TempDir, TestDb};
use serde_json::{json, Map, Value};
use sluice_server::Config;

fn small_limits(config: &mut Config) {
    config.body_bytes_max = 2048;
    config.ops_per_mutate_max = 4;
    config.limits.row_bytes_max = 256;
    config.limits.columns_per_table_max = 4;
    config.page_rows_max = 100;
}

const SCHEMA: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, qty INTEGER DEFAULT 0, note TEXT); \
                      CREATE TABLE tags (id TEXT PRIMARY KEY, n INTEGER)";

/// Opens a database with two tables and a few rows (a row's version is the seq of the commit
/// that last wrote it: the DDL is seq 1, the inserts seq 2, and items 1 is at version 3).
async fn open_with_rows(dir: &TempDir) -> TestDb {
    let db = TestDb::open(dir.path(), small_limits);
    db.post_ok("/v1/sql", &json!({ "sql": SCHEMA }).to_string())
        .await;
    db.post_ok(
        "/v1/mutate",
        r#"{"ops": [
            {"op": "insert", "table": "items", "row": {"id": 1, "name": "one", "qty": 1}},
            {"op": "insert", "table": "items", "row": {"id": 2, "name": "two"}},
            {"op": "insert", "table": "tags", "row": {"id": "a", "n": 1}}]}"#,
    )
    .await;
    db.post_ok(
        "/v1/mutate",
        r#"{"ops": [{"op": "patch", "table": "items", "id": 1, "set": {"qty": 5}}]}"#,
    )
    .await;
    db
}

/// Everything a refused request must leave alone: seq, schemas, rows and versions.
async fn fingerprint(db: &TestDb) -> Value {
    let seq = db.get_ok("/health").await["seq"].clone();
    let tables = db.get_ok("/v1/tables").await["tables"].clone();
    let mut rows = Map::new();
    for t in tables.as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let page = db
            .get_ok(&format!("/v1/tables/{name}/rows?limit=100"))
            .await;
        rows.insert(name.to_string(), page["rows"].clone());
    }
    json!({"seq": seq, "tables": tables, "rows": rows})
}

/// One bad request and how it must be refused.
struct Case {
    what: &'static str,
    method: Method,
    uri: &'static str,
    body: String,
    status: u16,
    code: &'static str,
    /// `("op", i)` or `("statement", i)`: the detail naming what failed.
    at: Option<(&'static str, u64)>,
    /// A substring of the message (a limit's flag, the offending name).
    mentions: Option<&'static str>,
}

impl Case {
    fn new(
        what: &'static str,
        uri: &'static str,
        body: impl Into<String>,
        status: u16,
        code: &'static str,
    ) -> Case {
        Case {
            what,
            method: Method::POST,
            uri,
            body: body.into(),
            status,
            code,
            at: None,
            mentions: None,
        }
    }
    fn get(what: &'static str, uri: &'static str, status: u16, code: &'static str) -> Case {
        Case {
            method: Method::GET,
            ..Case::new(what, uri, "", status, code)
        }
    }
    fn at(mut self, key: &'static str, index: u64) -> Case {
        self.at = Some((key, index));
        self
    }
    fn mentions(mut self, text: &'static str) -> Case {
        self.mentions = Some(text);
        self
    }
}

/// Sends every case and checks its error, and that nothing changed.
async fn refuse_all(db: &TestDb, cases: Vec<Case>) {
    let before = fingerprint(db).await;
    let commits = db.metric("sluice_commits_total").await;
    for case in cases {
        let shown: String = case.body.chars().take(300).collect();
        let context = format!("{}: {} {} {shown}", case.what, case.method, case.uri);
        let reply = db
            .request(case.method.clone(), case.uri, case.body.clone())
            .await;
        assert_eq!(reply.status, case.status, "{context}\n=> {}", reply.text);
        let error = &reply.json["error"];
        assert_eq!(error["code"], case.code, "{context}\n=> {}", reply.text);
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            !message.is_empty(),
            "{context}: no message\n=> {}",
            reply.text
        );
        if let Some((key, index)) = case.at {
            assert_eq!(error[key], index, "{context}: {key}\n=> {}", reply.text);
        }
        if let Some(text) = case.mentions {
            assert!(
                message.contains(text),
                "{context}: message must mention {text:?}\n=> {}",
                reply.text
            );
        }
        assert_eq!(
            fingerprint(db).await,
            before,
            "{context}: the state changed"
        );
        assert_eq!(
            db.metric("sluice_commits_total").await,
            commits,
            "{context}: a commit was counted"
        );
    }
    let seq = before["seq"].as_u64().unwrap();
    let changes = db.get_ok(&format!("/v1/changes?since={seq}")).await;
    assert_eq!(
        changes["changes"],
        json!([]),
        "refused requests reached the changelog"
    );
}

/// Closes the database, reopens the directory, and expects the same state.
async fn reopen_unchanged(db: TestDb, dir: &TempDir) {
    let before = fingerprint(&db).await;
    db.close().await;
    let db = TestDb::open(dir.path(), small_limits);
    assert_eq!(
        fingerprint(&db).await,
        before,
        "the state after reopening differs"
    );
    db.close().await;
}

const INS10: &str = r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "ten"}}"#;

fn ops(ops: &[&str]) -> String {
    format!(r#"{{"ops": [{}]}}"#, ops.join(", "))
}

fn mutate_cases() -> Vec<Case> {
    let m = "/v1/mutate";
    let long = "x".repeat(300);
    let too_big = ops(&[&format!(
        r#"{{"op": "insert", "table": "items", "row": {{"id": 10, "name": "{}"}}}}"#,
        "y".repeat(3000)
    )]);
    vec![
        Case::new("malformed JSON", m, r#"{"ops": ["#, 400, "bad_request").mentions("malformed JSON"),
        Case::new("a body that is not an object", m, r#"[{"op": "insert"}]"#, 400, "bad_request"),
        Case::new("an empty body", m, "", 400, "bad_request"),
        Case::new("no ops", m, "{}", 400, "bad_request"),
        Case::new("ops that are not an array", m, r#"{"ops": {"op": "insert"}}"#, 400, "bad_request"),
        Case::new("empty ops", m, r#"{"ops": []}"#, 400, "bad_request"),
        Case::new("an unknown field in the mutate", m, format!(r#"{{"ops": [{INS10}], "dry_run": true}}"#), 400, "bad_request")
            .mentions("dry_run"),
        Case::new("an unknown durability class", m, format!(r#"{{"ops": [{INS10}], "durability": "eventually"}}"#), 400, "bad_request"),
        Case::new("an unknown op", m, ops(&[INS10, r#"{"op": "frobnicate", "table": "items"}"#]), 400, "bad_request")
            .at("op", 1)
            .mentions("frobnicate"),
        Case::new("an op that is not an object", m, ops(&[INS10, "42"]), 400, "bad_request").at("op", 1),
        Case::new("an op without a table", m, ops(&[r#"{"op": "insert", "row": {"id": 10, "name": "x"}}"#]), 400, "bad_request")
            .at("op", 0),
        Case::new("an unknown field in an op", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "x"}, "colour": "red"}"#]), 400, "bad_request")
            .at("op", 0)
            .mentions("colour"),
        Case::new("an insert without a row", m, ops(&[r#"{"op": "insert", "table": "items"}"#]), 400, "bad_request").at("op", 0),
        Case::new("a patch without an id", m, ops(&[r#"{"op": "patch", "table": "items", "set": {"qty": 1}}"#]), 400, "bad_request")
            .at("op", 0),
        Case::new("an if_version that is not an integer", m, ops(&[r#"{"op": "patch", "table": "items", "id": 1, "set": {"qty": 1}, "if_version": "2"}"#]), 400, "bad_request")
            .at("op", 0),
        Case::new("an unknown table", m, ops(&[INS10, r#"{"op": "insert", "table": "nope", "row": {"id": 1}}"#]), 404, "not_found")
            .at("op", 1)
            .mentions("nope"),
        Case::new("an unknown column", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "x", "colour": "red"}}"#]), 400, "schema")
            .at("op", 0)
            .mentions("colour"),
        Case::new("a wrong type", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "x", "qty": "three"}}"#]), 400, "schema")
            .at("op", 0)
            .mentions("qty"),
        Case::new("a fraction for an INTEGER", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "x", "qty": 1.5}}"#]), 400, "schema")
            .at("op", 0),
        Case::new("a key of the wrong type", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": "ten", "name": "x"}}"#]), 400, "schema")
            .at("op", 0),
        Case::new("a missing primary key", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"name": "x"}}"#]), 400, "schema")
            .at("op", 0)
            .mentions("primary key"),
        Case::new("a missing NOT NULL column", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10}}"#]), 400, "schema")
            .at("op", 0)
            .mentions("name"),
        Case::new("an insert of an existing key", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 1, "name": "again"}}"#]), 409, "already_exists")
            .at("op", 0),
        Case::new("two inserts of one key in one mutate", m, ops(&[INS10, INS10]), 409, "already_exists").at("op", 1),
        Case::new("a patch of a missing key", m, ops(&[INS10, r#"{"op": "patch", "table": "items", "id": 999, "set": {"qty": 1}}"#]), 404, "not_found")
            .at("op", 1),
        Case::new("a delete of a missing key", m, ops(&[r#"{"op": "delete", "table": "items", "id": 999}"#]), 404, "not_found")
            .at("op", 0),
        Case::new("a patch with a stale if_version", m, ops(&[r#"{"op": "patch", "table": "items", "id": 1, "set": {"qty": 7}, "if_version": 2}"#]), 409, "conflict")
            .at("op", 0),
        Case::new("a delete with a wrong if_version", m, ops(&[INS10, r#"{"op": "delete", "table": "items", "id": 2, "if_version": 5}"#]), 409, "conflict")
            .at("op", 1),
        Case::new("an insert with if_version of an absent row", m, ops(&[r#"{"op": "insert", "table": "items", "row": {"id": 10, "name": "x"}, "if_version": 3}"#]), 409, "conflict")
            .at("op", 0),
        Case::new("an if_version taken before a delete, against the re-inserted row", m, ops(&[
            r#"{"op": "delete", "table": "items", "id": 2, "if_version": 2}"#,
            r#"{"op": "insert", "table": "items", "row": {"id": 2, "name": "again"}}"#,
            r#"{"op": "patch", "table": "items", "id": 2, "set": {"qty": 1}, "if_version": 2}"#]), 409, "conflict")
            .at("op", 2),
        Case::new("an upsert with a stale if_version", m, ops(&[r#"{"op": "upsert", "table": "items", "row": {"id": 1, "name": "x"}, "if_version": 2}"#]), 409, "conflict")
            .at("op", 0),
        Case::new("a patch of the primary key", m, ops(&[r#"{"op": "patch", "table": "items", "id": 1, "set": {"id": 5}}"#]), 400, "bad_request")
            .at("op", 0)
            .mentions("primary key"),
        Case::new("a patch naming the primary key with its current value", m, ops(&[r#"{"op": "patch", "table": "items", "id": 1, "set": {"id": 1, "qty": 2}}"#]), 400, "bad_request")
            .at("op", 0)
            .mentions("\"id\""),
        Case::new("a patch to NULL of a NOT NULL column", m, ops(&[r#"{"op": "patch", "table": "items", "id": 1, "set": {"name": null}}"#]), 400, "schema")
            .at("op", 0),
        Case::new("a delete by a key of the wrong type", m, ops(&[r#"{"op": "delete", "table": "items", "id": "x"}"#]), 400, "schema")
            .at("op", 0),
        Case::new("a body over --max-body-bytes", m, too_big, 413, "limit").mentions("--max-body-bytes"),
        Case::new("more ops than --max-ops", m, ops(&[INS10; 5]), 413, "limit").mentions("--max-ops"),
        Case::new("a row over --max-row-bytes", m, ops(&[&format!(r#"{{"op": "insert", "table": "items", "row": {{"id": 10, "name": "x", "note": "{long}"}}}}"#)]), 413, "limit")
            .at("op", 0)
            .mentions("--max-row-bytes"),
        Case::new("a patch that makes a row over --max-row-bytes", m, ops(&[INS10, &format!(r#"{{"op": "patch", "table": "items", "id": 1, "set": {{"note": "{long}"}}}}"#)]), 413, "limit")
            .at("op", 1)
            .mentions("--max-row-bytes"),
        Case::new("a failing op after writes to both tables", m, ops(&[
            r#"{"op": "patch", "table": "items", "id": 1, "set": {"qty": 99}, "if_version": 3}"#,
            r#"{"op": "delete", "table": "items", "id": 2}"#,
            r#"{"op": "upsert", "table": "tags", "row": {"id": "b", "n": 2}}"#,
            r#"{"op": "insert", "table": "tags", "row": {"id": "a"}}"#]), 409, "already_exists")
            .at("op", 3),
    ]
}

fn ddl_cases() -> Vec<Case> {
    let s = "/v1/sql";
    let sql = |text: &str| json!({ "sql": text }).to_string();
    let too_big = sql(&format!(
        "CREATE TABLE fresh (id INTEGER PRIMARY KEY, {} INTEGER)",
        "c".repeat(3000)
    ));
    vec![
        Case::new("malformed JSON", s, r#"{"sql": "#, 400, "bad_request"),
        Case::new("no sql field", s, r#"{"query": "CREATE TABLE fresh (id INTEGER PRIMARY KEY)"}"#, 400, "bad_request"),
        Case::new("sql that is not a string", s, r#"{"sql": 5}"#, 400, "bad_request"),
        Case::new("a bad durability", s, r#"{"sql": "CREATE TABLE fresh (id INTEGER PRIMARY KEY)", "durability": 5}"#, 400, "bad_request"),
        Case::new("a syntax error", s, sql("CREATE TABLE ("), 400, "bad_request").mentions("syntax"),
        Case::new("no statement", s, sql(""), 400, "bad_request"),
        Case::new("DDL mixed with data statements", s, sql("DELETE FROM items; CREATE TABLE fresh (id INTEGER PRIMARY KEY)"), 400, "unsupported")
            .at("statement", 1),
        Case::new("a write that fails after one that worked", s, sql("DELETE FROM items; UPDATE items SET nope = 1"), 400, "schema")
            .at("statement", 1),
        Case::new("an unsupported column type", s, sql("CREATE TABLE fresh (id INTEGER PRIMARY KEY, d DECIMAL)"), 400, "unsupported")
            .mentions("DECIMAL"),
        Case::new("an unsupported second statement", s, sql("CREATE TABLE fresh (id INTEGER PRIMARY KEY); CREATE UNIQUE INDEX u ON items (name)"), 400, "unsupported"),
        Case::new("a table without a primary key", s, sql("CREATE TABLE fresh (a INTEGER)"), 400, "schema"),
        Case::new("an existing table", s, sql("CREATE TABLE items (id INTEGER PRIMARY KEY)"), 409, "already_exists")
            .at("statement", 0),
        Case::new("a table over --max-columns", s, sql("CREATE TABLE wide (a INTEGER PRIMARY KEY, b INTEGER, c INTEGER, d INTEGER, e INTEGER)"), 413, "limit")
            .at("statement", 0)
            .mentions("--max-columns"),
        Case::new("a column past --max-columns", s, sql("ALTER TABLE items ADD COLUMN extra INTEGER"), 413, "limit")
            .at("statement", 0)
            .mentions("--max-columns"),
        Case::new("a NOT NULL column without a default", s, sql("ALTER TABLE tags ADD COLUMN extra INTEGER NOT NULL"), 400, "schema")
            .at("statement", 0),
        Case::new("an existing column", s, sql("ALTER TABLE tags ADD COLUMN n INTEGER"), 409, "already_exists")
            .at("statement", 0),
        Case::new("an index on an unknown column", s, sql("CREATE INDEX ix ON items (nope)"), 400, "schema")
            .at("statement", 0)
            .mentions("nope"),
        Case::new("dropping an unknown table", s, sql("DROP TABLE nope"), 404, "not_found").at("statement", 0),
        Case::new("a second statement that fails after a CREATE TABLE", s, sql("CREATE TABLE fresh (id INTEGER PRIMARY KEY); CREATE TABLE items (id INTEGER PRIMARY KEY)"), 409, "already_exists")
            .at("statement", 1),
        Case::new("a third statement that fails after CREATE and ALTER of a new table", s, sql("CREATE TABLE fresh (id INTEGER PRIMARY KEY); ALTER TABLE fresh ADD COLUMN x INTEGER; CREATE INDEX ix ON fresh (nope)"), 400, "schema")
            .at("statement", 2),
        Case::new("a second statement that fails after ADD COLUMN to a table with rows", s, sql("ALTER TABLE tags ADD COLUMN extra INTEGER DEFAULT 7; CREATE INDEX by_nope ON tags (nope)"), 400, "schema")
            .at("statement", 1),
        Case::new("a second statement that fails after DROP TABLE", s, sql("DROP TABLE items; CREATE TABLE tags (id TEXT PRIMARY KEY)"), 409, "already_exists")
            .at("statement", 1),
        Case::new("a second statement that fails after CREATE INDEX", s, sql("CREATE INDEX by_n ON tags (n); DROP TABLE nope"), 404, "not_found")
            .at("statement", 1),
        Case::new("a third statement that fails after a table was dropped and re-created", s, sql("DROP TABLE tags; CREATE TABLE tags (id TEXT PRIMARY KEY, other TEXT); CREATE TABLE items (id INTEGER PRIMARY KEY)"), 409, "already_exists")
            .at("statement", 2),
        Case::new("a body over --max-body-bytes", s, too_big, 413, "limit").mentions("--max-body-bytes"),
    ]
}

fn read_cases() -> Vec<Case> {
    vec![
        Case::get("an unknown table", "/v1/tables/nope/rows", 404, "not_found"),
        Case::get(
            "a row of an unknown table",
            "/v1/tables/nope/rows/1",
            404,
            "not_found",
        ),
        Case::get(
            "a missing row",
            "/v1/tables/items/rows/999",
            404,
            "not_found",
        ),
        Case::get(
            "a key of the wrong type",
            "/v1/tables/items/rows/abc",
            400,
            "schema",
        ),
        Case::get(
            "an after of the wrong type",
            "/v1/tables/items/rows?after=abc",
            400,
            "schema",
        ),
        Case::get(
            "a zero limit",
            "/v1/tables/items/rows?limit=0",
            400,
            "bad_request",
        ),
        Case::get(
            "a limit that is not a number",
            "/v1/tables/items/rows?limit=many",
            400,
            "bad_request",
        ),
        Case::get(
            "a limit over --max-page-rows",
            "/v1/tables/items/rows?limit=101",
            413,
            "limit",
        )
        .mentions("--max-page-rows"),
        Case::get(
            "a negative since",
            "/v1/changes?since=-1",
            400,
            "bad_request",
        ),
        Case::get(
            "a changes limit over --max-page-rows",
            "/v1/changes?limit=101",
            413,
            "limit",
        )
        .mentions("--max-page-rows"),
        Case::get("an unknown path", "/v2/anything", 404, "not_found"),
        Case::new(
            "an unknown path (POST)",
            "/v1/nothing",
            "{}",
            404,
            "not_found",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_mutates_are_refused_and_change_nothing() {
    let dir = TempDir::new("bad-mutate");
    let db = open_with_rows(&dir).await;
    refuse_all(&db, mutate_cases()).await;
    reopen_unchanged(db, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ddl_is_refused_and_changes_nothing() {
    let dir = TempDir::new("bad-ddl");
    let db = open_with_rows(&dir).await;
    refuse_all(&db, ddl_cases()).await;
    reopen_unchanged(db, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reads_and_unknown_routes_get_structured_errors() {
    let dir = TempDir::new("bad-read");
    let db = open_with_rows(&dir).await;
    refuse_all(&db, read_cases()).await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_gets_a_structured_error() {
    let dir = TempDir::new("bad-method");
    let db = open_with_rows(&dir).await;
    for (method, uri) in [(Method::GET, "/v1/mutate"), (Method::POST, "/v1/tables")] {
        let reply = db.request(method.clone(), uri, "{}").await;
        assert_eq!(reply.status, 405, "{method} {uri}: {}", reply.text);
        let error = &reply.json["error"];
        assert!(
            error["code"].as_str().is_some_and(|c| !c.is_empty())
                && error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {uri}: the refusal must be {{\"error\": {{\"code\", \"message\"}}}}, got {:?}",
            reply.text
        );
    }
    db.close().await;
}
