//! When this node last heard from its leader. openraft keeps naming a leader that fell silent
//! (killed, cut off) for as long as no other is elected, which takes a quorum: a follower left
//! without one would name a dead leader for ever, and look ready. Its status names no leader
//! once the leader has been silent for longer than a live one ever is (`status_report.rs`).

use std::time::{Duration, Instant};

use crate::types::NodeId;

/// The leader's messages this node took, and when it opened.
#[derive(Debug)]
pub(super) struct LeaderContact {
    opened: Instant,
    /// The leader of the last message taken, and when it came.
    last: Option<(NodeId, Instant)>,
}

impl LeaderContact {
    /// A node that opened at `now`.
    pub(super) fn new(now: Instant) -> Self {
        LeaderContact {
            opened: now,
            last: None,
        }
    }

    /// A message of `leader` was taken at `now`.
    pub(super) fn note(&mut self, leader: NodeId, now: Instant) {
        self.last = Some((leader, now));
    }

    /// Whether `leader` was heard from within `window` before `now`. A leader not heard from
    /// since this node opened counts from the opening: a node that just started gives its
    /// leader that long to reach it.
    pub(super) fn heard_within(&self, leader: NodeId, window: Duration, now: Instant) -> bool {
        let since = match self.last {
            Some((l, at)) if l == leader => at,
            _ => self.opened,
        };
        now.saturating_duration_since(since) <= window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_heard_for_a_window_after_its_last_message() {
        let t0 = Instant::now();
        let window = Duration::from_secs(2);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut c = LeaderContact::new(t0);
        // Just opened: the leader it remembers has the window to reach it.
        assert!(c.heard_within(1, window, at(2)));
        assert!(!c.heard_within(1, window, at(3)));
        c.note(1, at(10));
        assert!(c.heard_within(1, window, at(12)));
        assert!(!c.heard_within(1, window, at(13)));
        // Another leader's message says nothing of this one.
        assert!(!c.heard_within(2, window, at(10)));
        c.note(2, at(20));
        assert!(c.heard_within(2, window, at(21)));
        assert!(!c.heard_within(1, window, at(21)));
    }
}
