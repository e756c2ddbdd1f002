//! The hand-written reader of a MessagePack WebSocket `mutate` request (the TypeScript SDK's
//! default encoding): one pass over the frame's tokens ([`sluice_functions::msgpack::Reader`])
//! into typed ops, without `rmp_serde`'s visitor call for every key and value.
//!
//! Like the JSON reader beside it ([`super::json`]), it only ever *accepts*: whatever it is
//! not sure of — an op naming its table after its `row`, a `bin` or `ext` value, text that
//! is not UTF-8, a key it does not know — makes it return `None`, and the `rmp_serde` reader
//! ([`read_mutate_msgpack_serde`](super::read_mutate_msgpack_serde)) reads the frame instead.
//! What it accepts it reads exactly as that reader does: each token is the visitor call
//! `rmp_serde` makes for it (an integer marker of any width is its value; a `float 32` is
//! widened to `f64`), and a JSON column's value or the request's `id` is the
//! `serde_json::Value` that `rmp_serde` makes of it ([`Reader::json_value`], for values
//! [`Reader::check_value`] takes). As `rmp_serde` reads a frame, bytes after the request's
//! map are not looked at.

use std::sync::Arc;

use serde_json::Value as Json;
use sluice_engine::{ColumnType, TableSchema, Value};
use sluice_functions::msgpack::{Reader, Token};
use sluice_log::Durability;

use super::{column_index, finish_op, finish_row, table, text_value};
use super::{Kind, Pending, Schemas, Seen, TypedOp};

/// The ops, durability and id of the WebSocket `mutate` request `frame`, or `None` (see the
/// module's doc).
pub(super) fn read(frame: &[u8], schemas: &mut dyn Schemas, ops_max: usize) -> Option<super::Body> {
    let mut r = Reader::new(frame);
    let members = map(&mut r)?;
    let mut ops = None;
    let mut durability: Option<Option<Durability>> = None;
    let mut id = None;
    let mut typed = false;
    for _ in 0..members {
        match key(&mut r)? {
            b"type" if !typed => {
                if key(&mut r)? != b"mutate" {
                    return None;
                }
                typed = true;
            }
            b"id" if id.is_none() => id = Some(json(&mut r)?),
            b"ops" if ops.is_none() => ops = Some(read_ops(&mut r, schemas, ops_max)?),
            b"durability" if durability.is_none() => {
                durability = Some(match r.token()? {
                    Token::Nil => None,
                    Token::Str(name) => Some(std::str::from_utf8(name).ok()?.parse().ok()?),
                    _ => return None,
                });
            }
            _ => return None,
        }
    }
    if !typed {
        return None;
    }
    Some((ops?, durability.flatten(), id))
}

/// A map's member count.
fn map(r: &mut Reader<'_>) -> Option<u32> {
    match r.token()? {
        Token::Map(n) => Some(n),
        _ => None,
    }
}

/// A string's bytes, not checked as UTF-8: for a key or a word compared with ASCII ones
/// (equal to one, the bytes are that text), or checked by the caller ([`text`]).
fn key<'a>(r: &mut Reader<'a>) -> Option<&'a [u8]> {
    match r.token()? {
        Token::Str(s) => Some(s),
        _ => None,
    }
}

/// `bytes` as text, if they are UTF-8.
fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// Any value, as `rmp_serde` decodes it into a `serde_json::Value`, if
/// [`Reader::check_value`] takes it.
fn json(r: &mut Reader<'_>) -> Option<Json> {
    let start = r.position();
    r.check_value()?;
    let end = r.position();
    r.seek(start);
    let value = r.json_value()?;
    // The checked value was read whole: the reader is where the check ended.
    (r.position() == end).then_some(value)
}

/// `"ops"`: a non-empty array of ops, at most `ops_max`.
fn read_ops(r: &mut Reader<'_>, schemas: &mut dyn Schemas, ops_max: usize) -> Option<Vec<TypedOp>> {
    let Token::Array(n) = r.token()? else {
        return None;
    };
    let n = n as usize;
    if n == 0 || n > ops_max {
        return None;
    }
    let mut ops = Vec::with_capacity(n);
    // The table of the previous op, and the scratch row (as `super::OpsSeed` keeps them).
    let mut last = None;
    let mut buf = Vec::new();
    for _ in 0..n {
        ops.push(op(r, schemas, &mut last, &mut buf)?);
    }
    Some(ops)
}

/// One op; its table must come before its `row`, `set` or `id`.
fn op(
    r: &mut Reader<'_>,
    schemas: &mut dyn Schemas,
    last: &mut Option<Arc<TableSchema>>,
    buf: &mut Vec<Value>,
) -> Option<TypedOp> {
    let members = map(r)?;
    let mut kind = None;
    let mut schema: Option<Arc<TableSchema>> = None;
    let mut if_version: Option<Option<u64>> = None;
    let mut fields: Option<(bool, Pending)> = None;
    let mut id = None;
    for _ in 0..members {
        match key(r)? {
            b"op" if kind.is_none() => {
                kind = Some(match key(r)? {
                    b"insert" => Kind::Insert,
                    b"upsert" => Kind::Upsert,
                    b"patch" => Kind::Patch,
                    b"delete" => Kind::Delete,
                    _ => return None,
                });
            }
            b"table" if schema.is_none() => schema = Some(table(schemas, last, key(r)?)?),
            b"if_version" if if_version.is_none() => {
                // As `super::IfVersionSeed`: null, or an integer that is not negative.
                if_version = Some(match r.token()? {
                    Token::Nil => None,
                    Token::Int(i) => Some(u64::try_from(i).ok()?),
                    Token::Uint(u) => Some(u),
                    _ => return None,
                });
            }
            b"row" if fields.is_none() => {
                let schema = schema.as_deref()?;
                buf.clear();
                buf.resize(schema.columns.len(), Value::Null);
                let mut seen = members_of(r, schema, |i, v| buf[i] = v)?;
                fields = Some((false, Pending::Row(finish_row(schema, buf, &mut seen)?)));
            }
            b"set" if fields.is_none() => {
                let schema = schema.as_deref()?;
                let mut set = Vec::with_capacity(schema.columns.len());
                members_of(r, schema, |i, v| set.push((i, v)))?;
                fields = Some((true, Pending::Set(set)));
            }
            b"id" if id.is_none() => id = Some(column(r, schema.as_deref()?.pk_column().ty)?),
            _ => return None,
        }
    }
    finish_op(kind?, schema?, if_version.flatten(), fields, id, buf)
}

/// The members of a `row` or `set` map, each a column of `schema` named once:
/// `each(column, value)` in the order named. The columns named.
fn members_of(
    r: &mut Reader<'_>,
    schema: &TableSchema,
    mut each: impl FnMut(usize, Value),
) -> Option<Seen> {
    let members = map(r)?;
    let mut seen = Seen::new(schema.columns.len());
    let mut next = 0;
    for _ in 0..members {
        let i = column_index(schema, next, key(r)?)?;
        if !seen.insert(i) {
            return None;
        }
        next = i + 1;
        each(i, column(r, schema.columns[i].ty)?);
    }
    Some(seen)
}

/// One column value of type `ty`, as `super::ColumnSeed` converts the visitor call
/// `rmp_serde` makes for the token.
fn column(r: &mut Reader<'_>, ty: ColumnType) -> Option<Value> {
    if ty == ColumnType::Json {
        return Value::from_json(ColumnType::Json, &json(r)?).ok();
    }
    match (r.token()?, ty) {
        (Token::Nil, _) => Some(Value::Null),
        (Token::Bool(b), ColumnType::Boolean) => Some(Value::Boolean(b)),
        (Token::Int(i), ColumnType::Integer) => Some(Value::Integer(i)),
        (Token::Int(i), ColumnType::Timestamp) => Some(Value::Timestamp(i)),
        (Token::Int(i), ColumnType::Real) => Some(Value::Real(i as f64)),
        (Token::Uint(u), ColumnType::Real) => Some(Value::Real(u as f64)),
        (Token::Float(f), ColumnType::Real) if f.is_finite() => Some(Value::Real(f)),
        (Token::Str(s), _) => text_value(ty, text(s)?),
        _ => None,
    }
}
