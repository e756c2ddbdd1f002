//! `sluice-bench`: the `sluice bench` suites. Peers' drivers live only here.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Suite to run.
    pub suite: String,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("unknown bench suite {:?}", args.suite)
}
