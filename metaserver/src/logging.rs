//! Logging through `tracing`, filtered by `RUST_LOG` (default `info`), written to stderr so
//! that stdout carries only the lines scripts read.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
