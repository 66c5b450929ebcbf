//! Datanode heartbeats and the liveness report, both answered by the leader from its
//! in-memory record (`liveness.rs`), never through the log.

use std::ops::Bound;
use std::time::Instant;

use super::MetaNode;
use crate::error::Result;
use crate::liveness::DatanodeState;
use crate::view::{Consistency, Heartbeat, LivenessReport};

/// How many datanodes a page of the liveness report that asks for one state reads from the
/// registry at a time.
const STATE_SCAN: usize = 1_024;

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
    /// version 4 the first piece raises its epoch, and from version 7 that epoch is fenced too)
    /// or ended. Returns once the
    /// heartbeat is recorded; nothing is written to disk.
    pub async fn heartbeat(&self, id: u64, epoch: u64) -> Result<Heartbeat> {
        self.check_open()?;
        let seen_upto = self.applied_before_read();
        let Some(datanode) = self.datanode(Consistency::Lease, id).await? else {
            self.inner.liveness.lock().forget(id, seen_upto);
            return Ok(Heartbeat::UnknownDatanode);
        };
        if datanode.epoch != epoch || datanode.removing {
            return Ok(Heartbeat::Fenced {
                current_epoch: datanode.epoch,
                removing: datanode.removing,
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

    /// Every registered datanode with its liveness as this leader heard it: the whole
    /// [`MetaNode::liveness_page`].
    pub async fn liveness(&self) -> Result<LivenessReport> {
        self.liveness_page(None, None, usize::MAX).await
    }

    /// A page of the liveness report, as this leader heard the datanodes: those registered
    /// with ids above `after` (from the first: `None`), in state `wanted` (any: `None`), at most
    /// `limit`, by id; `next` names the page's last id when more such follow. Leader only: on
    /// a follower [`crate::Error::ForwardToLeader`]. It reads the registry from `after` on, a
    /// chunk at a time, until the page is full, so a page costs about its own size (more when
    /// it asks for a state that few datanodes are in), not the whole registry's. Forgets the
    /// heartbeats of former incarnations, and of datanodes no longer registered, among the
    /// ids it read.
    pub async fn liveness_page(
        &self,
        wanted: Option<DatanodeState>,
        after: Option<u64>,
        limit: usize,
    ) -> Result<LivenessReport> {
        self.check_open()?;
        let seen_upto = self.applied_before_read();
        let chunk = match wanted {
            None => limit.saturating_add(1),
            Some(_) => STATE_SCAN,
        }
        .min(crate::MAX_PAGE);
        let mut from = after;
        let mut datanodes = Vec::new();
        let mut next = None;
        let (timeout, collecting) = loop {
            let cursor = from.map(|id| format!("{id:016x}"));
            let read = self
                .datanodes(Consistency::Lease, cursor.as_deref(), chunk)
                .await?;
            // The ids the read covered: up to its last, or all that remain.
            let until = match (&read.next, read.items.last()) {
                (Some(_), Some(last)) => Bound::Included(last.id),
                _ => Bound::Unbounded,
            };
            let start = from.map_or(Bound::Unbounded, Bound::Excluded);
            let term = self.term();
            let now = Instant::now();
            let mut liveness = self.inner.liveness.lock();
            let registered: std::collections::HashMap<u64, u64> = read
                .items
                .iter()
                .map(|d| (d.id, d.registered_index))
                .collect();
            liveness.retain((start, until), seen_upto, |id| registered.get(&id).copied());
            let figures = (liveness.timeout(), liveness.collecting(term, now));
            for d in read.items {
                let l = liveness.state(term, d.id, d.registered_index, now);
                if wanted.is_some_and(|w| w != l.state) {
                    continue;
                }
                if datanodes.len() == limit {
                    next = datanodes
                        .last()
                        .map(|(d, _): &(crate::DatanodeInfo, _)| d.id);
                    break;
                }
                datanodes.push((d, l));
            }
            match (next, until) {
                (None, Bound::Included(last)) => from = Some(last),
                _ => break figures,
            }
        };
        Ok(LivenessReport {
            leader: self.id(),
            timeout,
            collecting,
            datanodes,
            next,
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
