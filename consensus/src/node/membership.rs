//! Cluster membership: initializing a cluster once, adding learners, changing voters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use openraft::error::{InitializeError, RaftError};
use openraft::ChangeMembers;

use super::{blocking, sync_dir, MetaNode, INITIALIZED};
use crate::error::{Error, Result};
use crate::types::{Node, NodeId};

impl MetaNode {
    fn marker(&self) -> PathBuf {
        self.inner.cfg.data_dir.join(INITIALIZED)
    }

    /// Whether this node belongs to an initialized cluster (it initialized one, or holds any
    /// log, vote or membership).
    pub async fn is_initialized(&self) -> Result<bool> {
        self.check_open()?;
        if self.marker().exists() {
            return Ok(true);
        }
        self.inner
            .raft
            .is_initialized()
            .await
            .map_err(|e| self.fatal(e))
    }

    /// Forms a new cluster of `members` (which must include this node). Only ever once: a
    /// node that was initialized, or that holds any Raft state, answers
    /// [`Error::AlreadyInitialized`]; the fact is persisted in the data dir.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> Result<()> {
        if self.is_initialized().await? {
            return Err(Error::AlreadyInitialized);
        }
        if !members.contains_key(&self.id()) {
            return Err(Error::InvalidArgument(format!(
                "members {:?} must include this node ({})",
                members.keys().collect::<Vec<_>>(),
                self.id()
            )));
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => {}
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                return Err(Error::AlreadyInitialized)
            }
            Err(RaftError::APIError(e)) => return Err(Error::InvalidArgument(e.to_string())),
            Err(RaftError::Fatal(f)) => return Err(self.fatal(f)),
        }
        let marker = self.marker();
        let dir = self.inner.cfg.data_dir.clone();
        blocking(move || {
            std::fs::write(&marker, b"initialized\n")
                .and_then(|_| std::fs::File::open(&marker)?.sync_all())
                .map_err(|e| Error::io("write initialized marker", &marker, e))?;
            sync_dir(&dir)
        })
        .await
    }

    /// Adds (or re-adds) a learner and starts replicating to it; returns once the membership
    /// change is committed, without waiting for the learner to catch up.
    pub async fn add_learner(&self, id: NodeId, node: Node) -> Result<()> {
        self.check_open()?;
        if node.addr.is_empty() {
            return Err(Error::InvalidArgument("learner address is empty".into()));
        }
        let raft = &self.inner.raft;
        self.leader_call(|| raft.add_learner(id, node.clone(), false))
            .await
            .map(|_| ())
    }

    /// Makes `voters` the voting members (each must already be a member or learner); removed
    /// voters leave the cluster.
    pub async fn change_voters(&self, voters: BTreeSet<NodeId>) -> Result<()> {
        self.check_open()?;
        if voters.is_empty() {
            return Err(Error::InvalidArgument(
                "the voter set cannot be empty".into(),
            ));
        }
        let raft = &self.inner.raft;
        self.leader_call(|| {
            raft.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), false)
        })
        .await
        .map(|_| ())
    }
}
