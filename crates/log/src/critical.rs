//! Threads the process cannot live without: the writer, the log, the live thread and the
//! snapshot thread. A panic in one of them leaves state that nothing can vouch for (a
//! half-applied transaction, an unknown log tail, views that stopped following commits), so
//! the process must not go on answering `/health` while it cannot write or read. Instead it
//! logs the reason and exits with [`EXIT_THREAD_PANIC`]; a supervisor restarts it, and
//! recovery replays the log, which holds everything that was acknowledged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::thread::JoinHandle;

/// Exit status after a critical thread panicked (`EX_SOFTWARE` of sysexits.h).
pub const EXIT_THREAD_PANIC: i32 = 70;

/// Environment variable naming a critical thread (`writer`, `log`, `live`, `snapshot`) that
/// panics at its first unit of work: a test-only hook for the exit-on-panic tests.
pub const INJECT_PANIC_ENV: &str = "SLUICE_TEST_PANIC";

/// Spawns a thread named `sluice-{name}`; if its body panics, the process exits.
pub fn spawn<F, T>(name: &'static str, body: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(format!("sluice-{name}"))
        .spawn(move || match catch_unwind(AssertUnwindSafe(body)) {
            Ok(value) => value,
            Err(payload) => {
                let reason = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                tracing::error!(
                    thread = name,
                    %reason,
                    "a critical thread panicked; exiting so a supervisor restarts the server (recovery replays every acknowledged commit)"
                );
                eprintln!(
                    "fatal: the {name} thread panicked ({reason}); exiting with status {EXIT_THREAD_PANIC}"
                );
                std::process::exit(EXIT_THREAD_PANIC)
            }
        })
}

/// Panics if [`INJECT_PANIC_ENV`] names `thread` (test-only hook; read once per process).
pub fn injected_panic_point(thread: &str) {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    let target = TARGET.get_or_init(|| std::env::var(INJECT_PANIC_ENV).ok());
    if target.as_deref() == Some(thread) {
        panic!("injected panic in the {thread} thread ({INJECT_PANIC_ENV})");
    }
}
