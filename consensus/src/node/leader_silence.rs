//! Noticing that the leader fell silent: openraft keeps naming a leader that stopped, is paused
//! or is cut off from this node until another is elected, which a follower left without a
//! quorum waits for in vain. Requests are not sent to a silent leader (callers check
//! [`MetaNode::silent_leader`]), and those already waiting on it are told when it falls
//! silent ([`MetaNode::leader_silenced`]), so that none waits for its own timeout.
//!
//! One task per node watches for the moment; a request waiting on a leader holds no timer.

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

    /// Completes once `leader` is the [silent leader](MetaNode::silent_leader) (at once if it
    /// is already), with how long it has been silent; never while it is heard from, or while
    /// openraft names another leader or none.
    pub async fn leader_silenced(&self, leader: NodeId) -> Duration {
        // Subscribed before the first look: a silence noticed after it wakes this wait.
        let mut noticed = self.inner.silences.subscribe();
        loop {
            if let Some((silent, for_how_long)) = self.silent_leader() {
                if silent == leader {
                    return for_how_long;
                }
            }
            if noticed.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Starts the task that tells [`MetaNode::leader_silenced`] waits when the leader falls
    /// silent: it looks when the named leader's silence would pass the limit, and while it is
    /// silent every heartbeat interval (so that a leader heard from again and silent again
    /// counts again), until Raft stops.
    pub(super) fn watch_leader_silence(&self) {
        let inner = Arc::downgrade(&self.inner);
        // Server metrics change with the role, leader and membership only.
        let mut metrics = self.inner.raft.server_metrics();
        tokio::spawn(async move {
            let mut silent_before = None;
            loop {
                let next_look = {
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let node = MetaNode { inner };
                    let silent = node.silent_leader().map(|(leader, _)| leader);
                    if silent.is_some() && silent != silent_before {
                        node.inner.silences.send_modify(|n| *n += 1);
                    }
                    silent_before = silent;
                    node.next_silence_look(silent.is_some())
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

    /// How long `leader` has been silent (`leader_contact.rs`).
    fn silence_of(&self, leader: NodeId) -> Duration {
        self.inner
            .leader_contact
            .lock()
            .silence(leader, std::time::Instant::now())
    }
}
