//! Differential oracle for row policies (docs/security.md "Row policies", "Reads").
//!
//! A seeded random workload runs against a server on loopback (in-process, real sockets):
//! 2–3 tables with owner/team-like columns (some nullable), random `FOR SELECT` / `FOR ALL`
//! policies over `auth.sub`, `auth.team`, literals, `AND`/`OR`/`NOT`, `IS NULL`, `IN`,
//! `LIKE` (sometimes two permissive ones, sometimes none on a table: it reads as empty;
//! sometimes an `INSERT`-only policy that must not open reads), random admin writes
//! (inserts, patches and upserts that move rows between owners and teams, deletes), and
//! 6–12 subscribers with different client tokens (some with the same claims and query, so
//! they share a view), each subscribed over SSE (header or `access_token`) or WebSocket to a
//! random query: filters, `ORDER BY … LIMIT`, `GROUP BY` counts, joins (`JOIN`, `LEFT JOIN`),
//! `IN (SELECT …)`.
//!
//! A third of the writes are clients' own mutates (mostly of their own rows), under random
//! `INSERT` / `UPDATE` (with or without `WITH CHECK`) / `DELETE` / `ALL` policies: SQLite
//! predicts each op's verdict from docs/security.md "Writes" (insert: some INSERT/ALL
//! `WITH CHECK`, else `USING`, on the new row; update: some UPDATE/ALL `USING` on the old row
//! and `WITH CHECK` on the new; delete: some DELETE/ALL `USING` on the old row); a batch with
//! a forbidden op must be refused with 403 `forbidden` naming the first such op, its command
//! and table, the seq unmoved; an allowed one must commit.
//!
//! After every commit, for every subscriber:
//! - its materialisation (snapshot, then diffs applied as docs/protocol.md says, checksums
//!   verified) equals SQLite running the query with each table replaced by
//!   `(SELECT * FROM t WHERE <USING of its SELECT/ALL policies OR'ed, claims substituted as
//!   literals>)` — `WHERE 0` for a table without one;
//! - no snapshot or diff carries a row the subscriber may not read (the policy evaluated by
//!   SQLite on the row the event carries, for every query whose rows are table rows);
//! - `POST /v1/query` with its token equals the oracle.
//!
//! Every few commits: row reads (`GET /v1/tables/t/rows/{id}`: the row iff readable, else 404)
//! and paged scans equal the oracle; a subscriber disconnects and resumes with `since` (diffs
//! or a `reset` snapshot, checked like the rest). Twice, a policy is created (or dropped)
//! on one table: every subscription reading that table follows with a `reset` snapshot under
//! the new rules when they read the claims the old ones read, and ends with `rules_changed`
//! when they read one more (docs/security.md; with one fewer either is accepted) — then it
//! resumes with `since`; the others go on. Before each policy change and at the end,
//! `/v1/changes` since the previous change (a stretch of constant rules), paged with each
//! client token, is exactly the changes whose old or new image the client may
//! read (a readable new image as usual, a readable old image whose new one is not as
//! `delete`), and every policy entry appears.
//!
//! `SLUICE_RULES_SEED` repeats a run (the seed is printed); `SLUICE_RULES_LONG=1` runs 2 000
//! commits with 12 subscribers (default: 400 commits, 6–10 subscribers).
//! `SLUICE_RULES_HARNESS_CHECK=1` checks the harness itself against a server without rules:
//! no policies, every subscriber with the admin token, the oracle reading every row.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rusqlite::types::Value as Lite;
use serde_json::{json, Map, Value};
use sluice_log::Durability;
use sluice_server::{Config, Core};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const ADMIN: &str = "sluice_admin_rules_oracle_test_token";
const SECRET: &str = "rules-oracle-test-secret";
/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(20);
const OWNERS: [&str; 4] = ["u0", "u1", "u2", "u3"];
const COLUMNS: [&str; 5] = ["id", "owner", "team", "score", "link"];

// ---------------------------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// `SLUICE_RULES_HARNESS_CHECK=1` checks the harness itself: no policies, every subscriber
/// with the admin token, the oracle reading every row.
fn harness_check() -> bool {
    std::env::var("SLUICE_RULES_HARNESS_CHECK").is_ok_and(|v| v == "1")
}

fn seed() -> u64 {
    let seed = match std::env::var("SLUICE_RULES_SEED") {
        Ok(s) => s.parse().expect("SLUICE_RULES_SEED must be a u64"),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            nanos ^ (u64::from(std::process::id()) << 32)
        }
    };
    eprintln!("rules oracle: seed {seed} (repeat with SLUICE_RULES_SEED={seed})");
    seed
}

// ---------------------------------------------------------------------------------------------
// Claims and policies
// ---------------------------------------------------------------------------------------------

/// The `team` claim of a token: a number, a string (affinity applies against the INTEGER
/// column), JSON null, or absent (NULL in rules).
#[derive(Clone, Debug, PartialEq)]
enum Team {
    Int(i64),
    Text(String),
    Null,
    Missing,
}

#[derive(Clone, Debug, PartialEq)]
struct Claims {
    sub: String,
    team: Team,
}

impl Claims {
    fn team_sql(&self) -> String {
        match &self.team {
            Team::Int(n) => n.to_string(),
            Team::Text(s) => format!("'{s}'"),
            Team::Null | Team::Missing => "NULL".into(),
        }
    }

    fn token(&self) -> String {
        if harness_check() {
            return ADMIN.into();
        }
        let mut claims = Map::new();
        match &self.team {
            Team::Int(n) => {
                claims.insert("team".into(), json!(n));
            }
            Team::Text(s) => {
                claims.insert("team".into(), json!(s));
            }
            Team::Null => {
                claims.insert("team".into(), Value::Null);
            }
            Team::Missing => {}
        }
        claims.insert("role".into(), json!("reader"));
        sluice_server::auth::mint_hs256(SECRET, &self.sub, &claims, Duration::from_secs(3600))
    }
}

#[derive(Clone, Debug)]
enum Atom {
    OwnerIsSub,
    TeamIsTeam,
    OwnerIs(&'static str),
    OwnerIsNull,
    TeamIsNull,
    TeamIn(i64, i64),
    ScoreAbove(i64),
    ClaimTeamIs(i64),
    SubIs(&'static str),
    OwnerLike(&'static str),
}

#[derive(Clone, Debug)]
enum Pred {
    Atom(Atom),
    Not(Atom),
    And(Box<Pred>, Box<Pred>),
    Or(Box<Pred>, Box<Pred>),
}

impl Pred {
    /// The claims the predicate reads.
    fn claims(&self, out: &mut BTreeSet<&'static str>) {
        let atom = |a: &Atom, out: &mut BTreeSet<&'static str>| match a {
            Atom::OwnerIsSub | Atom::SubIs(_) => {
                out.insert("sub");
            }
            Atom::TeamIsTeam | Atom::ClaimTeamIs(_) => {
                out.insert("team");
            }
            _ => {}
        };
        match self {
            Pred::Atom(a) | Pred::Not(a) => atom(a, out),
            Pred::And(a, b) | Pred::Or(a, b) => {
                a.claims(out);
                b.claims(out);
            }
        }
    }

    fn random(rng: &mut Rng, depth: u32) -> Pred {
        if depth > 0 && rng.chance(40) {
            let a = Box::new(Pred::random(rng, depth - 1));
            let b = Box::new(Pred::random(rng, depth - 1));
            return if rng.chance(50) {
                Pred::And(a, b)
            } else {
                Pred::Or(a, b)
            };
        }
        let atom = match rng.below(14) {
            0..=3 => Atom::OwnerIsSub,
            4..=5 => Atom::TeamIsTeam,
            6 => Atom::OwnerIs(OWNERS[rng.below(OWNERS.len())]),
            7 => Atom::OwnerIsNull,
            8 => Atom::TeamIsNull,
            9 => Atom::TeamIn(rng.range(0, 3), rng.range(0, 3)),
            10 => Atom::ScoreAbove(rng.range(10, 90)),
            11 => Atom::ClaimTeamIs(rng.range(1, 3)),
            12 => Atom::SubIs(OWNERS[rng.below(OWNERS.len())]),
            _ => Atom::OwnerLike(["u%", "%1", "u_", "x%"][rng.below(4)]),
        };
        if rng.chance(12) {
            Pred::Not(atom)
        } else {
            Pred::Atom(atom)
        }
    }

    /// The predicate as SQL: with `auth.*` references (`claims` = None) or with the claims
    /// substituted as literals.
    fn render(&self, claims: Option<&Claims>) -> String {
        let sub = |c: Option<&Claims>| match c {
            Some(c) => format!("'{}'", c.sub),
            None => "auth.sub".into(),
        };
        let team = |c: Option<&Claims>| match c {
            Some(c) => c.team_sql(),
            None => "auth.team".into(),
        };
        let atom = |a: &Atom| match a {
            Atom::OwnerIsSub => format!("owner = {}", sub(claims)),
            Atom::TeamIsTeam => format!("team = {}", team(claims)),
            Atom::OwnerIs(o) => format!("owner = '{o}'"),
            Atom::OwnerIsNull => "owner IS NULL".into(),
            Atom::TeamIsNull => "team IS NULL".into(),
            Atom::TeamIn(a, b) => format!("team IN ({a}, {b})"),
            Atom::ScoreAbove(n) => format!("score > {n}"),
            Atom::ClaimTeamIs(n) => format!("{} = {n}", team(claims)),
            Atom::SubIs(s) => format!("{} = '{s}'", sub(claims)),
            Atom::OwnerLike(p) => format!("owner LIKE '{p}'"),
        };
        match self {
            Pred::Atom(a) => atom(a),
            Pred::Not(a) => format!("NOT ({})", atom(a)),
            Pred::And(a, b) => format!("({} AND {})", a.render(claims), b.render(claims)),
            Pred::Or(a, b) => format!("({} OR {})", a.render(claims), b.render(claims)),
        }
    }
}

#[derive(Clone, Debug)]
struct Policy {
    name: String,
    table: usize,
    /// `SELECT`, `INSERT`, `UPDATE`, `DELETE` or `ALL`; only `SELECT` and `ALL` open reads.
    command: &'static str,
    /// `USING` (for `INSERT`: its `WITH CHECK`).
    using: Pred,
    /// `WITH CHECK` of an `UPDATE` or `ALL` policy; without it, new rows are checked by
    /// `using`.
    check: Option<Pred>,
}

impl Policy {
    fn reads(&self) -> bool {
        self.command == "SELECT" || self.command == "ALL"
    }

    fn create_sql(&self) -> String {
        let p = self.using.render(None);
        let check = self
            .check
            .as_ref()
            .map(|c| format!(" WITH CHECK ({})", c.render(None)))
            .unwrap_or_default();
        match self.command {
            "INSERT" => format!(
                "CREATE POLICY {} ON t{} FOR INSERT WITH CHECK ({p})",
                self.name, self.table
            ),
            c => format!(
                "CREATE POLICY {} ON t{} FOR {c} USING ({p}){check}",
                self.name, self.table
            ),
        }
    }

    /// The predicate new rows must pass under this policy (for `command`), if it applies.
    fn new_row_pred(&self, command: &str) -> Option<&Pred> {
        match (self.command, command) {
            ("INSERT", "insert") => Some(&self.using),
            ("ALL", "insert" | "update") | ("UPDATE", "update") => {
                Some(self.check.as_ref().unwrap_or(&self.using))
            }
            _ => None,
        }
    }

    /// The predicate old rows must pass under this policy (for `command`), if it applies.
    fn old_row_pred(&self, command: &str) -> Option<&Pred> {
        match (self.command, command) {
            ("ALL", "update" | "delete") | ("UPDATE", "update") | ("DELETE", "delete") => {
                Some(&self.using)
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Schema and rows
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct TableDef {
    owner_nullable: bool,
    team_nullable: bool,
}

#[derive(Clone, Debug, PartialEq)]
struct Row {
    owner: Option<String>,
    team: Option<i64>,
    score: i64,
    link: Option<i64>,
}

impl Row {
    fn json(&self, id: i64) -> Value {
        json!({"id": id, "owner": self.owner, "team": self.team, "score": self.score, "link": self.link})
    }
}

type State = Vec<BTreeMap<i64, Row>>;

fn create_table_sql(i: usize, def: &TableDef) -> String {
    format!(
        "CREATE TABLE t{i} (id INTEGER PRIMARY KEY, owner TEXT{}, team INTEGER{}, score INTEGER NOT NULL, link INTEGER)",
        if def.owner_nullable { "" } else { " NOT NULL" },
        if def.team_nullable { "" } else { " NOT NULL" },
    )
}

// ---------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------

/// What the rows of a query are, for the per-row readability check.
#[derive(Clone, Debug)]
enum Shape {
    /// `SELECT *` of one table: every row is a row of that table.
    Whole(usize),
    /// Two tables' columns, prefixed `a_` and `b_` (the `b_` side may be all NULL: LEFT JOIN).
    Join(usize, usize),
    /// Aggregates: no table row to check (the oracle comparison covers them).
    Derived,
}

#[derive(Clone, Debug)]
struct Query {
    /// SQL with `{T<i>}` / `{T<i> <alias>}` where table `t<i>` is read.
    template: String,
    ordered: bool,
    shape: Shape,
}

impl Query {
    fn random(rng: &mut Rng, tables: usize) -> Query {
        let t = rng.below(tables);
        let other = (t + 1 + rng.below(tables - 1)) % tables;
        let filter = |rng: &mut Rng| -> String {
            match rng.below(5) {
                0 => format!(" WHERE score > {}", rng.range(10, 80)),
                1 => format!(" WHERE owner = '{}'", rng.pick(&OWNERS)),
                2 => format!(" WHERE team IN (1, {})", rng.range(2, 3)),
                3 => " WHERE owner IS NOT NULL OR team IS NULL".into(),
                _ => String::new(),
            }
        };
        match rng.below(7) {
            0 | 1 => Query {
                template: format!("SELECT * FROM {{T{t}}}{}", filter(rng)),
                ordered: false,
                shape: Shape::Whole(t),
            },
            2 => Query {
                template: format!(
                    "SELECT * FROM {{T{t}}}{} ORDER BY score DESC, id LIMIT {}",
                    filter(rng),
                    rng.range(2, 5)
                ),
                ordered: true,
                shape: Shape::Whole(t),
            },
            3 => {
                let key = *rng.pick(&["owner", "team"]);
                Query {
                    template: format!(
                        "SELECT {key}, COUNT(*) AS n, SUM(score) AS total FROM {{T{t}}} GROUP BY {key}"
                    ),
                    ordered: false,
                    shape: Shape::Derived,
                }
            }
            4 | 5 => {
                let kind = *rng.pick(&["JOIN", "LEFT JOIN"]);
                let cols = |x: &str, p: &str| {
                    COLUMNS
                        .iter()
                        .map(|c| format!("{x}.{c} AS {p}_{c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                Query {
                    template: format!(
                        "SELECT {}, {} FROM {{T{t} x}} {kind} {{T{other} y}} ON x.link = y.id",
                        cols("x", "a"),
                        cols("y", "b")
                    ),
                    ordered: false,
                    shape: Shape::Join(t, other),
                }
            }
            _ => Query {
                template: format!(
                    "SELECT * FROM {{T{t} x}} WHERE x.link IN (SELECT s.id FROM {{T{other} s}} WHERE s.score > {})",
                    rng.range(0, 60)
                ),
                ordered: false,
                shape: Shape::Whole(t),
            },
        }
    }

    /// Replaces each `{T<i>[ alias]}` with `table(i)` followed by the alias.
    fn render(&self, table: impl Fn(usize) -> String) -> String {
        let mut out = String::new();
        let mut rest = self.template.as_str();
        while let Some(start) = rest.find("{T") {
            out.push_str(&rest[..start]);
            let end = start + rest[start..].find('}').expect("a closing brace");
            let inner = &rest[start + 2..end];
            let (i, alias) = match inner.split_once(' ') {
                Some((i, a)) => (i, Some(a)),
                None => (inner, None),
            };
            let i: usize = i.parse().expect("a table index");
            out.push_str(&table(i));
            if let Some(a) = alias {
                out.push(' ');
                out.push_str(a);
            } else if out.ends_with(')') {
                write!(out, " AS t{i}").unwrap();
            }
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn sql(&self) -> String {
        self.render(|i| format!("t{i}"))
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle: SQLite holding the model's rows
// ---------------------------------------------------------------------------------------------

struct Oracle {
    conn: rusqlite::Connection,
    policies: Vec<Policy>,
    /// The seq of the last policy change and the policies before it: an event of an earlier
    /// seq (one still queued when the policy changed) is checked against those.
    before_change: Option<(u64, Vec<Policy>)>,
}

fn lite_to_json(v: Lite) -> Value {
    match v {
        Lite::Null => Value::Null,
        Lite::Integer(i) => json!(i),
        Lite::Real(f) => json!(f),
        Lite::Text(s) => json!(s),
        Lite::Blob(_) => panic!("no blobs in this test"),
    }
}

impl Oracle {
    fn new(defs: &[TableDef]) -> Oracle {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for (i, def) in defs.iter().enumerate() {
            conn.execute_batch(&create_table_sql(i, def)).unwrap();
            conn.execute_batch(&create_table_sql(i, def).replace(
                &format!("CREATE TABLE t{i} "),
                &format!("CREATE TABLE probe{i} "),
            ))
            .unwrap();
        }
        Oracle {
            conn,
            policies: Vec::new(),
            before_change: None,
        }
    }

    fn load(&self, state: &State) {
        for (i, rows) in state.iter().enumerate() {
            self.conn.execute(&format!("DELETE FROM t{i}"), []).unwrap();
            let mut insert = self
                .conn
                .prepare(&format!("INSERT INTO t{i} VALUES (?1, ?2, ?3, ?4, ?5)"))
                .unwrap();
            for (id, r) in rows {
                insert
                    .execute(rusqlite::params![id, r.owner, r.team, r.score, r.link])
                    .unwrap();
            }
        }
    }

    /// The claims the read rules of the tables `q` reads read.
    fn claims_read(&self, q: &Query) -> BTreeSet<&'static str> {
        let mut out = BTreeSet::new();
        for p in &self.policies {
            if p.reads() && q.template.contains(&format!("{{T{}", p.table)) {
                p.using.claims(&mut out);
            }
        }
        out
    }

    /// The read predicate of table `i` for `claims`: its SELECT/ALL policies OR'ed.
    fn read_pred(&self, i: usize, claims: &Claims) -> String {
        self.read_pred_in(&self.policies, i, claims)
    }

    /// The policies in force at `seq`.
    fn policies_at(&self, seq: u64) -> &[Policy] {
        match &self.before_change {
            Some((change, old)) if seq < *change => old,
            _ => &self.policies,
        }
    }

    fn read_pred_in(&self, policies: &[Policy], i: usize, claims: &Claims) -> String {
        if harness_check() {
            return "1".into();
        }
        let preds: Vec<String> = policies
            .iter()
            .filter(|p| p.table == i && p.reads())
            .map(|p| format!("({})", p.using.render(Some(claims))))
            .collect();
        if preds.is_empty() {
            "0".into()
        } else {
            preds.join(" OR ")
        }
    }

    fn run(&self, sql: &str) -> Vec<Value> {
        let mut stmt = self
            .conn
            .prepare(sql)
            .unwrap_or_else(|e| panic!("SQLite refuses {sql}: {e}"));
        let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
        let rows = stmt
            .query_map([], |r| {
                let mut m = Map::new();
                for (k, name) in names.iter().enumerate() {
                    m.insert(name.clone(), lite_to_json(r.get::<_, Lite>(k)?));
                }
                Ok(Value::Object(m))
            })
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// The query as `claims` must see it.
    fn expected(&self, q: &Query, claims: &Claims) -> Vec<Value> {
        let sql = q.render(|i| format!("(SELECT * FROM t{i} WHERE {})", self.read_pred(i, claims)));
        let rows = self.run(&sql);
        if q.ordered {
            rows
        } else {
            sorted(&rows)
        }
    }

    /// Whether `claims` may read `row` (a row image of table `i`), evaluated by SQLite.
    fn readable(&self, i: usize, row: &Value, claims: &Claims) -> bool {
        self.holds(i, row, &self.read_pred(i, claims))
    }

    /// Whether `claims` may make the change `old` → `new` of a row of table `i`
    /// (docs/security.md "Writes"): the command it is checked as, and the verdict.
    fn write_allowed(
        &self,
        i: usize,
        old: Option<&Value>,
        new: Option<&Value>,
        claims: &Claims,
    ) -> (&'static str, bool) {
        let any = |preds: Vec<&Pred>| -> String {
            if preds.is_empty() {
                "0".into()
            } else {
                preds
                    .iter()
                    .map(|p| format!("({})", p.render(Some(claims))))
                    .collect::<Vec<_>>()
                    .join(" OR ")
            }
        };
        let on_table = || self.policies.iter().filter(|p| p.table == i);
        let command = match (old, new) {
            (None, Some(_)) => "insert",
            (Some(_), Some(_)) => "update",
            (Some(_), None) => "delete",
            (None, None) => unreachable!("an op changes a row"),
        };
        let old_ok = old.is_none_or(|o| {
            let preds: Vec<&Pred> = on_table().filter_map(|p| p.old_row_pred(command)).collect();
            self.holds(i, o, &any(preds))
        });
        let new_ok = new.is_none_or(|n| {
            let preds: Vec<&Pred> = on_table().filter_map(|p| p.new_row_pred(command)).collect();
            self.holds(i, n, &any(preds))
        });
        (command, old_ok && new_ok)
    }

    /// Whether the SQL predicate `pred` holds for `row` (a row image of table `i`).
    fn holds(&self, i: usize, row: &Value, pred: &str) -> bool {
        self.conn
            .execute(&format!("DELETE FROM probe{i}"), [])
            .unwrap();
        let lite = |c: &str| -> Lite {
            match &row[c] {
                Value::Null => Lite::Null,
                Value::Number(n) => Lite::Integer(n.as_i64().expect("integer columns")),
                Value::String(s) => Lite::Text(s.clone()),
                other => panic!("column {c} of t{i} holds {other}"),
            }
        };
        self.conn
            .execute(
                &format!("INSERT INTO probe{i} VALUES (?1, ?2, ?3, ?4, ?5)"),
                rusqlite::params![
                    lite("id"),
                    lite("owner"),
                    lite("team"),
                    lite("score"),
                    lite("link")
                ],
            )
            .unwrap_or_else(|e| panic!("probe row {row} of t{i}: {e}"));
        let n: i64 = self
            .conn
            .query_row(
                &format!("SELECT COUNT(*) FROM probe{i} WHERE {pred}"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        n == 1
    }

    /// Every row an event of `seq` carries is one `claims` may read under the rules in force
    /// at `seq`.
    fn check_rows<'a>(
        &self,
        seq: u64,
        shape: &Shape,
        claims: &Claims,
        rows: impl Iterator<Item = &'a Value>,
        context: &str,
    ) {
        let readable = |t: usize, row: &Value| {
            self.holds(t, row, &self.read_pred_in(self.policies_at(seq), t, claims))
        };
        for row in rows {
            match shape {
                Shape::Whole(t) => assert!(
                    readable(*t, row),
                    "{context}: LEAK: row {row} of t{t} is not readable by {claims:?}"
                ),
                Shape::Join(a, b) => {
                    for (t, p) in [(*a, "a"), (*b, "b")] {
                        let side: Map<String, Value> = COLUMNS
                            .iter()
                            .map(|c| (c.to_string(), row[format!("{p}_{c}")].clone()))
                            .collect();
                        if side["id"].is_null() {
                            continue; // the missing side of a LEFT JOIN
                        }
                        let side = Value::Object(side);
                        assert!(
                            readable(t, &side),
                            "{context}: LEAK: joined row {side} of t{t} in {row} is not readable by {claims:?}"
                        );
                    }
                }
                Shape::Derived => {}
            }
        }
    }
}

fn sorted(rows: &[Value]) -> Vec<Value> {
    let mut v = rows.to_vec();
    v.sort_by_key(|r| r.to_string());
    v
}

// ---------------------------------------------------------------------------------------------
// Server and clients
// ---------------------------------------------------------------------------------------------

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("sluice-rules-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn serve(dir: &Path) -> (Core, SocketAddr) {
    let mut config = Config::new(dir);
    config.durability = Durability::Memory;
    config.auth.admin_token = Some(ADMIN.into());
    config.auth.jwt_secret = Some(SECRET.into());
    let core = tokio::task::spawn_blocking(move || Core::open(config))
        .await
        .expect("the open task")
        .expect("open the database");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let router = sluice_server::api::router(core.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (core, addr)
}

#[derive(Clone)]
struct Http {
    client: reqwest::Client,
    addr: SocketAddr,
}

impl Http {
    async fn send(&self, req: reqwest::RequestBuilder, token: &str) -> (u16, Value) {
        let req = req.bearer_auth(token).build().expect("a valid request");
        let what = format!("{} {}", req.method(), req.url());
        let resp = tokio::time::timeout(WAIT, self.client.execute(req))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within {WAIT:?}"))
            .unwrap_or_else(|e| panic!("{what}: no HTTP answer: {e:?}"));
        let status = resp.status().as_u16();
        let text = tokio::time::timeout(WAIT, resp.text())
            .await
            .unwrap_or_else(|_| panic!("{what}: no body within {WAIT:?}"))
            .unwrap_or_else(|e| panic!("{what}: no body: {e:?}"));
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, body)
    }

    async fn post(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        let req = self
            .client
            .post(format!("http://{}{path}", self.addr))
            .json(body);
        self.send(req, token).await
    }

    async fn get(&self, token: &str, path: &str, params: &[(&str, String)]) -> (u16, Value) {
        let url = reqwest::Url::parse_with_params(
            &format!("http://{}{path}", self.addr),
            params.iter().map(|(k, v)| (*k, v.as_str())),
        )
        .unwrap();
        self.send(self.client.get(url), token).await
    }

    async fn health_seq(&self) -> u64 {
        let (status, body) = self.get(ADMIN, "/health", &[]).await;
        assert_eq!(status, 200, "/health: {body}");
        body["seq"].as_u64().expect("a seq")
    }

    async fn admin_sql(&self, sql: &str) -> u64 {
        let (status, body) = self.post(ADMIN, "/v1/sql", &json!({ "sql": sql })).await;
        assert_eq!(status, 200, "{sql}: {body}");
        body["seq"].as_u64().expect("a seq")
    }
}

// ---------------------------------------------------------------------------------------------
// Live clients: SSE and WebSocket, and the materialisation
// ---------------------------------------------------------------------------------------------

struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next event as `{"type": <event>, …data}`, skipping heartbeats; `None` at the end.
    async fn event(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8 events");
                let (mut event, mut data) = (None, Vec::new());
                for line in text
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with(':'))
                {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                    match field {
                        "event" => event = Some(value),
                        "data" => data.push(value),
                        _ => {}
                    }
                }
                let Some(event) = event else { continue };
                let mut v: Value = serde_json::from_str(&data.join("\n")).expect("JSON data");
                v["type"] = json!(event);
                return Some(v);
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .ok()?
                .expect("read the stream");
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return None,
            }
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

enum Stream {
    Sse(Sse),
    Ws(Ws),
}

impl Stream {
    /// The next live event (timeout: `None`).
    async fn event(&mut self) -> Option<Value> {
        match self {
            Stream::Sse(s) => s.event().await,
            Stream::Ws(ws) => loop {
                let msg = tokio::time::timeout(WAIT, ws.next()).await.ok()??.ok()?;
                match msg {
                    Message::Text(t) => return Some(serde_json::from_str(t.as_str()).unwrap()),
                    Message::Close(_) => return None,
                    _ => continue,
                }
            },
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Mat {
    seq: u64,
    columns: Vec<String>,
    keys: Vec<Value>,
    rows: Vec<Value>,
}

fn json_to_value(v: &Value) -> sluice_engine::Value {
    use sluice_engine::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Bool(b) => V::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => V::Integer(i),
            None => V::Real(n.as_f64().unwrap()),
        },
        Value::String(s) => V::Text(s.as_str().into()),
        other => panic!("no column of this test holds {other}"),
    }
}

impl Mat {
    fn snapshot(body: &Value) -> Mat {
        let keys = body["keys"].as_array().expect("keys").clone();
        let rows = body["rows"].as_array().expect("rows").clone();
        assert_eq!(keys.len(), rows.len(), "a key per row: {body}");
        let mat = Mat {
            seq: body["seq"].as_u64().expect("seq"),
            columns: body["columns"]
                .as_array()
                .expect("columns")
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect(),
            keys,
            rows,
        };
        mat.verify_checksum(body);
        mat
    }

    fn position(&self, key: &Value) -> Option<usize> {
        self.keys.iter().position(|k| k == key)
    }

    fn apply(&mut self, diff: &Value) {
        let seq = diff["seq"].as_u64().expect("seq");
        assert!(seq > self.seq, "diff {seq} after {}: {diff}", self.seq);
        let changes = diff["changes"].as_array().expect("changes");
        assert!(!changes.is_empty(), "a diff changes something: {diff}");
        for c in changes {
            let key = &c["key"];
            let index = c.get("index").map(|i| i.as_u64().unwrap() as usize);
            match c["op"].as_str().unwrap() {
                "remove" => {
                    let at = self
                        .position(key)
                        .unwrap_or_else(|| panic!("remove of absent {key}: {diff}"));
                    if let Some(i) = index {
                        assert_eq!(i, at, "remove index is where the row was: {diff}");
                    }
                    self.keys.remove(at);
                    self.rows.remove(at);
                }
                "add" => {
                    assert!(self.position(key).is_none(), "add of present {key}: {diff}");
                    let at = index.unwrap_or(self.keys.len());
                    assert!(at <= self.keys.len(), "add index {at} out of range: {diff}");
                    self.keys.insert(at, key.clone());
                    self.rows.insert(at, c["row"].clone());
                }
                "change" => {
                    let old = self
                        .position(key)
                        .unwrap_or_else(|| panic!("change of absent {key}: {diff}"));
                    self.keys.remove(old);
                    self.rows.remove(old);
                    let at = index.unwrap_or(old);
                    assert!(
                        at <= self.keys.len(),
                        "change index {at} out of range: {diff}"
                    );
                    self.keys.insert(at, key.clone());
                    self.rows.insert(at, c["row"].clone());
                }
                other => panic!("unknown op {other}: {diff}"),
            }
        }
        self.seq = seq;
        self.verify_checksum(diff);
    }

    /// The event's checksum is the documented hash of the rows now held.
    fn verify_checksum(&self, event: &Value) {
        let rows: Vec<Vec<sluice_engine::Value>> = self
            .rows
            .iter()
            .map(|r| self.columns.iter().map(|c| json_to_value(&r[c])).collect())
            .collect();
        let sum = sluice_live::checksum::checksum(rows.iter().map(|r| &r[..]));
        assert_eq!(
            sluice_live::checksum::render(sum),
            event["checksum"].as_str().expect("checksum"),
            "checksum of {:?} after {event}",
            self.rows
        );
    }

    fn result(&self, ordered: bool) -> Vec<Value> {
        if ordered {
            self.rows.clone()
        } else {
            sorted(&self.rows)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    SseHeader,
    SseAccessToken,
    Ws,
}

struct Subscriber {
    name: String,
    claims: Claims,
    token: String,
    query: Query,
    transport: Transport,
    stream: Option<Stream>,
    mat: Option<Mat>,
    /// A `since` was sent: the next snapshot must be a reset.
    resuming: bool,
}

impl Subscriber {
    fn reads(&self, table: usize) -> bool {
        self.query.template.contains(&format!("{{T{table}"))
    }

    /// Subscribes (or resumes from `since`).
    async fn subscribe(&mut self, addr: SocketAddr, since: Option<u64>) {
        let sql = self.query.sql();
        self.resuming = since.is_some();
        self.stream = Some(match self.transport {
            Transport::SseHeader | Transport::SseAccessToken => {
                let mut url = reqwest::Url::parse(&format!("http://{addr}/v1/live")).unwrap();
                url.query_pairs_mut().append_pair("sql", &sql);
                if let Some(s) = since {
                    url.query_pairs_mut().append_pair("since", &s.to_string());
                }
                let client = reqwest::Client::builder().no_proxy().build().unwrap();
                let mut req = client.get(url.clone());
                if self.transport == Transport::SseHeader {
                    req = req.bearer_auth(&self.token);
                } else {
                    url.query_pairs_mut()
                        .append_pair("access_token", &self.token);
                    req = client.get(url);
                }
                let response = tokio::time::timeout(WAIT, req.send())
                    .await
                    .expect("response headers in time")
                    .unwrap();
                let status = response.status().as_u16();
                if status != 200 {
                    let body = response.text().await.unwrap_or_default();
                    panic!("{}: GET /v1/live {sql}: {status} {body}", self.name);
                }
                Stream::Sse(Sse {
                    response,
                    buf: Vec::new(),
                })
            }
            Transport::Ws => {
                let mut request = format!("ws://{addr}/v1/ws").into_client_request().unwrap();
                request.headers_mut().insert(
                    "Authorization",
                    format!("Bearer {}", self.token).parse().unwrap(),
                );
                let (mut ws, _) =
                    tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
                        .await
                        .expect("the upgrade in time")
                        .unwrap_or_else(|e| panic!("{}: WebSocket upgrade: {e}", self.name));
                let mut msg = json!({"id": 1, "type": "subscribe", "qid": "q", "sql": sql});
                if let Some(s) = since {
                    msg["since"] = json!(s);
                }
                ws.send(Message::Text(msg.to_string().into()))
                    .await
                    .unwrap();
                Stream::Ws(ws)
            }
        });
    }

    /// Reads events until the materialisation equals `expected`, checking every row every
    /// event carries. `policy_change`: the seq of a policy change on a table the query reads;
    /// reads until the subscription ends with `rules_changed` (the stream is then gone) or a
    /// `reset` snapshot of that seq or later arrives (earlier events, still queued from
    /// before, are applied on the way).
    async fn sync(
        &mut self,
        oracle: &Oracle,
        expected: &[Value],
        context: &str,
        policy_change: Option<u64>,
    ) {
        let expect_rules_changed = policy_change.is_some();
        let mut events: Vec<String> = Vec::new();
        loop {
            if !expect_rules_changed {
                if let Some(mat) = &self.mat {
                    if mat.result(self.query.ordered) == expected {
                        return;
                    }
                }
            }
            let stream = self.stream.as_mut().expect("subscribed");
            let Some(event) = stream.event().await else {
                panic!(
                    "{context}: {} ({}) got no event within {WAIT:?} (or its stream ended) after the events {events:#?};\n  materialisation {:?}\n  expected {expected:?}",
                    self.name,
                    self.query.sql(),
                    self.mat.as_ref().map(|m| m.result(self.query.ordered)),
                );
            };
            events.push(event.to_string());
            let ctx = format!(
                "{context}: {} ({}) event {event}",
                self.name,
                self.query.sql()
            );
            let seq = event["seq"].as_u64().unwrap_or(u64::MAX);
            let answers_change = policy_change.is_some_and(|c| seq >= c);
            match event["type"].as_str() {
                Some("snapshot") => {
                    if self.resuming || answers_change {
                        assert_eq!(
                            event["reset"], true,
                            "{ctx}: a snapshot after `since` is a reset"
                        );
                    }
                    self.resuming = false;
                    let rows = event["rows"].as_array().expect("rows");
                    oracle.check_rows(seq, &self.query.shape, &self.claims, rows.iter(), &ctx);
                    self.mat = Some(Mat::snapshot(&event));
                    if answers_change {
                        return;
                    }
                }
                Some("diff") => {
                    self.resuming = false;
                    let changes = event["changes"].as_array().expect("changes");
                    oracle.check_rows(
                        seq,
                        &self.query.shape,
                        &self.claims,
                        changes.iter().filter_map(|c| c.get("row")),
                        &ctx,
                    );
                    self.mat
                        .as_mut()
                        .unwrap_or_else(|| panic!("{ctx}: a diff before any snapshot"))
                        .apply(&event);
                }
                Some("error") if expect_rules_changed => {
                    assert_eq!(event["error"]["code"], "rules_changed", "{ctx}");
                    self.stream = None;
                    return;
                }
                _ => panic!("{ctx}: unexpected event"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------------------------

/// `(table, id)` of each op of a batch.
fn touched_by(ops: &[Value]) -> Vec<(usize, i64)> {
    ops.iter()
        .map(|op| {
            let t = op["table"].as_str().unwrap()[1..].parse().unwrap();
            let id = op.get("id").unwrap_or(&op["row"]["id"]).as_i64().unwrap();
            (t, id)
        })
        .collect()
}

/// A random row; with `bias` (a client writing), often its own `owner` and `team`.
fn random_row(rng: &mut Rng, def: &TableDef, bias: Option<&Claims>) -> Row {
    let own_team = bias.and_then(|c| match &c.team {
        Team::Int(n) => Some(*n),
        Team::Text(t) => t.parse().ok(),
        _ => None,
    });
    Row {
        owner: if def.owner_nullable && rng.chance(15) {
            None
        } else {
            match bias {
                Some(c) if rng.chance(70) => Some(c.sub.clone()),
                _ => Some(rng.pick(&OWNERS).to_string()),
            }
        },
        team: if def.team_nullable && rng.chance(20) {
            None
        } else {
            match own_team {
                Some(n) if rng.chance(60) => Some(n),
                _ => Some(rng.range(1, 3)),
            }
        },
        score: rng.range(0, 100),
        link: if rng.chance(15) {
            None
        } else {
            Some(rng.range(1, 12))
        },
    }
}

fn row_set(r: &Row) -> Value {
    json!({"owner": r.owner, "team": r.team, "score": r.score, "link": r.link})
}

/// A batch of 1–3 ops on distinct rows, applied to `state`; returns the JSON ops.
fn random_batch(
    rng: &mut Rng,
    defs: &[TableDef],
    state: &mut State,
    next_id: &mut [i64],
    bias: Option<&Claims>,
) -> Vec<Value> {
    let mut ops = Vec::new();
    let mut touched = Vec::new();
    let n = if bias.is_some() && rng.chance(60) {
        1
    } else {
        rng.range(1, 3)
    };
    for _ in 0..n {
        let t = rng.below(defs.len());
        let mut existing: Vec<i64> = state[t]
            .keys()
            .copied()
            .filter(|id| !touched.contains(&(t, *id)))
            .collect();
        // A client mostly writes its own rows.
        if let Some(c) = bias {
            let own: Vec<i64> = existing
                .iter()
                .copied()
                .filter(|id| state[t][id].owner.as_deref() == Some(c.sub.as_str()))
                .collect();
            if !own.is_empty() && rng.chance(70) {
                existing = own;
            }
        }
        let kind = if existing.is_empty() || state[t].len() < 4 {
            0
        } else if state[t].len() > 14 {
            1 + rng.below(4)
        } else {
            rng.below(5)
        };
        match kind {
            0 => {
                let id = next_id[t];
                next_id[t] += 1;
                let row = random_row(rng, &defs[t], bias);
                let mut j = row.json(id);
                if rng.chance(30) {
                    ops.push(json!({"op": "upsert", "table": format!("t{t}"), "row": j}));
                } else {
                    j["id"] = json!(id);
                    ops.push(json!({"op": "insert", "table": format!("t{t}"), "row": j}));
                }
                state[t].insert(id, row);
                touched.push((t, id));
            }
            1 | 2 => {
                // Patch: move the row to another owner and/or team, or change its score.
                let id = *rng.pick(&existing);
                let mut row = state[t][&id].clone();
                let fresh = random_row(rng, &defs[t], bias);
                let mut set = Map::new();
                if rng.chance(60) {
                    row.owner = fresh.owner.clone();
                    set.insert("owner".into(), json!(row.owner));
                }
                if rng.chance(40) {
                    row.team = fresh.team;
                    set.insert("team".into(), json!(row.team));
                }
                if set.is_empty() || rng.chance(40) {
                    row.score = fresh.score;
                    set.insert("score".into(), json!(row.score));
                }
                ops.push(json!({"op": "patch", "table": format!("t{t}"), "id": id, "set": set}));
                state[t].insert(id, row);
                touched.push((t, id));
            }
            3 => {
                let id = *rng.pick(&existing);
                let row = random_row(rng, &defs[t], bias);
                let mut j = row_set(&row);
                j["id"] = json!(id);
                ops.push(json!({"op": "upsert", "table": format!("t{t}"), "row": j}));
                state[t].insert(id, row);
                touched.push((t, id));
            }
            _ => {
                let id = *rng.pick(&existing);
                ops.push(json!({"op": "delete", "table": format!("t{t}"), "id": id}));
                state[t].remove(&id);
                touched.push((t, id));
            }
        }
    }
    ops
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

/// One write commit of the run: its seq, the state before and after.
struct Commit {
    seq: u64,
    /// The rows its ops wrote, `(table, id)`.
    touched: Vec<(usize, i64)>,
    before: State,
    after: State,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscriber_sees_exactly_what_its_policies_allow() {
    let seed = seed();
    let long = std::env::var("SLUICE_RULES_LONG").is_ok_and(|v| v == "1");
    let commits = if long { 2000 } else { 400 };
    // A safety bound on the whole run (each wait inside has its own).
    let bound = Duration::from_secs(if long { 3600 } else { 300 });
    if tokio::time::timeout(bound, run(seed, long, commits))
        .await
        .is_err()
    {
        panic!("seed {seed} (SLUICE_RULES_SEED={seed}): the run did not end within {bound:?}");
    }
}

async fn run(seed: u64, long: bool, commits: usize) {
    let mut rng = Rng(seed);
    let ctx0 = format!("seed {seed} (SLUICE_RULES_SEED={seed})");

    let dir = TempDir::new("oracle");
    let (core, addr) = serve(dir.path()).await;
    let http = Http {
        client: reqwest::Client::builder()
            .no_proxy()
            .timeout(WAIT)
            .build()
            .unwrap(),
        addr,
    };

    // Schema.
    let tables = 2 + rng.below(2);
    let defs: Vec<TableDef> = (0..tables)
        .map(|_| TableDef {
            owner_nullable: rng.chance(50),
            team_nullable: rng.chance(50),
        })
        .collect();
    for (i, def) in defs.iter().enumerate() {
        http.admin_sql(&create_table_sql(i, def)).await;
        if rng.chance(50) {
            http.admin_sql(&format!("CREATE INDEX t{i}_owner ON t{i} (owner)"))
                .await;
        }
    }
    let mut oracle = Oracle::new(&defs);

    // Policies: none on some tables (they read as empty), one or two permissive ones, now and
    // then an INSERT-only one that must not open reads.
    let mut policy_no = 0;
    let mut policy_names: Vec<(String, usize, &'static str)> = Vec::new();
    for t in 0..tables {
        let n = *rng.pick(&[0, 1, 1, 1, 2, 2]);
        for _ in 0..n {
            let all = rng.chance(25);
            let p = Policy {
                name: format!("p{policy_no}"),
                table: t,
                command: if all { "ALL" } else { "SELECT" },
                using: Pred::random(&mut rng, 2),
                check: (all && rng.chance(50)).then(|| Pred::random(&mut rng, 1)),
            };
            policy_no += 1;
            if !harness_check() {
                http.admin_sql(&p.create_sql()).await;
                policy_names.push((p.name.clone(), t, "create_policy"));
            }
            oracle.policies.push(p);
        }
        // Write policies: INSERT (which must not open reads), UPDATE with or without WITH
        // CHECK, DELETE.
        for (command, percent) in [("INSERT", 40), ("UPDATE", 50), ("DELETE", 40)] {
            if !rng.chance(percent) {
                continue;
            }
            let p = Policy {
                name: format!("p{policy_no}"),
                table: t,
                command,
                using: Pred::random(&mut rng, 1),
                check: (command == "UPDATE" && rng.chance(60)).then(|| Pred::random(&mut rng, 1)),
            };
            policy_no += 1;
            if !harness_check() {
                http.admin_sql(&p.create_sql()).await;
                policy_names.push((p.name.clone(), t, "create_policy"));
            }
            oracle.policies.push(p);
        }
    }
    let policy_text: Vec<String> = oracle.policies.iter().map(Policy::create_sql).collect();
    eprintln!("rules oracle: {tables} tables {defs:?}\n  policies {policy_text:#?}");

    // Some rows before anyone subscribes.
    let mut state: State = vec![BTreeMap::new(); tables];
    let mut next_id = vec![1i64; tables];
    let mut history: Vec<Commit> = Vec::new();
    for _ in 0..4 {
        let before = state.clone();
        let ops = random_batch(&mut rng, &defs, &mut state, &mut next_id, None);
        let (status, body) = http.post(ADMIN, "/v1/mutate", &json!({ "ops": ops })).await;
        assert_eq!(status, 200, "{ctx0}: {ops:?}: {body}");
        history.push(Commit {
            seq: body["seq"].as_u64().unwrap(),
            touched: touched_by(&ops),
            before,
            after: state.clone(),
        });
    }
    oracle.load(&state);

    // Subscribers.
    let n_subs = if long { 12 } else { 6 + rng.below(5) };
    let mut subs: Vec<Subscriber> = Vec::new();
    for k in 0..n_subs {
        let (claims, query) = if k > 0 && rng.chance(15) {
            // Same claims and query as another: they share a view.
            let other = &subs[rng.below(subs.len())];
            (other.claims.clone(), other.query.clone())
        } else {
            let team = match rng.below(10) {
                0 => Team::Missing,
                1 => Team::Null,
                2 => Team::Text(rng.range(1, 3).to_string()),
                _ => Team::Int(rng.range(1, 3)),
            };
            (
                Claims {
                    sub: rng.pick(&OWNERS).to_string(),
                    team,
                },
                Query::random(&mut rng, tables),
            )
        };
        let transport = *rng.pick(&[
            Transport::SseHeader,
            Transport::SseAccessToken,
            Transport::Ws,
        ]);
        let token = claims.token();
        let mut sub = Subscriber {
            name: format!("subscriber {k} ({claims:?}, {transport:?})"),
            claims,
            token,
            query,
            transport,
            stream: None,
            mat: None,
            resuming: false,
        };
        sub.subscribe(addr, None).await;
        subs.push(sub);
    }
    for s in &subs {
        eprintln!("rules oracle: {}: {}", s.name, s.query.sql());
    }
    for s in subs.iter_mut() {
        let expected = oracle.expected(&s.query, &s.claims);
        s.sync(&oracle, &expected, &format!("{ctx0}, first snapshot"), None)
            .await;
    }

    // Policies change twice during the run. `/v1/changes` is checked per stretch of constant
    // rules (since the seq before the last change: its history and its policy entries).
    let policy_changes = [commits / 3, 2 * commits / 3];
    let mut window = (0u64, 0usize, 0usize);
    let (mut client_writes, mut refused_writes) = (0usize, 0usize);
    for step in 0..commits {
        let ctx = format!("{ctx0}, step {step}");
        if step % 25 == 0 {
            eprintln!("rules oracle: step {step}");
        }

        if policy_changes.contains(&step) && !harness_check() {
            // Catch-up with each client token over the stretch that ends here (under the
            // rules in force until now).
            check_all_changes(
                &http,
                &oracle,
                &subs,
                window.0,
                &history[window.1..],
                &policy_names[window.2..],
                &ctx,
            )
            .await;
            let entries_before = policy_names.len();
            // Create a policy on one table (or drop one): every subscription reading that
            // table follows with a reset snapshot or ends with `rules_changed`; resumed, it
            // reads under the new rules.
            let t = rng.below(tables);
            let claims_before: Vec<BTreeSet<&'static str>> =
                subs.iter().map(|s| oracle.claims_read(&s.query)).collect();
            let policies_before = oracle.policies.clone();
            let droppable: Vec<usize> = (0..oracle.policies.len())
                .filter(|&i| oracle.policies[i].table == t)
                .collect();
            let sql = if !droppable.is_empty() && rng.chance(40) {
                let p = oracle.policies.remove(*rng.pick(&droppable));
                policy_names.push((p.name.clone(), t, "drop_policy"));
                format!("DROP POLICY {} ON t{t}", p.name)
            } else {
                let p = Policy {
                    name: format!("p{policy_no}"),
                    table: t,
                    command: "SELECT",
                    using: Pred::random(&mut rng, 1),
                    check: None,
                };
                policy_no += 1;
                let sql = p.create_sql();
                policy_names.push((p.name.clone(), t, "create_policy"));
                oracle.policies.push(p);
                sql
            };
            eprintln!("rules oracle: step {step}: {sql}");
            let seq = http.admin_sql(&sql).await;
            oracle.before_change = Some((seq, policies_before));
            window = (seq - 1, history.len(), entries_before);
            for (k, s) in subs.iter_mut().enumerate().filter(|(_, s)| s.reads(t)) {
                s.sync(&oracle, &[], &format!("{ctx}, after {sql}"), Some(seq))
                    .await;
                // A reset snapshot when the rules read the claims they read before; the end
                // with `rules_changed` when they read one more (fewer: either).
                let after = oracle.claims_read(&s.query);
                let before = &claims_before[k];
                let ended = s.stream.is_none();
                if after.is_subset(before) && before.is_subset(&after) {
                    assert!(
                        !ended,
                        "{ctx}: {} ended with rules_changed after {sql}, yet its rules read the same claims {before:?}",
                        s.name
                    );
                } else if !after.is_subset(before) {
                    assert!(
                        ended,
                        "{ctx}: {} got a reset snapshot after {sql}, yet its rules now read {after:?}, not only {before:?}",
                        s.name
                    );
                }
                if ended {
                    let since = s.mat.as_ref().map(|m| m.seq);
                    s.subscribe(addr, since).await;
                }
                let expected = oracle.expected(&s.query, &s.claims);
                s.sync(
                    &oracle,
                    &expected,
                    &format!("{ctx}, resumed after {sql}"),
                    None,
                )
                .await;
            }
        }

        // Now and then a subscriber drops its stream and resumes from its last seq; a couple
        // of commits happen while it is away.
        let away = if step % 7 == 3 {
            let k = rng.below(subs.len());
            subs[k].stream = None;
            Some(k)
        } else {
            None
        };

        // The writer: the admin, or (a third of the time) a client whose batch the oracle
        // predicts to pass or to be refused at its first forbidden op.
        let before = state.clone();
        let mut next = state.clone();
        let mut ids = next_id.clone();
        let client = (!harness_check() && rng.chance(33)).then(|| rng.below(subs.len()));
        let bias = client.map(|k| subs[k].claims.clone());
        let ops = random_batch(&mut rng, &defs, &mut next, &mut ids, bias.as_ref());
        let token = client.map_or(ADMIN.to_string(), |k| subs[k].token.clone());
        let refusal = client.and_then(|k| {
            touched_by(&ops)
                .iter()
                .enumerate()
                .find_map(|(i, &(t, id))| {
                    let old = before[t].get(&id).map(|r| r.json(id));
                    let new = next[t].get(&id).map(|r| r.json(id));
                    let (command, ok) =
                        oracle.write_allowed(t, old.as_ref(), new.as_ref(), &subs[k].claims);
                    (!ok).then_some((i, command, t))
                })
        });
        let seq_before = http.health_seq().await;
        let (status, body) = http
            .post(&token, "/v1/mutate", &json!({ "ops": ops }))
            .await;
        let who = client.map_or("the admin".to_string(), |k| subs[k].name.clone());
        if let Some((i, command, t)) = refusal {
            assert_eq!(
                status, 403,
                "{ctx}: {who}: {ops:?} must be refused at op {i} ({command}): {body}"
            );
            let err = &body["error"];
            assert_eq!(err["code"], "forbidden", "{ctx}: {who}: {ops:?}: {body}");
            assert_eq!(
                err["op"],
                json!(i),
                "{ctx}: {who}: {ops:?}: the first forbidden op: {body}"
            );
            assert_eq!(err["command"], command, "{ctx}: {who}: {ops:?}: {body}");
            assert_eq!(
                err["table"],
                format!("t{t}"),
                "{ctx}: {who}: {ops:?}: {body}"
            );
            assert_eq!(
                http.health_seq().await,
                seq_before,
                "{ctx}: {who}: a refused mutate moved the seq"
            );
            refused_writes += 1;
            if let Some(k) = away {
                let since = subs[k].mat.as_ref().map(|m| m.seq);
                subs[k].subscribe(addr, since).await;
            }
            continue;
        }
        assert_eq!(status, 200, "{ctx}: {who}: {ops:?}: {body}");
        if client.is_some() {
            client_writes += 1;
        }
        state = next;
        next_id = ids;
        let seq = body["seq"].as_u64().unwrap();
        history.push(Commit {
            seq,
            touched: touched_by(&ops),
            before,
            after: state.clone(),
        });
        oracle.load(&state);

        if let Some(k) = away {
            let since = subs[k].mat.as_ref().map(|m| m.seq);
            subs[k].subscribe(addr, since).await;
        }

        for s in subs.iter_mut() {
            let expected = oracle.expected(&s.query, &s.claims);
            s.sync(&oracle, &expected, &format!("{ctx}, after {ops:?}"), None)
                .await;
            // One-shot query with the same token.
            let (status, body) = http
                .post(&s.token, "/v1/query", &json!({ "sql": s.query.sql() }))
                .await;
            assert_eq!(status, 200, "{ctx}: {}: /v1/query: {body}", s.name);
            assert!(body["seq"].as_u64().unwrap() >= seq, "{ctx}: {body}");
            let rows = body["rows"].as_array().expect("rows");
            oracle.check_rows(
                u64::MAX,
                &s.query.shape,
                &s.claims,
                rows.iter(),
                &format!("{ctx}: /v1/query of {}", s.name),
            );
            let got = if s.query.ordered {
                rows.clone()
            } else {
                sorted(rows)
            };
            assert_eq!(
                got,
                expected,
                "{ctx}: {}: /v1/query {}",
                s.name,
                s.query.sql()
            );
        }

        if step % 5 == 0 {
            check_row_reads(&http, &oracle, &subs, &state, &mut rng, &ctx).await;
        }
    }

    eprintln!(
        "rules oracle: {} commits, {client_writes} of them by clients; {refused_writes} client mutates refused as predicted",
        history.len()
    );

    // Catch-up with each client token over the last stretch.
    check_all_changes(
        &http,
        &oracle,
        &subs,
        window.0,
        &history[window.1..],
        &policy_names[window.2..],
        &ctx0,
    )
    .await;

    drop(subs);
    core.shutdown().await.expect("clean shutdown");
}

/// Row reads and paged scans with each subscriber's token equal the oracle.
async fn check_row_reads(
    http: &Http,
    oracle: &Oracle,
    subs: &[Subscriber],
    state: &State,
    rng: &mut Rng,
    ctx: &str,
) {
    for s in subs {
        for (t, rows) in state.iter().enumerate() {
            // Three ids: present or not.
            for _ in 0..3 {
                let id = rng.range(1, rows.keys().last().copied().unwrap_or(1) + 1);
                let (status, body) = http
                    .get(&s.token, &format!("/v1/tables/t{t}/rows/{id}"), &[])
                    .await;
                let readable = rows
                    .get(&id)
                    .is_some_and(|r| oracle.readable(t, &r.json(id), &s.claims));
                if readable {
                    assert_eq!(status, 200, "{ctx}: {} reads t{t}/{id}: {body}", s.name);
                    assert_eq!(
                        body["row"],
                        rows[&id].json(id),
                        "{ctx}: {} reads t{t}/{id}",
                        s.name
                    );
                } else {
                    assert_eq!(
                        status, 404,
                        "{ctx}: {} reads t{t}/{id} it may not read (or absent): {body}",
                        s.name
                    );
                    assert_eq!(body["error"]["code"], "not_found", "{ctx}: {body}");
                }
            }
            // A paged scan.
            let mut got = Vec::new();
            let mut after: Option<String> = None;
            for _ in 0..1000 {
                let mut params = vec![("limit", "3".to_string())];
                if let Some(a) = &after {
                    params.push(("after", a.clone()));
                }
                let (status, body) = http
                    .get(&s.token, &format!("/v1/tables/t{t}/rows"), &params)
                    .await;
                assert_eq!(status, 200, "{ctx}: {} scans t{t}: {body}", s.name);
                for item in body["rows"].as_array().expect("rows") {
                    got.push(item["row"].clone());
                }
                match &body["next"] {
                    Value::Null => break,
                    Value::String(n) => after = Some(n.clone()),
                    other => after = Some(other.to_string()),
                }
            }
            let want: Vec<Value> = rows
                .iter()
                .map(|(id, r)| r.json(*id))
                .filter(|j| oracle.readable(t, j, &s.claims))
                .collect();
            assert_eq!(got, want, "{ctx}: {} scans t{t}", s.name);
        }
    }
}

/// [`check_changes`] for each distinct claims among the subscribers.
async fn check_all_changes(
    http: &Http,
    oracle: &Oracle,
    subs: &[Subscriber],
    since: u64,
    history: &[Commit],
    policy_want: &[(String, usize, &'static str)],
    ctx: &str,
) {
    let mut seen: Vec<&Claims> = Vec::new();
    for s in subs {
        if !seen.contains(&&s.claims) {
            seen.push(&s.claims);
            check_changes(http, oracle, s, since, history, policy_want, ctx).await;
        }
    }
}

/// `/v1/changes?since=<since>` with the subscriber's token, paged, is exactly what the
/// contract lets it see of `history` (the write commits after `since`), and its policy
/// entries are `policy_want` (name, table, op), in order.
async fn check_changes(
    http: &Http,
    oracle: &Oracle,
    s: &Subscriber,
    since: u64,
    history: &[Commit],
    policy_want: &[(String, usize, &'static str)],
    ctx: &str,
) {
    let ctx = format!(
        "{ctx}: /v1/changes?since={since} for {} ({:?})",
        s.name, s.claims
    );
    let last = history.last().expect("commits").seq;
    let mut got: Vec<Value> = Vec::new();
    let mut from = since;
    for _ in 0..100_000 {
        let (status, body) = http
            .get(
                &s.token,
                "/v1/changes",
                &[("since", from.to_string()), ("limit", "4".into())],
            )
            .await;
        assert_eq!(status, 200, "{ctx}: {body}");
        let page = body["changes"].as_array().expect("changes");
        got.extend(page.iter().cloned());
        let next = body["next"].as_u64().expect("next");
        assert!(next >= from, "{ctx}: next {next} < since {from}");
        if next >= last || (page.is_empty() && next == from) {
            break;
        }
        from = next;
    }

    // Every row entry carries only what the caller may read.
    let table_of = |e: &Value| -> usize { e["table"].as_str().unwrap()[1..].parse().unwrap() };
    for e in &got {
        if matches!(e["op"].as_str(), Some("insert" | "update" | "delete")) && !e["row"].is_null() {
            assert!(
                oracle.readable(table_of(e), &e["row"], &s.claims),
                "{ctx}: LEAK: {e}"
            );
        }
    }
    // Policy entries, in order.
    let policy_got: Vec<(String, String, String)> = got
        .iter()
        .filter(|e| matches!(e["op"].as_str(), Some("create_policy" | "drop_policy")))
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e["table"].as_str().unwrap_or_default().to_string(),
                e["op"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let policy_want: Vec<(String, String, String)> = policy_want
        .iter()
        .map(|(n, t, op)| (n.clone(), format!("t{t}"), op.to_string()))
        .collect();
    assert_eq!(policy_got, policy_want, "{ctx}: policy entries");

    // Row entries: per commit, exactly the rows whose old or new image is readable: a
    // readable new image as usual (`insert` for a new row, `update` for an old one; a row
    // that was there but unreadable may come as either), a readable old image whose new one
    // is not (or a delete) as `delete`.
    type Entry = (u64, String, i64, String, Option<Value>);
    let mut want: Vec<Entry> = Vec::new();
    for c in history {
        for &(t, id) in &c.touched {
            {
                let old = c.before[t].get(&id);
                let new = c.after[t].get(&id);
                let r_old = old.is_some_and(|r| oracle.readable(t, &r.json(id), &s.claims));
                let r_new = new.is_some_and(|r| oracle.readable(t, &r.json(id), &s.claims));
                let op = if r_new {
                    match (old, r_old) {
                        (None, _) => "insert",
                        (Some(_), true) => "update",
                        (Some(_), false) => "insert|update",
                    }
                } else if r_old {
                    "delete"
                } else {
                    continue;
                };
                let row = r_new.then(|| new.unwrap().json(id));
                want.push((c.seq, format!("t{t}"), id, op.to_string(), row));
            }
        }
    }
    let mut have: Vec<Entry> = got
        .iter()
        .filter(|e| matches!(e["op"].as_str(), Some("insert" | "update" | "delete")))
        .map(|e| {
            let op = e["op"].as_str().unwrap().to_string();
            let row = (op != "delete").then(|| e["row"].clone());
            (
                e["seq"].as_u64().unwrap(),
                e["table"].as_str().unwrap().to_string(),
                e["id"].as_i64().unwrap(),
                op,
                row,
            )
        })
        .collect();
    let key = |w: &Entry| (w.0, w.1.clone(), w.2);
    want.sort_by_key(key);
    have.sort_by_key(key);
    for h in have.iter_mut() {
        if let Some(w) = want.iter().find(|w| key(w) == key(h)) {
            if w.3 == "insert|update" && (h.3 == "insert" || h.3 == "update") {
                h.3 = w.3.clone();
            }
        }
    }
    if have != want {
        let extra: Vec<&Entry> = have.iter().filter(|h| !want.contains(h)).collect();
        let missing: Vec<&Entry> = want.iter().filter(|w| !have.contains(w)).collect();
        panic!("{ctx}: the changes differ from those it may read:\n  served but not expected: {extra:?}\n  expected but not served: {missing:?}");
    }
}
