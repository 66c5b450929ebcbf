//! Answering vote requests. A node that holds no Raft state cannot tell a new member from one
//! whose data dir was lost; it votes only in a cluster's first election, so that a voter that
//! lost its log and its votes cannot help elect a candidate that misses acknowledged writes.

use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::{VoteRequest, VoteResponse};

use super::MetaNode;
use crate::error::{Error, Result};
use crate::types::TypeConfig;

impl MetaNode {
    /// Answers a vote request. Refused with [`Error::NotVoting`] (the candidate counts it as no
    /// answer) while this node holds no Raft state (no log, never voted) and the candidate's
    /// log holds more than the cluster's initial membership: a member that lost its data dir
    /// must not count toward a quorum until a leader has fed it the log again.
    pub async fn vote(&self, rpc: VoteRequest<TypeConfig>) -> Result<VoteResponse<TypeConfig>> {
        self.check_vote(&rpc)?;
        self.inner
            .raft
            .vote(rpc)
            .await
            .map_err(|e| Error::Raft(e.to_string()))
    }

    /// Answers a pre-vote request, under the rule of [`MetaNode::vote`].
    pub async fn pre_vote(&self, rpc: VoteRequest<TypeConfig>) -> Result<VoteResponse<TypeConfig>> {
        self.check_vote(&rpc)?;
        self.inner
            .raft
            .pre_vote(rpc)
            .await
            .map_err(|e| Error::Raft(e.to_string()))
    }

    fn check_vote(&self, rpc: &VoteRequest<TypeConfig>) -> Result<()> {
        let stateless = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            m.last_log_index.is_none() && m.current_term == 0
        };
        // `initialize` writes the membership at index 0; a first leader's entries follow it.
        let established = rpc.last_log_id.as_ref().is_some_and(|l| l.index > 0);
        if stateless && established {
            tracing::warn!(
                candidate = %rpc.vote,
                "refusing to vote: this node holds no Raft state but the cluster has a log; if \
                 it was a voter, its data dir was lost: remove it from the voters and add it back \
                 as a learner"
            );
            return Err(Error::NotVoting(
                "this node holds no Raft state and votes only in a cluster's first election".into(),
            ));
        }
        Ok(())
    }
}
