//! How a view follows commits. Five operators, chosen from the plan's shape:
//!
//! - [`Operator::Filter`] — one table, no grouping, no subquery: a changed row is tested
//!   against the `WHERE` clause and projected, alone; its result key is its primary key.
//!   O(1) per changed row, whatever the size of the view or the table.
//! - [`Operator::Aggregate`] — one table with `GROUP BY` / aggregates: the changed row's old
//!   image is retracted from its group and the new image added, with invertible aggregate
//!   states (counts, exact integer sums, value multisets for `MIN`/`MAX`); only the touched
//!   groups are re-projected and re-tested against `HAVING`. O(changed rows × log group).
//! - [`Operator::Join`] — joins whose `ON` keys are plain columns (no grouping, no
//!   subquery): a changed row is walked back through the `ON` columns to the first-table rows
//!   ("anchors") whose output it can alter, and only those anchors are re-evaluated
//!   ([`join_anchors`]). O(anchors touched × their fan-out), with index lookups where the
//!   join columns are indexed (a scan of an intermediate table where they are not).
//! - [`Operator::Subquery`] — one table filtered by `column IN (SELECT …)` (nested to any
//!   supported depth): changed rows of the table are re-tested alone; a change to a table a
//!   subquery reads re-runs the subqueries (O(their result)) and re-tests only the rows whose
//!   `IN` column holds a value that entered or left a set ([`subquery_deltas`]).
//! - [`Operator::Reeval`] — aggregates over joins or subqueries, computed join keys,
//!   subqueries outside `WHERE`: the query is re-run when a commit touches one of the tables
//!   it reads, and the result compared with the view by key. Correct for every shape, but
//!   O(view) per relevant commit.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_engine::{Change, Db, Key, Value};
use sluice_query::expr::{binary, BinOp, Env, SubqueryValues};
use sluice_query::plan::{AggFunc, AggSpec, SortExpr};
use sluice_query::{Expr, QueryError, Select};

use crate::view::{Out, RKey};

pub(crate) enum Operator {
    Filter {
        identity: bool,
    },
    /// Boxed, as the subquery's values: the enum (one per view) stays 16 bytes.
    Aggregate {
        #[allow(clippy::box_collection)] // inline, the map would make every view 16 bytes larger
        groups: Box<BTreeMap<RKey, Group>>,
    },
    /// Joins whose `ON` keys are plain columns: see [`join_anchors`].
    Join,
    /// One table filtered by `column IN (SELECT …)`: see [`subquery_deltas`].
    Subquery {
        identity: bool,
        #[allow(clippy::box_collection)] // inline, the Vec would make every view 16 bytes larger
        values: Box<Vec<SubqueryValues>>,
    },
    Reeval,
}

impl Operator {
    pub(crate) fn for_select(select: &Select) -> Operator {
        if !select.subqueries.is_empty() {
            let outside_where = select
                .projection
                .iter()
                .chain(select.order_by.iter().filter_map(|k| match &k.expr {
                    SortExpr::Expr(e) => Some(e),
                    SortExpr::Output(_) => None,
                }))
                .any(has_subquery);
            let mut column_keys = true;
            for f in select.base_filter.iter().chain(select.filter.iter()) {
                f.visit_in_subqueries(&mut |e, _| column_keys &= matches!(e, Expr::Column(_)));
            }
            return if select.sources.len() == 1
                && select.aggregate.is_none()
                && !outside_where
                && column_keys
            {
                Operator::Subquery {
                    identity: is_identity(select),
                    values: Box::default(),
                }
            } else {
                Operator::Reeval
            };
        }
        if select.sources.len() > 1 {
            let plain_keys = select
                .joins
                .iter()
                .all(|j| matches!(j.left_key, Expr::Column(_)) && j.right_affinity.is_none());
            return if select.aggregate.is_none() && plain_keys {
                Operator::Join
            } else {
                Operator::Reeval
            };
        }
        if select.aggregate.is_some() {
            return Operator::Aggregate {
                groups: Box::default(),
            };
        }
        Operator::Filter {
            identity: is_identity(select),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Operator::Filter { .. } => "filter",
            Operator::Aggregate { .. } => "aggregate",
            Operator::Join => "join",
            Operator::Subquery { .. } => "subquery",
            Operator::Reeval => "reevaluate",
        }
    }

    /// The full result at `db`'s current state; also primes the operator's own state.
    pub(crate) fn load(
        &mut self,
        select: &Select,
        db: &Db,
        params: &[Value],
        rows_max: usize,
    ) -> Result<Vec<(RKey, Out)>, QueryError> {
        let too_many = |n: usize| {
            QueryError::Limit(format!(
                "the view has {n} rows or more; view_rows_max (--live-view-rows-max) is {rows_max}"
            ))
        };
        match self {
            Operator::Aggregate { groups } => {
                let agg = select.aggregate.as_ref().expect("an aggregate plan");
                groups.clear();
                if agg.keys.is_empty() {
                    groups.insert(Vec::new(), Group::new(&agg.aggs));
                }
                let table = db
                    .tables
                    .get(&select.sources[0].schema.name)
                    .ok_or_else(|| QueryError::NotFound("the view's table is gone".into()))?;
                for r in table.rows.values() {
                    if passes(select, params, &r.values) {
                        let env = env(&r.values, params, &[]);
                        let key: RKey = agg.keys.iter().map(|k| k.eval(&env)).collect();
                        groups
                            .entry(key)
                            .or_insert_with(|| Group::new(&agg.aggs))
                            .add(&agg.aggs, &env, 1);
                        if groups.len() > rows_max {
                            return Err(too_many(groups.len()));
                        }
                    }
                }
                Ok(groups
                    .iter()
                    .filter_map(|(k, g)| group_out(select, params, k, g).map(|o| (k.clone(), o)))
                    .collect())
            }
            Operator::Filter { .. } | Operator::Subquery { .. } => {
                if let Operator::Subquery { values, .. } = self {
                    **values = sluice_query::subquery_values(select, db, params)?;
                }
                let identity = matches!(
                    self,
                    Operator::Filter { identity: true } | Operator::Subquery { identity: true, .. }
                );
                let rows = evaluate(select, db, params, rows_max)?;
                if !identity {
                    return Ok(rows);
                }
                // `SELECT *`: share the table's row instead of holding a copy.
                let table = &db.tables[&select.sources[0].schema.name];
                Ok(rows
                    .into_iter()
                    .map(|(k, mut out)| {
                        let key = sluice_engine::Key::from_value(&k[0]).expect("a primary key");
                        out.row = table.rows[&key].values.clone();
                        (k, out)
                    })
                    .collect())
            }
            Operator::Join | Operator::Reeval => evaluate(select, db, params, rows_max),
        }
    }

    /// What the changes of one commit (all to this view's single table) make of the result.
    /// Reeval views are refreshed with [`Operator::load`] instead.
    pub(crate) fn deltas(
        &mut self,
        select: &Select,
        params: &[Value],
        changes: &[&Change],
    ) -> BTreeMap<RKey, Option<Out>> {
        let mut deltas = BTreeMap::new();
        match self {
            Operator::Filter { identity } => {
                for c in changes {
                    let key = vec![c.key.to_value()];
                    let out = c
                        .row
                        .as_ref()
                        .filter(|r| passes(select, params, r))
                        .map(|r| project(select, params, r, &[], identity.then_some(r)));
                    deltas.insert(key, out);
                }
            }
            Operator::Aggregate { groups } => {
                let agg = select.aggregate.as_ref().expect("an aggregate plan");
                let mut touched = Vec::new();
                for c in changes {
                    for (image, sign) in [(&c.old, -1), (&c.row, 1)] {
                        let Some(r) = image else { continue };
                        if !passes(select, params, r) {
                            continue;
                        }
                        let env = env(r, params, &[]);
                        let key: RKey = agg.keys.iter().map(|k| k.eval(&env)).collect();
                        let group = groups
                            .entry(key.clone())
                            .or_insert_with(|| Group::new(&agg.aggs));
                        group.add(&agg.aggs, &env, sign);
                        touched.push(key);
                    }
                }
                for key in touched {
                    if deltas.contains_key(&key) {
                        continue;
                    }
                    let group = &groups[&key];
                    if group.rows == 0 && !key.is_empty() {
                        groups.remove(&key);
                        deltas.insert(key, None);
                    } else {
                        let out = group_out(select, params, &key, group);
                        deltas.insert(key, out);
                    }
                }
            }
            Operator::Join | Operator::Subquery { .. } | Operator::Reeval => {
                unreachable!("these views read the Db")
            }
        }
        deltas
    }
}

/// The primary keys of the first table's rows whose part of a join's result `change` can
/// alter, read from `db` (the state after the change).
///
/// The result of a join is the union over the first table's rows ("anchors") of what each
/// one produces, and every result key starts with its anchor's key; so re-evaluating the
/// affected anchors (`sluice_query::evaluate_anchor`) and replacing their rows is exact. A
/// changed row of a later table is walked back to the anchors through the `ON` columns: the
/// rows of the table its join key refers to that hold the same value (by primary key, by an
/// index on that column, or by a scan), and so on to the first table — once for its old image
/// (anchors that had it) and once for its new one (anchors that will). The rows passed
/// through on the way are unchanged, or their own change starts a walk of its own, so every
/// anchor whose output changed is found.
pub(crate) fn join_anchors(
    select: &Select,
    db: &Db,
    change: &Change,
    anchors: &mut std::collections::BTreeSet<Key>,
) {
    for (s, source) in select.sources.iter().enumerate() {
        if source.schema.name != change.table.name {
            continue;
        }
        if s == 0 {
            anchors.insert(change.key.clone());
            continue;
        }
        for image in [&change.old, &change.row].into_iter().flatten() {
            walk_back(select, db, s, image, anchors);
        }
    }
}

fn walk_back(
    select: &Select,
    db: &Db,
    source: usize,
    row: &[Value],
    anchors: &mut std::collections::BTreeSet<Key>,
) {
    let join = select
        .joins
        .iter()
        .find(|j| j.source == source)
        .expect("every source after the first is joined");
    let value = &row[join.right_column];
    if value.is_null() {
        return; // NULL joins nothing
    }
    let Expr::Column(c) = join.left_key else {
        unreachable!("join views have column join keys")
    };
    let i = select
        .sources
        .iter()
        .rposition(|s| s.offset <= c)
        .expect("a column of an earlier source");
    let column = c - select.sources[i].offset;
    let Some(table) = db.tables.get(&select.sources[i].schema.name) else {
        return;
    };
    let keys = rows_with(table, column, value);
    for k in keys {
        if i == 0 {
            anchors.insert(k);
        } else {
            let values = table.rows[&k].values.clone();
            walk_back(select, db, i, &values, anchors);
        }
    }
}

/// Re-evaluates the given anchors of a join view: their old rows out, their new rows in.
pub(crate) fn join_deltas(
    select: &Select,
    db: &Db,
    params: &[Value],
    anchors: &std::collections::BTreeSet<Key>,
    old_keys: impl Fn(&Value) -> Vec<RKey>,
) -> Result<BTreeMap<RKey, Option<Out>>, QueryError> {
    let mut deltas = BTreeMap::new();
    for a in anchors {
        for k in old_keys(&a.to_value()) {
            deltas.insert(k, None);
        }
        for r in sluice_query::evaluate_anchor(select, db, params, a)? {
            deltas.insert(
                r.key,
                Some(Out {
                    sort: r.sort.into(),
                    row: r.row.into(),
                }),
            );
        }
    }
    Ok(deltas)
}

fn is_identity(select: &Select) -> bool {
    let width = select.sources[0].schema.columns.len();
    select.projection.len() == width
        && select
            .projection
            .iter()
            .enumerate()
            .all(|(i, e)| *e == Expr::Column(i))
}

fn has_subquery(e: &Expr) -> bool {
    let mut found = false;
    e.visit_in_subqueries(&mut |_, _| found = true);
    found
}

/// Keys of the rows of `table` whose `column` equals `value` (`=` semantics): by primary
/// key, by an index whose first column it is, or by a scan.
fn rows_with(table: &sluice_engine::table::Table, column: usize, value: &Value) -> Vec<Key> {
    let schema = &table.schema;
    if value.is_null() {
        return Vec::new();
    }
    if column == schema.pk {
        return sluice_query::to_key(value, schema.pk_column().ty)
            .filter(|k| table.rows.contains_key(k))
            .into_iter()
            .collect();
    }
    if let Some(ix) = schema.indexes.iter().position(|x| x.columns[0] == column) {
        return sluice_query::index_range(table, ix, Some(value), Some(value))
            .cloned()
            .collect();
    }
    table
        .rows
        .iter()
        .filter(|(_, r)| r.values[column] == *value)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Brings a one-table `IN (SELECT …)` view up to `db`, given the changes since its seq.
///
/// A changed row of the view's own table is re-tested alone. A change to a table a subquery
/// reads re-runs the subqueries (O(their result), not O(view)) and compares each value set
/// with the one the view holds; only rows whose `IN` column holds a value that entered or
/// left a set are re-tested, found by primary key, index or scan of that column. If a
/// subquery's NULL-ness or emptiness changed (which can flip every row), the whole query is
/// re-evaluated: `None` is returned.
pub(crate) fn subquery_deltas(
    op: &mut Operator,
    select: &Select,
    db: &Db,
    params: &[Value],
    changes: &[&Change],
) -> Result<Option<BTreeMap<RKey, Option<Out>>>, QueryError> {
    let Operator::Subquery { identity, values } = op else {
        unreachable!("a subquery view")
    };
    let table_name = &select.sources[0].schema.name;
    let Some(table) = db.tables.get(table_name) else {
        return Err(QueryError::NotFound(format!(
            "no table named {table_name:?}"
        )));
    };
    let mut keys: std::collections::BTreeSet<Key> = changes
        .iter()
        .filter(|c| &c.table.name == table_name)
        .map(|c| c.key.clone())
        .collect();
    let mut sub_tables = std::collections::BTreeSet::new();
    for q in &select.subqueries {
        tables_of(q, &mut sub_tables);
    }
    if changes.iter().any(|c| sub_tables.contains(&c.table.name)) {
        let fresh = sluice_query::subquery_values(select, db, params)?;
        let mut moved: Vec<(usize, Value)> = Vec::new();
        for (i, (old, new)) in values.iter().zip(&fresh).enumerate() {
            // `x IN (…)` for a NULL x depends on whether the set is empty, and `NOT IN` for
            // every x on whether it holds a NULL: then every row may flip.
            if old.has_null != new.has_null || old.values.is_empty() != new.values.is_empty() {
                **values = fresh;
                return Ok(None);
            }
            for v in old.values.symmetric_difference(&new.values) {
                moved.push((i, v.clone()));
            }
        }
        if !moved.is_empty() {
            let mut columns: Vec<(usize, usize)> = Vec::new(); // (subquery, column)
            for f in select.base_filter.iter().chain(select.filter.iter()) {
                f.visit_in_subqueries(&mut |expr, i| {
                    if let Expr::Column(c) = expr {
                        columns.push((i, *c));
                    }
                });
            }
            for (i, v) in &moved {
                for &(_, c) in columns.iter().filter(|(q, _)| q == i) {
                    keys.extend(rows_with(table, c, v));
                }
            }
        }
        **values = fresh;
    }
    let mut deltas = BTreeMap::new();
    for k in keys {
        let out = table.rows.get(&k).and_then(|r| {
            passes_with(select, params, values, &r.values).then(|| {
                project(
                    select,
                    params,
                    &r.values,
                    &[],
                    identity.then_some(&r.values),
                )
            })
        });
        deltas.insert(vec![k.to_value()], out);
    }
    Ok(Some(deltas))
}

fn tables_of(select: &Select, out: &mut std::collections::BTreeSet<String>) {
    for s in &select.sources {
        out.insert(s.schema.name.clone());
    }
    for q in &select.subqueries {
        tables_of(q, out);
    }
}

fn env<'a>(row: &'a [Value], params: &'a [Value], aggs: &'a [Value]) -> Env<'a> {
    Env {
        row,
        params,
        aggs,
        subqueries: &[],
    }
}

fn passes(select: &Select, params: &[Value], row: &[Value]) -> bool {
    passes_with(select, params, &[], row)
}

fn passes_with(select: &Select, params: &[Value], subs: &[SubqueryValues], row: &[Value]) -> bool {
    let e = Env {
        row,
        params,
        aggs: &[],
        subqueries: subs,
    };
    select.base_filter.as_ref().is_none_or(|f| f.is_true(&e))
        && select.filter.as_ref().is_none_or(|f| f.is_true(&e))
}

/// Projects one input row (or group) into an output row with its sort values.
fn project(
    select: &Select,
    params: &[Value],
    row: &[Value],
    aggs: &[Value],
    shared: Option<&Arc<[Value]>>,
) -> Out {
    let e = env(row, params, aggs);
    let projected: Arc<[Value]> = match shared {
        Some(r) => r.clone(),
        None => select.projection.iter().map(|p| p.eval(&e)).collect(),
    };
    let sort = select
        .order_by
        .iter()
        .map(|k| match &k.expr {
            SortExpr::Output(i) => projected[*i].clone(),
            SortExpr::Expr(x) => x.eval(&e),
        })
        .collect();
    Out {
        sort,
        row: projected,
    }
}

fn evaluate(
    select: &Select,
    db: &Db,
    params: &[Value],
    rows_max: usize,
) -> Result<Vec<(RKey, Out)>, QueryError> {
    let rows = sluice_query::evaluate(select, db, params)?;
    if rows.len() > rows_max {
        return Err(QueryError::Limit(format!(
            "the view has {} rows; view_rows_max (--live-view-rows-max) is {rows_max}",
            rows.len()
        )));
    }
    Ok(rows
        .into_iter()
        .map(|k| {
            (
                k.key,
                Out {
                    sort: k.sort.into(),
                    row: k.row.into(),
                },
            )
        })
        .collect())
}

fn group_out(select: &Select, params: &[Value], key: &RKey, group: &Group) -> Option<Out> {
    let aggs: Vec<Value> = group.states.iter().map(Inv::finish).collect();
    let agg = select.aggregate.as_ref().expect("an aggregate plan");
    let e = env(key, params, &aggs);
    if agg.having.as_ref().is_some_and(|h| !h.is_true(&e)) {
        return None;
    }
    Some(project(select, params, key, &aggs, None))
}

/// One group of an aggregate view: how many input rows it has and its aggregates' states.
pub(crate) struct Group {
    rows: i64,
    states: Vec<Inv>,
}

impl Group {
    fn new(specs: &[AggSpec]) -> Group {
        Group {
            rows: 0,
            states: specs.iter().map(|s| Inv::new(s.func)).collect(),
        }
    }

    /// Adds (`sign` 1) or retracts (`sign` -1) one input row.
    fn add(&mut self, specs: &[AggSpec], env: &Env<'_>, sign: i64) {
        self.rows += sign;
        for (state, spec) in self.states.iter_mut().zip(specs) {
            state.add(spec.arg.as_ref().map(|a| a.eval(env)), sign);
        }
    }
}

/// An invertible aggregate state.
enum Inv {
    Count(i64),
    /// Integers summed exactly; other values as REAL, with how many there were.
    Sum {
        int: i128,
        real: f64,
        reals: i64,
        n: i64,
        avg: bool,
    },
    /// The multiset of non-NULL values.
    Extreme {
        values: BTreeMap<Value, i64>,
        max: bool,
    },
}

impl Inv {
    fn new(func: AggFunc) -> Inv {
        match func {
            AggFunc::CountStar | AggFunc::Count => Inv::Count(0),
            AggFunc::Sum | AggFunc::Avg => Inv::Sum {
                int: 0,
                real: 0.0,
                reals: 0,
                n: 0,
                avg: func == AggFunc::Avg,
            },
            AggFunc::Min | AggFunc::Max => Inv::Extreme {
                values: BTreeMap::new(),
                max: func == AggFunc::Max,
            },
        }
    }

    /// `v` is `None` for `COUNT(*)`.
    fn add(&mut self, v: Option<Value>, sign: i64) {
        let Some(v) = v else {
            if let Inv::Count(n) = self {
                *n += sign;
            }
            return;
        };
        if v.is_null() {
            return;
        }
        match self {
            Inv::Count(n) => *n += sign,
            Inv::Sum {
                int,
                real,
                reals,
                n,
                ..
            } => {
                *n += sign;
                match v {
                    Value::Integer(i) | Value::Timestamp(i) => *int += (i as i128) * sign as i128,
                    Value::Boolean(b) => *int += (b as i128) * sign as i128,
                    other => {
                        *reals += sign;
                        *real += as_f64(&other) * sign as f64;
                        if *reals == 0 {
                            // No REAL left: drop the rounding residue of the retractions.
                            *real = 0.0;
                        }
                    }
                }
            }
            Inv::Extreme { values, .. } => {
                let count = values.entry(v.clone()).or_insert(0);
                *count += sign;
                if *count == 0 {
                    values.remove(&v);
                }
            }
        }
    }

    fn finish(&self) -> Value {
        match self {
            Inv::Count(n) => Value::Integer(*n),
            Inv::Sum { n: 0, .. } => Value::Null,
            Inv::Sum {
                int,
                real,
                reals,
                n,
                avg,
            } => {
                if *avg {
                    Value::Real((*int as f64 + real) / *n as f64)
                } else if *reals == 0 {
                    i64::try_from(*int).map_or(Value::Real(*int as f64), Value::Integer)
                } else {
                    Value::Real(*int as f64 + real)
                }
            }
            Inv::Extreme { values, max } => {
                let v = if *max {
                    values.keys().next_back()
                } else {
                    values.keys().next()
                };
                v.cloned().unwrap_or(Value::Null)
            }
        }
    }
}

fn as_f64(v: &Value) -> f64 {
    match binary(BinOp::Add, v, &Value::Real(0.0)) {
        Value::Real(r) => r,
        _ => 0.0,
    }
}

/// A frozen version of one table's rows: a copy-on-write clone of its row map, taken under
/// the `Db`'s read lock in O(rows / chunk) and read after the lock is released.
pub(crate) type FrozenRows = sluice_engine::cow::CowMap<Key, sluice_engine::table::RowEntry>;

/// Picks a filter view's rows out of its table's (a [`FrozenRows`] version): the view's
/// `WHERE` and projection, as [`Operator::load_frozen`] applies them — a large new view's
/// snapshot is encoded from the frozen table with it ([`crate::chunked`]).
pub(crate) struct RowPick {
    shape: Arc<crate::engine::Shape>,
    params: Box<[Value]>,
    identity: bool,
}

impl RowPick {
    /// `None` unless `op` is a filter.
    pub(crate) fn new(
        op: &Operator,
        shape: Arc<crate::engine::Shape>,
        params: Box<[Value]>,
    ) -> Option<RowPick> {
        match op {
            Operator::Filter { identity } => Some(RowPick {
                shape,
                params,
                identity: *identity,
            }),
            _ => None,
        }
    }

    /// The view's row for this table row, if the view takes it (the table's own `Arc` when
    /// the view is `SELECT *`).
    pub(crate) fn pick<'a>(
        &self,
        values: &'a Arc<[Value]>,
    ) -> Option<std::borrow::Cow<'a, Arc<[Value]>>> {
        let select = &self.shape.plan.select;
        if !passes(select, &self.params, values) {
            return None;
        }
        if self.identity {
            return Some(std::borrow::Cow::Borrowed(values));
        }
        let e = env(values, &self.params, &[]);
        let row: Arc<[Value]> = select.projection.iter().map(|p| p.eval(&e)).collect();
        Some(std::borrow::Cow::Owned(row))
    }
}

impl Operator {
    /// For a view that can be built from its one table's rows alone (a filter or an
    /// aggregate, no subquery, reading the table by a full scan), a frozen version of those
    /// rows: the caller takes it under the read lock and builds with
    /// [`Operator::load_frozen`] after releasing it, so the writer waits microseconds however
    /// large the view. `None`: build with [`Operator::load`] under the lock.
    pub(crate) fn freeze(&self, select: &Select, db: &Db) -> Option<FrozenRows> {
        let scans = matches!(select.access, sluice_query::Access::Scan)
            && select.sources.len() == 1
            && select.subqueries.is_empty();
        if !scans || !matches!(self, Operator::Filter { .. } | Operator::Aggregate { .. }) {
            return None;
        }
        db.tables
            .get(&select.sources[0].schema.name)
            .map(|t| t.rows.clone())
    }

    /// [`Operator::load`] from a frozen version of the view's one table (see
    /// [`Operator::freeze`]): the same rows, without the `Db`.
    pub(crate) fn load_frozen(
        &mut self,
        select: &Select,
        rows: &FrozenRows,
        params: &[Value],
        rows_max: usize,
    ) -> Result<Vec<(RKey, Out)>, QueryError> {
        match self {
            Operator::Filter { identity } => {
                let identity = *identity;
                // Sized once (untouched capacity costs address space, not memory): grown by
                // doubling, a 5 M-row view copied ~600 MB on the live thread.
                let mut out = Vec::with_capacity(rows.len().min(rows_max.saturating_add(1)));
                for (k, r) in sluice_sched::paced(rows.iter()) {
                    if !passes(select, params, &r.values) {
                        continue;
                    }
                    if out.len() >= rows_max {
                        return Err(QueryError::Limit(format!(
                            "the view has more than {rows_max} rows; view_rows_max (--live-view-rows-max) is {rows_max}"
                        )));
                    }
                    let projected = project(
                        select,
                        params,
                        &r.values,
                        &[],
                        identity.then_some(&r.values),
                    );
                    out.push((vec![k.to_value()], projected));
                }
                Ok(out)
            }
            Operator::Aggregate { groups } => {
                let agg = select.aggregate.as_ref().expect("an aggregate plan");
                groups.clear();
                if agg.keys.is_empty() {
                    groups.insert(Vec::new(), Group::new(&agg.aggs));
                }
                for r in sluice_sched::paced(rows.values()) {
                    if passes(select, params, &r.values) {
                        let env = env(&r.values, params, &[]);
                        let key: RKey = agg.keys.iter().map(|k| k.eval(&env)).collect();
                        groups
                            .entry(key)
                            .or_insert_with(|| Group::new(&agg.aggs))
                            .add(&agg.aggs, &env, 1);
                        if groups.len() > rows_max {
                            return Err(QueryError::Limit(format!(
                                "the view has {} rows or more; view_rows_max (--live-view-rows-max) is {rows_max}",
                                groups.len()
                            )));
                        }
                    }
                }
                Ok(groups
                    .iter()
                    .filter_map(|(k, g)| group_out(select, params, k, g).map(|o| (k.clone(), o)))
                    .collect())
            }
            Operator::Join | Operator::Subquery { .. } | Operator::Reeval => {
                unreachable!("only filters and aggregates are frozen (Operator::freeze)")
            }
        }
    }
}
