//! Compiled scalar expressions and their evaluation with SQLite's semantics.
//!
//! An [`Expr`] refers to columns by position in the row it is evaluated against (the
//! concatenation of the joined tables' columns, or a group's keys), so evaluation needs no
//! names and no schema: an incremental engine can evaluate the same `Expr` against a single
//! changed row.
//!
//! Semantics follow SQLite for Sluice's types: three-valued logic; NULL in, NULL out;
//! INTEGER and REAL compare numerically; integer arithmetic stays integer (falling back to
//! REAL on overflow), integer division truncates, division or modulo by zero is NULL;
//! BOOLEAN behaves as the integers 0 and 1; comparisons return the integers 0 or 1.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use sluice_engine::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Concat,
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
    /// `IS`: `=` that treats two NULLs as equal and never yields NULL.
    Is,
    /// `IS NOT`: the negation of [`BinOp::Is`].
    IsNot,
    And,
    Or,
}

/// SQLite's type affinity of an operand (datatype3.html §3), as far as comparisons need it:
/// a column has its declared type's affinity, any other expression has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// An expression that is not a column.
    None,
    /// A BLOB column: no conversion.
    Blob,
    /// A TEXT (or JSON) column: numbers compared with it are compared as their text.
    Text,
    /// An INTEGER, REAL, BOOLEAN or TIMESTAMP column: text that is a well-formed number
    /// is compared as that number.
    Numeric,
}

impl Affinity {
    /// The affinity of a column of type `ty`. JSON is stored as text, so it has TEXT
    /// affinity (a JSON number compares with a number as SQLite compares a stored number).
    pub fn of_column(ty: sluice_engine::ColumnType) -> Affinity {
        use sluice_engine::ColumnType as T;
        match ty {
            T::Integer | T::Real | T::Boolean | T::Timestamp => Affinity::Numeric,
            T::Text | T::Json => Affinity::Text,
            T::Blob => Affinity::Blob,
        }
    }

    /// The affinity a comparison between operands of affinities `a` and `b` applies to
    /// both (SQLite's `sqlite3CompareAffinity`): two columns compare numerically if either
    /// is numeric, else as they are; a column and a non-column use the column's.
    pub fn comparison(a: Affinity, b: Affinity) -> Affinity {
        match (a, b) {
            (Affinity::None, x) | (x, Affinity::None) => x,
            (Affinity::Numeric, _) | (_, Affinity::Numeric) => Affinity::Numeric,
            _ => Affinity::Blob,
        }
    }

    /// Whether applying `self` can change a value of an operand whose own affinity is `of`.
    pub fn converts(self, of: Affinity) -> bool {
        match self {
            Affinity::Numeric => of != Affinity::Numeric && of != Affinity::Blob,
            Affinity::Text => of != Affinity::Text && of != Affinity::Blob,
            Affinity::None | Affinity::Blob => false,
        }
    }

    /// `v` with this affinity applied, as SQLite converts a comparison's operand.
    pub fn apply(self, v: Value) -> Value {
        match (self, &v) {
            (Affinity::Numeric, Value::Text(s) | Value::Json(s)) => numeric_text(s).unwrap_or(v),
            (
                Affinity::Text,
                Value::Integer(_) | Value::Real(_) | Value::Boolean(_) | Value::Timestamp(_),
            ) => Value::Text(to_text(&v).unwrap_or_default().into()),
            _ => v,
        }
    }
}

/// The number `s` spells, if all of it (around optional spaces) is a well-formed integer
/// or real literal: SQLite's numeric affinity (`'10'`, `' 7'`, `'1e3'`, `'-2.5'`; not `''`,
/// `'12abc'`, `'0x10'` or `'inf'`).
pub fn numeric_text(s: &str) -> Option<Value> {
    let t = s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'));
    let b = t.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let mut mantissa = digits(&mut i);
    let mut integer = true;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        integer = false;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        integer = false;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return None;
        }
    }
    if i != b.len() {
        return None;
    }
    if integer {
        if let Ok(n) = t.parse::<i64>() {
            return Some(Value::Integer(n));
        }
    }
    let r: f64 = t.parse().ok()?;
    // SQLite keeps a real that is an exact integer as that integer.
    if r.fract() == 0.0 && (-9.2e18..=9.2e18).contains(&r) {
        return Some(Value::Integer(r as i64));
    }
    Some(Value::Real(r))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

/// A compiled expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// The value at this position of the input row.
    Column(usize),
    Literal(Value),
    /// The value at this position of the resolved parameter list.
    Param(usize),
    /// The value of the aggregate at this position (group context only).
    Agg(usize),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// The operand with an affinity applied: what a comparison compares (the planner puts
    /// it around an operand whose values the comparison's affinity may convert).
    Affinity(Affinity, Box<Expr>),
    IsNull {
        expr: Box<Expr>,
        negated: bool,
    },
    InList {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
    },
    /// `expr IN (SELECT …)`: `subquery` indexes the owning plan's uncorrelated subqueries.
    InSubquery {
        expr: Box<Expr>,
        subquery: usize,
        negated: bool,
    },
    Between {
        expr: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
    },
    Like {
        expr: Box<Expr>,
        pattern: Box<Expr>,
        negated: bool,
    },
}

/// The values of one uncorrelated `IN (SELECT …)` subquery.
#[derive(Clone, Debug, Default)]
pub struct SubqueryValues {
    pub values: BTreeSet<Value>,
    pub has_null: bool,
}

/// What an expression is evaluated against.
#[derive(Clone, Copy, Debug)]
pub struct Env<'a> {
    pub row: &'a [Value],
    pub params: &'a [Value],
    pub aggs: &'a [Value],
    pub subqueries: &'a [SubqueryValues],
}

impl Expr {
    pub fn eval(&self, env: &Env<'_>) -> Value {
        match self {
            Expr::Column(i) => env.row[*i].clone(),
            Expr::Literal(v) => v.clone(),
            Expr::Param(i) => env.params[*i].clone(),
            Expr::Agg(i) => env.aggs[*i].clone(),
            Expr::Unary(op, e) => {
                let v = e.eval(env);
                match op {
                    UnOp::Neg => negate(&v),
                    UnOp::Not => from_truth(truth(&v).map(|b| !b)),
                }
            }
            Expr::Binary(BinOp::And, a, b) => {
                let x = truth(&a.eval(env));
                if x == Some(false) {
                    return Value::Integer(0);
                }
                from_truth(and(x, truth(&b.eval(env))))
            }
            Expr::Binary(BinOp::Or, a, b) => {
                let x = truth(&a.eval(env));
                if x == Some(true) {
                    return Value::Integer(1);
                }
                from_truth(or(x, truth(&b.eval(env))))
            }
            Expr::Binary(op, a, b) => binary(*op, &a.eval(env), &b.eval(env)),
            Expr::Affinity(aff, e) => aff.apply(e.eval(env)),
            Expr::IsNull { expr, negated } => {
                Value::Integer((expr.eval(env).is_null() != *negated) as i64)
            }
            Expr::InList {
                expr,
                list,
                negated,
            } => {
                let v = expr.eval(env);
                let mut result = Some(false);
                if v.is_null() {
                    result = if list.is_empty() { Some(false) } else { None };
                } else {
                    for item in list {
                        let w = item.eval(env);
                        if w.is_null() {
                            result = None;
                        } else if compare(&v, &w) == Ordering::Equal {
                            result = Some(true);
                            break;
                        }
                    }
                }
                from_truth(negate_if(result, *negated))
            }
            Expr::InSubquery {
                expr,
                subquery,
                negated,
            } => {
                let sub = &env.subqueries[*subquery];
                let v = expr.eval(env);
                let result = if sub.values.is_empty() && !sub.has_null {
                    Some(false)
                } else if v.is_null() {
                    None
                } else if sub.values.contains(&v) {
                    Some(true)
                } else if sub.has_null {
                    None
                } else {
                    Some(false)
                };
                from_truth(negate_if(result, *negated))
            }
            Expr::Between {
                expr,
                low,
                high,
                negated,
            } => {
                let v = expr.eval(env);
                let ge = cmp_truth(&v, &low.eval(env), |o| o != Ordering::Less);
                let le = cmp_truth(&v, &high.eval(env), |o| o != Ordering::Greater);
                from_truth(negate_if(and(ge, le), *negated))
            }
            Expr::Like {
                expr,
                pattern,
                negated,
            } => {
                let (v, p) = (expr.eval(env), pattern.eval(env));
                let result = match (to_text(&v), to_text(&p)) {
                    (Some(v), Some(p)) => Some(like(p.as_bytes(), v.as_bytes())),
                    _ => None,
                };
                from_truth(negate_if(result, *negated))
            }
        }
    }

    /// Whether the expression (evaluated against `env`) is true, as `WHERE` decides.
    pub fn is_true(&self, env: &Env<'_>) -> bool {
        truth(&self.eval(env)) == Some(true)
    }

    /// Calls `f` on every column position this expression reads.
    /// Calls `f(expr, subquery)` for every `expr IN (SELECT …)` inside this expression.
    pub fn visit_in_subqueries(&self, f: &mut impl FnMut(&Expr, usize)) {
        match self {
            Expr::InSubquery { expr, subquery, .. } => {
                f(expr, *subquery);
                expr.visit_in_subqueries(f);
            }
            Expr::Column(_) | Expr::Literal(_) | Expr::Param(_) | Expr::Agg(_) => {}
            Expr::Unary(_, e) | Expr::Affinity(_, e) | Expr::IsNull { expr: e, .. } => {
                e.visit_in_subqueries(f)
            }
            Expr::Binary(_, a, b)
            | Expr::Like {
                expr: a,
                pattern: b,
                ..
            } => {
                a.visit_in_subqueries(f);
                b.visit_in_subqueries(f);
            }
            Expr::InList { expr, list, .. } => {
                expr.visit_in_subqueries(f);
                list.iter().for_each(|e| e.visit_in_subqueries(f));
            }
            Expr::Between {
                expr, low, high, ..
            } => {
                expr.visit_in_subqueries(f);
                low.visit_in_subqueries(f);
                high.visit_in_subqueries(f);
            }
        }
    }

    pub fn visit_columns(&self, f: &mut impl FnMut(usize)) {
        match self {
            Expr::Column(i) => f(*i),
            Expr::Literal(_) | Expr::Param(_) | Expr::Agg(_) => {}
            Expr::Unary(_, e) | Expr::Affinity(_, e) => e.visit_columns(f),
            Expr::Binary(_, a, b) => {
                a.visit_columns(f);
                b.visit_columns(f);
            }
            Expr::IsNull { expr, .. } | Expr::InSubquery { expr, .. } => expr.visit_columns(f),
            Expr::InList { expr, list, .. } => {
                expr.visit_columns(f);
                list.iter().for_each(|e| e.visit_columns(f));
            }
            Expr::Between {
                expr, low, high, ..
            } => {
                expr.visit_columns(f);
                low.visit_columns(f);
                high.visit_columns(f);
            }
            Expr::Like { expr, pattern, .. } => {
                expr.visit_columns(f);
                pattern.visit_columns(f);
            }
        }
    }
}

fn negate_if(v: Option<bool>, negated: bool) -> Option<bool> {
    if negated {
        v.map(|b| !b)
    } else {
        v
    }
}

fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

pub(crate) fn from_truth(b: Option<bool>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => Value::Integer(b as i64),
    }
}

/// SQLite truthiness: NULL is unknown; otherwise true iff the numeric value is non-zero.
pub fn truth(v: &Value) -> Option<bool> {
    match num(v)? {
        Num::Int(i) => Some(i != 0),
        Num::Real(r) => Some(r != 0.0),
    }
}

#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i64),
    Real(f64),
}

impl Num {
    fn f(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Real(r) => r,
        }
    }
}

/// A value as a number, SQLite style (text is converted by its longest numeric prefix).
fn num(v: &Value) -> Option<Num> {
    Some(match v {
        Value::Null => return None,
        Value::Integer(i) | Value::Timestamp(i) => Num::Int(*i),
        Value::Boolean(b) => Num::Int(*b as i64),
        Value::Real(r) => Num::Real(*r),
        Value::Text(s) | Value::Json(s) => text_to_num(s),
        Value::Blob(_) => Num::Int(0),
    })
}

fn text_to_num(s: &str) -> Num {
    let t = s.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Num::Int(i);
    }
    // The longest prefix that parses as a real number.
    let mut best = Num::Int(0);
    for end in (1..=t.len()).rev() {
        if !t.is_char_boundary(end) {
            continue;
        }
        let prefix = &t[..end];
        if let Ok(i) = prefix.parse::<i64>() {
            best = Num::Int(i);
            break;
        }
        if prefix
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
        {
            if let Ok(r) = prefix.parse::<f64>() {
                best = Num::Real(r);
                break;
            }
        }
    }
    best
}

fn real(r: f64) -> Value {
    if r.is_nan() {
        Value::Null
    } else {
        Value::Real(r)
    }
}

fn negate(v: &Value) -> Value {
    match num(v) {
        None => Value::Null,
        Some(Num::Int(i)) => match i.checked_neg() {
            Some(n) => Value::Integer(n),
            None => Value::Real(-(i as f64)),
        },
        Some(Num::Real(r)) => Value::Real(-r),
    }
}

/// Compares two non-NULL values as SQLite does for Sluice's types (the engine's order).
pub fn compare(a: &Value, b: &Value) -> Ordering {
    a.cmp(b)
}

fn cmp_truth(a: &Value, b: &Value, f: impl Fn(Ordering) -> bool) -> Option<bool> {
    if a.is_null() || b.is_null() {
        None
    } else {
        Some(f(compare(a, b)))
    }
}

/// Evaluates a binary operator other than AND / OR.
pub fn binary(op: BinOp, a: &Value, b: &Value) -> Value {
    match op {
        BinOp::Eq => from_truth(cmp_truth(a, b, |o| o == Ordering::Equal)),
        BinOp::NotEq => from_truth(cmp_truth(a, b, |o| o != Ordering::Equal)),
        BinOp::Lt => from_truth(cmp_truth(a, b, |o| o == Ordering::Less)),
        BinOp::LtEq => from_truth(cmp_truth(a, b, |o| o != Ordering::Greater)),
        BinOp::Gt => from_truth(cmp_truth(a, b, |o| o == Ordering::Greater)),
        BinOp::GtEq => from_truth(cmp_truth(a, b, |o| o != Ordering::Less)),
        BinOp::Is | BinOp::IsNot => {
            let same = match (a.is_null(), b.is_null()) {
                (true, true) => true,
                (false, false) => compare(a, b) == Ordering::Equal,
                _ => false,
            };
            Value::Integer((same == (op == BinOp::Is)) as i64)
        }
        BinOp::And => from_truth(and(truth(a), truth(b))),
        BinOp::Or => from_truth(or(truth(a), truth(b))),
        BinOp::Concat => match (to_text(a), to_text(b)) {
            (Some(x), Some(y)) => Value::Text(format!("{x}{y}").into()),
            _ => Value::Null,
        },
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod => {
            let (Some(x), Some(y)) = (num(a), num(b)) else {
                return Value::Null;
            };
            arith(op, x, y)
        }
    }
}

fn arith(op: BinOp, x: Num, y: Num) -> Value {
    if op == BinOp::Mod {
        // SQLite: both operands as integers; the result is REAL if either operand was.
        let is_real = matches!(x, Num::Real(_)) || matches!(y, Num::Real(_));
        let to_i = |n: Num| match n {
            Num::Int(i) => i,
            Num::Real(r) => r as i64,
        };
        let (a, mut b) = (to_i(x), to_i(y));
        if b == 0 {
            return Value::Null;
        }
        if b == -1 {
            b = 1;
        }
        let r = a % b;
        return if is_real {
            Value::Real(r as f64)
        } else {
            Value::Integer(r)
        };
    }
    if let (Num::Int(a), Num::Int(b)) = (x, y) {
        let r = match op {
            BinOp::Add => a.checked_add(b),
            BinOp::Sub => a.checked_sub(b),
            BinOp::Mul => a.checked_mul(b),
            _ => {
                if b == 0 {
                    return Value::Null;
                }
                a.checked_div(b)
            }
        };
        if let Some(r) = r {
            return Value::Integer(r);
        }
    }
    let (a, b) = (x.f(), y.f());
    match op {
        BinOp::Add => real(a + b),
        BinOp::Sub => real(a - b),
        BinOp::Mul => real(a * b),
        _ => {
            if b == 0.0 {
                Value::Null
            } else {
                real(a / b)
            }
        }
    }
}

/// A value as text, as `||` and `LIKE` see it; `None` for NULL.
pub fn to_text(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Integer(i) | Value::Timestamp(i) => i.to_string(),
        Value::Boolean(b) => (*b as i64).to_string(),
        Value::Real(r) => real_to_text(*r),
        Value::Text(s) | Value::Json(s) => s.to_string(),
        Value::Blob(b) => String::from_utf8_lossy(b).into_owned(),
    })
}

/// SQLite renders a REAL with 15 significant digits, always with a `.` or an exponent.
fn real_to_text(r: f64) -> String {
    if r.is_infinite() {
        return if r > 0.0 { "Inf".into() } else { "-Inf".into() };
    }
    if r == r.trunc() && r.abs() < 1e15 {
        return format!("{r:.1}");
    }
    let s = format!("{r:.14e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-5..15).contains(&exp) {
        let text = format!("{:.*}", (14 - exp).max(0) as usize, r);
        let text = text.trim_end_matches('0');
        if text.ends_with('.') {
            format!("{text}0")
        } else {
            text.to_string()
        }
    } else {
        let m = mantissa.trim_end_matches('0').trim_end_matches('.');
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// SQLite `LIKE`: `%` any run, `_` one character, ASCII letters match case-insensitively.
pub fn like(pattern: &[u8], text: &[u8]) -> bool {
    let p: Vec<char> = String::from_utf8_lossy(pattern).chars().collect();
    let t: Vec<char> = String::from_utf8_lossy(text).chars().collect();
    // Iterative matcher with backtracking to the last `%`.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '%' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '_' || p[pi].eq_ignore_ascii_case(&t[ti])) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '%' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_follows_sqlite() {
        assert!(like(b"a%", b"ABC"));
        assert!(like(b"%b_", b"abc"));
        assert!(!like(b"%b_", b"ab"));
        assert!(like(b"%", b""));
        assert!(like(b"a%c%e", b"abcde"));
        assert!(!like(b"a%c%f", b"abcde"));
    }

    #[test]
    fn numeric_affinity_converts_only_well_formed_numbers() {
        use Value::*;
        let n = |s: &str| numeric_text(s);
        assert_eq!(n("3"), Some(Integer(3)));
        assert_eq!(n(" 7 "), Some(Integer(7)));
        assert_eq!(n("+4"), Some(Integer(4)));
        assert_eq!(n("007"), Some(Integer(7)));
        assert_eq!(n("-2.5"), Some(Real(-2.5)));
        assert_eq!(n("1e3"), Some(Integer(1000)));
        assert_eq!(n(".5"), Some(Real(0.5)));
        assert_eq!(n("5."), Some(Integer(5)));
        assert_eq!(n("99999999999999999999"), Some(Real(1e20)));
        for bad in [
            "", " ", "abc", "12abc", "0x10", "inf", "NaN", "1e", "e5", ".", "-", "1 2",
        ] {
            assert_eq!(n(bad), None, "{bad:?}");
        }
        assert_eq!(Affinity::Text.apply(Integer(5)), Text("5".into()));
        assert_eq!(Affinity::Text.apply(Real(2.0)), Text("2.0".into()));
        assert_eq!(Affinity::Numeric.apply(Text("x".into())), Text("x".into()));
        assert_eq!(
            Affinity::comparison(Affinity::Text, Affinity::Numeric),
            Affinity::Numeric
        );
        assert_eq!(
            Affinity::comparison(Affinity::Text, Affinity::Blob),
            Affinity::Blob
        );
        assert_eq!(
            Affinity::comparison(Affinity::None, Affinity::Text),
            Affinity::Text
        );
    }

    #[test]
    fn arithmetic_follows_sqlite() {
        use Value::*;
        assert_eq!(binary(BinOp::Div, &Integer(7), &Integer(2)), Integer(3));
        assert_eq!(binary(BinOp::Div, &Integer(-7), &Integer(2)), Integer(-3));
        assert!(binary(BinOp::Div, &Integer(7), &Integer(0)).is_null());
        assert!(binary(BinOp::Div, &Real(7.0), &Integer(0)).is_null());
        assert!(binary(BinOp::Mod, &Integer(7), &Integer(0)).is_null());
        assert_eq!(binary(BinOp::Mod, &Integer(-7), &Integer(3)), Integer(-1));
        assert_eq!(binary(BinOp::Add, &Boolean(true), &Integer(1)), Integer(2));
        assert_eq!(binary(BinOp::Eq, &Boolean(true), &Integer(1)), Integer(1));
        assert!(binary(BinOp::Eq, &Null, &Integer(1)).is_null());
        assert_eq!(
            binary(BinOp::Concat, &Text("a".into()), &Integer(1)),
            Text("a1".into())
        );
        assert_eq!(real_to_text(2.0), "2.0");
        assert_eq!(real_to_text(0.5), "0.5");
    }
}
