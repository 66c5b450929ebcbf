//! How the admin handlers write: a command is proposed on this node when it may lead, and sent
//! to the leader in the next forwarded batch (`forward_batch.rs`) when its metrics name
//! another leader.
//!
//! A write that reached a follower is thus parsed and validated once, on the follower, and the
//! leader only proposes the command. A write that nobody acted on goes on to the next leader
//! this node learns of (`Writer::write`): one the leader it was sent to refused (it no longer
//! leads, or cannot be reached), and one this node's core refused before proposing it (it
//! hands its leadership over, knows no leader while an election runs, or learned that
//! another node leads before its metrics said so).
//!
//! A command that needs a cluster version this node has not applied (`RaiseEpochFloor` before
//! this node applied the raise to 4) is not sent in a batch: a leader of an older build could not
//! decode the batch, and would refuse every write in it. This node's core answers "forward to
//! leader" for it, and the middleware replays the request; a leader of an older build answers
//! that as it answers any route or query it does not know, which the middleware answers as 503
//! `cluster_version` (`forward.rs`). (A removal's later piece, sent as a command
//! when this node lags, goes to a leader that applied version 3 already.)

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use meta_consensus::{Command, Error as NodeError, MetaNode, Written};

use crate::error::{ApiError, ForwardTo};
use crate::failover::{self, Failover, MAX_ATTEMPTS};
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
    ///
    /// A write that nobody acted on is not failed at once: when the leader it was sent to
    /// refuses it (it no longer leads, or cannot be reached: a hand-over, a crash), or this
    /// node's core refuses it (it is handing its leadership over, or knows no leader while an
    /// election runs), it goes to the leader this node learns of next, within what is left of
    /// the request timeout (at least two election timeouts): a failover that ends in time
    /// costs the client a slower answer, not an error. A crashed leader is noticed only after
    /// an election timeout, and a split vote takes another. A leader without a quorum refuses
    /// at once (after its lease wait), as does a node in no cluster or removed from one; one
    /// that refused a forwarded write is asked again after an election timeout if no other
    /// leader is known by then (`failover::next_try`). A
    /// write sent to a leader that stops answering is answered `outcome_unknown` once another
    /// leader is known and the old one stayed silent for two election timeouts more.
    pub async fn write(&self, cmd: Command) -> Result<Written, ApiError> {
        let decodable = self.node.cluster_version() >= cmd.required_version();
        let mut next = self.node.route(&cmd)?;
        if self.forwarded || !decodable {
            return self.propose_here(cmd).await;
        }
        let mut failover = Failover::start();
        for attempt in 1.. {
            let term = self.node.term();
            // Who refused the write without acting on it, and the answer if nobody takes it.
            let (refused_by, why) = match next.take() {
                Some((leader_id, addr)) => {
                    if let Some(silent) = failover::refused_as_silent(&self.node, leader_id) {
                        return Err(silent);
                    }
                    let sent = self
                        .batcher
                        .send(ForwardTo { leader_id, addr }, cmd.clone());
                    let sent = failover::unless_superseded(&self.node, leader_id, sent).await;
                    match sent {
                        Err(why @ ApiError::NoLeader(_)) => (Some(leader_id), why),
                        sent => return sent,
                    }
                }
                // Openraft refuses before it proposes: "forward to leader" (this node does not
                // lead, or hands its leadership over) or no leader (none known, or this
                // leader has no quorum). A leader that hands over is not asked again in its
                // term; a node that was campaigning when asked may lead next. A leader without
                // a quorum answers at once, so that its clients try another member, as does a
                // node that has known no leader for two election timeouts.
                None => {
                    let asked = std::time::Instant::now();
                    match self.node.write(cmd.clone()).await {
                        Err(e @ NodeError::ForwardToLeader { .. }) => {
                            let by = self.node.led_before(asked).then(|| self.node.id());
                            (by, ApiError::from(e))
                        }
                        Err(e @ NodeError::NoLeader) if !self.node.lacks_quorum_since(asked) => {
                            (None, ApiError::from(e))
                        }
                        written => return Ok(written?),
                    }
                }
            };
            // A removal's later piece is never replayed as its request (see `propose_here`).
            let why = match why {
                ApiError::ForwardToLeader { .. }
                    if matches!(cmd, Command::RemoveDatanodePiece { .. }) =>
                {
                    ApiError::NoLeader(why.to_string())
                }
                why => why,
            };
            // No leader elected for two election timeouts: waiting for one would last the
            // request's timeout.
            if let Some(for_how_long) = self.node.long_leaderless() {
                return Err(failover::leaderless(&self.node, for_how_long));
            }
            if attempt == MAX_ATTEMPTS {
                return Err(why);
            }
            if !failover::next_try(&self.node, refused_by, term, &mut failover).await {
                return Err(why);
            }
            next = self.node.route(&cmd)?;
        }
        unreachable!("the last attempt returns")
    }

    /// Proposes `cmd` on this node, for a request another member replayed here or a command
    /// a leader of an older build could not decode in a batch. A removal's later piece must
    /// keep the incarnation it names: were this node's core to answer "forward to leader", the
    /// replayed request would start the removal again. It goes to that leader as a command
    /// instead.
    async fn propose_here(&self, cmd: Command) -> Result<Written, ApiError> {
        let piece = matches!(cmd, Command::RemoveDatanodePiece { .. }).then(|| cmd.clone());
        match (self.node.write(cmd).await, piece) {
            (
                Err(NodeError::ForwardToLeader {
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
