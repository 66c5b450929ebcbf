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
    /// The leader last seen named, and when it was first seen named: one this node learned of
    /// a moment ago (a paused leader that resumes and finds another elected) has had no time
    /// to reach it, and is not silent since this node opened.
    named: Option<(NodeId, Instant)>,
}

impl LeaderContact {
    /// A node that opened at `now`.
    pub(super) fn new(now: Instant) -> Self {
        LeaderContact {
            opened: now,
            last: HashMap::new(),
            named: None,
        }
    }

    /// A message of `leader` was taken at `now`.
    pub(super) fn note(&mut self, leader: NodeId, now: Instant) {
        self.last.insert(leader, now);
    }

    /// How long `leader`, named as the leader now, has been silent at `now`: since its last
    /// message, or since this node opened if it took none (a node that just started gives its
    /// leader time to reach it), but at most since it was first seen named.
    pub(super) fn silence(&mut self, leader: NodeId, now: Instant) -> Duration {
        let named_at = match self.named {
            Some((named, at)) if named == leader => at,
            _ => self.named.insert((leader, now)).1,
        };
        let heard = self.last.get(&leader).copied().unwrap_or(self.opened);
        now.saturating_duration_since(heard.max(named_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_silent_from_its_last_message_or_from_when_it_was_named() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let at = |s: u64| t0 + secs(s);
        let mut c = LeaderContact::new(t0);
        // Named from the opening, never heard: silent since then.
        assert_eq!(c.silence(1, at(0)), secs(0));
        assert_eq!(c.silence(1, at(2)), secs(2));
        c.note(1, at(10));
        assert_eq!(c.silence(1, at(12)), secs(2));
        assert_eq!(c.silence(1, at(9)), secs(0), "a clock read before the note");
        // The next leader's first message, while the metrics still name the last one: that
        // one is silent since its own last message.
        c.note(2, at(11));
        assert_eq!(c.silence(1, at(13)), secs(3));
        // A leader named a while after the opening and never heard (a paused node that
        // resumes and finds another elected) is silent since it was named, not the opening.
        let mut c = LeaderContact::new(t0);
        assert_eq!(c.silence(3, at(30)), secs(0));
        assert_eq!(c.silence(3, at(31)), secs(1));
        c.note(3, at(32));
        assert_eq!(c.silence(3, at(35)), secs(3));
    }
}
