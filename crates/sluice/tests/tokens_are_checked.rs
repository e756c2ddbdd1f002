//! Tokens against the real binary (docs/security.md, "Tokens"): every bad token is a 401
//! naming its reason; a client token may not use admin-only endpoints; `access_token` is
//! taken on the streaming endpoints only; a generated admin token is stored 0600 and
//! reused; TLS serves HTTPS and `wss://` and refuses plain HTTP.

mod common;
#[path = "common/tokens.rs"]
mod tokens;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{Api, Server, TempDir, ADMIN_TOKEN};
use serde_json::{json, Value};
use tokens::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The 401's reason, asserting the shape of the error.
fn reason_of(status: u16, body: &Value) -> String {
    assert_eq!(status, 401, "expected 401, got {status}: {body}");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body["error"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn reason_with(server: &Server, token: Option<&str>) -> String {
    let (status, body) = server.api_as(token).get("/v1/tables").await;
    reason_of(status, &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_token_is_401_with_its_reason() {
    let dir = TempDir::new("tokens-reasons");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &["--jwt-secret", SECRET, "--jwt-audience", "app"],
    );
    let exp = now() + 600;
    let good = hs256(SECRET, json!({"sub": "alice", "exp": exp, "aud": "app"}));
    let (status, body) = server.api_as(Some(&good)).get("/v1/tables").await;
    assert_eq!(status, 200, "a valid client token: {body}");
    // /health needs no token.
    let (status, _) = server.api_as(None).get("/health").await;
    assert_eq!(status, 200);

    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("malformed", Some("not-a-token".into())),
        ("malformed", Some("a.b.c".into())),
        (
            "bad_signature",
            Some(hs256(
                "another-secret",
                json!({"sub": "alice", "exp": exp, "aud": "app"}),
            )),
        ),
        (
            "bad_signature",
            // Claims swapped after signing.
            Some({
                let parts: Vec<&str> = good.split('.').collect();
                let claims = json!({"sub": "admin", "exp": exp, "aud": "app"});
                format!(
                    "{}.{}.{}",
                    parts[0],
                    b64url(claims.to_string().as_bytes()),
                    parts[2]
                )
            }),
        ),
        (
            "wrong_algorithm",
            Some(unsigned(
                &json!({"alg": "none", "typ": "JWT"}),
                &json!({"sub": "alice", "exp": exp, "aud": "app"}),
                "",
            )),
        ),
        (
            "wrong_algorithm",
            Some(unsigned(
                &json!({"alg": "RS256", "typ": "JWT"}),
                &json!({"sub": "alice", "exp": exp, "aud": "app"}),
                "c2lnbmF0dXJl",
            )),
        ),
        (
            "expired",
            Some(hs256(
                SECRET,
                json!({"sub": "alice", "exp": now() - 120, "aud": "app"}),
            )),
        ),
        (
            "expired",
            Some(hs256(
                SECRET,
                json!({"sub": "alice", "exp": exp, "nbf": now() + 120, "aud": "app"}),
            )),
        ),
        (
            "wrong_audience",
            Some(hs256(
                SECRET,
                json!({"sub": "alice", "exp": exp, "aud": "other"}),
            )),
        ),
        (
            "missing_claim",
            Some(hs256(SECRET, json!({"exp": exp, "aud": "app"}))),
        ),
        (
            "missing_claim",
            Some(hs256(SECRET, json!({"sub": "alice", "aud": "app"}))),
        ),
    ];
    for (want, token) in &cases {
        let got = reason_with(&server, token.as_deref()).await;
        assert_eq!(&got, want, "token {token:?}");
    }
    // Not `Bearer <token>`.
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/tables", server.base_url()))
        .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(reason_of(status, &body), "malformed");
    // The expired message names both times.
    let (status, body) = server
        .api_as(Some(&cases[7].1.clone().unwrap()))
        .get("/v1/tables")
        .await;
    assert_eq!(status, 401);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("expired at") && message.contains("now"),
        "{message}"
    );

    // Every refusal is counted by reason.
    let api = server.api();
    for (reason, at_least) in [
        ("missing", 1.0),
        ("malformed", 3.0),
        ("bad_signature", 2.0),
        ("wrong_algorithm", 2.0),
        ("expired", 3.0),
        ("wrong_audience", 1.0),
        ("missing_claim", 2.0),
    ] {
        let n = api
            .metric(&format!(
                "sluice_auth_failures_total{{reason=\"{reason}\"}}"
            ))
            .await;
        assert!(n >= at_least, "{reason}: {n} < {at_least}");
    }
    common::topics::assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_decides_the_algorithm_and_no_key_takes_no_jwt() {
    let dir = TempDir::new("tokens-keys");
    let key = dir.join("rsa.pub");
    std::fs::write(&key, RSA_PUBLIC_PEM).unwrap();
    let rsa = Server::start(
        &dir.join("rsa"),
        dir.path(),
        &["--jwt-public-key", key.to_str().unwrap()],
    );
    // An HS256 token signed with the public key as the secret (key confusion) and a plain
    // HS256 token: wrong_algorithm on an RS256 server.
    let claims = json!({"sub": "alice", "exp": now() + 600});
    let confused = hs256(RSA_PUBLIC_PEM, claims.clone());
    assert_eq!(reason_with(&rsa, Some(&confused)).await, "wrong_algorithm");
    assert_eq!(
        reason_with(&rsa, Some(&hs256(SECRET, claims.clone()))).await,
        "wrong_algorithm"
    );
    // A made-up RS256 signature is checked and fails.
    let forged = unsigned(&json!({"alg": "RS256"}), &claims, "c2lnbmF0dXJl");
    assert_eq!(reason_with(&rsa, Some(&forged)).await, "bad_signature");
    // The admin token still works.
    let (status, body) = rsa.api().get("/v1/tables").await;
    assert_eq!(status, 200, "{body}");
    drop(rsa);

    let none = Server::start(&dir.join("none"), dir.path(), &[]);
    assert_eq!(
        reason_with(&none, Some(&hs256(SECRET, claims))).await,
        "no_client_tokens"
    );
    // A key that is not a public key stops the server at startup, naming the file.
    std::fs::write(dir.join("bad.pem"), "not a key").unwrap();
    let bad = dir.join("bad.pem");
    let (status, stderr) = Server::start_expecting_failure(
        &dir.join("bad"),
        dir.path(),
        &["--jwt-public-key", bad.to_str().unwrap()],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--jwt-public-key") && stderr.contains("bad.pem"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_may_not_use_admin_endpoints() {
    let dir = TempDir::new("tokens-rights");
    let server = Server::start(&dir.join("data"), dir.path(), &["--jwt-secret", SECRET]);
    let admin = server.api();
    let (status, body) = admin
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT)"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let before = admin.metric("sluice_forbidden_total").await;

    let client = server.api_as(Some(&client_token("alice")));
    let (status, body) = client
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE TABLE other (id INTEGER PRIMARY KEY)"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    let (status, body) = client.get("/metrics").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    // Reads are allowed (through the rules: no policy, no rows).
    let (status, body) = client.get("/v1/tables").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = client
        .post("/v1/query", &json!({"sql": "SELECT * FROM notes"}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Nothing was created by the client.
    let tables = admin.get_ok("/v1/tables").await;
    assert!(!tables.to_string().contains("\"other\""), "{tables}");
    assert!(admin.metric("sluice_forbidden_total").await >= before + 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_token_is_taken_on_streaming_endpoints_only() {
    let dir = TempDir::new("tokens-access");
    let server = Server::start(&dir.join("data"), dir.path(), &["--jwt-secret", SECRET]);
    let admin = server.api();
    let (status, body) = admin
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT)"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let alice = client_token("alice");
    let plain = Api::with_token(&server.base_url(), None);
    let live = |token: Option<&str>| {
        let mut params = vec![("sql", "SELECT * FROM notes".to_string())];
        if let Some(t) = token {
            params.push(("access_token", t.to_string()));
        }
        reqwest::Url::parse_with_params(&format!("{}/v1/live", server.base_url()), &params).unwrap()
    };
    // SSE: the client token in the URL or in the header; the admin token in the URL too.
    for (client, url) in [
        (&plain, live(Some(&alice))),
        (&plain, live(Some(ADMIN_TOKEN))),
        (&server.api_as(Some(&alice)), live(None)),
    ] {
        let resp = tokio::time::timeout(
            Duration::from_secs(30),
            client.client.get(url.clone()).send(),
        )
        .await
        .expect("headers within 30 s")
        .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{url}");
        let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
    }
    for (url, want) in [
        (live(None), "missing"),
        (live(Some("garbage")), "malformed"),
    ] {
        let resp = plain.client.get(url).send().await.unwrap();
        let status = resp.status().as_u16();
        assert_eq!(reason_of(status, &resp.json().await.unwrap()), want);
    }

    // WebSocket upgrade: access_token in the URL, or the header; neither is 401.
    let ws = |query: &str| format!("ws://{}/v1/ws{query}", server.addr);
    let (mut socket, _) = tokio_tungstenite::connect_async(ws(&format!("?access_token={alice}")))
        .await
        .expect("an upgrade with access_token");
    use futures_util::{SinkExt, StreamExt};
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            json!({"id": 1, "type": "query", "sql": "SELECT * FROM notes"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), socket.next())
        .await
        .expect("a reply within 30 s")
        .expect("a frame")
        .unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["id"], 1, "{reply}");
    assert_ne!(reply["type"], "error", "{reply}");
    drop(socket);
    let mut request = ws("").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {alice}").parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .expect("an upgrade with the header");
    for (query, want) in [("", "missing"), ("?access_token=x.y.z", "malformed")] {
        match tokio_tungstenite::connect_async(ws(query)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status().as_u16(), 401, "{query}");
                let body: Value =
                    serde_json::from_slice(resp.body().as_deref().unwrap_or_default())
                        .unwrap_or(Value::Null);
                if body != Value::Null {
                    assert_eq!(body["error"]["reason"], want, "{body}");
                }
            }
            other => panic!("{query}: expected a 401, got {other:?}"),
        }
    }

    // A topic watch takes access_token too.
    let (status, body) = admin.put_topic("feed", None).await;
    assert!(status == 200 || status == 201, "{body}");
    let watch = plain
        .watch_sse_raw("feed", &[("access_token", ADMIN_TOKEN.to_string())], None)
        .await;
    assert!(
        watch.is_ok(),
        "a watch with access_token: {:?}",
        watch.err()
    );
    match plain.watch_sse_raw("feed", &[], None).await {
        Err((status, body)) => assert_eq!(reason_of(status, &body), "missing"),
        Ok(_) => panic!("a watch without a token was served"),
    }

    // Other endpoints take the header only: access_token on /v1/query is `missing`.
    let url = format!("{}/v1/query?access_token={alice}", server.base_url());
    let resp = plain
        .client
        .post(url)
        .json(&json!({"sql": "SELECT * FROM notes"}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    assert_eq!(reason_of(status, &resp.json().await.unwrap()), "missing");
    let url = format!("{}/v1/tables?access_token={ADMIN_TOKEN}", server.base_url());
    let resp = plain.client.get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    assert_eq!(reason_of(status, &resp.json().await.unwrap()), "missing");
    common::topics::assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_admin_token_is_stored_0600_and_reused_on_restart() {
    let dir = TempDir::new("tokens-admin");
    let data = dir.join("data");
    let server = Server::start_with_stored_admin_token(&data, dir.path(), &[]);
    let path = data.join("admin-token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    let token = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert!(token.starts_with("sluice_admin_"), "{token}");
    let (status, body) = server.api_as(Some(&token)).get("/v1/tables").await;
    assert_eq!(status, 200, "{body}");
    // The ready-to-paste line names the real address (not the default port) and the token.
    let line = format!(
        "curl -H \"Authorization: Bearer {token}\" {}/v1/tables",
        server.base_url()
    );
    let stderr = server.stderr();
    assert!(stderr.contains(&line), "no {line:?} in:\n{stderr}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status}:\n{stderr}");

    let server = Server::start_with_stored_admin_token(&data, dir.path(), &[]);
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), token);
    let (status, body) = server.api_as(Some(&token)).get("/v1/tables").await;
    assert_eq!(status, 200, "{body}");
    // Later starts say where the token is without printing it.
    let stderr = server.stderr();
    assert!(
        !stderr.contains(&token),
        "the stored token was logged:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("$(cat {})", path.display()))
            && stderr.contains(&server.base_url()),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_https_and_wss_and_refuses_plain_http() {
    let dir = TempDir::new("tokens-tls");
    let Some((cert, key)) = self_signed_cert(dir.path()) else {
        eprintln!("note: openssl is not installed; skipping the TLS test");
        return;
    };
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let (status, body) = https_get(server.addr, &cert, "/v1/tables", ADMIN_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"tables\""), "{body}");
    let (status, body) = https_get(server.addr, &cert, "/v1/tables", "wrong").await;
    assert_eq!(status, 401, "{body}");
    assert!(server
        .stderr()
        .contains(&format!("https://{}", server.addr)));

    // wss:// on the same address.
    let tls = tls_connect(server.addr, &cert).await;
    let request = format!("wss://localhost/v1/ws?access_token={ADMIN_TOKEN}")
        .into_client_request()
        .unwrap();
    let (mut socket, _) = tokio_tungstenite::client_async(request, tls)
        .await
        .expect("a WebSocket over TLS");
    use futures_util::{SinkExt, StreamExt};
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            json!({"id": 7, "type": "query", "sql": "SELECT 1 AS one"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), socket.next())
        .await
        .expect("a reply within 30 s")
        .expect("a frame")
        .unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["id"], 7, "{reply}");
    drop(socket);

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = server
        .api()
        .client
        .get(format!("{}/health", server.base_url()))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");

    // The server still stops cleanly.
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");

    // A key file that does not load stops the server at startup, naming it.
    let (status, stderr) = Server::start_expecting_failure(
        &dir.join("data2"),
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            "/nonexistent/key.pem",
        ],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--tls-key") && stderr.contains("/nonexistent/key.pem"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_token_prints_a_token_the_server_accepts() {
    let out = std::process::Command::new(common::BIN)
        .args(["token", "--secret", SECRET, "--sub", "alice"])
        .args([
            "--claim",
            "team=7",
            "--claim",
            "role=editor",
            "--claim",
            "ok=true",
        ])
        .args([
            "--claim",
            "note=not json",
            "--ttl",
            "1h",
            "--aud",
            "app",
            "--iss",
            "me",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::describe(&out));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let claims: Value =
        serde_json::from_slice(&b64url_decode(token.split('.').nth(1).unwrap())).unwrap();
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["team"], 7);
    assert_eq!(claims["role"], "editor");
    assert_eq!(claims["ok"], true);
    assert_eq!(claims["note"], "not json");
    assert_eq!(claims["aud"], "app");
    assert_eq!(claims["iss"], "me");
    let ttl = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(ttl, 3600, "{claims}");

    let dir = TempDir::new("tokens-cli");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--jwt-secret",
            SECRET,
            "--jwt-audience",
            "app",
            "--jwt-issuer",
            "me",
        ],
    );
    let (status, body) = server.api_as(Some(&token)).get("/v1/tables").await;
    assert_eq!(status, 200, "{body}");

    for (args, message) in [
        (&["--ttl", "5x"][..], "s, m, h or d"),
        (&["--claim", "novalue"][..], "NAME=VALUE"),
        (&["--claim", "exp=1"][..], "--ttl"),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(["token", "--secret", SECRET, "--sub", "alice"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subject_may_hold_max_connections_per_subject_streams() {
    let dir = TempDir::new("tokens-limit");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--jwt-secret",
            SECRET,
            "--max-connections-per-subject",
            "2",
            "--live-heartbeat-ms",
            "50",
        ],
    );
    let admin = server.api();
    let (status, body) = admin
        .post(
            "/v1/sql",
            &json!({"sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT)"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let url = reqwest::Url::parse_with_params(
        &format!("{}/v1/live", server.base_url()),
        &[("sql", "SELECT * FROM notes")],
    )
    .unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let open = |token: String| {
        let request = client.get(url.clone()).bearer_auth(token);
        async move {
            tokio::time::timeout(Duration::from_secs(30), request.send())
                .await
                .expect("headers within 30 s")
                .unwrap()
        }
    };
    let (alice, bob) = (client_token("alice"), client_token("bob"));
    let a1 = open(alice.clone()).await;
    let a2 = open(alice.clone()).await;
    assert_eq!((a1.status().as_u16(), a2.status().as_u16()), (200, 200));
    let refused = open(alice.clone()).await;
    assert_eq!(refused.status().as_u16(), 429);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "limit", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-connections-per-subject"),
        "{body}"
    );
    // A WebSocket counts against the same limit.
    let ws = format!("ws://{}/v1/ws?access_token={alice}", server.addr);
    match tokio_tungstenite::connect_async(ws.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 429)
        }
        other => panic!("a third stream of alice's was not refused: {other:?}"),
    }
    // Another subject, and the admin, are not affected.
    let b1 = open(bob).await;
    assert_eq!(b1.status().as_u16(), 200);
    let admins = [
        open(ADMIN_TOKEN.into()).await,
        open(ADMIN_TOKEN.into()).await,
        open(ADMIN_TOKEN.into()).await,
    ];
    assert!(admins.iter().all(|r| r.status().as_u16() == 200));
    assert_eq!(admin.metric("sluice_client_connections").await, 3.0);
    assert!(
        admin
            .metric("sluice_limit_refusals_total{limit=\"max-connections-per-subject\"}")
            .await
            >= 2.0
    );
    // Closing one of alice's streams frees its slot (once the server notices: bounded).
    drop(a1);
    let mut attempts = 0;
    loop {
        let again = open(alice.clone()).await;
        if again.status().as_u16() == 200 {
            break;
        }
        attempts += 1;
        assert!(attempts < 600, "alice's closed stream was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((a2, b1, admins));
}

/// Decodes unpadded base64url.
fn b64url_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("not base64url: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, c)| n | (value(*c) << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}
