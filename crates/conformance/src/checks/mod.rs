//! The check list, area by area, and helpers shared by the checks.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::client::{Auth, Enc};
use crate::{fail, show, skip, Check, Ctx, R};

mod auth;
mod http;
mod live;
pub(crate) mod shutdown;
mod sql;
mod topics;
mod web;
mod ws;

/// A check `async fn f(Arc<Ctx>) -> R` in `area`.
macro_rules! check {
    ($area:literal, $name:ident => $f:ident) => {
        Check {
            area: $area,
            name: stringify!($name),
            run: |c| Box::pin($f(c)),
        }
    };
    ($area:literal, $f:ident) => {
        Check {
            area: $area,
            name: stringify!($f),
            run: |c| Box::pin($f(c)),
        }
    };
}

/// A WebSocket check `async fn f(Arc<Ctx>, Enc) -> R`, once per encoding.
macro_rules! ws_check {
    ($f:ident) => {
        [
            Check {
                area: "ws.json",
                name: stringify!($f),
                run: |c| Box::pin(ws::$f(c, Enc::Json)),
            },
            Check {
                area: "ws.msgpack",
                name: stringify!($f),
                run: |c| Box::pin(ws::$f(c, Enc::Msgpack)),
            },
        ]
    };
}

/// Every check, in the order they run.
pub(crate) fn all() -> Vec<Check> {
    let mut v = vec![
        // HTTP basics and errors every endpoint shares.
        check!("http", health_answers_ok_and_seq_without_a_token),
        check!("http", unknown_route_is_not_found),
        check!("http", wrong_method_is_method_not_allowed),
        check!("http", malformed_json_is_bad_request),
        check!("http", wrong_request_shape_is_bad_request),
        check!("http", body_over_max_body_bytes_is_limit),
        // Tokens.
        check!("auth", missing_token_is_unauthorized_missing),
        check!("auth", non_bearer_header_is_unauthorized_malformed),
        check!("auth", garbage_token_is_unauthorized_malformed),
        check!("auth", wrong_admin_token_is_unauthorized),
        check!("auth", jwt_without_client_tokens_is_no_client_tokens),
        check!("auth", jwt_with_bad_signature_is_unauthorized_bad_signature),
        check!("auth", jwt_alg_none_is_unauthorized_wrong_algorithm),
        check!("auth", expired_jwt_is_unauthorized_expired),
        check!("auth", jwt_without_sub_is_unauthorized_missing_claim),
        check!("auth", client_token_on_admin_endpoint_is_forbidden),
        check!("auth", client_sending_as_is_forbidden),
        check!("auth", access_token_parameter_works_on_live_only),
        // Tables, DDL and policies through /v1/sql.
        check!("schema", create_table_reports_seq_and_changed),
        check!("schema", create_table_reply_lists_a_ddl_entry),
        check!(
            "schema",
            create_existing_table_is_already_exists_with_statement
        ),
        check!("schema", create_if_not_exists_changes_nothing),
        check!("schema", bad_sql_syntax_is_bad_request),
        check!("schema", restrictive_policy_is_unsupported),
        check!("schema", policy_on_unknown_column_is_schema),
        check!("schema", tables_lists_columns_types_and_primary_key),
        check!("schema", policies_lists_created_policy),
        check!("schema", sql_text_over_sql_bytes_max_is_limit),
        // Mutations.
        check!("mutate", insert_reports_table_id_and_version_equal_to_seq),
        check!("mutate", every_op_kind_applies_in_one_commit),
        check!("mutate", insert_of_existing_key_is_already_exists_with_op),
        check!("mutate", patch_of_missing_row_is_not_found),
        check!("mutate", unknown_table_is_not_found),
        check!("mutate", unknown_column_is_schema),
        check!("mutate", wrong_value_type_is_schema),
        check!("mutate", missing_primary_key_is_schema),
        check!("mutate", stale_if_version_is_conflict),
        check!("mutate", patch_naming_the_primary_key_is_bad_request),
        check!("mutate", failing_op_changes_nothing_and_keeps_the_seq),
        check!("mutate", ops_over_max_ops_is_limit),
        // Reads and catch-up.
        check!("reads", get_row_answers_row_version_seq),
        check!("reads", get_missing_row_is_not_found),
        check!("reads", scan_pages_in_key_order_with_next),
        check!("reads", page_limit_over_max_page_rows_is_limit),
        check!("reads", changes_list_schema_and_row_changes_in_seq_order),
        check!("reads", changes_below_the_retained_window_is_horizon),
        // Queries.
        check!("query", select_answers_seq_columns_rows),
        check!("query", select_carries_column_types),
        check!("query", positional_and_named_params_bind),
        check!("query", unsupported_construct_is_unsupported_naming_it),
        check!("query", unknown_table_is_not_found => unknown_table_is_not_found_query),
        check!("query", bad_syntax_is_bad_request),
        check!("query", sql_text_over_sql_bytes_max_is_limit => sql_text_over_sql_bytes_max_is_limit_query),
        check!("query", admin_as_claims_reads_through_policies),
        // SQL data statements.
        check!("sql", select_without_from_is_a_select_entry),
        check!("sql", insert_values_reports_count_and_results),
        check!("sql", update_where_reports_written_rows),
        check!("sql", delete_where_reports_deleted_versions),
        check!("sql", statements_see_earlier_statements_of_the_request),
        check!("sql", failing_statement_rolls_back_all_and_names_its_index),
        check!("sql", insert_of_existing_key_is_already_exists),
        check!("sql", on_conflict_do_update_upserts),
        check!("sql", ddl_mixed_with_data_is_unsupported),
        check!("sql", insert_select_is_unsupported),
        check!("sql", select_entry_carries_types),
        check!(
            "sql",
            client_write_outside_policies_is_forbidden_naming_statement
        ),
        // Server functions.
        check!("functions", list_answers_exports),
        check!(
            "functions",
            module_that_does_not_compile_is_compile_error_with_line
        ),
        check!("functions", call_answers_seq_and_result),
        check!(
            "functions",
            throwing_function_is_function_error_and_keeps_nothing
        ),
        check!("functions", unknown_function_is_not_found),
        check!("functions", call_over_function_time_ms_is_limit),
        // Row policies with client tokens.
        check!("policies", client_reads_only_rows_its_policies_pass),
        check!("policies", client_reads_nothing_without_a_policy),
        check!(
            "policies",
            client_write_refused_is_forbidden_naming_policies
        ),
        check!("policies", client_live_view_ends_with_rules_changed),
        // Live queries over SSE.
        check!("live", first_event_is_a_snapshot_with_id_equal_to_seq),
        check!("live", snapshot_carries_column_types),
        check!("live", insert_update_delete_send_add_change_remove),
        check!("live", ordered_view_diffs_carry_index),
        check!("live", aggregate_view_keys_are_group_values),
        check!("live", checksum_matches_rows_after_every_event),
        check!("live", resume_with_since_sends_exactly_the_missed_diffs),
        check!(
            "live",
            resume_with_last_event_id_sends_exactly_the_missed_diffs
        ),
        check!("live", since_zero_is_a_reset_snapshot),
        check!("live", since_ahead_of_the_view_is_a_reset_snapshot),
        check!("live", alter_table_sends_a_reset_snapshot),
        check!("live", drop_table_ends_the_stream_with_an_error_event),
        check!("live", idle_stream_sends_heartbeat_comments),
        check!("live", backlog_becomes_a_reset_snapshot),
        check!("live", unsupported_query_is_a_json_error_before_the_stream),
        check!("live", unknown_table_is_not_found_before_the_stream),
        check!("live", bad_params_is_bad_request_before_the_stream),
        // Topics over HTTP and SSE.
        check!("topics", put_creates_then_alters_and_no_change_has_null_seq),
        check!("topics", get_and_list_answer_topic_info),
        check!("topics", bad_topic_name_is_bad_request),
        check!("topics", unknown_topic_is_not_found),
        check!("topics", delete_answers_seq_then_topic_is_gone),
        check!("topics", append_answers_consecutive_offsets),
        check!("topics", append_with_bad_tag_is_bad_request_with_op),
        check!("topics", record_over_max_record_bytes_is_limit),
        check!("topics", record_with_more_than_16_tags_is_limit_with_op),
        check!("topics", bad_tag_pattern_is_bad_request),
        check!("topics", read_limit_over_max_page_rows_is_limit),
        check!("topics", read_pages_in_offset_order_with_next),
        check!("topics", read_with_tag_filter_returns_only_matching_records),
        check!("topics", read_below_first_is_horizon_with_first),
        check!("topics", read_past_next_is_bad_request),
        check!("topics", watch_says_watching_then_streams_records),
        check!("topics", watch_replays_from_and_filters_tags),
        check!("topics", watch_resumes_after_last_event_id),
        check!("topics", watch_below_first_is_horizon_before_the_stream),
        check!("topics", watch_of_dropped_topic_ends_with_not_found),
        check!("topics", lagging_watcher_ends_with_lagging_and_next),
        check!("topics", client_read_without_rules_is_forbidden),
        check!("topics", client_read_and_append_within_rules),
        // Codes only a broken or overloaded server answers (listed, skipped with why).
        check!("unreachable", log_poisoned_after_a_failed_sync),
        check!("unreachable", busy_asks_to_try_again),
        // The console and compression.
        check!(
            "web",
            root_redirects_to_the_console_or_serves_the_public_index
        ),
        check!("web", console_page_loads_without_a_token),
        check!("web", json_reply_over_1_kib_is_compressed_when_accepted),
        check!("web", sse_stream_is_compressed_and_flushed_per_event),
        check!("web", websocket_offers_no_permessage_deflate),
        // WebSocket, both encodings.
        check!("ws", upgrade_without_token_is_unauthorized),
        check!("ws", default_subprotocol_is_json),
        check!("ws", access_token_parameter_authenticates_the_upgrade),
        check!(
            "ws",
            frame_over_max_body_bytes_is_limit_and_connection_stays
        ),
        check!("ws", frame_over_twice_max_body_bytes_closes_the_connection),
        check!("ws", subscriptions_over_the_per_connection_limit_are_limit),
    ];
    for pair in [
        ws_check!(negotiates_the_subprotocol),
        ws_check!(ping_answers_pong_with_seq),
        ws_check!(query_answers_result_with_columns_types_rows),
        ws_check!(mutate_answers_results),
        ws_check!(mutate_error_carries_code_and_op),
        ws_check!(call_answers_result),
        ws_check!(call_of_unknown_function_is_not_found),
        ws_check!(subscribe_sends_snapshot_then_diffs),
        ws_check!(subscribe_resumes_with_since),
        ws_check!(refused_subscribe_carries_id_and_qid),
        ws_check!(unsubscribe_answers_unsubscribed_and_stops_events),
        ws_check!(append_answers_first_and_last),
        ws_check!(watch_answers_watching_then_records),
        ws_check!(second_watch_of_a_topic_is_already_exists),
        ws_check!(unwatch_answers_unwatched),
        ws_check!(watch_of_unknown_topic_is_not_found),
        ws_check!(pipelined_requests_are_answered_by_id),
        ws_check!(undecodable_frame_is_error_with_null_id_and_connection_stays),
        ws_check!(other_encoding_frame_is_decoded_too),
        ws_check!(unknown_type_is_bad_request),
        ws_check!(missing_type_is_bad_request),
        ws_check!(nesting_deeper_than_128_is_bad_request),
        ws_check!(unsupported_query_is_unsupported),
        ws_check!(client_mutate_refused_is_forbidden),
        ws_check!(client_watch_without_rules_is_forbidden),
        ws_check!(client_subscription_ends_with_rules_changed),
    ] {
        v.extend(pair);
    }
    v
}

use auth::*;
use http::*;
use live::*;
use sql::*;
use topics::*;
use web::*;
use ws::{
    access_token_parameter_authenticates_the_upgrade, default_subprotocol_is_json,
    frame_over_max_body_bytes_is_limit_and_connection_stays,
    frame_over_twice_max_body_bytes_closes_the_connection,
    subscriptions_over_the_per_connection_limit_are_limit, upgrade_without_token_is_unauthorized,
};

/// Drops every table and topic of the run, and the suite's functions module.
pub(crate) async fn cleanup(c: &Arc<Ctx>) {
    if let Ok(tables) = c.get("/v1/tables").await {
        for t in tables["tables"].as_array().into_iter().flatten() {
            if let Some(name) = t["name"].as_str() {
                if name.starts_with(&c.prefix) {
                    let _ = c
                        .call(
                            "POST",
                            "/v1/sql",
                            Some(json!({"sql": format!("DROP TABLE IF EXISTS {name}")})),
                        )
                        .await;
                }
            }
        }
    }
    if let Ok(topics) = c.get("/v1/topics").await {
        for t in topics["topics"].as_array().into_iter().flatten() {
            if let Some(name) = t["name"].as_str() {
                if name.starts_with(&c.prefix) {
                    let _ = c.call("DELETE", &format!("/v1/topics/{name}"), None).await;
                }
            }
        }
    }
    sql::unload_module(c).await;
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Creates a table `conf_<random>_<what>_<n>` with these column definitions.
pub(crate) async fn table(c: &Ctx, what: &str, columns: &str) -> R<String> {
    let name = c.name(what);
    c.sql(&format!("CREATE TABLE {name} ({columns})")).await?;
    Ok(name)
}

/// `v[key]` as an unsigned integer.
pub(crate) fn uint(v: &Value, key: &str) -> R<u64> {
    match v.get(key).and_then(Value::as_u64) {
        Some(n) => Ok(n),
        None => fail!("`{key}` is not an unsigned integer in {}", show(v)),
    }
}

/// `v[key]` as an array.
pub(crate) fn arr<'a>(v: &'a Value, key: &str) -> R<&'a Vec<Value>> {
    match v.get(key).and_then(Value::as_array) {
        Some(a) => Ok(a),
        None => fail!("`{key}` is not an array in {}", show(v)),
    }
}

/// `v[key]` as a string.
pub(crate) fn string<'a>(v: &'a Value, key: &str) -> R<&'a str> {
    match v.get(key).and_then(Value::as_str) {
        Some(s) => Ok(s),
        None => fail!("`{key}` is not a string in {}", show(v)),
    }
}

/// `v` has every key of `keys`.
pub(crate) fn has(v: &Value, keys: &[&str]) -> R {
    for k in keys {
        if v.get(*k).is_none() {
            fail!("`{k}` is missing in {}", show(v));
        }
    }
    Ok(())
}

/// `actual == expected`, or fail naming `what`.
pub(crate) fn same(what: &str, actual: &Value, expected: &Value) -> R {
    if actual != expected {
        fail!("{what}: expected {}, got {}", show(expected), show(actual));
    }
    Ok(())
}

/// The error's message mentions `word` (a named limit, a construct).
pub(crate) fn names(error: &Value, words: &[&str]) -> R {
    let m = error["message"].as_str().unwrap_or("");
    if !words.iter().any(|w| m.contains(w)) {
        fail!("the message does not name {}: {m:?}", words.join(" or "));
    }
    Ok(())
}

/// The current seq (from `/health`).
pub(crate) async fn seq(c: &Ctx) -> R<u64> {
    let h = c.call_as("GET", "/health", None, &Auth::None).await?.ok()?;
    uint(&h, "seq")
}

/// A client token for subject `sub` with these extra claims: minted when the suite has
/// the server's secret; otherwise the given client token when `sub` is `None`
/// (any subject); otherwise the check is skipped.
pub(crate) fn client(c: &Ctx, sub: Option<&str>, extra: Value) -> R<(String, String)> {
    if let Some(secret) = &c.opts.jwt_secret {
        let sub = sub.map(str::to_string).unwrap_or_else(|| c.name("user"));
        let mut claims = json!({"sub": sub, "exp": crate::jwt::now_secs() + 3600, "iat": crate::jwt::now_secs()});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                claims[k] = v;
            }
        }
        return Ok((crate::jwt::hs256(secret, &claims), sub));
    }
    if let (Some(token), None, true) = (
        &c.opts.client_token,
        sub,
        extra.as_object().is_none_or(|m| m.is_empty()),
    ) {
        let claims = crate::jwt::claims(token).unwrap_or(Value::Null);
        let Some(sub) = claims["sub"].as_str() else {
            skip!("the --client-token has no `sub` claim");
        };
        return Ok((token.clone(), sub.to_string()));
    }
    skip!("needs client tokens: pass --jwt-secret (or --client-token for the simpler checks)")
}

/// The secret, or skip.
pub(crate) fn secret(c: &Ctx) -> R<String> {
    match &c.opts.jwt_secret {
        Some(s) => Ok(s.clone()),
        None => skip!("needs the server's --jwt-secret to mint tokens"),
    }
}
