//! Typed decoding of a mutate body: JSON bytes straight into rows of [`Value`]s by each
//! table's schema, on the request's own task (no `serde_json::Map` per row, no conversion
//! on the writer thread).
//!
//! The decoder only ever *accepts*: anything it is not sure of — a wrong type, an unknown
//! column, a missing key, a duplicate field, an unknown table, a bad shape, too many ops,
//! malformed JSON — makes it give up ([`decode_mutate`] returns `None`), and the caller runs
//! the general path (`api::parse_ops`, then `TxRef::insert`/`upsert`/`patch`/`delete` on the
//! writer), which decides the refusal and its error code and `op` index exactly as before.
//! What it accepts it turns into the very rows the general path would build (the
//! differential test `typed_mutate_decoder_matches_the_json_path` holds it to that).
//!
//! Each op carries the `Arc<TableSchema>` it was decoded against. The writer applies a
//! decoded mutate only if every op's schema is still its table's schema (`Arc::ptr_eq`);
//! if a schema changed in between (DDL), it re-parses the kept body the general way.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

mod json;
mod msgpack;
use sluice_engine::{ColumnType, Db, Key, TableSchema, Value};
use sluice_log::Durability;

/// One op of a decoded mutate.
#[derive(Clone, Debug)]
pub enum TypedOp {
    /// Insert (`replace` false) or upsert: the whole row, defaults filled.
    Put {
        schema: Arc<TableSchema>,
        key: Key,
        values: Arc<[Value]>,
        if_version: Option<u64>,
        replace: bool,
    },
    Patch {
        schema: Arc<TableSchema>,
        key: Key,
        set: Vec<(usize, Value)>,
        if_version: Option<u64>,
    },
    Delete {
        schema: Arc<TableSchema>,
        key: Key,
        if_version: Option<u64>,
    },
}

impl TypedOp {
    pub fn schema(&self) -> &Arc<TableSchema> {
        match self {
            TypedOp::Put { schema, .. }
            | TypedOp::Patch { schema, .. }
            | TypedOp::Delete { schema, .. } => schema,
        }
    }
}

/// A mutate body decoded by [`decode_mutate`] (or a WebSocket request by
/// [`decode_ws_mutate`]).
#[derive(Clone, Debug)]
pub struct TypedMutate {
    pub ops: Vec<TypedOp>,
    /// The body's `"durability"`, if it named one.
    pub durability: Option<Durability>,
    /// The body as received: re-parsed the general way if a schema changed before the
    /// writer got to it. `None` for ops built in-process ([`TypedMutate::from_ops`]).
    pub body: Option<KeptBody>,
}

/// The text a mutate was decoded from, kept to be parsed again the general way.
#[derive(Clone, Debug)]
pub enum KeptBody {
    /// JSON text: an HTTP body or a WebSocket text frame.
    Json(axum::body::Bytes),
    /// A WebSocket MessagePack frame.
    Msgpack(axum::body::Bytes),
}

impl KeptBody {
    /// The ops the general path parses from this body (no limit on their count: the
    /// decoder already held them to it).
    pub fn parse_ops(&self) -> Result<Vec<crate::core::Op>, crate::api::ApiError> {
        match self {
            KeptBody::Json(bytes) => crate::api::parse_ops_json(bytes, usize::MAX),
            KeptBody::Msgpack(bytes) => match msgpack_value(bytes) {
                Ok(Json::Object(mut map)) => crate::api::parse_ops(&mut map, usize::MAX),
                _ => Err(crate::api::ApiError::bad_request(
                    "a request must be a MessagePack map",
                )),
            },
        }
    }
}

/// Nesting a MessagePack frame may have, as `serde_json` allows JSON: `rmp_serde`'s own
/// limit (1024) overflows a runtime worker's 2 MiB stack in a debug build (found by fuzzing).
pub(crate) const MSGPACK_DEPTH_MAX: usize = 128;

/// A MessagePack frame as a JSON value (the WebSocket protocol's general path).
pub(crate) fn msgpack_value(bytes: &[u8]) -> Result<Json, rmp_serde::decode::Error> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MSGPACK_DEPTH_MAX);
    Deserialize::deserialize(&mut de)
}

impl TypedMutate {
    /// Ops built in-process against the tables' current schemas (the fastest way in for
    /// an embedding program or a bench). Each `Put` must carry the whole row — every
    /// column converted to its type, defaults filled, the key its primary-key column's
    /// value, NOT NULL columns set — as [`decode_mutate`] builds it. If a schema changed
    /// before the writer applies them, the mutate is refused (`schema`) and nothing is
    /// written: build the ops again.
    pub fn from_ops(ops: Vec<TypedOp>, durability: Option<Durability>) -> TypedMutate {
        TypedMutate {
            ops,
            durability,
            body: None,
        }
    }
}

/// Table schemas by name.
pub type SchemaMap = Arc<HashMap<String, Arc<TableSchema>>>;

/// Table schemas by name, as last seen: request tasks decode against it without waiting for
/// the database lock (the writer holds it for whole rounds, as long as a server function's
/// time limit). It may be stale — the writer checks every op's schema — and is refreshed
/// when a table is missing or the writer finds a schema changed, but only if the lock is
/// free at that moment ([`parking_lot::RwLock::try_read`]): a request task that would wait
/// for it would hold a runtime worker thread for the whole round, so it takes the general
/// path (decoded on the writer) instead.
#[derive(Default)]
pub struct SchemaCache {
    /// The schemas and the `Db::schema_seq` they were read at.
    current: Mutex<(u64, SchemaMap)>,
}

impl SchemaCache {
    /// The schemas as last seen.
    pub fn get(&self) -> SchemaMap {
        self.current.lock().1.clone()
    }

    /// Whether the cache was read at `db`'s schema state.
    pub fn is_current(&self, db: &Db) -> bool {
        self.current.lock().0 == db.schema_seq
    }

    /// Replaces the cache with `db`'s schemas.
    pub fn refresh(&self, db: &Db) -> SchemaMap {
        let map: HashMap<String, Arc<TableSchema>> = db
            .tables
            .iter()
            .map(|(name, t)| (name.clone(), t.schema.clone()))
            .collect();
        let map = Arc::new(map);
        *self.current.lock() = (db.schema_seq, map.clone());
        map
    }
}

/// Where [`decode_mutate`] finds schemas: the cache, refreshed from the database on a miss.
pub trait Schemas {
    fn table(&mut self, name: &str) -> Option<Arc<TableSchema>>;
}

/// Schemas straight from a [`Db`] (tests, in-process tools).
impl Schemas for &Db {
    fn table(&mut self, name: &str) -> Option<Arc<TableSchema>> {
        self.tables.get(name).map(|t| t.schema.clone())
    }
}

/// The cache, refreshed once from the database when a table is not in it and the database
/// lock is free.
pub(crate) struct CachedSchemas<'c> {
    pub cache: &'c SchemaCache,
    pub db: &'c parking_lot::RwLock<Db>,
    pub map: SchemaMap,
    pub refreshed: bool,
}

impl Schemas for CachedSchemas<'_> {
    fn table(&mut self, name: &str) -> Option<Arc<TableSchema>> {
        if let Some(s) = self.map.get(name) {
            return Some(s.clone());
        }
        if self.refreshed {
            return None;
        }
        self.refreshed = true;
        // Never waits: see [`SchemaCache`].
        let db = self.db.try_read()?;
        self.map = self.cache.refresh(&db);
        self.map.get(name).cloned()
    }
}

/// The decoder's signal to give up (never shown to anyone: the general path decides).
const GIVE_UP: &str = "typed decoder: use the general path";

/// Decodes a mutate body (`{"ops": [...], "durability"?: ...}`) into typed ops, or `None`
/// when the general path must decide (anything unusual, every refusal among it).
///
/// Two readers take turns: [`read_mutate_json`], written by hand for the bodies clients
/// send (about two thirds of the instructions), and, for whatever it is not sure of,
/// [`read_mutate_serde`] over `serde_json`, which gives up in turn on what only the
/// general path can decide.
pub fn decode_mutate(
    body: axum::body::Bytes,
    schemas: &mut dyn Schemas,
    ops_max: usize,
) -> Option<TypedMutate> {
    let (ops, durability, _) = read_mutate_json(&body, schemas, ops_max, false)
        .or_else(|| read_mutate_serde(&body, schemas, ops_max, false))?;
    Some(TypedMutate {
        ops,
        durability,
        body: Some(KeptBody::Json(body)),
    })
}

/// The arguments and durability of a `POST /v1/call` body read by the hand reader, the
/// arguments as checked MessagePack (what a WebSocket call hands the functions); `None`
/// for a body the general path must read (it also makes every refusal).
pub fn read_call_json(body: &[u8]) -> Option<(sluice_functions::Args, Option<Durability>)> {
    let (args, durability) = json::read_call(body)?;
    let args = sluice_functions::Msgpack::checked(args)?;
    Some((sluice_functions::Args::Msgpack(args), durability))
}

/// The hand-written reader of a JSON mutate body ([`decode_mutate`] tries it first; `ws`:
/// a WebSocket `mutate` request, with its `"type"` and `"id"`): the ops, durability and id,
/// or `None` for anything it is not sure of — which [`read_mutate_serde`] then reads. What
/// it accepts, it reads exactly as that reader does (the differential test
/// `hand_json_reader_matches_serde` in `tests/hand_readers_match_serde.rs` holds it to that).
pub fn read_mutate_json(
    body: &[u8],
    schemas: &mut dyn Schemas,
    ops_max: usize,
    ws: bool,
) -> Option<Body> {
    json::read(body, schemas, ops_max, ws)
}

/// The hand-written reader of a MessagePack WebSocket `mutate` request (`decode/msgpack.rs`),
/// which [`decode_ws_mutate`] tries first: the ops, durability and id, or `None` when it is
/// not sure (then [`read_mutate_msgpack_serde`] reads the frame).
pub fn read_mutate_msgpack(
    frame: &[u8],
    schemas: &mut dyn Schemas,
    ops_max: usize,
) -> Option<Body> {
    msgpack::read(frame, schemas, ops_max)
}

/// The `rmp_serde` reader of a MessagePack WebSocket `mutate` request: the ops, durability
/// and id, or `None` when the general path must decide. As `msgpack_value` reads a frame,
/// bytes after the request are not looked at.
pub fn read_mutate_msgpack_serde(
    frame: &[u8],
    schemas: &mut dyn Schemas,
    ops_max: usize,
) -> Option<Body> {
    let mut de = rmp_serde::Deserializer::from_read_ref(frame);
    de.set_max_depth(MSGPACK_DEPTH_MAX);
    let seed = BodySeed {
        schemas,
        ops_max,
        ws: true,
    };
    seed.deserialize(&mut de).ok()
}

/// The `serde_json` reader of a JSON mutate body (`ws` as for [`read_mutate_json`]): the
/// ops, durability and id, or `None` when the general path must decide.
pub fn read_mutate_serde(
    body: &[u8],
    schemas: &mut dyn Schemas,
    ops_max: usize,
    ws: bool,
) -> Option<Body> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = BodySeed {
        schemas,
        ops_max,
        ws,
    };
    let decoded = seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(decoded)
}

/// Decodes a WebSocket `mutate` request (`{"type": "mutate", "id"?, "ops": [...],
/// "durability"?}`, a JSON text frame or a MessagePack frame) into its `id` and typed ops,
/// or `None` when the general path must decide (anything unusual, every refusal among it,
/// and any other request type). What it accepts is what the general path would make of it.
pub fn decode_ws_mutate(
    frame: KeptBody,
    schemas: &mut dyn Schemas,
    ops_max: usize,
) -> Option<(Json, TypedMutate)> {
    let (ops, durability, id) = match &frame {
        KeptBody::Json(bytes) => read_mutate_json(bytes, schemas, ops_max, true)
            .or_else(|| read_mutate_serde(bytes, schemas, ops_max, true))?,
        KeptBody::Msgpack(bytes) => read_mutate_msgpack(bytes, schemas, ops_max)
            .or_else(|| read_mutate_msgpack_serde(bytes, schemas, ops_max))?,
    };
    Some((
        id.unwrap_or(Json::Null),
        TypedMutate {
            ops,
            durability,
            body: Some(frame),
        },
    ))
}

/// The top level of a mutate: an HTTP body, or (`ws`) a WebSocket request, which also has
/// `"type": "mutate"` (required) and an `"id"`.
struct BodySeed<'s> {
    schemas: &'s mut dyn Schemas,
    ops_max: usize,
    ws: bool,
}

/// Ops, durability and (WebSocket) id.
pub type Body = (Vec<TypedOp>, Option<Durability>, Option<Json>);

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = Body;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = Body;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mutate body")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut ops = None;
        let mut durability = None;
        let mut id = None;
        let mut typed = false;
        while let Some(key) = map.next_key::<KeyStr<'de>>()? {
            match key.as_str() {
                "type" if self.ws && !typed => {
                    let kind: KeyStr<'de> = map.next_value()?;
                    if kind.as_str() != "mutate" {
                        return Err(give_up());
                    }
                    typed = true;
                }
                "id" if self.ws && id.is_none() => id = Some(map.next_value::<Json>()?),
                "ops" if ops.is_none() => {
                    ops = Some(map.next_value_seed(OpsSeed {
                        schemas: &mut *self.schemas,
                        ops_max: self.ops_max,
                    })?);
                }
                "durability" if durability.is_none() => {
                    let text: Option<KeyStr<'de>> = map.next_value()?;
                    durability = Some(match text {
                        None => None,
                        Some(t) => Some(t.as_str().parse().map_err(|_| give_up::<A::Error>())?),
                    });
                }
                _ => return Err(give_up()),
            }
        }
        match ops {
            Some(ops) if typed || !self.ws => Ok((ops, durability.flatten(), id)),
            _ => Err(give_up()),
        }
    }
}

fn give_up<E: de::Error>() -> E {
    E::custom(GIVE_UP)
}

/// A string that borrows from the input when it can.
pub(crate) enum KeyStr<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyStr<'_> {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            KeyStr::Borrowed(s) => s,
            KeyStr::Owned(s) => s,
        }
    }

    pub(crate) fn into_string(self) -> String {
        match self {
            KeyStr::Borrowed(s) => s.to_owned(),
            KeyStr::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for KeyStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(KeyStr::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(KeyStr::Owned(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(KeyStr::Owned(v))
            }
        }
        d.deserialize_str(V)
    }
}

struct OpsSeed<'s> {
    schemas: &'s mut dyn Schemas,
    ops_max: usize,
}

impl<'de> DeserializeSeed<'de> for OpsSeed<'_> {
    type Value = Vec<TypedOp>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OpsSeed<'_> {
    type Value = Vec<TypedOp>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of ops")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut ops = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.ops_max));
        // The table of the previous op, looked up again only when the name changes.
        let mut last: Option<Arc<TableSchema>> = None;
        // Rows are decoded here first, then moved into their own allocation.
        let mut buf = Vec::new();
        while let Some(op) = seq.next_element_seed(OpSeed {
            schemas: &mut *self.schemas,
            last: &mut last,
            buf: &mut buf,
        })? {
            if ops.len() == self.ops_max {
                return Err(give_up());
            }
            ops.push(op);
        }
        if ops.is_empty() {
            return Err(give_up());
        }
        Ok(ops)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Insert,
    Upsert,
    Patch,
    Delete,
}

/// An op's `row` or `set`: decoded by the table's schema if the op named its table first,
/// else kept as JSON and converted once the table is known.
enum Pending {
    /// A whole `row`: every column, defaults filled, NOT NULL checked.
    Row(Arc<[Value]>),
    /// The columns a `set` names.
    Set(Vec<(usize, Value)>),
    Json(Map<String, Json>),
}

struct OpSeed<'s, 'l> {
    schemas: &'s mut dyn Schemas,
    last: &'l mut Option<Arc<TableSchema>>,
    /// Scratch space for a row being decoded (reused from op to op).
    buf: &'l mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for OpSeed<'_, '_> {
    type Value = TypedOp;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OpSeed<'_, '_> {
    type Value = TypedOp;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an op")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind = None;
        let mut schema: Option<Arc<TableSchema>> = None;
        let mut if_version: Option<Option<u64>> = None;
        // `row` or `set` (both are refused together: a duplicate as far as we care).
        let mut fields: Option<(bool, Pending)> = None;
        let mut id: Option<Result<Value, Json>> = None;
        while let Some(key) = map.next_key::<KeyStr<'de>>()? {
            match key.as_str() {
                "op" if kind.is_none() => {
                    let k: KeyStr<'de> = map.next_value()?;
                    kind = Some(match k.as_str() {
                        "insert" => Kind::Insert,
                        "upsert" => Kind::Upsert,
                        "patch" => Kind::Patch,
                        "delete" => Kind::Delete,
                        _ => return Err(give_up()),
                    });
                }
                "table" if schema.is_none() => {
                    let name: KeyStr<'de> = map.next_value()?;
                    schema = Some(
                        table(
                            &mut *self.schemas,
                            &mut *self.last,
                            name.as_str().as_bytes(),
                        )
                        .ok_or_else(give_up)?,
                    );
                }
                "if_version" if if_version.is_none() => {
                    if_version = Some(map.next_value_seed(IfVersionSeed)?);
                }
                f @ ("row" | "set") if fields.is_none() => {
                    let is_set = f == "set";
                    let pending = match &schema {
                        Some(s) if is_set => {
                            Pending::Set(map.next_value_seed(RowSeed { schema: s })?)
                        }
                        Some(s) => Pending::Row(map.next_value_seed(FullRowSeed {
                            schema: s,
                            buf: &mut *self.buf,
                        })?),
                        None => Pending::Json(map.next_value::<Map<String, Json>>()?),
                    };
                    fields = Some((is_set, pending));
                }
                "id" if id.is_none() => {
                    id = Some(match &schema {
                        Some(s) => Ok(map.next_value_seed(ColumnSeed(s.pk_column().ty))?),
                        None => Err(map.next_value::<Json>()?),
                    });
                }
                _ => return Err(give_up()),
            }
        }
        let (Some(kind), Some(schema)) = (kind, schema) else {
            return Err(give_up());
        };
        let id = match id {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(json)) => {
                Some(Value::from_json(schema.pk_column().ty, &json).map_err(|_| give_up())?)
            }
        };
        finish_op(kind, schema, if_version.flatten(), fields, id, self.buf).ok_or_else(give_up)
    }
}

/// The table named `name` (a name's bytes: a binary reader need not check them as UTF-8 to
/// match the previous op's): `last` (the previous op's) if it is that one, else looked up.
fn table(
    schemas: &mut dyn Schemas,
    last: &mut Option<Arc<TableSchema>>,
    name: &[u8],
) -> Option<Arc<TableSchema>> {
    match last {
        Some(s) if s.name.as_bytes() == name => Some(s.clone()),
        _ => {
            let s = schemas.table(std::str::from_utf8(name).ok()?)?;
            *last = Some(s.clone());
            Some(s)
        }
    }
}

/// Column `name`'s position (`name` as bytes, as for [`table`]): clients usually name the
/// columns in schema order, so the one after the last (`next`) is tried first.
fn column_index(schema: &TableSchema, next: usize, name: &[u8]) -> Option<usize> {
    match schema.columns.get(next) {
        Some(c) if same(c.name.as_bytes(), name) => Some(next),
        _ => schema.column(std::str::from_utf8(name).ok()?),
    }
}

/// `a == b`, compared in line: for names this short a call to `memcmp` costs more.
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// An op from its fields as read (`fields`: whether it was a `set`, and what it held), or
/// `None` if the fields do not make that kind of op.
fn finish_op(
    kind: Kind,
    schema: Arc<TableSchema>,
    if_version: Option<u64>,
    fields: Option<(bool, Pending)>,
    id: Option<Value>,
    buf: &mut Vec<Value>,
) -> Option<TypedOp> {
    let fields = match fields {
        None => None,
        Some((is_set, pending)) => {
            if is_set != (kind == Kind::Patch) {
                return None;
            }
            Some(pending)
        }
    };
    let op = match kind {
        Kind::Insert | Kind::Upsert => {
            let (Some(fields), None) = (fields, id) else {
                return None;
            };
            let values = match fields {
                Pending::Row(values) => values,
                Pending::Json(m) => {
                    let named = from_json_map(&schema, &m)?;
                    let mut seen = Seen::new(schema.columns.len());
                    buf.clear();
                    buf.resize(schema.columns.len(), Value::Null);
                    for (i, v) in named {
                        seen.insert(i);
                        buf[i] = v;
                    }
                    finish_row(&schema, buf, &mut seen)?
                }
                Pending::Set(_) => return None,
            };
            let key = Key::from_value(&values[schema.pk])?;
            TypedOp::Put {
                key,
                values,
                if_version,
                replace: kind == Kind::Upsert,
                schema,
            }
        }
        Kind::Patch => {
            let (Some(set), Some(id)) = (fields, id) else {
                return None;
            };
            let set = match set {
                Pending::Set(set) => set,
                Pending::Json(m) => from_json_map(&schema, &m)?,
                Pending::Row(_) => return None,
            };
            if set.iter().any(|(i, _)| *i == schema.pk) {
                return None;
            }
            let key = Key::from_value(&id)?;
            TypedOp::Patch {
                schema,
                key,
                set,
                if_version,
            }
        }
        Kind::Delete => {
            let (None, Some(id)) = (fields, id) else {
                return None;
            };
            let key = Key::from_value(&id)?;
            TypedOp::Delete {
                schema,
                key,
                if_version,
            }
        }
    };
    Some(op)
}

/// `"if_version"`: null or a non-negative integer.
struct IfVersionSeed;

impl<'de> DeserializeSeed<'de> for IfVersionSeed {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IfVersionSeed {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a version")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map(Some).map_err(|_| give_up())
    }
}

/// The columns of a `row` or `set` object, by position, converted by each column's type.
/// Unknown or repeated columns give up.
struct RowSeed<'a> {
    schema: &'a TableSchema,
}

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = Vec<(usize, Value)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = Vec<(usize, Value)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a row object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let columns = &self.schema.columns;
        let mut out = Vec::with_capacity(columns.len());
        let mut seen = Seen::new(columns.len());
        let mut next = 0;
        while let Some(name) = map.next_key::<KeyStr<'de>>()? {
            let i =
                column_index(self.schema, next, name.as_str().as_bytes()).ok_or_else(give_up)?;
            if !seen.insert(i) {
                return Err(give_up());
            }
            next = i + 1;
            out.push((i, map.next_value_seed(ColumnSeed(columns[i].ty))?));
        }
        Ok(out)
    }
}

/// Which columns a row named (a repeated one gives up). No allocation up to 64 columns.
struct Seen {
    low: u64,
    /// Columns from 64 on.
    high: Vec<u64>,
}

impl Seen {
    fn new(n: usize) -> Seen {
        Seen {
            low: 0,
            high: vec![0; n.saturating_sub(64).div_ceil(64)],
        }
    }
    fn word(&mut self, i: usize) -> (&mut u64, u64) {
        let bit = 1u64 << (i % 64);
        match i.checked_sub(64) {
            None => (&mut self.low, bit),
            Some(j) => (&mut self.high[j / 64], bit),
        }
    }
    /// Marks column `i`; false if it was already marked.
    fn insert(&mut self, i: usize) -> bool {
        let (w, bit) = self.word(i);
        let fresh = *w & bit == 0;
        *w |= bit;
        fresh
    }
    fn contains(&mut self, i: usize) -> bool {
        let (w, bit) = self.word(i);
        *w & bit != 0
    }
}

/// A whole `row` object: each named column converted by its type into `buf` (by position),
/// the others given their default (or NULL), then moved into the row's own allocation.
/// Unknown or repeated columns, and a NULL in a NOT NULL column, give up.
struct FullRowSeed<'a> {
    schema: &'a TableSchema,
    buf: &'a mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for FullRowSeed<'_> {
    type Value = Arc<[Value]>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FullRowSeed<'_> {
    type Value = Arc<[Value]>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a row object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let columns = &self.schema.columns;
        self.buf.clear();
        self.buf.resize(columns.len(), Value::Null);
        let mut seen = Seen::new(columns.len());
        let mut next = 0;
        while let Some(name) = map.next_key::<KeyStr<'de>>()? {
            let i =
                column_index(self.schema, next, name.as_str().as_bytes()).ok_or_else(give_up)?;
            if !seen.insert(i) {
                return Err(give_up());
            }
            next = i + 1;
            self.buf[i] = map.next_value_seed(ColumnSeed(columns[i].ty))?;
        }
        finish_row(self.schema, self.buf, &mut seen).ok_or_else(give_up)
    }
}

/// One column value, converted as `Value::from_json(ty, …)` would (null → NULL).
struct ColumnSeed(ColumnType);

impl<'de> DeserializeSeed<'de> for ColumnSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.0 == ColumnType::Json {
            let json = Json::deserialize(d)?;
            return Value::from_json(ColumnType::Json, &json).map_err(|_| give_up());
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ColumnSeed {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a {} value", self.0)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        match self.0 {
            ColumnType::Boolean => Ok(Value::Boolean(v)),
            _ => Err(give_up()),
        }
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        match self.0 {
            ColumnType::Integer => Ok(Value::Integer(v)),
            ColumnType::Timestamp => Ok(Value::Timestamp(v)),
            ColumnType::Real => Ok(Value::Real(v as f64)),
            _ => Err(give_up()),
        }
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        match self.0 {
            ColumnType::Integer | ColumnType::Timestamp => {
                let v = i64::try_from(v).map_err(|_| give_up())?;
                self.visit_i64(v)
            }
            ColumnType::Real => Ok(Value::Real(v as f64)),
            _ => Err(give_up()),
        }
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // As serde_json keeps a number: a non-finite one would be null (JSON has none).
        match self.0 {
            ColumnType::Real if v.is_finite() => Ok(Value::Real(v)),
            _ => Err(give_up()),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        text_value(self.0, v).ok_or_else(give_up)
    }
}

/// A JSON string as a value of a column of type `ty` (TEXT, or BLOB in base64).
fn text_value(ty: ColumnType, v: &str) -> Option<Value> {
    match ty {
        ColumnType::Text => Some(Value::Text(v.into())),
        ColumnType::Blob => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
            Some(Value::Blob(bytes.into()))
        }
        _ => None,
    }
}

/// A row or `set` given before its table: converted as the general path would, or `None`.
fn from_json_map(schema: &TableSchema, map: &Map<String, Json>) -> Option<Vec<(usize, Value)>> {
    map.iter()
        .map(|(name, json)| {
            let i = schema.column(name)?;
            let v = Value::from_json(schema.columns[i].ty, json).ok()?;
            Some((i, v))
        })
        .collect()
}

/// A whole row from `buf` (one value per column; the columns in `seen` were named): the
/// others get their default (or stay NULL); `None` if a NOT NULL column would be null.
/// Empties `buf` into the row's own allocation (one allocation, values moved).
fn finish_row(schema: &TableSchema, buf: &mut Vec<Value>, seen: &mut Seen) -> Option<Arc<[Value]>> {
    for (i, c) in schema.columns.iter().enumerate() {
        if !seen.contains(i) {
            if let Some(d) = &c.default {
                buf[i] = d.clone();
            }
        }
        if c.not_null && buf[i].is_null() {
            return None;
        }
    }
    Some(buf.drain(..).collect())
}
