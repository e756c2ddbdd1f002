//! The live-result checksum of `docs/protocol.md` ("Checksum"), recomputed on the client:
//! the wrapping sum of XXH3-64 over each row's canonical bytes, as 16 hex digits.

use serde_json::Value;

/// The canonical bytes of one value of type `ty` (a declared type from `types`, or `None`:
/// the value says its own type). `Err` names a value the wire cannot tell apart.
fn push_value(out: &mut Vec<u8>, v: &Value, ty: Option<&str>) -> Result<(), String> {
    let var = |out: &mut Vec<u8>, tag: u8, bytes: &[u8]| {
        out.push(tag);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    if v.is_null() {
        out.push(0x00);
        return Ok(());
    }
    let ty = match ty {
        Some(t) => t.to_ascii_lowercase(),
        None => match v {
            Value::Bool(_) => "boolean".into(),
            Value::String(_) => "text".into(),
            Value::Number(n) if n.is_f64() => "real".into(),
            Value::Number(_) => "integer".into(),
            other => return Err(format!("a value of no type: {other}")),
        },
    };
    match (ty.as_str(), v) {
        ("integer", Value::Number(n)) | ("timestamp", Value::Number(n)) => {
            let i = n
                .as_i64()
                .ok_or_else(|| format!("{ty} value {n} is not an i64"))?;
            out.push(if ty == "integer" { 0x01 } else { 0x07 });
            out.extend_from_slice(&i.to_le_bytes());
        }
        ("real", Value::Number(n)) => {
            let f = n.as_f64().ok_or_else(|| format!("real value {n}"))?;
            out.push(0x02);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        ("boolean", Value::Bool(b)) => {
            out.push(0x03);
            out.push(u8::from(*b));
        }
        ("text", Value::String(s)) => var(out, 0x04, s.as_bytes()),
        ("blob", Value::String(s)) => {
            let bytes = crate::jwt::base64_decode(s, false)
                .ok_or_else(|| format!("blob value {s:?} is not base64"))?;
            var(out, 0x05, &bytes)
        }
        ("json", v) => var(out, 0x06, v.to_string().as_bytes()),
        (ty, v) => return Err(format!("a {ty} column holding {v}")),
    }
    Ok(())
}

/// XXH3-64 of one row's canonical bytes: `columns` in order, typed by `types` (same
/// length as `columns`, `null` entries: the value's own type; an empty slice: no types).
pub fn row_checksum(row: &Value, columns: &[String], types: &[Value]) -> Result<u64, String> {
    let mut buf = Vec::with_capacity(64);
    for (i, c) in columns.iter().enumerate() {
        let v = row.get(c).unwrap_or(&Value::Null);
        let ty = types.get(i).and_then(Value::as_str);
        push_value(&mut buf, v, ty)?;
    }
    Ok(xxhash_rust::xxh3::xxh3_64(&buf))
}

/// The checksum of rows, as the server renders it (16 lower-case hex digits).
pub fn rows_checksum<'a>(
    rows: impl IntoIterator<Item = &'a Value>,
    columns: &[String],
    types: &[Value],
) -> Result<String, String> {
    let mut sum = 0u64;
    for r in rows {
        sum = sum.wrapping_add(row_checksum(r, columns, types)?);
    }
    Ok(format!("{sum:016x}"))
}
