//! The plan types and the planner: a parsed `SELECT` → [`Select`].
//!
//! A plan refers to tables by name and to columns by position; it keeps the schema it was
//! planned against and execution refuses to run it against a changed schema.

use std::sync::Arc;

use sluice_engine::{ColumnType, Db, TableSchema, Value};
use sqlparser::ast::{
    self, BinaryOperator, Distinct, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr,
    JoinConstraint, JoinOperator, LimitClause, ObjectName, OrderByKind, OrderBySort, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, SetOperator, Statement, TableFactor, UnaryOperator,
};

use crate::expr::{Affinity, BinOp, Expr, UnOp};
use crate::QueryError;

/// `IN (SELECT …)` subqueries nest at most this deep.
pub const SUBQUERY_DEPTH_MAX: usize = 3;

/// One table read by a [`Select`]; its columns sit at `offset..offset + schema.columns.len()`
/// of the joined row.
#[derive(Clone, Debug)]
pub struct Source {
    pub schema: Arc<TableSchema>,
    /// The alias, or the table name.
    pub binding: String,
    pub offset: usize,
}

/// How the first table's candidate rows are found. Candidates are a superset of the rows
/// that pass the filter: the filter is always applied afterwards.
#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    Scan,
    /// `pk = value`.
    Key(Expr),
    /// `low <= pk <= high` (either side may be open).
    KeyRange {
        low: Option<Expr>,
        high: Option<Expr>,
    },
    /// `indexed_col = value` on the first column of `schema.indexes[index]`.
    IndexEq {
        index: usize,
        value: Expr,
    },
    /// `low <= indexed_col <= high` on the first column of `schema.indexes[index]`.
    IndexRange {
        index: usize,
        low: Option<Expr>,
        high: Option<Expr>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
}

/// How the right side of a join is probed for one left row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The right join column is the primary key.
    PrimaryKey,
    /// The right join column is the first column of `schema.indexes[i]`.
    Index(usize),
    /// No index: an ordered map of the right side, built once per execution.
    Hashed,
}

/// `… JOIN sources[source] ON left_key = right.column [AND residual]`.
#[derive(Clone, Debug)]
pub struct Join {
    pub kind: JoinKind,
    pub source: usize,
    /// Evaluated against the joined row so far.
    pub left_key: Expr,
    /// Column position inside the right table.
    pub right_column: usize,
    /// An affinity the comparison applies to the right column's values (a TEXT column
    /// joined to a numeric one): then the probe is [`Probe::Hashed`] on the converted values.
    pub right_affinity: Option<Affinity>,
    pub probe: Probe,
    /// Other `ON` conjuncts, evaluated against the joined row including the right side.
    pub residual: Option<Expr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggFunc {
    CountStar,
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AggSpec {
    pub func: AggFunc,
    /// Evaluated against the joined row; `None` for `COUNT(*)`.
    pub arg: Option<Expr>,
}

/// `GROUP BY` (or an aggregate without it: one group). Expressions after grouping are
/// evaluated with `row` = the group's key values and `aggs` = the aggregates' values.
#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    pub keys: Vec<Expr>,
    pub aggs: Vec<AggSpec>,
    pub having: Option<Expr>,
}

#[derive(Clone, Debug)]
pub enum SortExpr {
    /// An output column (by alias or ordinal).
    Output(usize),
    /// An expression in the projection's context.
    Expr(Expr),
}

#[derive(Clone, Debug)]
pub struct SortKey {
    pub expr: SortExpr,
    pub desc: bool,
    /// `None`: SQLite's default (NULLs sort as the smallest value).
    pub nulls_first: Option<bool>,
}

/// One planned `SELECT`.
#[derive(Clone, Debug)]
pub struct Select {
    pub sources: Vec<Source>,
    pub access: Access,
    pub joins: Vec<Join>,
    /// `WHERE` conjuncts that read only the first table (checked before joining).
    pub base_filter: Option<Expr>,
    /// The other `WHERE` conjuncts (checked after joining).
    pub filter: Option<Expr>,
    pub aggregate: Option<Aggregate>,
    pub projection: Vec<Expr>,
    /// Output column names, unique (a repeated name gets a `:2`, `:3`, … suffix).
    pub columns: Vec<String>,
    pub order_by: Vec<SortKey>,
    pub limit: Option<Expr>,
    pub offset: Option<Expr>,
    /// Uncorrelated `IN (SELECT …)` subqueries, indexed by [`Expr::InSubquery`].
    pub subqueries: Vec<Select>,
}

impl Select {
    /// The type of each output column when the plan knows it: a table column's declared
    /// type (also through `MIN`/`MAX` of one, or a `GROUP BY` key that is one), INTEGER for
    /// `COUNT`; `None` when each value says its own (expressions, `SUM`, `AVG`).
    pub fn output_types(&self) -> Vec<Option<ColumnType>> {
        let column_type = |i: usize| {
            self.sources.iter().find_map(|s| {
                (i >= s.offset && i < s.offset + s.schema.columns.len())
                    .then(|| s.schema.columns[i - s.offset].ty)
            })
        };
        let bare = |e: &Expr| match e {
            Expr::Column(i) => column_type(*i),
            _ => None,
        };
        self.projection
            .iter()
            .map(|e| match (&self.aggregate, e) {
                (None, e) => bare(e),
                (Some(agg), Expr::Column(k)) => agg.keys.get(*k).and_then(bare),
                (Some(agg), Expr::Agg(a)) => {
                    let spec = agg.aggs.get(*a)?;
                    match spec.func {
                        AggFunc::CountStar | AggFunc::Count => Some(ColumnType::Integer),
                        AggFunc::Min | AggFunc::Max => spec.arg.as_ref().and_then(bare),
                        AggFunc::Sum | AggFunc::Avg => None,
                    }
                }
                _ => None,
            })
            .collect()
    }
}

/// The output types as the protocol names them (`"integer"`, …, or `null`).
pub fn types_json(types: &[Option<ColumnType>]) -> serde_json::Value {
    serde_json::Value::Array(
        types
            .iter()
            .map(|t| match t {
                Some(t) => serde_json::Value::from(t.as_str().to_ascii_lowercase()),
                None => serde_json::Value::Null,
            })
            .collect(),
    )
}

/// The parameters a query uses: `$1…$n` or `:name`s (not both).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamSpec {
    /// Highest `$n` used.
    pub positional: usize,
    /// `:name`s in first-use order; `Expr::Param(i)` is `names[i]`.
    pub names: Vec<String>,
    /// The caller's claims the row policies read (`auth.<claim>`), in first-use order;
    /// `Expr::Param(claim_base + i)` is `claims[i]`. Empty unless planned for a client.
    pub claims: Vec<String>,
    /// Where claim parameters start: after every parameter of the query's own text.
    pub claim_base: usize,
}

/// A prepared query.
#[derive(Clone, Debug)]
pub struct Plan {
    pub select: Select,
    pub params: ParamSpec,
    /// The statement as sqlparser prints it back: the same for texts that differ only in
    /// whitespace or keyword case (live views are shared by it).
    pub text: String,
}

pub(crate) fn ident(id: &ast::Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

pub(crate) fn object_name(name: &ObjectName) -> Result<String, QueryError> {
    match name.0.as_slice() {
        [part] => match part.as_ident() {
            Some(id) => Ok(ident(id)),
            None => Err(QueryError::unsupported(format!("name {name}"))),
        },
        _ => Err(QueryError::unsupported(format!(
            "qualified name {name}; Sluice has one namespace"
        ))),
    }
}

/// Columns visible to an expression.
#[derive(Clone, Debug, Default)]
struct Scope {
    sources: Vec<Source>,
}

impl Scope {
    fn width(&self) -> usize {
        self.sources
            .last()
            .map_or(0, |s| s.offset + s.schema.columns.len())
    }

    fn resolve(&self, table: Option<&str>, column: &str) -> Result<Option<usize>, QueryError> {
        let mut found = None;
        for s in &self.sources {
            if table.is_some_and(|t| t != s.binding) {
                continue;
            }
            if let Some(c) = s.schema.column(column) {
                if found.is_some() {
                    return Err(QueryError::Schema(format!(
                        "ambiguous column name {column:?}; qualify it with a table name or alias"
                    )));
                }
                found = Some(s.offset + c);
            }
        }
        if found.is_none() {
            if let Some(t) = table {
                if !self.sources.iter().any(|s| s.binding == t) {
                    return Ok(None);
                }
            }
        }
        Ok(found)
    }

    fn has_binding(&self, t: &str) -> bool {
        self.sources.iter().any(|s| s.binding == t)
    }
}

/// Where an expression is compiled.
enum Mode {
    /// Against a joined row; aggregates are refused.
    Rows,
    /// After grouping: group keys and aggregates (collected here).
    Groups { keys: Vec<Expr>, aggs: Vec<AggSpec> },
}

pub(crate) struct Planner<'a> {
    db: &'a Db,
    pub(crate) params: ParamSpec,
    /// Scopes of the enclosing queries (to name correlated references).
    outer: Vec<Scope>,
    /// Set when an aggregate was met in `Mode::Rows`.
    saw_aggregate: bool,
    /// Select-list aliases a bare name may stand for (while compiling GROUP BY and HAVING;
    /// as in SQLite, a column of that name wins).
    aliases: Vec<(String, ast::Expr)>,
    /// Planning for a client: every table is read through its `SELECT` policies.
    pub(crate) client: bool,
    /// Set while a policy predicate is compiled: `auth.<claim>` reads the caller's claim.
    in_policy: bool,
    /// `INSERT … ON CONFLICT DO UPDATE`: `excluded.<column>` is the proposed row's value.
    pub(crate) excluded: Option<(Arc<TableSchema>, Vec<Value>)>,
}

const AGGREGATES: [&str; 5] = ["count", "sum", "min", "max", "avg"];

impl<'a> Planner<'a> {
    pub(crate) fn new(db: &'a Db) -> Self {
        Planner {
            db,
            params: ParamSpec::default(),
            outer: Vec::new(),
            saw_aggregate: false,
            aliases: Vec::new(),
            client: false,
            in_policy: false,
            excluded: None,
        }
    }

    /// The OR of the predicates of `source`'s policies for `op` — their `USING`, or with
    /// `check` their `WITH CHECK` (a policy without one uses its `USING`) — compiled against
    /// the joined row; FALSE when no policy applies (deny by default).
    /// The OR of `source`'s policies for `op` (`WITH CHECK` when `check`), compiled in the
    /// query being planned: their `IN (SELECT …)` subqueries (`FOR SELECT` policies only)
    /// join `subs`, the subqueries of the select being planned, at nesting `depth`.
    pub(crate) fn policy_filter(
        &mut self,
        source: &Source,
        op: sluice_engine::PolicyCommand,
        check: bool,
        subs: &mut Vec<Select>,
        depth: usize,
    ) -> Result<(Expr, Vec<String>), QueryError> {
        let table = self.db.tables.get(&source.schema.name).ok_or_else(|| {
            QueryError::NotFound(format!("no table named {:?}", source.schema.name))
        })?;
        let mut names = Vec::new();
        let mut filter: Option<Expr> = None;
        for p in table.policies.iter().filter(|p| p.command.covers(op)) {
            names.push(p.name.clone());
            let text = if check {
                p.check.as_ref().or(p.using.as_ref())
            } else {
                p.using.as_ref()
            };
            let Some(text) = text else { continue };
            let e = self.policy_expr(text, source, subs, depth).map_err(|e| {
                QueryError::Schema(format!(
                    "policy {:?} on {:?}: {e}",
                    p.name, source.schema.name
                ))
            })?;
            filter = Some(match filter {
                None => e,
                Some(f) => Expr::Binary(BinOp::Or, Box::new(f), Box::new(e)),
            });
        }
        Ok((filter.unwrap_or(Expr::Literal(Value::Integer(0))), names))
    }

    /// One policy predicate over `source`'s columns (named bare or by the table's name,
    /// whatever the query's alias) and the caller's claims; no outer names. Its uncorrelated
    /// `IN (SELECT …)` subqueries are pushed onto `subs` (planned for the same caller, so
    /// they read through their own tables' policies).
    pub(crate) fn policy_expr(
        &mut self,
        text: &str,
        source: &Source,
        subs: &mut Vec<Select>,
        depth: usize,
    ) -> Result<Expr, QueryError> {
        let dialect = sqlparser::dialect::GenericDialect {};
        let ast = sqlparser::parser::Parser::new(&dialect)
            .try_with_sql(text)
            .and_then(|mut p| p.parse_expr())
            .map_err(|e| QueryError::Syntax(e.to_string()))?;
        let scope = Scope {
            sources: vec![Source {
                binding: source.schema.name.clone(),
                ..source.clone()
            }],
        };
        let outer = std::mem::take(&mut self.outer);
        let aliases = std::mem::take(&mut self.aliases);
        let saw = self.saw_aggregate;
        let in_policy = std::mem::replace(&mut self.in_policy, true);
        let compiled = self.expr(&ast, &scope, &mut Mode::Rows, subs, depth);
        self.in_policy = in_policy;
        self.outer = outer;
        self.aliases = aliases;
        self.saw_aggregate = saw;
        compiled
    }

    /// `auth.<name>`: the caller's claim, a parameter after the query's own.
    fn claim(&mut self, name: String) -> Expr {
        let i = match self.params.claims.iter().position(|c| *c == name) {
            Some(i) => i,
            None => {
                self.params.claims.push(name);
                self.params.claims.len() - 1
            }
        };
        Expr::Param(self.params.claim_base + i)
    }

    pub(crate) fn statement(&mut self, s: &Statement) -> Result<Select, QueryError> {
        match s {
            Statement::Query(q) => self.query(q, 0),
            other => {
                let text = other.to_string();
                let words: Vec<&str> = text.split_whitespace().take(2).collect();
                Err(QueryError::unsupported(format!(
                    "statement {}; only SELECT is supported",
                    words.join(" ")
                )))
            }
        }
    }

    fn query(&mut self, q: &ast::Query, depth: usize) -> Result<Select, QueryError> {
        if q.with.is_some() {
            return Err(QueryError::unsupported("WITH (common table expressions)"));
        }
        if q.fetch.is_some() {
            return Err(QueryError::unsupported("FETCH"));
        }
        if !q.locks.is_empty() {
            return Err(QueryError::unsupported("FOR UPDATE / FOR SHARE"));
        }
        if q.for_clause.is_some() || q.settings.is_some() || q.format_clause.is_some() {
            return Err(QueryError::unsupported("dialect-specific query clauses"));
        }
        if !q.pipe_operators.is_empty() {
            return Err(QueryError::unsupported("pipe operators"));
        }
        let select = match q.body.as_ref() {
            SetExpr::Select(s) => s,
            SetExpr::SetOperation { op, .. } => {
                return Err(QueryError::unsupported(match op {
                    SetOperator::Union => "UNION".to_string(),
                    SetOperator::Except => "EXCEPT".to_string(),
                    SetOperator::Intersect => "INTERSECT".to_string(),
                    other => format!("set operation {other}"),
                }))
            }
            SetExpr::Values(_) => return Err(QueryError::unsupported("VALUES")),
            SetExpr::Query(_) => return Err(QueryError::unsupported("parenthesized query")),
            _ => return Err(QueryError::unsupported("statement in a query")),
        };
        self.select(select, q, depth)
    }

    fn select(
        &mut self,
        s: &ast::Select,
        q: &ast::Query,
        depth: usize,
    ) -> Result<Select, QueryError> {
        match &s.distinct {
            None | Some(Distinct::All) => {}
            Some(_) => return Err(QueryError::unsupported("SELECT DISTINCT")),
        }
        if s.top.is_some() {
            return Err(QueryError::unsupported("TOP"));
        }
        if s.into.is_some() {
            return Err(QueryError::unsupported("SELECT INTO"));
        }
        if !s.lateral_views.is_empty() {
            return Err(QueryError::unsupported("LATERAL VIEW"));
        }
        if s.prewhere.is_some() {
            return Err(QueryError::unsupported("PREWHERE"));
        }
        if s.qualify.is_some() || !s.named_window.is_empty() {
            return Err(QueryError::unsupported("window functions"));
        }
        if !s.connect_by.is_empty() {
            return Err(QueryError::unsupported("CONNECT BY"));
        }
        if !s.cluster_by.is_empty() || !s.distribute_by.is_empty() || !s.sort_by.is_empty() {
            return Err(QueryError::unsupported("CLUSTER/DISTRIBUTE/SORT BY"));
        }
        // No FROM: one row of constants (`SELECT 1 + 2`).
        let from = match s.from.as_slice() {
            [] => None,
            [one] => Some(one),
            _ => {
                return Err(QueryError::unsupported(
                    "comma joins (FROM a, b); use JOIN … ON",
                ))
            }
        };

        // FROM and JOINs.
        let mut scope = Scope::default();
        if let Some(from) = from {
            self.add_source(&mut scope, &from.relation)?;
        }
        let mut joins = Vec::new();
        // Uncorrelated `IN (SELECT …)` subqueries: of WHERE, the select list, and the
        // policies folded in for a client.
        let mut subqueries = Vec::new();
        for j in from.map_or(&[][..], |f| &f.joins) {
            if j.global {
                return Err(QueryError::unsupported("GLOBAL JOIN"));
            }
            let (kind, constraint) = match &j.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => (JoinKind::Inner, c),
                JoinOperator::Left(c) | JoinOperator::LeftOuter(c) => (JoinKind::Left, c),
                JoinOperator::Right(_) | JoinOperator::RightOuter(_) => {
                    return Err(QueryError::unsupported("RIGHT JOIN"))
                }
                JoinOperator::FullOuter(_) => return Err(QueryError::unsupported("FULL JOIN")),
                JoinOperator::CrossJoin(_) => return Err(QueryError::unsupported("CROSS JOIN")),
                _ => return Err(QueryError::unsupported("this kind of JOIN")),
            };
            let on = match constraint {
                JoinConstraint::On(e) => e,
                JoinConstraint::Using(_) => {
                    return Err(QueryError::unsupported("JOIN … USING; use JOIN … ON a = b"))
                }
                JoinConstraint::Natural => return Err(QueryError::unsupported("NATURAL JOIN")),
                JoinConstraint::None => {
                    return Err(QueryError::unsupported("JOIN without ON"));
                }
            };
            let left_width = scope.width();
            self.add_source(&mut scope, &j.relation)?;
            let source = scope.sources.len() - 1;
            let mut subs = Vec::new();
            let on = self.expr(on, &scope, &mut Mode::Rows, &mut subs, depth)?;
            if !subs.is_empty() {
                return Err(QueryError::unsupported("subqueries in JOIN … ON"));
            }
            let mut join = self.join(kind, source, &scope, left_width, on)?;
            if self.client {
                // Part of the match, not of WHERE: a LEFT JOIN sees an unreadable row as absent.
                let (rule, _) = self.policy_filter(
                    &scope.sources[source],
                    sluice_engine::PolicyCommand::Select,
                    false,
                    &mut subqueries,
                    depth,
                )?;
                join.residual = conjoin(join.residual.into_iter().chain([rule]).collect());
            }
            joins.push(join);
        }

        // Is this an aggregate query?
        let group_exprs: &[ast::Expr] = match &s.group_by {
            GroupByExpr::All(_) => return Err(QueryError::unsupported("GROUP BY ALL")),
            GroupByExpr::Expressions(exprs, modifiers) => {
                if !modifiers.is_empty() {
                    return Err(QueryError::unsupported(
                        "GROUP BY modifiers (ROLLUP, CUBE, …)",
                    ));
                }
                exprs
            }
        };
        let order_exprs: Vec<&ast::OrderByExpr> = match &q.order_by {
            None => Vec::new(),
            Some(ob) => {
                if ob.interpolate.is_some() {
                    return Err(QueryError::unsupported("ORDER BY … INTERPOLATE"));
                }
                match &ob.kind {
                    OrderByKind::All(_) => return Err(QueryError::unsupported("ORDER BY ALL")),
                    OrderByKind::Expressions(e) => e.iter().collect(),
                }
            }
        };
        let grouped = !group_exprs.is_empty()
            || s.having.is_some()
            || self.probe_aggregates(s, &order_exprs, &scope, depth);
        if grouped && from.is_none() {
            return Err(QueryError::unsupported(
                "aggregates or GROUP BY without FROM",
            ));
        }

        // WHERE.
        let mut filter = match &s.selection {
            Some(e) => Some(self.expr(e, &scope, &mut Mode::Rows, &mut subqueries, depth)?),
            None => None,
        };
        if let (true, Some(first)) = (self.client, scope.sources.first()) {
            let (rule, _) = self.policy_filter(
                first,
                sluice_engine::PolicyCommand::Select,
                false,
                &mut subqueries,
                depth,
            )?;
            filter = conjoin(filter.into_iter().chain([rule]).collect());
        }

        let aliases: Vec<(String, ast::Expr)> = s
            .projection
            .iter()
            .filter_map(|item| match item {
                SelectItem::ExprWithAlias { expr, alias } => Some((ident(alias), expr.clone())),
                _ => None,
            })
            .collect();
        let mut mode = if grouped {
            self.aliases = aliases.clone();
            let keys = group_exprs
                .iter()
                .map(|e| self.expr(e, &scope, &mut Mode::Rows, &mut subqueries, depth))
                .collect::<Result<Vec<_>, _>>();
            self.aliases.clear();
            let keys = keys?;
            Mode::Groups {
                keys,
                aggs: Vec::new(),
            }
        } else {
            Mode::Rows
        };

        // Projection.
        let mut projection = Vec::new();
        let mut names = Vec::new();
        for item in &s.projection {
            match item {
                SelectItem::UnnamedExpr(e) => {
                    projection.push(self.expr(e, &scope, &mut mode, &mut subqueries, depth)?);
                    names.push(match e {
                        ast::Expr::Identifier(id) => ident(id),
                        ast::Expr::CompoundIdentifier(ids) => {
                            ids.last().map(ident).unwrap_or_default()
                        }
                        other => other.to_string(),
                    });
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    projection.push(self.expr(expr, &scope, &mut mode, &mut subqueries, depth)?);
                    names.push(ident(alias));
                }
                SelectItem::ExprWithAliases { .. } => {
                    return Err(QueryError::unsupported(
                        "multiple aliases for one expression",
                    ))
                }
                SelectItem::Wildcard(opts) | SelectItem::QualifiedWildcard(_, opts) => {
                    if !opts.to_string().trim().is_empty() {
                        return Err(QueryError::unsupported(format!("wildcard options{opts}")));
                    }
                    let only = match item {
                        SelectItem::QualifiedWildcard(
                            SelectItemQualifiedWildcardKind::ObjectName(n),
                            _,
                        ) => {
                            let t = object_name(n)?;
                            if !scope.has_binding(&t) {
                                return Err(QueryError::Schema(format!(
                                    "no table or alias named {t:?} in this query"
                                )));
                            }
                            Some(t)
                        }
                        SelectItem::QualifiedWildcard(..) => {
                            return Err(QueryError::unsupported("expression wildcard"))
                        }
                        _ => None,
                    };
                    for src in &scope.sources {
                        if only.as_ref().is_some_and(|t| *t != src.binding) {
                            continue;
                        }
                        for (c, col) in src.schema.columns.iter().enumerate() {
                            let e = self.column_in_mode(src.offset + c, &col.name, &mut mode)?;
                            projection.push(e);
                            names.push(col.name.clone());
                        }
                    }
                }
            }
        }

        // HAVING.
        let having = match &s.having {
            Some(e) => {
                self.aliases = aliases;
                let compiled = self.expr(e, &scope, &mut mode, &mut subqueries, depth);
                self.aliases.clear();
                Some(compiled?)
            }
            None => None,
        };

        // ORDER BY.
        let mut order_by = Vec::new();
        for o in order_exprs {
            if o.with_fill.is_some() {
                return Err(QueryError::unsupported("ORDER BY … WITH FILL"));
            }
            let desc = match &o.options.sort {
                None | Some(OrderBySort::Asc) => false,
                Some(OrderBySort::Desc) => true,
                Some(OrderBySort::Using(_)) => {
                    return Err(QueryError::unsupported("ORDER BY … USING"))
                }
            };
            let expr = match &o.expr {
                ast::Expr::Identifier(id)
                    // As in SQLite, an output column name wins over a table column.
                    if names.contains(&ident(id)) =>
                {
                    SortExpr::Output(names.iter().position(|n| *n == ident(id)).expect("found"))
                }
                ast::Expr::Value(v) if matches!(v.value, ast::Value::Number(..)) => {
                    let ast::Value::Number(n, _) = &v.value else {
                        unreachable!()
                    };
                    match n.parse::<usize>() {
                        Ok(i) if (1..=projection.len()).contains(&i) => SortExpr::Output(i - 1),
                        _ => {
                            return Err(QueryError::Schema(format!(
                                "ORDER BY term {n} is out of range: there are {} output columns",
                                projection.len()
                            )))
                        }
                    }
                }
                e => SortExpr::Expr(self.expr(e, &scope, &mut mode, &mut subqueries, depth)?),
            };
            order_by.push(SortKey {
                expr,
                desc,
                nulls_first: o.options.nulls_first,
            });
        }

        // LIMIT / OFFSET: constants or parameters.
        let (limit, offset) = match &q.limit_clause {
            None => (None, None),
            Some(LimitClause::LimitOffset {
                limit,
                offset,
                limit_by,
            }) => {
                if !limit_by.is_empty() {
                    return Err(QueryError::unsupported("LIMIT … BY"));
                }
                (limit.as_ref(), offset.as_ref().map(|o| &o.value))
            }
            Some(LimitClause::OffsetCommaLimit { offset, limit }) => (Some(limit), Some(offset)),
        };
        let empty = Scope::default();
        let mut constant = |e: Option<&ast::Expr>,
                            what: &str|
         -> Result<Option<Expr>, QueryError> {
            let Some(e) = e else { return Ok(None) };
            let mut subs = Vec::new();
            let compiled = self
                .expr(e, &empty, &mut Mode::Rows, &mut subs, depth)
                .map_err(|_| {
                    QueryError::unsupported(format!("{what} {e}; use an integer or a parameter"))
                })?;
            Ok(Some(compiled))
        };
        let limit = constant(limit, "LIMIT")?;
        let offset = constant(offset, "OFFSET")?;

        let aggregate = match mode {
            Mode::Rows => None,
            Mode::Groups { keys, aggs } => Some(Aggregate { keys, aggs, having }),
        };

        // Split WHERE: conjuncts over the first table only run before the joins.
        let base_width = scope.sources.first().map_or(0, |s| s.schema.columns.len());
        let (mut base, mut rest) = (Vec::new(), Vec::new());
        if let Some(f) = filter {
            for c in conjuncts(f) {
                let mut only_base = true;
                c.visit_columns(&mut |i| only_base &= i < base_width);
                if only_base {
                    base.push(c);
                } else {
                    rest.push(c);
                }
            }
        }
        let access = match scope.sources.first() {
            Some(first) => access_path(&first.schema, &base),
            None => Access::Scan,
        };

        Ok(Select {
            sources: scope.sources,
            access,
            joins,
            base_filter: conjoin(base),
            filter: conjoin(rest),
            aggregate,
            projection,
            columns: unique_names(names),
            order_by,
            limit,
            offset,
            subqueries,
        })
    }

    /// Whether the projection or ORDER BY uses an aggregate (compiled on a scratch copy).
    fn probe_aggregates(
        &mut self,
        s: &ast::Select,
        order: &[&ast::OrderByExpr],
        scope: &Scope,
        depth: usize,
    ) -> bool {
        // Planning a nested subquery probes too: keep the enclosing query's flag apart.
        let saved = std::mem::take(&mut self.saw_aggregate);
        let mut scratch = Vec::new();
        let exprs = s
            .projection
            .iter()
            .filter_map(|item| match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
                _ => None,
            })
            .chain(order.iter().map(|o| &o.expr));
        for e in exprs {
            let _ = self.expr(e, scope, &mut Mode::Rows, &mut scratch, depth);
        }
        std::mem::replace(&mut self.saw_aggregate, saved)
    }

    fn add_source(&mut self, scope: &mut Scope, relation: &TableFactor) -> Result<(), QueryError> {
        let (name, alias) = match relation {
            TableFactor::Table {
                name,
                alias,
                args: None,
                with_hints,
                version: None,
                with_ordinality: false,
                partitions,
                ..
            } if with_hints.is_empty() && partitions.is_empty() => (name, alias),
            TableFactor::Table { .. } => {
                return Err(QueryError::unsupported("table functions and table hints"))
            }
            TableFactor::Derived { .. } => return Err(QueryError::unsupported("subquery in FROM")),
            TableFactor::NestedJoin { .. } => {
                return Err(QueryError::unsupported("parenthesized joins"))
            }
            _ => return Err(QueryError::unsupported("this kind of FROM item")),
        };
        let table = object_name(name)?;
        let binding = match alias {
            Some(a) if !a.columns.is_empty() => {
                return Err(QueryError::unsupported("column aliases in FROM"))
            }
            Some(a) => ident(&a.name),
            None => table.clone(),
        };
        let t = self
            .db
            .tables
            .get(&table)
            .ok_or_else(|| QueryError::NotFound(format!("no table named {table:?}")))?;
        if scope.has_binding(&binding) {
            return Err(QueryError::Schema(format!(
                "table name or alias {binding:?} is used twice; give one an alias"
            )));
        }
        let offset = scope.width();
        scope.sources.push(Source {
            schema: t.schema.clone(),
            binding,
            offset,
        });
        Ok(())
    }

    fn join(
        &self,
        kind: JoinKind,
        source: usize,
        scope: &Scope,
        left_width: usize,
        on: Expr,
    ) -> Result<Join, QueryError> {
        let right = &scope.sources[source];
        let (lo, hi) = (right.offset, right.offset + right.schema.columns.len());
        let parts = conjuncts(on);
        // The best equality: right pk, then an indexed right column, then any.
        let mut best: Option<(usize, usize, Expr, Probe, Option<Affinity>)> = None;
        for (i, c) in parts.iter().enumerate() {
            let Expr::Binary(BinOp::Eq, a, b) = c else {
                continue;
            };
            for (r, l) in [(a, b), (b, a)] {
                let (rc, right_affinity) = match &**r {
                    Expr::Column(rc) => (*rc, None),
                    Expr::Affinity(aff, inner) => match **inner {
                        Expr::Column(rc) => (rc, Some(*aff)),
                        _ => continue,
                    },
                    _ => continue,
                };
                if !(lo..hi).contains(&rc) {
                    continue;
                }
                let mut left_only = true;
                l.visit_columns(&mut |x| left_only &= x < left_width);
                if !left_only {
                    continue;
                }
                let col = rc - lo;
                let probe = if right_affinity.is_some() {
                    Probe::Hashed
                } else if col == right.schema.pk {
                    Probe::PrimaryKey
                } else if let Some(ix) = right
                    .schema
                    .indexes
                    .iter()
                    .position(|ix| ix.columns[0] == col)
                {
                    Probe::Index(ix)
                } else {
                    Probe::Hashed
                };
                let rank = match probe {
                    Probe::PrimaryKey => 0,
                    Probe::Index(_) => 1,
                    Probe::Hashed => 2,
                };
                if best.as_ref().is_none_or(|b| rank < probe_rank(b.3)) {
                    best = Some((i, col, (**l).clone(), probe, right_affinity));
                }
            }
        }
        let Some((i, right_column, left_key, probe, right_affinity)) = best else {
            return Err(QueryError::unsupported(
                "JOIN … ON without an equality between a column of the joined table and the tables before it",
            ));
        };
        let residual: Vec<Expr> = parts
            .into_iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, e)| e)
            .collect();
        Ok(Join {
            kind,
            source,
            left_key,
            right_column,
            right_affinity,
            probe,
            residual: conjoin(residual),
        })
    }

    fn column_in_mode(
        &mut self,
        pos: usize,
        name: &str,
        mode: &mut Mode,
    ) -> Result<Expr, QueryError> {
        match mode {
            Mode::Rows => Ok(Expr::Column(pos)),
            Mode::Groups { keys, .. } => match keys.iter().position(|k| *k == Expr::Column(pos)) {
                Some(k) => Ok(Expr::Column(k)),
                None => Err(QueryError::unsupported(format!(
                    "column {name:?} outside GROUP BY and aggregates in a grouped query"
                ))),
            },
        }
    }

    fn expr(
        &mut self,
        e: &ast::Expr,
        scope: &Scope,
        mode: &mut Mode,
        subs: &mut Vec<Select>,
        depth: usize,
    ) -> Result<Expr, QueryError> {
        // After grouping, a whole expression that equals a GROUP BY key reads the key.
        if let Mode::Groups { keys, .. } = mode {
            if !matches!(e, ast::Expr::Function(_)) {
                let saw = self.saw_aggregate;
                let mut scratch = Vec::new();
                let attempt = self.expr(e, scope, &mut Mode::Rows, &mut scratch, depth);
                self.saw_aggregate = saw;
                if let Ok(compiled) = attempt {
                    if let Some(k) = keys.iter().position(|k| *k == compiled) {
                        return Ok(Expr::Column(k));
                    }
                }
            }
        }
        let sub = |p: &mut Self, x: &ast::Expr, mode: &mut Mode, subs: &mut Vec<Select>| {
            p.expr(x, scope, mode, subs, depth).map(Box::new)
        };
        Ok(match e {
            ast::Expr::Identifier(id) => {
                let name = ident(id);
                if scope.resolve(None, &name)?.is_none() {
                    let alias = self.aliases.iter().find(|(n, _)| *n == name);
                    if let Some(aliased) = alias.map(|(_, e)| e.clone()) {
                        // Aliases do not refer to aliases.
                        let saved = std::mem::take(&mut self.aliases);
                        let compiled = self.expr(&aliased, scope, mode, subs, depth);
                        self.aliases = saved;
                        return compiled;
                    }
                }
                let pos = self.column(scope, None, &name)?;
                self.column_in_mode(pos, &name, mode)?
            }
            ast::Expr::CompoundIdentifier(ids) => {
                let [t, c] = ids.as_slice() else {
                    return Err(QueryError::unsupported(format!("qualified name {e}")));
                };
                if self.in_policy && t.quote_style.is_none() && t.value.eq_ignore_ascii_case("auth")
                {
                    return Ok(self.claim(ident(c)));
                }
                let (t, c) = (ident(t), ident(c));
                if let Some((schema, values)) = &self.excluded {
                    if t == "excluded" && !scope.has_binding(&t) {
                        let Some(i) = schema.columns.iter().position(|col| col.name == c) else {
                            return Err(QueryError::Schema(format!(
                                "no column named {c:?} in table {:?} (excluded.{c})",
                                schema.name
                            )));
                        };
                        return Ok(Expr::Literal(values[i].clone()));
                    }
                }
                let pos = self.column(scope, Some(&t), &c)?;
                self.column_in_mode(pos, &format!("{t}.{c}"), mode)?
            }
            ast::Expr::Value(v) => self.literal(&v.value)?,
            ast::Expr::Nested(inner) => return self.expr(inner, scope, mode, subs, depth),
            ast::Expr::UnaryOp { op, expr } => match op {
                UnaryOperator::Plus => {
                    // SQLite: `+x` has no affinity, even when x is a column.
                    let inner = self.expr(expr, scope, mode, subs, depth)?;
                    return Ok(match inner {
                        Expr::Column(_) => Expr::Affinity(Affinity::None, Box::new(inner)),
                        other => other,
                    });
                }
                UnaryOperator::Minus => match &**expr {
                    // Fold negative literals so that `-9223372036854775808` stays an integer.
                    ast::Expr::Value(v) if matches!(v.value, ast::Value::Number(..)) => {
                        let ast::Value::Number(n, _) = &v.value else {
                            unreachable!()
                        };
                        Expr::Literal(number(&format!("-{n}"))?)
                    }
                    _ => Expr::Unary(UnOp::Neg, sub(self, expr, mode, subs)?),
                },
                UnaryOperator::Not => Expr::Unary(UnOp::Not, sub(self, expr, mode, subs)?),
                other => return Err(QueryError::unsupported(format!("operator {other}"))),
            },
            ast::Expr::BinaryOp { left, op, right } => {
                let op = match op {
                    BinaryOperator::Plus => BinOp::Add,
                    BinaryOperator::Minus => BinOp::Sub,
                    BinaryOperator::Multiply => BinOp::Mul,
                    BinaryOperator::Divide => BinOp::Div,
                    BinaryOperator::Modulo => BinOp::Mod,
                    BinaryOperator::StringConcat => BinOp::Concat,
                    BinaryOperator::Eq => BinOp::Eq,
                    BinaryOperator::NotEq => BinOp::NotEq,
                    BinaryOperator::Lt => BinOp::Lt,
                    BinaryOperator::LtEq => BinOp::LtEq,
                    BinaryOperator::Gt => BinOp::Gt,
                    BinaryOperator::GtEq => BinOp::GtEq,
                    BinaryOperator::And => BinOp::And,
                    BinaryOperator::Or => BinOp::Or,
                    other => return Err(QueryError::unsupported(format!("operator {other}"))),
                };
                let (a, b) = (sub(self, left, mode, subs)?, sub(self, right, mode, subs)?);
                if is_comparison(op) {
                    self.comparison(op, *a, *b, scope, mode)
                } else {
                    Expr::Binary(op, a, b)
                }
            }
            ast::Expr::IsNotDistinctFrom(left, right) | ast::Expr::IsDistinctFrom(left, right) => {
                let op = if matches!(e, ast::Expr::IsNotDistinctFrom(..)) {
                    BinOp::Is
                } else {
                    BinOp::IsNot
                };
                let (a, b) = (sub(self, left, mode, subs)?, sub(self, right, mode, subs)?);
                self.comparison(op, *a, *b, scope, mode)
            }
            ast::Expr::IsNull(x) => Expr::IsNull {
                expr: sub(self, x, mode, subs)?,
                negated: false,
            },
            ast::Expr::IsNotNull(x) => Expr::IsNull {
                expr: sub(self, x, mode, subs)?,
                negated: true,
            },
            ast::Expr::InList {
                expr,
                list,
                negated,
            } => {
                // SQLite: `x IN (a, b)` compares as `x = +a OR x = +b`: the left operand's
                // affinity applies to both sides.
                let expr = sub(self, expr, mode, subs)?;
                let aff = self.affinity_of(&expr, scope, mode);
                let mut items = Vec::with_capacity(list.len());
                for x in list {
                    let item = self.expr(x, scope, mode, subs, depth)?;
                    let own = self.affinity_of(&item, scope, mode);
                    items.push(coerce(item, own, aff));
                }
                Expr::InList {
                    expr,
                    list: items,
                    negated: *negated,
                }
            }
            ast::Expr::InSubquery {
                expr,
                subquery,
                negated,
            } => {
                let expr = sub(self, expr, mode, subs)?;
                if depth + 1 > SUBQUERY_DEPTH_MAX {
                    return Err(QueryError::unsupported(format!(
                        "subquery nested deeper than {SUBQUERY_DEPTH_MAX}"
                    )));
                }
                self.outer.push(scope.clone());
                let aliases = std::mem::take(&mut self.aliases);
                let planned = self.query(subquery, depth + 1);
                self.aliases = aliases;
                self.outer.pop();
                let mut planned = planned?;
                if planned.projection.len() != 1 {
                    return Err(QueryError::Schema(format!(
                        "a subquery in IN must return one column; this one returns {}",
                        planned.projection.len()
                    )));
                }
                // As `x = y` for each value y of the subquery's column.
                let own = self.affinity_of(&expr, scope, mode);
                let theirs = select_output_affinity(&planned);
                let aff = Affinity::comparison(own, theirs);
                let expr = Box::new(coerce(*expr, own, aff));
                let out = planned.projection.remove(0);
                // Its ORDER BY (before a LIMIT) still sorts by the unconverted value.
                for k in &mut planned.order_by {
                    if matches!(k.expr, SortExpr::Output(0)) {
                        k.expr = SortExpr::Expr(out.clone());
                    }
                }
                planned.projection.push(coerce(out, theirs, aff));
                subs.push(planned);
                Expr::InSubquery {
                    expr,
                    subquery: subs.len() - 1,
                    negated: *negated,
                }
            }
            ast::Expr::Between {
                expr,
                negated,
                low,
                high,
            } => {
                // `x BETWEEN l AND h` is `x >= l AND x <= h`: each comparison has its affinity.
                let x = *sub(self, expr, mode, subs)?;
                let (l, h) = (*sub(self, low, mode, subs)?, *sub(self, high, mode, subs)?);
                let fx = self.affinity_of(&x, scope, mode);
                let (fl, fh) = (
                    self.affinity_of(&l, scope, mode),
                    self.affinity_of(&h, scope, mode),
                );
                let (al, ah) = (Affinity::comparison(fx, fl), Affinity::comparison(fx, fh));
                let (xl, xh) = (coerce(x.clone(), fx, al), coerce(x, fx, ah));
                let (l, h) = (coerce(l, fl, al), coerce(h, fh, ah));
                if xl == xh {
                    Expr::Between {
                        expr: Box::new(xl),
                        low: Box::new(l),
                        high: Box::new(h),
                        negated: *negated,
                    }
                } else {
                    let both = Expr::Binary(
                        BinOp::And,
                        Box::new(Expr::Binary(BinOp::GtEq, Box::new(xl), Box::new(l))),
                        Box::new(Expr::Binary(BinOp::LtEq, Box::new(xh), Box::new(h))),
                    );
                    if *negated {
                        Expr::Unary(UnOp::Not, Box::new(both))
                    } else {
                        both
                    }
                }
            }
            ast::Expr::Like {
                negated,
                any,
                expr,
                pattern,
                escape_char,
            } => {
                if *any {
                    return Err(QueryError::unsupported("LIKE ANY"));
                }
                if escape_char.is_some() {
                    return Err(QueryError::unsupported("LIKE … ESCAPE"));
                }
                Expr::Like {
                    expr: sub(self, expr, mode, subs)?,
                    pattern: sub(self, pattern, mode, subs)?,
                    negated: *negated,
                }
            }
            ast::Expr::ILike { .. } => return Err(QueryError::unsupported("ILIKE")),
            ast::Expr::Function(f) => self.function(f, scope, mode, depth)?,
            ast::Expr::Subquery(_) => return Err(QueryError::unsupported("scalar subquery")),
            ast::Expr::Exists { .. } => return Err(QueryError::unsupported("EXISTS")),
            ast::Expr::Case { .. } => return Err(QueryError::unsupported("CASE")),
            ast::Expr::Cast { .. } => return Err(QueryError::unsupported("CAST")),
            ast::Expr::IsTrue(_)
            | ast::Expr::IsFalse(_)
            | ast::Expr::IsNotTrue(_)
            | ast::Expr::IsNotFalse(_) => {
                return Err(QueryError::unsupported("IS TRUE / IS FALSE"))
            }
            other => return Err(QueryError::unsupported(format!("expression {other}"))),
        })
    }

    /// The affinity of a compiled operand: a column's (in a grouped context, a key that is a
    /// column keeps it), none for anything else.
    fn affinity_of(&self, e: &Expr, scope: &Scope, mode: &Mode) -> Affinity {
        match (e, mode) {
            (Expr::Column(k), Mode::Groups { keys, .. }) => match keys.get(*k) {
                Some(Expr::Column(i)) => scope_affinity(scope, *i),
                _ => Affinity::None,
            },
            (Expr::Column(i), Mode::Rows) => scope_affinity(scope, *i),
            _ => Affinity::None,
        }
    }

    /// `a op b` for a comparison operator, with SQLite's affinity applied to the operands.
    fn comparison(&self, op: BinOp, a: Expr, b: Expr, scope: &Scope, mode: &Mode) -> Expr {
        let (fa, fb) = (
            self.affinity_of(&a, scope, mode),
            self.affinity_of(&b, scope, mode),
        );
        let aff = Affinity::comparison(fa, fb);
        Expr::Binary(
            op,
            Box::new(coerce(a, fa, aff)),
            Box::new(coerce(b, fb, aff)),
        )
    }

    fn column(&self, scope: &Scope, table: Option<&str>, name: &str) -> Result<usize, QueryError> {
        if let Some(pos) = scope.resolve(table, name)? {
            return Ok(pos);
        }
        let shown = match table {
            Some(t) => format!("{t}.{name}"),
            None => name.to_string(),
        };
        if self
            .outer
            .iter()
            .any(|s| s.resolve(table, name).ok().flatten().is_some())
        {
            return Err(QueryError::unsupported(format!(
                "correlated subquery (column {shown} of an enclosing query)"
            )));
        }
        if let Some(t) = table {
            if !scope.has_binding(t) {
                return Err(QueryError::Schema(format!(
                    "no table or alias named {t:?} in this query"
                )));
            }
        }
        let tables: Vec<&str> = scope.sources.iter().map(|s| s.binding.as_str()).collect();
        Err(QueryError::Schema(format!(
            "no column named {shown:?} in {}",
            tables.join(", ")
        )))
    }

    fn literal(&mut self, v: &ast::Value) -> Result<Expr, QueryError> {
        Ok(Expr::Literal(match v {
            ast::Value::Number(n, _) => number(n)?,
            ast::Value::SingleQuotedString(s) => Value::Text(s.as_str().into()),
            ast::Value::Boolean(b) => Value::Integer(*b as i64),
            ast::Value::Null => Value::Null,
            ast::Value::Placeholder(p) => return self.param(p),
            other => return Err(QueryError::unsupported(format!("literal {other}"))),
        }))
    }

    fn param(&mut self, p: &str) -> Result<Expr, QueryError> {
        let mixed = || QueryError::unsupported("mixing $n and :name parameters in one query");
        if let Some(n) = p.strip_prefix('$') {
            let n: usize = n.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                QueryError::unsupported(format!("parameter {p}; use $1, $2, … or :name"))
            })?;
            if !self.params.names.is_empty() {
                return Err(mixed());
            }
            self.params.positional = self.params.positional.max(n);
            return Ok(Expr::Param(n - 1));
        }
        if let Some(name) = p.strip_prefix(':').filter(|n| !n.is_empty()) {
            if self.params.positional > 0 {
                return Err(mixed());
            }
            let i = match self.params.names.iter().position(|x| x == name) {
                Some(i) => i,
                None => {
                    self.params.names.push(name.to_string());
                    self.params.names.len() - 1
                }
            };
            return Ok(Expr::Param(i));
        }
        Err(QueryError::unsupported(format!(
            "parameter {p}; use $1, $2, … or :name"
        )))
    }

    fn function(
        &mut self,
        f: &ast::Function,
        scope: &Scope,
        mode: &mut Mode,
        depth: usize,
    ) -> Result<Expr, QueryError> {
        let name = f.name.to_string().to_lowercase();
        if f.over.is_some() {
            return Err(QueryError::unsupported("window functions"));
        }
        if !AGGREGATES.contains(&name.as_str()) {
            return Err(QueryError::unsupported(format!("function {name}()")));
        }
        if f.filter.is_some() {
            return Err(QueryError::unsupported("aggregate FILTER"));
        }
        if !f.within_group.is_empty() {
            return Err(QueryError::unsupported("WITHIN GROUP"));
        }
        if !matches!(f.parameters, FunctionArguments::None) {
            return Err(QueryError::unsupported(format!("parameters of {name}()")));
        }
        let args = match &f.args {
            FunctionArguments::List(list) => {
                if list.duplicate_treatment.is_some() {
                    return Err(QueryError::unsupported(format!("{name}(DISTINCT …)")));
                }
                if !list.clauses.is_empty() {
                    return Err(QueryError::unsupported(format!("clauses inside {name}()")));
                }
                &list.args
            }
            _ => return Err(QueryError::unsupported(format!("{name} without arguments"))),
        };
        let arg = match args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] if name == "count" => None,
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => Some(e),
            _ => {
                return Err(QueryError::unsupported(format!(
                    "function {name}() with these arguments"
                )))
            }
        };
        let Mode::Groups { aggs, .. } = mode else {
            self.saw_aggregate = true;
            return Err(QueryError::unsupported(format!(
                "aggregate function {name}() here (aggregates belong in SELECT, HAVING or ORDER BY)"
            )));
        };
        let arg = match arg {
            None => None,
            Some(e) => {
                // The argument is evaluated per row; nested aggregates are refused there.
                let mut subs = Vec::new();
                let compiled = self.expr(e, scope, &mut Mode::Rows, &mut subs, depth)?;
                if !subs.is_empty() {
                    return Err(QueryError::unsupported("subqueries inside aggregates"));
                }
                Some(compiled)
            }
        };
        let func = match (name.as_str(), &arg) {
            ("count", None) => AggFunc::CountStar,
            ("count", Some(_)) => AggFunc::Count,
            ("sum", _) => AggFunc::Sum,
            ("min", _) => AggFunc::Min,
            ("max", _) => AggFunc::Max,
            _ => AggFunc::Avg,
        };
        let spec = AggSpec { func, arg };
        let i = match aggs.iter().position(|a| *a == spec) {
            Some(i) => i,
            None => {
                aggs.push(spec);
                aggs.len() - 1
            }
        };
        Ok(Expr::Agg(i))
    }
}

fn is_comparison(op: BinOp) -> bool {
    matches!(
        op,
        BinOp::Eq | BinOp::NotEq | BinOp::Lt | BinOp::LtEq | BinOp::Gt | BinOp::GtEq
    )
}

fn scope_affinity(scope: &Scope, i: usize) -> Affinity {
    scope
        .sources
        .iter()
        .find(|s| (s.offset..s.offset + s.schema.columns.len()).contains(&i))
        .map_or(Affinity::None, |s| {
            Affinity::of_column(s.schema.columns[i - s.offset].ty)
        })
}

/// The affinity of a planned subquery's (only) output column.
fn select_output_affinity(s: &Select) -> Affinity {
    let scope = Scope {
        sources: s.sources.clone(),
    };
    match (&s.projection[0], &s.aggregate) {
        (Expr::Column(k), Some(agg)) => match agg.keys.get(*k) {
            Some(Expr::Column(i)) => scope_affinity(&scope, *i),
            _ => Affinity::None,
        },
        (Expr::Column(i), None) => scope_affinity(&scope, *i),
        _ => Affinity::None,
    }
}

/// `e` (of affinity `own`) as a comparison with affinity `aff` sees it: a literal is
/// converted now, another operand whose values `aff` may change is wrapped.
pub(crate) fn coerce(e: Expr, own: Affinity, aff: Affinity) -> Expr {
    if !aff.converts(own) {
        return e;
    }
    match e {
        Expr::Literal(v) => Expr::Literal(aff.apply(v)),
        other => Expr::Affinity(aff, Box::new(other)),
    }
}

fn probe_rank(p: Probe) -> u8 {
    match p {
        Probe::PrimaryKey => 0,
        Probe::Index(_) => 1,
        Probe::Hashed => 2,
    }
}

fn number(n: &str) -> Result<Value, QueryError> {
    if let Ok(i) = n.parse::<i64>() {
        return Ok(Value::Integer(i));
    }
    n.parse::<f64>()
        .map(Value::Real)
        .map_err(|_| QueryError::Syntax(format!("bad number {n}")))
}

/// Splits a conjunction into its parts.
pub fn conjuncts(e: Expr) -> Vec<Expr> {
    match e {
        Expr::Binary(BinOp::And, a, b) => {
            let mut v = conjuncts(*a);
            v.extend(conjuncts(*b));
            v
        }
        other => vec![other],
    }
}

/// Joins parts back with AND; `None` if there are none.
pub fn conjoin(parts: Vec<Expr>) -> Option<Expr> {
    parts
        .into_iter()
        .reduce(|a, b| Expr::Binary(BinOp::And, Box::new(a), Box::new(b)))
}

fn unique_names(names: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for n in names {
        let mut candidate = n.clone();
        let mut k = 2;
        while out.contains(&candidate) {
            candidate = format!("{n}:{k}");
            k += 1;
        }
        out.push(candidate);
    }
    out
}

fn is_constant(e: &Expr) -> bool {
    match e {
        Expr::Literal(_) | Expr::Param(_) => true,
        Expr::Unary(UnOp::Neg, x) | Expr::Affinity(_, x) => is_constant(x),
        _ => false,
    }
}

/// Picks how to find the first table's candidate rows from its `WHERE` conjuncts.
fn access_path(schema: &TableSchema, conjuncts: &[Expr]) -> Access {
    let index_of = |c: usize| schema.indexes.iter().position(|ix| ix.columns[0] == c);
    let mut best = (u8::MAX, Access::Scan);
    let mut consider = |rank: u8, access: Access| {
        if rank < best.0 {
            best = (rank, access);
        }
    };
    for c in conjuncts {
        match c {
            Expr::Binary(op, a, b) => {
                let (col, value, op) = match (&**a, &**b) {
                    (Expr::Column(c), v) if is_constant(v) => (*c, v, *op),
                    (v, Expr::Column(c)) if is_constant(v) => (*c, v, flip(*op)),
                    _ => continue,
                };
                let v = Some(value.clone());
                let (low, high) = match op {
                    BinOp::Eq => {
                        if col == schema.pk {
                            consider(0, Access::Key(value.clone()));
                        } else if let Some(index) = index_of(col) {
                            consider(
                                1,
                                Access::IndexEq {
                                    index,
                                    value: value.clone(),
                                },
                            );
                        }
                        continue;
                    }
                    BinOp::Gt | BinOp::GtEq => (v, None),
                    BinOp::Lt | BinOp::LtEq => (None, v),
                    _ => continue,
                };
                range(schema.pk, index_of(col), col, low, high, &mut consider);
            }
            Expr::Between {
                expr,
                low,
                high,
                negated: false,
            } => {
                if let Expr::Column(col) = **expr {
                    if is_constant(low) && is_constant(high) {
                        let (l, h) = (Some((**low).clone()), Some((**high).clone()));
                        range(schema.pk, index_of(col), col, l, h, &mut consider);
                    }
                }
            }
            _ => {}
        }
    }
    best.1
}

fn range(
    pk: usize,
    index: Option<usize>,
    col: usize,
    low: Option<Expr>,
    high: Option<Expr>,
    consider: &mut impl FnMut(u8, Access),
) {
    if col == pk {
        consider(2, Access::KeyRange { low, high });
    } else if let Some(index) = index {
        consider(3, Access::IndexRange { index, low, high });
    }
}

fn flip(op: BinOp) -> BinOp {
    match op {
        BinOp::Lt => BinOp::Gt,
        BinOp::LtEq => BinOp::GtEq,
        BinOp::Gt => BinOp::Lt,
        BinOp::GtEq => BinOp::LtEq,
        other => other,
    }
}
