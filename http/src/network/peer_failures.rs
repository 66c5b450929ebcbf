//! What a node makes of its members' refusals of its Raft messages, and of failures to reach
//! them: one that refuses them as another cluster's, or for its token (401), is noted for the
//! node's status (`PeerRefusals`); one that refuses its token, and one that cannot be reached,
//! are logged, once per member and then at most every 30 s with the count in between (one that
//! cannot be reached once its messages have failed for a second with no answer between).
//!
//! Without the token line, a member restarted with another `--token` looked merely slow: the
//! leader's messages to it failed in silence, and its own requests to the leader failed as
//! internal errors. The unreachable line stands for openraft's replication warnings, two per
//! retry (about two a second per member that is down), which the binary's log filter leaves
//! out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meta_consensus::{NodeId, PeerRefusals};

use crate::cluster_identity;
use crate::log_throttle::LogThrottle;

/// How long a member's messages must have failed, with no answer between, before it is said
/// not to answer: one message timed out on a loaded host is no news.
const UNANSWERED_FOR: Duration = Duration::from_secs(1);

/// How a message failed without an answer, as far as it tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unanswered {
    /// No connection could be made: nothing listens at the member's address (or its TLS
    /// handshake failed).
    NotConnected,
    /// The member answered this node's TLS with something that is no TLS: plain HTTP.
    PlainAnswer,
    /// Any other: no answer in time, an answer cut off.
    Other,
}

impl Unanswered {
    /// What `e`, a failed exchange, tells.
    pub(super) fn of(e: &reqwest::Error) -> Self {
        if crate::peer_client::answered_plain(e) {
            Unanswered::PlainAnswer
        } else if e.is_connect() {
            // A failed handshake counts as no connection, as it is one no message gets through.
            Unanswered::NotConnected
        } else {
            Unanswered::Other
        }
    }
}

/// The refusals and failures of this node's messages, shared by its connections to every
/// member.
#[derive(Debug, Clone)]
pub(super) struct PeerFailures {
    refusals: PeerRefusals,
    token: Arc<LogThrottle<NodeId>>,
    unreachable: Arc<LogThrottle<NodeId>>,
    /// Members on the other side of TLS from this node (one speaks it, the other not).
    tls: Arc<LogThrottle<NodeId>>,
    /// Since when each member's messages have failed, with no answer since.
    failing_since: Arc<std::sync::Mutex<HashMap<NodeId, Instant>>>,
}

impl PeerFailures {
    pub(super) fn new(refusals: PeerRefusals) -> Self {
        PeerFailures {
            refusals,
            token: Arc::default(),
            unreachable: Arc::default(),
            tls: Arc::default(),
            failing_since: Arc::default(),
        }
    }

    /// Notes `target`'s answer to a snapshot: refused for want of room, saying `why`, or not.
    pub(super) fn snapshot_answered(&self, target: NodeId, why: Option<String>) {
        self.refusals.snapshot_answered(target, why);
    }

    /// Notes `target`'s answer with `status` and `body` to one of this node's messages.
    pub(super) fn note(&self, target: NodeId, status: reqwest::StatusCode, body: &[u8]) {
        self.failing().remove(&target);
        if status.is_success() {
            self.refusals.accepted(target);
            return;
        }
        self.refusals.answered(target);
        if cluster_identity::refuses_as_other_cluster(status, body) {
            self.refusals.refused(target);
        } else if status == reqwest::StatusCode::UNAUTHORIZED {
            self.token_refused(target, Instant::now());
        } else if cluster_identity::asks_for_tls(status, body) {
            self.tls_mismatch(target, true, Instant::now());
        }
    }

    /// Since when each member's messages have failed (a poisoned lock's map is still sound).
    fn failing(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Instant>> {
        self.failing_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `target` took a message.
    pub(super) fn accepted(&self, target: NodeId) {
        self.failing().remove(&target);
        self.refusals.accepted(target);
    }

    /// How long to wait before asking `target` again, after it refused this node's messages
    /// as another cluster's (`PeerRefusals::wait_before_asking`).
    pub(super) fn wait_before_asking(
        &self,
        target: NodeId,
        pause: std::time::Duration,
    ) -> Option<std::time::Duration> {
        self.refusals.wait_before_asking(target, pause)
    }

    /// A message to `target` failed, `why`, without an answer (not reached, or no answer in
    /// time), as `how` tells.
    pub(super) fn failed(&self, target: NodeId, why: &dyn std::fmt::Display, how: Unanswered) {
        match how {
            Unanswered::NotConnected => self.refusals.not_connecting(target),
            Unanswered::PlainAnswer => {
                self.tls_mismatch(target, false, Instant::now());
            }
            Unanswered::Other => {}
        }
        self.unreachable_at(target, why, Instant::now());
    }

    /// `target` and this node are on either side of TLS at `now` (`theirs`: it speaks TLS
    /// only, and this node plain HTTP; else the other way round); `true` if that was logged.
    /// Each side's messages failed in silence, or as a corrupt message.
    fn tls_mismatch(&self, target: NodeId, theirs: bool, now: Instant) -> bool {
        let Some(unlogged) = self.tls.note(target, (), now) else {
            return false;
        };
        let speaks = match theirs {
            true => "speaks TLS only, and this node plain HTTP",
            false => "answers in plain HTTP, and this node speaks TLS to the members",
        };
        tracing::warn!(
            target_node = target,
            unlogged,
            "node {target} {speaks}: every member has TLS (--tls-cert, --tls-key and --tls-ca), \
             or none; until the two agree, it takes none of this node's messages"
        );
        true
    }

    /// [`PeerFailures::failed`] at `now`; `true` if that was logged: once its messages have
    /// failed for [`UNANSWERED_FOR`].
    fn unreachable_at(&self, target: NodeId, why: &dyn std::fmt::Display, now: Instant) -> bool {
        let since = *self.failing().entry(target).or_insert(now);
        if now.saturating_duration_since(since) < UNANSWERED_FOR {
            return false;
        }
        let Some(unlogged) = self.unreachable.note(target, (), now) else {
            return false;
        };
        tracing::warn!(
            target_node = target,
            unlogged,
            "node {target} does not answer this node's messages ({why}); they are sent again \
             until it does"
        );
        true
    }

    /// `target` refused this node's token at `now`; `true` if that was logged.
    fn token_refused(&self, target: NodeId, now: Instant) -> bool {
        self.refusals.token_refused(target);
        let Some(unlogged) = self.token.note(target, (), now) else {
            return false;
        };
        tracing::warn!(
            target_node = target,
            unlogged,
            "node {target} refuses this node's token (401): every member needs the same --token \
             (METASERVER_TOKEN) and --member-token; until then it takes none of this node's messages"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_token_is_logged_once_per_member_for_a_while() {
        let refusals = PeerFailures::new(PeerRefusals::default());
        let t0 = Instant::now();
        assert!(refusals.token_refused(3, t0));
        assert!(!refusals.token_refused(3, t0 + std::time::Duration::from_secs(1)));
        assert!(refusals.token_refused(2, t0), "another member: logged");
        let later = t0 + crate::log_throttle::REPEAT_EVERY;
        assert!(refusals.token_refused(3, later), "again after a while");
        // Each refusal is noted for the status, logged or not.
        let recent = std::time::Duration::from_secs(60);
        let noted = refusals.refusals.token_within(recent);
        assert_eq!(noted, std::collections::BTreeSet::from([2, 3]));
    }

    #[test]
    fn a_member_that_does_not_answer_is_logged_once_in_a_while() {
        let failures = PeerFailures::new(PeerRefusals::default());
        let start = Instant::now();
        let why = "connection refused";
        // Said once its messages failed for a second.
        assert!(!failures.unreachable_at(3, &why, start));
        let t0 = start + UNANSWERED_FOR;
        assert!(failures.unreachable_at(3, &why, t0));
        for s in 1..30 {
            let at = t0 + Duration::from_secs(s);
            assert!(!failures.unreachable_at(3, &why, at), "{s} s");
        }
        assert!(failures.unreachable_at(3, &why, t0 + crate::log_throttle::REPEAT_EVERY));
        // A refused token is another line, and so is TLS on one side only.
        assert!(failures.token_refused(3, t0));
        assert!(failures.tls_mismatch(3, true, t0));
        assert!(!failures.tls_mismatch(3, false, t0 + Duration::from_secs(1)));
    }

    /// A message that timed out once, on a loaded host, is not news: an answer in between
    /// starts the count again.
    #[test]
    fn a_member_that_answers_between_failures_is_not_logged() {
        let failures = PeerFailures::new(PeerRefusals::default());
        let t0 = Instant::now();
        let why = "timeout after 75 ms";
        for ms in [0, 600, 1200, 1800, 2400] {
            let at = t0 + Duration::from_millis(ms);
            assert!(!failures.unreachable_at(2, &why, at), "{ms} ms");
            failures.accepted(2);
        }
        assert!(!failures.unreachable_at(2, &why, t0 + Duration::from_secs(3)));
        assert!(failures.unreachable_at(2, &why, t0 + Duration::from_secs(4)));
    }
}
