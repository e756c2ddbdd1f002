//! `tx.get` and `tx.patch` as QuickJS C functions over raw values: the calls a
//! read-modify-write function makes by the thousand per second.
//!
//! Through rquickjs every JS value a host function touches holds its own reference to the
//! context (a `JS_DupContext` and a `JS_FreeContext` each), and arguments, atoms and
//! property lists each pass through a layer of conversion: 61 context references per
//! `transfer` call, ~40 % of its instructions outside the engine. Here the common shape of
//! each call — a table named by a string, a key that is an integer or a text, and for
//! `tx.patch` a plain object whose own properties are data properties holding primitives —
//! is served with raw QuickJS calls and atoms cached per table schema.
//!
//! Everything else is handed, untouched, to the rquickjs function it replaces (the
//! "slow" function of [`host::install`]): the fast path decides before anything observable
//! has happened (no getter, setter or proxy trap has run, nothing was written), so the
//! slow function sees the same call and gives the same result and the same error, in the
//! same order. What the fast path does produce is the same as the slow one's: the row
//! object is filled property by property with `JS_SetProperty` as `Object::set` does (a
//! setter on `Object.prototype` runs, as before), and a patch goes through the same
//! typed conversion ([`host::Prop`]) and `TxRef::patch_decoded`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use rquickjs::qjs::{self, JSAtom, JSContext, JSValue};
use rquickjs::Ctx;
use sluice_engine::{ColumnType, Key, TableSchema, Value as DbValue};

use crate::host::{self, Prop};
use crate::msgpack::{ArgsRef, Reader, Token};
use crate::Slot;

/// Tables whose atoms are cached at most (past it the cache starts over).
const CACHED_TABLES_MAX: usize = 64;
/// Own properties of a `tx.patch` set served by the fast path at most.
const PATCH_PROPS_MAX: usize = 64;

/// The state the C functions reach through their context's opaque pointer. Owned (in an
/// `Rc`) by the loaded module and dropped before its context: it holds atoms and values
/// of that context, which it frees when dropped.
pub(crate) struct Raw {
    ctx: NonNull<JSContext>,
    slot: Slot,
    /// Off: every call goes to the slow functions (tests compare the two paths).
    enabled: std::rc::Rc<Cell<bool>>,
    tables: RefCell<Vec<RawTable>>,
    /// Reused by every patch: the properties of one `set`, then their typed values.
    props: RefCell<Vec<(JSAtom, Prop)>>,
    typed: RefCell<Vec<(usize, DbValue)>>,
    /// The rquickjs functions the fast paths hand other calls to (owned references).
    slow_get: Cell<JSValue>,
    slow_patch: Cell<JSValue>,
    /// The class of a plain object (`{}`), read off one at install.
    plain_class: Cell<u32>,
    /// Shapes of the argument objects and `tx.patch` sets seen, kept alive.
    kept: RefCell<Vec<KeptShape>>,
    /// The atoms of the ASCII property names built objects were given, by their bytes
    /// (one reference each held; see [`key_atom`]).
    key_atoms: RefCell<Vec<(Box<[u8]>, JSAtom)>>,
}

/// Property names whose atoms are cached at most, and their longest: a call's argument
/// keys are few and short, and a miss scans the whole cache.
const KEY_ATOMS_MAX: usize = 64;
const KEY_ATOM_BYTES_MAX: usize = 32;

struct RawTable {
    name: Box<str>,
    /// The table's name as an atom (one reference held).
    atom: JSAtom,
    /// The atom's own string (one reference held): a string literal naming the table is
    /// this very string, so most calls match it by address, without making an atom.
    text: JSValue,
    /// The schema the column atoms were made for (a schema change gives the table a new
    /// `Arc`, and holding this one keeps its address from being reused).
    schema: Arc<TableSchema>,
    /// The `Db::schema_seq` at which `schema` was last found to be the table's: while it
    /// stays, no schema changed and `schema` is still current.
    schema_seq: u64,
    /// Column names as atoms, in column order, and the shapes of the row objects.
    columns: KeptShape,
}

/// Property names, as atoms in order (one reference each held), and one object for each
/// prefix of them, the empty one included, holding those properties (`null`). QuickJS frees an object shape with
/// its last object and makes it again for the next: with these alive, an object given
/// these properties in this order finds every shape it passes through ready (a hash
/// lookup), where it would otherwise allocate a shape, grow it and free it.
struct KeptShape {
    atoms: Vec<JSAtom>,
    templates: Vec<JSValue>,
}

/// Properties past which a shape's prefixes are not kept (their objects take memory).
const KEPT_PROPS_MAX: usize = 16;
/// Shapes of argument objects and `tx.patch` sets kept at most (past it the cache starts
/// over).
const KEPT_SHAPES_MAX: usize = 64;

impl KeptShape {
    /// Takes the references of `atoms`.
    ///
    /// # Safety
    /// `c` is a live context and `atoms` are its atoms.
    unsafe fn new(c: *mut JSContext, atoms: Vec<JSAtom>) -> KeptShape {
        let mut templates = Vec::new();
        if atoms.len() <= KEPT_PROPS_MAX {
            'prefixes: for n in 0..=atoms.len() {
                let object = qjs::JS_NewObject(c);
                if qjs::JS_IsException(object) {
                    drop_exception(c);
                    break;
                }
                templates.push(object);
                for &atom in &atoms[..n] {
                    // Defined, not set: no setter of `Object.prototype` runs here. A data
                    // property made by `JS_SetProperty` has the same flags.
                    let flags = qjs::JS_PROP_C_W_E as c_int;
                    if qjs::JS_DefinePropertyValue(c, object, atom, qjs::JS_NULL, flags) < 0 {
                        drop_exception(c);
                        break 'prefixes;
                    }
                }
            }
        }
        KeptShape { atoms, templates }
    }

    unsafe fn free(self, c: *mut JSContext) {
        self.atoms.into_iter().for_each(|a| qjs::JS_FreeAtom(c, a));
        self.templates
            .into_iter()
            .for_each(|o| qjs::JS_FreeValue(c, o));
    }
}

impl Raw {
    /// The state of `ctx`'s raw functions; installed as the context's opaque pointer by
    /// [`Raw::install`].
    pub(crate) fn new(ctx: &Ctx<'_>, slot: Slot, enabled: std::rc::Rc<Cell<bool>>) -> Raw {
        Raw {
            ctx: ctx.as_raw(),
            slot,
            enabled,
            tables: RefCell::default(),
            props: RefCell::default(),
            typed: RefCell::default(),
            slow_get: Cell::new(qjs::JS_UNDEFINED),
            slow_patch: Cell::new(qjs::JS_UNDEFINED),
            plain_class: Cell::new(u32::MAX),
            kept: RefCell::default(),
            key_atoms: RefCell::default(),
        }
    }

    /// Makes `raw` reachable from its context and returns `tx.get` and `tx.patch` as C
    /// functions that hand what they do not serve to `slow_get` and `slow_patch`.
    ///
    /// `raw` must stay at its address, and be dropped before its context is (the loaded
    /// module holds it in an `Rc`, declared before the context).
    pub(crate) fn install<'js>(
        raw: &std::rc::Rc<Raw>,
        ctx: &Ctx<'js>,
        slow_get: &rquickjs::Function<'js>,
        slow_patch: &rquickjs::Function<'js>,
    ) -> rquickjs::Result<(rquickjs::Value<'js>, rquickjs::Value<'js>)> {
        let c = ctx.as_raw().as_ptr();
        assert_eq!(
            c,
            raw.ctx.as_ptr(),
            "installed in the context it was made for"
        );
        // SAFETY: `c` is the live context `ctx` stands for; the values are owned references
        // (dup'd here, freed in `Drop`); the opaque pointer stays valid while `raw` lives,
        // and `Drop` clears it first.
        unsafe {
            raw.slow_get.set(qjs::JS_DupValue(c, slow_get.as_raw()));
            raw.slow_patch.set(qjs::JS_DupValue(c, slow_patch.as_raw()));
            let plain = owned(ctx, qjs::JS_NewObject(c))?;
            raw.plain_class.set(qjs::JS_GetClassID(plain.as_raw()));
            qjs::JS_SetContextOpaque(c, std::rc::Rc::as_ptr(raw) as *mut c_void);
            let get = qjs::JS_NewCFunction2(
                c,
                Some(raw_get),
                c"get".as_ptr(),
                2,
                qjs::JSCFunctionEnum_JS_CFUNC_generic,
                0,
            );
            let get = owned(ctx, get)?;
            let patch = qjs::JS_NewCFunction2(
                c,
                Some(raw_patch),
                c"patch".as_ptr(),
                3,
                qjs::JSCFunctionEnum_JS_CFUNC_generic,
                0,
            );
            let patch = owned(ctx, patch)?;
            Ok((get, patch))
        }
    }

    /// The cached table named by the JS value `table` in `db`, (re)made when missing or
    /// made for another schema; `None` when `table` is not a string naming a table of
    /// `db` (the slow path then says why), or the cache is in use.
    ///
    /// # Safety
    /// `table` is a live value of this context.
    unsafe fn table<'a, 'd>(
        &self,
        tables: &'a mut Vec<RawTable>,
        table: JSValue,
        db: &'d sluice_engine::Db,
    ) -> Option<(&'a RawTable, &'d sluice_engine::table::Table)> {
        let c = self.ctx.as_ptr();
        if !is_string(table) {
            return None;
        }
        let by_address = tables.iter().position(|t| t.is(table));
        let (found, atom) = match by_address {
            Some(i) => (Some(i), qjs::JS_ATOM_NULL),
            None => {
                let atom = qjs::JS_ValueToAtom(c, table);
                if atom == qjs::JS_ATOM_NULL {
                    drop_exception(c);
                    return None;
                }
                (tables.iter().position(|t| t.atom == atom), atom)
            }
        };
        if let Some(i) = found {
            if atom != qjs::JS_ATOM_NULL {
                qjs::JS_FreeAtom(c, atom);
            }
            let t = db.table(&tables[i].name).ok()?;
            if !Arc::ptr_eq(&t.schema, &tables[i].schema) {
                let columns = self.column_atoms(&t.schema)?;
                let old = std::mem::replace(&mut tables[i].columns, KeptShape::new(c, columns));
                old.free(c);
                tables[i].schema = t.schema.clone();
            }
            tables[i].schema_seq = db.schema_seq;
            return Some((&tables[i], t));
        }
        let made = atom_text(c, atom).and_then(|name| {
            let t = db.table(&name).ok()?;
            let columns = self.column_atoms(&t.schema)?;
            let text = qjs::JS_AtomToValue(c, atom);
            if qjs::JS_IsException(text) {
                drop_exception(c);
                columns.into_iter().for_each(|a| qjs::JS_FreeAtom(c, a));
                return None;
            }
            let entry = RawTable {
                name: name.into(),
                atom,
                text,
                schema: t.schema.clone(),
                schema_seq: db.schema_seq,
                columns: KeptShape::new(c, columns),
            };
            Some((entry, t))
        });
        let Some((entry, t)) = made else {
            qjs::JS_FreeAtom(c, atom);
            return None;
        };
        if tables.len() >= CACHED_TABLES_MAX {
            tables.drain(..).for_each(|t| t.free(c));
        }
        tables.push(entry);
        Some((tables.last().expect("just pushed"), t))
    }

    /// The cached table named by `table`, as [`Raw::table`] finds it, for a caller that
    /// needs only its schema and atoms: a string already matched by address whose schema
    /// no schema commit can have changed since (`Db::schema_seq`) is answered without
    /// looking the table up by name.
    ///
    /// # Safety
    /// As [`Raw::table`].
    unsafe fn schema_of<'a>(
        &self,
        tables: &'a mut Vec<RawTable>,
        table: JSValue,
        db: &sluice_engine::Db,
    ) -> Option<&'a RawTable> {
        let current = is_string(table)
            .then(|| {
                tables
                    .iter()
                    .position(|t| t.is(table) && t.schema_seq == db.schema_seq)
            })
            .flatten();
        match current {
            Some(i) => Some(&tables[i]),
            None => self.table(tables, table, db).map(|(entry, _)| entry),
        }
    }

    /// Keeps the shapes of objects given the properties `atoms` in this order (see
    /// [`KeptShape`]), unless they are kept already or the cache is in use.
    ///
    /// # Safety
    /// `atoms` are atoms of this context.
    unsafe fn keep(&self, atoms: &[JSAtom]) {
        if atoms.is_empty() || atoms.len() > KEPT_PROPS_MAX {
            return;
        }
        let Ok(mut kept) = self.kept.try_borrow_mut() else {
            return;
        };
        if kept.iter().any(|k| k.atoms == atoms) {
            return;
        }
        let c = self.ctx.as_ptr();
        if kept.len() >= KEPT_SHAPES_MAX {
            kept.drain(..).for_each(|k| k.free(c));
        }
        let atoms = atoms.iter().map(|&a| qjs::JS_DupAtom(c, a)).collect();
        kept.push(KeptShape::new(c, atoms));
    }

    /// `schema`'s column names as atoms, made from JS strings as [`host`]'s are (a
    /// non-ASCII name is matched by its text, not its UTF-8 bytes read as Latin-1).
    unsafe fn column_atoms(&self, schema: &TableSchema) -> Option<Vec<JSAtom>> {
        let c = self.ctx.as_ptr();
        let mut atoms = Vec::with_capacity(schema.columns.len());
        for col in &schema.columns {
            let text =
                qjs::JS_NewStringLen(c, col.name.as_ptr() as *const c_char, col.name.len() as _);
            let atom = if qjs::JS_IsException(text) {
                qjs::JS_ATOM_NULL
            } else {
                let atom = qjs::JS_ValueToAtom(c, text);
                qjs::JS_FreeValue(c, text);
                atom
            };
            if atom == qjs::JS_ATOM_NULL {
                drop_exception(c);
                atoms.into_iter().for_each(|a| qjs::JS_FreeAtom(c, a));
                return None;
            }
            atoms.push(atom);
        }
        Some(atoms)
    }
}

/// Whether `v` is a JS string (flat or rope).
///
/// # Safety
/// `v` is a live value.
unsafe fn is_string(v: JSValue) -> bool {
    let tag = qjs::JS_VALUE_GET_TAG(v);
    tag == qjs::JS_TAG_STRING || tag == qjs::JS_TAG_STRING_ROPE
}

impl RawTable {
    /// Whether the string `table` is this table's own name string, by address (held by
    /// the entry, so its address is not reused while cached).
    ///
    /// # Safety
    /// `table` is a live string of this context.
    unsafe fn is(&self, table: JSValue) -> bool {
        qjs::JS_VALUE_GET_PTR(self.text) == qjs::JS_VALUE_GET_PTR(table)
    }

    unsafe fn free(self, c: *mut JSContext) {
        qjs::JS_FreeAtom(c, self.atom);
        qjs::JS_FreeValue(c, self.text);
        self.columns.free(c);
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let c = self.ctx.as_ptr();
        // SAFETY: the context outlives `self` (see `install`); every atom and value here
        // is a reference this struct owns.
        unsafe {
            if qjs::JS_GetContextOpaque(c) == self as *mut Raw as *mut c_void {
                qjs::JS_SetContextOpaque(c, std::ptr::null_mut());
            }
            self.tables.get_mut().drain(..).for_each(|t| t.free(c));
            self.kept.get_mut().drain(..).for_each(|k| k.free(c));
            self.key_atoms
                .get_mut()
                .drain(..)
                .for_each(|(_, a)| qjs::JS_FreeAtom(c, a));
            qjs::JS_FreeValue(c, self.slow_get.replace(qjs::JS_UNDEFINED));
            qjs::JS_FreeValue(c, self.slow_patch.replace(qjs::JS_UNDEFINED));
        }
    }
}

/// An owned raw value as an rquickjs value (its exception raised as an error).
unsafe fn owned<'js>(ctx: &Ctx<'js>, v: JSValue) -> rquickjs::Result<rquickjs::Value<'js>> {
    if qjs::JS_IsException(v) {
        return Err(rquickjs::Error::Exception);
    }
    Ok(rquickjs::Value::from_raw(ctx.clone(), v))
}

/// Clears the exception a failed call left pending (the call is then handed to the slow
/// path, which meets the failure itself and reports it its own way).
unsafe fn drop_exception(c: *mut JSContext) {
    qjs::JS_FreeValue(c, qjs::JS_GetException(c));
}

/// The text of `atom`, if it is valid UTF-8.
unsafe fn atom_text(c: *mut JSContext, atom: JSAtom) -> Option<String> {
    let mut len = 0usize;
    let p = qjs::JS_AtomToCStringLen(c, &mut len as *mut usize as *mut _, atom);
    c_text(c, p, len)
}

/// The text of a JS string value, if it is valid UTF-8 (the slow path reads any other as
/// it always did).
unsafe fn string_text(c: *mut JSContext, v: JSValue) -> Option<String> {
    let mut len = 0usize;
    let p = qjs::JS_ToCStringLen(c, &mut len, v);
    c_text(c, p, len)
}

/// The `len` bytes at `p` (a C string QuickJS made, freed here) as text, if they are
/// valid UTF-8; `None` also when QuickJS could not make it (`p` null).
unsafe fn c_text(c: *mut JSContext, p: *const c_char, len: usize) -> Option<String> {
    if p.is_null() {
        drop_exception(c);
        return None;
    }
    let text = std::str::from_utf8(std::slice::from_raw_parts(p as *const u8, len))
        .ok()
        .map(str::to_owned);
    qjs::JS_FreeCString(c, p);
    text
}

/// The key a JS `id` names in a table whose primary key is `pk`, when that is immediate:
/// an integer for an INTEGER key, a string for a TEXT key. `None` for anything else
/// (the slow path converts it, or refuses it, as it always did).
unsafe fn fast_key(c: *mut JSContext, id: JSValue, pk: ColumnType) -> Option<Key> {
    let tag = qjs::JS_VALUE_GET_TAG(id);
    match pk {
        ColumnType::Integer if tag == qjs::JS_TAG_INT => {
            Some(Key::Int(qjs::JS_VALUE_GET_INT(id) as i64))
        }
        ColumnType::Text if tag == qjs::JS_TAG_STRING || tag == qjs::JS_TAG_STRING_ROPE => {
            string_text(c, id).map(|s| Key::Text(s.as_str().into()))
        }
        _ => None,
    }
}

/// The context's [`Raw`], if it still has one.
unsafe fn raw_of<'a>(c: *mut JSContext) -> Option<&'a Raw> {
    (qjs::JS_GetContextOpaque(c) as *const Raw).as_ref()
}

/// A JS exception for a panic caught at the C boundary (unwinding through QuickJS's
/// frames would abort the process).
unsafe fn panicked(c: *mut JSContext) -> JSValue {
    let ctx = Ctx::from_raw(NonNull::new_unchecked(c));
    let _ = rquickjs::Exception::throw_internal(&ctx, "internal error in a tx call");
    qjs::JS_EXCEPTION
}

/// A fast path: the call's arguments to its result, or `None` to hand the call on.
type Fast = unsafe fn(&Raw, c_int, *mut JSValue) -> Option<JSValue>;

/// Serves a C function's call: `fast` first; on `None` (or with the fast paths off) the
/// slow function `slow` picks is called with the same `this` and arguments, untouched.
unsafe fn serve(
    c: *mut JSContext,
    this: JSValue,
    argc: c_int,
    argv: *mut JSValue,
    slow: fn(&Raw) -> &Cell<JSValue>,
    fast: Fast,
) -> JSValue {
    let Some(raw) = raw_of(c) else {
        let ctx = Ctx::from_raw(NonNull::new_unchecked(c));
        let _ = rquickjs::Exception::throw_internal(
            &ctx,
            "tx is not usable after its module was replaced",
        );
        return qjs::JS_EXCEPTION;
    };
    if raw.enabled.get() {
        match catch_unwind(AssertUnwindSafe(|| fast(raw, argc, argv))) {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(_) => return panicked(c),
        }
    }
    qjs::JS_Call(c, slow(raw).get(), this, argc, argv)
}

unsafe extern "C" fn raw_get(
    c: *mut JSContext,
    this: JSValue,
    argc: c_int,
    argv: *mut JSValue,
) -> JSValue {
    serve(c, this, argc, argv, |raw| &raw.slow_get, fast_get)
}

unsafe extern "C" fn raw_patch(
    c: *mut JSContext,
    this: JSValue,
    argc: c_int,
    argv: *mut JSValue,
) -> JSValue {
    serve(c, this, argc, argv, |raw| &raw.slow_patch, fast_patch)
}

/// The JS value of an engine value (INTEGER and TIMESTAMP as numbers; BLOB as base64 text,
/// JSON as the parsed value — the same shapes the HTTP API uses): an owned value, or the
/// exception marker.
unsafe fn js_of(c: *mut JSContext, v: &DbValue) -> JSValue {
    match v {
        DbValue::Null => qjs::JS_NULL,
        DbValue::Integer(i) | DbValue::Timestamp(i) => match i32::try_from(*i) {
            Ok(small) => qjs::JS_MKVAL(qjs::JS_TAG_INT, small),
            Err(_) => qjs::JS_NewFloat64(*i as f64),
        },
        DbValue::Real(r) => qjs::JS_NewFloat64(*r),
        DbValue::Boolean(b) => qjs::JS_MKVAL(qjs::JS_TAG_BOOL, *b as i32),
        DbValue::Text(s) => qjs::JS_NewStringLen(c, s.as_ptr() as *const c_char, s.len() as _),
        other => build(c, &other.to_json()),
    }
}

/// An engine value as a JS value (see [`js_of`]); the general `tx.get` fills its rows with it.
pub(crate) fn db_to_js<'js>(
    ctx: &Ctx<'js>,
    value: &DbValue,
) -> rquickjs::Result<rquickjs::Value<'js>> {
    // SAFETY: `ctx` stands for a live context; `js_of` returns an owned value or the
    // exception marker.
    unsafe { owned(ctx, js_of(ctx.as_raw().as_ptr(), value)) }
}

/// `tx.get(table, id)`.
unsafe fn fast_get(raw: &Raw, argc: c_int, argv: *mut JSValue) -> Option<JSValue> {
    if argc < 2 {
        return None;
    }
    let c = raw.ctx.as_ptr();
    let (table, id) = (*argv, *argv.add(1));
    // Held while the row object is filled: a setter it runs that calls `tx` again finds
    // both in use and goes to the slow path, which refuses it as re-entered.
    let mut slot = raw.slot.try_borrow_mut().ok()?;
    let access = slot.as_mut()?;
    let tx = access.tx();
    let db = tx.db();
    let mut tables = raw.tables.try_borrow_mut().ok()?;
    let (entry, t) = raw.table(&mut tables, table, db)?;
    let key = fast_key(c, id, t.schema.pk_column().ty)?;
    let Some(row) = t.rows.get(&key) else {
        return Some(qjs::JS_NULL);
    };
    let object = qjs::JS_NewObject(c);
    if qjs::JS_IsException(object) {
        return Some(object);
    }
    for (&atom, v) in entry.columns.atoms.iter().zip(row.values.iter()) {
        let value = js_of(c, v);
        if qjs::JS_IsException(value) || qjs::JS_SetProperty(c, object, atom, value) < 0 {
            qjs::JS_FreeValue(c, object);
            return Some(qjs::JS_EXCEPTION);
        }
    }
    Some(object)
}

/// The own enumerable string-keyed property names of an object, as `JS_GetOwnPropertyNames`
/// gives them (the slow path's `Object::props` asks for the same); freed on drop.
struct PropNames {
    c: *mut JSContext,
    tab: *mut qjs::JSPropertyEnum,
    len: u32,
}

impl PropNames {
    /// The names of `set`, when it is a plain object (`class` is that of `{}`: no proxy,
    /// array, function or other exotic object, so reading it runs no JavaScript).
    unsafe fn of_plain(c: *mut JSContext, set: JSValue, class: u32) -> Option<PropNames> {
        if qjs::JS_VALUE_GET_TAG(set) != qjs::JS_TAG_OBJECT || qjs::JS_GetClassID(set) != class {
            return None;
        }
        let mut names = PropNames {
            c,
            tab: std::ptr::null_mut(),
            len: 0,
        };
        let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as c_int;
        if qjs::JS_GetOwnPropertyNames(c, &mut names.tab, &mut names.len, set, flags) < 0 {
            drop_exception(c);
            return None;
        }
        Some(names)
    }

    fn atoms(&self) -> impl Iterator<Item = JSAtom> + '_ {
        (0..self.len as usize).map(|i| {
            // SAFETY: `tab` holds `len` entries until `self` is dropped.
            unsafe { (*self.tab.add(i)).atom }
        })
    }
}

impl Drop for PropNames {
    fn drop(&mut self) {
        if !self.tab.is_null() {
            // SAFETY: the list and its atoms were given to `self` by QuickJS, once.
            unsafe { qjs::JS_FreePropertyEnum(self.c, self.tab, self.len) };
        }
    }
}

/// `names`' properties of `set` as [`Prop`]s (an `undefined` one skipped, as the slow path
/// skips it), when every one is a data property holding a primitive the fast path reads
/// as the slow one does: read without running any JavaScript. `None` otherwise, having
/// run none.
unsafe fn plain_props(
    c: *mut JSContext,
    set: JSValue,
    names: &PropNames,
    out: &mut Vec<(JSAtom, Prop)>,
) -> Option<()> {
    out.clear();
    for atom in names.atoms() {
        let mut desc = qjs::JSPropertyDescriptor {
            flags: 0,
            value: qjs::JS_UNDEFINED,
            getter: qjs::JS_UNDEFINED,
            setter: qjs::JS_UNDEFINED,
        };
        match qjs::JS_GetOwnProperty(c, &mut desc, set, atom) {
            1 => {}
            r => {
                if r < 0 {
                    drop_exception(c);
                }
                return None;
            }
        }
        let data = desc.flags & qjs::JS_PROP_GETSET as c_int == 0;
        let prop = if data { prop_of(c, desc.value) } else { None };
        qjs::JS_FreeValue(c, desc.value);
        qjs::JS_FreeValue(c, desc.getter);
        qjs::JS_FreeValue(c, desc.setter);
        // `Some(None)`: `undefined`, skipped as the general path skips it.
        if let Some(p) = prop? {
            out.push((atom, p));
        }
    }
    Some(())
}

/// A primitive as the slow path's `Prop::read` reads it: `Some(None)` for `undefined`
/// (skipped), `None` for what only the slow path converts (objects, symbols, big
/// integers, non-finite numbers, text that is not UTF-8).
unsafe fn prop_of(c: *mut JSContext, v: JSValue) -> Option<Option<Prop>> {
    let tag = qjs::JS_VALUE_GET_TAG(v);
    Some(Some(match tag {
        qjs::JS_TAG_UNDEFINED => return Some(None),
        qjs::JS_TAG_NULL => Prop::Null,
        qjs::JS_TAG_BOOL => Prop::Bool(qjs::JS_VALUE_GET_BOOL(v)),
        qjs::JS_TAG_INT => Prop::Int(qjs::JS_VALUE_GET_INT(v) as i64),
        qjs::JS_TAG_FLOAT64 => Prop::from_float(qjs::JS_VALUE_GET_FLOAT64(v))?,
        qjs::JS_TAG_STRING | qjs::JS_TAG_STRING_ROPE => Prop::Text(string_text(c, v)?),
        _ => return None,
    }))
}

/// `tx.patch(table, id, set)`.
unsafe fn fast_patch(raw: &Raw, argc: c_int, argv: *mut JSValue) -> Option<JSValue> {
    if argc < 3 {
        return None;
    }
    let c = raw.ctx.as_ptr();
    let (table, id, set) = (*argv, *argv.add(1), *argv.add(2));
    let tag = qjs::JS_VALUE_GET_TAG(id);
    if tag != qjs::JS_TAG_INT && tag != qjs::JS_TAG_STRING && tag != qjs::JS_TAG_STRING_ROPE {
        return None;
    }
    // The atoms in `props` are those of `names`, alive until it drops.
    let names = PropNames::of_plain(c, set, raw.plain_class.get())?;
    if names.len as usize > PATCH_PROPS_MAX {
        return None;
    }
    let mut props = raw.props.try_borrow_mut().ok()?;
    plain_props(c, set, &names, &mut props)?;
    let served = patch_props(raw, c, table, id, &mut props);
    props.clear();
    let served = served?;
    // The next set made by the same object literal finds its shapes ready.
    if names.len as usize <= KEPT_PROPS_MAX {
        let mut atoms = [qjs::JS_ATOM_NULL; KEPT_PROPS_MAX];
        atoms
            .iter_mut()
            .zip(names.atoms())
            .for_each(|(slot, a)| *slot = a);
        raw.keep(&atoms[..names.len as usize]);
    }
    Some(served)
}

unsafe fn patch_props(
    raw: &Raw,
    c: *mut JSContext,
    table: JSValue,
    id: JSValue,
    props: &mut [(JSAtom, Prop)],
) -> Option<JSValue> {
    let mut slot = raw.slot.try_borrow_mut().ok()?;
    let access = slot.as_mut()?;
    let mut tx = access.tx();
    let mut tables = raw.tables.try_borrow_mut().ok()?;
    let entry = raw.schema_of(&mut tables, table, tx.db())?;
    let schema = entry.schema.clone();
    let key = fast_key(c, id, schema.pk_column().ty)?;
    let mut typed = raw.typed.try_borrow_mut().ok()?;
    host::typed_set(props, &schema, &entry.columns.atoms, &mut typed)?;
    drop(tables);
    Some(match tx.patch_decoded(&schema, key, &mut typed, None) {
        Ok(w) => qjs::JS_NewFloat64(w.version as f64),
        Err(e) => {
            drop(typed);
            drop(slot);
            let ctx = Ctx::from_raw(NonNull::new_unchecked(c));
            let _ = host::tx_error(&ctx, e);
            qjs::JS_EXCEPTION
        }
    })
}

/// A call's arguments as [`build`] makes them (or, for MessagePack, as it makes the
/// `serde_json::Value` those bytes decode to). With `keep_shape`, a top-level object's shape
/// is kept (see [`KeptShape`]): every call builds one, most with the keys of the one before;
/// `allow`'s copy does not keep it.
pub(crate) fn args_to_js<'js>(
    ctx: &Ctx<'js>,
    args: ArgsRef,
    keep_shape: bool,
) -> rquickjs::Result<rquickjs::Value<'js>> {
    let c = ctx.as_raw().as_ptr();
    // SAFETY: `ctx` stands for a live context; the builders return an owned value or the
    // exception marker.
    unsafe {
        let keep = if keep_shape { raw_of(c) } else { None };
        let value = match args {
            ArgsRef::Json(serde_json::Value::Object(map)) => build_json_object(c, map, keep),
            ArgsRef::Json(other) => build(c, other),
            ArgsRef::Msgpack(m) => build_msgpack(c, &mut Reader::new(m.bytes()), keep),
        };
        owned(ctx, value)
    }
}

/// Throws for MessagePack that `Msgpack::read` would not have passed (not reached: every
/// `Msgpack` was checked).
unsafe fn malformed(c: *mut JSContext) -> JSValue {
    qjs::JS_ThrowTypeError(c, c"arguments: malformed MessagePack".as_ptr())
}

/// The next value of checked MessagePack as [`build`] makes the `serde_json::Value` it
/// decodes to; a top-level object's shape kept by `keep` when given.
///
/// # Safety
/// `c` is a live context.
unsafe fn build_msgpack(c: *mut JSContext, r: &mut Reader, keep: Option<&Raw>) -> JSValue {
    let Some(token) = r.token() else {
        return malformed(c);
    };
    match token {
        Token::Nil => qjs::JS_NULL,
        Token::Bool(b) => qjs::JS_MKVAL(qjs::JS_TAG_BOOL, b as i32),
        Token::Int(i) => match i32::try_from(i) {
            Ok(i) => qjs::JS_MKVAL(qjs::JS_TAG_INT, i),
            Err(_) => qjs::JS_NewFloat64(i as f64),
        },
        Token::Uint(u) => qjs::JS_NewFloat64(u as f64),
        Token::Float(f) => qjs::JS_NewFloat64(f),
        Token::Str(s) => qjs::JS_NewStringLen(c, s.as_ptr() as *const c_char, s.len() as _),
        Token::Array(n) => {
            let array = qjs::JS_NewArray(c);
            if qjs::JS_IsException(array) {
                return array;
            }
            for i in 0..n {
                let v = build_msgpack(c, r, None);
                if qjs::JS_IsException(v) || qjs::JS_SetPropertyUint32(c, array, i, v) < 0 {
                    qjs::JS_FreeValue(c, array);
                    return qjs::JS_EXCEPTION;
                }
            }
            array
        }
        Token::Map(n) => build_object(c, n as usize, keep, || match r.token() {
            Some(Token::Str(k)) => Some((k, build_msgpack(c, r, None))),
            _ => None,
        }),
    }
}

/// `json` as a JS value — numbers that are 32-bit integers as integers, objects and arrays
/// filled with `JS_SetProperty*` (as rquickjs's `Object::set` and `Array::set` do) — owned,
/// or the exception marker.
///
/// # Safety
/// `c` is a live context.
unsafe fn build(c: *mut JSContext, json: &serde_json::Value) -> JSValue {
    use serde_json::Value as Json;
    match json {
        Json::Null => qjs::JS_NULL,
        Json::Bool(b) => qjs::JS_MKVAL(qjs::JS_TAG_BOOL, *b as i32),
        Json::Number(n) => match n.as_i64().and_then(|i| i32::try_from(i).ok()) {
            Some(i) => qjs::JS_MKVAL(qjs::JS_TAG_INT, i),
            None => qjs::JS_NewFloat64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => qjs::JS_NewStringLen(c, s.as_ptr() as *const c_char, s.len() as _),
        Json::Array(items) => {
            let array = qjs::JS_NewArray(c);
            if qjs::JS_IsException(array) {
                return array;
            }
            for (i, item) in items.iter().enumerate() {
                let v = build(c, item);
                if qjs::JS_IsException(v) || qjs::JS_SetPropertyUint32(c, array, i as u32, v) < 0 {
                    qjs::JS_FreeValue(c, array);
                    return qjs::JS_EXCEPTION;
                }
            }
            array
        }
        Json::Object(map) => build_json_object(c, map, None),
    }
}

/// `map` as a JS object (see [`build_object`]).
///
/// # Safety
/// `c` is a live context.
unsafe fn build_json_object(
    c: *mut JSContext,
    map: &serde_json::Map<String, serde_json::Value>,
    keep: Option<&Raw>,
) -> JSValue {
    let mut entries = map.iter();
    build_object(c, map.len(), keep, || {
        entries.next().map(|(k, v)| (k.as_bytes(), build(c, v)))
    })
}

/// The `len` entries `entry` gives (a name's UTF-8 and its built value; `None` if it runs
/// out) as a JS object, its shape kept by `keep` when given (the top-level arguments).
unsafe fn build_object<'k>(
    c: *mut JSContext,
    len: usize,
    keep: Option<&Raw>,
    mut entry: impl FnMut() -> Option<(&'k [u8], JSValue)>,
) -> JSValue {
    let object = qjs::JS_NewObject(c);
    if qjs::JS_IsException(object) {
        return object;
    }
    // The first keys' atoms, held until the shape is kept; every one is freed below.
    let mut atoms = [qjs::JS_ATOM_NULL; KEPT_PROPS_MAX];
    let mut held = 0;
    let mut failed = false;
    for _ in 0..len {
        let Some((k, v)) = entry() else {
            // Only MessagePack runs out of entries early.
            malformed(c);
            failed = true;
            break;
        };
        if qjs::JS_IsException(v) {
            failed = true;
            break;
        }
        let atom = key_atom(c, k);
        if atom == qjs::JS_ATOM_NULL {
            qjs::JS_FreeValue(c, v);
            failed = true;
            break;
        }
        failed = qjs::JS_SetProperty(c, object, atom, v) < 0;
        if held < KEPT_PROPS_MAX {
            atoms[held] = atom;
            held += 1;
        } else {
            qjs::JS_FreeAtom(c, atom);
        }
        if failed {
            break;
        }
    }
    if let Some(raw) = keep.filter(|_| !failed && len <= KEPT_PROPS_MAX) {
        raw.keep(&atoms[..held]);
    }
    atoms[..held].iter().for_each(|&a| qjs::JS_FreeAtom(c, a));
    if failed {
        qjs::JS_FreeValue(c, object);
        return qjs::JS_EXCEPTION;
    }
    object
}

/// The atom of a property name: straight from its bytes when it is ASCII, else through a
/// JS string (`JS_NewAtomLen` may match a non-ASCII name to the atom of its UTF-8 bytes
/// read as Latin-1). `JS_ATOM_NULL` with an exception pending on failure.
///
/// A short ASCII name's atom is kept in the context's [`Raw`] once made, so the next object
/// with that key takes a reference to it (the same atom `JS_NewAtomLen` would find in the
/// runtime's atom table, without hashing the name): each call's argument object has the
/// same few keys.
unsafe fn key_atom(c: *mut JSContext, k: &[u8]) -> JSAtom {
    if k.is_ascii() {
        let cache = raw_of(c)
            .filter(|_| k.len() <= KEY_ATOM_BYTES_MAX)
            .and_then(|raw| raw.key_atoms.try_borrow_mut().ok());
        let Some(mut cache) = cache else {
            return qjs::JS_NewAtomLen(c, k.as_ptr() as *const c_char, k.len() as _);
        };
        if let Some(&(_, atom)) = cache.iter().find(|(bytes, _)| **bytes == *k) {
            return qjs::JS_DupAtom(c, atom);
        }
        let atom = qjs::JS_NewAtomLen(c, k.as_ptr() as *const c_char, k.len() as _);
        if atom != qjs::JS_ATOM_NULL && cache.len() < KEY_ATOMS_MAX {
            cache.push((k.into(), qjs::JS_DupAtom(c, atom)));
        }
        return atom;
    }
    let text = qjs::JS_NewStringLen(c, k.as_ptr() as *const c_char, k.len() as _);
    if qjs::JS_IsException(text) {
        return qjs::JS_ATOM_NULL;
    }
    let atom = qjs::JS_ValueToAtom(c, text);
    qjs::JS_FreeValue(c, text);
    atom
}
