//! A `FOR SELECT` policy may read another table through `col IN (SELECT …)` — the chat
//! rule "read the messages of rooms you belong to". Its subquery reads that table through
//! the table's own policies for the same caller, one-shot queries, row reads, scans and
//! catch-up apply it, and a live view follows membership: joining a room shows its
//! messages, leaving it removes them, and no event ever carries another room's message.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "policy-subquery-secret";
const DDL: &str = "CREATE TABLE members (id TEXT PRIMARY KEY, room TEXT NOT NULL, user_id TEXT NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, room TEXT NOT NULL, body TEXT);
CREATE INDEX messages_room ON messages (room);
CREATE POLICY own_memberships ON members FOR SELECT USING (user_id = auth.sub);
CREATE POLICY member_reads ON messages FOR SELECT USING (room IN (SELECT room FROM members WHERE user_id = auth.sub))";

fn token(sub: &str) -> String {
    sluice_server::auth::mint_hs256(
        SECRET,
        sub,
        &serde_json::Map::new(),
        Duration::from_secs(600),
    )
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A server with client tokens and the chat schema, and a client of it.
    async fn start(dir: &common::TempDir) -> (Client, std::net::SocketAddr) {
        let (_core, addr) =
            common::serve(dir.path(), |c| c.auth.jwt_secret = Some(SECRET.into()), DDL).await;
        let client = Client {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base: format!("http://{addr}"),
        };
        (client, addr)
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let reply = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap_or(Value::Null))
    }
    async fn get(&self, token: &str, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
    async fn admin(&self, sql: &str) -> Value {
        let (status, body) = self
            .post(common::ADMIN_TOKEN, "/v1/sql", json!({ "sql": sql }))
            .await;
        assert_eq!(status, 200, "{sql}: {body}");
        body
    }
}

fn bodies(rows: &Value) -> Vec<String> {
    let mut out: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_live_view_follows_room_membership_and_never_shows_other_rooms() {
    let dir = common::TempDir::new("policy-subquery");
    let (c, addr) = Client::start(&dir).await;
    c.admin(
        "INSERT INTO members VALUES ('general:bob', 'general', 'bob'), ('general:alice', 'general', 'alice'), ('secret:alice', 'secret', 'alice');
         INSERT INTO messages VALUES (1, 'general', 'hello all'), (2, 'secret', 'alice only')",
    )
    .await;
    let bob = token("bob");

    // One-shot: bob reads general only; his memberships only (the members policy applies
    // inside the subquery and on its own).
    let (status, q) = c
        .post(
            &bob,
            "/v1/query",
            json!({"sql": "SELECT body FROM messages"}),
        )
        .await;
    assert_eq!(status, 200, "{q}");
    assert_eq!(bodies(&q["rows"]), ["hello all"]);
    let (_, m) = c
        .post(
            &bob,
            "/v1/query",
            json!({"sql": "SELECT id FROM members ORDER BY id"}),
        )
        .await;
    assert_eq!(m["rows"], json!([{"id": "general:bob"}]));
    // Row reads, scans and catch-up apply the same rule.
    let (one, two) = (
        c.get(&bob, "/v1/tables/messages/rows/1").await,
        c.get(&bob, "/v1/tables/messages/rows/2").await,
    );
    assert_eq!(one["row"]["body"], "hello all", "{one}");
    assert_eq!(two["error"]["code"], "not_found", "{two}");
    let scan = c.get(&bob, "/v1/tables/messages/rows").await;
    assert_eq!(scan["rows"].as_array().unwrap().len(), 1, "{scan}");
    let changes = c.get(&bob, "/v1/changes?since=0&tables=messages").await;
    assert!(!changes.to_string().contains("alice only"), "{changes}");

    // Live: bob subscribes over the WebSocket.
    let url = format!("ws://{addr}/v1/ws?access_token={bob}");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    ws.send(Message::text(
        json!({"id": 1, "type": "subscribe", "qid": "m", "sql": "SELECT id, room, body FROM messages"})
            .to_string(),
    ))
    .await
    .unwrap();
    let mut held: BTreeMap<String, Value> = BTreeMap::new();
    let mut seq = 0u64;
    let next_event = async |ws: &mut tokio_tungstenite::WebSocketStream<_>| -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("an event within 10 s")
                .unwrap()
                .unwrap();
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).unwrap();
                assert!(
                    !t.contains("alice only"),
                    "an event carried another room's message: {t}"
                );
                return v;
            }
        }
    };
    let apply = |held: &mut BTreeMap<String, Value>, event: &Value| {
        match event["type"].as_str().unwrap() {
            "snapshot" => {
                held.clear();
                for (k, r) in event["keys"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .zip(event["rows"].as_array().unwrap())
                {
                    held.insert(k.to_string(), r.clone());
                }
            }
            "diff" => {
                for ch in event["changes"].as_array().unwrap() {
                    let key = ch["key"].to_string();
                    match ch["op"].as_str().unwrap() {
                        "remove" => {
                            held.remove(&key);
                        }
                        _ => {
                            held.insert(key, ch["row"].clone());
                        }
                    }
                }
            }
            other => panic!("unexpected event {other}: {event}"),
        }
        event["seq"].as_u64().unwrap()
    };
    let snapshot = next_event(&mut ws).await;
    seq = seq.max(apply(&mut held, &snapshot));
    let expect_equal = async |held: &BTreeMap<String, Value>, what: &str| {
        let (_, q) = c
            .post(
                &bob,
                "/v1/query",
                json!({"sql": "SELECT id, room, body FROM messages"}),
            )
            .await;
        let mut want: Vec<String> = q["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        want.sort();
        let mut have: Vec<String> = held.values().map(|r| r.to_string()).collect();
        have.sort();
        assert_eq!(
            have, want,
            "{what}: the live rows differ from a one-shot query"
        );
    };
    expect_equal(&held, "after the snapshot").await;

    // Each step: an admin write, then events until bob's view reaches the write's seq.
    let steps = [
        (
            "a message in a room bob is not in",
            "INSERT INTO messages VALUES (3, 'secret', 'alice only')",
            1,
        ),
        (
            "a message in bob's room",
            "INSERT INTO messages VALUES (4, 'general', 'second')",
            2,
        ),
        (
            "bob joins secret",
            "INSERT INTO members VALUES ('secret:bob', 'secret', 'bob')",
            4,
        ),
        (
            "bob leaves general",
            "DELETE FROM members WHERE id = 'general:bob'",
            2,
        ),
        (
            "bob leaves secret",
            "DELETE FROM members WHERE id = 'secret:bob'",
            0,
        ),
    ];
    for (what, sql, visible) in steps {
        if what == "bob joins secret" {
            // From now on, secret's messages may reach bob.
            break;
        }
        let reply = c.admin(sql).await;
        let target = reply["seq"].as_u64().unwrap();
        if what != "a message in a room bob is not in" {
            while seq < target {
                let event = next_event(&mut ws).await;
                seq = seq.max(apply(&mut held, &event));
            }
        }
        expect_equal(&held, what).await;
        assert_eq!(held.len(), visible, "{what}");
    }
    // Membership changes move what the view shows (checked without the "alice only" guard).
    for (what, sql, visible) in &steps[2..] {
        let reply = c.admin(sql).await;
        let target = reply["seq"].as_u64().unwrap();
        while seq < target {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("an event within 10 s")
                .unwrap()
                .unwrap();
            if let Message::Text(t) = msg {
                let event: Value = serde_json::from_str(&t).unwrap();
                seq = seq.max(apply(&mut held, &event));
            }
        }
        expect_equal(&held, what).await;
        assert_eq!(held.len(), *visible, "{what}");
    }
}

#[tokio::test]
async fn subqueries_are_refused_in_write_policies() {
    let dir = common::TempDir::new("policy-subquery-write");
    let (c, _) = Client::start(&dir).await;
    for cmd in ["ALL", "INSERT", "UPDATE", "DELETE"] {
        let (status, body) = c
            .post(
                common::ADMIN_TOKEN,
                "/v1/sql",
                json!({"sql": format!(
                    "CREATE POLICY w ON messages FOR {cmd} {} (room IN (SELECT room FROM members WHERE user_id = auth.sub))",
                    if cmd == "INSERT" { "WITH CHECK" } else { "USING" }
                )}),
            )
            .await;
        assert_eq!(status, 400, "FOR {cmd}: {body}");
        // Checked when the policy is compiled against its table: a `schema` refusal.
        assert_eq!(body["error"]["code"], "schema", "FOR {cmd}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("FOR SELECT"),
            "{body}"
        );
    }
}
