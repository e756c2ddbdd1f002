//! `sluice sql`, the shell, driven as a user drives it: through stdin (a script) and through
//! a real pseudo-terminal (tmux), against a real `sluice serve` on loopback.
//!
//! The tmux tests skip, saying so, when `tmux` is not installed (scripts/test.sh installs
//! it). Each uses its own tmux server (`-S <socket in a temp dir>`), killed at the end.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{describe, Server, TempDir, ADMIN_TOKEN, BIN};
use serde_json::json;

/// How long the screen may take to show what a step expects.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `sluice sql <args>` with `stdin` piped in (not a terminal), HOME in `home`.
fn shell(server: &Server, home: &Path, args: &[&str], token: Option<&str>, stdin: &str) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("sql")
        .arg("--url")
        .arg(server.base_url())
        .args(args)
        .env_remove("SLUICE_URL")
        .env_remove("SLUICE_TOKEN")
        .env("HOME", home)
        .current_dir(home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = token {
        command.env("SLUICE_TOKEN", token);
    }
    let mut child = command.spawn().expect("spawn sluice sql");
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
    }
    wait_output(child)
}

/// Waits (bounded) for the child to exit and returns its output.
fn wait_output(mut child: std::process::Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("sluice sql did not exit within 30 s\n{}", describe(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_script_on_stdin_creates_inserts_and_selects_an_aligned_table() {
    let dir = TempDir::new("shell-stdin");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let script = "\
CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT NOT NULL, body TEXT);
INSERT INTO msgs VALUES (1, 'lobby', 'hello'),
                        (2, 'lobby', NULL);
-- a comment; not a statement
UPDATE msgs SET body = 'semi;colon' WHERE id = 2;
SELECT id, room, body FROM msgs ORDER BY id;
CREATE INDEX msgs_room ON msgs (room);
CREATE POLICY lobby_only ON msgs FOR SELECT USING (room = 'lobby');
\\d msgs
CREATE TABLE events (id INTEGER PRIMARY KEY, at TIMESTAMP);
INSERT INTO events VALUES (1, 1732400000000000);
SELECT at, at + 0 AS raw FROM events;
SELECT 1 + 2 AS three";
    let out = shell(&server, dir.path(), &[], Some(ADMIN_TOKEN), script);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert!(text.contains("CREATE TABLE (seq "), "{text}");
    assert!(text.contains("INSERT 2 (seq "), "{text}");
    assert!(text.contains("UPDATE 1 (seq "), "{text}");
    let table = " id | room  |    body\n\
                 ----+-------+------------\n  \
                 1 | lobby | hello\n  \
                 2 | lobby | semi;colon\n\
                 (2 rows)\n";
    assert!(text.contains(table), "expected\n{table}in\n{text}");
    // `\d msgs`: the columns with their types, the key.
    for needle in [
        "Table \"msgs\"",
        " id     | INTEGER | not null |         | primary key",
        " room   | TEXT    | not null |",
        " body   | TEXT    |",
        "Primary key: id",
        "Indexes:\n    \"msgs_room\" (room)\n",
        "Policies:\n    \"lobby_only\" FOR SELECT USING (",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
    // A TIMESTAMP column shows as a UTC time; an expression over it (no type) as it is.
    assert!(
        text.contains(" 2024-11-23 22:13:20 | 1732400000000000\n"),
        "{text}"
    );
    // The last statement had no `;`: it ran at the end of input.
    assert!(
        text.contains(" three\n-------\n     3\n(1 row)\n"),
        "{text}"
    );
    assert!(stderr(&out).is_empty(), "{}", describe(&out));
}

#[test]
fn a_failing_statement_is_named_with_its_code_and_the_exit_status_is_not_zero() {
    let dir = TempDir::new("shell-errors");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let script = "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL);\n\
                  INSERT INTO t VALUES (1, 10);\n\
                  INSERT INTO t VALUES (1, 11);\n\
                  SELECT * FROM nowhere;\n\
                  SELECT n FROM t;\n";
    let out = shell(&server, dir.path(), &[], Some(ADMIN_TOKEN), script);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("ERROR (already_exists): ") && err.contains("(statement 3)"),
        "{err}"
    );
    assert!(
        err.contains("ERROR (not_found): ")
            && err.contains("nowhere")
            && err.contains("(statement 4)"),
        "{err}"
    );
    // Statements after a failure still run; results stay on stdout, errors on stderr.
    let text = stdout(&out);
    assert!(text.contains(" n\n----\n 10\n(1 row)\n"), "{text}");
    assert!(!text.contains("ERROR"), "{text}");

    // `-c` runs one command; an error there is a failure too.
    let ok = shell(
        &server,
        dir.path(),
        &["-c", "SELECT n FROM t"],
        Some(ADMIN_TOKEN),
        "",
    );
    assert!(ok.status.success(), "{}", describe(&ok));
    assert!(stdout(&ok).contains("(1 row)"), "{}", describe(&ok));
    let bad = shell(
        &server,
        dir.path(),
        &["-c", "SELEC 1"],
        Some(ADMIN_TOKEN),
        "",
    );
    assert_eq!(bad.status.code(), Some(1), "{}", describe(&bad));
    assert!(
        stderr(&bad).contains("ERROR (bad_request): "),
        "{}",
        describe(&bad)
    );
}

#[test]
fn begin_and_commit_send_their_statements_as_one_transaction() {
    let dir = TempDir::new("shell-transaction");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let script = "CREATE TABLE acct (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);\n\
                  INSERT INTO acct VALUES (1, 100);\n\
                  BEGIN;\n\
                  INSERT INTO acct VALUES (2, 5);\n\
                  INSERT INTO acct VALUES (1, 7);\n\
                  COMMIT;\n\
                  SELECT count(*) AS n FROM acct;\n\
                  BEGIN;\n\
                  UPDATE acct SET balance = balance - 30 WHERE id = 1;\n\
                  INSERT INTO acct VALUES (2, 30);\n\
                  SELECT id, balance FROM acct ORDER BY id;\n\
                  COMMIT;\n\
                  BEGIN;\n\
                  DELETE FROM acct;\n\
                  ROLLBACK;\n\
                  SELECT sum(balance) AS total FROM acct;\n";
    let out = shell(&server, dir.path(), &[], Some(ADMIN_TOKEN), script);
    // The first transaction fails as a whole, naming its failing statement.
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("ERROR (already_exists): ") && err.contains("(statement 5)"),
        "{err}"
    );
    assert!(
        err.contains("ROLLBACK (nothing of the transaction was applied)"),
        "{err}"
    );
    let text = stdout(&out);
    // Nothing of it was applied: still one row.
    assert!(text.contains(" n\n---\n 1\n(1 row)\n"), "{text}");
    // The second commits: its results print at COMMIT, the SELECT sees the writes before it.
    assert!(text.contains("UPDATE 1 (seq "), "{text}");
    assert!(
        text.contains(
            " id | balance\n----+---------\n  1 |      70\n  2 |      30\n(2 rows)\nCOMMIT\n"
        ),
        "{text}"
    );
    // ROLLBACK sends nothing.
    assert!(text.contains("ROLLBACK (1 statements dropped)"), "{text}");
    assert!(
        text.contains(" total\n-------\n   100\n(1 row)\n"),
        "{text}"
    );
}

#[test]
fn a_refused_token_prints_the_reason_and_a_hint() {
    let dir = TempDir::new("shell-token");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let out = shell(&server, dir.path(), &[], Some("not-the-token"), "SELECT 1;");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let err = stderr(&out);
    assert!(err.contains("ERROR (unauthorized): "), "{err}");
    assert!(err.contains("reason: "), "{err}");
    assert!(
        err.contains("hint: token from SLUICE_TOKEN was refused"),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "{}", describe(&out));
}

#[test]
fn without_a_token_a_local_url_uses_the_default_data_dirs_admin_token() {
    let dir = TempDir::new("shell-local-token");
    // The server keeps its generated admin token in ./sluice-data/admin-token, the default
    // data directory seen from `dir`.
    let server = Server::start_with_stored_admin_token(&dir.join("sluice-data"), dir.path(), &[]);
    assert!(dir.join("sluice-data/admin-token").exists());
    let out = shell(&server, dir.path(), &[], None, "SELECT 'ok' AS status;");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout(&out).contains(" ok\n(1 row)"), "{}", describe(&out));
}

// ---------------------------------------------------------------------------------------
// Through a pseudo-terminal

/// One tmux server of our own (its socket in a temp dir) running `sluice sql`.
struct Tmux {
    socket: PathBuf,
    session: String,
}

impl Tmux {
    /// Starts the shell in a 200×50 pane; `None` when tmux is not installed.
    fn start(dir: &TempDir, server: &Server, name: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            println!("SKIPPED: tmux is not installed (scripts/test.sh installs it)");
            return None;
        }
        let tmux = Tmux {
            socket: dir.join("tmux.sock"),
            session: format!("sluice-sql-{name}-{}", std::process::id()),
        };
        // The shell's exit status is printed, and the pane kept, so a failure shows why.
        let command = format!(
            "env -u SLUICE_URL HOME='{home}' SLUICE_TOKEN='{ADMIN_TOKEN}' TERM=xterm '{BIN}' sql --url '{url}'; \
             echo SHELL-EXITED-$?; sleep 600",
            home = dir.path().display(),
            url = server.base_url(),
        );
        let status = tmux
            .cmd()
            .args([
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
                "-s",
                &tmux.session,
            ])
            .arg(command)
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        Some(tmux)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket);
        c
    }

    /// Types `text` literally (no Enter). As hex bytes: tmux reads an argument ending in
    /// `;` as a command separator, even with `-l`.
    fn type_text(&self, text: &str) {
        let ok = self
            .cmd()
            .args(["send-keys", "-t", &self.session, "-H"])
            .args(text.bytes().map(|b| format!("{b:02x}")))
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux send-keys failed");
    }

    /// Presses keys by name (`Enter`, `Up`, `C-c`).
    fn keys(&self, keys: &[&str]) {
        let ok = self
            .cmd()
            .args(["send-keys", "-t", &self.session])
            .args(keys)
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux send-keys failed");
    }

    fn line(&self, text: &str) {
        self.type_text(text);
        self.keys(&["Enter"]);
    }

    /// The pane's text with its scrollback, wrapped lines joined.
    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args([
                "capture-pane",
                "-p",
                "-J",
                "-S",
                "-2000",
                "-t",
                &self.session,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `check` holds for the screen; panics with the screen when it does not
    /// within [`SCREEN_TIMEOUT`].
    fn wait_for(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            let screen = self.screen();
            if check(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                panic!("the screen never showed {what}; it shows:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_text(&self, text: &str) -> String {
        self.wait_for(&format!("{text:?}"), |s| s.contains(text))
    }

    fn wait_count(&self, text: &str, n: usize) -> String {
        self.wait_for(&format!("{text:?} {n} times"), |s| {
            s.matches(text).count() >= n
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn in_a_terminal_multi_line_statements_history_and_live_queries_work() {
    let dir = TempDir::new("shell-tty");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let Some(tmux) = Tmux::start(&dir, &server, "live") else {
        return;
    };
    tmux.wait_text("Type \\? for help");
    let banner = tmux.screen();
    assert!(banner.contains("token from SLUICE_TOKEN"), "{banner}");

    // A statement over two lines: the continuation prompt, then one result.
    tmux.line("CREATE TABLE msgs (id INTEGER PRIMARY KEY,");
    tmux.wait_text("sluice-> ");
    tmux.line("body TEXT);");
    tmux.wait_text("CREATE TABLE (seq ");
    tmux.line("INSERT INTO msgs VALUES (1, 'first');");
    tmux.wait_text("INSERT 1 (seq ");

    // History: Up recalls the last statement; Enter runs it again.
    tmux.line("SELECT body FROM msgs WHERE id = 1;");
    tmux.wait_count("(1 row)", 1);
    tmux.keys(&["Up"]);
    tmux.wait_count("SELECT body FROM msgs WHERE id = 1;", 2);
    tmux.keys(&["Enter"]);
    tmux.wait_count("(1 row)", 2);

    // A value wider than the terminal (200 columns) is cut with `…` to fit.
    tmux.line(&format!("SELECT '{}' AS wide;", "w".repeat(300)));
    let screen = tmux.wait_count("(1 row)", 3);
    let cut = screen
        .lines()
        .find(|l| l.starts_with(" www"))
        .unwrap_or_else(|| panic!("no row of w's in\n{screen}"));
    assert!(cut.ends_with('…') && cut.chars().count() <= 200, "{cut:?}");

    // \live: the snapshot, then a row written over HTTP by this test appears.
    tmux.line("\\live SELECT id, body FROM msgs ORDER BY id");
    tmux.wait_text("live, Ctrl-C to stop");
    runtime().block_on(async {
        let (status, body) = server
            .api()
            .post(
                "/v1/sql",
                &json!({"sql": "INSERT INTO msgs VALUES (2, 'from-http')"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    });
    tmux.wait_text("+ 2 | from-http");
    runtime().block_on(async {
        let sql = "UPDATE msgs SET body = 'edited' WHERE id = 2; DELETE FROM msgs WHERE id = 1";
        let (status, body) = server.api().post("/v1/sql", &json!({ "sql": sql })).await;
        assert_eq!(status, 200, "{body}");
    });
    tmux.wait_text("~ 2 | edited");
    tmux.wait_text("- key 1");

    // Ctrl-C ends the stream and returns to the prompt; the shell keeps working.
    tmux.keys(&["C-c"]);
    tmux.wait_text("(stopped)");
    tmux.line("SELECT 'still-here' AS after_live;");
    tmux.wait_text(" still-here\n(1 row)");
    assert!(!tmux.screen().contains("SHELL-EXITED"), "{}", tmux.screen());

    tmux.line("\\q");
    tmux.wait_text("SHELL-EXITED-0");
    // The history file holds the statements, the multi-line one as one entry.
    let history = std::fs::read_to_string(dir.join(".sluice_history")).unwrap_or_default();
    assert!(
        history.contains("SELECT body FROM msgs WHERE id = 1;"),
        "{history}"
    );
}

#[test]
fn in_a_terminal_watch_shows_appended_records_until_ctrl_c() {
    let dir = TempDir::new("shell-watch");
    let server = Server::start(&dir.join("data"), dir.path(), &[]);
    let Some(tmux) = Tmux::start(&dir, &server, "watch") else {
        return;
    };
    let api = server.api();
    runtime().block_on(async {
        let (status, body) = api.put_topic("events", None).await;
        assert_eq!(status, 200, "{body}");
    });
    tmux.wait_text("Type \\? for help");
    tmux.line("\\topics");
    tmux.wait_text(" events ");

    tmux.line("\\watch events kind:*");
    tmux.wait_text("watching events from offset 0");
    runtime().block_on(async {
        let records = json!([
            {"tags": ["other"], "data": {"text": "filtered-out"}},
            {"tags": ["kind:test"], "data": {"text": "hello-watch"}},
        ]);
        api.append_ok("events", &records, None).await;
    });
    let screen = tmux.wait_text("hello-watch");
    assert!(
        screen.contains("1  [kind:test]  {\"text\":\"hello-watch\"}"),
        "{screen}"
    );
    assert!(!screen.contains("filtered-out"), "{screen}");

    tmux.keys(&["C-c"]);
    tmux.wait_text("(stopped)");
    tmux.line("\\d");
    tmux.wait_text("List of tables");
    // Inside BEGIN the prompt says so (`*`), as psql's does.
    tmux.line("BEGIN;");
    tmux.wait_text("sluice*=> ");
    tmux.line("ROLLBACK;");
    tmux.wait_text("ROLLBACK (0 statements dropped)");
    tmux.line("\\q");
    tmux.wait_text("SHELL-EXITED-0");
}
