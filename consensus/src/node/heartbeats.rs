//! Datanode heartbeats and the liveness report, both answered by the leader from its
//! in-memory record (`liveness.rs`), never through the log.

use std::time::Instant;

use super::MetaNode;
use crate::error::Result;
use crate::view::{Consistency, Heartbeat, LivenessReport};

impl MetaNode {
    /// Ticks the liveness record every [`crate::liveness::TICK`] until the node is dropped, so
    /// that it knows when this node did not run (`liveness.rs`).
    pub(super) fn tick_liveness(&self) {
        // A weak handle: the task must not keep a node that shut down alive.
        let inner = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(crate::liveness::TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                inner.liveness.lock().tick(Instant::now());
            }
        });
    }

    /// Records a heartbeat of datanode `id`, incarnation `epoch`. Leader only: on a follower
    /// [`crate::Error::ForwardToLeader`]. The datanode is read with `Lease` consistency, so the
    /// answer knows every registration acknowledged before the call: a heartbeat is fenced
    /// only when the datanode really registered again since, or its removal began (from cluster
    /// version 4 the first piece raises its epoch) or ended. Returns once the
    /// heartbeat is recorded; nothing is written to disk.
    pub async fn heartbeat(&self, id: u64, epoch: u64) -> Result<Heartbeat> {
        self.check_open()?;
        let seen_upto = self.applied_before_read();
        let Some(datanode) = self.datanode(Consistency::Lease, id).await? else {
            self.inner.liveness.lock().forget(id, seen_upto);
            return Ok(Heartbeat::UnknownDatanode);
        };
        if datanode.epoch != epoch {
            return Ok(Heartbeat::Fenced {
                current_epoch: datanode.epoch,
            });
        }
        let term = self.term();
        let mut liveness = self.inner.liveness.lock();
        liveness.heard(term, id, datanode.registered_index, Instant::now());
        Ok(Heartbeat::Recorded {
            timeout: liveness.timeout(),
        })
    }

    /// Marks a registration of datanode `id` as proposed by this node, if it leads: until the
    /// returned guard is dropped (once openraft answered it, after
    /// [`MetaNode::note_registration`]), the liveness report calls the datanode `unknown`
    /// rather than `down` when it has no record of its current incarnation.
    pub(super) fn proposing_registration(&self, id: u64) -> Option<ProposedRegistration> {
        let term = self.leader_view()?.current_term;
        self.inner
            .liveness
            .lock()
            .proposing(term, id, Instant::now());
        Some(ProposedRegistration {
            node: self.clone(),
            term,
            id,
        })
    }

    /// Records, on the leader that wrote it in `term`, the registration of datanode `id` at log
    /// index `index`: that incarnation is `unknown`, not `down`, for a timeout unless a
    /// heartbeat comes.
    pub(super) fn note_registration(&self, id: u64, index: u64, term: u64) {
        self.inner
            .liveness
            .lock()
            .registered(term, id, index, Instant::now());
    }

    /// For metrics, while this node leads: how many datanodes it heard from within the
    /// timeout, and how long it has collected heartbeats. `None` on any other node.
    pub fn liveness_figures(&self) -> Option<(usize, std::time::Duration)> {
        let term = self.leader_view()?.current_term;
        let now = Instant::now();
        let mut liveness = self.inner.liveness.lock();
        let alive = liveness.alive(term, now);
        Some((alive, liveness.collecting(term, now)))
    }

    /// Every registered datanode with its liveness as this leader heard it. Leader only: on a
    /// follower [`crate::Error::ForwardToLeader`]. Forgets the heartbeats of datanodes no
    /// longer registered and of former incarnations.
    pub async fn liveness(&self) -> Result<LivenessReport> {
        self.check_open()?;
        let seen_upto = self.applied_before_read();
        let datanodes = self.every_datanode(Consistency::Lease).await?;
        let term = self.term();
        let now = Instant::now();
        let mut liveness = self.inner.liveness.lock();
        let registered: std::collections::HashMap<u64, u64> = datanodes
            .iter()
            .map(|d| (d.id, d.registered_index))
            .collect();
        liveness.retain(seen_upto, |id| registered.get(&id).copied());
        let collecting = liveness.collecting(term, now);
        let datanodes = datanodes
            .into_iter()
            .map(|d| {
                let l = liveness.state(term, d.id, d.registered_index, now);
                (d, l)
            })
            .collect();
        Ok(LivenessReport {
            leader: self.id(),
            timeout: liveness.timeout(),
            collecting,
            datanodes,
        })
    }

    /// The log index this node's state machine applied, taken before a read of the registry:
    /// the read sees every entry up to it (applied entries stay visible), so a datanode it
    /// finds unregistered has no incarnation registered at or below it.
    fn applied_before_read(&self) -> u64 {
        self.inner.sm.applied().0.map_or(0, |l| l.index)
    }
}

/// A registration a leader proposed and openraft has not answered yet
/// ([`MetaNode::proposing_registration`]).
pub(super) struct ProposedRegistration {
    node: MetaNode,
    term: u64,
    id: u64,
}

impl Drop for ProposedRegistration {
    fn drop(&mut self) {
        self.node.inner.liveness.lock().proposed(self.term, self.id);
    }
}
