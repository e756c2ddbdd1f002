//! Column types and values.
//!
//! Ordering follows SQLite's for these types: NULL < numbers (INTEGER, REAL, BOOLEAN,
//! TIMESTAMP compared numerically) < TEXT and JSON (bytewise) < BLOB.

use std::cmp::Ordering;
use std::fmt;

use base64::Engine as _;

use crate::thin::{ThinBytes, ThinStr};
use serde_json::Value as Json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Integer,
    Real,
    Boolean,
    Text,
    Blob,
    Json,
    Timestamp,
}

impl ColumnType {
    pub const fn as_str(self) -> &'static str {
        match self {
            ColumnType::Integer => "INTEGER",
            ColumnType::Real => "REAL",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Text => "TEXT",
            ColumnType::Blob => "BLOB",
            ColumnType::Json => "JSON",
            ColumnType::Timestamp => "TIMESTAMP",
        }
    }

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<ColumnType> {
        use ColumnType::*;
        [Integer, Real, Boolean, Text, Blob, Json, Timestamp]
            .get(code as usize)
            .copied()
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One typed value of a column.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Boolean(bool),
    Text(ThinStr),
    Blob(ThinBytes),
    /// Any JSON value, kept as its compact text (validated on the way in).
    Json(ThinStr),
    /// Microseconds since the Unix epoch.
    Timestamp(i64),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    fn class(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Integer(_) | Value::Real(_) | Value::Boolean(_) | Value::Timestamp(_) => 1,
            Value::Text(_) | Value::Json(_) => 2,
            Value::Blob(_) => 3,
        }
    }

    fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Integer(i) | Value::Timestamp(i) => Some(i),
            Value::Boolean(b) => Some(b as i64),
            _ => None,
        }
    }

    fn as_f64(&self) -> f64 {
        match *self {
            Value::Real(r) => r,
            _ => self.as_i64().unwrap_or(0) as f64,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Value::Text(s) | Value::Json(s) => s.as_bytes(),
            Value::Blob(b) => b,
            _ => &[],
        }
    }

    /// Approximate bytes this value takes in a log record (for the row size limit).
    pub fn encoded_len(&self) -> usize {
        match self {
            Value::Null | Value::Boolean(_) => 1,
            Value::Integer(_) | Value::Real(_) | Value::Timestamp(_) => 9,
            Value::Text(s) | Value::Json(s) => 5 + s.len(),
            Value::Blob(b) => 5 + b.len(),
        }
    }

    /// Converts a JSON value into a value of column type `ty`; `Err` says what was wrong.
    pub fn from_json(ty: ColumnType, json: &Json) -> Result<Value, String> {
        if json.is_null() {
            return Ok(Value::Null);
        }
        let wrong = || format!("expected {ty}, got {}", json_kind(json));
        Ok(match ty {
            ColumnType::Integer => Value::Integer(json.as_i64().ok_or_else(wrong)?),
            ColumnType::Timestamp => Value::Timestamp(json.as_i64().ok_or_else(wrong)?),
            ColumnType::Real => Value::Real(json.as_f64().ok_or_else(wrong)?),
            ColumnType::Boolean => Value::Boolean(json.as_bool().ok_or_else(wrong)?),
            ColumnType::Text => Value::Text(json.as_str().ok_or_else(wrong)?.into()),
            ColumnType::Blob => {
                let text = json.as_str().ok_or_else(wrong)?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("expected base64 text for BLOB: {e}"))?;
                Value::Blob(bytes.into())
            }
            ColumnType::Json => Value::Json(json.to_string().into()),
        })
    }

    pub fn to_json(&self) -> Json {
        match self {
            Value::Null => Json::Null,
            Value::Integer(i) | Value::Timestamp(i) => Json::from(*i),
            Value::Real(r) => serde_json::Number::from_f64(*r)
                .map(Json::Number)
                .unwrap_or(Json::Null),
            Value::Boolean(b) => Json::Bool(*b),
            Value::Text(s) => Json::String(s.to_string()),
            Value::Blob(b) => Json::String(base64::engine::general_purpose::STANDARD.encode(b)),
            Value::Json(text) => serde_json::from_str(text).unwrap_or(Json::Null),
        }
    }

    /// Whether this value may be stored in a column of type `ty` (NULL fits any).
    pub fn fits(&self, ty: ColumnType) -> bool {
        matches!(
            (self, ty),
            (Value::Null, _)
                | (Value::Integer(_), ColumnType::Integer)
                | (Value::Real(_), ColumnType::Real)
                | (Value::Boolean(_), ColumnType::Boolean)
                | (Value::Text(_), ColumnType::Text)
                | (Value::Blob(_), ColumnType::Blob)
                | (Value::Json(_), ColumnType::Json)
                | (Value::Timestamp(_), ColumnType::Timestamp)
        )
    }
}

pub(crate) fn json_kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.class(), other.class());
        if a != b {
            return a.cmp(&b);
        }
        match a {
            0 => Ordering::Equal,
            1 => match (self.as_i64(), other.as_i64()) {
                (Some(x), Some(y)) => x.cmp(&y),
                _ => self.as_f64().total_cmp(&other.as_f64()),
            },
            _ => self.as_bytes().cmp(other.as_bytes()),
        }
    }
}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Value {}

/// A primary key: tables are keyed by an INTEGER or a TEXT column.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Int(i64),
    Text(ThinStr),
}

// Rows are slices of values and tables are maps of keys: their size is most of the memory.
const _: () = assert!(std::mem::size_of::<Value>() == 16);
const _: () = assert!(std::mem::size_of::<Key>() == 16);

/// Integer keys interpolate (ids are dense, so a lookup lands on or next to its row);
/// text keys and a span across both kinds search by bisection.
impl crate::cow::Guess for Key {
    fn guess(&self, lo: &Self, hi: &Self) -> Option<f64> {
        match (self, lo, hi) {
            (Key::Int(x), Key::Int(lo), Key::Int(hi)) => {
                crate::cow::interpolate(*x as f64, *lo as f64, *hi as f64)
            }
            _ => None,
        }
    }
}

impl Key {
    pub fn from_value(value: &Value) -> Option<Key> {
        match value {
            Value::Integer(i) => Some(Key::Int(*i)),
            Value::Text(s) => Some(Key::Text(s.clone())),
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            Key::Int(i) => Value::Integer(*i),
            Key::Text(s) => Value::Text(s.clone()),
        }
    }

    pub fn to_json(&self) -> Json {
        match self {
            Key::Int(i) => Json::from(*i),
            Key::Text(s) => Json::String(s.to_string()),
        }
    }

    /// Parses a key given in a URL path or query string for a key column of type `ty`.
    pub fn parse(ty: ColumnType, text: &str) -> Result<Key, String> {
        match ty {
            ColumnType::Integer => text
                .parse::<i64>()
                .map(Key::Int)
                .map_err(|_| format!("expected an INTEGER key, got {text:?}")),
            _ => Ok(Key::Text(text.into())),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Int(i) => write!(f, "{i}"),
            Key::Text(s) => write!(f, "{s:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_follows_sqlite_classes() {
        let ordered = [
            Value::Null,
            Value::Integer(-5),
            Value::Real(-4.5),
            Value::Boolean(false),
            Value::Integer(1),
            Value::Real(1.5),
            Value::Text("a".into()),
            Value::Text("b".into()),
            Value::Blob(vec![0].into()),
        ];
        for w in ordered.windows(2) {
            assert!(w[0] < w[1], "{:?} < {:?}", w[0], w[1]);
        }
        assert_eq!(Value::Integer(2), Value::Real(2.0));
    }

    #[test]
    fn json_conversion_checks_types() {
        assert!(Value::from_json(ColumnType::Integer, &Json::from(1.5)).is_err());
        assert!(Value::from_json(ColumnType::Text, &Json::from(1)).is_err());
        let blob = Value::from_json(ColumnType::Blob, &Json::from("AAEC")).unwrap();
        assert_eq!(blob.to_json(), Json::from("AAEC"));
        let json = Value::from_json(ColumnType::Json, &serde_json::json!({"a":[1,2]})).unwrap();
        assert_eq!(json.to_json(), serde_json::json!({"a":[1,2]}));
    }
}
