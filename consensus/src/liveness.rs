//! Which datanodes are alive: the leader's record of their heartbeats.
//!
//! Soft state, kept in memory on the leader only. A heartbeat is not a log entry: every
//! datanode beating every few seconds would be most of the log's writes and barriers, for a
//! fact that is stale a moment later anyway. The price is that a new leader knows nothing; it
//! calls a datanode it has not heard from `unknown` until it has been collecting heartbeats
//! for a whole timeout, and `down` only after that. A heartbeat counts for the incarnation
//! that sent it: once a datanode registers again, the old incarnation's heartbeats no longer
//! make it alive. A registration the leader applied gives the new incarnation the same grace:
//! `unknown` for a whole timeout before it is `down` without a heartbeat (a datanode that just
//! started, or one a restore registered on its behalf, has not had the time to send one).
//!
//! Incarnations are ordered by their registration's log index (`registered_index`), not by
//! epoch: a datanode removed and registered again gets an epoch that may be lower than its
//! former one (a restore may have raised that), while its registration index is always higher.
//!
//! A leader that did not run for a while (its process paused, or starved of the CPU) heard
//! nothing meanwhile: that time does not count as listened. A ticker calls [`Liveness::tick`]
//! every [`TICK`]; a gap of more than [`STALL`] since the last tick moves every record, and the
//! start of collecting, that much later, so that a datanode is not called down for heartbeats
//! the leader could not hear.
//!
//! Plain code without a runtime or clock of its own: callers pass the term and the time.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeBounds;
use std::time::{Duration, Instant};

/// How often the node's ticker calls [`Liveness::tick`].
pub const TICK: Duration = Duration::from_millis(100);
/// A gap between ticks longer than this is a stall: the node did not run.
pub const STALL: Duration = Duration::from_millis(500);

/// What the leader knows of one datanode's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatanodeState {
    /// Heard from, in its current incarnation, within the timeout.
    Alive,
    /// Not heard from within the timeout, by a leader that has collected heartbeats for at
    /// least that long.
    Down,
    /// Not heard from yet, by a leader that has not collected heartbeats for a whole timeout,
    /// or in an incarnation this leader saw registered less than a timeout ago.
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
    /// Datanode id -> the newest incarnation heard; by id, so that a page of the report
    /// forgets what is stale among its own ids only.
    heard: BTreeMap<u64, Heard>,
    /// Datanode id -> how many registrations of it this leader proposed and openraft has not
    /// answered yet. A registration is applied, and so read, a moment before its proposer
    /// hears of it and records it ([`Liveness::registered`]); meanwhile the datanode is
    /// `unknown`, not `down`.
    proposing: HashMap<u64, usize>,
    /// The last tick, once the ticker runs.
    ticked: Option<Instant>,
}

/// The heartbeat last heard of one datanode, or its registration.
#[derive(Clone, Copy, Debug)]
struct Heard {
    /// The log index of the incarnation's registration: it names the incarnation (each
    /// registration has its own epoch too).
    registered_index: u64,
    /// The last heartbeat; the registration's time while `beat` is false.
    at: Instant,
    /// Whether a heartbeat of this incarnation was heard (else only its registration).
    beat: bool,
}

impl Liveness {
    /// A record that calls a datanode down after `timeout` without a heartbeat.
    pub fn new(timeout: Duration) -> Liveness {
        Liveness {
            timeout,
            term: None,
            heard: BTreeMap::new(),
            proposing: HashMap::new(),
            ticked: None,
        }
    }

    /// The ticker's call, every [`TICK`].
    pub fn tick(&mut self, now: Instant) {
        self.observe(now);
        self.ticked = Some(self.ticked.map_or(now, |t| t.max(now)));
    }

    /// Moves every record, and the start of collecting, later by the time this node did not
    /// run, when `now` comes more than [`STALL`] after the last tick.
    fn observe(&mut self, now: Instant) {
        let Some(ticked) = self.ticked else {
            return;
        };
        let gap = now.saturating_duration_since(ticked);
        if gap <= STALL {
            return;
        }
        let deaf = gap - TICK;
        let later = |at: Instant| (at + deaf).min(now);
        if let Some((_, since)) = &mut self.term {
            *since = later(*since);
        }
        for h in self.heard.values_mut() {
            h.at = later(h.at);
        }
        self.ticked = Some(now);
    }

    /// The timeout after which a silent datanode is down.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The term the record is collected in, if any.
    fn term_collected(&self) -> Option<u64> {
        self.term.map(|(t, _)| t)
    }

    /// Starts collecting afresh when `term` is newer than the term the record was collected in:
    /// a leader of a new term (even this node again) knows nothing of the heartbeats before. An
    /// older term (a caller that read it just before the term changed) wipes nothing. The node
    /// calls it when it takes office (`now`: when it saw itself lead), so a leader asked a
    /// timeout later has listened for that long; every other call here starts the clock too,
    /// should that call come first.
    pub fn lead(&mut self, term: u64, now: Instant) {
        self.observe(now);
        if self.term_collected().is_none_or(|t| t < term) {
            self.term = Some((term, now));
            self.heard.clear();
            self.proposing.clear();
        }
    }

    /// Records a heartbeat of datanode `id`, of the incarnation registered at log index
    /// `registered_index`, heard while leading `term`. A former incarnation's heartbeat that
    /// arrives late never replaces a newer one's.
    pub fn heard(&mut self, term: u64, id: u64, registered_index: u64, now: Instant) {
        self.lead(term, now);
        match self.heard.get_mut(&id) {
            Some(old) if old.registered_index > registered_index => {}
            Some(old) if old.registered_index == registered_index && old.beat => {
                old.at = old.at.max(now)
            }
            _ => {
                self.heard.insert(
                    id,
                    Heard {
                        registered_index,
                        at: now,
                        beat: true,
                    },
                );
            }
        }
    }

    /// Records that this leader applied the registration of datanode `id` at log index
    /// `registered_index` while leading `term`: the incarnation is `unknown`, not `down`, for a
    /// timeout from `now` unless a heartbeat comes. Changes nothing for an incarnation heard
    /// from already, or a newer one.
    pub fn registered(&mut self, term: u64, id: u64, registered_index: u64, now: Instant) {
        self.lead(term, now);
        if self
            .heard
            .get(&id)
            .is_some_and(|h| h.registered_index >= registered_index)
        {
            return;
        }
        self.heard.insert(
            id,
            Heard {
                registered_index,
                at: now,
                beat: false,
            },
        );
    }

    /// This leader proposes a registration of datanode `id` in `term`: until
    /// [`Liveness::proposed`], a datanode whose current incarnation it has no record of is
    /// `unknown`, not `down` (the registration may be applied before it is recorded).
    pub fn proposing(&mut self, term: u64, id: u64, now: Instant) {
        self.lead(term, now);
        // One of an older term would never be answered in this one (`proposed`).
        if self.term_collected() == Some(term) {
            *self.proposing.entry(id).or_default() += 1;
        }
    }

    /// openraft answered a registration of datanode `id` that this leader proposed in `term`
    /// (and, if it committed, the proposer recorded it). A term that ended meanwhile forgot it.
    pub fn proposed(&mut self, term: u64, id: u64) {
        if self.term_collected() != Some(term) {
            return;
        }
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.proposing.entry(id) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Forgets datanode `id`, which a read of the registry found unregistered, where the read
    /// saw every entry up to log index `seen_upto`. Only incarnations registered at or below
    /// it are forgotten: one registered later is not the one the read found gone.
    pub fn forget(&mut self, id: u64, seen_upto: u64) {
        if self
            .heard
            .get(&id)
            .is_some_and(|h| h.registered_index <= seen_upto)
        {
            self.heard.remove(&id);
        }
    }

    /// How long this leader has collected heartbeats in `term` (zero if it just started).
    pub fn collecting(&mut self, term: u64, now: Instant) -> Duration {
        self.lead(term, now);
        self.term
            .map(|(_, since)| now.saturating_duration_since(since))
            .unwrap_or_default()
    }

    /// The liveness of datanode `id`, whose current incarnation was registered at log index
    /// `registered_index`, as of `now` in `term`.
    pub fn state(
        &mut self,
        term: u64,
        id: u64,
        registered_index: u64,
        now: Instant,
    ) -> DatanodeLiveness {
        let collecting = self.collecting(term, now);
        // The datanode registered again after the caller's read of the registry: what was
        // heard of that newer incarnation decides (a registration a moment ago is not down).
        if let Some(h) = self
            .heard
            .get(&id)
            .filter(|h| h.registered_index > registered_index)
        {
            let ago = now.saturating_duration_since(h.at);
            let alive = h.beat && ago <= self.timeout;
            return DatanodeLiveness {
                state: if alive {
                    DatanodeState::Alive
                } else {
                    DatanodeState::Unknown
                },
                heard_ago: h.beat.then_some(ago),
            };
        }
        let current = self
            .heard
            .get(&id)
            .filter(|h| h.registered_index == registered_index);
        let heard_ago = current
            .filter(|h| h.beat)
            .map(|h| now.saturating_duration_since(h.at));
        let registered_ago = current
            .filter(|h| !h.beat)
            .map(|h| now.saturating_duration_since(h.at));
        let state = match (heard_ago, registered_ago) {
            (Some(ago), _) if ago <= self.timeout => DatanodeState::Alive,
            (Some(_), _) => DatanodeState::Down,
            (None, Some(ago)) if ago <= self.timeout => DatanodeState::Unknown,
            (None, _) if self.proposing.contains_key(&id) => DatanodeState::Unknown,
            (None, _) if collecting >= self.timeout => DatanodeState::Down,
            (None, _) => DatanodeState::Unknown,
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
            .filter(|h| h.beat && now.saturating_duration_since(h.at) <= timeout)
            .count()
    }

    /// Forgets what a read of the registry's datanodes with ids `within`, which saw every entry
    /// up to log index `seen_upto`, shows to be stale, so the record stays as large as the
    /// registry. `current` gives the registration index of a datanode's current incarnation,
    /// `None` if it is not registered. Forgets former incarnations and removed datanodes, but
    /// keeps incarnations registered after the read (heard since).
    pub fn retain(
        &mut self,
        within: impl RangeBounds<u64>,
        seen_upto: u64,
        mut current: impl FnMut(u64) -> Option<u64>,
    ) {
        let stale: Vec<u64> = self
            .heard
            .range(within)
            .filter(|(&id, h)| match current(id) {
                Some(registered_index) => h.registered_index < registered_index,
                None => h.registered_index <= seen_upto,
            })
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.heard.remove(&id);
        }
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
    fn time_this_node_did_not_run_is_not_listened() {
        let t0 = Instant::now();
        let timeout = Duration::from_millis(1200);
        let mut l = Liveness::new(timeout);
        l.lead(3, t0);
        let mut now = t0;
        let mut ticks_until = |l: &mut Liveness, end: Instant| {
            while now + TICK <= end {
                now += TICK;
                l.tick(now);
            }
        };
        ticks_until(&mut l, t0 + secs(2));
        l.heard(3, 7, 100, t0 + secs(2));
        // Paused 1.4 s: no tick; a report right after the pause, before any tick.
        let resumed = t0 + secs(2) + Duration::from_millis(1500);
        let s = l.state(3, 7, 100, resumed);
        assert_eq!(s.state, DatanodeState::Alive, "{s:?}");
        assert_eq!(s.heard_ago, Some(TICK));
        // Not heard for a timeout of running since: down, and a datanode never heard is too.
        ticks_until(&mut l, resumed + timeout);
        let s = l.state(3, 7, 100, resumed + timeout + TICK);
        assert_eq!(s.state, DatanodeState::Down, "{s:?}");
        assert_eq!(l.state(3, 8, 100, resumed).state, DatanodeState::Down);
        // Without a ticker, time between calls is all listened.
        let mut quiet = Liveness::new(timeout);
        quiet.heard(3, 7, 100, t0);
        let s = quiet.state(3, 7, 100, t0 + secs(2));
        assert_eq!(s.state, DatanodeState::Down);
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
    fn a_datanode_that_registered_again_after_the_read_is_not_down() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 50, t0);
        // Collecting for long; the read saw incarnation 50, and meanwhile 7 registered again
        // at 120 (and, in the second case, sent its first heartbeat).
        let t1 = t0 + secs(30);
        l.registered(3, 7, 120, t1);
        assert_eq!(l.state(3, 7, 50, t1).state, DatanodeState::Unknown);
        l.heard(3, 7, 120, t1);
        let s = l.state(3, 7, 50, t1 + secs(1));
        assert_eq!(
            (s.state, s.heard_ago),
            (DatanodeState::Alive, Some(secs(1)))
        );
    }

    #[test]
    fn a_registration_gives_its_incarnation_a_timeout_of_grace() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        // Collecting for long: datanode 7 registers again at index 150 and 8 for the first time.
        let t1 = t0 + secs(60);
        l.registered(3, 7, 150, t1);
        l.registered(3, 8, 151, t1);
        for id in [(7, 150), (8, 151)] {
            let s = l.state(3, id.0, id.1, t1 + secs(9));
            assert_eq!((s.state, s.heard_ago), (DatanodeState::Unknown, None));
            assert_eq!(
                l.state(3, id.0, id.1, t1 + secs(11)).state,
                DatanodeState::Down
            );
        }
        assert_eq!(l.alive(3, t1), 0, "a registration is no heartbeat");
        // A heartbeat makes it alive; a registration seen late changes nothing then.
        l.heard(3, 8, 151, t1 + secs(12));
        l.registered(3, 8, 151, t1 + secs(13));
        let s = l.state(3, 8, 151, t1 + secs(13));
        assert_eq!(
            (s.state, s.heard_ago),
            (DatanodeState::Alive, Some(secs(1)))
        );
        // An older incarnation's registration changes nothing either.
        l.registered(3, 7, 100, t1 + secs(13));
        assert_eq!(l.state(3, 7, 150, t1 + secs(15)).state, DatanodeState::Down);
    }

    #[test]
    fn heartbeats_of_a_former_incarnation_do_not_count() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        // Registered again (at index 150): not heard in this incarnation.
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
        l.forget(7, 150);
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
        // A page's read of ids 1 to 3 forgets datanode 2 only.
        l.retain(1..=3, 1, |id| (id % 2 == 1).then_some(1));
        assert_eq!(l.len(), 4);
        l.retain(.., 1, |id| (id % 2 == 1).then_some(1));
        assert_eq!(l.len(), 3);
        assert_eq!(l.state(3, 2, 1, t0).state, DatanodeState::Unknown);
        assert_eq!(l.state(3, 3, 1, t0).state, DatanodeState::Alive);
    }

    #[test]
    fn a_new_incarnation_with_a_lower_epoch_replaces_the_old_one() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        // Registered at index 40 with a raised epoch, then removed and registered again at
        // index 90, whose epoch (90) is far below.
        l.heard(3, 7, 40, t0);
        l.heard(3, 7, 90, t0 + secs(1));
        let s = l.state(3, 7, 90, t0 + secs(2));
        assert_eq!(s.state, DatanodeState::Alive);
        assert_eq!(s.heard_ago, Some(secs(1)));
        // It stays alive while it beats, past the old heartbeat's timeout.
        l.heard(3, 7, 90, t0 + secs(15));
        assert_eq!(l.state(3, 7, 90, t0 + secs(16)).state, DatanodeState::Alive);
    }

    #[test]
    fn a_late_heartbeat_of_the_old_incarnation_does_not_replace_the_new_one() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 90, t0);
        // The old incarnation's epoch is higher, its registration older.
        l.heard(3, 7, 40, t0 + secs(5));
        let s = l.state(3, 7, 90, t0 + secs(6));
        assert_eq!(s.state, DatanodeState::Alive);
        assert_eq!(s.heard_ago, Some(secs(6)));
        // A caller whose read still showed incarnation 40 is told of 90, heard at t0.
        assert_eq!(l.state(3, 7, 40, t0 + secs(6)), s);
    }

    #[test]
    fn a_heartbeat_of_the_same_incarnation_keeps_the_newest_time() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 90, t0 + secs(5));
        l.heard(3, 7, 90, t0);
        assert_eq!(l.state(3, 7, 90, t0 + secs(6)).heard_ago, Some(secs(1)));
    }

    #[test]
    fn forget_does_not_erase_an_incarnation_registered_after_the_read() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        // A read that saw up to index 60 found datanode 7 gone; meanwhile it registered again
        // at 90 and was heard.
        l.heard(3, 7, 90, t0);
        l.forget(7, 60);
        assert_eq!(l.state(3, 7, 90, t0 + secs(1)).state, DatanodeState::Alive);
        // A read that saw index 90 and found it gone forgets it.
        l.forget(7, 90);
        assert_eq!(l.state(3, 7, 90, t0 + secs(1)).heard_ago, None);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn a_registration_being_proposed_is_unknown_until_answered() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 7, 100, t0);
        let later = t0 + secs(30);
        // Registered again at 200, applied, not yet recorded by its proposer: without the
        // proposal it would read as down (no record of incarnation 200, collected long enough).
        assert_eq!(l.state(3, 7, 200, later).state, DatanodeState::Down);
        l.proposing(3, 7, later);
        l.proposing(3, 7, later);
        assert_eq!(l.state(3, 7, 200, later).state, DatanodeState::Unknown);
        // Another datanode is not covered.
        assert_eq!(l.state(3, 8, 150, later).state, DatanodeState::Down);
        l.proposed(3, 7);
        assert_eq!(l.state(3, 7, 200, later).state, DatanodeState::Unknown);
        l.registered(3, 7, 200, later);
        l.proposed(3, 7);
        assert!(l.proposing.is_empty());
        assert_eq!(l.state(3, 7, 200, later).state, DatanodeState::Unknown);
        assert_eq!(
            l.state(3, 7, 200, later + secs(11)).state,
            DatanodeState::Down
        );
        // An answer from a term that ended changes nothing in the new one.
        l.proposing(3, 9, later);
        l.collecting(4, later);
        assert!(l.proposing.is_empty());
        l.proposing(4, 9, later);
        l.proposed(3, 9);
        assert_eq!(l.proposing.get(&9), Some(&1));
    }

    #[test]
    fn a_call_with_an_older_term_wipes_nothing() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(5, 7, 100, t0);
        l.proposing(4, 8, t0 + secs(1));
        l.heard(4, 9, 100, t0 + secs(1));
        assert_eq!(l.collecting(5, t0 + secs(2)), secs(2));
        assert_eq!(l.state(5, 7, 100, t0 + secs(2)).state, DatanodeState::Alive);
        // Its answer, in term 4, would not count in term 5: it was never counted.
        assert!(l.proposing.is_empty());
    }

    #[test]
    fn retain_drops_former_incarnations_but_keeps_newer_ones() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT);
        l.heard(3, 1, 40, t0); // Registered again at 90 since.
        l.heard(3, 2, 90, t0); // The read (up to 60) saw it at 40.
        l.heard(3, 3, 50, t0); // Removed before the read.
        l.heard(3, 4, 95, t0); // Registered after the read, which found it absent.
        l.heard(3, 5, 30, t0); // Current.
        let current = |id| match id {
            1 => Some(90),
            2 => Some(40),
            5 => Some(30),
            _ => None,
        };
        l.retain(.., 60, current);
        let mut kept: Vec<u64> = l.heard.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![2, 4, 5]);
        assert_eq!(l.alive(3, t0), 3);
    }
}
