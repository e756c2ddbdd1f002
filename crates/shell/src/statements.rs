//! Splitting input into statements: a statement ends at a `;` outside quotes and comments.
//!
//! The shell feeds it everything typed since the last complete statement; what follows the
//! last `;` stays in the buffer (a multi-line statement in progress). Quotes are SQL's:
//! `'…'` strings and `"…"` identifiers, each with its quote doubled inside; `--` comments
//! run to the end of the line, `/* … */` comments may span lines.

/// The statements completed by `buffer` (each without its `;`, trimmed, never empty) and
/// the text after the last of them.
pub fn split(buffer: &str) -> (Vec<String>, String) {
    let mut statements = Vec::new();
    let mut start = 0;
    let mut state = State::Code;
    let bytes = buffer.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let next = bytes.get(i + 1).copied();
        match state {
            State::Code => match b {
                b'\'' => state = State::Single,
                b'"' => state = State::Double,
                b'-' if next == Some(b'-') => {
                    state = State::LineComment;
                    i += 1;
                }
                b'/' if next == Some(b'*') => {
                    state = State::BlockComment;
                    i += 1;
                }
                b';' => {
                    let text = &buffer[start..i];
                    if has_code(text) {
                        statements.push(text.trim().to_string());
                    }
                    start = i + 1;
                }
                _ => {}
            },
            // A doubled quote inside reads as: leave, then enter again.
            State::Single if b == b'\'' => state = State::Code,
            State::Double if b == b'"' => state = State::Code,
            State::LineComment if b == b'\n' => state = State::Code,
            State::BlockComment if b == b'*' && next == Some(b'/') => {
                state = State::Code;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    (statements, buffer[start..].to_string())
}

/// Whether `text` holds anything but white space and comments (a statement to send).
pub fn has_code(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
            }
            b if b.is_ascii_whitespace() => i += 1,
            _ => return true,
        }
    }
    false
}

/// The statement's leading keywords, upper-cased (`"INSERT"`, `"CREATE TABLE"`): the tag
/// the shell prints for a statement that returns no rows, as psql does.
pub fn command_tag(statement: &str) -> String {
    let words: Vec<String> = statement
        .split_whitespace()
        .take(2)
        .map(|w| w.trim_end_matches('(').to_ascii_uppercase())
        .collect();
    match words.first().map(String::as_str) {
        Some("CREATE" | "DROP" | "ALTER") => match words.get(1).map(String::as_str) {
            Some(second @ ("TABLE" | "INDEX" | "POLICY" | "UNIQUE")) => {
                format!("{} {second}", words[0])
            }
            _ => words[0].clone(),
        },
        Some(first) => first.to_string(),
        None => String::new(),
    }
}

/// Whether the statement is a `SELECT` (or `WITH … SELECT`): one that returns rows.
pub fn is_select(statement: &str) -> bool {
    let first = statement
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or("");
    first.eq_ignore_ascii_case("select") || first.eq_ignore_ascii_case("with")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Code,
    Single,
    Double,
    LineComment,
    BlockComment,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_ends_at_a_semicolon_outside_quotes_and_comments() {
        let (done, rest) = split("SELECT 'a;b', \"c;\" -- x;y\n FROM t; SELECT /* ; */ 2");
        assert_eq!(done, vec!["SELECT 'a;b', \"c;\" -- x;y\n FROM t"]);
        assert_eq!(rest, " SELECT /* ; */ 2");
    }

    #[test]
    fn doubled_quotes_stay_inside_the_string() {
        let (done, rest) = split("SELECT 'it''s; fine';");
        assert_eq!(done, vec!["SELECT 'it''s; fine'"]);
        assert_eq!(rest, "");
    }

    #[test]
    fn an_open_quote_keeps_the_statement_incomplete() {
        let (done, rest) = split("INSERT INTO t VALUES ('a;\nb');x");
        assert_eq!(done, vec!["INSERT INTO t VALUES ('a;\nb')"]);
        assert_eq!(rest, "x");
        let (done, _) = split("SELECT 'open;");
        assert!(done.is_empty());
    }

    #[test]
    fn empty_statements_and_bare_comments_are_skipped() {
        let (done, rest) = split(";; -- nothing;\n /* here */ ;");
        assert!(done.is_empty(), "{done:?}");
        assert!(!has_code(&rest));
    }

    #[test]
    fn tags_name_the_command() {
        assert_eq!(command_tag("create table t (id integer)"), "CREATE TABLE");
        assert_eq!(command_tag("DROP POLICY p ON t"), "DROP POLICY");
        assert_eq!(command_tag("insert into t values (1)"), "INSERT");
        assert!(is_select("  select 1"));
        assert!(is_select("(SELECT 1)"));
        assert!(!is_select("selector"));
    }
}
