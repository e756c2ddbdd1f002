//! Real peers the suites compare against, started on this machine for the run.
//!
//! - [`postgres`]: a throwaway PostgreSQL cluster from the Debian packages.
//! - [`redis`]: a throwaway `redis-server` (Debian package `redis-server`), spoken to with
//!   the minimal RESP codec in [`resp`].

pub mod postgres;
pub mod redis;
pub mod resp;
