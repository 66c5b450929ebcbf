//! Logging through `tracing`, filtered by `RUST_LOG` (default `info`, without openraft's
//! per-heartbeat warnings), written to stderr so that stdout carries only the lines scripts read.

use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::EnvFilter;

/// The filter without `RUST_LOG`. openraft's info lines are its internals (state dumps, every
/// vote it answers: an operator audit found them 97% of a node's log), so only its warnings
/// show; the node logs leader changes itself. openraft warns of every failed heartbeat (ten a
/// second to a peer that is down), and its replication of every failed retry, twice (about two
/// lines a second per member that is down: 3.5 MB of log in 45 minutes); the node logs a member
/// that does not answer itself, once in 30 s (`meta-http`'s `network/peer_failures.rs`). The
/// replication's other warnings (a snapshot it cannot read, a log read that breaks its
/// contract) stay. openraft logs as errors the refusals of a membership change's two steps
/// that it returns to the node (another change under way, a leader change between them),
/// which the node retries or answers itself: a change answered 200 left ERROR lines.
const DEFAULT_FILTER: &str = "info,openraft=warn,openraft::core::heartbeat=error,\
     openraft::replication=error,openraft::engine::handler::replication_handler=error,\
     openraft::replication::snapshot_transmitter=warn,openraft::replication::stream_state=warn,\
     openraft::raft::api::management=off";

/// Installs the global subscriber once. Colours only on a terminal, not in files or journald.
pub fn init() {
    let (filter, refused) = filter(std::env::var("RUST_LOG").ok());
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(StaleMessages)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init();
    if let Some(refused) = refused {
        tracing::warn!("{refused}");
    }
}

/// openraft's lines that say nothing the node does not say better, by target and a part of
/// their message:
/// - warnings of answers that arrive after the role, vote or member they were sent for is gone:
///   a leader that resumed from a pause, or lost an election, logged one per answer still on
///   its way (31 lines after a pause), and one that removed a member one per answer of that
///   member's, although nothing is wrong;
/// - the warning that a leadership transfer could not be sent to a member (one per voter): a
///   leader that stops says itself when the voter it asked stopped too (a whole cluster stopped
///   at once), and a move an operator asked for is answered with its outcome; and the one of a
///   voter that gets a transfer after another election already moved the vote (every removal
///   of a leader logged one, while the node logs the leader change itself);
/// - the errors of a core that stopped (its own, and that of each stream of entries it was
///   taking), with the cause, some three times over: the node logs the stop once, with it.
const STALE_MESSAGES: [(&str, &str); 7] = [
    (
        "openraft::core::raft_core",
        "A message will be ignored because",
    ),
    (
        "openraft::proposer::leader",
        "It may be from a delayed message, ignore",
    ),
    ("openraft::core::raft_core", "error sending transfer_leader"),
    (
        "openraft::raft::api::protocol",
        "Vote changed, give up Leader-transfer",
    ),
    // The core's stop, which the node logs once with its cause ("the Raft core stopped").
    ("openraft::core::raft_core", "RaftCore::main error"),
    ("openraft::raft::raft_inner", "recv_msg: error"),
    ("openraft::raft::stream_append", "RaftCore stopped"),
];

/// Drops openraft's lines that [`STALE_MESSAGES`] names; its other lines stay.
struct StaleMessages;

impl<S: Subscriber> Layer<S> for StaleMessages {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let target = event.metadata().target();
        if !STALE_MESSAGES.iter().any(|(t, _)| *t == target) {
            return true;
        }
        let mut stale = Stale {
            target,
            found: false,
        };
        event.record(&mut stale);
        !stale.found
    }
}

/// Whether an event of `target` has a message that [`STALE_MESSAGES`] names for it.
struct Stale<'a> {
    target: &'a str,
    found: bool,
}

impl Visit for Stale<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let message = format!("{value:?}");
            self.found = STALE_MESSAGES
                .iter()
                .any(|(t, part)| *t == self.target && message.contains(part));
        }
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
    /// The default filter drops openraft's per-retry replication warnings and keeps its
    /// others.
    #[test]
    fn the_default_filter_keeps_warnings_but_the_per_retry_ones() {
        use std::sync::{Arc, Mutex};

        use tracing_subscriber::layer::SubscriberExt as _;

        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry()
            .with(super::filter(None).0)
            .with(super::StaleMessages)
            .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "openraft::replication", "per-retry one");
            tracing::warn!(
                target: "openraft::engine::handler::replication_handler",
                "per-retry two"
            );
            tracing::warn!(target: "openraft::core::heartbeat", "per-heartbeat");
            tracing::error!(target: "openraft::raft::api::management", "membership step");
            tracing::warn!(target: "openraft::replication::snapshot_transmitter", "snapshot kept");
            tracing::warn!(target: "openraft::replication::stream_state", "contract kept");
            tracing::warn!(target: "openraft::core::raft_core", "core kept");
            tracing::warn!(
                target: "openraft::core::raft_core",
                "A message will be ignored because this node is no longer Leader: stale"
            );
            tracing::warn!(
                target: "openraft::proposer::leader",
                "stale too: target node 4 not found. It may be from a delayed message, ignore"
            );
            tracing::warn!(
                target: "openraft::core::raft_core",
                "error sending transfer_leader: Unreachable node: stale as well"
            );
            tracing::warn!(
                target: "openraft::raft::api::protocol",
                "Vote changed, give up Leader-transfer; expected vote: stale"
            );
            tracing::warn!(target: "openraft::raft::api::protocol", "protocol kept");
            tracing::error!(
                target: "openraft::core::raft_core",
                "RaftCore::main error: stale: when Write Logs"
            );
            tracing::error!(
                target: "openraft::raft::raft_inner",
                "openraft::raft::raft_inner::RaftInner<_>::recv_msg: error: stale"
            );
            tracing::error!(target: "openraft::raft::raft_inner", "inner kept");
            tracing::error!(
                target: "openraft::raft::stream_append",
                "stream_append: RaftCore stopped: stale"
            );
            tracing::warn!(target: "openraft::proposer::leader", "leader kept");
            tracing::info!(target: "openraft::core::raft_core", "core info");
            tracing::info!(target: "meta_http::network", "ours kept");
        });
        let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        for kept in [
            "snapshot kept",
            "contract kept",
            "core kept",
            "leader kept",
            "inner kept",
            "protocol kept",
            "ours kept",
        ] {
            assert!(logged.contains(kept), "{kept} missing: {logged}");
        }
        for dropped in [
            "per-retry",
            "per-heartbeat",
            "membership step",
            "core info",
            "stale",
        ] {
            assert!(!logged.contains(dropped), "{dropped} logged: {logged}");
        }
    }

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
