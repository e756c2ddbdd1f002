//! `sluice-sql`: SQL text into Sluice's own structures.
//!
//! Today: DDL (`CREATE TABLE`, `CREATE INDEX`, `DROP TABLE`, `ALTER TABLE … ADD COLUMN`)
//! into [`SchemaChange`]s, parsed with `sqlparser`. The live-query planner will live here
//! too. Not responsible for applying anything: the engine validates and applies.
//!
//! Unquoted identifiers are folded to lower case (as in PostgreSQL); quoted ones are kept.

use sluice_engine::{
    ColumnDef, ColumnType, PolicyCommand, PolicyDef, SchemaChange, TableSchema, Value,
};
use sqlparser::ast::{
    self, AlterTableOperation, ColumnOption, Expr, ObjectName, ObjectType, Statement,
    TableConstraint, UnaryOperator,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

/// Why SQL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlError {
    /// The text does not parse.
    #[error("SQL syntax error: {0}")]
    Syntax(String),
    /// It parses, but uses something Sluice does not support; the message names it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Supported syntax with a meaning Sluice rejects (bad type, two primary keys, …).
    #[error("{0}")]
    Schema(String),
}

/// One parsed DDL statement with its SQL text (as normalised by the parser).
#[derive(Debug, Clone, PartialEq)]
pub struct Ddl {
    pub change: SchemaChange,
    pub sql: String,
}

/// Parses one or more `;`-separated DDL statements.
pub fn parse_ddl(sql: &str) -> Result<Vec<Ddl>, SqlError> {
    let statements =
        Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| SqlError::Syntax(e.to_string()))?;
    if statements.is_empty() {
        return Err(SqlError::Syntax("no SQL statement given".into()));
    }
    statements
        .into_iter()
        .map(|s| {
            let text = s.to_string();
            // The normalised text is what the log keeps and `/v1/changes` shows, so it must
            // mean the statement that was applied. sqlparser prints a few things back in a
            // form its own tokenizer reads differently (a quote right after a backslash in a
            // string literal is written unescaped); such a statement is refused, not stored
            // as text that says something else.
            let prints_back = Parser::parse_sql(&GenericDialect {}, &text).ok().as_deref()
                == Some(std::slice::from_ref(&s));
            let change = statement(s)?;
            if !prints_back {
                return Err(SqlError::Unsupported(format!(
                    "this statement, printed back, reads `{text}`, which parses differently; \
                     a string literal with a backslash right before a quote is one such case"
                )));
            }
            Ok(Ddl { change, sql: text })
        })
        .collect()
}

fn statement(s: Statement) -> Result<SchemaChange, SqlError> {
    match s {
        Statement::CreateTable(ct) => create_table(ct),
        Statement::CreateIndex(ci) => {
            if ci.unique {
                return Err(SqlError::Unsupported("CREATE UNIQUE INDEX".into()));
            }
            if ci.predicate.is_some() {
                return Err(SqlError::Unsupported("partial indexes (CREATE INDEX … WHERE)".into()));
            }
            let table = object_name(&ci.table_name)?;
            let name = match &ci.name {
                Some(n) => object_name(n)?,
                None => return Err(SqlError::Schema("CREATE INDEX needs an index name".into())),
            };
            let columns = ci
                .columns
                .iter()
                .map(|c| match &c.column.expr {
                    Expr::Identifier(id) => Ok(ident(id)),
                    other => Err(SqlError::Unsupported(format!(
                        "index on expression {other}; index plain columns"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(SchemaChange::CreateIndex {
                table,
                name,
                columns,
                if_not_exists: ci.if_not_exists,
            })
        }
        Statement::Drop {
            object_type: ObjectType::Table,
            if_exists,
            names,
            ..
        } => {
            if names.len() != 1 {
                return Err(SqlError::Unsupported(
                    "DROP TABLE of several tables at once".into(),
                ));
            }
            Ok(SchemaChange::DropTable {
                name: object_name(&names[0])?,
                if_exists,
            })
        }
        Statement::AlterTable(at) => {
            let table = object_name(&at.name)?;
            if at.operations.len() != 1 {
                return Err(SqlError::Unsupported(
                    "ALTER TABLE with several operations".into(),
                ));
            }
            match at.operations.into_iter().next().expect("one") {
                AlterTableOperation::AddColumn { column_def, .. } => {
                    let (column, pk) = column(&column_def)?;
                    if pk {
                        return Err(SqlError::Schema(
                            "ALTER TABLE … ADD COLUMN cannot add a PRIMARY KEY".into(),
                        ));
                    }
                    Ok(SchemaChange::AddColumn { table, column })
                }
                other => Err(SqlError::Unsupported(format!(
                    "ALTER TABLE operation {other}; only ADD COLUMN is supported"
                ))),
            }
        }
        Statement::CreatePolicy(cp) => create_policy(cp),
        Statement::DropPolicy(dp) => {
            if dp.drop_behavior.is_some() {
                return Err(SqlError::Unsupported("DROP POLICY … CASCADE/RESTRICT".into()));
            }
            Ok(SchemaChange::DropPolicy {
                table: object_name(&dp.table_name)?,
                name: ident(&dp.name),
                if_exists: dp.if_exists,
            })
        }
        other => Err(SqlError::Unsupported(format!(
            "statement {:?} in DDL; supported: CREATE TABLE, CREATE INDEX, DROP TABLE, ALTER TABLE … ADD COLUMN, CREATE POLICY, DROP POLICY",
            first_words(&other.to_string())
        ))),
    }
}

/// `CREATE POLICY name ON table [AS PERMISSIVE] [FOR cmd] [TO public] [USING (…)] [WITH CHECK (…)]`.
/// The predicates are kept as text; the query crate compiles and checks them.
fn create_policy(cp: ast::CreatePolicy) -> Result<SchemaChange, SqlError> {
    if matches!(cp.policy_type, Some(ast::CreatePolicyType::Restrictive)) {
        return Err(SqlError::Unsupported(
            "AS RESTRICTIVE policies; policies are permissive (any one allows)".into(),
        ));
    }
    if let Some(to) = &cp.to {
        let public = to.len() == 1 && to[0].to_string().eq_ignore_ascii_case("public");
        if !public {
            return Err(SqlError::Unsupported(
                "CREATE POLICY … TO <role>; there are no roles, rules read the caller's claims (auth.<claim>)".into(),
            ));
        }
    }
    let command = match cp.command {
        None | Some(ast::CreatePolicyCommand::All) => PolicyCommand::All,
        Some(ast::CreatePolicyCommand::Select) => PolicyCommand::Select,
        Some(ast::CreatePolicyCommand::Insert) => PolicyCommand::Insert,
        Some(ast::CreatePolicyCommand::Update) => PolicyCommand::Update,
        Some(ast::CreatePolicyCommand::Delete) => PolicyCommand::Delete,
    };
    let name = ident(&cp.name);
    match command {
        PolicyCommand::Select | PolicyCommand::Delete if cp.with_check.is_some() => {
            return Err(SqlError::Schema(format!(
                "policy {name:?}: WITH CHECK cannot be given for FOR {} (it has no new row)",
                command.as_str().to_uppercase()
            )))
        }
        PolicyCommand::Insert if cp.using.is_some() => {
            return Err(SqlError::Schema(format!(
                "policy {name:?}: USING cannot be given for FOR INSERT (it has no old row); use WITH CHECK"
            )))
        }
        _ => {}
    }
    if cp.using.is_none() && cp.with_check.is_none() {
        return Err(SqlError::Schema(format!(
            "policy {name:?} needs USING (…) or WITH CHECK (…)"
        )));
    }
    Ok(SchemaChange::CreatePolicy {
        table: object_name(&cp.table_name)?,
        policy: PolicyDef {
            name,
            command,
            using: cp.using.map(|e| e.to_string()),
            check: cp.with_check.map(|e| e.to_string()),
        },
    })
}

fn first_words(s: &str) -> String {
    s.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

fn ident(id: &ast::Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

fn object_name(name: &ObjectName) -> Result<String, SqlError> {
    match name.0.as_slice() {
        [part] => match part.as_ident() {
            Some(id) => Ok(ident(id)),
            None => Err(SqlError::Unsupported(format!("name {name}"))),
        },
        _ => Err(SqlError::Unsupported(format!(
            "qualified name {name}; Sluice has one namespace"
        ))),
    }
}

fn create_table(ct: ast::CreateTable) -> Result<SchemaChange, SqlError> {
    if ct.query.is_some() {
        return Err(SqlError::Unsupported("CREATE TABLE … AS SELECT".into()));
    }
    if ct.temporary {
        return Err(SqlError::Unsupported("CREATE TEMPORARY TABLE".into()));
    }
    let name = object_name(&ct.name)?;
    let mut columns = Vec::with_capacity(ct.columns.len());
    let mut pk: Option<usize> = None;
    let set_pk = |i: usize, pk: &mut Option<usize>| -> Result<(), SqlError> {
        if pk.is_some() {
            return Err(SqlError::Schema(format!(
                "table {name:?} declares more than one primary key"
            )));
        }
        *pk = Some(i);
        Ok(())
    };
    for (i, def) in ct.columns.iter().enumerate() {
        let (col, is_pk) = column(def)?;
        if is_pk {
            set_pk(i, &mut pk)?;
        }
        columns.push(col);
    }
    for c in &ct.constraints {
        match c {
            TableConstraint::PrimaryKey(p) => {
                let [col] = p.columns.as_slice() else {
                    return Err(SqlError::Unsupported(
                        "composite primary keys; use one INTEGER or TEXT column".into(),
                    ));
                };
                let Expr::Identifier(id) = &col.column.expr else {
                    return Err(SqlError::Unsupported("primary key on an expression".into()));
                };
                let col_name = ident(id);
                let i = columns
                    .iter()
                    .position(|c| c.name == col_name)
                    .ok_or_else(|| {
                        SqlError::Schema(format!("primary key names unknown column {col_name:?}"))
                    })?;
                set_pk(i, &mut pk)?;
            }
            other => {
                return Err(SqlError::Unsupported(format!("table constraint {other}")));
            }
        }
    }
    let pk = pk.ok_or_else(|| {
        SqlError::Schema(format!(
            "table {name:?} needs a PRIMARY KEY column (INTEGER or TEXT)"
        ))
    })?;
    columns[pk].not_null = true;
    Ok(SchemaChange::CreateTable {
        schema: TableSchema {
            name,
            columns,
            pk,
            indexes: Vec::new(),
        },
        if_not_exists: ct.if_not_exists,
    })
}

fn column_type(dt: &ast::DataType) -> Result<ColumnType, SqlError> {
    let text = dt.to_string().to_uppercase();
    let word = text.split(['(', ' ']).next().unwrap_or("");
    Ok(match word {
        "INT" | "INTEGER" | "BIGINT" | "SMALLINT" | "TINYINT" | "INT8" | "INT4" | "INT64" => {
            ColumnType::Integer
        }
        "REAL" | "DOUBLE" | "FLOAT" | "FLOAT8" | "FLOAT4" | "FLOAT64" => ColumnType::Real,
        "BOOL" | "BOOLEAN" => ColumnType::Boolean,
        "TEXT" | "VARCHAR" | "CHAR" | "STRING" | "CHARACTER" => ColumnType::Text,
        "BLOB" | "BYTEA" | "BYTES" => ColumnType::Blob,
        "JSON" | "JSONB" => ColumnType::Json,
        "TIMESTAMP" | "DATETIME" | "TIMESTAMPTZ" => ColumnType::Timestamp,
        _ => {
            return Err(SqlError::Unsupported(format!(
                "column type {text}; use INTEGER, REAL, BOOLEAN, TEXT, BLOB, JSON or TIMESTAMP"
            )))
        }
    })
}

/// A column definition, and whether it is declared `PRIMARY KEY`.
fn column(def: &ast::ColumnDef) -> Result<(ColumnDef, bool), SqlError> {
    let name = ident(&def.name);
    let ty = column_type(&def.data_type)?;
    let mut not_null = false;
    let mut default = None;
    let mut pk = false;
    for opt in &def.options {
        match &opt.option {
            ColumnOption::NotNull => not_null = true,
            ColumnOption::Null => not_null = false,
            ColumnOption::Default(expr) => default = Some(literal(expr, ty, &name)?),
            ColumnOption::PrimaryKey(_) => pk = true,
            other => {
                return Err(SqlError::Unsupported(format!(
                    "column option {other} on column {name:?}"
                )))
            }
        }
    }
    Ok((
        ColumnDef {
            name,
            ty,
            not_null,
            default,
        },
        pk,
    ))
}

/// A `DEFAULT` literal, typed for its column.
fn literal(expr: &Expr, ty: ColumnType, column: &str) -> Result<Value, SqlError> {
    let bad = || {
        SqlError::Schema(format!(
            "DEFAULT for column {column:?} must be a {ty} literal, not {expr}"
        ))
    };
    let json = match expr {
        Expr::Value(v) => match &v.value {
            ast::Value::Null => serde_json::Value::Null,
            ast::Value::Boolean(b) => serde_json::Value::Bool(*b),
            ast::Value::Number(n, _) => serde_json::from_str(&n.to_string()).map_err(|_| bad())?,
            ast::Value::SingleQuotedString(s) => {
                if ty == ColumnType::Json {
                    serde_json::from_str(s).map_err(|_| bad())?
                } else {
                    serde_json::Value::String(s.clone())
                }
            }
            _ => return Err(bad()),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr: inner,
        } if matches!(&**inner, Expr::Value(_)) => match literal(inner, ty, column)? {
            Value::Integer(i) => return Ok(Value::Integer(-i)),
            Value::Real(r) => return Ok(Value::Real(-r)),
            Value::Timestamp(t) => return Ok(Value::Timestamp(-t)),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let json = match (ty, json) {
        (ColumnType::Boolean, serde_json::Value::Number(n)) if n.as_i64() == Some(0) => {
            serde_json::Value::Bool(false)
        }
        (ColumnType::Boolean, serde_json::Value::Number(n)) if n.as_i64() == Some(1) => {
            serde_json::Value::Bool(true)
        }
        (_, j) => j,
    };
    Value::from_json(ty, &json).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_table_with_all_types_and_defaults() {
        let ddl = parse_ddl(
            "CREATE TABLE IF NOT EXISTS Msgs (id INTEGER PRIMARY KEY, room TEXT NOT NULL, score REAL DEFAULT -1.5, \
             ok BOOLEAN DEFAULT true, data BLOB, meta JSON DEFAULT '{\"a\":1}', ts TIMESTAMP DEFAULT 0)",
        )
        .unwrap();
        let SchemaChange::CreateTable {
            schema,
            if_not_exists,
        } = &ddl[0].change
        else {
            panic!()
        };
        assert!(if_not_exists);
        assert_eq!(schema.name, "msgs");
        assert_eq!(schema.pk, 0);
        assert!(schema.columns[0].not_null);
        assert_eq!(schema.columns[2].default, Some(Value::Real(-1.5)));
        assert_eq!(schema.columns[3].default, Some(Value::Boolean(true)));
        assert_eq!(
            schema.columns[5].default,
            Some(Value::Json("{\"a\":1}".into()))
        );
    }

    #[test]
    fn table_level_primary_key_and_errors() {
        let ddl = parse_ddl("CREATE TABLE t (a TEXT, b INT, PRIMARY KEY (a))").unwrap();
        let SchemaChange::CreateTable { schema, .. } = &ddl[0].change else {
            panic!()
        };
        assert_eq!(schema.pk, 0);
        assert!(matches!(
            parse_ddl("CREATE TABLE t (a INT)"),
            Err(SqlError::Schema(_))
        ));
        assert!(matches!(
            parse_ddl("CREATE TABLE t (a INT PRIMARY KEY, b DECIMAL)"),
            Err(SqlError::Unsupported(_))
        ));
        assert!(matches!(
            parse_ddl("CREATE TABLE"),
            Err(SqlError::Syntax(_))
        ));
        assert!(matches!(
            parse_ddl("SELECT 1"),
            Err(SqlError::Unsupported(_))
        ));
    }

    #[test]
    fn index_drop_and_alter() {
        let ddl = parse_ddl(
            "CREATE INDEX by_room ON msgs (room, ts); DROP TABLE IF EXISTS old; ALTER TABLE msgs ADD COLUMN n INTEGER NOT NULL DEFAULT 0",
        )
        .unwrap();
        assert_eq!(
            ddl[0].change,
            SchemaChange::CreateIndex {
                table: "msgs".into(),
                name: "by_room".into(),
                columns: vec!["room".into(), "ts".into()],
                if_not_exists: false
            }
        );
        assert_eq!(
            ddl[1].change,
            SchemaChange::DropTable {
                name: "old".into(),
                if_exists: true
            }
        );
        let SchemaChange::AddColumn { column, .. } = &ddl[2].change else {
            panic!()
        };
        assert_eq!(column.default, Some(Value::Integer(0)));
    }
}
