//! The reproductions of issue 8 point 9, each checked against SQLite itself as well as
//! against the expected rows: column affinity in comparisons (literals, parameters, index
//! and key access paths), `IS` / `IS NOT`, and select-list aliases in GROUP BY / HAVING.

use serde_json::{json, Map, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention, Value};
use sluice_query::{query, Params};

const DDL: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT);
                   CREATE TABLE s (k TEXT PRIMARY KEY, n INTEGER);
                   CREATE INDEX t_a ON t (a);
                   CREATE INDEX t_b ON t (b);";

const T_ROWS: [(i64, Option<i64>, &str); 5] = [
    (1, Some(3), ""),
    (2, Some(7), "100%"),
    (3, Some(10), "apple"),
    (4, None, "10"),
    (5, Some(3), " 7"),
];

fn both() -> (Db, rusqlite::Connection) {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let changes = sluice_sql::parse_ddl(DDL)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, DDL.into()).unwrap();
    let lite = rusqlite::Connection::open_in_memory().unwrap();
    lite.execute_batch(DDL).unwrap();
    let mut tx = db.transaction();
    let obj = |j: Json| -> Map<String, Json> { j.as_object().unwrap().clone() };
    for (id, a, b) in T_ROWS {
        tx.insert("t", &obj(json!({"id": id, "a": a, "b": b})), None)
            .unwrap();
        lite.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3)",
            rusqlite::params![id, a, b],
        )
        .unwrap();
    }
    for (k, n) in [("5", 1), ("x", 2), ("10", 3)] {
        tx.insert("s", &obj(json!({"k": k, "n": n})), None).unwrap();
        lite.execute("INSERT INTO s VALUES (?1, ?2)", rusqlite::params![k, n])
            .unwrap();
    }
    tx.commit();
    (db, lite)
}

/// The first column of every row, sorted, from Sluice and from SQLite (which must agree).
fn ids(sql: &str, params: &[Value]) -> Vec<Value> {
    let (db, lite) = both();
    let ours = query(sql, &db, &Params::Positional(params.to_vec()))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut ours: Vec<Value> = ours.rows.into_iter().map(|r| r[0].clone()).collect();
    ours.sort();
    let lite_params: Vec<rusqlite::types::Value> = params
        .iter()
        .map(|v| match v {
            Value::Integer(i) => rusqlite::types::Value::Integer(*i),
            Value::Text(t) => rusqlite::types::Value::Text(t.to_string()),
            Value::Null => rusqlite::types::Value::Null,
            other => panic!("{other:?}"),
        })
        .collect();
    let mut stmt = lite.prepare(&sql.replace('$', "?")).unwrap();
    let mut theirs: Vec<Value> = stmt
        .query_map(rusqlite::params_from_iter(lite_params), |row| {
            row.get::<_, rusqlite::types::Value>(0)
        })
        .unwrap()
        .map(|v| match v.unwrap() {
            rusqlite::types::Value::Integer(i) => Value::Integer(i),
            rusqlite::types::Value::Text(t) => Value::Text(t.into()),
            rusqlite::types::Value::Null => Value::Null,
            other => panic!("{other:?}"),
        })
        .collect();
    theirs.sort();
    assert_eq!(ours, theirs, "{sql} {params:?}: Sluice and SQLite differ");
    ours
}

fn ints(v: &[i64]) -> Vec<Value> {
    v.iter().map(|&i| Value::Integer(i)).collect()
}

#[test]
fn an_integer_column_equals_text_that_spells_its_value() {
    assert_eq!(ids("SELECT id FROM t WHERE a = '3'", &[]), ints(&[1, 5]));
    assert_eq!(ids("SELECT id FROM t WHERE a = ' 3 '", &[]), ints(&[1, 5]));
    assert_eq!(ids("SELECT id FROM t WHERE a = '3.0'", &[]), ints(&[1, 5]));
    assert_eq!(ids("SELECT id FROM t WHERE a = '1e1'", &[]), ints(&[3]));
    assert_eq!(ids("SELECT id FROM t WHERE a = '3x'", &[]), ints(&[]));
    // Text that is no number stays text, and every number sorts before text.
    assert_eq!(
        ids("SELECT id FROM t WHERE a < 'x'", &[]),
        ints(&[1, 2, 3, 5])
    );
    assert_eq!(ids("SELECT id FROM t WHERE a > '5'", &[]), ints(&[2, 3]));
}

#[test]
fn unary_plus_strips_a_columns_affinity() {
    assert_eq!(ids("SELECT id FROM t WHERE +a = '3'", &[]), ints(&[]));
    assert_eq!(ids("SELECT id FROM t WHERE +a = 3", &[]), ints(&[1, 5]));
    assert_eq!(
        ids("SELECT id FROM t WHERE +b > 5", &[]),
        ints(&[1, 2, 3, 4, 5])
    );
    assert_eq!(ids("SELECT id FROM t WHERE a IN (+b)", &[]), ints(&[]));
    assert_eq!(ids("SELECT id FROM t WHERE b IN (+a, 10)", &[]), ints(&[4]));
}

#[test]
fn a_text_parameter_takes_the_columns_affinity() {
    let p = |s: &str| vec![Value::Text(s.into())];
    assert_eq!(ids("SELECT id FROM t WHERE a = $1", &p("3")), ints(&[1, 5]));
    assert_eq!(ids("SELECT id FROM t WHERE $1 = a", &p("7")), ints(&[2]));
    assert_eq!(
        ids("SELECT id FROM t WHERE a >= $1", &p("7")),
        ints(&[2, 3])
    );
    assert_eq!(ids("SELECT id FROM t WHERE id = $1", &p("4")), ints(&[4]));
    assert_eq!(
        ids("SELECT id FROM t WHERE a IN ($1, 10)", &p("7")),
        ints(&[2, 3])
    );
    // An integer parameter against a TEXT column compares as text.
    assert_eq!(
        ids("SELECT id FROM t WHERE b = $1", &[Value::Integer(10)]),
        ints(&[4])
    );
}

#[test]
fn access_paths_find_rows_through_affinity() {
    // `a` and `b` are indexed and `id` / `k` are primary keys: each is an access path.
    assert_eq!(ids("SELECT id FROM t WHERE id = '2'", &[]), ints(&[2]));
    assert_eq!(
        ids("SELECT id FROM t WHERE id BETWEEN '2' AND '4'", &[]),
        ints(&[2, 3, 4])
    );
    assert_eq!(ids("SELECT id FROM t WHERE a = '10'", &[]), ints(&[3]));
    assert_eq!(
        ids("SELECT id FROM t WHERE a BETWEEN '4' AND '10'", &[]),
        ints(&[2, 3])
    );
    assert_eq!(ids("SELECT id FROM t WHERE b = 10", &[]), ints(&[4]));
    assert_eq!(
        ids("SELECT k FROM s WHERE k = 5", &[]),
        vec![Value::Text("5".into())]
    );
    assert_eq!(
        ids("SELECT k FROM s WHERE k IN (10, 5)", &[]),
        vec![Value::Text("10".into()), Value::Text("5".into())]
    );
}

#[test]
fn a_text_column_compares_with_a_number_as_text() {
    // '' < '100%' < '5' < 'apple' as text; ' 7' and '10' sort below '5' too.
    assert_eq!(ids("SELECT id FROM t WHERE b > 5", &[]), ints(&[3]));
    assert_eq!(
        ids("SELECT id FROM t WHERE b < 5", &[]),
        ints(&[1, 2, 4, 5])
    );
    assert_eq!(
        ids("SELECT id FROM t WHERE b BETWEEN 1 AND 2", &[]),
        ints(&[2, 4])
    );
    assert_eq!(ids("SELECT id FROM t WHERE b IN (10, 7)", &[]), ints(&[4]));
    // Without a column on either side, nothing converts: every number is below text.
    assert_eq!(
        ids("SELECT id FROM t WHERE b || '' > 5", &[]),
        ints(&[1, 2, 3, 4, 5])
    );
}

#[test]
fn columns_of_different_affinity_compare_numerically() {
    // INTEGER vs TEXT columns: numeric affinity converts ' 7' and '10'.
    assert_eq!(ids("SELECT id FROM t WHERE a = b", &[]), ints(&[]));
    assert_eq!(
        ids("SELECT t.id FROM t JOIN s ON s.k = t.a", &[]),
        ints(&[3])
    );
    assert_eq!(
        ids("SELECT s.n FROM s JOIN t ON t.a = s.k", &[]),
        ints(&[3])
    );
    assert_eq!(
        ids("SELECT id FROM t WHERE a IN (SELECT k FROM s)", &[]),
        ints(&[3])
    );
    assert_eq!(
        ids("SELECT k FROM s WHERE k IN (SELECT a FROM t)", &[]),
        vec![Value::Text("10".into())]
    );
    // The subquery's ORDER BY … LIMIT picks by the unconverted text ('x', '5'), then compares.
    assert_eq!(
        ids(
            "SELECT id FROM t WHERE a IN (SELECT k FROM s ORDER BY 1 DESC LIMIT 2)",
            &[]
        ),
        ints(&[])
    );
}

#[test]
fn is_compares_like_equals_with_nulls_equal() {
    assert_eq!(ids("SELECT id FROM t WHERE a IS 3", &[]), ints(&[1, 5]));
    assert_eq!(ids("SELECT id FROM t WHERE a IS '3'", &[]), ints(&[1, 5]));
    assert_eq!(
        ids("SELECT id FROM t WHERE a IS NOT 3", &[]),
        ints(&[2, 3, 4])
    );
    assert_eq!(ids("SELECT id FROM t WHERE a IS NULL", &[]), ints(&[4]));
    assert_eq!(
        ids("SELECT id FROM t WHERE a IS NOT NULL", &[]),
        ints(&[1, 2, 3, 5])
    );
    assert_eq!(
        ids("SELECT id FROM t WHERE a IS $1", &[Value::Null]),
        ints(&[4])
    );
    assert_eq!(ids("SELECT id FROM t WHERE a IS NOT a", &[]), ints(&[]));
    assert_eq!(
        ids("SELECT id FROM t WHERE (a IS 3) = 1 AND id IS NOT 5", &[]),
        ints(&[1])
    );
    assert_eq!(
        ids("SELECT id FROM t WHERE a IS NOT DISTINCT FROM 7", &[]),
        ints(&[2])
    );
}

#[test]
fn group_by_and_having_accept_select_list_aliases() {
    assert_eq!(
        ids("SELECT a % 2 AS g, COUNT(*) FROM t GROUP BY g", &[]),
        vec![Value::Null, Value::Integer(0), Value::Integer(1)]
    );
    assert_eq!(
        ids(
            "SELECT a AS g, COUNT(*) AS n FROM t GROUP BY g HAVING n > 1",
            &[]
        ),
        ints(&[3])
    );
    assert_eq!(
        ids("SELECT a AS g FROM t GROUP BY g HAVING g > '5'", &[]),
        ints(&[7, 10])
    );
    // A column of that name wins over the alias, as in SQLite.
    // (Grouped by the column a: groups 3, 7, 10 and NULL; the alias would be an aggregate.)
    assert_eq!(
        ids("SELECT COUNT(*) AS a FROM t GROUP BY a", &[]),
        ints(&[1, 1, 1, 2])
    );
}
