//! Everything outside the supported subset is refused with a message naming it; unknown
//! names, bad parameters and limits get their own typed errors.

use serde_json::{json, Map};
use sluice_engine::{Changelog, Db, Limits, Retention, Value};
use sluice_query::{prepare, query, Params, QueryError};

fn db() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let ddl = "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, c TEXT);
               CREATE TABLE u (id INTEGER PRIMARY KEY, t_id INTEGER, v REAL);
               CREATE INDEX t_a ON t (a);";
    let changes = sluice_sql::parse_ddl(ddl)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, ddl.into()).unwrap();
    let mut tx = db.transaction();
    for i in 1..=5i64 {
        let row: Map<_, _> = json!({"id": i, "a": i % 3, "c": format!("n{i}")})
            .as_object()
            .unwrap()
            .clone();
        tx.insert("t", &row, None).unwrap();
        let row: Map<_, _> = json!({"id": i, "t_id": i % 2 + 1, "v": i as f64 / 2.0})
            .as_object()
            .unwrap()
            .clone();
        tx.insert("u", &row, None).unwrap();
    }
    tx.commit();
    db
}

#[test]
fn unsupported_constructs_are_named() {
    let db = db();
    let cases = [
        ("SELECT a, row_number() OVER () FROM t", "window functions"),
        ("SELECT a FROM t UNION SELECT a FROM t", "UNION"),
        ("SELECT a FROM t EXCEPT SELECT a FROM t", "EXCEPT"),
        ("SELECT upper(c) FROM t", "function upper()"),
        ("SELECT * FROM t RIGHT JOIN u ON u.t_id = t.id", "RIGHT JOIN"),
        ("SELECT * FROM t FULL OUTER JOIN u ON u.t_id = t.id", "FULL JOIN"),
        ("SELECT * FROM t CROSS JOIN u", "CROSS JOIN"),
        ("SELECT * FROM t JOIN u USING (id)", "USING"),
        ("SELECT * FROM t, u", "comma joins"),
        ("SELECT * FROM t JOIN u ON u.v > t.a", "JOIN … ON without an equality"),
        (
            "SELECT id FROM t WHERE a IN (SELECT a FROM t WHERE a IN (SELECT a FROM t WHERE a IN (SELECT a FROM t WHERE a IN (SELECT a FROM t))))",
            "subquery nested deeper than 3",
        ),
        ("SELECT DISTINCT a FROM t", "SELECT DISTINCT"),
        ("WITH x AS (SELECT 1) SELECT * FROM t", "WITH"),
        ("SELECT (SELECT 1) FROM t", "scalar subquery"),
        ("SELECT id FROM t WHERE EXISTS (SELECT 1 FROM u)", "EXISTS"),
        ("SELECT CASE WHEN a = 1 THEN 2 END FROM t", "CASE"),
        ("SELECT CAST(a AS TEXT) FROM t", "CAST"),
        ("SELECT * FROM (SELECT * FROM t) x", "subquery in FROM"),
        ("SELECT COUNT(*)", "aggregates or GROUP BY without FROM"),
        ("SELECT COUNT(DISTINCT a) FROM t", "count(DISTINCT …)"),
        ("SELECT id FROM t WHERE c ILIKE 'a%'", "ILIKE"),
        ("SELECT id FROM t WHERE c LIKE 'a!%' ESCAPE '!'", "LIKE … ESCAPE"),
        ("SELECT id FROM t WHERE id IN (SELECT t_id FROM u WHERE u.t_id = t.a)", "correlated subquery"),
        ("SELECT id, COUNT(*) FROM t GROUP BY a", "outside GROUP BY"),
        ("SELECT id FROM t WHERE COUNT(*) > 1", "aggregate function count()"),
        ("SELECT id FROM t WHERE a = $1 AND c = :name", "mixing $n and :name"),
        ("INSERT INTO t VALUES (1, 2, 'x')", "only SELECT"),
        ("SELECT id FROM t; SELECT id FROM t", "several statements"),
        ("SELECT a FROM t GROUP BY ALL", "GROUP BY ALL"),
    ];
    for (sql, named) in cases {
        match prepare(sql, &db) {
            Err(QueryError::Unsupported(m)) => assert!(
                m.contains(named),
                "{sql}: message {m:?} does not name {named:?}"
            ),
            other => panic!("{sql}: expected Unsupported naming {named:?}, got {other:?}"),
        }
    }
    let e = prepare("SELECT upper(c) FROM t", &db).unwrap_err();
    assert_eq!(e.to_string(), "unsupported: function upper()");
}

#[test]
fn unknown_names_and_bad_params_are_typed() {
    let db = db();
    assert!(
        matches!(prepare("SELECT * FROM nope", &db), Err(QueryError::NotFound(m)) if m.contains("nope"))
    );
    assert!(
        matches!(prepare("SELECT zzz FROM t", &db), Err(QueryError::Schema(m)) if m.contains("zzz"))
    );
    assert!(
        matches!(prepare("SELECT x.a FROM t", &db), Err(QueryError::Schema(m)) if m.contains("\"x\""))
    );
    assert!(matches!(
        prepare("SELECT id FROM t JOIN u ON u.t_id = t.id", &db),
        Err(QueryError::Schema(m)) if m.contains("ambiguous")
    ));
    assert!(matches!(
        prepare("SELECT id FROM t WHERE a IN (SELECT id, t_id FROM u)", &db),
        Err(QueryError::Schema(m)) if m.contains("one column")
    ));
    assert!(matches!(
        prepare("SELEC nothing", &db),
        Err(QueryError::Syntax(_))
    ));

    let plan = prepare("SELECT id FROM t WHERE a = $1", &db).unwrap();
    assert!(matches!(
        plan.execute(&db, &Params::None),
        Err(QueryError::BadRequest(_))
    ));
    assert!(matches!(
        plan.execute(
            &db,
            &Params::Positional(vec![Value::Integer(1), Value::Integer(2)])
        ),
        Err(QueryError::BadRequest(_))
    ));
    let named = prepare("SELECT id FROM t WHERE a = :a", &db).unwrap();
    let p = Params::from_json(Some(&json!({"b": 1}))).unwrap();
    assert!(matches!(named.execute(&db, &p), Err(QueryError::BadRequest(m)) if m.contains(":b")));
    let p = Params::from_json(Some(&json!({"a": 1}))).unwrap();
    let r = named.execute(&db, &p).unwrap();
    assert_eq!(
        r.rows,
        vec![vec![Value::Integer(1)], vec![Value::Integer(4)]]
    );
    assert!(Params::from_json(Some(&json!([[1]]))).is_err());

    let long = format!(
        "SELECT id FROM t WHERE {}",
        "a = 1 OR ".repeat(10_000) + "a = 1"
    );
    assert!(
        matches!(prepare(&long, &db), Err(QueryError::Limit(m)) if m.contains("sql_bytes_max"))
    );
}

#[test]
fn access_paths_and_shapes_work() {
    use sluice_query::Access;
    let db = db();
    let plan = prepare("SELECT * FROM t WHERE id = 3", &db).unwrap();
    assert!(matches!(plan.select.access, Access::Key(_)));
    let plan = prepare("SELECT * FROM t WHERE a = 1 AND c <> 'x'", &db).unwrap();
    assert!(matches!(plan.select.access, Access::IndexEq { .. }));
    let plan = prepare("SELECT * FROM t WHERE id BETWEEN 2 AND 4", &db).unwrap();
    assert!(matches!(plan.select.access, Access::KeyRange { .. }));
    let r = query(
        "SELECT id FROM t WHERE id BETWEEN 2 AND 4 ORDER BY id DESC",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(
        r.rows,
        vec![
            vec![Value::Integer(4)],
            vec![Value::Integer(3)],
            vec![Value::Integer(2)]
        ]
    );

    let r = query(
        "SELECT t.id, u.id AS uid FROM t JOIN u ON u.id = t.id WHERE t.id = 2",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(r.columns, vec!["id", "uid"]);
    let r = query(
        "SELECT t.id, u.id FROM t JOIN u ON u.id = t.id",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(
        r.columns,
        vec!["id", "id:2"],
        "duplicate names are made unique"
    );

    let r = query(
        "SELECT COUNT(*), SUM(a), AVG(a), MIN(c), MAX(a) FROM t WHERE id > 100",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![
            Value::Integer(0),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null
        ]]
    );
    let r = query(
        "SELECT a, COUNT(*) FROM t WHERE id > 100 GROUP BY a",
        &db,
        &Params::None,
    )
    .unwrap();
    assert!(r.rows.is_empty());
    let r = query(
        "SELECT COUNT(*), 2 IN (SELECT COUNT(*) FROM u GROUP BY t_id) FROM t",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(r.rows, vec![vec![Value::Integer(5), Value::Integer(1)]]);
    let r = query(
        "SELECT id FROM t ORDER BY a DESC NULLS LAST, id LIMIT 2 OFFSET 1",
        &db,
        &Params::None,
    )
    .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![Value::Integer(5)], vec![Value::Integer(1)]]
    );
}
