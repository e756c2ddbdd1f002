//! Executing a [`Select`] against one consistent [`Db`] state.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use sluice_engine::table::Table;
use sluice_engine::{ColumnType, Db, Key, Value};

use crate::expr::{Env, Expr, SubqueryValues};
use crate::plan::{Access, AggFunc, AggSpec, JoinKind, Probe, Select, SortExpr, SortKey};
use crate::{QueryError, JOINED_ROWS_MAX, ROWS_MAX};

type Row = Vec<Value>;

/// One output row before sorting and windowing, with its identity in the result.
#[derive(Clone, Debug, PartialEq)]
pub struct Keyed {
    /// Identity in the result: the primary key of every source in order (`NULL` for the
    /// missing side of a `LEFT JOIN`), or the group's key values for a grouped query.
    pub key: Vec<Value>,
    /// The `ORDER BY` values, in order.
    pub sort: Vec<Value>,
    pub row: Vec<Value>,
}

pub(crate) fn run(select: &Select, db: &Db, params: &[Value]) -> Result<Vec<Row>, QueryError> {
    let mut output = evaluate(select, db, params)?;
    if !select.order_by.is_empty() {
        output.sort_by(|a, b| sort_cmp(&select.order_by, &a.sort, &b.sort));
    }
    let (offset, limit) = window(select, params)?;
    let rows: Vec<Row> = output
        .into_iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .map(|k| k.row)
        .collect();
    if rows.len() > ROWS_MAX {
        return Err(QueryError::Limit(format!(
            "the result has {} rows; rows_per_query_max is {ROWS_MAX} (add a LIMIT)",
            rows.len()
        )));
    }
    Ok(rows)
}

/// `OFFSET` and `LIMIT` of `select` (`None`: no limit).
pub fn window(select: &Select, params: &[Value]) -> Result<(usize, Option<usize>), QueryError> {
    let env = Env {
        row: &[],
        params,
        aggs: &[],
        subqueries: &[],
    };
    let offset = match &select.offset {
        Some(e) => count(&e.eval(&env), "OFFSET")?.unwrap_or(0),
        None => 0,
    };
    let limit = match &select.limit {
        Some(e) => count(&e.eval(&env), "LIMIT")?,
        None => None,
    };
    Ok((offset, limit))
}

/// The values of each `IN (SELECT …)` subquery of `select`.
pub fn subquery_values(
    select: &Select,
    db: &Db,
    params: &[Value],
) -> Result<Vec<SubqueryValues>, QueryError> {
    subqueries_of(&select.subqueries, db, params)
}

/// The values of each of `selects` (one-column `IN (SELECT …)` subqueries).
pub fn subqueries_of(
    selects: &[Select],
    db: &Db,
    params: &[Value],
) -> Result<Vec<SubqueryValues>, QueryError> {
    let mut subqueries = Vec::with_capacity(selects.len());
    for s in selects {
        let mut values = SubqueryValues::default();
        for mut row in run(s, db, params)? {
            let v = row.swap_remove(0);
            if v.is_null() {
                values.has_null = true;
            } else {
                values.values.insert(v);
            }
        }
        subqueries.push(values);
    }
    Ok(subqueries)
}

/// Every output row of `select` (unsorted, before `OFFSET`/`LIMIT`), with its key and sort
/// values.
pub fn evaluate(select: &Select, db: &Db, params: &[Value]) -> Result<Vec<Keyed>, QueryError> {
    evaluate_from(select, db, params, None)
}

/// The output rows of `select` whose first table's row is the one with primary key
/// `anchor` (none if it does not exist or fails the filter): the part of a join's result
/// that one row of its first table produces.
pub fn evaluate_anchor(
    select: &Select,
    db: &Db,
    params: &[Value],
    anchor: &Key,
) -> Result<Vec<Keyed>, QueryError> {
    evaluate_from(select, db, params, Some(anchor))
}

fn evaluate_from(
    select: &Select,
    db: &Db,
    params: &[Value],
    anchor: Option<&Key>,
) -> Result<Vec<Keyed>, QueryError> {
    let subqueries = subquery_values(select, db, params)?;
    let cx = Cx {
        params,
        subqueries: &subqueries,
    };

    // Tables, checked against the schema the plan was made for.
    let tables: Vec<&Table> = select
        .sources
        .iter()
        .map(|s| {
            let t = db.tables.get(&s.schema.name).ok_or_else(|| {
                QueryError::NotFound(format!("no table named {:?}", s.schema.name))
            })?;
            if *t.schema != *s.schema {
                return Err(QueryError::Schema(format!(
                    "table {:?} changed since the query was planned; prepare it again",
                    s.schema.name
                )));
            }
            Ok(t)
        })
        .collect::<Result<_, _>>()?;

    if select.sources.is_empty() {
        // SELECT without FROM: one row of constants, if the WHERE holds.
        let env = cx.env(&[]);
        let holds = [&select.base_filter, &select.filter]
            .into_iter()
            .all(|f| f.as_ref().is_none_or(|f| f.is_true(&env)));
        if !holds {
            return Ok(Vec::new());
        }
        let row: Vec<Value> = select.projection.iter().map(|e| e.eval(&env)).collect();
        return Ok(vec![Keyed {
            key: Vec::new(),
            sort: Vec::new(),
            row,
        }]);
    }

    // The first table, narrowed by its access path and its own WHERE conjuncts.
    let mut rows: Vec<Row> = Vec::new();
    let mut push_base = |values: &Arc<[Value]>| -> Result<(), QueryError> {
        if select
            .base_filter
            .as_ref()
            .is_none_or(|f| f.is_true(&cx.env(values)))
        {
            if rows.len() >= JOINED_ROWS_MAX {
                return Err(joined_limit());
            }
            rows.push(values.to_vec());
        }
        Ok(())
    };
    let base = tables[0];
    let constant = |e: &Expr| e.eval(&cx.env(&[]));
    let anchored = anchor.map(|k| Access::Key(Expr::Literal(k.to_value())));
    match anchored.as_ref().unwrap_or(&select.access) {
        Access::Scan => {
            for r in base.rows.values() {
                push_base(&r.values)?;
            }
        }
        Access::Key(e) => {
            if let Some(key) = to_key(&constant(e), base.schema.pk_column().ty) {
                if let Some(r) = base.rows.get(&key) {
                    push_base(&r.values)?;
                }
            }
        }
        Access::KeyRange { low, high } => {
            let ty = base.schema.pk_column().ty;
            let bound = |e: &Option<Expr>| -> Option<Option<Key>> {
                match e {
                    None => Some(None),
                    Some(e) => to_key(&constant(e), ty).map(Some),
                }
            };
            match (bound(low), bound(high)) {
                (Some(lo), Some(hi)) if lo.is_some() || hi.is_some() => {
                    let lo = lo.map_or(Bound::Unbounded, Bound::Included);
                    let hi = hi.map_or(Bound::Unbounded, Bound::Included);
                    if !matches!((&lo, &hi), (Bound::Included(a), Bound::Included(b)) if a > b) {
                        for (_, r) in base.rows.range((lo, hi)) {
                            push_base(&r.values)?;
                        }
                    }
                }
                // A bound of another type (or NULL): scan; the filter decides.
                _ => {
                    for r in base.rows.values() {
                        push_base(&r.values)?;
                    }
                }
            }
        }
        Access::IndexEq { index, value } => {
            let v = constant(value);
            if !v.is_null() {
                for key in index_range(base, *index, Some(&v), Some(&v)) {
                    push_base(&base.rows[key].values)?;
                }
            }
        }
        Access::IndexRange { index, low, high } => {
            let lo = low.as_ref().map(constant);
            let hi = high.as_ref().map(constant);
            if !lo.as_ref().is_some_and(Value::is_null) && !hi.as_ref().is_some_and(Value::is_null)
            {
                for key in index_range(base, *index, lo.as_ref(), hi.as_ref()) {
                    push_base(&base.rows[key].values)?;
                }
            }
        }
    }

    // Joins, left to right.
    for join in &select.joins {
        let right = tables[join.source];
        let width = right.schema.columns.len();
        let hashed: BTreeMap<Value, Vec<&Arc<[Value]>>> = if join.probe == Probe::Hashed {
            let mut map: BTreeMap<Value, Vec<&Arc<[Value]>>> = BTreeMap::new();
            for r in right.rows.values() {
                let mut v = r.values[join.right_column].clone();
                if let Some(aff) = join.right_affinity {
                    v = aff.apply(v);
                }
                if !v.is_null() {
                    map.entry(v).or_default().push(&r.values);
                }
            }
            map
        } else {
            BTreeMap::new()
        };
        let mut out = Vec::new();
        for left in rows {
            let k = join.left_key.eval(&cx.env(&left));
            let mut matches: Vec<&Arc<[Value]>> = Vec::new();
            if !k.is_null() {
                match join.probe {
                    Probe::PrimaryKey => {
                        if let Some(key) = to_key(&k, right.schema.pk_column().ty) {
                            if let Some(r) = right.rows.get(&key) {
                                matches.push(&r.values);
                            }
                        }
                    }
                    Probe::Index(ix) => {
                        for key in index_range(right, ix, Some(&k), Some(&k)) {
                            matches.push(&right.rows[key].values);
                        }
                    }
                    Probe::Hashed => {
                        if let Some(rs) = hashed.get(&k) {
                            matches.extend(rs.iter().copied());
                        }
                    }
                }
            }
            let mut matched = false;
            for m in matches {
                let mut row = left.clone();
                row.extend(m.iter().cloned());
                if join
                    .residual
                    .as_ref()
                    .is_none_or(|f| f.is_true(&cx.env(&row)))
                {
                    matched = true;
                    if out.len() >= JOINED_ROWS_MAX {
                        return Err(joined_limit());
                    }
                    out.push(row);
                }
            }
            if !matched && join.kind == JoinKind::Left {
                let mut row = left;
                row.extend(std::iter::repeat_n(Value::Null, width));
                out.push(row);
            }
        }
        rows = out;
    }

    if let Some(f) = &select.filter {
        rows.retain(|r| f.is_true(&cx.env(r)));
    }

    // Projection (after grouping, if any), with the sort keys of each output row.
    let mut output: Vec<Keyed> = Vec::new();
    let pk_positions: Vec<usize> = select
        .sources
        .iter()
        .map(|s| s.offset + s.schema.pk)
        .collect();
    let mut emit = |key: Row, e: Env<'_>| {
        let projected: Row = select.projection.iter().map(|p| p.eval(&e)).collect();
        let keys: Row = select
            .order_by
            .iter()
            .map(|k| match &k.expr {
                SortExpr::Output(i) => projected[*i].clone(),
                SortExpr::Expr(x) => x.eval(&e),
            })
            .collect();
        output.push(Keyed {
            key,
            sort: keys,
            row: projected,
        });
    };
    match &select.aggregate {
        None => {
            for r in &rows {
                let key = pk_positions.iter().map(|&i| r[i].clone()).collect();
                emit(key, cx.env(r));
            }
        }
        Some(agg) => {
            let mut groups: BTreeMap<Row, Vec<AggState>> = BTreeMap::new();
            if agg.keys.is_empty() {
                groups.insert(Vec::new(), agg.aggs.iter().map(AggState::new).collect());
            }
            for r in &rows {
                let e = cx.env(r);
                let key: Row = agg.keys.iter().map(|k| k.eval(&e)).collect();
                let states = groups
                    .entry(key)
                    .or_insert_with(|| agg.aggs.iter().map(AggState::new).collect());
                for (state, spec) in states.iter_mut().zip(&agg.aggs) {
                    state.add(spec.arg.as_ref().map(|a| a.eval(&e)));
                }
            }
            for (key, states) in groups {
                let aggs: Row = states.into_iter().map(AggState::finish).collect();
                let e = Env {
                    row: &key,
                    params,
                    aggs: &aggs,
                    subqueries: &subqueries,
                };
                if agg.having.as_ref().is_none_or(|h| h.is_true(&e)) {
                    emit(key.clone(), e);
                }
            }
        }
    }

    Ok(output)
}

struct Cx<'a> {
    params: &'a [Value],
    subqueries: &'a [SubqueryValues],
}

impl<'a> Cx<'a> {
    fn env<'r>(&self, row: &'r [Value]) -> Env<'r>
    where
        'a: 'r,
    {
        Env {
            row,
            params: self.params,
            aggs: &[],
            subqueries: self.subqueries,
        }
    }
}

fn joined_limit() -> QueryError {
    QueryError::Limit(format!(
        "the query reads more than joined_rows_max ({JOINED_ROWS_MAX}) rows before grouping and LIMIT; narrow it with WHERE"
    ))
}

/// LIMIT / OFFSET value: a negative LIMIT means none (as in SQLite).
fn count(v: &Value, what: &str) -> Result<Option<usize>, QueryError> {
    match v {
        Value::Integer(i) if *i < 0 => Ok(None),
        Value::Integer(i) => Ok(Some(*i as usize)),
        other => Err(QueryError::BadRequest(format!(
            "{what} must be an integer, got {}",
            other.to_json()
        ))),
    }
}

/// Compares two rows of `ORDER BY` values under `keys`.
pub fn sort_cmp(keys: &[SortKey], a: &[Value], b: &[Value]) -> Ordering {
    keys.iter()
        .zip(a.iter().zip(b))
        .map(|(k, (x, y))| sort_value_cmp(x, y, k.desc, k.nulls_first))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// Compares two values of one `ORDER BY` key: `desc` reverses, `nulls_first` places NULL
/// (without it NULL is the smallest value, as in SQLite).
pub fn sort_value_cmp(x: &Value, y: &Value, desc: bool, nulls_first: Option<bool>) -> Ordering {
    match (nulls_first, x.is_null(), y.is_null()) {
        (Some(first), true, false) => {
            if first {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (Some(first), false, true) => {
            if first {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        (Some(_), true, true) => Ordering::Equal,
        _ => {
            let o = x.cmp(y);
            if desc {
                o.reverse()
            } else {
                o
            }
        }
    }
}

/// The key a value would have in a primary key of type `ty`, if it can equal one.
pub fn to_key(v: &Value, ty: ColumnType) -> Option<Key> {
    match (v, ty) {
        (Value::Integer(i), ColumnType::Integer) => Some(Key::Int(*i)),
        (Value::Boolean(b), ColumnType::Integer) => Some(Key::Int(*b as i64)),
        (Value::Real(r), ColumnType::Integer)
            if r.fract() == 0.0 && *r >= i64::MIN as f64 && *r < i64::MAX as f64 =>
        {
            Some(Key::Int(*r as i64))
        }
        (Value::Text(s), ColumnType::Text) => Some(Key::Text(s.clone())),
        _ => None,
    }
}

/// Keys of rows whose first indexed value lies in `[low, high]` (open where `None`).
pub fn index_range<'t>(
    table: &'t Table,
    index: usize,
    low: Option<&Value>,
    high: Option<&Value>,
) -> impl Iterator<Item = &'t Key> + 't {
    let start = match low {
        Some(v) => Bound::Included((vec![v.clone()].into_boxed_slice(), Key::Int(i64::MIN))),
        None => Bound::Unbounded,
    };
    let high = high.cloned();
    table.indexes[index]
        .range((start, Bound::Unbounded))
        .take_while(move |(vals, _)| high.as_ref().is_none_or(|h| vals[0] <= *h))
        .map(|(_, k)| k)
}

/// The running state of one aggregate over a group.
enum AggState {
    Count(i64),
    Sum {
        int: i64,
        real: f64,
        is_real: bool,
        any: bool,
    },
    Min(Option<Value>),
    Max(Option<Value>),
    Avg {
        sum: f64,
        n: i64,
    },
}

impl AggState {
    fn new(spec: &AggSpec) -> AggState {
        match spec.func {
            AggFunc::CountStar | AggFunc::Count => AggState::Count(0),
            AggFunc::Sum => AggState::Sum {
                int: 0,
                real: 0.0,
                is_real: false,
                any: false,
            },
            AggFunc::Min => AggState::Min(None),
            AggFunc::Max => AggState::Max(None),
            AggFunc::Avg => AggState::Avg { sum: 0.0, n: 0 },
        }
    }

    /// `v` is `None` for `COUNT(*)`.
    fn add(&mut self, v: Option<Value>) {
        let Some(v) = v else {
            if let AggState::Count(n) = self {
                *n += 1;
            }
            return;
        };
        if v.is_null() {
            return;
        }
        match self {
            AggState::Count(n) => *n += 1,
            AggState::Sum {
                int,
                real,
                is_real,
                any,
            } => {
                *any = true;
                let as_int = match v {
                    Value::Integer(i) | Value::Timestamp(i) => Some(i),
                    Value::Boolean(b) => Some(b as i64),
                    _ => None,
                };
                match as_int {
                    Some(i) if !*is_real => match int.checked_add(i) {
                        Some(s) => *int = s,
                        None => {
                            // Integer overflow: continue in REAL.
                            *is_real = true;
                            *real = *int as f64 + i as f64;
                        }
                    },
                    _ => {
                        if !*is_real {
                            *is_real = true;
                            *real = *int as f64;
                        }
                        *real += as_f64(&v);
                    }
                }
            }
            AggState::Min(m) => {
                if m.as_ref().is_none_or(|cur| v < *cur) {
                    *m = Some(v);
                }
            }
            AggState::Max(m) => {
                if m.as_ref().is_none_or(|cur| v > *cur) {
                    *m = Some(v);
                }
            }
            AggState::Avg { sum, n } => {
                *sum += as_f64(&v);
                *n += 1;
            }
        }
    }

    fn finish(self) -> Value {
        match self {
            AggState::Count(n) => Value::Integer(n),
            AggState::Sum { any: false, .. } => Value::Null,
            AggState::Sum {
                is_real: true,
                real,
                ..
            } => Value::Real(real),
            AggState::Sum { int, .. } => Value::Integer(int),
            AggState::Min(m) | AggState::Max(m) => m.unwrap_or(Value::Null),
            AggState::Avg { n: 0, .. } => Value::Null,
            AggState::Avg { sum, n } => Value::Real(sum / n as f64),
        }
    }
}

fn as_f64(v: &Value) -> f64 {
    match crate::expr::binary(crate::expr::BinOp::Add, v, &Value::Real(0.0)) {
        Value::Real(r) => r,
        _ => 0.0,
    }
}
