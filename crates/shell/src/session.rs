//! Running one statement or meta-command against the server and printing what it returns.

use std::io::{IsTerminal, Write};

use serde_json::{json, Value};

use crate::client::{Client, Error};
use crate::render::{self, Style};
use crate::statements;

/// The help printed by `\?`.
pub const HELP: &str = "\
SQL (ends at `;`; several lines are one statement until then; sent to POST /v1/sql):
  SELECT … | INSERT … | UPDATE … | DELETE … | CREATE/DROP/ALTER …
  Each statement is its own transaction. Between BEGIN and COMMIT, statements are kept
  and sent at COMMIT as one transaction (all or nothing; their results print then);
  ROLLBACK drops them. DDL and data statements cannot share a transaction.
Meta-commands (one line, no `;` needed):
  \\d                   list tables
  \\d TABLE             columns, types, primary key, indexes and policies of TABLE
  \\live SELECT …       the result, then every change to it as it happens (Ctrl-C stops)
  \\topics              list topics
  \\watch TOPIC [TAG…]  records appended to TOPIC, only those matching a TAG when given
                       (`room:*` matches a prefix); Ctrl-C stops
  \\?                   this help
  \\q                   quit (also Ctrl-D)
";

/// What a meta-command asks of the loop around it.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Quit,
}

/// One connection's state: the client, how output is drawn, and what the server supports.
pub struct Session {
    pub client: Client,
    pub style: Style,
    /// Whether Ctrl-C should cancel a request (interactive use) rather than end the
    /// process. Streams (`\live`, `\watch`) always end on Ctrl-C.
    pub interactive: bool,
    /// `None` until known: whether `POST /v1/sql` runs `SELECT`s (servers before SQL writes
    /// ran only DDL there; the shell then sends a `SELECT` to `/v1/query`).
    sql_selects: Option<bool>,
}

impl Session {
    pub fn new(client: Client, style: Style, interactive: bool) -> Session {
        Session {
            client,
            style,
            interactive,
            sql_selects: None,
        }
    }

    /// Runs `fut` until it ends or, in interactive use, until Ctrl-C.
    async fn cancellable<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        if !self.interactive {
            return fut.await;
        }
        tokio::select! {
            r = fut => r,
            _ = tokio::signal::ctrl_c() => Err(Error::Cancelled),
        }
    }

    /// Runs one SQL statement and prints its result.
    pub async fn statement(&mut self, sql: &str) -> Result<(), Error> {
        let reply = self
            .cancellable(self.client.post("/v1/sql", &json!({ "sql": sql })))
            .await;
        let reply = match reply {
            Err(Error::Api { ref code, .. })
                if statements::is_select(sql)
                    && self.sql_selects != Some(true)
                    && (code == "unsupported" || code == "bad_request" || code == "forbidden") =>
            {
                // A server without SELECT in /v1/sql: the same statement through /v1/query.
                match self
                    .cancellable(self.client.post("/v1/query", &json!({ "sql": sql })))
                    .await
                {
                    Ok(result) => {
                        self.sql_selects = Some(false);
                        print(&self.select(&result, ""));
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            other => other?,
        };
        self.print_reply(&[sql], &reply);
        Ok(())
    }

    /// Runs `statements` as one request: one transaction, all or nothing (`BEGIN` …
    /// `COMMIT` in the shell). An error's `statement` is the index in `statements`.
    pub async fn transaction(&mut self, statements: &[&str]) -> Result<(), Error> {
        let sql = statements.join(";\n");
        let reply = self
            .cancellable(self.client.post("/v1/sql", &json!({ "sql": sql })))
            .await?;
        self.print_reply(statements, &reply);
        Ok(())
    }

    /// Prints a `/v1/sql` reply; `statements` are the request's, for the command tags.
    fn print_reply(&mut self, statements: &[&str], reply: &Value) {
        let seq = reply.get("seq").and_then(Value::as_u64);
        let mut out = String::new();
        match reply.get("results").and_then(Value::as_array) {
            Some(results) => {
                for (i, result) in results.iter().enumerate() {
                    let index = result
                        .get("statement")
                        .and_then(Value::as_u64)
                        .map_or(i, |n| n as usize);
                    let sql = statements.get(index).copied().unwrap_or("");
                    out.push_str(&self.result(sql, result, seq));
                }
            }
            // Servers before SQL writes: `{"seq", "changed"}` for DDL.
            None => out.push_str(&ddl_line(statements.join("; ").as_str(), reply, seq)),
        }
        print(&out);
    }

    /// One entry of a `/v1/sql` reply.
    fn result(&mut self, sql: &str, result: &Value, seq: Option<u64>) -> String {
        let seq_text = seq.map(|s| format!(" (seq {s})")).unwrap_or_default();
        match result.get("kind").and_then(Value::as_str) {
            Some("select") => {
                self.sql_selects = Some(true);
                self.select(result, "")
            }
            Some(kind @ ("insert" | "update" | "delete")) => {
                let count = result.get("count").and_then(Value::as_u64).unwrap_or(0);
                format!("{} {count}{seq_text}\n", kind.to_ascii_uppercase())
            }
            Some("ddl") => ddl_line(sql, result, seq),
            _ => format!("{result}\n"),
        }
    }

    /// A `SELECT`'s columns and rows as a table.
    fn select(&self, result: &Value, footer_extra: &str) -> String {
        let columns = strings(result.get("columns"));
        let mut rows = result
            .get("rows")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let types = result
            .get("types")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        render::format_timestamps(&columns, &types, &mut rows);
        render::table(&columns, &rows, self.style, footer_extra)
    }

    /// Runs a meta-command (a line starting with `\`).
    pub async fn meta(&mut self, line: &str) -> Result<Flow, Error> {
        let line = line.trim();
        let (command, rest) = match line.find(char::is_whitespace) {
            Some(i) => (&line[..i], line[i..].trim()),
            None => (line, ""),
        };
        match command {
            "\\q" | "\\quit" => return Ok(Flow::Quit),
            "\\?" | "\\h" | "\\help" => print(HELP),
            "\\d" if rest.is_empty() => self.tables().await?,
            "\\d" => self.describe(rest.trim_end_matches(';').trim()).await?,
            "\\live" => self.live(rest.trim_end_matches(';').trim()).await?,
            "\\topics" => self.topics().await?,
            "\\watch" => {
                let mut words = rest.split_whitespace();
                let Some(topic) = words.next() else {
                    return Err(Error::api("bad_request", "usage: \\watch TOPIC [TAG…]"));
                };
                let tags: Vec<&str> = words.collect();
                self.watch(topic, &tags).await?;
            }
            other => {
                return Err(Error::api(
                    "bad_request",
                    format!("unknown meta-command {other}; \\? lists them"),
                ))
            }
        }
        Ok(Flow::Continue)
    }

    /// `\d`: every table.
    async fn tables(&self) -> Result<(), Error> {
        let reply = self.cancellable(self.client.get("/v1/tables")).await?;
        let tables = reply
            .get("tables")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let rows: Vec<Value> = tables
            .iter()
            .map(|t| {
                let indexes: Vec<String> = t["indexes"]
                    .as_array()
                    .map(|ixs| {
                        ixs.iter()
                            .filter_map(|ix| ix["name"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "name": t["name"],
                    "columns": t["columns"].as_array().map(Vec::len).unwrap_or(0),
                    "primary key": t["primary_key"],
                    "indexes": indexes.join(", "),
                })
            })
            .collect();
        let columns = strings(Some(&json!(["name", "columns", "primary key", "indexes"])));
        print("List of tables\n");
        print(&render::table(&columns, &rows, self.style, ""));
        Ok(())
    }

    /// `\d TABLE`: its columns, key, indexes and policies.
    async fn describe(&self, name: &str) -> Result<(), Error> {
        let reply = self.cancellable(self.client.get("/v1/tables")).await?;
        let wanted = unquote(name);
        let table = reply
            .get("tables")
            .and_then(Value::as_array)
            .and_then(|ts| {
                ts.iter()
                    .find(|t| t["name"].as_str() == Some(wanted.as_str()))
            })
            .cloned()
            .ok_or_else(|| Error::api("not_found", format!("no table named {wanted:?}")))?;
        let rows: Vec<Value> = table["columns"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let mut notes = Vec::new();
                        if c["primary_key"].as_bool() == Some(true) {
                            notes.push("primary key");
                        }
                        json!({
                            "column": c["name"],
                            "type": c["type"],
                            "nullable": if c["not_null"].as_bool() == Some(true) || c["primary_key"].as_bool() == Some(true) { "not null" } else { "" },
                            "default": match &c["default"] { Value::Null => Value::String(String::new()), d => Value::String(render::value_text(d)) },
                            "key": notes.join(", "),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let columns = strings(Some(&json!([
            "column", "type", "nullable", "default", "key"
        ])));
        let mut out = format!("Table \"{wanted}\"\n");
        out.push_str(&render::table(&columns, &rows, self.style, ""));
        out.push_str(&format!(
            "Primary key: {}\n",
            table["primary_key"].as_str().unwrap_or("?")
        ));
        if let Some(indexes) = table["indexes"].as_array().filter(|ixs| !ixs.is_empty()) {
            out.push_str("Indexes:\n");
            for ix in indexes {
                out.push_str(&format!(
                    "    \"{}\" ({})\n",
                    ix["name"].as_str().unwrap_or("?"),
                    strings(ix.get("columns")).join(", ")
                ));
            }
        }
        match self.cancellable(self.client.get("/v1/policies")).await {
            Ok(reply) => {
                let policies: Vec<&Value> = reply
                    .get("policies")
                    .and_then(Value::as_array)
                    .map(|ps| {
                        ps.iter()
                            .filter(|p| p["table"].as_str() == Some(wanted.as_str()))
                            .collect()
                    })
                    .unwrap_or_default();
                if policies.is_empty() {
                    out.push_str("Policies: none\n");
                } else {
                    out.push_str("Policies:\n");
                    for p in policies {
                        let mut line = format!(
                            "    \"{}\" FOR {}",
                            p["name"].as_str().unwrap_or("?"),
                            p["command"].as_str().unwrap_or("all").to_ascii_uppercase()
                        );
                        if let Some(using) = p["using"].as_str() {
                            line.push_str(&format!(" USING ({using})"));
                        }
                        if let Some(check) = p["check"].as_str() {
                            line.push_str(&format!(" WITH CHECK ({check})"));
                        }
                        out.push_str(&line);
                        out.push('\n');
                    }
                }
            }
            Err(Error::Api { ref code, .. }) if code == "forbidden" => {
                out.push_str("Policies: (only the admin token may list them)\n");
            }
            Err(e) => return Err(e),
        }
        print(&out);
        Ok(())
    }

    /// `\topics`: every topic.
    async fn topics(&self) -> Result<(), Error> {
        let reply = self.cancellable(self.client.get("/v1/topics")).await?;
        let topics = reply
            .get("topics")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let columns = strings(Some(&json!([
            "name",
            "records",
            "bytes",
            "first",
            "last",
            "next",
            "retain_records",
            "retain_bytes",
            "retain_secs"
        ])));
        print("List of topics\n");
        print(&render::table(&columns, &topics, self.style, ""));
        Ok(())
    }

    /// `\live SELECT …`: the snapshot, then every diff, until Ctrl-C or the server ends it.
    async fn live(&self, sql: &str) -> Result<(), Error> {
        if sql.is_empty() {
            return Err(Error::api("bad_request", "usage: \\live SELECT …"));
        }
        let url = self.client.url("/v1/live", &[("sql", sql)])?;
        let stream =
            async {
                let mut events = self.client.events(url).await?;
                let mut columns: Vec<String> = Vec::new();
                let mut types: Vec<Value> = Vec::new();
                let mut chunks = SnapshotChunks::default();
                while let Some(event) = events.next().await? {
                    let data: Value = serde_json::from_str(&event.data)
                        .map_err(|e| Error::Protocol(format!("bad {} event: {e}", event.event)))?;
                    match event.event.as_str() {
                        "snapshot" => {
                            // A large snapshot comes in chunks: show it once it is whole.
                            let Some(data) = chunks.add(data) else {
                                continue;
                            };
                            columns = strings(data.get("columns"));
                            types = data["types"].as_array().cloned().unwrap_or_default();
                            let seq = data["seq"].as_u64().unwrap_or(0);
                            let reset = if data["reset"].as_bool() == Some(true) {
                                " (reset)"
                            } else {
                                ""
                            };
                            print(&self.select(
                                &data,
                                &format!(", seq {seq}{reset}; live, Ctrl-C to stop"),
                            ));
                        }
                        "diff" => {
                            let seq = data["seq"].as_u64().unwrap_or(0);
                            let mut out = String::new();
                            // Plain (no dimmed NULL) so that a line can be cut to the width.
                            let plain = Style {
                                color: false,
                                ..self.style
                            };
                            for change in data["changes"].as_array().into_iter().flatten() {
                                let mut row = [change["row"].clone()];
                                render::format_timestamps(&columns, &types, &mut row);
                                let line = match change["op"].as_str() {
                                    Some("add") => {
                                        format!("+ {}", render::row_line(&columns, &row[0], plain))
                                    }
                                    Some("change") => {
                                        format!("~ {}", render::row_line(&columns, &row[0], plain))
                                    }
                                    Some("remove") => {
                                        format!("- key {}", render::value_text(&change["key"]))
                                    }
                                    _ => format!("? {change}"),
                                };
                                let line = format!("seq {seq}  {line}");
                                out.push_str(&render::fit_line(&line, plain));
                                out.push('\n');
                            }
                            print(&out);
                        }
                        "error" => return Err(event_error(&data)),
                        _ => {}
                    }
                }
                Err(Error::Transport("the server ended the live query".into()))
            };
        until_ctrl_c(stream).await
    }

    /// `\watch TOPIC [TAG…]`: records as they are appended, until Ctrl-C.
    async fn watch(&self, topic: &str, tags: &[&str]) -> Result<(), Error> {
        let params: Vec<(&str, &str)> = tags.iter().map(|t| ("tag", *t)).collect();
        let path = format!("/v1/topics/{}/watch", path_segment(topic));
        let url = self.client.url(&path, &params)?;
        let stream = async {
            let mut events = self.client.events(url).await?;
            while let Some(event) = events.next().await? {
                let data: Value = serde_json::from_str(&event.data)
                    .map_err(|e| Error::Protocol(format!("bad {} event: {e}", event.event)))?;
                match event.event.as_str() {
                    "watching" => print(&format!(
                        "watching {} from offset {}{}; Ctrl-C to stop\n",
                        data["topic"].as_str().unwrap_or(topic),
                        data["next"],
                        if tags.is_empty() {
                            String::new()
                        } else {
                            format!(", tags {}", tags.join(" "))
                        }
                    )),
                    "record" => print(&format!(
                        "{}  [{}]  {}\n",
                        data["offset"],
                        strings(data.get("tags")).join(" "),
                        render::value_text(&data["data"])
                    )),
                    "error" => return Err(event_error(&data)),
                    _ => {}
                }
            }
            Err(Error::Transport("the server ended the watch".into()))
        };
        until_ctrl_c(stream).await
    }
}

/// Runs a stream until it fails or Ctrl-C (which is its normal end: `Ok`).
async fn until_ctrl_c(
    stream: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    tokio::select! {
        r = stream => r,
        _ = tokio::signal::ctrl_c() => {
            // On a terminal the `^C` echo ends the line's text, not the line.
            let newline = if std::io::stdout().is_terminal() { "\n" } else { "" };
            print(&format!("{newline}(stopped)\n"));
            Ok(())
        }
    }
}

/// The `error` event of a stream as an error.
fn event_error(data: &Value) -> Error {
    let e = &data["error"];
    Error::Api {
        status: 0,
        code: e["code"].as_str().unwrap_or("unknown").to_string(),
        message: e["message"].as_str().unwrap_or("").to_string(),
        statement: None,
        reason: None,
    }
}

/// The line printed for a DDL statement: its tag and seq.
fn ddl_line(sql: &str, reply: &Value, seq: Option<u64>) -> String {
    let tag = statements::command_tag(sql);
    let changed = reply.get("changed").and_then(Value::as_bool) != Some(false);
    match (changed, seq) {
        (true, Some(seq)) => format!("{tag} (seq {seq})\n"),
        (true, None) => format!("{tag}\n"),
        (false, _) => format!("{tag} (nothing changed)\n"),
    }
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A table name as typed: `"Quoted"` keeps its case, a bare name folds to lower case.
fn unquote(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => name.to_lowercase(),
    }
}

/// A topic name in a URL path (names are `A-Z a-z 0-9 _ - .`; anything else is escaped
/// so that the server, not the URL, refuses it).
fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Prints to stdout and flushes (streams print event by event).
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The chunks of a large snapshot (docs/protocol.md, "Large snapshots"): every chunk but
/// the last has `"more": true`; the whole snapshot is the last chunk with every chunk's
/// `keys` and `rows` in order.
#[derive(Default)]
struct SnapshotChunks {
    seq: Option<Value>,
    keys: Vec<Value>,
    rows: Vec<Value>,
}

impl SnapshotChunks {
    /// Takes one `snapshot` event's data; the whole snapshot once its last chunk arrived.
    fn add(&mut self, mut data: Value) -> Option<Value> {
        // A chunk of another seq starts a new snapshot (the unfinished one is dropped).
        if self.seq.as_ref().is_some_and(|s| *s != data["seq"]) {
            *self = SnapshotChunks::default();
        }
        let mut take = |field: &str, into: &mut Vec<Value>| {
            if let Some(Value::Array(items)) = data.get_mut(field) {
                into.append(items);
            }
        };
        take("keys", &mut self.keys);
        take("rows", &mut self.rows);
        if data.get("more") == Some(&Value::Bool(true)) {
            self.seq = Some(data["seq"].clone());
            return None;
        }
        let whole = std::mem::take(self);
        data["keys"] = Value::Array(whole.keys);
        data["rows"] = Value::Array(whole.rows);
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::SnapshotChunks;
    use serde_json::json;

    #[test]
    fn snapshot_chunks_are_shown_whole_once_the_last_arrives() {
        let mut chunks = SnapshotChunks::default();
        let one =
            json!({"seq": 3, "columns": ["id"], "keys": [1], "rows": [{"id": 1}], "checksum": "x"});
        assert_eq!(
            chunks.add(one.clone()),
            Some(one),
            "a one-message snapshot as it is"
        );
        assert_eq!(
            chunks.add(
                json!({"seq": 5, "keys": [1, 2], "rows": [{"id": 1}, {"id": 2}], "more": true})
            ),
            None
        );
        // Cut short by a snapshot of another seq: that one starts over.
        assert_eq!(
            chunks.add(json!({"seq": 7, "keys": [3], "rows": [{"id": 3}], "more": true})),
            None
        );
        assert_eq!(
            chunks.add(
                json!({"seq": 7, "keys": [4], "rows": [{"id": 4}], "checksum": "c", "reset": true})
            ),
            Some(
                json!({"seq": 7, "keys": [3, 4], "rows": [{"id": 3}, {"id": 4}], "checksum": "c", "reset": true})
            )
        );
    }
}
