//! `POST /v1/sql` data statements (SELECT, INSERT, UPDATE, DELETE, several statements as one
//! transaction) and server functions.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{arr, names, same, seq, table, uint};
use crate::{ensure, fail, show, skip, Ctx, R};

async fn sql_ok(c: &Ctx, sql: &str) -> R<Value> {
    c.call("POST", "/v1/sql", Some(json!({"sql": sql})))
        .await?
        .ok()
}

async fn msgs(c: &Ctx) -> R<String> {
    table(
        c,
        "msgs",
        "id INTEGER PRIMARY KEY, room TEXT NOT NULL, body TEXT, n INTEGER DEFAULT 0",
    )
    .await
}

/// `results[i]`, which must name statement `i` and be of `kind`.
fn entry<'a>(v: &'a Value, i: usize, kind: &str) -> R<&'a Value> {
    let results = arr(v, "results")?;
    let Some(e) = results.get(i) else {
        fail!("no results[{i}] in {}", show(v));
    };
    same(
        &format!("results[{i}].statement"),
        &e["statement"],
        &json!(i),
    )?;
    same(&format!("results[{i}].kind"), &e["kind"], &json!(kind))?;
    Ok(e)
}

pub async fn select_without_from_is_a_select_entry(c: Arc<Ctx>) -> R {
    let v = sql_ok(&c, "SELECT 1 + 2 AS three").await?;
    uint(&v, "seq")?;
    same("changed", &v["changed"], &json!(false))?;
    let e = entry(&v, 0, "select")?;
    same("columns", &e["columns"], &json!(["three"]))?;
    same("rows", &e["rows"], &json!([{"three": 3}]))
}

pub async fn insert_values_reports_count_and_results(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    let v = sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room, body) VALUES (1, 'a', 'hi'), (2, 'a', 'yo')"),
    )
    .await?;
    let s = uint(&v, "seq")?;
    let e = entry(&v, 0, "insert")?;
    same("count", &e["count"], &json!(2))?;
    same(
        "results",
        &e["results"],
        &json!([{"table": t, "id": 1, "version": s}, {"table": t, "id": 2, "version": s}]),
    )?;
    let r = c.get(&format!("/v1/tables/{t}/rows/2")).await?;
    same(
        "row 2",
        &r["row"],
        &json!({"id": 2, "room": "a", "body": "yo", "n": 0}),
    )
}

pub async fn update_where_reports_written_rows(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room) VALUES (1, 'a'), (2, 'b'), (3, 'a')"),
    )
    .await?;
    let v = sql_ok(
        &c,
        &format!("UPDATE {t} SET n = n + 5, body = 'x' WHERE room = 'a'"),
    )
    .await?;
    let s = uint(&v, "seq")?;
    let e = entry(&v, 0, "update")?;
    same("count", &e["count"], &json!(2))?;
    let mut ids: Vec<u64> = arr(e, "results")?
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .collect();
    ids.sort_unstable();
    ensure!(ids == [1, 3], "updated ids {ids:?}");
    ensure!(
        arr(e, "results")?
            .iter()
            .all(|r| r["version"] == json!(s) && r["table"] == json!(t)),
        "versions are not the commit's seq {s}: {}",
        show(e)
    );
    let q = c
        .post(
            "/v1/query",
            json!({"sql": format!("SELECT id, n FROM {t} ORDER BY id")}),
        )
        .await?;
    same(
        "rows",
        &q["rows"],
        &json!([{"id": 1, "n": 5}, {"id": 2, "n": 0}, {"id": 3, "n": 5}]),
    )
}

pub async fn delete_where_reports_deleted_versions(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    let ins = sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room) VALUES (1, 'a'), (2, 'b')"),
    )
    .await?;
    let s = uint(&ins, "seq")?;
    let v = sql_ok(&c, &format!("DELETE FROM {t} WHERE room = 'b'")).await?;
    let e = entry(&v, 0, "delete")?;
    same("count", &e["count"], &json!(1))?;
    same(
        "results",
        &e["results"],
        &json!([{"table": t, "id": 2, "version": s}]),
    )?;
    let v = sql_ok(&c, &format!("DELETE FROM {t} WHERE room = 'zzz'")).await?;
    let e = entry(&v, 0, "delete")?;
    same("count of a delete matching nothing", &e["count"], &json!(0))
}

pub async fn statements_see_earlier_statements_of_the_request(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    let v = sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room) VALUES (1, 'a'); UPDATE {t} SET body = 'seen' WHERE id = 1; SELECT id, body FROM {t}"),
    )
    .await?;
    entry(&v, 0, "insert")?;
    entry(&v, 1, "update")?;
    let e = entry(&v, 2, "select")?;
    same("rows", &e["rows"], &json!([{"id": 1, "body": "seen"}]))
}

pub async fn failing_statement_rolls_back_all_and_names_its_index(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    sql_ok(&c, &format!("INSERT INTO {t} (id, room) VALUES (1, 'a')")).await?;
    let before = seq(&c).await?;
    let e = c
        .call(
            "POST",
            "/v1/sql",
            Some(json!({"sql": format!("INSERT INTO {t} (id, room) VALUES (2, 'a'); UPDATE {t} SET body = 'z'; INSERT INTO {t} (id, room) VALUES (1, 'dup')")})),
        )
        .await?
        .err(409, "already_exists")?;
    same("statement", &e["statement"], &json!(2))?;
    ensure!(
        seq(&c).await? == before,
        "the refused request moved the seq"
    );
    let q = c
        .post(
            "/v1/query",
            json!({"sql": format!("SELECT id, body FROM {t}")}),
        )
        .await?;
    same(
        "rows after the refusal",
        &q["rows"],
        &json!([{"id": 1, "body": null}]),
    )
}

pub async fn insert_of_existing_key_is_already_exists(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    sql_ok(&c, &format!("INSERT INTO {t} (id, room) VALUES (1, 'a')")).await?;
    let e = c
        .call(
            "POST",
            "/v1/sql",
            Some(json!({"sql": format!("INSERT INTO {t} (id, room) VALUES (1, 'b')")})),
        )
        .await?
        .err(409, "already_exists")?;
    same("statement", &e["statement"], &json!(0))
}

pub async fn on_conflict_do_update_upserts(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room, n) VALUES (1, 'a', 1)"),
    )
    .await?;
    let v = sql_ok(
        &c,
        &format!("INSERT INTO {t} (id, room, n) VALUES (1, 'b', 10), (2, 'c', 20) ON CONFLICT (id) DO UPDATE SET room = excluded.room, n = n + 1"),
    )
    .await?;
    let e = entry(&v, 0, "insert")?;
    same("count", &e["count"], &json!(2))?;
    let q = c
        .post(
            "/v1/query",
            json!({"sql": format!("SELECT id, room, n FROM {t} ORDER BY id")}),
        )
        .await?;
    same(
        "rows",
        &q["rows"],
        &json!([{"id": 1, "room": "b", "n": 2}, {"id": 2, "room": "c", "n": 20}]),
    )
}

pub async fn ddl_mixed_with_data_is_unsupported(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    let other = c.name("t");
    c.call(
        "POST",
        "/v1/sql",
        Some(json!({"sql": format!("CREATE TABLE {other} (id INTEGER PRIMARY KEY); INSERT INTO {t} (id, room) VALUES (1, 'a')")})),
    )
    .await?
    .err(400, "unsupported")?;
    Ok(())
}

pub async fn insert_select_is_unsupported(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    c.call(
        "POST",
        "/v1/sql",
        Some(json!({"sql": format!("INSERT INTO {t} (id, room) SELECT id, room FROM {t}")})),
    )
    .await?
    .err(400, "unsupported")?;
    Ok(())
}

pub async fn select_entry_carries_types(c: Arc<Ctx>) -> R {
    let t = msgs(&c).await?;
    let v = sql_ok(&c, &format!("SELECT id, room, n FROM {t}")).await?;
    let e = entry(&v, 0, "select")?;
    same("types", &e["types"], &json!(["integer", "text", "integer"]))
}

// ---------------------------------------------------------------------------------------
// Server functions

/// The suite's module: its exports are named under the run's prefix.
fn module(c: &Ctx) -> String {
    let p = &c.prefix;
    format!(
        "export function {p}_echo(tx, args) {{ return {{got: args}}; }}\n\
         export function {p}_write_then_throw(tx, args) {{ tx.insert(args.table, {{id: args.id}}); throw new Error(\"conformance says no\"); }}\n\
         export function {p}_insert(tx, args) {{ return tx.insert(args.table, {{id: args.id}}); }}\n\
         export function {p}_spin(tx, args) {{ let i = 0; for (;;) {{ i += 1; }} }}\n"
    )
}

/// Loads the suite's module when the server has none (or already has ours); skips when
/// another module is loaded, so the suite never replaces the user's functions.
pub(crate) async fn load_module(c: &Ctx) -> R {
    let v = c.get("/v1/functions").await?;
    let exports = arr(&v, "exports")?;
    if exports
        .iter()
        .any(|e| !e.as_str().unwrap_or("").starts_with(&c.prefix))
    {
        skip!(
            "another functions module is loaded ({}); the suite does not replace it",
            show(&v["exports"])
        );
    }
    if exports.is_empty() {
        let resp = c
            .raw(
                "PUT",
                "/v1/functions",
                Some(module(c).into_bytes()),
                &crate::client::Auth::Admin,
                &[("Content-Type", "text/javascript")],
            )
            .await?;
        let v = resp.ok()?;
        ensure!(
            arr(&v, "exports")?.len() == 4,
            "exports after loading: {}",
            show(&v)
        );
    }
    Ok(())
}

/// Loads an empty module again when the suite's module is loaded.
pub(crate) async fn unload_module(c: &Ctx) {
    if let Ok(v) = c.get("/v1/functions").await {
        let ours = v["exports"].as_array().is_some_and(|e| {
            !e.is_empty()
                && e.iter()
                    .all(|x| x.as_str().unwrap_or("").starts_with(&c.prefix))
        });
        if ours {
            let _ = c
                .raw(
                    "PUT",
                    "/v1/functions",
                    Some(Vec::new()),
                    &crate::client::Auth::Admin,
                    &[("Content-Type", "text/javascript")],
                )
                .await;
        }
    }
}

pub async fn list_answers_exports(c: Arc<Ctx>) -> R {
    let v = c.get("/v1/functions").await?;
    arr(&v, "exports")?;
    Ok(())
}

pub async fn module_that_does_not_compile_is_compile_error_with_line(c: Arc<Ctx>) -> R {
    load_module(&c).await?;
    let before = c.get("/v1/functions").await?;
    let bad = "export function ok(tx) { return 1; }\n\n  this is ((( not javascript\n";
    let e = c
        .raw(
            "PUT",
            "/v1/functions",
            Some(bad.as_bytes().to_vec()),
            &crate::client::Auth::Admin,
            &[("Content-Type", "text/javascript")],
        )
        .await?
        .err(400, "compile_error")?;
    ensure!(e["line"].as_u64().is_some(), "no `line` in {}", show(&e));
    let after = c.get("/v1/functions").await?;
    same(
        "exports after the refused module",
        &after["exports"],
        &before["exports"],
    )
}

pub async fn call_answers_seq_and_result(c: Arc<Ctx>) -> R {
    load_module(&c).await?;
    let v = c
        .post(
            &format!("/v1/call/{}_echo", c.prefix),
            json!({"args": {"a": [1, "two"]}}),
        )
        .await?;
    uint(&v, "seq")?;
    same("result", &v["result"], &json!({"got": {"a": [1, "two"]}}))?;
    let t = table(&c, "fn", "id INTEGER PRIMARY KEY").await?;
    let v = c
        .post(
            &format!("/v1/call/{}_insert", c.prefix),
            json!({"args": {"table": t, "id": 1}}),
        )
        .await?;
    let s = uint(&v, "seq")?;
    same(
        "tx.insert's result (the new version)",
        &v["result"],
        &json!(s),
    )
}

pub async fn throwing_function_is_function_error_and_keeps_nothing(c: Arc<Ctx>) -> R {
    load_module(&c).await?;
    let t = table(&c, "fn", "id INTEGER PRIMARY KEY").await?;
    let before = seq(&c).await?;
    let e = c
        .call(
            "POST",
            &format!("/v1/call/{}_write_then_throw", c.prefix),
            Some(json!({"args": {"table": t, "id": 1}})),
        )
        .await?
        .err(400, "function_error")?;
    names(&e, &["conformance says no"])?;
    ensure!(seq(&c).await? == before, "the failed call moved the seq");
    c.call("GET", &format!("/v1/tables/{t}/rows/1"), None)
        .await?
        .err(404, "not_found")?;
    Ok(())
}

pub async fn unknown_function_is_not_found(c: Arc<Ctx>) -> R {
    c.call(
        "POST",
        &format!("/v1/call/{}_missing", c.prefix),
        Some(json!({"args": null})),
    )
    .await?
    .err(404, "not_found")?;
    Ok(())
}

pub async fn call_over_function_time_ms_is_limit(c: Arc<Ctx>) -> R {
    load_module(&c).await?;
    let resp = c
        .call(
            "POST",
            &format!("/v1/call/{}_spin", c.prefix),
            Some(json!({"args": null})),
        )
        .await?;
    let status = resp.status;
    ensure!(
        status == 413 || status == 429,
        "expected 413 limit, got {status}: {}",
        resp.text
    );
    let e = resp.err(status, "limit")?;
    names(&e, &["function-time-ms"])
}

pub async fn client_write_outside_policies_is_forbidden_naming_statement(c: Arc<Ctx>) -> R {
    let (token, sub) = super::client(&c, None, json!({}))?;
    let t = table(&c, "own", "id INTEGER PRIMARY KEY, owner TEXT").await?;
    c.sql(&format!("CREATE POLICY write_own ON {t} FOR ALL USING (owner = auth.sub) WITH CHECK (owner = auth.sub)")).await?;
    let auth = crate::client::Auth::Bearer(token);
    let v = c
        .call_as("POST", "/v1/sql", Some(json!({"sql": format!("INSERT INTO {t} (id, owner) VALUES (1, $1)"), "params": [sub]})), &auth)
        .await?
        .ok()?;
    entry(&v, 0, "insert")?;
    let e = c
        .call_as(
            "POST",
            "/v1/sql",
            Some(json!({"sql": format!("INSERT INTO {t} (id, owner) VALUES (2, $1); INSERT INTO {t} (id, owner) VALUES (3, 'someone-else')"), "params": [sub]})),
            &auth,
        )
        .await?
        .err(403, "forbidden")?;
    same("statement", &e["statement"], &json!(1))?;
    same("table", &e["table"], &json!(t))?;
    same("command", &e["command"], &json!("insert"))?;
    c.call("GET", &format!("/v1/tables/{t}/rows/2"), None)
        .await?
        .err(404, "not_found")?;
    Ok(())
}
