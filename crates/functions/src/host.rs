//! The `tx` object handed to every function: host functions over the lent transaction.

use rquickjs::{Ctx, Exception, Function, Object, Value};
use sluice_engine::db::key_from_json;
use sluice_engine::TxError;

use crate::convert::{db_to_js, js_to_json};
use crate::{AuthSlot, Slot};

/// Makes `tx.auth` a getter that cannot be redefined, then freezes `tx`: nothing a function
/// does to `tx` reaches a later call. Runs before the module, with the realm's own `Object`.
const SEAL_TX: &str = r#"(tx, auth) => {
  Object.defineProperty(tx, "auth", { get: auth, enumerable: true, configurable: false });
  return Object.freeze(tx);
}"#;

fn throw(ctx: &Ctx<'_>, code: &str, message: &str) -> rquickjs::Error {
    match Exception::from_message(ctx.clone(), &format!("{code}: {message}")) {
        Ok(ex) => {
            let _ = ex.as_object().set("code", code);
            ctx.throw(ex.into_value())
        }
        Err(e) => e,
    }
}

fn tx_error(ctx: &Ctx<'_>, e: TxError) -> rquickjs::Error {
    throw(ctx, e.code.as_str(), &e.message)
}

fn object_arg(
    ctx: &Ctx<'_>,
    value: &Value<'_>,
    what: &str,
) -> rquickjs::Result<serde_json::Map<String, serde_json::Value>> {
    match js_to_json(value, 0) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(throw(
            ctx,
            "bad_request",
            &format!("{what} must be an object"),
        )),
        Err(e) => Err(throw(ctx, "bad_request", &format!("{what}: {e}"))),
    }
}

fn json_arg(ctx: &Ctx<'_>, value: &Value<'_>, what: &str) -> rquickjs::Result<serde_json::Value> {
    js_to_json(value, 0).map_err(|e| throw(ctx, "bad_request", &format!("{what}: {e}")))
}

/// Runs `f` with the lent transaction, or throws if no call is in progress.
fn with_access<'js, T>(
    ctx: &Ctx<'js>,
    slot: &Slot,
    f: impl FnOnce(&mut dyn crate::TxAccess) -> rquickjs::Result<T>,
) -> rquickjs::Result<T> {
    let mut guard = slot.borrow_mut();
    match guard.as_mut() {
        Some(access) => f(access.as_mut()),
        None => Err(throw(
            ctx,
            "bad_request",
            "tx is only usable during a function call",
        )),
    }
}

/// Builds the `tx` object (created once per module load, reused by every call).
///
/// `rng` is the state of `tx.random()`; the caller resets it to 0 before every call, and the
/// first draw seeds it from the transaction. `auth` holds the caller of the call in progress
/// (`tx.auth`; `null` when it holds nothing: the admin).
pub(crate) fn install<'js>(
    ctx: &Ctx<'js>,
    slot: Slot,
    auth: AuthSlot,
    rng: std::rc::Rc<std::cell::Cell<u64>>,
) -> rquickjs::Result<Object<'js>> {
    let tx = Object::new(ctx.clone())?;

    let s = slot.clone();
    tx.set(
        "get",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, table: String, id: Value<'js>| -> rquickjs::Result<Value<'js>> {
                let id = json_arg(&ctx, &id, "id")?;
                with_access(&ctx, &s, |access| {
                    let tx = access.tx();
                    let db = tx.db();
                    let t = db.table(&table).map_err(|e| tx_error(&ctx, e))?;
                    let key = key_from_json(&t.schema, &id).map_err(|e| tx_error(&ctx, e))?;
                    match t.rows.get(&key) {
                        None => Ok(Value::new_null(ctx.clone())),
                        Some(row) => {
                            let object = Object::new(ctx.clone())?;
                            for (col, v) in t.schema.columns.iter().zip(row.values.iter()) {
                                object.set(col.name.as_str(), db_to_js(&ctx, v)?)?;
                            }
                            Ok(object.into_value())
                        }
                    }
                })
            },
        )?,
    )?;

    for (name, replace) in [("insert", false), ("upsert", true)] {
        let s = slot.clone();
        tx.set(
            name,
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>, table: String, row: Value<'js>| {
                    let row = object_arg(&ctx, &row, "row")?;
                    with_access(&ctx, &s, |access| {
                        let mut tx = access.tx();
                        let r = if replace {
                            tx.upsert(&table, &row, None)
                        } else {
                            tx.insert(&table, &row, None)
                        };
                        r.map(|w| w.version as f64).map_err(|e| tx_error(&ctx, e))
                    })
                },
            )?,
        )?;
    }

    let s = slot.clone();
    tx.set(
        "patch",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, table: String, id: Value<'js>, set: Value<'js>| {
                let id = json_arg(&ctx, &id, "id")?;
                let set = object_arg(&ctx, &set, "set")?;
                with_access(&ctx, &s, |access| {
                    access
                        .tx()
                        .patch(&table, &id, &set, None)
                        .map(|w| w.version as f64)
                        .map_err(|e| tx_error(&ctx, e))
                })
            },
        )?,
    )?;

    let s = slot.clone();
    tx.set(
        "delete",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, table: String, id: Value<'js>| {
                let id = json_arg(&ctx, &id, "id")?;
                with_access(&ctx, &s, |access| {
                    access
                        .tx()
                        .delete(&table, &id, None)
                        .map(|w| w.version as f64)
                        .map_err(|e| tx_error(&ctx, e))
                })
            },
        )?,
    )?;

    let s = slot.clone();
    tx.set(
        "append",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, topic: String, record: Value<'js>| {
                let record = json_arg(&ctx, &record, "record")?;
                let (tags, data) = sluice_engine::topic::record_from_json(record)
                    .map_err(|e| tx_error(&ctx, e))?;
                with_access(&ctx, &s, |access| {
                    let now = access.now_us();
                    access
                        .tx()
                        .append(&topic, tags, &data, now)
                        .map(|offset| offset as f64)
                        .map_err(|e| tx_error(&ctx, e))
                })
            },
        )?,
    )?;

    let s = slot.clone();
    tx.set(
        "now",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| {
            with_access(&ctx, &s, |access| Ok(access.now_us() as f64))
        })?,
    )?;

    let s = slot.clone();
    tx.set(
        "random",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| {
            with_access(&ctx, &s, |access| {
                // xorshift64*, seeded per transaction: the same draws on every replay.
                let mut x = rng.get();
                if x == 0 {
                    x = access.seed() | 1;
                }
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                rng.set(x);
                let out = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
                Ok((out >> 11) as f64 / (1u64 << 53) as f64)
            })
        })?,
    )?;

    tx.set(
        "query",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| -> rquickjs::Result<()> {
            Err(throw(
                &ctx,
                "unsupported",
                "tx.query needs the live-query engine, which is not built yet",
            ))
        })?,
    )?;

    let auth = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>| -> rquickjs::Result<Value<'js>> {
            match auth.borrow().as_ref() {
                Some(caller) => caller.clone().restore(&ctx),
                None => Ok(Value::new_null(ctx)),
            }
        },
    )?;
    let seal: Function = ctx.eval(SEAL_TX)?;
    seal.call((tx, auth))
}
