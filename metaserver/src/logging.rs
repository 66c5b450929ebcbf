//! Logging through `tracing`, filtered by `RUST_LOG` (default `info`, without openraft's
//! per-heartbeat warnings), written to stderr so that stdout carries only the lines scripts read.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter without `RUST_LOG`. openraft's info lines are its internals (state dumps, every
/// vote it answers: an operator audit found them 97% of a node's log), so only its warnings
/// show; the node logs leader changes itself. openraft warns of every failed heartbeat (ten a
/// second to a peer that is down); its replication warnings, paced by the retry backoff, say
/// the same.
const DEFAULT_FILTER: &str = "info,openraft=warn,openraft::core::heartbeat=error";

/// Installs the global subscriber once. Colours only on a terminal, not in files or journald.
pub fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
