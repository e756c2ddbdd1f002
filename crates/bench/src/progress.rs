//! Progress lines on stderr: which case is running and how long the suite has run.
//!
//! Results go to stdout and to files; stderr is only for a person watching a long run.

use std::fmt::Display;
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct Progress {
    suite: &'static str,
    started: Instant,
}

impl Progress {
    pub fn new(suite: &'static str) -> Self {
        Progress {
            suite,
            started: Instant::now(),
        }
    }

    /// Prints `[  12.3s] suite: message`.
    pub fn say(&self, message: impl Display) {
        eprintln!(
            "[{:>7.1}s] {}: {message}",
            self.started.elapsed().as_secs_f64(),
            self.suite
        );
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
