//! Differential oracle: a seeded random workload writes the same rows to the engine and to
//! SQLite, then random queries of every supported shape must return the same rows.
//!
//! `SLUICE_QUERY_SEED` picks the seed (printed on failure), `SLUICE_QUERY_OPS` the number
//! of write ops (queries run every few ops).

use std::cmp::Ordering;

use serde_json::{json, Map, Value as Json};
use sluice_engine::{Changelog, Db, Limits, Retention, Value};
use sluice_query::Params;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const TABLES: [&str; 3] = ["t0", "t1", "t2"];
const IDS_MAX: i64 = 30;
const WORDS: [&str; 19] = [
    "apple", "Apple", "banana", "cherry", "date", "Elder", "fig", "grape", "", "a_b", "100%",
    // Text that looks numeric: compared with a number, numeric affinity converts it.
    "10", "9", "1e3", " 7", "-2", "3.5", "007", "12abc",
];
/// Text operands for comparisons with numeric columns (affinity converts the well-formed).
const NUMERIC_TEXTS: [&str; 12] = [
    "3", "10", " 7", "1e1", "2.5", "-2", "007", "abc", "", "12abc", "0x10", "+4",
];
const LIKE_PATTERNS: [&str; 8] = ["a%", "%an%", "_pple", "%E%", "%", "a_b", "%0%%", "_"];

fn ddl() -> String {
    let mut s = String::new();
    for t in TABLES {
        s.push_str(&format!(
            "CREATE TABLE {t} (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT, d BOOLEAN, r INTEGER);"
        ));
    }
    s.push_str(
        "CREATE INDEX t0_a ON t0 (a); CREATE INDEX t1_r ON t1 (r); CREATE INDEX t2_c ON t2 (c, a);",
    );
    s
}

fn random_column(rng: &mut Rng, col: &str) -> Json {
    if rng.chance(15) {
        return Json::Null;
    }
    match col {
        "a" => json!(rng.range(-5, 20)),
        "b" => json!(rng.range(-40, 40) as f64 / 4.0),
        "c" => json!(rng.pick(&WORDS)),
        "d" => json!(rng.chance(50)),
        _ => json!(rng.range(1, IDS_MAX)),
    }
}

fn to_sql(j: &Json) -> rusqlite::types::Value {
    use rusqlite::types::Value as S;
    match j {
        Json::Null => S::Null,
        Json::Bool(b) => S::Integer(*b as i64),
        Json::Number(n) if n.is_i64() => S::Integer(n.as_i64().unwrap()),
        Json::Number(n) => S::Real(n.as_f64().unwrap()),
        Json::String(s) => S::Text(s.clone()),
        _ => unreachable!(),
    }
}

fn to_sluice(v: &rusqlite::types::Value) -> Value {
    use rusqlite::types::Value as S;
    match v {
        S::Null => Value::Null,
        S::Integer(i) => Value::Integer(*i),
        S::Real(r) => Value::Real(*r),
        S::Text(s) => Value::Text(s.as_str().into()),
        S::Blob(b) => Value::Blob(b.clone().into()),
    }
}

fn normalise(v: &Value) -> Value {
    match v {
        Value::Boolean(b) => Value::Integer(*b as i64),
        other => other.clone(),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Real(_), _) | (_, Value::Real(_)) => {
            let f = |v: &Value| match v {
                Value::Real(r) => Some(*r),
                Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match (f(a), f(b)) {
                (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                _ => false,
            }
        }
        _ => normalise(a) == normalise(b) && a.is_null() == b.is_null(),
    }
}

struct Generated {
    sql: String,
    params: Vec<Value>,
    ordered: bool,
}

struct Gen<'r> {
    rng: &'r mut Rng,
    params: Vec<Value>,
}

impl Gen<'_> {
    fn int_expr(&mut self, x: &str) -> String {
        match self.rng.below(9) {
            0 => format!("{x}.id"),
            1 | 2 => format!("{x}.a"),
            3 => format!("{x}.r"),
            4 => format!("{x}.a + {x}.r"),
            5 => format!("{x}.a * 2 - {x}.id"),
            6 => format!("{x}.a / {}", self.rng.range(-3, 3)),
            7 => format!("{x}.a % {}", self.rng.range(-4, 4)),
            _ => format!("-{x}.a"),
        }
    }

    fn real_expr(&mut self, x: &str) -> String {
        match self.rng.below(4) {
            0 | 1 => format!("{x}.b"),
            2 => format!("{x}.b * 2 + {x}.a"),
            _ => format!("{x}.b / {}", self.rng.range(0, 3)),
        }
    }

    fn text_expr(&mut self, x: &str) -> String {
        match self.rng.below(3) {
            0 | 1 => format!("{x}.c"),
            _ => format!("{x}.c || '-' || {x}.a"),
        }
    }

    fn int_const(&mut self) -> String {
        if self.rng.chance(10) {
            self.params.push(Value::Integer(self.rng.range(-5, 25)));
            return format!("${}", self.params.len());
        }
        self.rng.range(-5, 25).to_string()
    }

    /// A text operand: a literal or (sometimes) a parameter bound as text.
    fn text_const(&mut self) -> String {
        let t = *self.rng.pick(&NUMERIC_TEXTS);
        if self.rng.chance(30) {
            self.params.push(Value::Text(t.into()));
            return format!("${}", self.params.len());
        }
        format!("'{t}'")
    }

    /// A number compared with a TEXT column (text affinity converts it).
    fn num_const(&mut self) -> String {
        let n = match self.rng.below(3) {
            0 => self.rng.range(-3, 12).to_string(),
            1 => format!("{}", self.rng.range(-6, 30) as f64 / 2.0),
            _ => "1000".into(),
        };
        if self.rng.chance(25) {
            let v = match n.parse::<i64>() {
                Ok(i) => Value::Integer(i),
                Err(_) => Value::Real(n.parse().unwrap()),
            };
            self.params.push(v);
            return format!("${}", self.params.len());
        }
        n
    }

    /// Comparisons whose operands differ in type: SQLite's affinity rules decide.
    fn affinity_pred(&mut self, x: &str) -> String {
        match self.rng.below(12) {
            0 => {
                let c = self.rng.pick(&["a", "r", "id", "b", "d"]);
                let (op, t) = (self.cmp_op(), self.text_const());
                format!("{x}.{c} {op} {t}")
            }
            1 => {
                let (op, n) = (self.cmp_op(), self.num_const());
                format!("{x}.c {op} {n}")
            }
            2 => {
                let c = self.rng.pick(&["a", "r", "b", "id"]);
                let op = self.cmp_op();
                if self.rng.chance(50) {
                    format!("{x}.{c} {op} {x}.c")
                } else {
                    format!("{x}.c {op} {x}.{c}")
                }
            }
            3 => {
                let items: Vec<String> = (0..self.rng.range(1, 4))
                    .map(|_| {
                        if self.rng.chance(50) {
                            self.text_const()
                        } else {
                            self.rng.range(-3, 12).to_string()
                        }
                    })
                    .collect();
                let c = self.rng.pick(&["a", "c", "r"]);
                let not = if self.rng.chance(30) { " NOT" } else { "" };
                format!("{x}.{c}{not} IN ({})", items.join(", "))
            }
            4 => {
                let not = if self.rng.chance(20) { " NOT" } else { "" };
                let (lo, hi) = (self.text_const(), self.text_const());
                format!("{x}.a{not} BETWEEN {lo} AND {hi}")
            }
            5 => {
                let not = if self.rng.chance(20) { " NOT" } else { "" };
                let (lo, hi) = (self.num_const(), self.num_const());
                format!("{x}.c{not} BETWEEN {lo} AND {hi}")
            }
            6 => {
                let c = self.rng.pick(&["a", "b", "c", "d", "r"]);
                let not = if self.rng.chance(50) { " NOT" } else { "" };
                let v = match self.rng.below(4) {
                    0 => "NULL".to_string(),
                    1 => self.text_const(),
                    2 => self.num_const(),
                    _ => format!("{x}.{}", self.rng.pick(&["a", "c", "r"])),
                };
                format!("{x}.{c} IS{not} {v}")
            }
            7 => {
                // No affinity on either side: compared as they are.
                let op = self.cmp_op();
                format!("{x}.c || '' {op} {}", self.num_const())
            }
            8 => {
                // `+col` and `col + 0` have no affinity: compared as they are.
                let e = if self.rng.chance(50) {
                    format!("+{x}.{}", self.rng.pick(&["a", "c", "b"]))
                } else {
                    format!("{x}.a + 0")
                };
                format!("{e} {} {}", self.cmp_op(), self.text_const())
            }
            9 => format!("{x}.id = {}", self.text_const()),
            10 => format!("{x}.r {} {}", self.cmp_op(), self.text_const()),
            _ => format!("{} {} {x}.a", self.text_const(), self.cmp_op()),
        }
    }

    fn cmp_op(&mut self) -> &'static str {
        const OPS: [&str; 6] = ["=", "<>", "<", "<=", ">", ">="];
        OPS[self.rng.below(6) as usize]
    }

    fn pred(&mut self, x: &str, depth: u32) -> String {
        let choice = self.rng.below(if depth > 1 { 14 } else { 17 });
        if self.rng.chance(25) {
            return self.affinity_pred(x);
        }
        match choice {
            0 | 1 => {
                let (e, op, c) = (self.int_expr(x), self.cmp_op(), self.int_const());
                format!("{e} {op} {c}")
            }
            2 => {
                let (e, op) = (self.real_expr(x), self.cmp_op());
                format!("{e} {op} {}", self.rng.range(-20, 20) as f64 / 2.0)
            }
            3 => {
                let (e, op) = (self.text_expr(x), self.cmp_op());
                format!("{e} {op} '{}'", self.rng.pick(&WORDS))
            }
            4 => format!("{x}.d = {}", self.rng.below(2)),
            5 => format!("{x}.d"),
            6 => {
                let c = self.rng.pick(&["a", "b", "c", "d", "r"]);
                let not = if self.rng.chance(50) { " NOT" } else { "" };
                format!("{x}.{c} IS{not} NULL")
            }
            7 => {
                let mut items: Vec<String> = (0..self.rng.range(1, 4))
                    .map(|_| self.rng.range(-5, 20).to_string())
                    .collect();
                if self.rng.chance(20) {
                    items.push("NULL".into());
                }
                let not = if self.rng.chance(30) { " NOT" } else { "" };
                format!("{}{not} IN ({})", self.int_expr(x), items.join(", "))
            }
            8 => {
                let lo = self.rng.range(-5, 15);
                let hi = lo + self.rng.range(-2, 10);
                let not = if self.rng.chance(20) { " NOT" } else { "" };
                format!("{}{not} BETWEEN {lo} AND {hi}", self.int_expr(x))
            }
            9 => {
                let not = if self.rng.chance(20) { " NOT" } else { "" };
                format!("{x}.c{not} LIKE '{}'", self.rng.pick(&LIKE_PATTERNS))
            }
            10 => format!("{x}.id {} {}", self.cmp_op(), self.int_const()),
            11 => format!(
                "{x}.id BETWEEN {} AND {}",
                self.int_const(),
                self.int_const()
            ),
            12 => {
                let (e, op, f) = (self.real_expr(x), self.cmp_op(), self.int_expr(x));
                format!("{e} {op} {f}")
            }
            13 => format!("{x}.a = {}", self.int_const()),
            14 => format!("NOT ({})", self.pred(x, depth + 1)),
            15 => format!(
                "({} AND {})",
                self.pred(x, depth + 1),
                self.pred(x, depth + 1)
            ),
            _ => format!(
                "({} OR {})",
                self.pred(x, depth + 1),
                self.pred(x, depth + 1)
            ),
        }
    }

    fn where_clause(&mut self, x: &str) -> String {
        if self.rng.chance(20) {
            String::new()
        } else {
            format!(" WHERE {}", self.pred(x, 0))
        }
    }

    fn limit(&mut self) -> String {
        match self.rng.below(4) {
            0 => format!(" LIMIT {}", self.rng.range(0, 10)),
            1 => format!(
                " LIMIT {} OFFSET {}",
                self.rng.range(0, 10),
                self.rng.range(0, 10)
            ),
            _ => String::new(),
        }
    }

    fn single(&mut self) -> Generated {
        let t = self.rng.pick(&TABLES);
        let cols = match self.rng.below(4) {
            0 => "*".to_string(),
            1 => format!("x.id, {} AS v, {}", self.int_expr("x"), self.real_expr("x")),
            2 => format!("x.id, {}, x.d, x.c", self.text_expr("x")),
            _ => format!("x.id, x.a, x.b, x.c, x.d, x.r, {}", self.int_expr("x")),
        };
        let mut sql = format!("SELECT {cols} FROM {t} x{}", self.where_clause("x"));
        let ordered = self.rng.chance(70);
        if ordered {
            let key = self
                .rng
                .pick(&["x.a", "x.b", "x.c", "x.d", "x.r", "x.a + x.r"]);
            let dir = self.rng.pick(&[
                "",
                " ASC",
                " DESC",
                " NULLS LAST",
                " DESC NULLS FIRST",
                " ASC NULLS FIRST",
            ]);
            let iddir = self.rng.pick(&["", " DESC"]);
            sql.push_str(&format!(" ORDER BY {key}{dir}, x.id{iddir}"));
            sql.push_str(&self.limit());
        }
        self.done(sql, ordered)
    }

    fn done(&mut self, sql: String, ordered: bool) -> Generated {
        Generated {
            sql,
            params: std::mem::take(&mut self.params),
            ordered,
        }
    }

    fn join(&mut self) -> Generated {
        let mut order = TABLES.to_vec();
        for i in (1..order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let three = self.rng.chance(50);
        let aliases = ["x", "y", "z"];
        let n = if three { 3 } else { 2 };
        let mut sql = String::from("SELECT x.id, y.id, ");
        if three {
            sql.push_str("z.id, z.c, ");
        }
        sql.push_str(&format!("x.a, y.b, {}", self.int_expr("y")));
        sql.push_str(&format!(" FROM {} x", order[0]));
        for k in 1..n {
            let kind = self
                .rng
                .pick(&["JOIN", "INNER JOIN", "LEFT JOIN", "LEFT OUTER JOIN"]);
            let me = aliases[k];
            let other = aliases[self.rng.below(k as u64) as usize];
            let on = match self.rng.below(7) {
                5 => format!("{me}.c = {other}.a"),
                6 => format!("{other}.c = {me}.r"),
                0 => format!("{me}.id = {other}.r"),
                1 => format!("{me}.r = {other}.id"),
                2 => format!("{other}.a = {me}.a"),
                3 => format!("{me}.c = {other}.c"),
                _ => format!("{me}.r = {other}.r AND {me}.a > {other}.a"),
            };
            sql.push_str(&format!(" {kind} {} {me} ON {on}", order[k]));
        }
        if self.rng.chance(70) {
            let who = aliases[self.rng.below(n as u64) as usize];
            sql.push_str(&format!(" WHERE {}", self.pred(who, 1)));
        }
        let ordered = self.rng.chance(60);
        if ordered {
            sql.push_str(" ORDER BY x.id, y.id");
            if three {
                sql.push_str(", z.id DESC");
            }
            sql.push_str(&self.limit());
        }
        self.done(sql, ordered)
    }

    fn subquery(&mut self, level: u32, max: u32) -> String {
        let t = self.rng.pick(&TABLES);
        let s = format!("s{level}");
        let col = self.rng.pick(&["a", "r", "id", "c"]);
        let mut sql = format!("SELECT {s}.{col} FROM {t} {s}");
        let mut conds = Vec::new();
        if self.rng.chance(70) {
            conds.push(self.pred(&s, 1));
        }
        if level < max {
            let c = self.rng.pick(&["a", "r", "id"]);
            let not = if self.rng.chance(25) { " NOT" } else { "" };
            conds.push(format!(
                "{s}.{c}{not} IN ({})",
                self.subquery(level + 1, max)
            ));
        }
        if !conds.is_empty() {
            sql.push_str(&format!(" WHERE {}", conds.join(" AND ")));
        }
        if self.rng.chance(15) {
            sql.push_str(&format!(" ORDER BY {s}.id LIMIT {}", self.rng.range(0, 8)));
        }
        sql
    }

    fn in_subquery(&mut self) -> Generated {
        let t = self.rng.pick(&TABLES);
        let max = self.rng.range(1, 3) as u32;
        let col = self.rng.pick(&["a", "r", "id", "c"]);
        let not = if self.rng.chance(25) { " NOT" } else { "" };
        let mut sql = format!(
            "SELECT x.id, x.a, x.c FROM {t} x WHERE x.{col}{not} IN ({})",
            self.subquery(1, max)
        );
        if self.rng.chance(40) {
            sql.push_str(&format!(" AND {}", self.pred("x", 1)));
        }
        let ordered = self.rng.chance(50);
        if ordered {
            sql.push_str(" ORDER BY x.id DESC");
            sql.push_str(&self.limit());
        }
        self.done(sql, ordered)
    }

    fn group(&mut self) -> Generated {
        let t = self.rng.pick(&TABLES);
        let aggs = [
            "COUNT(*)",
            "COUNT(x.b)",
            "SUM(x.a)",
            "SUM(x.b)",
            "SUM(x.d)",
            "MIN(x.c)",
            "MAX(x.a)",
            "MIN(x.b)",
            "MAX(x.d)",
            "AVG(x.b)",
            "AVG(x.a)",
            "SUM(x.a * 2 + x.id)",
            "COUNT(x.c)",
        ];
        let mut picked: Vec<&str> = (0..self.rng.range(1, 4))
            .map(|_| *self.rng.pick(&aggs))
            .collect();
        picked.dedup();
        let aggs_sql = picked.join(", ");
        let mut join = String::new();
        if self.rng.chance(25) {
            let other = self.rng.pick(&TABLES);
            let kind = self.rng.pick(&["JOIN", "LEFT JOIN"]);
            join = format!(" {kind} {other} y ON y.id = x.r");
        }
        let where_ = self.where_clause("x");
        if self.rng.chance(20) {
            let sql = format!("SELECT {aggs_sql} FROM {t} x{join}{where_}");
            return self.done(sql, true);
        }
        let key = *self.rng.pick(&["x.a", "x.c", "x.d", "x.r", "x.a % 3"]);
        // GROUP BY may name the select-list alias instead of repeating the expression.
        let by = if self.rng.chance(30) { "k" } else { key };
        let mut sql =
            format!("SELECT {key} AS k, {aggs_sql} AS n FROM {t} x{join}{where_} GROUP BY {by}");
        if picked.len() > 1 {
            sql = format!("SELECT {key} AS k, {aggs_sql} FROM {t} x{join}{where_} GROUP BY {by}");
        }
        match self.rng.below(6) {
            4 => {
                let c = self.text_const();
                sql.push_str(&format!(" HAVING k {} {c}", self.cmp_op()));
            }
            5 if picked.len() == 1 => {
                sql.push_str(&format!(" HAVING n > {}", self.rng.range(0, 3)));
            }
            0 => sql.push_str(&format!(" HAVING COUNT(*) > {}", self.rng.range(0, 3))),
            1 => sql.push_str(&format!(
                " HAVING SUM(x.a) > {} OR MIN(x.b) IS NULL",
                self.rng.range(-5, 30)
            )),
            _ => {}
        }
        let ordered = self.rng.chance(60);
        if ordered {
            let dir = self.rng.pick(&["", " DESC"]);
            sql.push_str(&format!(" ORDER BY k{dir}"));
            sql.push_str(&self.limit());
        }
        self.done(sql, ordered)
    }
}

fn sort_rows(rows: &mut [Vec<Value>]) {
    for r in rows.iter_mut() {
        for v in r.iter_mut() {
            *v = normalise(v);
        }
    }
    rows.sort_by(|a, b| {
        a.iter()
            .zip(b.iter())
            .map(|(x, y)| x.cmp(y))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or(Ordering::Equal)
    });
}

#[test]
fn random_queries_match_sqlite() {
    let seed: u64 = std::env::var("SLUICE_QUERY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let ops: usize = std::env::var("SLUICE_QUERY_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    eprintln!("SLUICE_QUERY_SEED={seed} SLUICE_QUERY_OPS={ops}");
    let mut rng = Rng(seed);

    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let changes = sluice_sql::parse_ddl(&ddl())
        .expect("DDL parses")
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, ddl()).expect("DDL applies");
    let lite = rusqlite::Connection::open_in_memory().unwrap();
    lite.execute_batch(&ddl()).unwrap();

    let mut exists = [[false; IDS_MAX as usize + 1]; 3];
    let mut checked = 0usize;
    let mut shapes = [0usize; 5];
    for op in 0..ops {
        let ti = rng.below(3) as usize;
        let t = TABLES[ti];
        let id = rng.range(1, IDS_MAX);
        let mut tx = db.transaction();
        match rng.below(4) {
            0 | 1 => {
                let mut row = Map::new();
                row.insert("id".into(), json!(id));
                for c in ["a", "b", "c", "d", "r"] {
                    row.insert(c.into(), random_column(&mut rng, c));
                }
                tx.upsert(t, &row, None).expect("upsert");
                let vals: Vec<rusqlite::types::Value> = ["id", "a", "b", "c", "d", "r"]
                    .iter()
                    .map(|c| to_sql(&row[*c]))
                    .collect();
                lite.execute(
                    &format!("INSERT OR REPLACE INTO {t} VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                    rusqlite::params_from_iter(vals),
                )
                .unwrap();
                exists[ti][id as usize] = true;
            }
            2 if exists[ti][id as usize] => {
                let c = *rng.pick(&["a", "b", "c", "d", "r"]);
                let v = random_column(&mut rng, c);
                let mut set = Map::new();
                set.insert(c.into(), v.clone());
                tx.patch(t, &json!(id), &set, None).expect("patch");
                lite.execute(
                    &format!("UPDATE {t} SET {c} = ?1 WHERE id = ?2"),
                    rusqlite::params![to_sql(&v), id],
                )
                .unwrap();
            }
            _ if exists[ti][id as usize] => {
                tx.delete(t, &json!(id), None).expect("delete");
                lite.execute(&format!("DELETE FROM {t} WHERE id = ?1"), [id])
                    .unwrap();
                exists[ti][id as usize] = false;
            }
            _ => {}
        }
        tx.commit();

        if op % 10 != 9 {
            continue;
        }
        for _ in 0..6 {
            let mut g = Gen {
                rng: &mut rng,
                params: Vec::new(),
            };
            let shape = g.rng.below(5) as usize;
            shapes[shape] += 1;
            let q = match shape {
                0 => g.single(),
                1 => g.join(),
                2 => g.in_subquery(),
                3 => g.group(),
                _ => {
                    if g.rng.chance(50) {
                        g.single()
                    } else {
                        g.group()
                    }
                }
            };
            let fail = |what: String| -> ! {
                panic!(
                    "seed {seed} (SLUICE_QUERY_SEED={seed}), after op {op}\nSQL: {}\nparams: {:?}\n{what}",
                    q.sql, q.params
                )
            };
            let ours = match sluice_query::query(&q.sql, &db, &Params::Positional(q.params.clone()))
            {
                Ok(r) => r.rows,
                Err(e) => fail(format!("sluice refused: {e}")),
            };
            let lite_sql = q.sql.replace('$', "?");
            let mut stmt = match lite.prepare(&lite_sql) {
                Ok(s) => s,
                Err(e) => fail(format!("sqlite refused: {e}")),
            };
            let ncol = stmt.column_count();
            let lite_params: Vec<rusqlite::types::Value> = q
                .params
                .iter()
                .map(|v| match v {
                    Value::Integer(i) => rusqlite::types::Value::Integer(*i),
                    Value::Real(r) => rusqlite::types::Value::Real(*r),
                    Value::Text(t) => rusqlite::types::Value::Text(t.to_string()),
                    _ => unreachable!(),
                })
                .collect();
            let mut theirs: Vec<Vec<Value>> = stmt
                .query_map(rusqlite::params_from_iter(lite_params), |row| {
                    (0..ncol)
                        .map(|i| {
                            row.get::<_, rusqlite::types::Value>(i)
                                .map(|v| to_sluice(&v))
                        })
                        .collect()
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let mut ours = ours;
            if !q.ordered {
                sort_rows(&mut ours);
                sort_rows(&mut theirs);
            }
            let equal = ours.len() == theirs.len()
                && ours
                    .iter()
                    .zip(&theirs)
                    .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)));
            if !equal {
                fail(format!(
                    "rows differ (ordered: {}):\n sluice: {ours:?}\n sqlite: {theirs:?}",
                    q.ordered
                ));
            }
            checked += 1;
        }
    }
    eprintln!(
        "{checked} queries matched SQLite (single, join, in-subquery, group, mixed: {shapes:?})"
    );
    assert!(checked > 0);
}
