//! How the admin handlers write: a command is proposed on this node when it may lead, and sent
//! to the leader in the next forwarded batch (`forward_batch.rs`) when its metrics name
//! another leader.
//!
//! A write that reached a follower is thus parsed and validated once, on the follower, and the
//! leader only proposes the command. When this node's core, asked directly, answers "forward
//! to leader" (an election just ended), the forwarding middleware replays the request instead
//! (a removal's later piece excepted: it goes to that leader as a command, see `Writer::write`).
//! When the leader it was sent to refuses it without acting on it (it no longer leads, or
//! cannot be reached), it is sent once more, to the next leader this node learns of.
//!
//! A command that needs a cluster version this node has not applied (`RaiseEpochFloor` before
//! this node applied the raise to 4) is not sent in a batch: a leader of an older build could not
//! decode the batch, and would refuse every write in it. This node's core answers "forward to
//! leader" for it, and the middleware replays the request; a leader of an older build answers
//! that as it answers any route it does not know. (A removal's later piece, sent as a command
//! when this node lags, goes to a leader that applied version 3 already.)

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use meta_consensus::{Command, MetaNode, Written};

use crate::error::{ApiError, ForwardTo};
use crate::forward::FORWARDED_BY;
use crate::forward_batch::Batcher;
use crate::state::SharedState;

/// A handler's handle for writing; extracted from the request (whether another member
/// forwarded it) and the state.
pub struct Writer {
    node: MetaNode,
    batcher: Batcher,
    /// Replayed here by another member: never forwarded again (the 503 tells the client to
    /// retry).
    forwarded: bool,
}

impl FromRequestParts<SharedState> for Writer {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Self, Infallible> {
        Ok(Writer {
            node: state.node.clone(),
            batcher: state.forwarder.batcher().clone(),
            forwarded: parts.headers.contains_key(&FORWARDED_BY),
        })
    }
}

impl Writer {
    /// Writes `cmd`. Returns once it is committed (durable on a quorum) and applied on the
    /// node that proposed it (this one, or the leader it was forwarded to). Bad input is
    /// refused before anything is sent or proposed.
    pub async fn write(&self, cmd: Command) -> Result<Written, ApiError> {
        let decodable = self.node.cluster_version() >= cmd.required_version();
        match self.node.route(&cmd)? {
            Some((leader_id, addr)) if !self.forwarded && decodable => {
                let started = tokio::time::Instant::now();
                let term = self.node.term();
                let sent = self
                    .batcher
                    .send(ForwardTo { leader_id, addr }, cmd.clone())
                    .await;
                let Err(ApiError::NoLeader(why)) = sent else {
                    return sent;
                };
                // The leader this node knew did nothing with the write (it no longer leads, or
                // could not be reached: a hand-over, a crash): it goes once more, to the leader
                // this node learns of next, within what is left of the request timeout (at
                // least two election timeouts): a failover that ends in time costs the client
                // a slower answer, not an error. A crashed leader is noticed only after an
                // election timeout, and a split vote takes another.
                let cfg = self.node.config();
                let within = cfg
                    .request_timeout
                    .saturating_sub(started.elapsed())
                    .max(cfg.election_timeout() * 2);
                match self.node.next_leader(leader_id, term, within).await {
                    Some(Some((leader_id, addr))) => {
                        self.batcher.send(ForwardTo { leader_id, addr }, cmd).await
                    }
                    // This node leads now: proposed here, as below (a removal's later piece
                    // must not become a replay of its request here either).
                    Some(None) => self.propose_here(cmd).await,
                    None => Err(ApiError::NoLeader(why)),
                }
            }
            _ => self.propose_here(cmd).await,
        }
    }

    /// Proposes `cmd` on this node. A removal's later piece must keep the incarnation it names:
    /// were this node's core to answer "forward to leader", the replayed request would start
    /// the removal again. It goes to that leader as a command instead.
    async fn propose_here(&self, cmd: Command) -> Result<Written, ApiError> {
        let piece = matches!(cmd, Command::RemoveDatanodePiece { .. }).then(|| cmd.clone());
        match (self.node.write(cmd).await, piece) {
            (
                Err(meta_consensus::Error::ForwardToLeader {
                    leader_id,
                    leader_addr,
                }),
                Some(piece),
            ) if !self.forwarded => {
                let to = ForwardTo {
                    leader_id,
                    addr: leader_addr,
                };
                self.batcher.send(to, piece).await
            }
            (written, _) => Ok(written?),
        }
    }
}
