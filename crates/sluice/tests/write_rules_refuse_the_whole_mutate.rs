//! Write rules (docs/security.md "Writes"): a client's mutate applies its ops, then checks
//! every changed row — an insert (or an upsert that inserts) against the `WITH CHECK` of some
//! `INSERT`/`ALL` policy (a policy without `WITH CHECK` uses its `USING`), an update, patch
//! (or an upsert that updates) against the `USING` of some `UPDATE`/`ALL` policy on the old
//! row and the `WITH CHECK` on the new row, a delete against the `USING` of some
//! `DELETE`/`ALL` policy on the old row. One refused op refuses the whole batch with 403
//! `forbidden` naming the op index, the command, the table and the policies tried; nothing
//! changes and the seq does not move (`GET /health` before and after). Allowed batches pass.
//! Over HTTP and over WebSocket; the admin token bypasses every rule.

mod common;
mod sec;

use common::TempDir;
use sec::{assert_forbidden, token, Client};
use serde_json::{json, Value};

const SCHEMA: &str = "
CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT);
CREATE TABLE docs (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, team INTEGER, locked BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE tasks (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, title TEXT);
CREATE TABLE logs (id INTEGER PRIMARY KEY, line TEXT)";

const POLICIES: &str = "
CREATE POLICY read_own ON notes FOR SELECT USING (owner = auth.sub);
CREATE POLICY write_own ON notes FOR ALL USING (owner = auth.sub) WITH CHECK (owner = auth.sub);
CREATE POLICY docs_read ON docs FOR SELECT USING (team = auth.team);
CREATE POLICY ins_team ON docs FOR INSERT WITH CHECK (team = auth.team);
CREATE POLICY upd_own ON docs FOR UPDATE USING (owner = auth.sub) WITH CHECK (team = auth.team);
CREATE POLICY del_unlocked ON docs FOR DELETE USING (owner = auth.sub AND NOT locked);
CREATE POLICY mine ON tasks FOR ALL USING (owner = auth.sub);
CREATE POLICY logs_read ON logs FOR SELECT USING (1 = 1)";

/// Every row of every table, as the admin reads them.
async fn everything(admin: &Client) -> Value {
    let mut all = serde_json::Map::new();
    for t in ["notes", "docs", "tasks", "logs"] {
        all.insert(
            t.into(),
            Value::Array(admin.query(&format!("SELECT * FROM {t} ORDER BY id")).await),
        );
    }
    Value::Object(all)
}

/// A refusal as the contract describes it.
struct Refusal {
    op: u64,
    command: &'static str,
    table: &'static str,
    policies: &'static [&'static str],
    /// Words the message must contain (e.g. `WITH CHECK` or `USING`).
    says: &'static [&'static str],
}

fn check_refusal(err: &serde_json::Map<String, Value>, want: &Refusal, what: &str) {
    assert_eq!(err["op"], json!(want.op), "{what}: the op index: {err:?}");
    assert_eq!(
        err["command"],
        json!(want.command),
        "{what}: the command: {err:?}"
    );
    assert_eq!(
        err["table"],
        json!(want.table),
        "{what}: the table: {err:?}"
    );
    let mut policies: Vec<String> = err["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: a policies list: {err:?}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    policies.sort();
    let mut expected: Vec<String> = want.policies.iter().map(|p| p.to_string()).collect();
    expected.sort();
    assert_eq!(policies, expected, "{what}: the policies tried: {err:?}");
    let message = err["message"].as_str().expect("a message");
    assert!(
        message.contains(&format!("op {}", want.op)),
        "{what}: the message names the op: {message}"
    );
    assert!(
        message.contains(want.table),
        "{what}: the message names the table: {message}"
    );
    for p in want.policies {
        assert!(
            message.contains(p),
            "{what}: the message names {p}: {message}"
        );
    }
    for w in want.says {
        assert!(
            message.contains(w),
            "{what}: the message says {w:?}: {message}"
        );
    }
}

/// Runs `ops` as `client` over HTTP, expecting the refusal `want`; checks that nothing
/// changed and the seq did not move.
async fn refused_over_http(admin: &Client, client: &Client, ops: Value, want: Refusal, what: &str) {
    let before = everything(admin).await;
    let seq = admin.health_seq().await;
    let (status, body) = client.mutate(ops.clone()).await;
    let err = assert_forbidden(status, &body, &format!("{what}: {ops}"));
    check_refusal(&err, &want, what);
    assert_eq!(admin.health_seq().await, seq, "{what}: the seq moved");
    assert_eq!(everything(admin).await, before, "{what}: something changed");
}

fn ins(table: &str, row: Value) -> Value {
    json!({"op": "insert", "table": table, "row": row})
}
fn ups(table: &str, row: Value) -> Value {
    json!({"op": "upsert", "table": table, "row": row})
}
fn patch(table: &str, id: i64, set: Value) -> Value {
    json!({"op": "patch", "table": table, "id": id, "set": set})
}
fn del(table: &str, id: i64) -> Value {
    json!({"op": "delete", "table": table, "id": id})
}

async fn setup(name: &str) -> (TempDir, common::Server) {
    let dir = TempDir::new(name);
    let data = dir.join("data");
    let server = sec::start(&data, dir.path(), &[]);
    let admin = Client::admin(&server);
    admin.sql(SCHEMA).await;
    admin.sql(POLICIES).await;
    // The admin token bypasses every rule: rows of both users, a locked doc, a log line.
    admin
        .mutate_ok(json!([
            ins("notes", json!({"id": 1, "owner": "alice", "body": "a1"})),
            ins("notes", json!({"id": 2, "owner": "bob", "body": "b2"})),
            ins("docs", json!({"id": 1, "owner": "alice", "team": 1})),
            ins(
                "docs",
                json!({"id": 2, "owner": "alice", "team": 1, "locked": true})
            ),
            ins("docs", json!({"id": 3, "owner": "bob", "team": 1})),
            ins("tasks", json!({"id": 1, "owner": "alice", "title": "t1"})),
            ins("tasks", json!({"id": 2, "owner": "bob", "title": "t2"})),
            ins("logs", json!({"id": 1, "line": "started"})),
        ]))
        .await;
    (dir, server)
}

#[tokio::test]
async fn forbidden_ops_refuse_the_whole_batch_over_http() {
    let (_dir, server) = setup("write-rules-http").await;
    let admin = Client::admin(&server);
    let alice = Client::new(&server, &token("alice", json!({"team": 1})));

    // Insert: the second op inserts a note for bob (WITH CHECK of write_own fails); the first,
    // allowed alone, is not kept either.
    refused_over_http(
        &admin,
        &alice,
        json!([
            ins("notes", json!({"id": 10, "owner": "alice", "body": "mine"})),
            ins("notes", json!({"id": 11, "owner": "bob", "body": "forged"})),
        ]),
        Refusal {
            op: 1,
            command: "insert",
            table: "notes",
            policies: &["write_own"],
            says: &["WITH CHECK"],
        },
        "insert of a note for another owner",
    )
    .await;

    // Update that moves alice's own row to bob: USING passes on the old row, WITH CHECK fails
    // on the new one.
    refused_over_http(
        &admin,
        &alice,
        json!([
            patch("notes", 1, json!({"body": "edited"})),
            patch("notes", 1, json!({"owner": "bob"})),
        ]),
        Refusal {
            op: 1,
            command: "update",
            table: "notes",
            policies: &["write_own"],
            says: &["WITH CHECK"],
        },
        "patch moving a row to another owner",
    )
    .await;

    // Update of bob's row that would even make it alice's: USING fails on the old row.
    refused_over_http(
        &admin,
        &alice,
        json!([patch("notes", 2, json!({"owner": "alice"}))]),
        Refusal {
            op: 0,
            command: "update",
            table: "notes",
            policies: &["write_own"],
            says: &["USING"],
        },
        "patch of another owner's row",
    )
    .await;

    // Delete of bob's note.
    refused_over_http(
        &admin,
        &alice,
        json!([
            ins("notes", json!({"id": 12, "owner": "alice"})),
            del("notes", 1),
            del("notes", 2),
        ]),
        Refusal {
            op: 2,
            command: "delete",
            table: "notes",
            policies: &["write_own"],
            says: &["USING"],
        },
        "delete of another owner's row",
    )
    .await;

    // Upsert that inserts a row for bob (checked as an insert).
    refused_over_http(
        &admin,
        &alice,
        json!([ups("notes", json!({"id": 20, "owner": "bob"}))]),
        Refusal {
            op: 0,
            command: "insert",
            table: "notes",
            policies: &["write_own"],
            says: &["WITH CHECK"],
        },
        "upsert inserting a row for another owner",
    )
    .await;

    // Upsert that replaces bob's row with one of alice's (checked as an update: USING fails).
    refused_over_http(
        &admin,
        &alice,
        json!([ups(
            "notes",
            json!({"id": 2, "owner": "alice", "body": "taken"})
        )]),
        Refusal {
            op: 0,
            command: "update",
            table: "notes",
            policies: &["write_own"],
            says: &["USING"],
        },
        "upsert replacing another owner's row",
    )
    .await;

    // docs: separate INSERT / UPDATE / DELETE policies. WITH CHECK and USING are distinct:
    // alice may update her own docs (USING owner) only into her team (WITH CHECK team).
    refused_over_http(
        &admin,
        &alice,
        json!([ins("docs", json!({"id": 9, "owner": "alice", "team": 2}))]),
        Refusal {
            op: 0,
            command: "insert",
            table: "docs",
            policies: &["ins_team"],
            says: &["WITH CHECK"],
        },
        "insert into another team",
    )
    .await;
    refused_over_http(
        &admin,
        &alice,
        json!([patch("docs", 1, json!({"team": 2}))]),
        Refusal {
            op: 0,
            command: "update",
            table: "docs",
            policies: &["upd_own"],
            says: &["WITH CHECK"],
        },
        "update of an own doc into another team (WITH CHECK)",
    )
    .await;
    refused_over_http(
        &admin,
        &alice,
        json!([patch("docs", 3, json!({"locked": true}))]),
        Refusal {
            op: 0,
            command: "update",
            table: "docs",
            policies: &["upd_own"],
            says: &["USING"],
        },
        "update of a doc of the same team but another owner (USING)",
    )
    .await;
    refused_over_http(
        &admin,
        &alice,
        json!([del("docs", 1), del("docs", 2)]),
        Refusal {
            op: 1,
            command: "delete",
            table: "docs",
            policies: &["del_unlocked"],
            says: &["USING"],
        },
        "delete of an own locked doc",
    )
    .await;

    // tasks: a FOR ALL policy without WITH CHECK checks new rows with its USING.
    refused_over_http(
        &admin,
        &alice,
        json!([ins("tasks", json!({"id": 5, "owner": "bob"}))]),
        Refusal {
            op: 0,
            command: "insert",
            table: "tasks",
            policies: &["mine"],
            says: &[],
        },
        "insert checked by the USING of a policy without WITH CHECK",
    )
    .await;
    refused_over_http(
        &admin,
        &alice,
        json!([patch("tasks", 1, json!({"owner": "bob"}))]),
        Refusal {
            op: 0,
            command: "update",
            table: "tasks",
            policies: &["mine"],
            says: &[],
        },
        "update moving a task away, checked by USING as WITH CHECK",
    )
    .await;

    // logs: only a SELECT policy, so no write policy: nothing was tried.
    refused_over_http(
        &admin,
        &alice,
        json!([ins("logs", json!({"id": 2, "line": "forged"}))]),
        Refusal {
            op: 0,
            command: "insert",
            table: "logs",
            policies: &[],
            says: &[],
        },
        "insert into a table without a write policy",
    )
    .await;

    // Allowed batches pass and move the seq.
    let seq = admin.health_seq().await;
    let applied = alice
        .mutate_ok(json!([
            ins("notes", json!({"id": 30, "owner": "alice", "body": "new"})),
            patch("notes", 1, json!({"body": "edited"})),
            ups("notes", json!({"id": 31, "owner": "alice"})),
            ins("docs", json!({"id": 30, "owner": "alice", "team": 1})),
            patch("docs", 1, json!({"locked": true})),
            del("docs", 30),
            ins("tasks", json!({"id": 30, "owner": "alice", "title": "x"})),
            del("tasks", 1),
        ]))
        .await;
    assert!(applied > seq, "an allowed batch commits");
    assert_eq!(admin.health_seq().await, applied);
    let all = everything(&admin).await;
    assert_eq!(
        all["notes"],
        json!([
            {"id": 1, "owner": "alice", "body": "edited"},
            {"id": 2, "owner": "bob", "body": "b2"},
            {"id": 30, "owner": "alice", "body": "new"},
            {"id": 31, "owner": "alice", "body": null},
        ])
    );
    assert_eq!(
        all["docs"],
        json!([
            {"id": 1, "owner": "alice", "team": 1, "locked": true},
            {"id": 2, "owner": "alice", "team": 1, "locked": true},
            {"id": 3, "owner": "bob", "team": 1, "locked": false},
        ])
    );
    assert_eq!(
        all["tasks"],
        json!([
            {"id": 2, "owner": "bob", "title": "t2"},
            {"id": 30, "owner": "alice", "title": "x"},
        ])
    );

    // Another client: bob's rights are his own.
    let bob = Client::new(&server, &token("bob", json!({"team": 2})));
    bob.mutate_ok(json!([patch("notes", 2, json!({"body": "bob's edit"}))]))
        .await;
    refused_over_http(
        &admin,
        &bob,
        json!([patch("docs", 3, json!({"team": 1}))]),
        Refusal {
            op: 0,
            command: "update",
            table: "docs",
            policies: &["upd_own"],
            says: &["WITH CHECK"],
        },
        "bob updating his doc into a team that is not his",
    )
    .await;

    // The admin token bypasses every rule.
    admin
        .mutate_ok(json!([
            ins("notes", json!({"id": 40, "owner": "carol"})),
            del("docs", 2),
            ins("logs", json!({"id": 2, "line": "admin"})),
        ]))
        .await;
}

#[tokio::test]
async fn forbidden_ops_refuse_the_whole_batch_over_websocket() {
    let (_dir, server) = setup("write-rules-ws").await;
    let admin = Client::admin(&server);
    let alice = Client::new(&server, &token("alice", json!({"team": 1})));
    let mut ws = alice.ws().await;

    let cases: Vec<(Value, Refusal, &str)> = vec![
        (
            json!([
                ins("notes", json!({"id": 10, "owner": "alice"})),
                ins("notes", json!({"id": 11, "owner": "bob"})),
            ]),
            Refusal {
                op: 1,
                command: "insert",
                table: "notes",
                policies: &["write_own"],
                says: &["WITH CHECK"],
            },
            "insert for another owner",
        ),
        (
            json!([patch("notes", 1, json!({"owner": "bob"}))]),
            Refusal {
                op: 0,
                command: "update",
                table: "notes",
                policies: &["write_own"],
                says: &["WITH CHECK"],
            },
            "moving a row to another owner",
        ),
        (
            json!([patch("docs", 1, json!({"locked": true})), del("docs", 2)]),
            Refusal {
                op: 1,
                command: "delete",
                table: "docs",
                policies: &["del_unlocked"],
                says: &["USING"],
            },
            "delete of a locked doc",
        ),
        (
            json!([ups("tasks", json!({"id": 2, "owner": "alice"}))]),
            Refusal {
                op: 0,
                command: "update",
                table: "tasks",
                policies: &["mine"],
                says: &["USING"],
            },
            "upsert over another owner's task",
        ),
    ];
    for (id, (ops, want, what)) in cases.into_iter().enumerate() {
        let what = format!("WS: {what}");
        let before = everything(&admin).await;
        let seq = admin.health_seq().await;
        let reply = ws
            .request(id as u64 + 1, json!({"type": "mutate", "ops": ops}))
            .await;
        assert_eq!(reply["type"], "error", "{what}: {reply}");
        let err = reply["error"].as_object().expect("an error object").clone();
        assert_eq!(err["code"], "forbidden", "{what}: {reply}");
        check_refusal(&err, &want, &what);
        assert_eq!(admin.health_seq().await, seq, "{what}: the seq moved");
        assert_eq!(
            everything(&admin).await,
            before,
            "{what}: something changed"
        );
    }

    // The connection stays usable, and an allowed batch passes.
    let reply = ws
        .request(
            100,
            json!({"type": "mutate", "ops": [
                ins("notes", json!({"id": 50, "owner": "alice"})),
                patch("docs", 1, json!({"locked": true})),
            ]}),
        )
        .await;
    assert_eq!(reply["type"], "result", "{reply}");
    let seq = reply["seq"].as_u64().expect("a seq");
    assert_eq!(admin.health_seq().await, seq);
    assert_eq!(
        admin
            .query("SELECT id, owner FROM notes WHERE id = 50")
            .await,
        vec![json!({"id": 50, "owner": "alice"})]
    );
}
