//! When this node last heard from each leader. openraft keeps naming a leader that fell silent
//! (killed, cut off) for as long as no other is elected, which takes a quorum: a follower left
//! without one would name a dead leader for ever, and look ready. Its status names no leader
//! once the leader has been silent for longer than a live one ever is (`status_report.rs`), and
//! requests are no longer sent to it ([`MetaNode::silent_leader`](super::MetaNode::silent_leader)).
//!
//! Time this node itself stood still (a paused process, a stalled VM) is nobody's silence: the
//! leader's messages wait in the socket meanwhile. A node that resumed would otherwise blame a
//! healthy leader for its own pause, and answer the requests it holds `no_leader` or
//! `outcome_unknown` before it read the leader's answers. The silence watch ticks every
//! heartbeat interval ([`LeaderContact::tick`]); a tick that comes much later than that marks a
//! stall, and silence counts from its end.

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
    /// When this node last ticked, and when it last resumed from a stall.
    ticked: Instant,
    resumed: Instant,
    /// Since when openraft names no leader (`None` while it names one).
    leaderless_since: Option<Instant>,
}

impl LeaderContact {
    /// A node that opened at `now`.
    pub(super) fn new(now: Instant) -> Self {
        LeaderContact {
            opened: now,
            last: HashMap::new(),
            named: None,
            ticked: now,
            resumed: now,
            leaderless_since: Some(now),
        }
    }

    /// Openraft names `leader` (or none) as of `now`.
    pub(super) fn named(&mut self, leader: Option<NodeId>, now: Instant) {
        match leader {
            Some(_) => self.leaderless_since = None,
            None => {
                self.leaderless_since.get_or_insert(now);
            }
        }
    }

    /// How long openraft has named no leader at `now`, if it names none: since it named the
    /// last, or since this node opened, but at most since this node last resumed from a stall
    /// (as [`LeaderContact::silence`]).
    pub(super) fn leaderless_for(&mut self, now: Instant, stall: Duration) -> Option<Duration> {
        self.tick(now, stall);
        let since = self.leaderless_since?;
        Some(now.saturating_duration_since(since.max(self.resumed)))
    }

    /// This node runs at `now`; a tick more than `stall` after the last one means it stood
    /// still in between, and silence counts from `now`.
    pub(super) fn tick(&mut self, now: Instant, stall: Duration) {
        if now.saturating_duration_since(self.ticked) > stall {
            self.resumed = now;
        }
        self.ticked = self.ticked.max(now);
    }

    /// A message of `leader` was taken at `now`.
    pub(super) fn note(&mut self, leader: NodeId, now: Instant) {
        self.last.insert(leader, now);
    }

    /// Whether a message of `leader` was taken since this node opened.
    pub(super) fn heard_from(&self, leader: NodeId) -> bool {
        self.last.contains_key(&leader)
    }

    /// Whether this node stood still lately, at `now`: it resumed from a stall (a gap of more
    /// than `stall` between two ticks) within `within`, or it stands still now (its next tick
    /// is more than `stall` late: a node that just resumed runs what it holds before the tick).
    pub(super) fn stalled_lately(&self, now: Instant, stall: Duration, within: Duration) -> bool {
        let late = now.saturating_duration_since(self.ticked) > stall;
        let resumed = self.resumed != self.opened;
        late || (resumed && now.saturating_duration_since(self.resumed) < within)
    }

    /// How long `leader`, named as the leader now, has been silent at `now`: since its last
    /// message, or since this node opened if it took none (a node that just started gives its
    /// leader time to reach it), but at most since it was first seen named, and since this
    /// node last resumed from a stall (a look before the first tick after one is a tick).
    pub(super) fn silence(&mut self, leader: NodeId, now: Instant, stall: Duration) -> Duration {
        self.tick(now, stall);
        let named_at = match self.named {
            Some((named, at)) if named == leader => at,
            _ => self.named.insert((leader, now)).1,
        };
        let heard = self.last.get(&leader).copied().unwrap_or(self.opened);
        now.saturating_duration_since(heard.max(named_at).max(self.resumed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longer than any test here runs: no tick marks a stall.
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn no_leader_is_named_from_the_open_or_from_when_the_last_was_named() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut c = LeaderContact::new(t0);
        assert_eq!(
            c.leaderless_for(at(10), DAY),
            Some(Duration::from_millis(10))
        );
        c.named(Some(1), at(20));
        assert_eq!(c.leaderless_for(at(30), DAY), None);
        c.named(None, at(40));
        // Metrics that change again while none is named do not restart the count.
        c.named(None, at(50));
        assert_eq!(
            c.leaderless_for(at(60), DAY),
            Some(Duration::from_millis(20))
        );
        // A stall of this node is nobody's fault: the count starts again when it resumes.
        let stall = Duration::from_millis(100);
        c.tick(at(60), stall);
        assert_eq!(c.leaderless_for(at(500), stall), Some(Duration::ZERO));
    }

    #[test]
    fn a_leader_is_silent_from_its_last_message_or_from_when_it_was_named() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let at = |s: u64| t0 + secs(s);
        let mut c = LeaderContact::new(t0);
        // Named from the opening, never heard: silent since then.
        assert_eq!(c.silence(1, at(0), DAY), secs(0));
        assert_eq!(c.silence(1, at(2), DAY), secs(2));
        c.note(1, at(10));
        assert_eq!(c.silence(1, at(12), DAY), secs(2));
        assert_eq!(
            c.silence(1, at(9), DAY),
            secs(0),
            "a clock read before the note"
        );
        // The next leader's first message, while the metrics still name the last one: that
        // one is silent since its own last message.
        c.note(2, at(11));
        assert_eq!(c.silence(1, at(13), DAY), secs(3));
        // A leader named a while after the opening and never heard (a paused node that
        // resumes and finds another elected) is silent since it was named, not the opening.
        let mut c = LeaderContact::new(t0);
        assert_eq!(c.silence(3, at(30), DAY), secs(0));
        assert_eq!(c.silence(3, at(31), DAY), secs(1));
        c.note(3, at(32));
        assert_eq!(c.silence(3, at(35), DAY), secs(3));
    }

    /// Time this node stood still is nobody's silence: a tick (or a look) long after the last
    /// one marks a stall, and silence counts from its end; regular ticks mark none.
    #[test]
    fn a_stall_of_this_node_is_not_its_leaders_silence() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |m: u64| t0 + ms(m);
        let stall = ms(1000);
        let mut c = LeaderContact::new(t0);
        c.note(1, at(0));
        assert_eq!(c.silence(1, at(0), stall), ms(0), "named from the start");
        // Ticks every 100 ms while the leader says nothing: its silence grows.
        for m in (100..=3000).step_by(100) {
            c.tick(at(m), stall);
        }
        assert_eq!(c.silence(1, at(3000), stall), ms(3000));
        c.note(1, at(3000));
        // This node stood still for 10 s: the next look (before any tick) finds no silence.
        assert_eq!(c.silence(1, at(13_000), stall), ms(0));
        // Nor after a tick that came late, then a while without the leader.
        c.note(1, at(13_000));
        c.tick(at(20_000), stall);
        assert_eq!(c.silence(1, at(20_500), stall), ms(500));
    }

    /// A leader that stood still lately is not taken for one without a quorum: a paused leader
    /// that resumes lacks the acknowledgements it could not read, and learns a moment later
    /// that another leads; the requests it held were answered 503 `no_leader` meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_that_stood_still_lately_is_not_taken_for_one_without_a_quorum() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::NodeConfig::new(1, "local-1", dir.path().join("node-1"));
        let network = crate::transport::LocalRouter::new().network(1);
        let node = crate::MetaNode::open(cfg, network).await.unwrap();
        node.lead_alone().await;
        // Once the node notes when it took office (its metrics watch does, a moment after).
        let deadline = Instant::now() + Duration::from_secs(20);
        while !node.led_before(Instant::now()) {
            assert!(Instant::now() < deadline, "never noted its office");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let asked = Instant::now();
        assert!(node.lacks_quorum_since(asked));
        // Its ticks stopped 10 s ago: it stands still now (its next tick marks the stall).
        node.inner.leader_contact.lock().ticked = Instant::now() - Duration::from_secs(10);
        assert!(!node.lacks_quorum_since(asked));
        node.shutdown().await.unwrap();
    }

    /// A node stood still lately while its tick is late, and for a while after it resumed;
    /// not on regular ticks, nor for being opened a moment ago.
    #[test]
    fn a_node_stood_still_lately_while_its_tick_is_late_and_a_while_after() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |m: u64| t0 + ms(m);
        let (stall, within) = (ms(1000), ms(2000));
        let mut c = LeaderContact::new(t0);
        assert!(!c.stalled_lately(at(0), stall, within), "just opened");
        for m in (100..=3000).step_by(100) {
            c.tick(at(m), stall);
            assert!(!c.stalled_lately(at(m), stall, within), "{m}");
        }
        // Paused for 7 s: before its first tick, and after it for `within`.
        assert!(c.stalled_lately(at(10_000), stall, within));
        c.tick(at(10_005), stall);
        for m in (10_100..=13_000).step_by(100) {
            c.tick(at(m), stall);
            assert_eq!(c.stalled_lately(at(m), stall, within), m < 12_005, "{m}");
        }
    }
}
