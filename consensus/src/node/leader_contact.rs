//! When this node last heard from each leader. openraft keeps naming a leader that fell silent
//! (killed, cut off) for as long as no other is elected, which takes a quorum: a follower left
//! without one would name a dead leader for ever, and look ready. Its status names no leader
//! once the leader has been silent for longer than a live one ever is (`status_report.rs`), and
//! requests are no longer sent to it ([`MetaNode::silent_leader`](super::MetaNode::silent_leader)).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::types::NodeId;

/// The leaders' messages this node took, and when it opened.
#[derive(Debug)]
pub(super) struct LeaderContact {
    opened: Instant,
    /// When the last message of each leader was taken. Each leader's own: a node takes the
    /// next leader's first message a moment before its metrics stop naming the last one, and
    /// that one must not look silent since the node opened meanwhile.
    last: HashMap<NodeId, Instant>,
}

impl LeaderContact {
    /// A node that opened at `now`.
    pub(super) fn new(now: Instant) -> Self {
        LeaderContact {
            opened: now,
            last: HashMap::new(),
        }
    }

    /// A message of `leader` was taken at `now`.
    pub(super) fn note(&mut self, leader: NodeId, now: Instant) {
        self.last.insert(leader, now);
    }

    /// How long `leader` has been silent at `now`: since its last message, or since this node
    /// opened if it took none (a node that just started gives its leader time to reach it).
    pub(super) fn silence(&self, leader: NodeId, now: Instant) -> Duration {
        let since = self.last.get(&leader).copied().unwrap_or(self.opened);
        now.saturating_duration_since(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_silent_from_its_last_message() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let at = |s: u64| t0 + secs(s);
        let mut c = LeaderContact::new(t0);
        // Just opened: the leader it remembers is silent from the opening.
        assert_eq!(c.silence(1, at(2)), secs(2));
        c.note(1, at(10));
        assert_eq!(c.silence(1, at(12)), secs(2));
        assert_eq!(c.silence(1, at(9)), secs(0), "a clock read before the note");
        // Another leader's message says nothing of this one.
        assert_eq!(c.silence(2, at(10)), secs(10));
        c.note(2, at(20));
        assert_eq!(c.silence(2, at(21)), secs(1));
        assert_eq!(c.silence(1, at(21)), secs(11), "since its own last message");
    }
}
