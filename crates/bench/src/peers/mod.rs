//! Real peers the suites compare against, started on this machine for the run.
//!
//! - [`postgres`]: a throwaway PostgreSQL cluster from the Debian packages.

pub mod postgres;
