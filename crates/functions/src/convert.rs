//! Values across the Rust/JavaScript boundary, converted natively (no JSON text).

use rquickjs::{Array, Ctx, Function, IntoJs, Object, Type, Value};
use serde_json::Value as Json;

/// Nesting depth past which a value is refused (guards the Rust stack).
pub(crate) const DEPTH_MAX: usize = 64;

/// Items an array may have to leave JavaScript. A sparse array's `length` can reach
/// 2^32 − 1 with no memory behind it, and its JSON would be that many `null`s; a dense
/// array this long already fills the default 64 MiB of function memory (16 bytes a slot).
pub(crate) const ARRAY_ITEMS_MAX: usize = 1 << 22;

/// `json` as a JS value whose every object and array is frozen with `freeze`
/// (`Object.freeze`): read-only at every depth (the caller's `tx.auth`). Unfrozen values
/// are built in raw calls by `crate::raw` (call arguments, rows, JSON columns).
pub(crate) fn json_to_frozen_js<'js>(
    ctx: &Ctx<'js>,
    json: &Json,
    freeze: &Function<'js>,
) -> rquickjs::Result<Value<'js>> {
    let value = match json {
        Json::Null => Value::new_null(ctx.clone()),
        Json::Bool(b) => Value::new_bool(ctx.clone(), *b),
        Json::Number(n) => match n.as_i64() {
            Some(i) if i32::try_from(i).is_ok() => Value::new_int(ctx.clone(), i as i32),
            _ => Value::new_float(ctx.clone(), n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => s.as_str().into_js(ctx)?,
        Json::Array(items) => {
            let array = Array::new(ctx.clone())?;
            for (i, item) in items.iter().enumerate() {
                array.set(i, json_to_frozen_js(ctx, item, freeze)?)?;
            }
            array.into_value()
        }
        Json::Object(map) => {
            let object = Object::new(ctx.clone())?;
            for (k, v) in map {
                object.set(k.as_str(), json_to_frozen_js(ctx, v, freeze)?)?;
            }
            object.into_value()
        }
    };
    if value.is_object() {
        freeze.call((value,))
    } else {
        Ok(value)
    }
}

pub(crate) fn js_to_json(value: &Value<'_>, depth: usize) -> Result<Json, String> {
    if depth > DEPTH_MAX {
        return Err(format!("value nested deeper than {DEPTH_MAX} levels"));
    }
    Ok(match value.type_of() {
        Type::Uninitialized | Type::Undefined | Type::Null => Json::Null,
        Type::Bool => Json::Bool(value.as_bool().unwrap_or(false)),
        Type::Int => Json::from(value.as_int().unwrap_or(0)),
        Type::Float => {
            let f = value.as_float().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                Json::from(f as i64)
            } else {
                serde_json::Number::from_f64(f)
                    .map(Json::Number)
                    .ok_or_else(|| format!("{f} is not a finite number"))?
            }
        }
        Type::String => Json::String(
            value
                .as_string()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_default(),
        ),
        Type::Array => {
            let array = value.as_array().expect("type is array");
            // Read as a number: past 2^31 − 1 it is a float, which rquickjs's `Array::len`
            // (and so its iterator) asserts it is not — a panic on the writer thread.
            let length: Value = value
                .as_object()
                .expect("an array is an object")
                .get("length")
                .map_err(|e| e.to_string())?;
            let length = length
                .as_int()
                .map(f64::from)
                .or_else(|| length.as_float())
                .unwrap_or(f64::NAN);
            if !(0.0..=ARRAY_ITEMS_MAX as f64).contains(&length) {
                return Err(format!(
                    "an array of {length} items is longer than the {ARRAY_ITEMS_MAX} a value may hold (array_items_max)"
                ));
            }
            let length = length as usize;
            let mut out = Vec::with_capacity(length);
            for i in 0..length {
                let item: Value = array.get(i).map_err(|e| e.to_string())?;
                out.push(js_to_json(&item, depth + 1)?);
            }
            Json::Array(out)
        }
        Type::Object | Type::Exception => {
            let object = value.as_object().expect("type is object");
            let mut map = serde_json::Map::new();
            for prop in object.props::<String, Value>() {
                let (k, v) = prop.map_err(|e| e.to_string())?;
                if v.is_function() || v.type_of() == Type::Undefined {
                    continue;
                }
                map.insert(k, js_to_json(&v, depth + 1)?);
            }
            Json::Object(map)
        }
        Type::BigInt => {
            let big = value.as_big_int().expect("type is bigint").clone();
            Json::from(big.to_i64().map_err(|e| e.to_string())?)
        }
        other => return Err(format!("a {other} value cannot be stored")),
    })
}
