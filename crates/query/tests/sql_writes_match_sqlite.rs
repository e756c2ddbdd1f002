//! `POST /v1/sql` scripts (INSERT … VALUES [ON CONFLICT], UPDATE, DELETE, SELECT, several in
//! one transaction) against SQLite as the oracle: random scripts run on both, and after each
//! one both must have succeeded or both failed, agree on every SELECT inside it, and hold the
//! same rows. A failed script must change nothing on either side.
//!
//! `SLUICE_SQL_WRITES_SEED` replays one seed; `SLUICE_SQL_WRITES_SCRIPTS` sets the length.

use sluice_engine::{Changelog, Db, Limits, Retention, TxError, Value};
use sluice_query::script::{Outcome, Script};
use sluice_query::{Params, QueryError};

const DDL: &str =
    "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c INTEGER NOT NULL DEFAULT 0);
                   CREATE INDEX t_a ON t (a);";

/// A small deterministic generator (xorshift), so a seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Debug)]
#[allow(dead_code)] // the payloads are read through Debug when a case fails
enum Failure {
    Query(QueryError),
    Tx(TxError),
}

impl From<QueryError> for Failure {
    fn from(e: QueryError) -> Self {
        Failure::Query(e)
    }
}

impl From<TxError> for Failure {
    fn from(e: TxError) -> Self {
        Failure::Tx(e)
    }
}

fn value_sql(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => "NULL".into(),
        1 => "$1".into(),
        _ => rng.below(20).to_string(),
    }
}

fn text_sql(rng: &mut Rng) -> String {
    match rng.below(5) {
        0 => "NULL".into(),
        1 => "$2".into(),
        _ => format!("'{}'", rng.pick(&["x", "y", "xy", "it''s", "", "zz"])),
    }
}

fn predicate(rng: &mut Rng) -> String {
    let k = rng.below(20);
    match rng.below(8) {
        0 => format!("a < {k}"),
        1 => format!("a >= {k} AND c < 3"),
        2 => format!("id = {k}"),
        3 => format!("id IN ({k}, {}, {})", rng.below(20), rng.below(20)),
        4 => "b LIKE 'x%'".into(),
        5 => "a IS NULL OR b IS NULL".into(),
        6 => format!("a = $1 OR id > {k}"),
        _ => format!("NOT (a BETWEEN {k} AND {})", k + 5),
    }
}

fn statement(rng: &mut Rng) -> String {
    match rng.below(10) {
        0..=3 => {
            let rows: Vec<String> = (0..1 + rng.below(3))
                .map(|_| format!("({}, {}, {})", rng.below(20), value_sql(rng), text_sql(rng)))
                .collect();
            let conflict = match rng.below(4) {
                0 => String::new(),
                1 => " ON CONFLICT (id) DO NOTHING".into(),
                2 => " ON CONFLICT (id) DO UPDATE SET a = excluded.a, c = c + 1".into(),
                _ => format!(
                    " ON CONFLICT (id) DO UPDATE SET b = excluded.b || 'u', c = t.c + 2 WHERE t.a > {}",
                    rng.below(20)
                ),
            };
            format!(
                "INSERT INTO t (id, a, b) VALUES {}{conflict}",
                rows.join(", ")
            )
        }
        4..=6 => {
            let set = rng.pick(&[
                "a = a + 1",
                "c = c + 1, b = b || 'z'",
                "a = NULL",
                "b = 'x', a = $1",
                "a = id * 2 - c",
            ]);
            if rng.below(5) == 0 {
                format!("UPDATE t SET {set}")
            } else {
                format!("UPDATE t SET {set} WHERE {}", predicate(rng))
            }
        }
        7 | 8 => format!("DELETE FROM t WHERE {}", predicate(rng)),
        _ => format!(
            "SELECT id, a, b, c FROM t WHERE {} ORDER BY id",
            predicate(rng)
        ),
    }
}

fn to_lite(v: &Value) -> rusqlite::types::Value {
    match v {
        Value::Null => rusqlite::types::Value::Null,
        Value::Integer(i) => rusqlite::types::Value::Integer(*i),
        Value::Text(t) => rusqlite::types::Value::Text(t.to_string()),
        other => panic!("unexpected value {other:?}"),
    }
}

fn from_lite(v: rusqlite::types::Value) -> Value {
    match v {
        rusqlite::types::Value::Null => Value::Null,
        rusqlite::types::Value::Integer(i) => Value::Integer(i),
        rusqlite::types::Value::Text(t) => Value::Text(t.into()),
        other => panic!("unexpected SQLite value {other:?}"),
    }
}

fn lite_rows(
    lite: &rusqlite::Connection,
    sql: &str,
    params: &[rusqlite::types::Value],
) -> Vec<Vec<Value>> {
    let mut stmt = lite.prepare(&sql.replace('$', "?")).unwrap();
    let n = stmt.column_count();
    stmt.query_map(
        rusqlite::params_from_iter(&params[..stmt.parameter_count()]),
        |row| {
            Ok((0..n)
                .map(|i| from_lite(row.get::<_, rusqlite::types::Value>(i).unwrap()))
                .collect())
        },
    )
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

fn ours_rows(db: &Db) -> Vec<Vec<Value>> {
    sluice_query::query("SELECT id, a, b, c FROM t ORDER BY id", db, &Params::None)
        .unwrap()
        .rows
}

/// Runs `statements` on SQLite in one transaction: `Some(select results)` if all of them
/// succeeded (committed), `None` if one failed (rolled back).
fn lite_run(
    lite: &mut rusqlite::Connection,
    statements: &[String],
    params: &[rusqlite::types::Value],
) -> Option<Vec<Vec<Vec<Value>>>> {
    let tx = lite.transaction().unwrap();
    let mut selects = Vec::new();
    for s in statements {
        if s.starts_with("SELECT") {
            selects.push(lite_rows(&tx, s, params));
            continue;
        }
        let mut stmt = tx.prepare(&s.replace('$', "?")).unwrap();
        // `?2` alone still binds two slots in SQLite.
        let wanted = stmt.parameter_count();
        if stmt
            .execute(rusqlite::params_from_iter(&params[..wanted]))
            .is_err()
        {
            return None; // dropping `tx` rolls back
        }
    }
    tx.commit().unwrap();
    Some(selects)
}

#[test]
fn random_write_scripts_leave_the_same_rows_as_sqlite() {
    let seed: u64 = std::env::var("SLUICE_SQL_WRITES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let scripts: usize = std::env::var("SLUICE_SQL_WRITES_SCRIPTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    println!("seed {seed} (SLUICE_SQL_WRITES_SEED={seed} replays it), {scripts} scripts");
    let mut rng = Rng(seed);

    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let changes = sluice_sql::parse_ddl(DDL)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, DDL.into()).unwrap();
    let mut lite = rusqlite::Connection::open_in_memory().unwrap();
    lite.execute_batch(DDL).unwrap();

    let (mut committed, mut failed) = (0, 0);
    for n in 0..scripts {
        let statements: Vec<String> = (0..1 + rng.below(3)).map(|_| statement(&mut rng)).collect();
        let text = statements.join("; ");
        let mut params = vec![
            Value::Integer(rng.below(20)),
            Value::Text(rng.pick(&["x", "xq", "q"]).into()),
        ];
        // A script takes exactly the parameters its text uses.
        params.truncate(if text.contains("$2") {
            2
        } else if text.contains("$1") {
            1
        } else {
            0
        });
        let lite_params: Vec<_> = params.iter().map(to_lite).collect();
        let context = format!("seed {seed}, script {n}: {text} with {params:?}");

        let script = Script::parse(&text).unwrap_or_else(|e| panic!("{context}: {e}"));
        let before = ours_rows(&db);
        let mut tx = db.transaction();
        let ours = script.run::<Failure>(
            &mut tx,
            &Params::Positional(params.clone()),
            None,
            10_000,
            &mut |_, _, _| Ok(()),
        );
        let ours = match ours {
            Ok(outcomes) => {
                tx.commit();
                Some(outcomes)
            }
            Err(_) => {
                drop(tx);
                None
            }
        };
        let theirs = lite_run(&mut lite, &statements, &lite_params);
        match (&ours, &theirs) {
            (Some(outcomes), Some(selects)) => {
                committed += 1;
                let ours_selects: Vec<&Vec<Vec<Value>>> = outcomes
                    .iter()
                    .filter_map(|o| match o {
                        Outcome::Rows(r) => Some(&r.rows),
                        Outcome::Written { .. } => None,
                    })
                    .collect();
                assert_eq!(
                    ours_selects,
                    selects.iter().collect::<Vec<_>>(),
                    "{context}: a SELECT inside the script differs"
                );
            }
            (None, None) => {
                failed += 1;
                assert_eq!(
                    ours_rows(&db),
                    before,
                    "{context}: a failed script changed rows"
                );
            }
            _ => panic!(
                "{context}: Sluice {} but SQLite {}",
                if ours.is_some() {
                    "committed"
                } else {
                    "failed"
                },
                if theirs.is_some() {
                    "committed"
                } else {
                    "failed"
                }
            ),
        }
        let want = lite_rows(&lite, "SELECT id, a, b, c FROM t ORDER BY id", &[]);
        assert_eq!(ours_rows(&db), want, "{context}: the rows differ");
    }
    println!("{committed} scripts committed, {failed} failed on both sides");
    assert!(
        committed > scripts / 4 && failed > 0,
        "the generator must exercise both outcomes"
    );
}
