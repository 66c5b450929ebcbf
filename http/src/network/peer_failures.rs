//! What a node makes of its members' refusals of its Raft messages, and of failures to reach
//! them: one that refuses them as another cluster's, or for its token (401), is noted for the
//! node's status (`PeerRefusals`); one that refuses its token, and one that cannot be reached,
//! are logged, once per member and then at most every 30 s with the count in between.
//!
//! Without the token line, a member restarted with another `--token` looked merely slow: the
//! leader's messages to it failed in silence, and its own requests to the leader failed as
//! internal errors. The unreachable line stands for openraft's replication warnings, two per
//! retry (about two a second per member that is down), which the binary's log filter leaves
//! out.

use std::sync::Arc;
use std::time::Instant;

use meta_consensus::{NodeId, PeerRefusals};

use crate::cluster_identity;
use crate::log_throttle::LogThrottle;

/// The refusals and failures of this node's messages, shared by its connections to every
/// member.
#[derive(Debug, Clone)]
pub(super) struct PeerFailures {
    refusals: PeerRefusals,
    token: Arc<LogThrottle<NodeId>>,
    unreachable: Arc<LogThrottle<NodeId>>,
}

impl PeerFailures {
    pub(super) fn new(refusals: PeerRefusals) -> Self {
        PeerFailures {
            refusals,
            token: Arc::default(),
            unreachable: Arc::default(),
        }
    }

    /// Notes `target`'s answer with `status` and `body` to one of this node's messages.
    pub(super) fn note(&self, target: NodeId, status: reqwest::StatusCode, body: &[u8]) {
        if status.is_success() {
            self.refusals.accepted(target);
        } else if cluster_identity::refuses_as_other_cluster(status, body) {
            self.refusals.refused(target);
        } else if status == reqwest::StatusCode::UNAUTHORIZED {
            self.token_refused(target, Instant::now());
        }
    }

    /// `target` took a message.
    pub(super) fn accepted(&self, target: NodeId) {
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
    /// time).
    pub(super) fn failed(&self, target: NodeId, why: &dyn std::fmt::Display) {
        self.unreachable_at(target, why, Instant::now());
    }

    /// [`PeerFailures::failed`] at `now`; `true` if that was logged.
    fn unreachable_at(&self, target: NodeId, why: &dyn std::fmt::Display, now: Instant) -> bool {
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
        let t0 = Instant::now();
        let why = "connection refused";
        assert!(failures.unreachable_at(3, &why, t0));
        for s in 1..30 {
            let at = t0 + std::time::Duration::from_secs(s);
            assert!(!failures.unreachable_at(3, &why, at), "{s} s");
        }
        assert!(failures.unreachable_at(3, &why, t0 + crate::log_throttle::REPEAT_EVERY));
        // A refused token is another line.
        assert!(failures.token_refused(3, t0));
    }
}
