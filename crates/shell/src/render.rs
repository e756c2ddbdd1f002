//! Aligned tables in the style of psql, and one-line renderings of rows and records.
//!
//! ```text
//!  id | body
//! ----+------
//!   1 | hi
//!   2 | NULL
//! (2 rows)
//! ```
//!
//! Numbers are right-aligned, everything else left-aligned; `timestamp` columns show as UTC
//! times. NULL is the bare word `NULL`
//! (dimmed on a colour terminal, so it stands apart from the text `'NULL'`). A value is
//! shown on one line: control characters are escaped (`\n`, `\t`, `\u{1b}`), JSON objects
//! and arrays are compact JSON. When a width is given (the terminal's), the widest columns
//! are cut, with `…`, until a line fits.

use serde_json::Value;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// How tables are drawn.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    /// The terminal's width; lines are cut to it. `None` (output is not a terminal): no cut.
    pub width: Option<usize>,
    /// Whether to dim NULL with an ANSI escape (only when output is a terminal).
    pub color: bool,
}

/// The narrowest a cut column gets (one character and the `…`).
const COLUMN_WIDTH_MIN: usize = 2;

/// A cell: its text and whether it is NULL (drawn dimmed) and numeric (right-aligned).
struct Cell {
    text: String,
    null: bool,
    numeric: bool,
}

fn cell(value: &Value) -> Cell {
    Cell {
        text: value_text(value),
        null: value.is_null(),
        numeric: value.is_number(),
    }
}

/// One value as shown in a cell (NULL as `NULL`).
pub fn value_text(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_string(),
        Value::String(s) => escape(s),
        Value::Object(_) | Value::Array(_) => escape(&value.to_string()),
        other => other.to_string(),
    }
}

/// Replaces, in each row, the integer values of the columns whose type is `timestamp` (µs
/// since the epoch) with their UTC time as text (`2026-11-24 01:59:48.776193`), as psql
/// shows timestamps. `types` is the reply's `types` (one per column, `null` when unknown).
pub fn format_timestamps(columns: &[String], types: &[Value], rows: &mut [Value]) {
    let stamped: Vec<&String> = columns
        .iter()
        .zip(types)
        .filter(|(_, t)| t.as_str() == Some("timestamp"))
        .map(|(c, _)| c)
        .collect();
    if stamped.is_empty() {
        return;
    }
    for row in rows {
        if let Value::Object(map) = row {
            for column in &stamped {
                if let Some(v) = map.get_mut(column.as_str()) {
                    if let Some(us) = v.as_i64() {
                        *v = Value::String(timestamp_text(us));
                    }
                }
            }
        }
    }
}

/// µs since 1970-01-01 UTC as `YYYY-MM-DD HH:MM:SS[.ffffff]`.
pub fn timestamp_text(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    // Days to a civil date (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    );
    if micros != 0 {
        text.push_str(&format!(".{micros:06}"));
    }
    text
}

/// Control characters as escapes, so that a value stays on its line.
fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The cells of `row` in the order of `columns` (a row is an object keyed by column name;
/// an array row is taken as it is).
pub fn row_values<'a>(columns: &[String], row: &'a Value) -> Vec<&'a Value> {
    static NULL: Value = Value::Null;
    match row {
        Value::Object(map) => columns
            .iter()
            .map(|c| map.get(c).unwrap_or(&NULL))
            .collect(),
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    }
}

/// A row on one line: its cells joined by ` | ` (for live diffs).
pub fn row_line(columns: &[String], row: &Value, style: Style) -> String {
    row_values(columns, row)
        .into_iter()
        .map(|v| {
            let c = cell(v);
            paint(&c.text, c.null, style)
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// An aligned table of `rows` under `columns`, with a `(N rows)` footer (its text after
/// the count given by `footer_extra`, e.g. `", seq 12"`), ending in a newline.
pub fn table(columns: &[String], rows: &[Value], style: Style, footer_extra: &str) -> String {
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|row| row_values(columns, row).into_iter().map(cell).collect())
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.width()).collect();
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.text.width());
            }
        }
    }
    if let Some(width_max) = style.width {
        fit(&mut widths, width_max);
    }
    let mut out = String::new();
    if !columns.is_empty() {
        let header: Vec<String> = columns
            .iter()
            .zip(&widths)
            .map(|(name, &w)| center(&cut(name, w), w))
            .collect();
        push_line(&mut out, &header);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w + 2)).collect();
        out.push_str(&rule.join("+"));
        out.push('\n');
        for row in &cells {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, &w)| {
                    let text = cut(&c.text, w);
                    let pad = " ".repeat(w - text.width());
                    let text = paint(&text, c.null, style);
                    if c.numeric {
                        format!("{pad}{text}")
                    } else {
                        format!("{text}{pad}")
                    }
                })
                .collect();
            push_line(&mut out, &line);
        }
    }
    let n = rows.len();
    let noun = if n == 1 { "row" } else { "rows" };
    out.push_str(&format!("({n} {noun}{footer_extra})\n"));
    out
}

/// ` a | b ` without trailing blanks.
fn push_line(out: &mut String, cells: &[String]) {
    let line = format!(" {} ", cells.join(" | "));
    out.push_str(line.trim_end());
    out.push('\n');
}

/// Narrows the widest columns until a line (` a | b `) is at most `width_max` wide.
fn fit(widths: &mut [usize], width_max: usize) {
    let line_width = |widths: &[usize]| widths.iter().sum::<usize>() + 3 * widths.len();
    while line_width(widths) > width_max {
        let Some((i, &w)) = widths.iter().enumerate().max_by_key(|(_, w)| **w) else {
            return;
        };
        if w <= COLUMN_WIDTH_MIN {
            return;
        }
        widths[i] = w - 1;
    }
}

/// A line cut to the terminal's width (when there is one), ending in `…` when cut.
pub fn fit_line(text: &str, style: Style) -> String {
    match style.width {
        Some(width) => cut(text, width.max(COLUMN_WIDTH_MIN)),
        None => text.to_string(),
    }
}

/// `text` cut to `width` display columns, ending in `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

fn center(text: &str, width: usize) -> String {
    let free = width.saturating_sub(text.width());
    let left = free / 2;
    format!("{}{}{}", " ".repeat(left), text, " ".repeat(free - left))
}

fn paint(text: &str, null: bool, style: Style) -> String {
    if null && style.color {
        format!("\x1b[2m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cols(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_table_is_aligned_with_a_footer() {
        let rows = vec![
            json!({"id": 1, "body": "hi"}),
            json!({"id": 22, "body": null}),
        ];
        let out = table(&cols(&["id", "body"]), &rows, Style::default(), "");
        assert_eq!(
            out,
            " id | body\n----+------\n  1 | hi\n 22 | NULL\n(2 rows)\n"
        );
    }

    #[test]
    fn long_values_are_cut_to_the_width() {
        let rows = vec![json!({"id": 1, "body": "x".repeat(100)})];
        let out = table(
            &cols(&["id", "body"]),
            &rows,
            Style {
                width: Some(30),
                color: false,
            },
            "",
        );
        for line in out.lines() {
            assert!(line.width() <= 30, "{line:?} is wider than 30");
        }
        assert!(out.contains('…'));
    }

    #[test]
    fn timestamps_show_as_utc_times() {
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00");
        assert_eq!(timestamp_text(1_732_400_000_000_000), "2024-11-23 22:13:20");
        assert_eq!(
            timestamp_text(951_782_400_000_001),
            "2000-02-29 00:00:00.000001"
        );
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999999");
        let mut rows = vec![json!({"ts": 0, "n": 0})];
        format_timestamps(
            &cols(&["ts", "n"]),
            &[json!("timestamp"), json!(null)],
            &mut rows,
        );
        assert_eq!(rows[0], json!({"ts": "1970-01-01 00:00:00", "n": 0}));
    }

    #[test]
    fn values_stay_on_one_line() {
        assert_eq!(value_text(&json!("a\nb")), "a\\nb");
        assert_eq!(value_text(&json!({"k": [1, 2]})), "{\"k\":[1,2]}");
        let out = table(
            &cols(&["n"]),
            &[json!({"n": 1})],
            Style::default(),
            ", seq 3",
        );
        assert!(out.ends_with("(1 row, seq 3)\n"));
    }
}
