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
    let (filter, refused) = filter(std::env::var("RUST_LOG").ok());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    if let Some(refused) = refused {
        tracing::warn!("{refused}");
    }
}

/// The filter `RUST_LOG` (`rust_log`) asks for, else the default; with the warning for a value
/// that is not a filter, which is not dropped without a word.
fn filter(rust_log: Option<String>) -> (EnvFilter, Option<String>) {
    match rust_log.filter(|text| !text.trim().is_empty()) {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(text) => match EnvFilter::try_new(&text) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new(DEFAULT_FILTER),
                Some(format!(
                    "RUST_LOG={text:?} is not a log filter ({e}): logging with the default, \
                     {DEFAULT_FILTER}"
                )),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rust_log_that_is_not_a_filter_is_warned_about() {
        assert!(super::filter(None).1.is_none());
        assert!(super::filter(Some(" ".into())).1.is_none());
        assert!(super::filter(Some("debug,openraft=warn".into()))
            .1
            .is_none());
        let warned = super::filter(Some("metaserver=loud".into())).1;
        assert!(warned.is_some_and(|w| w.contains("not a log filter")));
    }
}
