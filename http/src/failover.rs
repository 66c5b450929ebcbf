//! Riding out a leader change: a request that no leader acted on goes on to the next leader
//! this node learns of, within a deadline, instead of failing with 503 `no_leader`.
//!
//! Writes do this in `writer.rs`, where what counts as "not acted on" depends on who refused;
//! a write whose leader stopped answering is given up once another leader is elected
//! (`unless_superseded`), as `outcome_unknown`.
//! Reads (the admin API's GET and HEAD requests) do it here, around the whole request (the
//! handler, and the replay at the leader if it asked for one): a read changes nothing, so it
//! may be asked again of any leader, and a read asked of a leader may be dropped at any time.
//! Membership changes do the same: each names a target state (these voters, this learner at
//! this address), so asking again changes nothing more.
//! So a read also gives up on a leader that stopped answering (a paused process, a partition)
//! once this node learns that another one leads (`unless_deposed`), instead of waiting for
//! the exchange's timeout.
//! Every request waiting on a leader also gives up once that leader has been silent for two
//! election timeouts with no other elected (no quorum may be left here to elect one): a read
//! or membership change answers 503 `no_leader`, a write 504 `outcome_unknown`.

use std::future::Future;
use std::time::Duration;

use axum::response::Response;
use meta_consensus::{MetaNode, NodeId};
use tokio::time::Instant;

use crate::error::ApiError;

/// Attempts of one request, at most: each after a refusal that changed something (another
/// leader known, a later term), so more means leaders come and go faster than a request can
/// reach one.
pub(crate) const MAX_ATTEMPTS: u32 = 8;

/// Marks a response of 503 `no_leader`: no leader took the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoLeaderAnswer {
    /// Another member refused or could not be reached (a replay at the leader), rather than
    /// this node's own core: then this node's leading (it hands over) is not a leader without
    /// a quorum refusing.
    pub(crate) elsewhere: bool,
}

/// When a request that no leader took stops waiting for the next one.
#[derive(Debug)]
pub(crate) struct Failover {
    started: Instant,
    deadline: Option<Instant>,
}

impl Failover {
    /// The request started now.
    pub(crate) fn start() -> Self {
        Failover {
            started: Instant::now(),
            deadline: None,
        }
    }

    /// How long the request may still wait for a leader on `node`: what is left of its request
    /// timeout, but at least two election timeouts after its first refusal (the first call).
    pub(crate) fn left(&mut self, node: &MetaNode) -> Duration {
        let cfg = node.config();
        let started = self.started;
        let deadline = *self.deadline.get_or_insert_with(|| {
            started
                + cfg
                    .request_timeout
                    .max(started.elapsed() + cfg.election_timeout() * 2)
        });
        deadline.saturating_duration_since(Instant::now())
    }
}

/// 503 `no_leader` for a request about to go to `leader`, when `node` has not heard from it for
/// two election timeouts (`MetaNode::silent_leader`): it stopped, is paused or is cut off from
/// this node, and no other leader was elected since, so no quorum may be left here. Answered
/// at once, as a leader without a quorum answers, so that clients try another member; sent,
/// the request would wait for the forwarding timeout (a write then answered `outcome_unknown`).
pub(crate) fn refused_as_silent(node: &MetaNode, leader: NodeId) -> Option<ApiError> {
    let (silent, for_how_long) = node.silent_leader()?;
    (silent == leader).then(|| {
        no_leader(
            node,
            leader,
            format!(
                "node {leader}, the last leader this node knew, {}: try another member",
                silence(node, leader, for_how_long)
            ),
        )
    })
}

/// 503 `no_leader` with `message`, about the silent `leader`: without `Retry-After` when the
/// leader refuses this node's token, since asking this node again does not help until the
/// token is fixed (`NotServing`, which is also not asked of the next leader).
fn no_leader(node: &MetaNode, leader: NodeId, message: String) -> ApiError {
    match node.token_refused_by().contains(&leader) {
        true => ApiError::NotServing(message),
        false => ApiError::NoLeader(message),
    }
}

/// 503 `no_leader` for a request on `node`, which has known no leader for `for_how_long`
/// (`MetaNode::long_leaderless`): too few voters answer it to elect one. Without
/// `Retry-After` when members lately refused this node's token: asking it again does not help
/// until the token is fixed.
pub(crate) fn leaderless(node: &MetaNode, for_how_long: Duration) -> ApiError {
    let ms = for_how_long.as_millis();
    let refusing = node.token_refused_by();
    if refusing.is_empty() {
        let gone: Vec<NodeId> = node.voters_not_listening().into_iter().collect();
        let why = match gone.is_empty() {
            true => "they stopped, or are cut off from it".to_owned(),
            false => format!(
                "nothing listens at the addresses of voters {gone:?}: they stopped, or their \
                 hosts are down"
            ),
        };
        return ApiError::NoLeader(format!(
            "no leader was elected for {ms} ms: too few voters answer this node to elect one \
             ({why}); try another member"
        ));
    }
    ApiError::NotServing(format!(
        "no leader was elected for {ms} ms: members {refusing:?} refuse this node's token \
         (401), and this node their messages: every member needs the same --token and \
         --member-token; try another member"
    ))
}

/// How `node` describes its silent `leader` in answers: with the likely cause when `leader`
/// lately refused this node's token (then this node refuses the leader's messages too).
fn silence(node: &MetaNode, leader: NodeId, for_how_long: Duration) -> String {
    let cause = if node.token_refused_by().contains(&leader) {
        "it refuses this node's token (401), and this node its messages: every member needs \
         the same --token and --member-token"
    } else {
        "stopped, paused, or cut off from this node"
    };
    let ms = for_how_long.as_millis();
    // A leader this node never heard from is one its saved vote named when it started.
    let heard = match node.heard_from(leader) {
        true => format!("has not been heard from for {ms} ms"),
        false => format!("has not been heard from since this node started ({ms} ms)"),
    };
    format!("{heard} ({cause}), and no other leader was elected")
}

/// Answers a read on `node`; `attempt` asks it once. An answer of 503 `no_leader` is not final
/// while the cluster may elect a leader in time: the read is asked again once `node` learns of
/// a leader other than the one it was asked of (or the same one in a later term), within what
/// is left of the request timeout (at least two election timeouts). A leader without a quorum
/// answers at once, so that its clients try another member, as does a node in no cluster or
/// removed from one.
pub(crate) async fn read<F, Fut>(node: &MetaNode, mut attempt: F) -> Response
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Response>,
{
    let mut failover = Failover::start();
    let mut tries = 0;
    loop {
        tries += 1;
        let term = node.term();
        let asked_of = node.known_leader();
        let asked = std::time::Instant::now();
        let response = attempt().await;
        let Some(refused) = response.extensions().get::<NoLeaderAnswer>().copied() else {
            return response;
        };
        if tries == MAX_ATTEMPTS || !node.in_cluster() {
            return response;
        }
        if !refused.elsewhere && node.lacks_quorum_since(asked) {
            return response;
        }
        // Nothing is asked of a silent leader: waiting for the next one would last the whole
        // request timeout where no quorum is left. Nor is one waited for where none was
        // elected for that long.
        if node.silent_leader().is_some() {
            return response;
        }
        if let Some(for_how_long) = node.long_leaderless() {
            return axum::response::IntoResponse::into_response(leaderless(node, for_how_long));
        }
        if !next_try(node, asked_of, term, &mut failover).await {
            return response;
        }
        tracing::debug!(tries, ?asked_of, "a read goes on to the next leader");
    }
}

/// Waits until a request that `refused_by` refused in `term` without acting on it may be asked
/// again: once `node` learns of another leader, or the same one in a later term
/// (`MetaNode::next_leader`), or, failing that within an election timeout, of the same leader
/// again. A leader that refused for want of a quorum's acknowledgement may have one by then (a
/// leader elected a moment ago on a loaded machine: a change sent through a learner waited for
/// a next leader that never came, and failed). `false` once the request's time is up or the
/// node closes: the request answers what it has.
pub(crate) async fn next_try(
    node: &MetaNode,
    refused_by: Option<NodeId>,
    term: u64,
    failover: &mut Failover,
) -> bool {
    let within = failover.left(node);
    let again_after = within.min(node.config().election_timeout());
    // Also woken when this node has known no leader for too long: the request is refused
    // then, with the others that wait ([`leaderless`]), not an election timeout later.
    let next = tokio::select! {
        next = node.next_leader(refused_by, term, again_after) => next.is_some(),
        _ = node.leaderless_silenced() => true,
    };
    next || !(node.is_closing() || failover.left(node).is_zero())
}

/// Runs `asked`, a request that changes nothing, sent to `leader`, unless `node` learns first
/// that another node leads, or the same one in a later term: then `asked` is dropped and the
/// answer is 503 `no_leader`, as if `leader` had refused, so that [`read`] asks the next
/// leader.
pub(crate) async fn unless_deposed<T>(
    node: &MetaNode,
    leader: NodeId,
    asked: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let deposed = |term| {
        ApiError::NoLeader(format!(
            "node {leader} no longer leads (asked in term {term}): asking the next leader"
        ))
    };
    let silent = |for_how_long| {
        no_leader(
            node,
            leader,
            format!(
                "node {leader}, the leader this request was sent to, {}: try another member",
                silence(node, leader, for_how_long)
            ),
        )
    };
    until_deposed(node, leader, Duration::ZERO, deposed, silent, asked).await
}

/// [`unless_deposed`] for a leadership move asked of `leader`: another node leading is what it
/// waits for, so its answer is waited for up to two election timeouts after that (it answers
/// once it saw the node it named take office). Asked again at once, the new leader answered in
/// its stead, and one of a build without the route answered 404 to a move that was made.
pub(crate) async fn unless_moved_from<T>(
    node: &MetaNode,
    leader: NodeId,
    asked: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let grace = node.config().election_timeout() * 2;
    let deposed = |term| {
        ApiError::NoLeader(format!(
            "node {leader}, asked in term {term} to move the leadership, stopped answering and \
             another node leads: asking the next leader"
        ))
    };
    let silent = |for_how_long| {
        no_leader(
            node,
            leader,
            format!(
                "node {leader}, asked to move the leadership, {}: try another member",
                silence(node, leader, for_how_long)
            ),
        )
    };
    until_deposed(node, leader, grace, deposed, silent, asked).await
}

/// Runs `sent`, a write sent to `leader`, unless `leader` is still silent two election
/// timeouts after `node` learned that another node leads (or the same one in a later term):
/// then 504 `outcome_unknown`, since it may have made the write. A leader that hands its
/// leadership over answers its writes well within that (once the new leader committed them);
/// one that stopped answering (a paused process, a partition) would keep the client waiting
/// for the forwarding timeout.
pub(crate) async fn unless_superseded<T>(
    node: &MetaNode,
    leader: NodeId,
    sent: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let grace = node.config().election_timeout() * 2;
    let superseded = |term| {
        ApiError::OutcomeUnknown(format!(
            "node {leader}, the leader the write was sent to in term {term}, stopped answering \
             and another leader was elected: the write may or may not have been made"
        ))
    };
    let silent = |for_how_long| {
        ApiError::OutcomeUnknown(format!(
            "node {leader}, the leader the write was sent to, {}: the write may or may not \
             have been made",
            silence(node, leader, for_how_long)
        ))
    };
    until_deposed(node, leader, grace, superseded, silent, sent).await
}

/// Runs `asked` (sent to `leader`) until `grace` after `node` learns that another node leads,
/// or the same one in a later term (than `node`'s when asked); then drops it and answers
/// `deposed(term)`. A target that `node`'s metrics already show deposed is dropped at once
/// (after the grace), except while `node` itself leads: then `leader` is openraft's hint, the
/// target of a hand-over not elected yet, and is asked without a watch. Dropped too, answering
/// `silent(for how long)`, once `leader` has been silent for two election timeouts with no
/// other leader elected (`MetaNode::leader_silenced`): no quorum may be left to elect one, and
/// the request would wait for its forwarding timeout (a read 5 s, others 30 s).
async fn until_deposed<T>(
    node: &MetaNode,
    leader: NodeId,
    grace: Duration,
    deposed: impl FnOnce(u64) -> ApiError,
    silent: impl FnOnce(Duration) -> ApiError,
    asked: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let (named, term) = node.known_leader_and_term();
    if named == Some(node.id()) && leader != node.id() {
        return asked.await;
    }
    // No timer runs while `leader` leads (the silence has one per node): requests to it wait
    // here by the thousand.
    let superseded = async {
        if node.leader_after(Some(leader), term).await.is_none() {
            std::future::pending::<()>().await;
        }
        if !grace.is_zero() {
            tokio::time::sleep(grace).await;
        }
    };
    tokio::select! {
        answer = asked => answer,
        () = superseded => Err(deposed(term)),
        for_how_long = node.leader_silenced(leader) => Err(silent(for_how_long)),
    }
}
