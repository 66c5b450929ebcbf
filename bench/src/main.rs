//! `meta-bench`: the project's benchmarks. `cargo run --release -p meta-bench -- <wal|limiter|raft|storm>`.

mod limiter;
mod raft;
mod report;
mod storm;
mod wal;

use anyhow::{bail, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(which) = args.first() else {
        bail!("usage: meta-bench <wal|limiter|raft|storm> [options]");
    };
    match which.as_str() {
        "wal" => wal::run(&args[1..]),
        "limiter" => limiter::run(&args[1..]),
        "raft" => raft::run(&args[1..]),
        "storm" => storm::run(&args[1..]),
        other => bail!("unknown benchmark {other:?}; expected wal, limiter, raft or storm"),
    }
}
