//! The `tx` object handed to every function: host functions over the lent transaction.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use rquickjs::{Atom, Ctx, Exception, Function, Object, Persistent, Type, Value};
use sluice_engine::db::key_from_json;
use sluice_engine::{ColumnType, Key, TableSchema, TxError, Value as DbValue};

use crate::convert::js_to_json;
use crate::raw::{db_to_js, Raw};
use crate::{AuthSlot, Slot};

/// Tables whose column atoms are kept at most (past it the cache starts over).
const CACHED_TABLES_MAX: usize = 64;

/// The names of the tables the module's functions touched and of their columns, as JS
/// atoms made once per table schema: a table named by a string literal is found by its
/// atom (no text made of it), `tx.get` names its row objects' properties with the column
/// atoms and `tx.patch` matches the property names of its `set` against them (atoms
/// compare as integers). Held as [`Persistent`] values, each of which holds its context,
/// while the host functions that share this cache live in that context:
/// [`Columns::clear`] must run before the context is dropped, or neither would be freed.
#[derive(Default)]
pub(crate) struct Columns {
    tables: Vec<TableColumns>,
}

type SavedAtom = Persistent<Atom<'static>>;

struct TableColumns {
    table: Rc<str>,
    table_atom: SavedAtom,
    /// The schema the atoms were made for. A schema change gives the table a new `Arc`
    /// (and holding this one keeps its address from being reused).
    schema: Arc<TableSchema>,
    columns: Vec<SavedAtom>,
}

impl Columns {
    /// Drops every atom (and with them their hold on the context).
    pub(crate) fn clear(&mut self) {
        self.tables.clear();
    }

    /// The table named by the JS value `table` (a string, else the error converting it to
    /// one), without making a Rust string of it when it is a known table's name.
    fn table_name<'js>(&self, ctx: &Ctx<'js>, table: &Value<'js>) -> rquickjs::Result<Rc<str>> {
        if table.is_string() {
            let atom = Persistent::save(ctx, Atom::from_value(ctx.clone(), table)?);
            if let Some(t) = self.tables.iter().find(|t| t.table_atom == atom) {
                return Ok(t.table.clone());
            }
        }
        let name: String = rquickjs::FromJs::from_js(ctx, table.clone())?;
        Ok(name.into())
    }

    /// The atoms of `schema`'s columns, in column order.
    fn columns<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        table: &str,
        schema: &Arc<TableSchema>,
    ) -> rquickjs::Result<&[SavedAtom]> {
        let found = self.tables.iter().position(|t| *t.table == *table);
        let at = match found {
            Some(i)
                if Arc::ptr_eq(&self.tables[i].schema, schema)
                    && self.tables[i].columns.len() == schema.columns.len() =>
            {
                i
            }
            _ => {
                let columns = schema
                    .columns
                    .iter()
                    .map(|c| saved_atom(ctx, &c.name))
                    .collect::<rquickjs::Result<Vec<_>>>()?;
                let entry = TableColumns {
                    table: table.into(),
                    table_atom: saved_atom(ctx, table)?,
                    schema: schema.clone(),
                    columns,
                };
                match found {
                    Some(i) => {
                        self.tables[i] = entry;
                        i
                    }
                    None => {
                        if self.tables.len() >= CACHED_TABLES_MAX {
                            self.tables.clear();
                        }
                        self.tables.push(entry);
                        self.tables.len() - 1
                    }
                }
            }
        };
        Ok(&self.tables[at].columns)
    }
}

/// The atom of `name`, made from a JS string (QuickJS's `JS_NewAtomLen` may match a
/// non-ASCII name to the atom of its UTF-8 bytes read as Latin-1).
fn saved_atom(ctx: &Ctx<'_>, name: &str) -> rquickjs::Result<SavedAtom> {
    let text = rquickjs::String::from_str(ctx.clone(), name)?.into_value();
    Ok(Persistent::save(ctx, Atom::from_value(ctx.clone(), &text)?))
}

/// One property of a `set` (`tx.patch`) as read from JavaScript: a primitive kept as it
/// is (its JSON form is implied), or anything else already converted to JSON exactly as
/// [`js_to_json`] converts it.
pub(crate) enum Prop {
    Null,
    Bool(bool),
    /// A JS integer, or a float with an integral value below 2^53 (JSON reads both as an
    /// integer).
    Int(i64),
    /// A finite float that is not such an integer.
    Float(f64),
    Text(String),
    Json(serde_json::Value),
}

impl Prop {
    /// `value` as a property of an object at depth 0 (so the value is at depth 1); `None`
    /// if [`js_to_json`] skips it (a function or `undefined`).
    fn read(value: &Value<'_>) -> Result<Option<Prop>, String> {
        if value.is_function() || value.type_of() == Type::Undefined {
            return Ok(None);
        }
        Ok(Some(match value.type_of() {
            Type::Null => Prop::Null,
            Type::Bool => Prop::Bool(value.as_bool().unwrap_or(false)),
            Type::Int => Prop::Int(value.as_int().unwrap_or(0).into()),
            Type::Float => match value.as_float().and_then(Prop::from_float) {
                Some(p) => p,
                None => Prop::Json(js_to_json(value, 1)?),
            },
            Type::String => Prop::Text(
                value
                    .as_string()
                    .and_then(|s| s.to_string().ok())
                    .unwrap_or_default(),
            ),
            _ => Prop::Json(js_to_json(value, 1)?),
        }))
    }

    /// A finite float as JSON reads it: an integer when it has an integral value below
    /// 2^53, else a float; `None` for NaN and the infinities (converted as JSON would be,
    /// which refuses them).
    pub(crate) fn from_float(f: f64) -> Option<Prop> {
        if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
            Some(Prop::Int(f as i64))
        } else if f.is_finite() {
            Some(Prop::Float(f))
        } else {
            None
        }
    }

    /// Whether this property converts to a value of a column of type `ty` without error
    /// (else the JSON path says why, in its words).
    pub(crate) fn fits(&self, ty: ColumnType) -> bool {
        matches!(
            (ty, self),
            (_, Prop::Null)
                | (
                    ColumnType::Integer | ColumnType::Timestamp | ColumnType::Real,
                    Prop::Int(_)
                )
                | (ColumnType::Real, Prop::Float(_))
                | (ColumnType::Boolean, Prop::Bool(_))
                | (ColumnType::Text, Prop::Text(_))
        )
    }

    /// The value for a column of type `ty`, which it [`Prop::fits`]; a text is moved out.
    pub(crate) fn take(&mut self, ty: ColumnType) -> DbValue {
        match (ty, self) {
            (ColumnType::Integer, Prop::Int(i)) => DbValue::Integer(*i),
            (ColumnType::Timestamp, Prop::Int(i)) => DbValue::Timestamp(*i),
            (ColumnType::Real, Prop::Int(i)) => DbValue::Real(*i as f64),
            (ColumnType::Real, Prop::Float(f)) => DbValue::Real(*f),
            (ColumnType::Boolean, Prop::Bool(b)) => DbValue::Boolean(*b),
            (ColumnType::Text, Prop::Text(s)) => DbValue::Text(std::mem::take(s).into()),
            _ => DbValue::Null,
        }
    }

    fn into_json(self) -> serde_json::Value {
        match self {
            Prop::Null => serde_json::Value::Null,
            Prop::Bool(b) => serde_json::Value::Bool(b),
            Prop::Int(i) => serde_json::Value::from(i),
            Prop::Float(f) => serde_json::Number::from_f64(f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Prop::Text(s) => serde_json::Value::String(s),
            Prop::Json(j) => j,
        }
    }
}

/// The `set` of a `tx.patch` (or the row of a `tx.insert` / `tx.upsert`) as read from JavaScript, property by property in the order
/// [`js_to_json`] reads them (so getters run, and errors arise, exactly as they did when
/// `set` was converted to a JSON object first).
enum SetArg {
    Props(Vec<(SavedAtom, Prop)>),
    /// Not a plain object: converted as before (`Object` only when it is one).
    Json(serde_json::Map<String, serde_json::Value>),
}

impl SetArg {
    fn read<'js>(ctx: &Ctx<'js>, value: &Value<'js>, what: &str) -> rquickjs::Result<SetArg> {
        if value.type_of() != Type::Object {
            return object_arg(ctx, value, what).map(SetArg::Json);
        }
        let object = value.as_object().expect("type is object");
        let mut props = Vec::new();
        for prop in object.props::<Atom<'js>, Value<'js>>() {
            let (k, v) = prop.map_err(|e| throw(ctx, "bad_request", &format!("{what}: {e}")))?;
            match Prop::read(&v) {
                Ok(Some(p)) => props.push((Persistent::save(ctx, k), p)),
                Ok(None) => {}
                Err(e) => return Err(throw(ctx, "bad_request", &format!("{what}: {e}"))),
            }
        }
        Ok(SetArg::Props(props))
    }

    /// The JSON object [`object_arg`] would have made of it.
    fn into_json(
        self,
        ctx: &Ctx<'_>,
    ) -> rquickjs::Result<serde_json::Map<String, serde_json::Value>> {
        match self {
            SetArg::Json(map) => Ok(map),
            SetArg::Props(props) => {
                let mut map = serde_json::Map::new();
                for (k, p) in props {
                    map.insert(k.restore(ctx)?.to_string()?, p.into_json());
                }
                Ok(map)
            }
        }
    }
}

/// `props` as `(column, value)` pairs of `schema` for a patch, if every property names a
/// column other than the key and converts to its type; `None` sends the patch down the
/// JSON path, which refuses it with its own errors in its own order. `atoms` name the
/// columns in order, as saved atoms here or raw ones in [`crate::raw`].
pub(crate) fn typed_set<A: PartialEq>(
    props: &mut [(A, Prop)],
    schema: &TableSchema,
    atoms: &[A],
    out: &mut Vec<(usize, DbValue)>,
) -> Option<()> {
    out.clear();
    for (name, prop) in props.iter() {
        let i = atoms.iter().position(|a| a == name)?;
        if i == schema.pk || !prop.fits(schema.columns[i].ty) {
            return None;
        }
        out.push((i, DbValue::Null));
    }
    // All fit: only now are texts moved out (a refusal above leaves `props` whole).
    for ((i, value), (_, prop)) in out.iter_mut().zip(props.iter_mut()) {
        *value = prop.take(schema.columns[*i].ty);
    }
    Some(())
}

/// `props` as a whole row of `schema` for an insert or upsert, if every property names a
/// column and converts to its type, the columns not named take their default (else NULL),
/// the primary key is set and no NOT NULL column is NULL: exactly the row the JSON path
/// builds. `None` sends the write down the JSON path, which refuses it with its own errors
/// in its own order.
fn typed_row(
    props: &mut [(SavedAtom, Prop)],
    schema: &TableSchema,
    atoms: &[SavedAtom],
) -> Option<(Key, Vec<DbValue>)> {
    let mut at = Vec::with_capacity(props.len());
    for (name, prop) in props.iter() {
        let i = atoms.iter().position(|a| a == name)?;
        if !prop.fits(schema.columns[i].ty) {
            return None;
        }
        at.push(i);
    }
    // All fit: only now are texts moved out (a refusal above leaves `props` whole).
    let mut named: Vec<Option<DbValue>> = vec![None; schema.columns.len()];
    for (&i, (_, prop)) in at.iter().zip(props.iter_mut()) {
        named[i] = Some(prop.take(schema.columns[i].ty));
    }
    let values: Vec<DbValue> = named
        .into_iter()
        .zip(&schema.columns)
        .map(|(v, c)| v.or_else(|| c.default.clone()).unwrap_or(DbValue::Null))
        .collect();
    let key = Key::from_value(&values[schema.pk])?;
    let null_in_not_null = schema
        .columns
        .iter()
        .zip(&values)
        .any(|(c, v)| c.not_null && v.is_null());
    (!null_in_not_null).then_some((key, values))
}

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

pub(crate) fn tx_error(ctx: &Ctx<'_>, e: TxError) -> rquickjs::Error {
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

/// The error of a tx call made while another one is running (from code it triggered).
fn reentered(ctx: &Ctx<'_>) -> rquickjs::Error {
    throw(
        ctx,
        "bad_request",
        "a tx call was made while another tx call was running (from a getter or setter it triggered); tx calls cannot nest",
    )
}

/// Runs `f` with the lent transaction, or throws if no call is in progress.
fn with_access<'js, T>(
    ctx: &Ctx<'js>,
    slot: &Slot,
    f: impl FnOnce(&mut dyn crate::TxAccess) -> rquickjs::Result<T>,
) -> rquickjs::Result<T> {
    // JavaScript can run inside a tx call (a setter on `Object.prototype` while a row object
    // is filled, a getter of an argument) and call tx again: that is refused as an error,
    // never a panic (which on the writer thread would stop the server).
    let Ok(mut guard) = slot.try_borrow_mut() else {
        return Err(reentered(ctx));
    };
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
    columns: Rc<RefCell<Columns>>,
    raw: Rc<Raw>,
) -> rquickjs::Result<Object<'js>> {
    let tx = Object::new(ctx.clone())?;

    let s = slot.clone();
    let cols = columns.clone();
    let slow_get = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>, table: Value<'js>, id: Value<'js>| -> rquickjs::Result<Value<'js>> {
            // No borrow of the cache is held while JavaScript may run (a getter of `id`).
            let table = cols
                .try_borrow()
                .map_err(|_| reentered(&ctx))?
                .table_name(&ctx, &table)?;
            let id = json_arg(&ctx, &id, "id")?;
            with_access(&ctx, &s, |access| {
                let tx = access.tx();
                let db = tx.db();
                let t = db.table(&table).map_err(|e| tx_error(&ctx, e))?;
                let key = key_from_json(&t.schema, &id).map_err(|e| tx_error(&ctx, e))?;
                match t.rows.get(&key) {
                    None => Ok(Value::new_null(ctx.clone())),
                    Some(row) => {
                        let mut cols = cols.try_borrow_mut().map_err(|_| reentered(&ctx))?;
                        let atoms = cols.columns(&ctx, &table, &t.schema)?;
                        let object = Object::new(ctx.clone())?;
                        for (atom, v) in atoms.iter().zip(row.values.iter()) {
                            object.set(atom.clone().restore(&ctx)?, db_to_js(&ctx, v)?)?;
                        }
                        Ok(object.into_value())
                    }
                }
            })
        },
    )?;

    let s = slot.clone();
    let cols = columns.clone();
    // Reused by every patch: the typed values of one `set`.
    let typed: RefCell<Vec<(usize, DbValue)>> = RefCell::default();
    let slow_patch = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>, table: Value<'js>, id: Value<'js>, set: Value<'js>| {
            let table = cols
                .try_borrow()
                .map_err(|_| reentered(&ctx))?
                .table_name(&ctx, &table)?;
            let id = json_arg(&ctx, &id, "id")?;
            let mut set = SetArg::read(&ctx, &set, "set")?;
            with_access(&ctx, &s, |access| {
                let mut tx = access.tx();
                let mut typed = typed.try_borrow_mut().map_err(|_| reentered(&ctx))?;
                // Typed when every property fits its column; else the JSON path, which
                // refuses the patch with the errors it always gave, in the same order.
                let fast = match &mut set {
                    SetArg::Props(props) => match tx.db().table(&table) {
                        Ok(t) => {
                            let mut cols = cols.try_borrow_mut().map_err(|_| reentered(&ctx))?;
                            let atoms = cols.columns(&ctx, &table, &t.schema)?;
                            typed_set(props, &t.schema, atoms, &mut typed)
                                .map(|()| (t.schema.clone(), key_from_json(&t.schema, &id)))
                        }
                        Err(_) => None,
                    },
                    SetArg::Json(_) => None,
                };
                let written = match fast {
                    Some((schema, key)) => {
                        key.and_then(|key| tx.patch_decoded(&schema, key, &mut typed, None))
                    }
                    None => tx.patch(&table, &id, &set.into_json(&ctx)?, None),
                };
                written
                    .map(|w| w.version as f64)
                    .map_err(|e| tx_error(&ctx, e))
            })
        },
    )?;

    // The calls a read-modify-write function makes most are served by C functions over
    // raw values, which hand every other call to these (see `raw`).
    let (get, patch) = Raw::install(&raw, ctx, &slow_get, &slow_patch)?;
    tx.set("get", get)?;

    for (name, replace) in [("insert", false), ("upsert", true)] {
        let s = slot.clone();
        let cols = columns.clone();
        tx.set(
            name,
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>, table: Value<'js>, row: Value<'js>| {
                    let table = cols
                        .try_borrow()
                        .map_err(|_| reentered(&ctx))?
                        .table_name(&ctx, &table)?;
                    let mut row = SetArg::read(&ctx, &row, "row")?;
                    with_access(&ctx, &s, |access| {
                        let mut tx = access.tx();
                        // Typed when the row is whole and every property fits its column;
                        // else the JSON path, which refuses it with the errors it always
                        // gave, in the same order.
                        let fast = match &mut row {
                            SetArg::Props(props) => match tx.db().table(&table) {
                                Ok(t) => {
                                    let mut cols =
                                        cols.try_borrow_mut().map_err(|_| reentered(&ctx))?;
                                    let atoms = cols.columns(&ctx, &table, &t.schema)?;
                                    typed_row(props, &t.schema, atoms)
                                        .map(|(key, values)| (t.schema.clone(), key, values))
                                }
                                Err(_) => None,
                            },
                            SetArg::Json(_) => None,
                        };
                        let written = match fast {
                            Some((schema, key, values)) => {
                                tx.put_decoded(&schema, key, values.into(), None, replace)
                            }
                            None => {
                                let row = row.into_json(&ctx)?;
                                if replace {
                                    tx.upsert(&table, &row, None)
                                } else {
                                    tx.insert(&table, &row, None)
                                }
                            }
                        };
                        written
                            .map(|w| w.version as f64)
                            .map_err(|e| tx_error(&ctx, e))
                    })
                },
            )?,
        )?;
    }

    tx.set("patch", patch)?;

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
