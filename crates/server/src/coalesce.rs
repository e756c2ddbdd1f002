//! `coalesce_ms`, the opt-in coalescing window of a live subscription (WebSocket
//! `subscribe`/`subscribe_many`, SSE `GET /v1/live?coalesce_ms=`) or a topic watch
//! (WebSocket `watch`, SSE `GET /v1/topics/{name}/watch?coalesce_ms=`): how it is read and
//! bounded. What it does lives with each stream: views fold their diffs
//! (`sluice_live::fold`), watches hand records out in batches ([`crate::topics::Watch::coalesce`]).

use std::time::Duration;

use serde_json::Value;

use crate::api::ApiError;

/// The largest window a client may ask for (`coalesce_ms_max`): a longer one would hold a
/// subscriber's changes back for longer than a reconnect would.
pub const COALESCE_MS_MAX: u32 = sluice_live::COALESCE_MS_MAX;

fn out_of_range(shown: &str) -> ApiError {
    ApiError::limit(format!(
        "\"coalesce_ms\" is {shown}; it must be an integer from 0 to coalesce_ms_max ({COALESCE_MS_MAX} ms)"
    ))
}

/// `coalesce_ms` from a JSON request: absent or `null` is 0 (a diff per commit).
pub(crate) fn coalesce_ms(value: Option<&Value>) -> Result<u32, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(v) => match v.as_u64() {
            Some(ms) if ms <= u64::from(COALESCE_MS_MAX) => Ok(ms as u32),
            Some(_) => Err(out_of_range(&v.to_string())),
            None => Err(ApiError::bad_request(format!(
                "\"coalesce_ms\" must be an integer from 0 to {COALESCE_MS_MAX}, got {v}"
            ))),
        },
    }
}

/// `coalesce_ms` from a query string.
pub(crate) fn coalesce_ms_text(text: Option<&str>) -> Result<u32, ApiError> {
    match text {
        None => Ok(0),
        Some(t) => match t.trim().parse::<u64>() {
            Ok(ms) if ms <= u64::from(COALESCE_MS_MAX) => Ok(ms as u32),
            Ok(_) => Err(out_of_range(t)),
            Err(_) => Err(ApiError::bad_request(format!(
                "query parameter \"coalesce_ms\" must be an integer from 0 to {COALESCE_MS_MAX}, got {t:?}"
            ))),
        },
    }
}

/// The window as a duration (zero: none).
pub(crate) fn window(coalesce_ms: u32) -> Duration {
    Duration::from_millis(u64::from(coalesce_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coalesce_ms_is_bounded_and_named() {
        assert_eq!(coalesce_ms(None).unwrap(), 0);
        assert_eq!(coalesce_ms(Some(&json!(null))).unwrap(), 0);
        assert_eq!(coalesce_ms(Some(&json!(10))).unwrap(), 10);
        assert_eq!(coalesce_ms(Some(&json!(10_000))).unwrap(), 10_000);
        let e = coalesce_ms(Some(&json!(10_001))).unwrap_err();
        assert_eq!(e.code, "limit");
        assert!(e.message.contains("coalesce_ms_max"), "{}", e.message);
        for bad in [json!(-1), json!(1.5), json!("10"), json!([1])] {
            assert_eq!(coalesce_ms(Some(&bad)).unwrap_err().code, "bad_request");
        }
        assert_eq!(coalesce_ms_text(Some("100")).unwrap(), 100);
        assert_eq!(coalesce_ms_text(Some("99999")).unwrap_err().code, "limit");
        assert_eq!(coalesce_ms_text(Some("x")).unwrap_err().code, "bad_request");
    }
}
