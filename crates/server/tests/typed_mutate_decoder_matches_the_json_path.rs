//! Differential test of the two mutate decoders: random mutate bodies (valid and invalid)
//! go through the general path (`parse_ops` → JSON maps → `TxRef::insert/upsert/patch/
//! delete` on the writer) on one database and through the typed decoder
//! (`Core::decode_mutate` → `Core::mutate_decoded_as`, falling back to the general path
//! when it gives up, as `POST /v1/mutate` does) on another. Both must commit the same rows
//! with the same results, or refuse with the same code, `op` index and message; the tables
//! are compared after every body. DDL runs between bodies, and some bodies are decoded
//! before a DDL and applied after it (the writer must notice the stale schema).
//!
//! The WebSocket `mutate` request takes the same decoder (`Core::decode_ws_mutate`) from a
//! JSON text frame or a MessagePack frame: the same bodies, made into requests (`"type"`,
//! `"id"`, sometimes a wrong type), are held to the WebSocket protocol's general path in
//! the same way, MessagePack ones through a schema change too (the writer then parses the
//! kept MessagePack frame again).
//!
//! `SLUICE_DECODE_SEED=n` replays one seed; `SLUICE_DECODE_CASES=n` sets the number of
//! bodies (default 1500).

mod common;

use common::TempDir;
use serde_json::Value;
use sluice_engine::{Db, Key};
use sluice_fuzzkit::Rng;
use sluice_log::Durability;
use sluice_server::api::{parse_ops, parse_ops_json, ApiError};
use sluice_server::decode::KeptBody;
use sluice_server::{Caller, Config, Core};

const OPS_MAX: usize = 6;

const SCHEMA: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER, \
    r REAL, b BOOLEAN, ts TIMESTAMP, j JSON, bl BLOB, d INTEGER DEFAULT 7); \
    CREATE TABLE s (k TEXT PRIMARY KEY, v INTEGER NOT NULL DEFAULT 0, note TEXT)";

/// Schema changes run between bodies (each at most once, in order).
const DDL: &[&str] = &[
    "ALTER TABLE t ADD COLUMN extra TEXT",
    "CREATE TABLE u (id INTEGER PRIMARY KEY, x REAL)",
    "ALTER TABLE s ADD COLUMN flag BOOLEAN DEFAULT true",
    "DROP TABLE u",
];

fn open(dir: &TempDir) -> Core {
    let mut config = Config::new(dir.path());
    config.durability = Durability::Memory;
    config.ops_per_mutate_max = OPS_MAX;
    config.limits.row_bytes_max = 400;
    config.limits.commit_bytes_max = 1500;
    Core::open(config).expect("open")
}

async fn ddl(core: &Core, sql: &str) {
    let changes = sluice_sql::parse_ddl(sql)
        .expect("the DDL parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    core.ddl(changes, sql.into(), None)
        .await
        .expect("the DDL applies");
}

/// What a mutate came to, as the API reports it.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok(u64, Vec<(String, Key, u64)>),
    Err {
        code: &'static str,
        op: Option<Value>,
        message: String,
    },
}

fn refused(e: ApiError) -> Outcome {
    Outcome::Err {
        code: e.code,
        op: e.details.get("op").cloned(),
        message: e.message,
    }
}

fn ok(m: sluice_server::MutateOk) -> Outcome {
    Outcome::Ok(
        m.seq,
        m.results
            .into_iter()
            .map(|r| (r.table.name.clone(), r.key, r.version))
            .collect(),
    )
}

/// The general path, as `POST /v1/mutate` took it before the typed decoder (the body's
/// top level is checked as the handler does).
async fn general(core: &Core, body: &[u8]) -> Outcome {
    let map: serde_json::Map<String, Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return refused(ApiError::bad_request(
                "the request body must be a JSON object",
            ))
        }
        Err(e) => return refused(ApiError::bad_request(format!("malformed JSON: {e}"))),
    };
    let durability = match map.get("durability") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.parse::<Durability>() {
            Ok(d) => Some(d),
            Err(e) => return refused(ApiError::bad_request(e)),
        },
        Some(_) => return refused(ApiError::bad_request("durability")),
    };
    if let Some(extra) = map
        .keys()
        .find(|k| !["ops", "durability"].contains(&k.as_str()))
    {
        return refused(ApiError::bad_request(format!(
            "unknown field {extra:?} in a mutate"
        )));
    }
    let ops = match parse_ops_json(body, OPS_MAX) {
        Ok(ops) => ops,
        Err(e) => return refused(e),
    };
    match core.mutate(ops, durability).await {
        Ok(m) => ok(m),
        Err(e) => refused(e.into()),
    }
}

/// The WebSocket protocol's general path for a request frame (as `ws::dispatch` takes a
/// `mutate` before the typed decoder): the reply's `id` and the outcome.
async fn general_ws(core: &Core, frame: &KeptBody) -> (Value, Outcome) {
    let parsed = match frame {
        KeptBody::Json(text) => serde_json::from_slice::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}"))),
        KeptBody::Msgpack(bytes) => rmp_serde::from_slice::<Value>(bytes)
            .map_err(|e| ApiError::bad_request(format!("malformed MessagePack: {e}"))),
    };
    let mut request = match parsed {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return (
                Value::Null,
                refused(ApiError::bad_request("a request must be an object")),
            )
        }
        Err(e) => return (Value::Null, refused(e)),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(kind) = request.get("type").and_then(Value::as_str) else {
        return (
            id,
            refused(ApiError::bad_request("a request needs \"type\"")),
        );
    };
    let kind = kind.to_string();
    let durability = match request.get("durability") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.parse::<Durability>() {
            Ok(d) => Some(d),
            Err(e) => return (id, refused(ApiError::bad_request(e))),
        },
        Some(_) => return (id, refused(ApiError::bad_request("durability"))),
    };
    if kind != "mutate" {
        return (id, refused(ApiError::bad_request(format!("type {kind}"))));
    }
    let ops = match parse_ops(&mut request, OPS_MAX) {
        Ok(ops) => ops,
        Err(e) => return (id, refused(e)),
    };
    let outcome = match core.mutate(ops, durability).await {
        Ok(m) => ok(m),
        Err(e) => refused(e.into()),
    };
    (id, outcome)
}

/// A mutate body made into a WebSocket request frame: `"type"` and `"id"` added at the
/// front or the back (now and then a wrong or a missing type), as JSON text or — if the
/// text is a JSON object — MessagePack.
fn ws_frame(rng: &mut Rng, body: &str, n: usize, msgpack: bool) -> KeptBody {
    let kind = match rng.below(30) {
        0 => None,
        1 => Some("\"call\"".to_string()),
        2 => Some("1".to_string()),
        3 => Some("\"mutate\",\"type\":\"mutate\"".to_string()),
        _ => Some("\"mutate\"".to_string()),
    };
    let id = match rng.below(4) {
        0 => None,
        1 => Some(format!("\"r{n}\"")),
        2 => Some("{\"k\":[1,null]}".to_string()),
        _ => Some(n.to_string()),
    };
    let mut extra: Vec<String> = Vec::new();
    if let Some(k) = kind {
        extra.push(format!("\"type\":{k}"));
    }
    if let Some(id) = id {
        extra.push(format!("\"id\":{id}"));
    }
    shuffle_some(rng, &mut extra);
    let extra = extra.join(",");
    let text = match body.strip_prefix('{') {
        Some(_) if extra.is_empty() => body.to_string(),
        Some(rest) if rng.one_in(2) || !body.ends_with('}') => {
            let sep = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            format!("{{{extra}{sep}{rest}")
        }
        Some(_) => {
            let head = &body[..body.len() - 1];
            let sep = if head.trim_end().ends_with('{') {
                ""
            } else {
                ","
            };
            format!("{head}{sep}{extra}}}")
        }
        None => body.to_string(),
    };
    if msgpack {
        if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
            return KeptBody::Msgpack(rmp_serde::to_vec_named(&value).unwrap().into());
        }
    }
    KeptBody::Json(text.into())
}

/// Every row of every table: name, key, version, values — printed, so a value of another
/// variant that compares equal (a TIMESTAMP and an INTEGER, 0.0 and -0.0) still differs.
fn dump(db: &Db) -> Vec<String> {
    let mut out = Vec::new();
    for (name, t) in &db.tables {
        for (key, entry) in t.rows.iter() {
            out.push(format!(
                "{name} {key:?} v{} {:?}",
                entry.version, entry.values
            ));
        }
    }
    out
}

// ---- random bodies -------------------------------------------------------------------

/// JSON text of an object from (key, value text) pairs, in order, duplicates kept.
fn object(fields: &[(String, String)]) -> String {
    let inner: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
        .collect();
    format!("{{{}}}", inner.join(","))
}

const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "42",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "1.5",
    "-0.0",
    "1e300",
    "2.0",
    "1e2",
    "\"a\"",
    "\"\"",
    "\"h\\u00e9llo\\n\"",
    "\"aGVsbG8=\"",
    "\"!!notbase64\"",
    "[1,2]",
    "{\"a\":[1,{\"b\":null}]}",
    "\"2026-01-01T00:00:00Z\"",
];

/// Whether the body being built may be broken anywhere (else: only well-formed ops, which
/// the writer may still refuse for the state, a limit or a NOT NULL column).
static NOISY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `one_in(n)` for a fault: never in a clean body.
fn fault(rng: &mut Rng, n: usize) -> bool {
    NOISY.load(std::sync::atomic::Ordering::Relaxed) && rng.one_in(n)
}

fn value(rng: &mut Rng, ty: &str) -> String {
    // Mostly a value of the right type, sometimes anything.
    if fault(rng, 5) {
        return rng.pick(VALUES).to_string();
    }
    match ty {
        "int" => rng
            .pick(&["0", "1", "2", "3", "5", "-7", "100"])
            .to_string(),
        "text" => format!("\"{}\"", rng.pick(&["a", "b", "c", "x y", "", "zz"])),
        "real" => rng.pick(&["0.5", "3", "-2.25", "1e10"]).to_string(),
        "bool" => rng.pick(&["true", "false"]).to_string(),
        "ts" => rng.pick(&["1700000000000000", "0", "-5"]).to_string(),
        "json" => rng
            .pick(&["{\"k\":1}", "[true,null]", "\"s\"", "3.5", "{ \"a\" : 1 }"])
            .to_string(),
        "blob" => rng.pick(&["\"aGk=\"", "\"\"", "\"AAEC\""]).to_string(),
        "long" => format!("\"{}\"", "x".repeat(rng.below(500))),
        _ => unreachable!(),
    }
}

/// A table the generator writes: name, [(column, type)], pk column, pk type.
type TableSpec = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static str,
    &'static str,
);

fn tables() -> Vec<TableSpec> {
    vec![
        (
            "t",
            vec![
                ("name", "text"),
                ("n", "int"),
                ("r", "real"),
                ("b", "bool"),
                ("ts", "ts"),
                ("j", "json"),
                ("bl", "blob"),
                ("d", "int"),
                ("extra", "long"),
            ],
            "id",
            "int",
        ),
        (
            "s",
            vec![("v", "int"), ("note", "text"), ("flag", "bool")],
            "k",
            "text",
        ),
        ("u", vec![("x", "real")], "id", "int"),
        ("nope", vec![("a", "int")], "id", "int"),
    ]
}

fn id(rng: &mut Rng, ty: &str) -> String {
    if fault(rng, 12) {
        return rng.pick(VALUES).to_string();
    }
    match ty {
        "int" => rng.below(8).to_string(),
        _ => format!("\"{}\"", rng.pick(&["a", "b", "c", "d"])),
    }
}

fn row(rng: &mut Rng, cols: &[(&str, &str)], pk: &str, pk_ty: &str, with_pk: bool) -> String {
    let mut fields = Vec::new();
    if with_pk {
        fields.push((pk.to_string(), id(rng, pk_ty)));
    }
    let noisy = NOISY.load(std::sync::atomic::Ordering::Relaxed);
    for (c, ty) in cols {
        if rng.one_in(3) && (noisy || *c != "name") {
            continue;
        }
        fields.push((c.to_string(), value(rng, ty)));
    }
    if fault(rng, 12) {
        fields.push(("bogus".into(), "1".into()));
    }
    if fault(rng, 15) && !fields.is_empty() {
        let dup = fields[rng.below(fields.len())].clone();
        fields.push((dup.0, rng.pick(VALUES).to_string()));
    }
    shuffle_some(rng, &mut fields);
    object(&fields)
}

fn shuffle_some<T>(rng: &mut Rng, items: &mut [T]) {
    if items.len() > 1 && rng.one_in(3) {
        for i in (1..items.len()).rev() {
            items.swap(i, rng.below(i + 1));
        }
    }
}

fn op(rng: &mut Rng) -> String {
    if fault(rng, 40) {
        return rng.pick(&["1", "null", "[]", "\"insert\""]).to_string();
    }
    let tables = tables();
    let noisy = NOISY.load(std::sync::atomic::Ordering::Relaxed);
    let weights = [10, 6, 2, usize::from(noisy)];
    let mut pick = rng.below(weights.iter().sum());
    let mut ti = 0;
    while pick >= weights[ti] {
        pick -= weights[ti];
        ti += 1;
    }
    let (table, cols, pk, pk_ty) = &tables[ti];
    let kinds: &[&str] = if noisy {
        &[
            "insert", "insert", "upsert", "upsert", "patch", "delete", "replace",
        ]
    } else {
        &["insert", "upsert", "upsert", "upsert", "patch", "delete"]
    };
    let kind = *rng.pick(kinds);
    let mut fields = vec![
        ("op".to_string(), format!("\"{kind}\"")),
        ("table".to_string(), format!("\"{table}\"")),
    ];
    match kind {
        "patch" => {
            fields.push(("id".into(), id(rng, pk_ty)));
            let with_pk = fault(rng, 10);
            let set = row(rng, cols, pk, pk_ty, with_pk);
            fields.push(("set".into(), set));
        }
        "delete" => fields.push(("id".into(), id(rng, pk_ty))),
        _ => {
            let with_pk = !fault(rng, 10);
            let mut r = row(rng, cols, pk, pk_ty, with_pk);
            if kind == "insert" && *pk_ty == "int" && !noisy && r.starts_with("{\"id\":") {
                // Mostly fresh keys, so inserts commit.
                let fresh = 100 + rng.below(100_000);
                let end = r.find(',').unwrap_or(r.len() - 1);
                r = format!("{{\"id\":{fresh}{}", &r[end..]);
            }
            fields.push(("row".into(), r));
        }
    }
    if rng.one_in(if noisy { 3 } else { 10 }) {
        let v = if noisy {
            *rng.pick(&["null", "0", "1", "2", "3", "5", "-1", "\"1\"", "1.0"])
        } else {
            *rng.pick(&["null", "0", "1", "2", "3", "5"])
        };
        fields.push(("if_version".into(), v.to_string()));
    }
    match if noisy { rng.below(30) } else { 99 } {
        0 => {
            fields.remove(rng.below(fields.len()));
        }
        1 => fields.push(("extra".into(), "1".into())),
        2 => fields.push(("id".into(), "1".into())),
        3 => fields.push(("row".into(), "{}".into())),
        4 => {
            let i = rng.below(fields.len());
            fields[i].1 = rng.pick(VALUES).to_string();
        }
        _ => {}
    }
    shuffle_some(rng, &mut fields);
    object(&fields)
}

fn body(rng: &mut Rng) -> String {
    let noisy = rng.one_in(2);
    NOISY.store(noisy, std::sync::atomic::Ordering::Relaxed);
    if !noisy {
        let n = 1 + rng.below(OPS_MAX);
        let ops: Vec<String> = (0..n).map(|_| op(rng)).collect();
        let mut fields = vec![("ops".to_string(), format!("[{}]", ops.join(",")))];
        if rng.one_in(4) {
            fields.push(("durability".into(), "\"memory\"".into()));
        }
        shuffle_some(rng, &mut fields);
        return object(&fields);
    }
    let n = match rng.below(20) {
        0 => 0,
        1 => OPS_MAX + 1,
        _ => 1 + rng.below(OPS_MAX),
    };
    let ops: Vec<String> = (0..n).map(|_| op(rng)).collect();
    let mut fields = vec![("ops".to_string(), format!("[{}]", ops.join(",")))];
    match rng.below(25) {
        0 => fields.push(("durability".into(), "\"memory\"".into())),
        1 => fields.push(("durability".into(), "\"sometimes\"".into())),
        2 => fields.push(("durability".into(), "null".into())),
        3 => fields.push(("durability".into(), "3".into())),
        4 => fields.push(("other".into(), "1".into())),
        5 => fields[0].1 = "{}".into(),
        6 => fields.clear(),
        7 => fields.push(("ops".into(), "[]".into())),
        _ => {}
    }
    shuffle_some(rng, &mut fields);
    let text = object(&fields);
    match rng.below(60) {
        0 => text[..rng.below(text.len())].to_string(),
        1 => format!("{text} x"),
        2 => "[1]".into(),
        _ => text,
    }
}

/// Which path the bodies take.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// `POST /v1/mutate`.
    Http,
    /// A WebSocket `mutate` request in a text frame.
    WsJson,
    /// A WebSocket `mutate` request in a MessagePack frame.
    WsMsgpack,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_mutate_decoder_matches_the_json_path() {
    differential(Path::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_json_mutate_decoder_matches_the_general_path() {
    differential(Path::WsJson).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_msgpack_mutate_decoder_matches_the_general_path() {
    differential(Path::WsMsgpack).await;
}

async fn differential(path: Path) {
    let seed: u64 = std::env::var("SLUICE_DECODE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let cases: usize = std::env::var("SLUICE_DECODE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    eprintln!(
        "typed decoder differential ({path:?}): seed {seed} (SLUICE_DECODE_SEED={seed}), {cases} bodies"
    );
    let (dir_a, dir_b) = (TempDir::new("decode-a"), TempDir::new("decode-b"));
    let (a, b) = (open(&dir_a), open(&dir_b));
    ddl(&a, SCHEMA).await;
    ddl(&b, SCHEMA).await;
    let mut rng = Rng::new(seed);
    let (mut typed, mut typed_ok, mut stale) = (0usize, 0usize, 0usize);
    let mut ddl_next = 0;
    for case in 0..cases {
        let text = body(&mut rng);
        let frame =
            (path != Path::Http).then(|| ws_frame(&mut rng, &text, case, path == Path::WsMsgpack));
        let (typed_id, decoded) = match &frame {
            None => (None, b.decode_mutate(axum::body::Bytes::from(text.clone()))),
            Some(frame) => match b.decode_ws_mutate(frame.clone()) {
                Some((id, decoded)) => (Some(id), Some(decoded)),
                None => (None, None),
            },
        };
        // Now and then the schema changes; after a typed decode, it lands between the
        // decode and the apply. (It does not wait for a typed decode: bodies naming tables
        // or columns a later DDL adds are not decoded typed, so a schema that only moved
        // after typed decodes could stall for a whole run with few typed bodies.)
        let ddl_due = ddl_next < DDL.len() && rng.one_in((cases / 40).max(1));
        let ddl_between = ddl_due && decoded.is_some();
        if ddl_due {
            ddl(&a, DDL[ddl_next]).await;
            ddl(&b, DDL[ddl_next]).await;
            ddl_next += 1;
        }
        let (expected, general_id) = match &frame {
            None => (general(&a, text.as_bytes()).await, None),
            Some(frame) => {
                let (id, outcome) = general_ws(&a, frame).await;
                (outcome, Some(id))
            }
        };
        let got = match decoded {
            Some(decoded) => {
                typed += 1;
                stale += usize::from(ddl_between);
                match b.mutate_decoded_as(&Caller::Admin, decoded).await {
                    Ok(m) => {
                        typed_ok += 1;
                        ok(m)
                    }
                    Err(e) => refused(e.into()),
                }
            }
            None => match &frame {
                None => general(&b, text.as_bytes()).await,
                Some(frame) => general_ws(&b, frame).await.1,
            },
        };
        if let Some(id) = typed_id {
            assert_eq!(
                Some(id),
                general_id,
                "seed {seed}, body #{case} ({text}, {frame:?}): the request id"
            );
        }
        assert_eq!(
            expected, got,
            "seed {seed}, body #{case} ({text}, {frame:?}): general path vs typed decoder"
        );
        assert_eq!(
            dump(&a.db()),
            dump(&b.db()),
            "seed {seed}, body #{case} ({text}): the tables differ"
        );
    }
    eprintln!(
        "{cases} bodies: {typed} decoded typed ({typed_ok} committed), {stale} applied after a schema change"
    );
    // Some seeds write to tables or columns before a DDL adds them for long stretches.
    assert!(
        typed_ok > cases / 40,
        "the typed decoder took too few bodies to mean anything"
    );
}
