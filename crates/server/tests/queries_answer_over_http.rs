//! `POST /v1/query`: one-shot SELECTs over HTTP, with the error codes of the API.

mod common;

use common::{TempDir, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_select_returns_columns_rows_and_the_seq_it_reflects() {
    let dir = TempDir::new("query-http");
    let db = TestDb::open(dir.path(), |_| {});
    db.post_ok(
        "/v1/sql",
        r#"{"sql":"CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT NOT NULL, n INTEGER)"}"#,
    )
    .await;
    let ok = db
        .post_ok(
            "/v1/mutate",
            &json!({"ops": [
                {"op": "insert", "table": "msgs", "row": {"id": 1, "room": "a", "n": 5}},
                {"op": "insert", "table": "msgs", "row": {"id": 2, "room": "b", "n": 7}},
                {"op": "insert", "table": "msgs", "row": {"id": 3, "room": "a", "n": null}},
            ]})
            .to_string(),
        )
        .await;
    let seq = ok["seq"].as_u64().unwrap();

    let r = db
        .post_ok(
            "/v1/query",
            &json!({"sql": "SELECT id, n * 2 AS double FROM msgs WHERE room = $1 ORDER BY id DESC", "params": ["a"]})
                .to_string(),
        )
        .await;
    assert_eq!(r["seq"], seq);
    assert_eq!(r["columns"], json!(["id", "double"]));
    assert_eq!(
        r["rows"],
        json!([{"id": 3, "double": null}, {"id": 1, "double": 10}])
    );

    let r = db
        .post_ok(
            "/v1/query",
            &json!({"sql": "SELECT room, COUNT(*) AS c, SUM(n) AS s FROM msgs GROUP BY room HAVING COUNT(*) > :min ORDER BY room",
                    "params": {"min": 1}})
                .to_string(),
        )
        .await;
    assert_eq!(r["rows"], json!([{"room": "a", "c": 2, "s": 5}]));

    let cases = [
        (
            json!({"sql": "SELECT id FROM msgs UNION SELECT id FROM msgs"}),
            400,
            "unsupported",
        ),
        (json!({"sql": "SELECT nope FROM msgs"}), 400, "schema"),
        (json!({"sql": "SELECT * FROM missing"}), 404, "not_found"),
        (json!({"sql": "SELEC id"}), 400, "bad_request"),
        (
            json!({"sql": "SELECT id FROM msgs WHERE id = $1"}),
            400,
            "bad_request",
        ),
        (json!({"sql": "SELECT 1", "extra": 1}), 400, "bad_request"),
    ];
    for (body, status, code) in cases {
        let reply = db.post("/v1/query", body.to_string()).await;
        assert_eq!(reply.status, status, "{body}: {}", reply.json);
        assert_eq!(reply.json["error"]["code"], code, "{body}: {}", reply.json);
    }

    // Without a token a query is refused before it runs.
    let reply = db
        .request_as(
            None,
            axum::http::Method::POST,
            "/v1/query",
            json!({"sql": "SELECT id FROM msgs"}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 401, "{}", reply.json);
    assert_eq!(
        reply.json["error"]["code"], "unauthorized",
        "{}",
        reply.json
    );
    assert_eq!(reply.json["error"]["reason"], "missing", "{}", reply.json);
    db.close().await;
}
