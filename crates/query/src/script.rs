//! `POST /v1/sql` scripts: several `;`-separated statements run as one transaction.
//!
//! [`Script::parse`] tokenizes and parses the text once and sorts its statements into
//! schema statements (DDL, handled by `sluice_sql`) and data statements (`SELECT`, `INSERT`,
//! `UPDATE`, `DELETE`). [`Script::run`] plans and runs the data statements one after another
//! against an open transaction, so each sees the writes of those before it: an `UPDATE` or
//! `DELETE` is planned as the `SELECT` of its target rows (through the caller's read
//! policies) and then written row by row through the transaction, like a mutate's ops.

use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value as Json};
use sluice_engine::{
    key_from_json, Change, ColumnType, Db, TableSchema, Tx, TxError, Value, WriteResult,
};
use sqlparser::ast::{
    self, AssignmentTarget, ConflictTarget, FromTable, OnConflictAction, OnInsert, SelectItem,
    SetExpr, Statement, TableObject, TableWithJoins,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Tokenizer;

use crate::{plan, Params, Plan, QueryError, QueryResult, SQL_BYTES_MAX};

/// What a statement of a script is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Select,
    Insert,
    Update,
    Delete,
    /// Anything else: a schema statement for `sluice_sql::parse_ddl`.
    Ddl,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Select => "select",
            Kind::Insert => "insert",
            Kind::Update => "update",
            Kind::Delete => "delete",
            Kind::Ddl => "ddl",
        }
    }
}

/// A parsed script.
#[derive(Clone, Debug)]
pub struct Script {
    statements: Vec<Statement>,
    kinds: Vec<Kind>,
    /// Parameters the script's own text takes (shared by every statement).
    own_params: usize,
}

/// The outcome of one data statement.
#[derive(Clone, Debug)]
pub enum Outcome {
    Rows(QueryResult),
    Written {
        kind: Kind,
        results: Vec<WriteResult>,
    },
}

/// Why a script failed: which statement, and the error.
#[derive(Debug)]
pub struct Failed<E> {
    pub statement: usize,
    pub error: E,
}

impl Script {
    pub fn parse(sql: &str) -> Result<Script, QueryError> {
        if sql.len() > SQL_BYTES_MAX {
            return Err(QueryError::Limit(format!(
                "the SQL text is {} bytes; sql_bytes_max is {SQL_BYTES_MAX}",
                sql.len()
            )));
        }
        let dialect = GenericDialect {};
        let tokens = Tokenizer::new(&dialect, sql)
            .tokenize_with_location()
            .map_err(|e| QueryError::Syntax(e.to_string()))?;
        let own_params = crate::own_params(&tokens);
        let statements = Parser::new(&dialect)
            .with_tokens_with_locations(crate::sqlite_is(tokens))
            .parse_statements()
            .map_err(|e| QueryError::Syntax(e.to_string()))?;
        if statements.is_empty() {
            return Err(QueryError::Syntax("no SQL statement given".into()));
        }
        let kinds = statements
            .iter()
            .map(|s| match s {
                Statement::Query(_) => Kind::Select,
                Statement::Insert(_) => Kind::Insert,
                Statement::Update(_) => Kind::Update,
                Statement::Delete(_) => Kind::Delete,
                _ => Kind::Ddl,
            })
            .collect();
        Ok(Script {
            statements,
            kinds,
            own_params,
        })
    }

    pub fn kinds(&self) -> &[Kind] {
        &self.kinds
    }

    /// Only schema statements.
    pub fn is_ddl(&self) -> bool {
        self.kinds.iter().all(|k| *k == Kind::Ddl)
    }

    /// Only `SELECT`s.
    pub fn is_read_only(&self) -> bool {
        self.kinds.iter().all(|k| *k == Kind::Select)
    }

    /// The first schema statement of a script that also has data statements (they cannot
    /// share a transaction).
    pub fn mixed_ddl(&self) -> Option<usize> {
        if self.is_ddl() {
            return None;
        }
        self.kinds.iter().position(|k| *k == Kind::Ddl)
    }

    /// Runs every `SELECT` of a read-only script against `db`.
    pub fn read(
        &self,
        db: &Db,
        params: &Params,
        claims: Option<&Map<String, Json>>,
    ) -> Result<Vec<QueryResult>, Failed<QueryError>> {
        self.check_params(params).map_err(|error| Failed {
            statement: 0,
            error,
        })?;
        self.statements
            .iter()
            .enumerate()
            .map(|(i, s)| {
                self.select(s, db, claims.is_some())
                    .and_then(|plan| execute(plan, db, params, claims))
                    .map_err(|error| Failed {
                        statement: i,
                        error,
                    })
            })
            .collect()
    }

    /// Runs the data statements in `tx`, in order. `check(db, change, statement)` sees every
    /// row change as it is made (a client's write rules); `rows_max` bounds the rows
    /// written (`--max-ops`). On error the caller drops `tx`, which undoes everything.
    pub fn run<E>(
        &self,
        tx: &mut Tx<'_>,
        params: &Params,
        claims: Option<&Map<String, Json>>,
        rows_max: usize,
        check: &mut dyn FnMut(&Db, &Change, usize) -> Result<(), E>,
    ) -> Result<Vec<Outcome>, Failed<E>>
    where
        E: From<QueryError> + From<TxError>,
    {
        self.check_params(params).map_err(|e| Failed {
            statement: 0,
            error: e.into(),
        })?;
        let mut outcomes = Vec::with_capacity(self.statements.len());
        let mut written = 0usize;
        for (i, s) in self.statements.iter().enumerate() {
            let at = |error: E| Failed {
                statement: i,
                error,
            };
            let before = tx.changes().len();
            let mut run = Run {
                tx: &mut *tx,
                params,
                claims,
                own_params: self.own_params,
                written: &mut written,
                rows_max,
            };
            let outcome = match (s, self.kinds[i]) {
                (_, Kind::Select) => {
                    let db = run.tx.db();
                    let result = self
                        .select(s, db, claims.is_some())
                        .and_then(|plan| execute(plan, db, params, claims))
                        .map_err(|e| at(e.into()))?;
                    Outcome::Rows(result)
                }
                (Statement::Insert(insert), _) => run.insert(insert).map_err(at)?,
                (Statement::Update(update), _) => run.update(update).map_err(at)?,
                (Statement::Delete(delete), _) => run.delete(delete).map_err(at)?,
                _ => return Err(at(QueryError::unsupported(
                    "schema statements and data statements in one request; send them separately",
                )
                .into())),
            };
            for change in &tx.changes()[before..] {
                check(tx.db(), change, i).map_err(at)?;
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// The parameters are shared by every statement: their number must match the script's.
    fn check_params(&self, params: &Params) -> Result<(), QueryError> {
        match params {
            Params::Positional(v) if v.len() != self.own_params => {
                Err(QueryError::BadRequest(format!(
                    "the statements use {} positional parameter(s) ($1…${}); {} given",
                    self.own_params,
                    self.own_params,
                    v.len()
                )))
            }
            Params::Named(m) if m.len() > self.own_params => Err(QueryError::BadRequest(format!(
                "{} named parameters given; the statements use {}",
                m.len(),
                self.own_params
            ))),
            _ => Ok(()),
        }
    }

    fn select(&self, s: &Statement, db: &Db, client: bool) -> Result<Plan, QueryError> {
        plan_statement(s, db, client, self.own_params, None)
    }
}

/// Plans one `SELECT` statement (or one built for a write).
fn plan_statement(
    s: &Statement,
    db: &Db,
    client: bool,
    own_params: usize,
    excluded: Option<(Arc<TableSchema>, Vec<Value>)>,
) -> Result<Plan, QueryError> {
    let mut planner = plan::Planner::new(db);
    planner.client = client;
    planner.params.claim_base = own_params;
    planner.excluded = excluded;
    let select = planner.statement(s)?;
    let planned = planner.params.positional.max(planner.params.names.len());
    if !planner.params.claims.is_empty() && planned > own_params {
        return Err(QueryError::unsupported(
            "this combination of parameters in a query read through row policies",
        ));
    }
    Ok(Plan {
        select,
        params: planner.params,
        text: String::new(),
    })
}

/// Runs one statement's plan with the script's parameters: a statement may use fewer of
/// them than the script gives.
fn execute(
    mut plan: Plan,
    db: &Db,
    params: &Params,
    claims: Option<&Map<String, Json>>,
) -> Result<QueryResult, QueryError> {
    let params = match params {
        Params::Positional(v) => {
            // Claims sit after every parameter of the script's (`claim_base`), as planned.
            plan.params.positional = plan.params.positional.max(v.len());
            return plan.execute_as(db, params, claims);
        }
        Params::Named(m) => Params::Named(
            m.iter()
                .filter(|(k, _)| plan.params.names.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        Params::None => Params::None,
    };
    plan.execute_as(db, &params, claims)
}

/// `SELECT <projection> [FROM <from>] [WHERE <selection>]` as a statement to plan.
fn select_statement(
    projection: Vec<SelectItem>,
    from: Option<TableWithJoins>,
    selection: Option<ast::Expr>,
) -> Statement {
    let mut statement = template();
    let select = template_select(&mut statement);
    select.projection = projection;
    select.from = from.into_iter().collect();
    select.selection = selection;
    statement
}

/// `FROM <name>`, as a relation to plan.
fn table_ref(name: &ast::ObjectName) -> TableWithJoins {
    let mut statement = template();
    let mut from = template_select(&mut statement)
        .from
        .pop()
        .expect("the template reads FROM t");
    if let ast::TableFactor::Table { name: n, .. } = &mut from.relation {
        *n = name.clone();
    }
    from
}

/// `SELECT 1 FROM t`, parsed once: the statements built for writes are copies of it with
/// their parts replaced.
fn template() -> Statement {
    static TEMPLATE: OnceLock<Statement> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            Parser::parse_sql(&GenericDialect {}, "SELECT 1 FROM t")
                .expect("a constant statement parses")
                .pop()
                .expect("one statement")
        })
        .clone()
}

fn template_select(statement: &mut Statement) -> &mut ast::Select {
    let Statement::Query(q) = statement else {
        unreachable!("SELECT parses as a query")
    };
    let SetExpr::Select(select) = q.body.as_mut() else {
        unreachable!("SELECT parses as a select")
    };
    select
}

fn column_item(name: &str) -> SelectItem {
    SelectItem::UnnamedExpr(ast::Expr::Identifier(ast::Ident::with_quote('"', name)))
}

/// One statement's run inside the transaction.
struct Run<'r, 'tx> {
    tx: &'r mut Tx<'tx>,
    params: &'r Params,
    claims: Option<&'r Map<String, Json>>,
    own_params: usize,
    written: &'r mut usize,
    rows_max: usize,
}

impl Run<'_, '_> {
    /// Plans `statement` (a `SELECT`) against the transaction's state and runs it.
    fn query(
        &self,
        statement: &Statement,
        excluded: Option<(Arc<TableSchema>, Vec<Value>)>,
    ) -> Result<Vec<Vec<Value>>, QueryError> {
        let db = self.tx.db();
        let plan = plan_statement(
            statement,
            db,
            self.claims.is_some(),
            self.own_params,
            excluded,
        )?;
        Ok(execute(plan, db, self.params, self.claims)?.rows)
    }

    fn schema(&self, table: &str) -> Result<Arc<TableSchema>, QueryError> {
        let t = self
            .tx
            .db()
            .tables
            .get(table)
            .ok_or_else(|| QueryError::NotFound(format!("no table named {table:?}")))?;
        Ok(t.schema.clone())
    }

    fn count_row(&mut self) -> Result<(), QueryError> {
        *self.written += 1;
        if *self.written > self.rows_max {
            return Err(QueryError::Limit(format!(
                "the request writes more than {} rows; --max-ops is {}",
                self.rows_max, self.rows_max
            )));
        }
        Ok(())
    }

    fn insert<E: From<QueryError> + From<TxError>>(
        &mut self,
        insert: &ast::Insert,
    ) -> Result<Outcome, E> {
        if insert.returning.is_some() {
            return Err(QueryError::unsupported("RETURNING").into());
        }
        if insert.or.is_some() || insert.ignore || insert.replace_into {
            return Err(QueryError::unsupported(
                "INSERT OR …; use ON CONFLICT … DO NOTHING / DO UPDATE",
            )
            .into());
        }
        let TableObject::TableName(name) = &insert.table else {
            return Err(QueryError::unsupported("INSERT INTO a table function").into());
        };
        let table = plan::object_name(name)?;
        let schema = self.schema(&table)?;
        let rows = match insert.source.as_deref().map(|q| q.body.as_ref()) {
            Some(SetExpr::Values(v)) => &v.rows,
            Some(_) => {
                return Err(QueryError::unsupported("INSERT … SELECT; use VALUES").into());
            }
            None => return Err(QueryError::unsupported("INSERT without VALUES").into()),
        };
        // The target columns, by position in the table.
        let columns: Vec<usize> = if insert.columns.is_empty() {
            (0..schema.columns.len()).collect()
        } else {
            insert
                .columns
                .iter()
                .map(|c| {
                    let c = plan::object_name(c)?;
                    schema
                        .columns
                        .iter()
                        .position(|col| col.name == c)
                        .ok_or_else(|| {
                            QueryError::Schema(format!("no column named {c:?} in table {table:?}"))
                        })
                })
                .collect::<Result<_, _>>()?
        };
        for (n, c) in columns.iter().enumerate() {
            if columns[..n].contains(c) {
                return Err(QueryError::Schema(format!(
                    "column {:?} is named twice",
                    schema.columns[*c].name
                ))
                .into());
            }
        }
        let action = match &insert.on {
            None => None,
            Some(OnInsert::OnConflict(c)) => {
                match &c.conflict_target {
                    None => {}
                    Some(ConflictTarget::Columns(cols))
                        if cols.len() == 1
                            && plan::ident(&cols[0]) == schema.columns[schema.pk].name => {}
                    Some(_) => {
                        return Err(QueryError::unsupported(format!(
                            "ON CONFLICT on anything but the primary key ({})",
                            schema.columns[schema.pk].name
                        ))
                        .into())
                    }
                }
                Some(&c.action)
            }
            Some(_) => return Err(QueryError::unsupported("ON DUPLICATE KEY UPDATE").into()),
        };

        // Every VALUES row is evaluated by one planned `SELECT e1, e2, …` without FROM (its
        // expressions are constants and parameters), before any row is written.
        let mut projection = Vec::with_capacity(rows.len() * columns.len());
        for row in rows {
            let exprs = &row.content;
            if exprs.len() != columns.len() {
                return Err(QueryError::Schema(format!(
                    "a VALUES row has {} values for {} columns",
                    exprs.len(),
                    columns.len()
                ))
                .into());
            }
            projection.extend(exprs.iter().map(|e| SelectItem::UnnamedExpr(e.clone())));
        }
        let evaluated = self
            .query(&select_statement(projection, None, None), None)?
            .pop()
            .expect("a SELECT without FROM or WHERE has one row");
        let mut results = Vec::with_capacity(rows.len());
        // A table has at least its key column, so `columns` is never empty.
        for values in evaluated.chunks(columns.len()) {
            let mut object = Map::with_capacity(columns.len());
            for (c, v) in columns.iter().zip(values) {
                let col = &schema.columns[*c];
                object.insert(col.name.clone(), column_json(col.ty, v));
            }
            let existing = match (action, object.get(&schema.columns[schema.pk].name)) {
                (Some(_), Some(id)) => {
                    let key = key_from_json(&schema, id)?;
                    self.tx.get(&table, &key)?.is_some().then(|| id.clone())
                }
                _ => None,
            };
            match (action, existing) {
                (Some(OnConflictAction::DoNothing), Some(_)) => {}
                (Some(OnConflictAction::DoUpdate(update)), Some(id)) => {
                    // Rows its `WHERE` leaves out stay as they are (PostgreSQL's rule).
                    // The proposed row as the table would store it, for `excluded.<column>`.
                    let proposed: Vec<Value> = schema
                        .columns
                        .iter()
                        .enumerate()
                        .map(|(c, col)| match columns.iter().position(|x| *x == c) {
                            Some(n) => values[n].clone(),
                            None => col.default.clone().unwrap_or(Value::Null),
                        })
                        .collect();
                    let relation = table_ref(name);
                    let pk = ast::Expr::Identifier(ast::Ident::with_quote(
                        '"',
                        schema.columns[schema.pk].name.clone(),
                    ));
                    let key_literal = literal(
                        &values[columns
                            .iter()
                            .position(|c| *c == schema.pk)
                            .expect("the key was given")],
                    );
                    let mut selection = ast::Expr::BinaryOp {
                        left: Box::new(pk),
                        op: ast::BinaryOperator::Eq,
                        right: Box::new(key_literal),
                    };
                    // As in PostgreSQL, an upsert may update only a row its caller can read.
                    let readable = self.query(
                        &select_statement(
                            vec![column_item(&schema.columns[schema.pk].name)],
                            Some(relation.clone()),
                            Some(selection.clone()),
                        ),
                        None,
                    )?;
                    if readable.is_empty() {
                        return Err(TxError::new(
                            sluice_engine::ErrorCode::AlreadyExists,
                            format!(
                                "a row with key {id} exists in {table:?}, and this caller cannot read it to update it (ON CONFLICT DO UPDATE)"
                            ),
                        )
                        .into());
                    }
                    if let Some(w) = &update.selection {
                        selection = ast::Expr::BinaryOp {
                            left: Box::new(selection),
                            op: ast::BinaryOperator::And,
                            right: Box::new(ast::Expr::Nested(Box::new(w.clone()))),
                        };
                    }
                    let written = self.assign::<E>(
                        &table,
                        &schema,
                        relation,
                        &update.assignments,
                        Some(selection),
                        Some((schema.clone(), proposed)),
                    )?;
                    results.extend(written);
                }
                _ => {
                    self.count_row()?;
                    results.push(self.tx.insert(&table, &object, None)?);
                }
            }
        }
        Ok(Outcome::Written {
            kind: Kind::Insert,
            results,
        })
    }

    fn update<E: From<QueryError> + From<TxError>>(
        &mut self,
        update: &ast::Update,
    ) -> Result<Outcome, E> {
        if update.returning.is_some() || update.output.is_some() {
            return Err(QueryError::unsupported("RETURNING").into());
        }
        if update.from.is_some() {
            return Err(QueryError::unsupported("UPDATE … FROM").into());
        }
        if update.or.is_some() {
            return Err(QueryError::unsupported("UPDATE OR …").into());
        }
        if !update.order_by.is_empty() || update.limit.is_some() {
            return Err(QueryError::unsupported("UPDATE … ORDER BY / LIMIT").into());
        }
        if !update.table.joins.is_empty() {
            return Err(QueryError::unsupported("UPDATE of a join").into());
        }
        let ast::TableFactor::Table { name, .. } = &update.table.relation else {
            return Err(QueryError::unsupported("UPDATE of something other than a table").into());
        };
        let table = plan::object_name(name)?;
        let schema = self.schema(&table)?;
        let results = self.assign::<E>(
            &table,
            &schema,
            update.table.clone(),
            &update.assignments,
            update.selection.clone(),
            None,
        )?;
        Ok(Outcome::Written {
            kind: Kind::Update,
            results,
        })
    }

    /// Sets `assignments` on the rows of `relation` that `selection` picks (as the caller
    /// reads them).
    fn assign<E: From<QueryError> + From<TxError>>(
        &mut self,
        table: &str,
        schema: &Arc<TableSchema>,
        relation: TableWithJoins,
        assignments: &[ast::Assignment],
        selection: Option<ast::Expr>,
        excluded: Option<(Arc<TableSchema>, Vec<Value>)>,
    ) -> Result<Vec<WriteResult>, E> {
        let pk_name = &schema.columns[schema.pk].name;
        let mut targets = Vec::with_capacity(assignments.len());
        let mut types = Vec::with_capacity(assignments.len());
        let mut projection = vec![column_item(pk_name)];
        for a in assignments {
            let AssignmentTarget::ColumnName(c) = &a.target else {
                return Err(QueryError::unsupported("SET (a, b) = (…)").into());
            };
            // `SET t.a = …` names the column with its table (or alias).
            let c = match c.0.as_slice() {
                [.., last] => last
                    .as_ident()
                    .map(plan::ident)
                    .ok_or_else(|| QueryError::unsupported(format!("column name {c}")))?,
                [] => return Err(QueryError::Syntax("an empty column name".into()).into()),
            };
            if !schema.columns.iter().any(|col| col.name == c) {
                return Err(QueryError::Schema(format!(
                    "no column named {c:?} in table {table:?}"
                ))
                .into());
            }
            if c == *pk_name {
                return Err(TxError::new(
                    sluice_engine::ErrorCode::BadRequest,
                    format!(
                        "SET may not name the primary key {c:?}: delete the row and insert it with its new key"
                    ),
                )
                .into());
            }
            if targets.contains(&c) {
                return Err(QueryError::Schema(format!("column {c:?} is set twice")).into());
            }
            types.push(
                schema
                    .columns
                    .iter()
                    .find(|col| col.name == c)
                    .expect("checked above")
                    .ty,
            );
            targets.push(c);
            projection.push(SelectItem::UnnamedExpr(a.value.clone()));
        }
        let rows = self.query(
            &select_statement(projection, Some(relation), selection),
            excluded,
        )?;
        let mut results = Vec::with_capacity(rows.len());
        for row in rows {
            self.count_row()?;
            let id = row[0].to_json();
            let mut set = Map::with_capacity(targets.len());
            for ((c, ty), v) in targets.iter().zip(&types).zip(&row[1..]) {
                set.insert(c.clone(), column_json(*ty, v));
            }
            results.push(self.tx.patch(table, &id, &set, None)?);
        }
        Ok(results)
    }

    fn delete<E: From<QueryError> + From<TxError>>(
        &mut self,
        delete: &ast::Delete,
    ) -> Result<Outcome, E> {
        if delete.returning.is_some() || delete.output.is_some() {
            return Err(QueryError::unsupported("RETURNING").into());
        }
        if delete.using.is_some() || !delete.tables.is_empty() {
            return Err(QueryError::unsupported("DELETE … USING / multi-table DELETE").into());
        }
        if !delete.order_by.is_empty() || delete.limit.is_some() {
            return Err(QueryError::unsupported("DELETE … ORDER BY / LIMIT").into());
        }
        let from = match &delete.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let [relation] = from.as_slice() else {
            return Err(QueryError::unsupported("DELETE from several tables").into());
        };
        if !relation.joins.is_empty() {
            return Err(QueryError::unsupported("DELETE of a join").into());
        }
        let ast::TableFactor::Table { name, .. } = &relation.relation else {
            return Err(QueryError::unsupported("DELETE from something other than a table").into());
        };
        let table = plan::object_name(name)?;
        let schema = self.schema(&table)?;
        let rows = self.query(
            &select_statement(
                vec![column_item(&schema.columns[schema.pk].name)],
                Some(relation.clone()),
                delete.selection.clone(),
            ),
            None,
        )?;
        let mut results = Vec::with_capacity(rows.len());
        for row in rows {
            self.count_row()?;
            results.push(self.tx.delete(&table, &row[0].to_json(), None)?);
        }
        Ok(Outcome::Written {
            kind: Kind::Delete,
            results,
        })
    }
}

/// A value computed by SQL as the JSON a write takes for a column of type `ty`: SQL's
/// `TRUE`/`FALSE` are the integers 1/0 (as in SQLite), which a BOOLEAN column takes as
/// booleans.
fn column_json(ty: ColumnType, v: &Value) -> Json {
    match (ty, v) {
        (ColumnType::Boolean, Value::Integer(i @ (0 | 1))) => Json::Bool(*i == 1),
        _ => v.to_json(),
    }
}

/// A value as a SQL literal (the key of an upsert's conflicting row).
fn literal(v: &Value) -> ast::Expr {
    let value = match v {
        Value::Integer(i) | Value::Timestamp(i) => ast::Value::Number(i.to_string(), false),
        Value::Text(s) => ast::Value::SingleQuotedString(s.to_string()),
        other => ast::Value::SingleQuotedString(other.to_json().to_string()),
    };
    ast::Expr::Value(value.with_empty_span())
}
