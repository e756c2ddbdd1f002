//! [`Live`]: the registry of views — sharing, routing, subscribing, resuming, following
//! commits, expiring idle views. Single-threaded by design (it runs on the live thread, see
//! [`crate::thread`]); tests drive it directly.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{Change, Commit, CommitBody, Db, Value};
use sluice_query::expr::BinOp;
use sluice_query::{Expr, Params, Plan, QueryError, Select};

use crate::chunked::FrozenTable;
use crate::fold::Fold;
use crate::operator::{FrozenRows, Operator, RowPick};
use crate::sink::{Event, EventKind, Pushed, Sink};
use crate::view::Materialized;
use crate::Limits;

pub type SubId = u64;
use crate::compact::{IdleQueue, QueryIndex, Subs, ViewId};

/// A subscription request.
#[derive(Clone, Debug)]
pub struct Subscribe {
    pub sql: String,
    pub params: Params,
    /// Resume after this seq (the last event the client saw).
    pub since: Option<u64>,
    /// A client's claims: the query then reads every table through its `SELECT` policies
    /// with these claims bound (`None`: the admin, no rules).
    pub claims: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What every view of one query text shares: the plan and what is derived from it.
pub(crate) struct Shape {
    sql: String,
    /// Planned for a client (through the row policies).
    client: bool,
    /// The normalised statement (`Plan::text`), shared by every view's registry key.
    text: Arc<str>,
    pub(crate) plan: Plan,
    columns: Arc<[String]>,
    /// The output types as a snapshot sends them.
    types: Arc<serde_json::Value>,
    order: crate::view::Order,
    /// Tables read, with subqueries'.
    tables: BTreeSet<String>,
    /// Where a view of this shape registers when its operator can be routed by value (see
    /// [`equality_route`]): found once per shape instead of once per view.
    route: Option<RouteOf>,
}

/// A `column = value` conjunct of a shape's `WHERE`, with where each view finds the value.
#[derive(Clone, Debug)]
struct RouteOf {
    column: usize,
    value: RouteValue,
}

#[derive(Clone, Debug)]
enum RouteValue {
    Literal(Value),
    Param(usize),
    /// A parameter with the comparison's affinity applied (`a = $1` with "3" routes under 3).
    Affinity(sluice_query::expr::Affinity, usize),
}

impl Shape {
    fn new(sql: String, client: bool, plan: Plan) -> Shape {
        let mut tables = BTreeSet::new();
        tables_of(&plan.select, &mut tables);
        Shape {
            sql,
            client,
            text: plan.text.as_str().into(),
            columns: plan.select.columns.clone().into(),
            types: Arc::new(sluice_query::plan::types_json(&plan.select.output_types())),
            order: plan
                .select
                .order_by
                .iter()
                .map(|k| (k.desc, k.nulls_first))
                .collect(),
            tables,
            route: route_of(&plan.select),
            plan,
        }
    }
}

struct View {
    shape: Arc<Shape>,
    params: Box<[Value]>,
    op: Operator,
    mat: Materialized,
    /// The seq the materialisation reflects.
    seq: u64,
    /// Diff events after `history_from`, for resuming subscribers: boxed, and only once the
    /// view has published a diff (most idle views never have).
    history: Option<Box<History>>,
    history_from: u64,
    /// Almost always one: held inline then ([`Subs`]).
    subs: Subs,
    /// How many of `subs` coalesce (have a [`Fold`]): 0 for almost every view, which then
    /// publishes without looking any subscriber up.
    folding: u32,
    idle_since: Option<Instant>,
    route: Route,
}

#[derive(Default)]
struct History {
    events: VecDeque<Arc<Event>>,
    bytes: usize,
}

/// How commits find a view.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    /// Every change to the view's tables.
    Tables,
    /// Changes to the view's one table whose old or new row has a value at a column (a
    /// `column = value` conjunct of the view's `WHERE`): both found again from the shape and
    /// the parameters ([`equality_route`]) rather than kept in every view.
    Equal,
}

#[derive(Default)]
struct TableRoutes {
    all: BTreeSet<ViewId>,
    equal: BTreeMap<usize, BTreeMap<Value, Ids>>,
}

/// The views routed through one `(table, column, value)`: almost always exactly one, which
/// then needs no allocation of its own (100 K scoped views are 100 K of these). 16 bytes:
/// the rare list is boxed, so the common entry of the route's B-tree stays small.
#[derive(Debug)]
enum Ids {
    One(ViewId),
    #[allow(clippy::box_collection)] // a Vec inline would make every entry 32 bytes
    Many(Box<Vec<ViewId>>),
}

impl Ids {
    fn add(&mut self, id: ViewId) {
        match self {
            Ids::One(first) => *self = Ids::Many(Box::new(vec![*first, id])),
            Ids::Many(ids) => ids.push(id),
        }
    }

    /// Removes `id`; whether none is left.
    fn remove(&mut self, id: ViewId) -> bool {
        match self {
            Ids::One(only) => *only == id,
            Ids::Many(ids) => {
                ids.retain(|&i| i != id);
                match ids[..] {
                    [] => true,
                    [only] => {
                        *self = Ids::One(only);
                        false
                    }
                    _ => false,
                }
            }
        }
    }

    fn as_slice(&self) -> &[ViewId] {
        match self {
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(ids) => ids,
        }
    }
}

/// Counters for `/metrics` and the bench.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveStats {
    pub views: usize,
    pub subscribers: usize,
    pub commits: u64,
    /// View updates (one per view a commit reached).
    pub view_updates: u64,
    pub diffs: u64,
    pub resets: u64,
    pub slow_closed: u64,
    /// Top-k views whose kept rows ran short of their window and were read again.
    pub refills: u64,
    /// Folded diffs sent to coalescing subscribers, and the diffs folded into them.
    pub folds_sent: u64,
    pub diffs_folded: u64,
}

pub struct Live {
    limits: Limits,
    /// Boxed: the map's spare slots then cost a pointer, not a whole view.
    views: HashMap<ViewId, Box<View>>,
    /// By normalised text and the canonical bytes of the parameters (so `1` and `1.0` differ).
    by_query: QueryIndex,
    /// Views without subscribers, in the order they lost them (for expiry).
    idle: IdleQueue,
    /// By query text: `[0]` planned for the admin, `[1]` for a client.
    plans: [HashMap<String, Arc<Shape>>; 2],
    /// Scratch for a view's canonical parameter bytes.
    key_buf: Vec<u8>,
    routes: HashMap<String, TableRoutes>,
    subs: HashMap<SubId, (ViewId, Arc<Sink>)>,
    /// The coalescing subscribers' windows, and when each open one is due.
    folds: HashMap<SubId, Fold>,
    fold_due: BinaryHeap<Reverse<(Instant, SubId)>>,
    next_id: u64,
    stats: LiveStats,
    /// A view whose snapshot is streaming while it waits to be built
    /// ([`Live::finish_pending`]).
    pending: Option<Box<Pending>>,
}

/// A new view registered by [`Live::subscribe_streaming`] and built by
/// [`Live::finish_pending`]: its one subscriber already holds the snapshot, encoded from
/// `frozen` (the table at `seq`) while the view is built from the same rows.
struct Pending {
    id: ViewId,
    sub: SubId,
    hash: u64,
    shape: Arc<Shape>,
    params: Box<[Value]>,
    frozen: FrozenRows,
    seq: u64,
    snapshot: Arc<crate::chunked::ChunkedSnapshot>,
    sink: Arc<Sink>,
}

/// A `column = literal/parameter` conjunct of a one-table `WHERE`, if there is one.
fn route_of(select: &Select) -> Option<RouteOf> {
    if select.sources.len() != 1 {
        return None;
    }
    let conj = select.base_filter.iter().chain(select.filter.iter());
    for f in conj {
        for c in sluice_query::plan::conjuncts(f.clone()) {
            if let Expr::Binary(BinOp::Eq, a, b) = &c {
                let (col, val) = match (&**a, &**b) {
                    (Expr::Column(i), v) | (v, Expr::Column(i)) => (*i, v),
                    _ => continue,
                };
                // A literal already has the comparison's affinity applied; a parameter is
                // wrapped in it (`a = $1` with "3" routes under a = 3).
                let value = match val {
                    Expr::Literal(v) => RouteValue::Literal(v.clone()),
                    Expr::Param(p) => RouteValue::Param(*p),
                    Expr::Affinity(aff, e) => match &**e {
                        Expr::Param(p) => RouteValue::Affinity(*aff, *p),
                        _ => continue,
                    },
                    _ => continue,
                };
                return Some(RouteOf { column: col, value });
            }
        }
    }
    None
}

/// The `(column, value)` a view of `shape` with `params` is routed under, if any.
fn equality_route(shape: &Shape, params: &[Value]) -> Option<(usize, Value)> {
    let r = shape.route.as_ref()?;
    let value = match &r.value {
        RouteValue::Literal(v) => v.clone(),
        RouteValue::Param(p) => params[*p].clone(),
        RouteValue::Affinity(aff, p) => aff.apply(params[*p].clone()),
    };
    Some((r.column, value))
}

fn tables_of(select: &Select, out: &mut BTreeSet<String>) {
    for s in &select.sources {
        out.insert(s.schema.name.clone());
    }
    for s in &select.subqueries {
        tables_of(s, out);
    }
}

/// Brings a view that reads the `Db` (join, re-evaluated) from its seq to `db.seq`. A join
/// view re-evaluates only the anchors the commits in between touched, found through the
/// changelog (commits after `view.seq` up to `db.seq`, which may be ahead of the commit being
/// followed); past the changelog's horizon, or for other shapes, the whole query re-runs.
fn read_deltas(
    view: &mut View,
    db: &Db,
    rows_max: usize,
) -> Result<BTreeMap<crate::view::RKey, Option<crate::view::Out>>, QueryError> {
    let select = &view.shape.plan.select;
    if matches!(view.op, Operator::Subquery { .. }) {
        if let Ok(commits) = db.changelog.since(view.seq) {
            let changes: Vec<&Change> = commits
                .filter_map(|c| match &c.body {
                    CommitBody::Rows(changes) => Some(changes),
                    CommitBody::Schema { .. } | CommitBody::Topic(_) => None,
                })
                .flatten()
                .filter(|c| view.shape.tables.contains(&c.table.name))
                .collect();
            let found =
                crate::operator::subquery_deltas(&mut view.op, select, db, &view.params, &changes)?;
            if let Some(deltas) = found {
                return Ok(deltas);
            }
        }
    }
    if matches!(view.op, Operator::Join) {
        if let Ok(commits) = db.changelog.since(view.seq) {
            let mut anchors = BTreeSet::new();
            for c in commits {
                if let CommitBody::Rows(changes) = &c.body {
                    for change in changes {
                        if view.shape.tables.contains(&change.table.name) {
                            crate::operator::join_anchors(select, db, change, &mut anchors);
                        }
                    }
                }
            }
            let mat = &view.mat;
            return crate::operator::join_deltas(select, db, &view.params, &anchors, |a| {
                mat.keys_with_first(a)
            });
        }
    }
    let rows = view.op.load(select, db, &view.params, rows_max)?;
    let mut deltas: BTreeMap<_, _> = view.mat.all().map(|(k, _)| (k.clone(), None)).collect();
    for (k, o) in rows {
        deltas.insert(k, Some(o));
    }
    Ok(deltas)
}

/// Whether every table `select` reads still has the schema it was planned for.
fn planned_for(select: &Select, db: &Db) -> bool {
    select.sources.iter().all(|s| {
        db.tables
            .get(&s.schema.name)
            // The same `Arc` (as almost always) needs no field-by-field comparison.
            .is_some_and(|t| Arc::ptr_eq(&t.schema, &s.schema) || t.schema == s.schema)
    }) && select.subqueries.iter().all(|q| planned_for(q, db))
}

/// The frozen table a new view's snapshot can stream from while the view is built (see
/// [`Live::subscribe_streaming`]): a filter over a full scan of one table with no `WHERE`
/// (so its rows are the table's, counted before they are read, and within
/// `view_rows_max`), unordered and without a window, too large for one message.
fn streams(shape: &Shape, params: &[Value], db: &Db, limits: &Limits) -> Option<FrozenRows> {
    let select = &shape.plan.select;
    let op = Operator::for_select(select);
    let plain = matches!(op, Operator::Filter { .. })
        && select.base_filter.is_none()
        && select.filter.is_none()
        && shape.order.is_empty()
        && matches!(sluice_query::window(select, params), Ok((0, None)));
    if !plain {
        return None;
    }
    let frozen = op.freeze(select, db)?;
    let rows = frozen.len();
    (rows > crate::chunked::SNAPSHOT_MESSAGE_ROWS_MAX && rows <= limits.view_rows_max)
        .then_some(frozen)
}

fn complexity(select: &Select) -> usize {
    select.sources.len() + select.subqueries.iter().map(complexity).sum::<usize>()
}

impl Live {
    pub fn new(limits: Limits) -> Live {
        Live {
            limits,
            views: HashMap::new(),
            by_query: QueryIndex::new(),
            idle: IdleQueue::default(),
            plans: Default::default(),
            key_buf: Vec::new(),
            routes: HashMap::new(),
            subs: HashMap::new(),
            folds: HashMap::new(),
            fold_due: BinaryHeap::new(),
            next_id: 1,
            stats: LiveStats::default(),
            pending: None,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn stats(&self) -> LiveStats {
        LiveStats {
            views: self.views.len() + usize::from(self.pending.is_some()),
            subscribers: self.subs.len(),
            ..self.stats
        }
    }

    /// Subscribes `sink` to the query, creating (from `db`) or sharing its view, and queues
    /// the snapshot — or, when `since` is within the view's history, exactly the diffs after
    /// it. `db` must be the state every commit up to `db.seq` was or will be applied from.
    pub fn subscribe(
        &mut self,
        db: &Db,
        req: &Subscribe,
        sink: Arc<Sink>,
    ) -> Result<SubId, QueryError> {
        self.subscribe_with(|| db, req, sink)
    }

    /// [`Live::subscribe`] with the `Db` behind a guard (a read lock) that is released as
    /// soon as a new view's rows are read — before they are ordered, hashed and rendered —
    /// so the writer waits only for the scan.
    pub fn subscribe_with<D: std::ops::Deref<Target = Db>>(
        &mut self,
        read: impl FnOnce() -> D,
        req: &Subscribe,
        sink: Arc<Sink>,
    ) -> Result<SubId, QueryError> {
        let sub = self.subscribe_streaming(read, req, sink);
        self.finish_pending();
        sub
    }

    /// [`Live::subscribe_with`], except that a large new view whose snapshot can be encoded
    /// from the table alone — `SELECT` of columns from one table, no `WHERE`, `ORDER BY` or
    /// window, more than [`crate::chunked::SNAPSHOT_MESSAGE_ROWS_MAX`] rows — is only
    /// registered: its subscriber gets a snapshot streamed from the frozen table at once,
    /// and the caller builds the view with [`Live::finish_pending`] after answering the
    /// subscribe (the live thread does so before it takes its next input), so the chunks go
    /// out while the view is built instead of after. Every other method finishes a pending
    /// build first.
    pub fn subscribe_streaming<D: std::ops::Deref<Target = Db>>(
        &mut self,
        read: impl FnOnce() -> D,
        req: &Subscribe,
        sink: Arc<Sink>,
    ) -> Result<SubId, QueryError> {
        self.finish_pending();
        let guard = read();
        let db: &Db = &guard;
        let client = req.claims.is_some();
        let shape = match self.plans[usize::from(client)].get(req.sql.as_str()) {
            // A plan cached before DDL the live thread has not followed yet is not reused.
            Some(p) if planned_for(&p.plan.select, db) => p.clone(),
            _ => {
                let plan = sluice_query::prepare_as(&req.sql, db, client)?;
                if plan.select.sources.is_empty() {
                    return Err(QueryError::unsupported(
                        "a live query without FROM (its result never changes)",
                    ));
                }
                let n = complexity(&plan.select);
                if n > self.limits.view_tables_max {
                    return Err(QueryError::Limit(format!(
                        "the query reads {n} tables (joins and subqueries); view_tables_max is {}",
                        self.limits.view_tables_max
                    )));
                }
                let plans = &mut self.plans[usize::from(client)];
                if plans.len() >= self.limits.plans_max {
                    plans.clear();
                }
                let shape = Arc::new(Shape::new(req.sql.clone(), client, plan));
                plans.insert(req.sql.clone(), shape.clone());
                shape
            }
        };
        let params = shape.plan.resolve_as(&req.params, req.claims.as_ref())?;
        let hash = self.key_hash(&shape.text, &params);
        let mut built = false;
        // The table version a view built now was read from, for its snapshot.
        let mut frozen = None;
        let found = self.find_view(hash, &shape.text, &params);
        let id = match found {
            Some(id) => id,
            None => {
                built = true;
                if self.views.len() >= self.limits.views_max {
                    self.expire(Instant::now(), true);
                    if self.views.len() >= self.limits.views_max {
                        return Err(QueryError::Limit(format!(
                            "the server holds {} live views; views_max (--live-views-max) is {}",
                            self.views.len(),
                            self.limits.views_max
                        )));
                    }
                }
                if let Some(frozen) = streams(&shape, &params, &guard, &self.limits) {
                    let seq = guard.seq;
                    drop(guard);
                    return Ok(self.start_streaming(
                        shape,
                        params.into(),
                        hash,
                        frozen,
                        seq,
                        req,
                        sink,
                    ));
                }
                let (view, table) = self.build_released(guard, shape, params.into())?;
                frozen = table;
                let id = self.next_id;
                self.next_id += 1;
                self.add_routes(id, &view);
                self.views.insert(id, Box::new(view));
                self.by_query.insert(hash, id);
                id
            }
        };
        let sub = self.next_id;
        self.next_id += 1;
        let view = self.views.get_mut(&id).expect("registered");
        view.subs.push(sub);
        view.idle_since = None;
        if sink.coalesce_ms() > 0 {
            view.folding += 1;
            self.folds.insert(sub, Fold::new(sink.coalesce_ms()));
        }
        // A view built just now has no past to vouch for: its first event is a snapshot.
        let resumable = req
            .since
            .filter(|&s| !built && s >= view.history_from && s <= view.seq);
        match resumable {
            Some(since) => {
                let past = view.history.iter().flat_map(|h| &h.events);
                for e in past.filter(|e| e.seq > since) {
                    sink.push_reset(e.clone());
                }
            }
            None => {
                let reset = req.since.is_some();
                let pick = frozen.and_then(|rows| {
                    let pick = RowPick::new(&view.op, view.shape.clone(), view.params.clone())?;
                    Some(FrozenTable { rows, pick })
                });
                let event = match pick {
                    Some(table) => view.mat.snapshot_event_from(view.seq, reset, table),
                    None => view.mat.snapshot_event(view.seq, reset),
                };
                sink.push_reset(Arc::new(event));
            }
        }
        self.subs.insert(sub, (id, sink));
        Ok(sub)
    }

    /// Registers a new view to be built by [`Live::finish_pending`], and queues its
    /// snapshot, streamed from `frozen` (see [`Live::subscribe_streaming`]).
    #[allow(clippy::too_many_arguments)]
    fn start_streaming(
        &mut self,
        shape: Arc<Shape>,
        params: Box<[Value]>,
        hash: u64,
        frozen: FrozenRows,
        seq: u64,
        req: &Subscribe,
        sink: Arc<Sink>,
    ) -> SubId {
        let id = self.next_id;
        let sub = self.next_id + 1;
        self.next_id += 2;
        let op = Operator::for_select(&shape.plan.select);
        let pick =
            RowPick::new(&op, shape.clone(), params.clone()).expect("streams() takes filters");
        let table = FrozenTable {
            rows: frozen.clone(),
            pick,
        };
        let snapshot = Arc::new(crate::chunked::ChunkedSnapshot::streaming(
            seq,
            req.since.is_some(),
            shape.columns.clone(),
            shape.types.clone(),
            table,
            frozen.len(),
        ));
        sink.push_reset(Arc::new(Event {
            seq,
            kind: EventKind::Snapshot,
            json: String::new(),
            chunked: Some(snapshot.clone()),
        }));
        self.subs.insert(sub, (id, sink.clone()));
        self.pending = Some(Box::new(Pending {
            id,
            sub,
            hash,
            shape,
            params,
            frozen,
            seq,
            snapshot,
            sink,
        }));
        sub
    }

    /// Builds the view [`Live::subscribe_streaming`] registered, if any, and hands its
    /// checksum to the snapshot being streamed.
    pub fn finish_pending(&mut self) {
        let Some(p) = self.pending.take() else {
            return;
        };
        let Pending {
            id,
            sub,
            hash,
            shape,
            params,
            frozen,
            seq,
            snapshot,
            sink,
        } = *p;
        let select = &shape.plan.select;
        let mut op = Operator::for_select(select);
        let built = op
            .load_frozen(select, &frozen, &params, self.limits.view_rows_max)
            .and_then(|rows| Self::finish(shape.clone(), params, op, rows, seq, &self.limits));
        drop(frozen);
        let mut view = match built {
            Ok(view) => view,
            // Not expected (`streams` checked the row limit, and the rows need no more
            // than the table), but a subscriber is never left waiting.
            Err(e) => {
                snapshot.set_checksum(None);
                self.subs.remove(&sub);
                sink.fail(crate::error_code(&e), &e.to_string());
                return;
            }
        };
        snapshot.set_checksum(Some(view.mat.checksum()));
        self.add_routes(id, &view);
        view.subs.push(sub);
        view.idle_since = None;
        if sink.coalesce_ms() > 0 {
            view.folding += 1;
            self.folds.insert(sub, Fold::new(sink.coalesce_ms()));
        }
        self.views.insert(id, Box::new(view));
        self.by_query.insert(hash, id);
    }

    /// Builds a new view from the `Db` behind `guard` (a read lock), holding it as briefly
    /// as the shape allows: a filter or aggregate that scans its one table takes only a
    /// frozen version of the table's rows and the seq under the lock (O(rows / chunk):
    /// microseconds at a million rows) and reads, projects, orders and hashes them after
    /// releasing it; other shapes read their rows under the lock as before.
    fn build_released<D: std::ops::Deref<Target = Db>>(
        &self,
        guard: D,
        shape: Arc<Shape>,
        params: Box<[Value]>,
    ) -> Result<(View, Option<FrozenRows>), QueryError> {
        let select = &shape.plan.select;
        let mut op = Operator::for_select(select);
        let rows_max = self.limits.view_rows_max;
        let (rows, seq, frozen) = match op.freeze(select, &guard) {
            Some(frozen) => {
                let seq = guard.seq;
                drop(guard);
                let rows = op.load_frozen(select, &frozen, &params, rows_max)?;
                (rows, seq, Some(frozen))
            }
            None => {
                let rows = op.load(select, &guard, &params, rows_max)?;
                let seq = guard.seq;
                drop(guard);
                (rows, seq, None)
            }
        };
        let view = Self::finish(shape, params, op, rows, seq, &self.limits)?;
        Ok((view, frozen))
    }

    fn build(&self, db: &Db, shape: Arc<Shape>, params: Box<[Value]>) -> Result<View, QueryError> {
        let (op, rows, seq) = self.load(db, &shape, &params)?;
        Self::finish(shape, params, op, rows, seq, &self.limits)
    }

    /// The part of building a view that reads the `Db`.
    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        db: &Db,
        shape: &Shape,
        params: &[Value],
    ) -> Result<(Operator, Vec<(crate::view::RKey, crate::view::Out)>, u64), QueryError> {
        let select = &shape.plan.select;
        let mut op = Operator::for_select(select);
        let rows = op.load(select, db, params, self.limits.view_rows_max)?;
        Ok((op, rows, db.seq))
    }

    /// The rest of building a view, without the `Db`.
    fn finish(
        shape: Arc<Shape>,
        params: Box<[Value]>,
        op: Operator,
        rows: Vec<(crate::view::RKey, crate::view::Out)>,
        seq: u64,
        limits: &Limits,
    ) -> Result<View, QueryError> {
        let select = &shape.plan.select;
        let (offset, limit) = sluice_query::window(select, &params)?;
        // A top-k filter keeps only its first rows and refills them from the table (through
        // the plan's index, if any) when rows leave; other shapes keep their whole result.
        let spare = matches!(op, Operator::Filter { .. }).then_some(limits.top_k_spare_rows);
        let mut mat = Materialized::new(
            shape.columns.clone(),
            shape.order.clone(),
            offset,
            limit,
            spare,
        );
        mat.types = shape.types.clone();
        mat.load(rows);
        let route = match (&op, &shape.route) {
            (Operator::Filter { .. } | Operator::Aggregate { .. }, Some(_)) => Route::Equal,
            _ => Route::Tables,
        };
        Ok(View {
            shape,
            params,
            op,
            mat,
            seq,
            history: None,
            history_from: seq,
            subs: Subs::default(),
            folding: 0,
            idle_since: Some(Instant::now()),
            route,
        })
    }

    fn add_routes(&mut self, id: ViewId, view: &View) {
        match &view.route {
            Route::Tables => {
                for t in &view.shape.tables {
                    self.table_routes(t).all.insert(id);
                }
            }
            Route::Equal => {
                let (column, value) =
                    equality_route(&view.shape, &view.params).expect("a routed shape");
                let by_value = self
                    .table_routes(&view.shape.plan.select.sources[0].schema.name)
                    .equal
                    .entry(column)
                    .or_default();
                match by_value.get_mut(&value) {
                    Some(ids) => ids.add(id),
                    None => {
                        by_value.insert(value, Ids::One(id));
                    }
                }
            }
        }
    }

    /// The routes of `table`, registered on first use (without copying its name on every
    /// subscribe, as `entry` would).
    fn table_routes(&mut self, table: &str) -> &mut TableRoutes {
        if !self.routes.contains_key(table) {
            self.routes
                .insert(table.to_string(), TableRoutes::default());
        }
        self.routes.get_mut(table).expect("inserted")
    }

    fn remove_routes(&mut self, id: ViewId, view: &View) {
        match &view.route {
            Route::Tables => {
                for t in &view.shape.tables {
                    if let Some(r) = self.routes.get_mut(t) {
                        r.all.remove(&id);
                    }
                }
            }
            Route::Equal => {
                let (column, value) =
                    equality_route(&view.shape, &view.params).expect("a routed shape");
                let table = &view.shape.plan.select.sources[0].schema.name;
                if let Some(r) = self.routes.get_mut(table) {
                    if let Some(by_value) = r.equal.get_mut(&column) {
                        if by_value.get_mut(&value).is_some_and(|ids| ids.remove(id)) {
                            by_value.remove(&value);
                        }
                        if by_value.is_empty() {
                            r.equal.remove(&column);
                        }
                    }
                }
            }
        }
    }

    pub fn unsubscribe(&mut self, sub: SubId) {
        self.finish_pending();
        if let Some((view_id, sink)) = self.subs.remove(&sub) {
            sink.close();
            let folded = self.folds.remove(&sub).is_some();
            if let Some(view) = self.views.get_mut(&view_id) {
                view.subs.remove(sub);
                view.folding -= u32::from(folded);
                if view.subs.is_empty() {
                    let now = Instant::now();
                    view.idle_since = Some(now);
                    self.note_idle(now, view_id);
                }
            }
        }
    }

    /// Puts a view that just lost its last subscriber on the expiry queue.
    fn note_idle(&mut self, now: Instant, id: ViewId) {
        let views = &self.views;
        self.idle.push(now, id, views.len(), |t, i| {
            views.get(&i).is_some_and(|v| v.idle_since == Some(t))
        });
    }

    /// The hash of a view's sharing key: its normalised text and its parameters' canonical
    /// bytes (so `1` and `1.0` differ).
    fn key_hash(&mut self, text: &str, params: &[Value]) -> u64 {
        self.key_buf.clear();
        crate::checksum::canonical_bytes(params, &mut self.key_buf);
        self.by_query.hash(text, &self.key_buf)
    }

    /// The view shared by `(text, params)` whose key hashed to `hash`, if any.
    fn find_view(&self, hash: u64, text: &str, params: &[Value]) -> Option<ViewId> {
        let views = &self.views;
        self.by_query.find(hash, |id| {
            views
                .get(&id)
                .is_some_and(|v| &*v.shape.text == text && same_params(&v.params, params))
        })
    }

    /// Drops views idle for longer than the TTL (all idle views if `all_idle`).
    /// O(views expired), not O(views): the idle ones wait on a queue in the order they
    /// became idle.
    pub fn expire(&mut self, now: Instant, all_idle: bool) -> usize {
        self.finish_pending();
        let ttl = self.limits.idle_ttl;
        let mut n = 0;
        for (at, id) in self.idle.due(now, ttl, all_idle) {
            // Skip entries of views subscribed again (or dropped) since.
            if self
                .views
                .get(&id)
                .is_some_and(|v| v.idle_since == Some(at))
            {
                // Paced only on the live thread's own expiry pass: with `all_idle` the caller
                // (a subscribe at `views_max`) holds the `Db` read lock, and a yield there
                // would keep the writer waiting.
                self.drop_view(id, !all_idle);
                n += 1;
            }
        }
        n
    }

    /// Unregisters view `id` and drops it; with `paced`, its rows go a chunk at a time
    /// with yields between ([`crate::view::Materialized::release_paced`]).
    fn drop_view(&mut self, id: ViewId, paced: bool) {
        if let Some(mut view) = self.views.remove(&id) {
            self.remove_routes(id, &view);
            let hash = self.key_hash(&view.shape.text, &view.params);
            self.by_query.remove(hash, id);
            for s in &view.subs {
                self.subs.remove(s);
                self.folds.remove(s);
            }
            if paced {
                view.mat.release_paced();
            }
        }
    }

    /// Follows one commit. `db` gives the current state (at or after `commit.seq`), read
    /// only when a view must be rebuilt or re-evaluated.
    pub fn apply<D>(&mut self, commit: &Commit, db: impl Fn() -> D)
    where
        D: std::ops::Deref<Target = Db>,
    {
        self.finish_pending();
        self.stats.commits += 1;
        match &commit.body {
            CommitBody::Schema { changes, .. } => {
                let touched: BTreeSet<String> =
                    changes.iter().map(|c| c.table().to_string()).collect();
                self.plans.iter_mut().for_each(HashMap::clear);
                let ids: Vec<ViewId> = self
                    .views
                    .iter()
                    .filter(|(_, v)| v.seq < commit.seq && !v.shape.tables.is_disjoint(&touched))
                    .map(|(id, _)| *id)
                    .collect();
                if !ids.is_empty() {
                    let db = db();
                    for id in ids {
                        self.rebuild(id, &db);
                    }
                }
            }
            // Topics feed no view: watches have their own fan-out.
            CommitBody::Topic(_) => {}
            CommitBody::Rows(changes) => {
                let mut reached: BTreeMap<ViewId, Vec<&Change>> = BTreeMap::new();
                for c in changes {
                    let Some(r) = self.routes.get(&c.table.name) else {
                        continue;
                    };
                    for id in &r.all {
                        push_unique(reached.entry(*id).or_default(), c);
                    }
                    for (column, by_value) in &r.equal {
                        for image in [&c.old, &c.row].into_iter().flatten() {
                            if let Some(ids) = by_value.get(&image[*column]) {
                                for id in ids.as_slice() {
                                    push_unique(reached.entry(*id).or_default(), c);
                                }
                            }
                        }
                    }
                }
                let mut state: Option<D> = None;
                for (id, changes) in reached {
                    let Some(view) = self.views.get_mut(&id) else {
                        continue;
                    };
                    if view.seq >= commit.seq {
                        continue; // built from a state that already has this commit
                    }
                    self.stats.view_updates += 1;
                    let (seq, deltas) = match view.op {
                        Operator::Reeval | Operator::Join | Operator::Subquery { .. } => {
                            let db = state.get_or_insert_with(&db);
                            if !planned_for(&view.shape.plan.select, db) {
                                // The plan no longer fits `db`; the DDL commit, still in
                                // this thread's queue, rebuilds the view.
                                continue;
                            }
                            match read_deltas(view, db, self.limits.view_rows_max) {
                                Ok(deltas) => (db.seq, deltas),
                                Err(e) => {
                                    self.fail_view(id, &e);
                                    continue;
                                }
                            }
                        }
                        _ => {
                            let select = &view.shape.plan.select;
                            let mut d = view.op.deltas(select, &view.params, &changes);
                            if view.mat.admit(&mut d) {
                                (commit.seq, d)
                            } else {
                                // The rows a top-k view keeps no longer cover its window:
                                // read them again, at the Db's seq (folding any commits the
                                // live thread has not reached yet, as Db-reading views do).
                                let db = state.get_or_insert_with(&db);
                                if !planned_for(select, db) {
                                    continue; // the queued DDL commit rebuilds the view
                                }
                                self.stats.refills += 1;
                                let rows_max = self.limits.view_rows_max;
                                match view.op.load(select, db, &view.params, rows_max) {
                                    Ok(rows) => (db.seq, view.mat.refill(rows)),
                                    Err(e) => {
                                        self.fail_view(id, &e);
                                        continue;
                                    }
                                }
                            }
                        }
                    };
                    self.publish(id, seq, deltas);
                }
            }
        }
    }

    fn publish(
        &mut self,
        id: ViewId,
        seq: u64,
        deltas: BTreeMap<crate::view::RKey, Option<crate::view::Out>>,
    ) {
        let view = self.views.get_mut(&id).expect("present");
        if view.folding > 0 {
            // Coalescing subscribers note their base before the deltas land.
            let now = Instant::now();
            for sub in &view.subs {
                if let Some(fold) = self.folds.get_mut(sub) {
                    if let Some(due) = fold.before(&view.mat, &deltas, now) {
                        self.fold_due.push(Reverse((due, *sub)));
                    }
                }
            }
        }
        let ops = view.mat.apply(deltas);
        view.seq = seq;
        if view.mat.len() > self.limits.view_rows_max {
            let e = QueryError::Limit(format!(
                "the view grew to {} rows; view_rows_max (--live-view-rows-max) is {}",
                view.mat.len(),
                self.limits.view_rows_max
            ));
            self.fail_view(id, &e);
            return;
        }
        if ops.is_empty() {
            return;
        }
        self.stats.diffs += 1;
        let event = Arc::new(Event {
            seq,
            kind: EventKind::Diff,
            json: view.mat.diff_json(seq, &ops),
            chunked: None,
        });
        let history = view.history.get_or_insert_with(Default::default);
        history.bytes += event.json.len();
        history.events.push_back(event.clone());
        while history.events.len() > self.limits.history_diffs_max
            || history.bytes > self.limits.history_bytes_max
        {
            let old = history.events.pop_front().expect("non-empty");
            history.bytes -= old.json.len();
            view.history_from = old.seq;
        }
        let mut gone = Vec::new();
        for sub in &view.subs {
            if view.folding > 0 {
                if let Some(fold) = self.folds.get_mut(sub) {
                    fold.folded(seq);
                    continue;
                }
            }
            let sink = &self.subs[sub].1;
            match sink.push(event.clone()) {
                Pushed::Queued => {}
                Pushed::Overflow => {
                    self.stats.resets += 1;
                    sink.push_reset(Arc::new(view.mat.snapshot_event(seq, true)));
                }
                Pushed::Gone => gone.push(*sub),
            }
        }
        for sub in gone {
            self.stats.slow_closed += 1;
            self.unsubscribe(sub);
        }
    }

    /// When the next coalescing window is due (it may have been closed since).
    pub fn next_fold_due(&self) -> Option<Instant> {
        self.fold_due.peek().map(|Reverse((due, _))| *due)
    }

    /// Sends each coalescing subscriber whose window is due by `now` its folded diff (if the
    /// window changed what it sees); returns when the next window is due.
    pub fn flush_folds(&mut self, now: Instant) -> Option<Instant> {
        self.finish_pending();
        let mut gone = Vec::new();
        let next = loop {
            let Some(&Reverse((due, sub))) = self.fold_due.peek() else {
                break None;
            };
            if due > now {
                break Some(due);
            }
            self.fold_due.pop();
            let Some(fold) = self.folds.get_mut(&sub) else {
                continue; // unsubscribed since
            };
            if fold.open.as_ref().is_none_or(|o| o.due != due) {
                continue; // reset by a snapshot since
            }
            let open = fold.open.take().expect("checked");
            let (Some((view_id, sink)), true) = (self.subs.get(&sub), open.diffs > 0) else {
                continue;
            };
            let Some(view) = self.views.get(view_id) else {
                continue;
            };
            let ops = crate::fold::ops(&open.base, &view.mat);
            if ops.is_empty() {
                continue; // the window's commits cancelled out
            }
            self.stats.folds_sent += 1;
            self.stats.diffs_folded += open.diffs;
            let event = Arc::new(Event {
                seq: open.seq,
                kind: EventKind::Diff,
                json: view.mat.diff_json(open.seq, &ops),
                chunked: None,
            });
            match sink.push(event) {
                Pushed::Queued => {}
                Pushed::Overflow => {
                    self.stats.resets += 1;
                    sink.push_reset(Arc::new(view.mat.snapshot_event(view.seq, true)));
                }
                Pushed::Gone => gone.push(sub),
            }
        };
        for sub in gone {
            self.stats.slow_closed += 1;
            self.unsubscribe(sub);
        }
        next
    }

    /// Re-plans a view after DDL on a table it reads and sends its subscribers a reset
    /// snapshot — or, if the query no longer plans, an error, and drops the view.
    fn rebuild(&mut self, id: ViewId, db: &Db) {
        let view = self.views.get(&id).expect("present");
        let sql = view.shape.sql.clone();
        let client = view.shape.client;
        let before = &view.shape.plan.params;
        let rebuilt = sluice_query::prepare_as(&sql, db, client).and_then(|plan| {
            let params = rebind(before, &view.params, &plan.params)?;
            let shape = Arc::new(Shape::new(sql.clone(), client, plan));
            self.build(db, shape, params.into())
        });
        match rebuilt {
            Err(e) => self.fail_view(id, &e),
            Ok(mut fresh) => {
                let old = self.views.remove(&id).expect("present");
                self.remove_routes(id, &old);
                // Rebinding may reorder the claim values: the view's key follows (registered
                // unless another view already has the new key).
                let old_hash = self.key_hash(&old.shape.text, &old.params);
                self.by_query.remove(old_hash, id);
                let new_hash = self.key_hash(&fresh.shape.text, &fresh.params);
                let taken = self
                    .find_view(new_hash, &fresh.shape.text, &fresh.params)
                    .is_some();
                fresh.subs = old.subs;
                fresh.folding = old.folding;
                fresh.idle_since = old.idle_since;
                // The reset snapshot is every subscriber's new base.
                for sub in &fresh.subs {
                    if let Some(fold) = self.folds.get_mut(sub) {
                        fold.open = None;
                    }
                }
                self.add_routes(id, &fresh);
                let event = Arc::new(fresh.mat.snapshot_event(fresh.seq, true));
                let mut gone = Vec::new();
                for sub in &fresh.subs {
                    let sink = &self.subs[sub].1;
                    match sink.push(event.clone()) {
                        Pushed::Queued => {}
                        Pushed::Overflow => sink.push_reset(event.clone()),
                        Pushed::Gone => gone.push(*sub),
                    }
                }
                self.views.insert(id, Box::new(fresh));
                if !taken {
                    self.by_query.insert(new_hash, id);
                }
                for sub in gone {
                    self.stats.slow_closed += 1;
                    self.unsubscribe(sub);
                }
            }
        }
    }

    /// Ends a view with an error to each subscriber.
    fn fail_view(&mut self, id: ViewId, e: &QueryError) {
        if let Some(view) = self.views.get(&id) {
            let code = crate::error_code(e);
            for sub in &view.subs {
                self.subs[sub].1.fail(code, &e.to_string());
            }
        }
        self.drop_view(id, false);
    }

    /// Rows the (first) view of this query holds: its whole result, or a top-k view's kept
    /// prefix (for tests and the bench).
    pub fn view_rows_of(&self, sql: &str) -> Option<usize> {
        self.views
            .values()
            .find(|v| v.shape.sql == sql)
            .map(|v| v.mat.len())
    }

    /// Which operator follows the view of this query (for tests, the bench and docs).
    pub fn operator_of(&self, sql: &str) -> Option<&'static str> {
        self.views
            .values()
            .find(|v| v.shape.sql == sql)
            .map(|v| v.op.name())
    }
}

/// A view's parameter values (`values`, resolved for a plan with `old`) laid out for a new
/// plan of the same text with `new`. The view keeps only the values of the claims its old
/// plan read: a new plan that reads another claim (a new policy on `auth.team`, say) needs
/// the subscriber's token again — `rules_changed`.
fn rebind(
    old: &sluice_query::plan::ParamSpec,
    values: &[Value],
    new: &sluice_query::plan::ParamSpec,
) -> Result<Vec<Value>, QueryError> {
    let changed = || {
        QueryError::RulesChanged(
            "the row policies of a table this query reads changed and now read other claims; subscribe again".into(),
        )
    };
    if (old.positional, &old.names, old.claim_base) != (new.positional, &new.names, new.claim_base)
    {
        return Err(changed());
    }
    if new.claims.is_empty() {
        return Ok(values[..values.len().min(old.claim_base)].to_vec());
    }
    let mut out = values[..values.len().min(old.claim_base)].to_vec();
    out.resize(new.claim_base, Value::Null);
    for claim in &new.claims {
        let i = old
            .claims
            .iter()
            .position(|c| c == claim)
            .ok_or_else(changed)?;
        out.push(values[old.claim_base + i].clone());
    }
    Ok(out)
}

/// Whether two parameter lists have the same canonical bytes (so `1` and `1.0` differ).
fn same_params(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| match (a, b) {
            (Value::Null, Value::Null) => true,
            (Value::Integer(x), Value::Integer(y)) => x == y,
            (Value::Real(x), Value::Real(y)) => x.to_bits() == y.to_bits(),
            (Value::Boolean(x), Value::Boolean(y)) => x == y,
            (Value::Text(x), Value::Text(y)) | (Value::Json(x), Value::Json(y)) => x == y,
            (Value::Blob(x), Value::Blob(y)) => x == y,
            (Value::Timestamp(x), Value::Timestamp(y)) => x == y,
            _ => false,
        })
}

fn push_unique<'a>(v: &mut Vec<&'a Change>, c: &'a Change) {
    if !v.last().is_some_and(|l| std::ptr::eq(*l, c)) {
        v.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-view structures stay at the sizes the registry's memory budget assumes (a
    /// million idle views: every 8 bytes here is 8 MB).
    #[test]
    fn per_view_structures_stay_small() {
        use std::mem::size_of;
        eprintln!(
            "View {} (Materialized {}, Operator {}, Route {}, History {}), Ids {}, Sink {}",
            size_of::<View>(),
            size_of::<Materialized>(),
            size_of::<Operator>(),
            size_of::<Route>(),
            size_of::<History>(),
            size_of::<Ids>(),
            size_of::<Sink>(),
        );
        assert_eq!(size_of::<Ids>(), 16);
        assert_eq!(size_of::<Route>(), 1);
        assert_eq!(size_of::<Operator>(), 16);
        assert!(
            size_of::<View>() <= 240,
            "View is {} bytes",
            size_of::<View>()
        );
    }

    #[test]
    fn ids_add_and_remove_down_to_one_then_none() {
        let mut ids = Ids::One(1);
        ids.add(2);
        ids.add(3);
        assert_eq!(ids.as_slice(), [1, 2, 3]);
        assert!(!ids.remove(2));
        assert!(!ids.remove(1));
        assert!(matches!(ids, Ids::One(3)));
        assert!(!ids.remove(9), "an absent id changes nothing");
        assert!(ids.remove(3));
    }

    #[test]
    fn same_params_is_canonical_equality() {
        let cases = [
            vec![Value::Integer(1)],
            vec![Value::Real(1.0)],
            vec![Value::Text("1".into())],
            vec![Value::Json("1".into())],
            vec![Value::Timestamp(1)],
            vec![Value::Boolean(true)],
            vec![Value::Null],
            vec![Value::Blob([1].into())],
            vec![Value::Integer(1), Value::Null],
        ];
        for a in &cases {
            for b in &cases {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                crate::checksum::canonical_bytes(a, &mut x);
                crate::checksum::canonical_bytes(b, &mut y);
                assert_eq!(same_params(a, b), x == y, "{a:?} vs {b:?}");
            }
        }
    }
}
