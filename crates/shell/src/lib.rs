//! `sluice sql`: an interactive SQL shell against a running Sluice server, in the manner of
//! psql.
//!
//! It is responsible for reading statements (from a line editor with history when stdin is
//! a terminal, else from stdin as a script, or from `-c`), sending them over the HTTP API
//! (`POST /v1/sql`; `/v1/live` and topic watches as Server-Sent Events for `\live` and
//! `\watch`), and printing replies as aligned tables. It is *not* a SQL implementation:
//! the server parses and checks every statement; the shell only finds where a statement
//! ends (a `;` outside quotes and comments).
//!
//! # Layout
//! - [`client`]: HTTP requests, the server's errors, SSE streams.
//! - [`statements`]: where statements end; command tags.
//! - [`render`]: aligned tables, values on one line.
//! - [`session`]: one statement or meta-command: request, reply, output.
//! - this file: arguments, token choice, the banner, the interactive and script loops.

pub mod client;
pub mod render;
pub mod session;
pub mod statements;

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use reqwest::Url;
use rustyline::error::ReadlineError;

use client::{Client, Error};
use render::Style;
use session::{print, Flow, Session};

/// The URL used without `--url` and `SLUICE_URL`.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// Where the default data directory keeps its generated admin token.
pub const LOCAL_ADMIN_TOKEN_FILE: &str = "./sluice-data/admin-token";
/// Statements kept in `~/.sluice_history`.
pub const HISTORY_ENTRIES_MAX: usize = 1000;
/// The history file's name, in the home directory.
pub const HISTORY_FILE: &str = ".sluice_history";
/// The longest statement the shell buffers (the server's `sql_bytes_max` is 64 KiB; a
/// longer buffer is a runaway quote, reported instead of growing without end).
pub const STATEMENT_BYTES_MAX: usize = 1024 * 1024;

/// Arguments of `sluice sql`.
#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// The server's URL.
    #[arg(long, env = "SLUICE_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// The token to send (the admin token or a client JWT). Default: `SLUICE_TOKEN`, else
    /// for a local URL the file ./sluice-data/admin-token when it exists.
    #[arg(long)]
    pub token: Option<String>,
    /// Run this (statements or one meta-command) and exit.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    pub command: Option<String>,
}

/// Where the token came from (said in the banner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Flag,
    Env,
    File(PathBuf),
    None,
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::Flag => write!(f, "token from --token"),
            TokenSource::Env => write!(f, "token from SLUICE_TOKEN"),
            TokenSource::File(path) => write!(f, "admin token from {}", path.display()),
            TokenSource::None => write!(f, "no token"),
        }
    }
}

/// Chooses the token: `--token`, else `SLUICE_TOKEN`, else (local URL only) the default
/// data directory's admin token file.
pub fn choose_token(flag: Option<String>, url: &Url) -> (Option<String>, TokenSource) {
    if let Some(token) = flag {
        return (Some(token), TokenSource::Flag);
    }
    if let Ok(token) = std::env::var("SLUICE_TOKEN") {
        if !token.trim().is_empty() {
            return (Some(token.trim().to_string()), TokenSource::Env);
        }
    }
    if is_local(url) {
        let path = Path::new(LOCAL_ADMIN_TOKEN_FILE);
        if let Ok(text) = std::fs::read_to_string(path) {
            let token = text.trim();
            if !token.is_empty() {
                return (
                    Some(token.to_string()),
                    TokenSource::File(path.to_path_buf()),
                );
            }
        }
    }
    (None, TokenSource::None)
}

/// Whether the URL names this machine (only then is a local token file a fit).
pub fn is_local(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs `sluice sql`. Exit status: 0 when everything succeeded, 1 when a statement failed,
/// 2 when the server could not be reached or refused the token.
pub fn run(args: SqlArgs) -> ExitCode {
    let url = match Url::parse(&args.url) {
        Ok(url) if url.scheme() == "http" => url,
        Ok(url) => {
            eprintln!(
                "error: {url}: only http:// URLs are supported by `sluice sql` (no TLS client)"
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("error: --url {:?}: {e}", args.url);
            return ExitCode::from(2);
        }
    };
    let (token, source) = choose_token(args.token, &url);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::new(url, token) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let interactive = args.command.is_none() && std::io::stdin().is_terminal();
    let stdout_tty = std::io::stdout().is_terminal();
    let style = Style {
        width: None,
        color: stdout_tty,
    };
    let mut session = Session::new(client, style, interactive);
    let seq = match runtime.block_on(connect(&session.client, &source)) {
        Ok(seq) => seq,
        Err(()) => return ExitCode::from(2),
    };
    if let Some(command) = args.command {
        return exit(runtime.block_on(run_script_text(&mut session, &command)));
    }
    if interactive {
        let banner = format!(
            "sluice sql: {} (seq {seq}), {source}\nType \\? for help, \\q to quit. Statements end with `;`.\n",
            session.client.base()
        );
        print(&banner);
        return interactive_loop(&runtime, &mut session);
    }
    exit(runtime.block_on(run_stdin(&mut session)))
}

fn exit(all_ok: bool) -> ExitCode {
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Checks that the server answers and takes the token; returns its seq. Errors are
/// printed (with a hint for a refused token).
async fn connect(client: &Client, source: &TokenSource) -> Result<u64, ()> {
    let health = match client.get("/health").await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("{e}");
            return Err(());
        }
    };
    match client.get("/v1/tables").await {
        Ok(_) => {}
        Err(Error::Api {
            code,
            message,
            reason,
            ..
        }) if code == "unauthorized" => {
            let reason = reason
                .map(|r| format!(" (reason: {r})"))
                .unwrap_or_default();
            eprintln!("ERROR (unauthorized): {message}{reason}");
            eprintln!(
                "hint: {source} was refused. Pass the admin token or a client token with --token \
                 or SLUICE_TOKEN; `sluice serve` prints where it keeps its admin token \
                 (<data>/admin-token)."
            );
            return Err(());
        }
        // A client token may be refused other things; the session can still run.
        Err(_) => {}
    }
    Ok(health["seq"].as_u64().unwrap_or(0))
}

/// Prints an error the way the shell shows them: `ERROR (code): message`, with the
/// statement's number in the script (from 1) when there is one.
fn report(error: &Error, statement: Option<usize>) {
    if matches!(error, Error::Cancelled) {
        eprintln!("cancelled (a write the server had already received may still apply)");
        return;
    }
    match statement {
        Some(n) => eprintln!("{error} (statement {n})"),
        None => eprintln!("{error}"),
    }
}

/// Feeds lines to statements and meta-commands; used by the script, `-c` and the
/// interactive loop alike.
struct Feeder {
    buffer: String,
    /// Statements and meta-commands run so far (the number in error messages).
    count: usize,
    failed: bool,
    /// Between `BEGIN` and `COMMIT`: the statements kept for the transaction, with their
    /// numbers.
    transaction: Option<Vec<(usize, String)>>,
}

/// `BEGIN`, `COMMIT`, `ROLLBACK` and their synonyms.
#[derive(Clone, Copy)]
enum Control {
    Begin,
    Commit,
    Rollback,
}

/// What one line did.
enum Fed {
    /// Part of a statement that has not ended.
    Pending,
    /// Ran what was complete.
    Ran(Flow),
}

impl Feeder {
    fn new() -> Feeder {
        Feeder {
            buffer: String::new(),
            count: 0,
            failed: false,
            transaction: None,
        }
    }

    async fn line(&mut self, session: &mut Session, line: &str, number: bool) -> Fed {
        if !statements::has_code(&self.buffer) && line.trim_start().starts_with('\\') {
            self.buffer.clear();
            self.count += 1;
            return match session.meta(line).await {
                Ok(flow) => Fed::Ran(flow),
                Err(e) => {
                    self.failed = true;
                    report(&e, number.then_some(self.count));
                    Fed::Ran(Flow::Continue)
                }
            };
        }
        if !self.buffer.is_empty() {
            self.buffer.push('\n');
        }
        self.buffer.push_str(line);
        let (done, rest) = statements::split(&self.buffer);
        self.buffer = rest;
        if self.buffer.len() > STATEMENT_BYTES_MAX {
            self.buffer.clear();
            self.failed = true;
            report(
                &Error::api(
                    "limit",
                    format!(
                        "a statement longer than {STATEMENT_BYTES_MAX} bytes \
                         (STATEMENT_BYTES_MAX) was dropped; is a quote left open?"
                    ),
                ),
                None,
            );
            return Fed::Ran(Flow::Continue);
        }
        let ran = !done.is_empty();
        for sql in done {
            self.run(session, &sql, number).await;
        }
        if ran {
            if !statements::has_code(&self.buffer) {
                self.buffer.clear();
            }
            Fed::Ran(Flow::Continue)
        } else if statements::has_code(&self.buffer) {
            Fed::Pending
        } else {
            self.buffer.clear();
            Fed::Ran(Flow::Continue)
        }
    }

    async fn run(&mut self, session: &mut Session, sql: &str, number: bool) {
        self.count += 1;
        let words: Vec<String> = sql
            .split_whitespace()
            .take(3)
            .map(str::to_ascii_uppercase)
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let control = match words.as_slice() {
            ["BEGIN"] | ["BEGIN", "TRANSACTION" | "WORK"] | ["START", "TRANSACTION"] => {
                Some(Control::Begin)
            }
            ["COMMIT" | "END"] | ["COMMIT" | "END", "TRANSACTION" | "WORK"] => {
                Some(Control::Commit)
            }
            ["ROLLBACK" | "ABORT"] | ["ROLLBACK" | "ABORT", "TRANSACTION" | "WORK"] => {
                Some(Control::Rollback)
            }
            _ => None,
        };
        let n = number.then_some(self.count);
        match (control, self.transaction.take()) {
            (Some(Control::Begin), None) => {
                self.transaction = Some(Vec::new());
                print("BEGIN\n");
            }
            (Some(Control::Begin), Some(kept)) => {
                self.transaction = Some(kept);
                self.failed = true;
                report(
                    &Error::api("bad_request", "a transaction is already in progress"),
                    n,
                );
            }
            (Some(Control::Commit), Some(kept)) => self.commit(session, kept, number).await,
            (Some(Control::Rollback), Some(kept)) => {
                print(&format!("ROLLBACK ({} statements dropped)\n", kept.len()));
            }
            (Some(_), None) => {
                self.failed = true;
                report(
                    &Error::api(
                        "bad_request",
                        "no transaction is in progress (BEGIN starts one)",
                    ),
                    n,
                );
            }
            (None, Some(mut kept)) => {
                kept.push((self.count, sql.to_string()));
                self.transaction = Some(kept);
            }
            (None, None) => {
                if let Err(e) = session.statement(sql).await {
                    self.failed = true;
                    report(&e, n);
                }
            }
        }
    }

    /// `COMMIT`: the kept statements as one request.
    async fn commit(&mut self, session: &mut Session, kept: Vec<(usize, String)>, number: bool) {
        if kept.is_empty() {
            print("COMMIT\n");
            return;
        }
        let sqls: Vec<&str> = kept.iter().map(|(_, sql)| sql.as_str()).collect();
        match session.transaction(&sqls).await {
            Ok(()) => print("COMMIT\n"),
            Err(e) => {
                self.failed = true;
                let failing = match &e {
                    Error::Api {
                        statement: Some(i), ..
                    } => kept.get(*i as usize),
                    _ => None,
                };
                match failing {
                    Some((n, sql)) => {
                        report(&e, number.then_some(*n));
                        eprintln!("  in: {}", sql.lines().next().unwrap_or(""));
                    }
                    None => report(&e, None),
                }
                eprintln!("ROLLBACK (nothing of the transaction was applied)");
            }
        }
    }

    /// Whether a `BEGIN` is waiting for its `COMMIT` (the prompt shows `*`).
    fn in_transaction(&self) -> bool {
        self.transaction.is_some()
    }

    /// At the end of input: a last statement without its `;` runs too; a transaction left
    /// open is dropped (nothing of it was sent), which is a failure.
    async fn finish(&mut self, session: &mut Session, number: bool) {
        let rest = std::mem::take(&mut self.buffer);
        if statements::has_code(&rest) {
            self.run(session, rest.trim(), number).await;
        }
        if let Some(kept) = self.transaction.take() {
            self.failed = true;
            report(
                &Error::api(
                    "bad_request",
                    format!(
                        "the input ended inside a transaction: its {} statements were not \
                         sent (COMMIT sends them)",
                        kept.len()
                    ),
                ),
                None,
            );
        }
    }
}

/// `-c TEXT`: its statements (or one meta-command); true when all succeeded.
async fn run_script_text(session: &mut Session, text: &str) -> bool {
    let mut feeder = Feeder::new();
    if text.trim_start().starts_with('\\') {
        for line in text.lines() {
            if let Fed::Ran(Flow::Quit) = feeder.line(session, line, false).await {
                break;
            }
        }
    } else {
        let (done, rest) = statements::split(text);
        for sql in done {
            feeder.run(session, &sql, false).await;
        }
        feeder.buffer = rest;
        feeder.finish(session, false).await;
    }
    !feeder.failed
}

/// Statements from stdin (not a terminal): no prompt, results to stdout, errors to stderr.
async fn run_stdin(session: &mut Session) -> bool {
    let mut feeder = Feeder::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<String>>(16);
    // Reading stdin blocks; a thread feeds the lines so a stream (`\live`) can still see
    // Ctrl-C and the runtime stays free.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let end = line.is_err();
            if tx.blocking_send(line).is_err() || end {
                return;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: reading stdin: {e}");
                return false;
            }
        };
        if let Fed::Ran(Flow::Quit) = feeder.line(session, &line, true).await {
            return !feeder.failed;
        }
    }
    feeder.finish(session, true).await;
    !feeder.failed
}

/// The history file: `$HOME/.sluice_history`.
fn history_path() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(HISTORY_FILE))
}

/// The line editor loop: prompts, history, multi-line statements.
fn interactive_loop(runtime: &tokio::runtime::Runtime, session: &mut Session) -> ExitCode {
    let config = rustyline::Config::builder()
        .max_history_size(HISTORY_ENTRIES_MAX)
        .map(|b| b.auto_add_history(false).build());
    let editor = config.and_then(rustyline::DefaultEditor::with_config);
    let mut editor = match editor {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot start the line editor: {e}");
            return ExitCode::from(2);
        }
    };
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    let mut feeder = Feeder::new();
    // The lines of the statement being typed, kept for history as one entry.
    let mut entry = String::new();
    loop {
        if let Some((cols, _)) = editor.dimensions() {
            session.style.width = Some(usize::from(cols));
        }
        // As psql: `-` continues a statement, `*` is inside a transaction.
        let prompt = match (
            statements::has_code(&feeder.buffer),
            feeder.in_transaction(),
        ) {
            (false, false) => "sluice=> ",
            (true, false) => "sluice-> ",
            (false, true) => "sluice*=> ",
            (true, true) => "sluice*-> ",
        };
        match editor.readline(prompt) {
            Ok(line) => {
                if !entry.is_empty() {
                    entry.push('\n');
                }
                entry.push_str(&line);
                let fed = runtime.block_on(feeder.line(session, &line, false));
                if let Fed::Ran(flow) = fed {
                    let text = std::mem::take(&mut entry);
                    if !text.trim().is_empty() {
                        let _ = editor.add_history_entry(text.trim());
                        if let Some(path) = &history {
                            let _ = editor.save_history(path);
                        }
                    }
                    if flow == Flow::Quit {
                        break;
                    }
                }
            }
            // Ctrl-C at the prompt drops the statement being typed, as in psql.
            Err(ReadlineError::Interrupted) => {
                feeder.buffer.clear();
                entry.clear();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("error: reading input: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(kept) = &feeder.transaction {
        eprintln!(
            "WARNING: the transaction was not committed; its {} statements were not sent",
            kept.len()
        );
    }
    ExitCode::SUCCESS
}
