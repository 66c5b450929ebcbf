//! A node's status, as `GET /v1/cluster` shows it: its role, leader, members, log and
//! registry figures, and on the leader the members' replication.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use openraft::async_runtime::watch::WatchReceiver;

use super::MetaNode;
use crate::status::{ClusterStatus, ReplicationLag, Role};
use crate::types::NodeId;

impl MetaNode {
    /// This node's status.
    pub fn status(&self) -> ClusterStatus {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let nodes: BTreeMap<NodeId, String> = membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        let stopped = self.inner.shut.load(Ordering::Acquire) || self.core_stopped();
        let removal = self.removal(&m);
        let removed = removal.is_some();
        // A leader no quorum acknowledged within the lease may be deposed already: it is not
        // reported as leader (a single voter is its own quorum).
        let self_quorum = membership.voter_ids().eq([self.id()]);
        let lost_quorum = m.state == openraft::ServerState::Leader
            && !self_quorum
            && m.last_quorum_acked
                .as_ref()
                .is_none_or(|t| openraft::Instant::elapsed(&**t) >= self.lease());
        // A silent leader (`leader_silence.rs`) is not named: openraft names it until another
        // is elected, which a follower left without a quorum waits for in vain.
        let silent = self
            .silent_leader()
            .is_some_and(|(l, _)| m.current_leader == Some(l));
        // A restarted node's saved vote names the leader of its last run, which openraft names
        // at once: it may be down. It is named once its word arrives.
        let unheard = m.state != openraft::ServerState::Leader
            && m.current_leader
                .is_some_and(|l| l != self.id() && !self.heard_from(l));
        let leader_id = if stopped || lost_quorum || removed || silent || unheard {
            None
        } else {
            m.current_leader
        };
        let leader_addr = leader_id.and_then(|l| nodes.get(&l).cloned());
        let last = m.last_log_index;
        let refusals = &self.inner.cfg.peer_refusals;
        let room_refusal =
            |node| refusals.snapshot_refusal(node, super::membership::ROOM_REFUSAL_RECENT);
        let replication = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(node, matched)| {
                        let matched = matched.as_ref().map(|l| l.index);
                        let lag = match (last, matched) {
                            (Some(l), Some(mi)) => l.saturating_sub(mi),
                            (Some(l), None) => l + 1,
                            _ => 0,
                        };
                        // A member this leader never heard from (down since before it took
                        // office) has been silent at least since then. The leader hears
                        // itself always: openraft's record of it is of its own log's flushes,
                        // which a single voter with nothing to write never refreshes (a "member
                        // down" alert on it fired on every idle single-node cluster).
                        let (_, heard) = Self::progress_of(&m, *node);
                        let heard = (*node == self.id())
                            .then_some(std::time::Duration::ZERO)
                            .or(heard)
                            .or_else(|| self.led_for(m.current_term));
                        ReplicationLag {
                            node: *node,
                            matched,
                            lag,
                            heard_ms: heard.map(|d| d.as_millis() as u64),
                            snapshot_refused: room_refusal(*node),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let sm = &self.inner.sm;
        let datanodes = sm.datanodes();
        let snapshot = sm.last_snapshot();
        let role = if stopped {
            Role::Shutdown
        } else if removed {
            Role::Removed
        } else if lost_quorum {
            Role::LeaderWithoutQuorum
        } else if membership.voter_ids().next().is_none() && m.current_leader.is_none() {
            // A learner that waits for its first snapshot holds no membership yet either, but
            // a leader replicates to it: it is a learner.
            Role::Uninitialized
        } else {
            Role::from(m.state)
        };
        ClusterStatus {
            id: self.id(),
            role,
            leader_id,
            leader_addr,
            term: m.current_term,
            voters: membership.voter_ids().collect(),
            voter_sets: membership
                .get_joint_config()
                .iter()
                .map(|set| set.iter().copied().collect())
                .collect(),
            learners: membership.learner_ids().collect(),
            nodes,
            last_log_index: last,
            committed: m.local_committed.as_ref().map(|l| l.index),
            applied: m.last_applied.as_ref().map(|l| l.index),
            purged: m.purged.as_ref().map(|l| l.index),
            snapshot_index: m.snapshot.as_ref().map(|l| l.index),
            snapshot_bytes: snapshot.map(|s| s.bytes),
            replication,
            datanodes,
            replicas: sm.replicas(),
            wal: self.inner.log.wal_metrics(),
            state_machine: sm.stats.snapshot(),
            snapshot_rate: sm.limiter.rate(),
            snapshot_throttle_pauses: sm.limiter.pauses(),
            snapshot_throttle_millis: sm.limiter.paused_nanos() / 1_000_000,
            watches_waiting: sm.feed.waiting() as u64,
            watch_floor: sm.feed.floor(),
            cluster_version: sm.cluster_version(),
            epoch_floor: sm.epoch_floor(),
            // A registry that cannot be read is a stopped node's, which says so in its role.
            restore: sm.restore_mark().unwrap_or(None),
            build_version: self.inner.cfg.build_version,
            member_versions: if m.state == openraft::ServerState::Leader {
                self.member_versions()
            } else {
                BTreeMap::new()
            },
            data_dir_free_bytes: self.data_dir_free_bytes(),
            min_free_bytes: self.inner.cfg.min_free_bytes,
            rejoin: self.rejoin_status(),
            removal: removal.filter(|_| role == Role::Removed),
            refused_by: self.refused_by().into_iter().collect(),
            token_refused_by: self.token_refused_by().into_iter().collect(),
            snapshot_refused: self.snapshot_refused(),
            stopping: self.inner.stopping.load(Ordering::Acquire),
        }
    }
}
