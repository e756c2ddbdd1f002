//! `sluice-query`: one-shot SQL `SELECT`s over the in-memory [`Db`].
//!
//! Responsible for: parsing a query (sqlparser), refusing what is outside the supported
//! subset with a message naming the construct, planning it once ([`prepare`] → [`Plan`]:
//! column positions, index and primary-key access paths, join probes), and executing a plan
//! against one consistent `Db` state ([`Plan::execute`]) with SQLite's NULL, comparison and
//! ordering rules. Not responsible for: waiting for confirmation or HTTP (the server runs a
//! plan under `Core::read`), and not (yet) for live, incremental maintenance — that engine
//! is meant to reuse [`Expr`] evaluation and the planner's [`Select`] unchanged.
//!
//! Supported: `SELECT` columns, `*`, `t.*`, expressions (`+ - * / % ||`, comparisons,
//! `AND/OR/NOT`, `IN (…)`, `BETWEEN`, `LIKE`, `IS [NOT] NULL`), aliases, parameters `$n` or
//! `:name`; `[INNER|LEFT] JOIN … ON a = b [AND …]` several tables deep; uncorrelated
//! `IN (SELECT …)` nested up to [`SUBQUERY_DEPTH_MAX`]; `GROUP BY` with `COUNT(*)`,
//! `COUNT`, `SUM`, `MIN`, `MAX`, `AVG` and `HAVING`; `ORDER BY … [ASC|DESC] [NULLS
//! FIRST|LAST]`, `LIMIT n [OFFSET m]`. Unquoted identifiers are folded to lower case.
//!
//! # Layout
//! - [`expr`]: compiled expressions ([`Expr`]) and their evaluation (SQLite semantics).
//! - [`plan`]: the plan types ([`Plan`], [`Select`], [`Access`], [`Join`], [`Aggregate`])
//!   and the planner from the sqlparser AST.
//! - `exec`: running a [`Select`]: access path, joins, filter, grouping, sort, limit.
//! - [`error`]: the [`QueryError`] type.

pub mod error;
mod exec;
pub mod expr;
pub mod plan;
pub mod rules;
pub mod script;

use std::collections::BTreeMap;

use serde_json::Value as Json;
use sluice_engine::{Db, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Whitespace};

pub use error::QueryError;
pub use exec::{
    evaluate, evaluate_anchor, index_range, sort_cmp, sort_value_cmp, subquery_values, to_key,
    window, Keyed,
};
pub use expr::Expr;
pub use plan::{Access, Aggregate, Join, Plan, Select, SUBQUERY_DEPTH_MAX};

/// Longest query text accepted, in bytes.
pub const SQL_BYTES_MAX: usize = 64 * 1024;
/// Most rows one result may have (after `LIMIT`).
pub const ROWS_MAX: usize = 100_000;
/// Most rows a query may hold between its scan/joins and grouping (bounds memory).
pub const JOINED_ROWS_MAX: usize = 1_000_000;

/// The rows of a query.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryResult {
    /// Output column names, unique within the result.
    pub columns: Vec<String>,
    /// Each output column's type, when the plan knows it ([`plan::Select::output_types`]).
    pub types: Vec<Option<sluice_engine::ColumnType>>,
    pub rows: Vec<Vec<Value>>,
}

/// Parameter values for one execution.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Params {
    #[default]
    None,
    /// `$1` is `[0]`.
    Positional(Vec<Value>),
    /// By name, without the `:`.
    Named(BTreeMap<String, Value>),
}

impl Params {
    /// From the JSON of a request: absent/`null`, an array (positional) or an object (named).
    pub fn from_json(json: Option<&Json>) -> Result<Params, QueryError> {
        let value = |j: &Json| -> Result<Value, QueryError> {
            Ok(match j {
                Json::Null => Value::Null,
                Json::Bool(b) => Value::Boolean(*b),
                Json::Number(n) => match n.as_i64() {
                    Some(i) => Value::Integer(i),
                    None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
                },
                Json::String(s) => Value::Text(s.as_str().into()),
                _ => {
                    return Err(QueryError::BadRequest(
                        "a parameter must be null, a boolean, a number or a string".into(),
                    ))
                }
            })
        };
        match json {
            None | Some(Json::Null) => Ok(Params::None),
            Some(Json::Array(a)) => Ok(Params::Positional(
                a.iter().map(value).collect::<Result<_, _>>()?,
            )),
            Some(Json::Object(m)) => Ok(Params::Named(
                m.iter()
                    .map(|(k, v)| Ok((k.strip_prefix(':').unwrap_or(k).to_string(), value(v)?)))
                    .collect::<Result<_, QueryError>>()?,
            )),
            Some(_) => Err(QueryError::BadRequest(
                "\"params\" must be an array ($1, $2, …) or an object (:name)".into(),
            )),
        }
    }
}

/// Parses and plans one `SELECT` against the current schema of `db`.
pub fn prepare(sql: &str, db: &Db) -> Result<Plan, QueryError> {
    prepare_as(sql, db, false)
}

/// [`prepare`]; with `client`, every table the query reads (in `FROM`, joins and
/// subqueries) is read through its `SELECT` policies, whose `auth.<claim>` references
/// become parameters after the query's own ([`Plan::resolve_as`] binds them), so callers
/// with the same claims share one plan and one live view.
pub fn prepare_as(sql: &str, db: &Db, client: bool) -> Result<Plan, QueryError> {
    if sql.len() > SQL_BYTES_MAX {
        return Err(QueryError::Limit(format!(
            "the query text is {} bytes; sql_bytes_max is {SQL_BYTES_MAX}",
            sql.len()
        )));
    }
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| QueryError::Syntax(e.to_string()))?;
    let own = own_params(&tokens);
    let statements = Parser::new(&dialect)
        .with_tokens_with_locations(sqlite_is(tokens))
        .parse_statements()
        .map_err(|e| QueryError::Syntax(e.to_string()))?;
    let statement = match statements.as_slice() {
        [] => return Err(QueryError::Syntax("no SQL statement given".into())),
        [one] => one,
        _ => return Err(QueryError::unsupported("several statements in one query")),
    };
    let mut planner = plan::Planner::new(db);
    planner.client = client;
    planner.params.claim_base = own;
    let select = planner.statement(statement)?;
    // The claims' slots must come after every parameter of the query's own: never let a
    // miscount alias a claim with a parameter.
    let planned = planner.params.positional.max(planner.params.names.len());
    if !planner.params.claims.is_empty() && planned > own {
        return Err(QueryError::unsupported(
            "this combination of parameters in a query read through row policies",
        ));
    }
    let mut text = statement.to_string();
    if client {
        // A client's view of a query is not the admin's: they must not share a view.
        text.push_str(" /* rules */");
    }
    Ok(Plan {
        select,
        params: planner.params,
        text,
    })
}

/// How many parameter values the query's own text takes: its highest `$n`, or its number
/// of distinct `:name`s.
pub(crate) fn own_params(tokens: &[TokenWithSpan]) -> usize {
    let mut positional = 0usize;
    let mut names: Vec<&str> = Vec::new();
    let mut add = |name| {
        if !names.contains(&name) {
            names.push(name);
        }
    };
    // `:name` is tokenized as `:` then a word (the parser joins them); counting a `:` before
    // a word that is not a parameter only leaves a slot unused.
    for (i, t) in tokens.iter().enumerate() {
        match &t.token {
            Token::Placeholder(p) => {
                if let Some(n) = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                    positional = positional.max(n);
                } else if let Some(name) = p.strip_prefix(':') {
                    add(name);
                }
            }
            Token::Colon => {
                if let Some(Token::Word(w)) = tokens.get(i + 1).map(|t| &t.token) {
                    add(w.value.as_str());
                }
            }
            _ => {}
        }
    }
    positional.max(names.len())
}

/// A claim as a SQL value: strings, numbers, booleans and null are themselves; arrays,
/// objects and missing claims are NULL.
pub fn claim_value(claim: Option<&Json>) -> Value {
    match claim {
        Some(Json::String(s)) => Value::Text(s.as_str().into()),
        Some(Json::Number(n)) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        Some(Json::Bool(b)) => Value::Boolean(*b),
        _ => Value::Null,
    }
}

/// SQLite's `a IS b` and `a IS NOT b` for any operand `b` (`=` / `<>` that treat two NULLs
/// as equal): sqlparser parses only `IS [NOT] NULL / TRUE / FALSE / DISTINCT FROM …`, so
/// any other `IS [NOT] b` is respelt `IS [NOT] DISTINCT FROM b`, which means the same.
pub(crate) fn sqlite_is(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let keyword = |t: &TokenWithSpan| match &t.token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.keyword),
        _ => None,
    };
    let next = |tokens: &[TokenWithSpan], from: usize| {
        (from..tokens.len()).find(|&i| !matches!(tokens[i].token, Token::Whitespace(_)))
    };
    // Words sqlparser itself accepts after `IS [NOT]`.
    const KNOWN: [Keyword; 11] = [
        Keyword::NULL,
        Keyword::TRUE,
        Keyword::FALSE,
        Keyword::UNKNOWN,
        Keyword::DISTINCT,
        Keyword::JSON,
        Keyword::NORMALIZED,
        Keyword::NFC,
        Keyword::NFD,
        Keyword::NFKC,
        Keyword::NFKD,
    ];
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        out.push(t.clone());
        i += 1;
        if keyword(t) != Some(Keyword::IS) {
            continue;
        }
        let span = t.span;
        let word = |k: &str| TokenWithSpan::new(Token::make_keyword(k), span);
        let space = || TokenWithSpan::new(Token::Whitespace(Whitespace::Space), span);
        let Some(j) = next(&tokens, i) else { continue };
        let negated = keyword(&tokens[j]) == Some(Keyword::NOT);
        let operand = if negated {
            next(&tokens, j + 1)
        } else {
            Some(j)
        };
        let Some(k) = operand else { continue };
        if keyword(&tokens[k]).is_some_and(|kw| KNOWN.contains(&kw)) {
            continue;
        }
        if !negated {
            out.extend([space(), word("NOT")]);
        }
        out.extend([space(), word("DISTINCT"), space(), word("FROM"), space()]);
        i = if negated { j + 1 } else { j };
    }
    out
}

impl Plan {
    /// Runs the plan against `db` (which **must** not change during the call).
    pub fn execute(&self, db: &Db, params: &Params) -> Result<QueryResult, QueryError> {
        self.execute_as(db, params, None)
    }

    /// [`Plan::execute`] for a caller with `claims` (a client), binding the claims its
    /// policies read.
    pub fn execute_as(
        &self,
        db: &Db,
        params: &Params,
        claims: Option<&serde_json::Map<String, Json>>,
    ) -> Result<QueryResult, QueryError> {
        let values = self.resolve_as(params, claims)?;
        let rows = exec::run(&self.select, db, &values)?;
        Ok(QueryResult {
            columns: self.select.columns.clone(),
            types: self.select.output_types(),
            rows,
        })
    }

    /// [`Plan::resolve`], then the values of the claims the policies read.
    pub fn resolve_as(
        &self,
        params: &Params,
        claims: Option<&serde_json::Map<String, Json>>,
    ) -> Result<Vec<Value>, QueryError> {
        let mut values = self.resolve(params)?;
        if self.params.claims.is_empty() {
            return Ok(values);
        }
        let Some(claims) = claims else {
            return Err(QueryError::BadRequest(
                "the query was planned for a client but no claims were given".into(),
            ));
        };
        values.resize(self.params.claim_base, Value::Null);
        values.extend(
            self.params
                .claims
                .iter()
                .map(|c| claim_value(claims.get(c))),
        );
        Ok(values)
    }

    /// The parameter values in the order [`Expr::Param`] indexes them.
    pub fn resolve(&self, params: &Params) -> Result<Vec<Value>, QueryError> {
        let spec = &self.params;
        match params {
            Params::None | Params::Positional(_) if !spec.names.is_empty() => {
                Err(QueryError::BadRequest(format!(
                    "the query uses named parameters (:{}); pass \"params\" as an object",
                    spec.names.join(", :")
                )))
            }
            Params::None if spec.positional > 0 => Err(QueryError::BadRequest(format!(
                "the query uses {} parameter(s) ($1…${}); none given",
                spec.positional, spec.positional
            ))),
            Params::None => Ok(Vec::new()),
            Params::Positional(v) => {
                if v.len() != spec.positional {
                    return Err(QueryError::BadRequest(format!(
                        "the query uses {} positional parameter(s); {} given",
                        spec.positional,
                        v.len()
                    )));
                }
                Ok(v.clone())
            }
            Params::Named(m) => {
                if spec.positional > 0 {
                    return Err(QueryError::BadRequest(format!(
                        "the query uses positional parameters ($1…${}); pass \"params\" as an array",
                        spec.positional
                    )));
                }
                if let Some(extra) = m.keys().find(|k| !spec.names.contains(k)) {
                    return Err(QueryError::BadRequest(format!(
                        "unknown parameter :{extra}"
                    )));
                }
                spec.names
                    .iter()
                    .map(|n| {
                        m.get(n).cloned().ok_or_else(|| {
                            QueryError::BadRequest(format!("missing parameter :{n}"))
                        })
                    })
                    .collect()
            }
        }
    }
}

/// Prepares and executes in one step.
pub fn query(sql: &str, db: &Db, params: &Params) -> Result<QueryResult, QueryError> {
    prepare(sql, db)?.execute(db, params)
}
