//! The cluster's version on the leader (`cluster_version.rs`): a write whose command needs a
//! version the cluster does not have raises it first, once every member answered recently as a
//! build of at least that version, and is refused otherwise (also on a node that does not
//! lead: it cannot tell); a learner whose build is older than the cluster, or unknown, is not
//! added. A cluster formed by this build does not wait for such a command: the node that formed
//! it raises its version to its members' oldest build as soon as every member answered, so that
//! a member down later does not hold back the commands an older build would have refused.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use openraft::async_runtime::watch::WatchReceiver;

use super::MetaNode;
use crate::cluster_version::{raisable, Behind, BASE_VERSION};
use crate::command::{Command, CommandResult};
use crate::error::{Error, Result};
use crate::types::NodeId;

/// How often a leader waiting for a member's answer looks again.
const RECHECK: Duration = Duration::from_millis(50);

/// How often the node that formed a cluster looks again whether every member answered.
const FORMATION_RECHECK: Duration = Duration::from_millis(200);

impl MetaNode {
    /// The cluster's version as this node applied it.
    pub fn cluster_version(&self) -> u32 {
        self.inner.sm.cluster_version()
    }

    /// How recent a member's answer must be for its version to count: the leader hears from
    /// every member several times a second, and a member's build may have been swapped since
    /// an older answer.
    fn version_recency(&self) -> Duration {
        self.lease()
    }

    /// The version each member's build answered this node with recently (`None`: it did not
    /// answer recently), this node's own included. Only a leader hears from every member.
    pub fn member_versions(&self) -> BTreeMap<NodeId, Option<u32>> {
        let metrics = self.inner.raft.metrics();
        let members: Vec<NodeId> = metrics
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        members
            .into_iter()
            .map(|id| (id, self.version_of(id)))
            .collect()
    }

    fn version_of(&self, id: NodeId) -> Option<u32> {
        let cfg = &self.inner.cfg;
        if id == cfg.id {
            return Some(cfg.build_version);
        }
        cfg.peer_versions.heard_within(id, self.version_recency())
    }

    /// Makes the cluster's version at least what `cmd` needs before it is proposed (see the
    /// module comment). Refuses with [`Error::ClusterVersionTooLow`] at once when members
    /// answered as older builds, and after at most [`MetaNode::lease_wait`] when some have not
    /// answered recently (a fresh leader hears from them within a heartbeat). A node that does
    /// not lead (a candidate, a follower that knows no leader) refuses such a command with
    /// [`Error::ForwardToLeader`] or [`Error::NoLeader`]: were it to win an election before it
    /// proposed the command, nothing would have checked the members.
    pub(super) async fn ensure_version(&self, cmd: &Command) -> Result<()> {
        let needed = cmd.required_version();
        if self.cluster_version() >= needed {
            return Ok(());
        }
        if self.leader_view().is_none() {
            return Err(self.not_leading());
        }
        let deadline = tokio::time::Instant::now() + self.lease_wait();
        loop {
            let Err(behind) = self.raise_if_raisable(needed).await? else {
                return Ok(());
            };
            // A member that answered as an older build will not change by waiting; one that
            // did not answer recently may yet (a fresh leader hears from it within a heartbeat).
            let known = behind.iter().all(|b| b.version.is_some());
            if known || tokio::time::Instant::now() >= deadline {
                return Err(Error::ClusterVersionTooLow {
                    what: cmd.described(),
                    needed,
                    current: self.cluster_version(),
                    behind,
                });
            }
            tokio::time::sleep(RECHECK).await;
            if self.cluster_version() >= needed {
                return Ok(());
            }
        }
    }

    /// Raises the version of the cluster this node just formed to its members' oldest build as
    /// soon as every member answered while this node leads, rather than when a command first
    /// needs it: no older build ran this cluster, so none is to be put back, and later a member
    /// that is down (whose answer then counts no more) would keep the version down, and every
    /// request that needs it refused, until it returned. Runs in the background until it
    /// raised the version, found it high enough, or the node closed. A node that restarts
    /// before leaves the version to rise when a command needs it, as in an upgraded cluster.
    pub(super) fn raise_version_at_formation(&self) {
        // A weak handle: the task must not keep a node that shut down alive.
        let inner = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FORMATION_RECHECK).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let node = MetaNode { inner };
                if node.check_open().is_err() {
                    return;
                }
                if node.leader_view().is_none() {
                    continue;
                }
                let oldest = node
                    .member_versions()
                    .into_values()
                    .collect::<Option<Vec<u32>>>()
                    .and_then(|versions| versions.into_iter().min());
                let Some(oldest) = oldest else {
                    continue;
                };
                if oldest <= node.cluster_version() {
                    return;
                }
                // Refused if a member stopped answering or this node lost its office meanwhile:
                // look again later.
                if let Ok(Ok(())) = node.raise_if_raisable(oldest).await {
                    return;
                }
            }
        });
    }

    /// Like [`MetaNode::ensure_version`] for a version the caller can do without: `Ok(true)`
    /// when the cluster has `needed` (raised now if every member answered recently as a build of
    /// at least that), `Ok(false)` at once when a member keeps it below (an older build, or one
    /// that did not answer recently: nothing waits for it). A node that does not lead refuses as
    /// `ensure_version` does.
    pub(super) async fn try_version(&self, needed: u32) -> Result<bool> {
        if self.cluster_version() >= needed {
            return Ok(true);
        }
        if self.leader_view().is_none() {
            return Err(self.not_leading());
        }
        Ok(self.raise_if_raisable(needed).await?.is_ok())
    }

    /// Raises the cluster's version for a command that needs `needed`, if the members allow it
    /// now; else the members that keep it below.
    async fn raise_if_raisable(&self, needed: u32) -> Result<std::result::Result<(), Vec<Behind>>> {
        if let Err(behind) = self.raisable(needed) {
            return Ok(Err(behind));
        }
        // One raise at a time, and none beside a learner's addition: with the lock held, the
        // members (and their versions) are looked at again.
        let _raising = self.inner.raising.lock().await;
        if self.cluster_version() >= needed {
            return Ok(Ok(()));
        }
        match self.raisable(needed) {
            Ok(version) => self.raise_version(version).await.map(Ok),
            Err(behind) => Ok(Err(behind)),
        }
    }

    /// What the cluster's version may be raised to for a command that needs `needed`, or the
    /// members that keep it below.
    fn raisable(&self, needed: u32) -> std::result::Result<u32, Vec<Behind>> {
        let members = self.member_versions();
        raisable(members.keys().copied(), needed, |id| members[&id])
    }

    /// [`MetaNode::ensure_version`] again, after the write waited for room: a node that led
    /// then may not now, and a command proposed must find the version raised.
    pub(super) fn check_version(&self, cmd: &Command) -> Result<()> {
        if self.cluster_version() >= cmd.required_version() {
            return Ok(());
        }
        Err(self.not_leading())
    }

    /// Where a command that needs a raise must go when this node cannot raise it: the leader
    /// its metrics name, or nowhere yet.
    pub(super) fn not_leading(&self) -> Error {
        self.leader_elsewhere().unwrap_or_else(|| self.no_leader())
    }

    /// Proposes the raise to `version` and waits until it is applied here. The version counts
    /// as proposed from before the proposal (`proposed_version`): if the caller gives up, the
    /// entry may still commit.
    async fn raise_version(&self, version: u32) -> Result<()> {
        self.inner
            .proposed_version
            .fetch_max(version, Ordering::AcqRel);
        let raise = Command::SetClusterVersion { version };
        let r = self
            .leader_call(|raft| {
                let raise = raise.clone();
                async move { raft.client_write(raise).await }
            })
            .await?;
        if let CommandResult::ClusterVersion { version } = r.data {
            tracing::info!("the cluster's version is {version} now");
        }
        Ok(())
    }

    /// Runs `add` (a learner's addition) unless the learner's build, as it answered recently
    /// (before this call, or since), is older than the cluster's version
    /// ([`Error::LearnerTooOld`]), or unknown while the cluster's version is past
    /// [`BASE_VERSION`] ([`Error::LearnerNotHeard`]). The cluster's version is the one
    /// committed, read after a read barrier (a fresh leader may not yet have applied a raise of
    /// an earlier term), or a raise this node proposed, which may still commit. Not
    /// concurrently with a raise: the raise then counts the learner as a member it must hear
    /// from.
    pub(super) async fn unless_too_old<F: std::future::Future<Output = Result<()>>>(
        &self,
        learner: NodeId,
        add: F,
    ) -> Result<()> {
        let asked = Instant::now();
        let _raising = self.inner.raising.lock().await;
        self.read_barrier(crate::view::Consistency::Linearizable)
            .await?;
        let cluster = self
            .cluster_version()
            .max(self.inner.proposed_version.load(Ordering::Acquire));
        if cluster > BASE_VERSION {
            // An answer that came before this call (the caller's probe) counts as recent as
            // it was then: waiting for the lock does not age it.
            let recent = self.version_recency() + asked.elapsed();
            match self.inner.cfg.peer_versions.heard_within(learner, recent) {
                Some(build) if build >= cluster => {}
                Some(build) => {
                    return Err(Error::LearnerTooOld {
                        node: learner,
                        build,
                        cluster,
                    })
                }
                None => {
                    return Err(Error::LearnerNotHeard {
                        node: learner,
                        cluster,
                    })
                }
            }
        }
        add.await
    }
}
