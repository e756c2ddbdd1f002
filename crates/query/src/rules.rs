//! Row policies compiled for one row at a time: may this caller read this row, write this
//! new row, update or delete this old one? Used where a single row is at stake (row reads,
//! scans, catch-up, write checks); queries and live views fold the read rule into their plan
//! instead ([`crate::prepare_as`]).

use std::sync::Arc;

use serde_json::{Map, Value as Json};
use sluice_engine::{Db, PolicyCommand, PolicyDef, Value};

use crate::expr::{Env, Expr, SubqueryValues};
use crate::plan::{Planner, Select, Source};
use crate::QueryError;

/// The OR of the policies for one check on one table.
#[derive(Clone, Debug)]
pub struct RowRule {
    /// FALSE when no policy applies.
    expr: Expr,
    /// The policies that were combined (those covering the command), for error messages.
    pub policies: Vec<String>,
    /// The claims `expr` reads: `Expr::Param(i)` is `claims[i]`.
    pub claims: Vec<String>,
    /// The `IN (SELECT …)` subqueries of `FOR SELECT` policies (read through their own
    /// tables' policies for the same caller).
    subqueries: Vec<Select>,
}

/// A [`RowRule`] bound to one caller over one state of the database: its claim values and
/// its subqueries' results.
#[derive(Clone, Debug, Default)]
pub struct Bound {
    claims: Vec<Value>,
    subqueries: Vec<SubqueryValues>,
}

impl RowRule {
    /// Whether `row` (the table's columns in order) passes, for the caller `bound` is for.
    pub fn allows(&self, row: &[Value], bound: &Bound) -> bool {
        self.expr.is_true(&Env {
            row,
            params: &bound.claims,
            aggs: &[],
            subqueries: &bound.subqueries,
        })
    }

    /// Whether the rule reads other tables (membership subqueries): then whether a row
    /// passes depends on more than the row and the caller's claims.
    pub fn reads_tables(&self) -> bool {
        !self.subqueries.is_empty()
    }

    /// The values of the claims this rule reads, and its subqueries' results over `db`
    /// (the state the rows it will check come from).
    pub fn bind(&self, db: &Db, claims: &Map<String, Json>) -> Result<Bound, QueryError> {
        let claims: Vec<Value> = self
            .claims
            .iter()
            .map(|c| crate::claim_value(claims.get(c)))
            .collect();
        let subqueries = crate::exec::subqueries_of(&self.subqueries, db, &claims)?;
        Ok(Bound { claims, subqueries })
    }
}

/// Every check of one table, compiled against one state of its schema and policies.
#[derive(Clone, Debug)]
pub struct TableRules {
    /// `USING` of `SELECT` policies: which rows a client reads.
    pub read: RowRule,
    /// `WITH CHECK` of `INSERT` policies on the new row.
    pub insert: RowRule,
    /// `USING` of `UPDATE` policies on the old row.
    pub update_old: RowRule,
    /// `WITH CHECK` of `UPDATE` policies on the new row.
    pub update_new: RowRule,
    /// `USING` of `DELETE` policies on the old row.
    pub delete: RowRule,
}

/// Compiles the policies of `table` as it is in `db`.
pub fn table_rules(db: &Db, table: &str) -> Result<Arc<TableRules>, QueryError> {
    let source = source_of(db, table)?;
    let rule = |op, check| compile(db, &source, op, check);
    Ok(Arc::new(TableRules {
        read: rule(PolicyCommand::Select, false)?,
        insert: rule(PolicyCommand::Insert, true)?,
        update_old: rule(PolicyCommand::Update, false)?,
        update_new: rule(PolicyCommand::Update, true)?,
        delete: rule(PolicyCommand::Delete, false)?,
    }))
}

/// Checks that `policy`'s predicates compile against `table` in `db` (before it is created).
pub fn check_policy(db: &Db, table: &str, policy: &PolicyDef) -> Result<(), QueryError> {
    let source = source_of(db, table)?;
    let mut planner = Planner::new(db);
    planner.client = true;
    for text in [&policy.using, &policy.check].into_iter().flatten() {
        let mut subs = Vec::new();
        planner.policy_expr(text, &source, &mut subs, 0)?;
        if !subs.is_empty() && policy.command != PolicyCommand::Select {
            return Err(QueryError::unsupported(
                "subqueries in a policy that is not FOR SELECT (a write rule reads only its row and the caller's claims)",
            ));
        }
    }
    Ok(())
}

fn source_of(db: &Db, table: &str) -> Result<Source, QueryError> {
    let t = db
        .tables
        .get(table)
        .ok_or_else(|| QueryError::NotFound(format!("no table named {table:?}")))?;
    Ok(Source {
        schema: t.schema.clone(),
        binding: table.to_string(),
        offset: 0,
    })
}

fn compile(
    db: &Db,
    source: &Source,
    op: PolicyCommand,
    check: bool,
) -> Result<RowRule, QueryError> {
    let mut planner = Planner::new(db);
    // A policy's subquery reads its table as the same caller would.
    planner.client = true;
    let mut subqueries = Vec::new();
    let (expr, policies) = planner.policy_filter(source, op, check, &mut subqueries, 0)?;
    Ok(RowRule {
        expr,
        policies,
        claims: planner.params.claims,
        subqueries,
    })
}
