//! Fuzz target for DDL text: `parse_ddl` must answer every input with statements or a typed
//! error, never panic. What it accepts is applied to a database holding the seed schema, and
//! the commit it makes must travel through the log format and replay to the same schemas
//! (what recovery will see). `SLUICE_FUZZ_EXECS` / `SLUICE_FUZZ_SEED` run a long mode;
//! `--nocapture` shows executions and panics.

use sluice_engine::codec;
use sluice_engine::{Changelog, CommitBody, Db, Limits, Retention};
use sluice_fuzzkit::{corpus, Fuzzer, Kind};
use sluice_sql::{parse_ddl, SqlError};

fn db_with_schema() -> Db {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let changes = parse_ddl(corpus::SCHEMA)
        .expect("the seed schema parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, corpus::SCHEMA.into())
        .expect("the seed schema applies");
    db
}

fn schemas(db: &Db) -> String {
    db.tables
        .values()
        .map(|t| format!("{:?}\n", t.schema))
        .collect()
}

#[test]
fn fuzz_ddl_parse_apply_and_replay() {
    let seeds: Vec<&str> = corpus::DDL.iter().chain(corpus::SELECTS).copied().collect();
    Fuzzer::new("sql_ddl", 20_000, Kind::Text)
        .seeds(seeds)
        .dictionary(corpus::SQL_WORDS)
        .len_max(1 << 14)
        .run(|input| {
            let sql = String::from_utf8_lossy(input);
            let ddl = match parse_ddl(&sql) {
                Ok(ddl) => ddl,
                Err(SqlError::Syntax(_)) => return "syntax".into(),
                Err(SqlError::Unsupported(m)) => {
                    return format!("unsupported {}", m.split(' ').next().unwrap_or(""))
                }
                Err(SqlError::Schema(m)) => return format!("schema {}", m.len().min(3)),
            };
            for d in &ddl {
                // The normalised text of each statement parses again.
                parse_ddl(&d.sql).expect("a statement's normalised text parses again");
            }
            let mut db = db_with_schema();
            let changes: Vec<_> = ddl.into_iter().map(|d| d.change).collect();
            let n = changes.len();
            let commit = match db.apply_schema(changes, sql.to_string()) {
                Ok(Some(commit)) => commit,
                Ok(None) => return "no-op".into(),
                Err(e) => return format!("refused {:?}", e.code),
            };
            assert!(matches!(commit.body, CommitBody::Schema { .. }));
            let mut payload = Vec::new();
            codec::encode_commit(&commit, &mut payload);
            let (seq, body) = codec::decode_commit(&payload).expect("an encoded commit decodes");
            let mut replayed = db_with_schema();
            replayed
                .replay(seq, body)
                .expect("an applied schema change replays");
            assert_eq!(
                schemas(&replayed),
                schemas(&db),
                "replay gives the same schemas"
            );
            format!("applied {}", n.min(3))
        });
}

/// Found by `fuzz_ddl_parse_apply_and_replay` (SLUICE_FUZZ_SEED=20261123, execution
/// 154 657): `DEFAULT - -1` was accepted, and sqlparser prints it back as `DEFAULT --1`,
/// which starts a comment — the normalised text kept in the log and shown by `/v1/changes`
/// lost the rest of the statement. A minus now applies to a literal only.
#[test]
fn a_default_of_a_double_minus_is_refused() {
    const INPUT: &[u8] = b"CREATE TABLE x(d TEXT PRIMARY KEY,j JSON,f DOUBLE,v VARCHAR(0)NOT NULL DEFAULT\'\',s TIMESTAMP DEFAULT- -1,b BOOLEAN DEFAULT true,l BLOB)";
    let sql = std::str::from_utf8(INPUT).unwrap();
    match parse_ddl(sql) {
        Err(SqlError::Schema(m)) => assert!(m.contains("DEFAULT for column \"s\""), "{m}"),
        other => panic!("expected a schema error naming the column, got {other:?}"),
    }
    let ddl = parse_ddl("CREATE TABLE y (id INTEGER PRIMARY KEY, s TIMESTAMP DEFAULT -1)").unwrap();
    assert!(ddl[0].sql.contains("DEFAULT -1"), "{}", ddl[0].sql);
}

/// Found by `fuzz_ddl_parse_apply_and_replay` in CI (SLUICE_FUZZ_SEED=271805097, execution
/// 279): the literal `'\'''` (a backslash and a quote) was accepted, and sqlparser prints it
/// back as `'\''`, an unterminated string — the text kept in the log would not parse. A
/// statement whose printed text parses differently is now refused by name; an ordinary
/// backslash in a literal still round-trips.
#[test]
fn a_literal_that_prints_back_differently_is_refused() {
    const INPUT: &str = r#"CREATE TABLE""(""INTEGER PRIMARY KEY,""TEXT DEFAULT'\''')"#;
    match parse_ddl(INPUT) {
        Err(SqlError::Unsupported(m)) => assert!(m.contains("parses differently"), "{m}"),
        other => panic!("expected the statement to be refused, got {other:?}"),
    }
    let ddl =
        parse_ddl(r"CREATE TABLE p (id INTEGER PRIMARY KEY, d TEXT DEFAULT 'C:\dir\')").unwrap();
    assert!(ddl[0].sql.contains(r"DEFAULT 'C:\dir\'"), "{}", ddl[0].sql);
    parse_ddl(&ddl[0].sql).expect("its printed text parses again");
}
