//! `--cors-origin`: a page from a named origin (a dev server on another port) may call the
//! API from the browser — its preflight is answered without a token, and real requests
//! still need one; other origins get no CORS headers; without the flag, none do.

mod common;

use common::{Server, TempDir, ADMIN_TOKEN};

const ALLOWED: &str = "http://localhost:5173";

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn preflight(server: &Server, origin: &str) -> reqwest::Response {
    client()
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/sql", server.base_url()),
        )
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap()
}

fn allow_origin(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn a_named_origin_may_call_the_api_and_others_may_not() {
    let dir = TempDir::new("cors");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &[
            "--cors-origin",
            &format!("{ALLOWED}/,http://127.0.0.1:3000"),
        ],
    );

    // The preflight carries no token and is answered for the allowed origin.
    let r = preflight(&server, ALLOWED).await;
    assert!(r.status().is_success(), "preflight: {}", r.status());
    assert_eq!(allow_origin(&r).as_deref(), Some(ALLOWED));
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");
    let headers = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");

    // The real request still needs its token, and carries the CORS header either way.
    let sql = format!("{}/v1/sql", server.base_url());
    let r = client()
        .post(&sql)
        .header("Origin", ALLOWED)
        .body(r#"{"sql": "SELECT 1 AS one"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client()
        .post(&sql)
        .header("Origin", ALLOWED)
        .bearer_auth(ADMIN_TOKEN)
        .body(r#"{"sql": "SELECT 1 AS one"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(allow_origin(&r).as_deref(), Some(ALLOWED));

    // Another origin gets no CORS headers (the browser then refuses the response).
    let r = preflight(&server, "http://evil.example").await;
    assert_eq!(allow_origin(&r), None);
}

#[tokio::test]
async fn without_the_flag_no_origin_is_allowed_and_bad_origins_are_refused() {
    let dir = TempDir::new("cors-off");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let r = preflight(&server, ALLOWED).await;
    assert_eq!(allow_origin(&r), None);
    drop(server);

    for bad in ["localhost:5173", "http://localhost:5173/app", "ftp://x"] {
        let (status, stderr) = Server::start_expecting_failure(
            &dir.join("data2"),
            dir.path(),
            &["--cors-origin", bad],
        );
        assert!(!status.success(), "{bad}");
        assert!(stderr.contains("--cors-origin"), "{bad}: {stderr}");
    }
}
