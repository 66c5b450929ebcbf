//! Which datanodes are alive: the leader's record of their heartbeats.
//!
//! Soft state, kept in memory on the leader only. A heartbeat is not a log entry: every
//! datanode beating every few seconds would be most of the log's writes and barriers, for a
//! fact that is stale a moment later anyway. The price is that a new leader knows nothing; it
//! calls a datanode it has not heard from `unknown` until it has been collecting heartbeats
//! for a whole timeout, and `down` only after that. A heartbeat counts for the incarnation
//! (epoch) that sent it: once a datanode registers again, the old incarnation's heartbeats no
//! longer make it alive.
//!
//! Plain code without a runtime or clock of its own: callers pass the term and the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the leader knows of one datanode's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatanodeState {
    /// Heard from, with its current epoch, within the timeout.
    Alive,
    /// Not heard from within the timeout, by a leader that has collected heartbeats for at
    /// least that long.
    Down,
    /// Not heard from yet, by a leader that has not collected heartbeats for a whole timeout.
    Unknown,
}

impl DatanodeState {
    /// The name used by the API.
    pub fn name(self) -> &'static str {
        match self {
            DatanodeState::Alive => "alive",
            DatanodeState::Down => "down",
            DatanodeState::Unknown => "unknown",
        }
    }
}

/// One datanode's liveness as the leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatanodeLiveness {
    /// Alive, down or unknown.
    pub state: DatanodeState,
    /// Since the last heartbeat of its current incarnation heard by this leader, if any.
    pub heard_ago: Option<Duration>,
}

/// The heartbeats a leader heard in its current term.
#[derive(Debug)]
pub struct Liveness {
    timeout: Duration,
    /// The term these heartbeats were heard in, and when this node started collecting them.
    term: Option<(u64, Instant)>,
    /// Datanode id -> (epoch, when heard).
    heard: HashMap<u64, (u64, Instant)>,
}

impl Liveness {
    /// A record that calls a datanode down after `timeout` without a heartbeat.
    pub fn new(timeout: Duration) -> Liveness {
        Liveness {
            timeout,
            term: None,
            heard: HashMap::new(),
        }
    }

    /// The timeout after which a silent datanode is down.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts collecting afresh when `term` is not the term the record was collected in: a
    /// leader of a new term (even this node again) knows nothing of the heartbeats before.
    fn lead(&mut self, term: u64, now: Instant) {
        if self.term.map(|(t, _)| t) != Some(term) {
            self.term = Some((term, now));
            self.heard.clear();
        }
    }

    /// Records a heartbeat of datanode `id`, incarnation `epoch`, heard while leading `term`.
    /// A former incarnation's heartbeat that arrives late never replaces a newer one's.
    pub fn heard(&mut self, term: u64, id: u64, epoch: u64, now: Instant) {
        self.lead(term, now);
        match self.heard.get(&id) {
            Some(&(newer, _)) if newer > epoch => {}
            _ => {
                self.heard.insert(id, (epoch, now));
            }
        }
    }

    /// Forgets datanode `id` (it is no longer registered).
    pub fn forget(&mut self, id: u64) {
        self.heard.remove(&id);
    }

    /// How long this leader has collected heartbeats in `term` (zero if it just started).
    pub fn collecting(&mut self, term: u64, now: Instant) -> Duration {
        self.lead(term, now);
        self.term
            .map(|(_, since)| now.saturating_duration_since(since))
            .unwrap_or_default()
    }

    /// The liveness of datanode `id`, whose current epoch is `epoch`, as of `now` in `term`.
    pub fn state(&mut self, term: u64, id: u64, epoch: u64, now: Instant) -> DatanodeLiveness {
        let collecting = self.collecting(term, now);
        let heard_ago = match self.heard.get(&id) {
            Some(&(e, at)) if e == epoch => Some(now.saturating_duration_since(at)),
            _ => None,
        };
        let state = match heard_ago {
            Some(ago) if ago <= self.timeout => DatanodeState::Alive,
            Some(_) => DatanodeState::Down,
            None if collecting >= self.timeout => DatanodeState::Down,
            None => DatanodeState::Unknown,
        };
        DatanodeLiveness { state, heard_ago }
    }

    /// How many datanodes were heard within the timeout in `term` (by any incarnation that
    /// was current when it was heard).
    pub fn alive(&mut self, term: u64, now: Instant) -> usize {
        self.lead(term, now);
        let timeout = self.timeout;
        self.heard
            .values()
            .filter(|(_, at)| now.saturating_duration_since(*at) <= timeout)
            .count()
    }

    /// Forgets every datanode `keep` says no to (removed ones), so the record stays as large
    /// as the registry.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.heard.retain(|&id, _| keep(id));
    }

    /// How many datanodes the record holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heard.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn alive_then_down_after_the_timeout() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        let s = l.state(3, 7, 100, t0 + secs(4));
        assert_eq!(s.state, DatanodeState::Alive);
        assert_eq!(s.heard_ago, Some(secs(4)));
        assert_eq!(l.state(3, 7, 100, t0 + TIMEOUT).state, DatanodeState::Alive);
        let s = l.state(3, 7, 100, t0 + secs(11));
        assert_eq!(s.state, DatanodeState::Down);
        assert_eq!(s.heard_ago, Some(secs(11)));
        // A heartbeat brings it back.
        l.heard(3, 7, 100, t0 + secs(12));
        assert_eq!(
            l.state(3, 7, 100, t0 + secs(13)).state,
            DatanodeState::Alive
        );
    }

    #[test]
    fn never_heard_is_unknown_for_one_timeout_then_down() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        let s = l.state(3, 7, 100, t0);
        assert_eq!(
            s,
            DatanodeLiveness {
                state: DatanodeState::Unknown,
                heard_ago: None
            }
        );
        assert_eq!(
            l.state(3, 7, 100, t0 + secs(9)).state,
            DatanodeState::Unknown
        );
        assert_eq!(l.state(3, 7, 100, t0 + TIMEOUT).state, DatanodeState::Down);
        assert_eq!(l.collecting(3, t0 + secs(12)), secs(12));
    }

    #[test]
    fn heartbeats_of_a_former_incarnation_do_not_count() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        // Registered again (epoch 150): not heard in this incarnation.
        let s = l.state(3, 7, 150, t0 + secs(1));
        assert_eq!(
            s,
            DatanodeLiveness {
                state: DatanodeState::Unknown,
                heard_ago: None
            }
        );
        assert_eq!(l.state(3, 7, 150, t0 + secs(10)).state, DatanodeState::Down);
        l.heard(3, 7, 150, t0 + secs(10));
        assert_eq!(
            l.state(3, 7, 150, t0 + secs(11)).state,
            DatanodeState::Alive
        );
    }

    #[test]
    fn a_late_heartbeat_of_a_former_incarnation_changes_nothing() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 150, t0);
        l.heard(3, 7, 100, t0 + secs(1));
        let s = l.state(3, 7, 150, t0 + secs(2));
        assert_eq!(s.state, DatanodeState::Alive);
        assert_eq!(s.heard_ago, Some(secs(2)));
        l.forget(7);
        assert_eq!(l.state(3, 7, 150, t0 + secs(2)).heard_ago, None);
    }

    #[test]
    fn a_new_term_starts_from_nothing() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        l.heard(3, 8, 101, t0);
        assert_eq!(l.state(3, 7, 100, t0 + secs(20)).state, DatanodeState::Down);
        // Leading again in term 5: what term 3 heard is gone, and the grace starts again.
        let s = l.state(5, 7, 100, t0 + secs(20));
        assert_eq!(s.state, DatanodeState::Unknown);
        assert_eq!(l.len(), 0);
        l.heard(5, 8, 101, t0 + secs(21));
        assert_eq!(
            l.state(5, 8, 101, t0 + secs(22)).state,
            DatanodeState::Alive
        );
        assert_eq!(l.state(5, 7, 100, t0 + secs(30)).state, DatanodeState::Down);
    }

    #[test]
    fn alive_counts_the_datanodes_heard_within_the_timeout() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 1, 1, t0);
        l.heard(3, 2, 1, t0 + secs(5));
        assert_eq!(l.alive(3, t0 + secs(6)), 2);
        assert_eq!(l.alive(3, t0 + secs(12)), 1);
        assert_eq!(l.alive(3, t0 + secs(16)), 0);
        l.heard(3, 1, 1, t0 + secs(16));
        assert_eq!(l.alive(4, t0 + secs(16)), 0, "a new term heard nobody yet");
    }

    #[test]
    fn removed_datanodes_are_forgotten() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        for id in 1..=5 {
            l.heard(3, id, 1, t0);
        }
        l.retain(|id| id % 2 == 1);
        assert_eq!(l.len(), 3);
        assert_eq!(l.state(3, 2, 1, t0).state, DatanodeState::Unknown);
        assert_eq!(l.state(3, 3, 1, t0).state, DatanodeState::Alive);
    }
}
