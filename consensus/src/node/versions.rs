//! The cluster's version on the leader (`cluster_version.rs`): a write whose command needs a
//! version the cluster does not have raises it first, once every member answered recently as a
//! build of at least that version, and is refused otherwise; a learner whose build is older
//! than the cluster is not added.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;

use super::MetaNode;
use crate::cluster_version::{raisable, Behind};
use crate::command::{Command, CommandResult};
use crate::error::{Error, Result};
use crate::types::NodeId;

/// How often a leader waiting for a member's answer looks again.
const RECHECK: Duration = Duration::from_millis(50);

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
    /// not lead changes nothing: the write goes to the leader, which decides.
    pub(super) async fn ensure_version(&self, cmd: &Command) -> Result<()> {
        let needed = cmd.required_version();
        if self.cluster_version() >= needed || self.leader_view().is_none() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.lease_wait();
        loop {
            let behind = match self.raisable(needed) {
                Ok(_) => {
                    // One raise at a time, and none beside a learner's addition: with the lock
                    // held, the members (and their versions) are looked at again.
                    let _raising = self.inner.raising.lock().await;
                    if self.cluster_version() >= needed {
                        return Ok(());
                    }
                    match self.raisable(needed) {
                        Ok(version) => return self.raise_version(version).await,
                        Err(behind) => behind,
                    }
                }
                Err(behind) => behind,
            };
            // A member that answered as an older build will not change by waiting; one that
            // did not answer recently may yet (a fresh leader hears from it within a heartbeat).
            let known = behind.iter().all(|b| b.version.is_some());
            if known || tokio::time::Instant::now() >= deadline {
                return Err(Error::ClusterVersionTooLow {
                    what: cmd.to_string(),
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

    /// What the cluster's version may be raised to for a command that needs `needed`, or the
    /// members that keep it below.
    fn raisable(&self, needed: u32) -> std::result::Result<u32, Vec<Behind>> {
        let members = self.member_versions();
        raisable(members.keys().copied(), needed, |id| members[&id])
    }

    /// Proposes the raise to `version` and waits until it is applied here.
    async fn raise_version(&self, version: u32) -> Result<()> {
        let raft = &self.inner.raft;
        let raise = Command::SetClusterVersion { version };
        let r = self
            .leader_call(|| raft.client_write(raise.clone()))
            .await?;
        if let CommandResult::ClusterVersion { version } = r.data {
            tracing::info!("the cluster's version is {version} now");
        }
        Ok(())
    }

    /// Runs `add` (a learner's addition) unless the learner's build, as it answered recently,
    /// is older than the cluster's version ([`Error::LearnerTooOld`]). Not concurrently with a
    /// raise of the version: the raise then counts the learner as a member it must hear from.
    pub(super) async fn unless_too_old<F: std::future::Future<Output = Result<()>>>(
        &self,
        learner: NodeId,
        add: F,
    ) -> Result<()> {
        let _raising = self.inner.raising.lock().await;
        let cluster = self.cluster_version();
        let heard = self
            .inner
            .cfg
            .peer_versions
            .heard_within(learner, self.version_recency());
        if let Some(build) = heard.filter(|b| *b < cluster) {
            return Err(Error::LearnerTooOld {
                node: learner,
                build,
                cluster,
            });
        }
        add.await
    }
}
