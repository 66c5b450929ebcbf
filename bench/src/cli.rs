//! Command-line parsing shared by the benchmarks: each benchmark's options are a clap `Parser`,
//! so every one of them answers `--help` and names a bad option the same way.

use anyhow::{bail, Result};
use clap::Parser;

/// Parses `args` (the words after the benchmark's name) as `T`. `--help` prints the options and
/// exits successfully; a bad option is an error that names it.
pub fn parse<T: Parser>(name: &str, args: &[String]) -> Result<T> {
    let argv = std::iter::once(format!("meta-bench {name}")).chain(args.iter().cloned());
    match T::try_parse_from(argv) {
        Ok(options) => Ok(options),
        Err(e) if !e.use_stderr() => {
            // --help: print and stop successfully (a reader that went away is no failure).
            let _ = e.print();
            std::process::exit(0);
        }
        Err(e) => bail!("{e}"),
    }
}
