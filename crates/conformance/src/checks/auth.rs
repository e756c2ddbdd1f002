//! Tokens (every `unauthorized` reason a client can reach) and row policies.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{client, same, secret, table};
use crate::client::Auth;
use crate::jwt::{b64url, hs256, now_secs};
use crate::{ensure, fail, show, skip, Ctx, R};

/// `GET /v1/tables` as `auth` must be 401 with this `reason`.
async fn unauthorized(c: &Ctx, auth: Auth, reasons: &[&str]) -> R {
    let e = c
        .call_as("GET", "/v1/tables", None, &auth)
        .await?
        .err(401, "unauthorized")?;
    let reason = e["reason"].as_str().unwrap_or("");
    ensure!(
        reasons.contains(&reason),
        "expected reason {}, got {}",
        reasons.join(" or "),
        show(&e)
    );
    Ok(())
}

fn has_client_tokens(c: &Ctx) -> bool {
    c.opts.jwt_secret.is_some() || c.opts.client_token.is_some()
}

pub async fn missing_token_is_unauthorized_missing(c: Arc<Ctx>) -> R {
    unauthorized(&c, Auth::None, &["missing"]).await
}

pub async fn non_bearer_header_is_unauthorized_malformed(c: Arc<Ctx>) -> R {
    unauthorized(
        &c,
        Auth::Header(format!("Basic {}", b64url(b"a:b"))),
        &["malformed"],
    )
    .await
}

pub async fn garbage_token_is_unauthorized_malformed(c: Arc<Ctx>) -> R {
    unauthorized(&c, Auth::Bearer("not-a-token".into()), &["malformed"]).await
}

pub async fn wrong_admin_token_is_unauthorized(c: Arc<Ctx>) -> R {
    unauthorized(
        &c,
        Auth::Bearer(format!("{}x", c.opts.token)),
        &["malformed"],
    )
    .await
}

pub async fn jwt_without_client_tokens_is_no_client_tokens(c: Arc<Ctx>) -> R {
    if has_client_tokens(&c) {
        skip!("the server accepts client tokens");
    }
    let token = hs256(
        "conformance-made-up-secret",
        &json!({"sub": "x", "exp": now_secs() + 600}),
    );
    // A server started with a secret the suite was not told about answers bad_signature.
    unauthorized(
        &c,
        Auth::Bearer(token),
        &["no_client_tokens", "bad_signature"],
    )
    .await
}

pub async fn jwt_with_bad_signature_is_unauthorized_bad_signature(c: Arc<Ctx>) -> R {
    let (token, _) = client(&c, None, json!({}))?;
    let mut parts: Vec<&str> = token.split('.').collect();
    ensure!(parts.len() == 3, "the client token is not a JWT");
    let forged = b64url(&[7u8; 32]);
    parts[2] = &forged;
    unauthorized(&c, Auth::Bearer(parts.join(".")), &["bad_signature"]).await
}

pub async fn jwt_alg_none_is_unauthorized_wrong_algorithm(c: Arc<Ctx>) -> R {
    if !has_client_tokens(&c) {
        skip!("needs a server with client tokens (pass --jwt-secret or --client-token)");
    }
    let token = format!(
        "{}.{}.",
        b64url(br#"{"alg":"none","typ":"JWT"}"#),
        b64url(
            json!({"sub": "x", "exp": now_secs() + 600})
                .to_string()
                .as_bytes()
        )
    );
    unauthorized(&c, Auth::Bearer(token), &["wrong_algorithm"]).await
}

pub async fn expired_jwt_is_unauthorized_expired(c: Arc<Ctx>) -> R {
    let s = secret(&c)?;
    let token = hs256(&s, &json!({"sub": "x", "exp": now_secs() - 3600}));
    unauthorized(&c, Auth::Bearer(token), &["expired"]).await
}

pub async fn jwt_without_sub_is_unauthorized_missing_claim(c: Arc<Ctx>) -> R {
    let s = secret(&c)?;
    let token = hs256(&s, &json!({"exp": now_secs() + 600}));
    unauthorized(&c, Auth::Bearer(token), &["missing_claim"]).await
}

pub async fn client_token_on_admin_endpoint_is_forbidden(c: Arc<Ctx>) -> R {
    let (token, _) = client(&c, None, json!({}))?;
    let auth = Auth::Bearer(token);
    c.call_as("GET", "/v1/policies", None, &auth)
        .await?
        .err(403, "forbidden")?;
    c.call_as(
        "POST",
        "/v1/sql",
        Some(json!({"sql": format!("CREATE TABLE {} (id INTEGER PRIMARY KEY)", c.name("t"))})),
        &auth,
    )
    .await?
    .err(403, "forbidden")?;
    c.call_as("PUT", &format!("/v1/topics/{}", c.name("tp")), None, &auth)
        .await?
        .err(403, "forbidden")?;
    Ok(())
}

pub async fn client_sending_as_is_forbidden(c: Arc<Ctx>) -> R {
    let (token, _) = client(&c, None, json!({}))?;
    let t = table(&c, "t", "id INTEGER PRIMARY KEY").await?;
    c.call_as(
        "POST",
        "/v1/query",
        Some(json!({"sql": format!("SELECT id FROM {t}"), "as": {"sub": "someone"}})),
        &Auth::Bearer(token),
    )
    .await?
    .err(403, "forbidden")?;
    Ok(())
}

pub async fn access_token_parameter_works_on_live_only(c: Arc<Ctx>) -> R {
    let t = table(&c, "t", "id INTEGER PRIMARY KEY").await?;
    let token = match client(&c, None, json!({})) {
        Ok((token, _)) => token,
        Err(_) => c.opts.token.clone(),
    };
    let mut sse = c
        .sse(
            &format!("/v1/live?sql=SELECT%20id%20FROM%20{t}&access_token={token}"),
            &Auth::None,
            &[],
        )
        .await?;
    sse.expect("snapshot").await?;
    let e = c
        .call_as(
            "GET",
            &format!("/v1/tables?access_token={token}"),
            None,
            &Auth::None,
        )
        .await?
        .err(401, "unauthorized")?;
    same("reason", &e["reason"], &json!("missing"))
}

// ---------------------------------------------------------------------------------------
// Row policies

async fn owned(c: &Ctx) -> R<String> {
    let t = table(c, "own", "id INTEGER PRIMARY KEY, owner TEXT, body TEXT").await?;
    Ok(t)
}

pub async fn client_reads_only_rows_its_policies_pass(c: Arc<Ctx>) -> R {
    let (token, sub) = client(&c, None, json!({}))?;
    let t = owned(&c).await?;
    c.sql(&format!(
        "CREATE POLICY mine ON {t} FOR SELECT USING (owner = auth.sub)"
    ))
    .await?;
    c.mutate(json!([
        {"op": "insert", "table": t, "row": {"id": 1, "owner": sub}},
        {"op": "insert", "table": t, "row": {"id": 2, "owner": format!("{sub}-not")}}]))
        .await?;
    let auth = Auth::Bearer(token);
    let v = c
        .call_as(
            "POST",
            "/v1/query",
            Some(json!({"sql": format!("SELECT id FROM {t} ORDER BY id")})),
            &auth,
        )
        .await?
        .ok()?;
    same("rows", &v["rows"], &json!([{"id": 1}]))?;
    c.call_as("GET", &format!("/v1/tables/{t}/rows/2"), None, &auth)
        .await?
        .err(404, "not_found")?;
    Ok(())
}

pub async fn client_reads_nothing_without_a_policy(c: Arc<Ctx>) -> R {
    let (token, sub) = client(&c, None, json!({}))?;
    let t = owned(&c).await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "owner": sub}}]))
        .await?;
    let v = c
        .call_as(
            "POST",
            "/v1/query",
            Some(json!({"sql": format!("SELECT id FROM {t}")})),
            &Auth::Bearer(token),
        )
        .await?
        .ok()?;
    same("rows", &v["rows"], &json!([]))
}

pub async fn client_write_refused_is_forbidden_naming_policies(c: Arc<Ctx>) -> R {
    let (token, sub) = client(&c, None, json!({}))?;
    let t = owned(&c).await?;
    c.sql(&format!("CREATE POLICY write_own ON {t} FOR ALL USING (owner = auth.sub) WITH CHECK (owner = auth.sub)")).await?;
    let e = c
        .call_as(
            "POST",
            "/v1/mutate",
            Some(json!({"ops": [
                {"op": "insert", "table": t, "row": {"id": 1, "owner": sub}},
                {"op": "insert", "table": t, "row": {"id": 2, "owner": format!("{sub}-other")}}]})),
            &Auth::Bearer(token),
        )
        .await?
        .err(403, "forbidden")?;
    same("op", &e["op"], &json!(1))?;
    same("table", &e["table"], &json!(t))?;
    same("command", &e["command"], &json!("insert"))?;
    same("policies", &e["policies"], &json!(["write_own"]))?;
    c.call("GET", &format!("/v1/tables/{t}/rows/1"), None)
        .await?
        .err(404, "not_found")?;
    Ok(())
}

pub async fn client_live_view_ends_with_rules_changed(c: Arc<Ctx>) -> R {
    let (token, sub) = client(&c, None, json!({}))?;
    let t = owned(&c).await?;
    c.sql(&format!(
        "CREATE POLICY mine ON {t} FOR SELECT USING (owner = auth.sub)"
    ))
    .await?;
    c.mutate(json!([{"op": "insert", "table": t, "row": {"id": 1, "owner": sub}}]))
        .await?;
    let mut sse = c
        .sse(
            &format!("/v1/live?sql=SELECT%20id%20FROM%20{t}"),
            &Auth::Bearer(token),
            &[],
        )
        .await?;
    let snap = sse.expect("snapshot").await?;
    same("snapshot rows", &snap.data["rows"], &json!([{"id": 1}]))?;
    // A policy reading a claim the old ones did not read: the view cannot follow.
    c.sql(&format!(
        "CREATE POLICY by_nick ON {t} FOR SELECT USING (body = auth.nick)"
    ))
    .await?;
    let e = sse.next().await?;
    if e.event != "error" {
        fail!("expected `event: error` rules_changed, got {}", e.raw);
    }
    same("code", &e.data["error"]["code"], &json!("rules_changed"))?;
    let _: &Value = &e.data;
    Ok(())
}
