//! Noticing that the leader fell silent: openraft keeps naming a leader that stopped, is paused
//! or is cut off from this node until another is elected, which a follower left without a
//! quorum waits for in vain. Requests are not sent to a silent leader (callers check
//! [`MetaNode::silent_leader`]), and those already waiting on it are told when it falls
//! silent ([`MetaNode::leader_silenced`]), so that none waits for its own timeout.
//!
//! The leader's side of the same silence: a leader that no quorum acknowledges (it is cut off
//! from the other voters, or they stopped) stays leader until it hears of a newer term, and
//! the writes it took before its lease ran out wait for a quorum that does not come. They are
//! told when the quorum's silence passes the same limit ([`MetaNode::quorum_silenced`]).
//!
//! One task per node watches for both moments; a request waiting holds no timer. It also ticks
//! every heartbeat interval, so that time this node itself stood still (a paused process) is
//! not taken for its leader's silence (`leader_contact.rs`).

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;

use super::MetaNode;
use crate::types::NodeId;

impl MetaNode {
    /// The leader openraft names, when it is another node that this node has not heard from
    /// for two election timeouts (longer than a live leader is ever silent: it sends a
    /// heartbeat every `heartbeat_ms`), and how long it has been silent: it stopped, is paused,
    /// or is cut off from this node. openraft names it until another leader is elected, which
    /// a follower left without a quorum waits for in vain; a request sent to it would wait for
    /// an answer until it timed out.
    pub fn silent_leader(&self) -> Option<(NodeId, Duration)> {
        let leader = self.named_other_leader()?;
        let silence = self.silence_of(leader);
        (silence > self.silence_limit()).then_some((leader, silence))
    }

    /// Whether a message of `leader` reached this node since it opened (`leader_contact.rs`).
    pub fn heard_from(&self, leader: NodeId) -> bool {
        self.inner.leader_contact.lock().heard_from(leader)
    }

    /// Completes once `leader` is the [silent leader](MetaNode::silent_leader) (at once if it
    /// is already), with how long it has been silent; never while it is heard from, or while
    /// openraft names another leader or none.
    pub async fn leader_silenced(&self, leader: NodeId) -> Duration {
        self.noticed(|| {
            self.silent_leader()
                .filter(|(silent, _)| *silent == leader)
                .map(|(_, for_how_long)| for_how_long)
        })
        .await
    }

    /// Completes once `look` finds a silence (at once if it does now), with what it found. The
    /// silence watch tells every silence it notices; never completes after the node closed.
    async fn noticed(&self, look: impl Fn() -> Option<Duration>) -> Duration {
        // Subscribed before the first look: a silence noticed after it wakes this wait.
        let mut noticed = self.inner.silences.subscribe();
        loop {
            if let Some(found) = look() {
                return found;
            }
            if noticed.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// How long no quorum of voters has acknowledged this node's leadership, when it leads a
    /// cluster it is not the only voter of, and that is longer than the silence limit of a
    /// [silent leader](MetaNode::silent_leader) (two election timeouts; a live quorum answers
    /// every heartbeat): it is cut off from the other voters, or they stopped, and they may
    /// have elected another leader already.
    pub fn unacknowledged_for(&self) -> Option<Duration> {
        let age = self.quorum_ack_age()?;
        (age > self.silence_limit()).then_some(age)
    }

    /// Completes once this node's leadership is
    /// [unacknowledged](MetaNode::unacknowledged_for) (at once if it is already), with for how
    /// long; never while a quorum acknowledges it, nor while it does not lead.
    pub async fn quorum_silenced(&self) -> Duration {
        self.noticed(|| self.unacknowledged_for()).await
    }

    /// How long since a quorum last acknowledged this leader (since it was elected, if none
    /// has yet); `None` when this node does not lead, or is its cluster's only voter.
    fn quorum_ack_age(&self) -> Option<Duration> {
        let (acked, term) = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            let sole = m.membership_config.membership().voter_ids().eq([self.id()]);
            if m.state != openraft::ServerState::Leader || sole {
                return None;
            }
            let acked = m
                .last_quorum_acked
                .as_ref()
                .map(|t| openraft::Instant::elapsed(&**t));
            (acked, m.current_term)
        };
        acked.or_else(|| self.led_for(term))
    }

    /// Starts the task that tells [`MetaNode::leader_silenced`] waits when the leader falls
    /// silent, and [`MetaNode::quorum_silenced`] waits when this leader's quorum does: it looks
    /// when a silence would pass the limit, and while one lasts every heartbeat interval (so
    /// that a leader or quorum heard from again and silent again counts again), until Raft
    /// stops.
    pub(super) fn watch_leader_silence(&self) {
        let inner = Arc::downgrade(&self.inner);
        // Server metrics change with the role, leader and membership only.
        let mut metrics = self.inner.raft.server_metrics();
        tokio::spawn(async move {
            let (mut silent_before, mut unacknowledged_before) = (None, false);
            let mut leaderless_before = false;
            loop {
                let next_look = {
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let node = MetaNode { inner };
                    node.inner
                        .leader_contact
                        .lock()
                        .tick(std::time::Instant::now(), node.stall_limit());
                    let silent = node.silent_leader().map(|(leader, _)| leader);
                    let unacknowledged = node.unacknowledged_for().is_some();
                    if (silent.is_some() && silent != silent_before)
                        || (unacknowledged && !unacknowledged_before)
                    {
                        node.inner.silences.send_modify(|n| *n += 1);
                    }
                    (silent_before, unacknowledged_before) = (silent, unacknowledged);
                    let leaderless = node.long_leaderless().is_some();
                    if leaderless && !leaderless_before {
                        node.inner.silences.send_modify(|n| *n += 1);
                    }
                    leaderless_before = leaderless;
                    // At least every heartbeat interval: the ticks that tell this node's own
                    // stalls from its leader's silence.
                    let heartbeat = Duration::from_millis(node.inner.cfg.heartbeat_ms);
                    node.next_silence_look(silent.is_some())
                        .min(node.next_quorum_look())
                        .min(node.next_leaderless_look())
                        .min(heartbeat)
                };
                tokio::select! {
                    () = tokio::time::sleep(next_look) => {}
                    changed = metrics.changed() => if changed.is_err() {
                        return;
                    },
                }
            }
        });
    }

    /// How long until the silence watch looks again.
    fn next_silence_look(&self, silent: bool) -> Duration {
        let heartbeat = Duration::from_millis(self.inner.cfg.heartbeat_ms);
        if silent {
            return heartbeat;
        }
        match self.named_other_leader() {
            // Just past the moment its silence would pass the limit.
            Some(leader) => {
                self.silence_limit().saturating_sub(self.silence_of(leader))
                    + Duration::from_millis(1)
            }
            // A leader named later is a metrics change, which wakes the watch.
            None => self.silence_limit(),
        }
    }

    /// How long until the silence watch looks at this leader's quorum again: just past the
    /// moment its silence would pass the limit, or every heartbeat interval while it lasts.
    fn next_quorum_look(&self) -> Duration {
        let limit = self.silence_limit();
        match self.quorum_ack_age() {
            Some(age) if age > limit => Duration::from_millis(self.inner.cfg.heartbeat_ms),
            Some(age) => limit - age + Duration::from_millis(1),
            // Leading later is a metrics change, which wakes the watch.
            None => limit,
        }
    }

    /// How long openraft has named no leader on this node, when that is longer than the
    /// silence limit of a [silent leader](MetaNode::silent_leader) (two election timeouts, in
    /// which an election that a quorum of voters answers ends): too few voters answer to elect
    /// one (they stopped, or are cut off from this node). A request that waits for a leader
    /// then would wait for its own timeout: it is refused at once instead. `None` while a
    /// leader is named (this node too), or until then.
    pub fn long_leaderless(&self) -> Option<Duration> {
        let leaderless = self.leaderless_for()?;
        (leaderless > self.silence_limit()).then_some(leaderless)
    }

    /// How long openraft has named no leader on this node, if it names none
    /// (`leader_contact.rs`).
    fn leaderless_for(&self) -> Option<Duration> {
        self.inner
            .leader_contact
            .lock()
            .leaderless_for(std::time::Instant::now(), self.stall_limit())
    }

    /// Completes once this node has known no leader for longer than the silence limit
    /// ([`MetaNode::long_leaderless`]; at once if it has already), with for how long.
    pub async fn leaderless_silenced(&self) -> Duration {
        self.noticed(|| self.long_leaderless()).await
    }

    /// How long until the silence watch looks again at how long no leader has been named:
    /// just past the moment that passes the limit.
    fn next_leaderless_look(&self) -> Duration {
        let limit = self.silence_limit();
        match self.leaderless_for() {
            Some(d) if d <= limit => limit - d + Duration::from_millis(1),
            // Past it (told already), or a leader is named: naming none is a metrics change,
            // which wakes the watch.
            _ => limit,
        }
    }

    /// Longer than a live leader is ever silent: two election timeouts.
    fn silence_limit(&self) -> Duration {
        self.inner.cfg.election_timeout() * 2
    }

    /// The leader openraft names, when this node does not lead and it is another node.
    fn named_other_leader(&self) -> Option<NodeId> {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        if m.state == openraft::ServerState::Leader {
            return None;
        }
        m.current_leader.filter(|l| *l != self.id())
    }

    /// Whether this node stood still lately: it resumed from a stall within an election
    /// timeout, or stands still now (`leader_contact.rs`).
    pub(super) fn stalled_lately(&self) -> bool {
        self.inner.leader_contact.lock().stalled_lately(
            std::time::Instant::now(),
            self.stall_limit(),
            self.stall_limit(),
        )
    }

    /// How long `leader` has been silent (`leader_contact.rs`).
    fn silence_of(&self, leader: NodeId) -> Duration {
        self.inner.leader_contact.lock().silence(
            leader,
            std::time::Instant::now(),
            self.stall_limit(),
        )
    }

    /// A gap between the silence watch's ticks (every heartbeat interval) longer than this is
    /// a stall of this node (`leader_contact.rs`): an election timeout, well under the silence
    /// limit, far over a tick's delay on a busy runtime.
    fn stall_limit(&self) -> Duration {
        self.inner.cfg.election_timeout()
    }
}
