//! `meta-bench`: the project's benchmarks. `cargo run --release -p meta-bench -- <wal|limiter|raft|storm>`.

mod cli;
mod limiter;
mod raft;
mod report;
mod storm;
mod wal;

use std::process::ExitCode;

const USAGE: &str =
    "usage: meta-bench <wal|limiter|raft|storm> [options]; meta-bench <name> --help lists the options";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str);
    let result = match which {
        Some("wal") => wal::run(&args[1..]),
        Some("limiter") => limiter::run(&args[1..]),
        Some("raft") => raft::run(&args[1..]),
        Some("storm") => storm::run(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(anyhow::anyhow!("unknown benchmark {other:?}\n{USAGE}")),
        None => Err(anyhow::anyhow!("{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes, without a backtrace: a usage or setup error is read by a person.
            eprintln!("meta-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
