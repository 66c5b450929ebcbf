//! Forwarded writes travel to the leader as commands, in batches: one HTTP exchange carries
//! every write that queued at a follower while its previous batches were in flight.
//!
//! A follower parses and validates a write itself (the handler's work), builds its
//! [`Command`] and sends only that; the leader proposes each command of a batch, concurrently,
//! and answers each with its [`Written`] or a [`Refusal`]; the follower renders the answer as
//! if the write had been proposed locally. So the leader, whose CPU is the cluster's
//! bottleneck under a write storm, neither parses JSON nor routes HTTP requests for forwarded
//! writes, and nothing can be forwarded twice: the leader's end never forwards (a leader that
//! lost its office refuses with `no_leader`).
//!
//! Batching is group commit: a write waits only while `MAX_IN_FLIGHT` batches are out (and
//! at most `SLOT_WAIT`, so a batch stuck at a leader that stopped answering does not hold
//! back the writes behind it), and a lone write leaves at once. A batch also needs one of
//! `MAX_OUT_PER_LEADER` places at its leader: each batch out holds a connection there, and a
//! leader that stalls must not collect a new connection from every follower every `SLOT_WAIT`
//! until the connection slots it keeps for datanodes are gone. A batch waits for a place at most
//! the exchange's timeout (then its writes are refused unsent), and no longer than that holds back
//! the part of it bound for another leader; a write whose caller went away is not sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use meta_consensus::{codec, ClusterId, Command, MetaNode, Written, SMALL_WRITE_WEIGHT};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::auth::Token;
use crate::cluster_identity::version_of;
use crate::error::{ApiError, ForwardTo};
use crate::leader_exchange::LeaderLink;
use crate::peer_client::PeerClient;
use crate::request::validate_command;

/// The leader's route for batches of forwarded commands.
pub const PATH_FORWARD_BATCH: &str = "/raft/forward-commands";

/// Batches one follower may have out at once; further writes queue and go in the next batch.
const MAX_IN_FLIGHT: usize = 2;
/// Longest a batch waits for one of the [`MAX_IN_FLIGHT`] slots; then it goes anyway.
const SLOT_WAIT: Duration = Duration::from_millis(20);
/// Batches one follower may have out at one leader at once, with a slot or without: each holds
/// a connection there. Past it, a batch waits (and holds back no batch for another leader).
const MAX_OUT_PER_LEADER: usize = 16;
/// Most writes in one batch (the leader refuses a longer one).
const MAX_BATCH: usize = 256;
/// Most bytes the leader's decoder allocates for the lengths a batch claims. A batch is at most
/// 8 MiB, and a value takes at most about 8 times its encoded bytes in memory (a shard report
/// of 3 bytes takes 24); without a bound below the codec's own, a body of a few bytes claiming
/// a 250 MiB key had the leader allocate and zero that much before the decode failed.
const SERVE_DECODE_LIMIT: usize = 64 << 20;
/// A batch stops growing at this many (estimated) encoded bytes; a larger write still goes,
/// alone.
const MAX_BATCH_BYTES: usize = 4 << 20;

/// Why the leader did not write a forwarded command: the parts of an [`ApiError`] that a
/// write can end in, as they travel back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// 503 `no_leader`: the receiver does not lead (any more: also when its Raft core stopped or
    /// it is closing), or there is no quorum.
    NoLeader(String),
    /// 503 `unavailable`: the leader is shutting down or its storage failed.
    Unavailable(String),
    /// 504 `timeout`: the write may still commit.
    Timeout(String),
    /// 504 `outcome_unknown`: a leader change discarded the entry; it may or may not commit.
    OutcomeUnknown(String),
    /// 400 `invalid_argument`: the leader's validation refused the command.
    Invalid(String),
    /// 404 `not_found`.
    NotFound(String),
    /// 500 `internal`.
    Internal(String),
    /// 507 `insufficient_storage`: the leader's disk is nearly full.
    InsufficientStorage(String),
    /// 503 `cluster_version`: the command needs a cluster version the leader cannot raise the
    /// cluster to yet. Sent only to a member whose build names a version of at least
    /// `CLUSTER_VERSION_REFUSAL_SINCE`: older ones cannot decode it (they get `Unavailable`).
    ClusterVersion(String),
}

/// The first build version that decodes [`Refusal::ClusterVersion`]; new variants go last, and
/// each with the version from which members understand it.
const CLUSTER_VERSION_REFUSAL_SINCE: u32 = 2;

impl Refusal {
    /// What the leader's end answers for a request from another member (a forwarded write, a
    /// read index) that failed with `e`.
    pub(crate) fn of(e: meta_consensus::Error) -> Refusal {
        if let meta_consensus::Error::ForwardToLeader { leader_id, .. } = e {
            // Forwarding again could loop on stale hints; the client retries instead.
            return Refusal::NoLeader(format!(
                "the request reached a node that does not lead (node {leader_id} does)"
            ));
        }
        if let meta_consensus::Error::Shutdown | meta_consensus::Error::Stopped(_) = e {
            // Refused before it was proposed (a write under way when the core stopped is
            // `OutcomeUnknown`): a node whose Raft core stopped, or that is closing, leads no
            // more, and the member that sent the request asks the next leader.
            return Refusal::NoLeader(format!(
                "the leader is shutting down ({}); nothing was proposed",
                match e {
                    meta_consensus::Error::Stopped(why) => format!("its Raft core stopped: {why}"),
                    _ => "it is closing".into(),
                }
            ));
        }
        match ApiError::from(e) {
            ApiError::NoLeader(m) | ApiError::NotServing(m) => Refusal::NoLeader(m),
            ApiError::Unavailable(m) => Refusal::Unavailable(m),
            ApiError::Timeout(m) => Refusal::Timeout(m),
            ApiError::OutcomeUnknown(m) => Refusal::OutcomeUnknown(m),
            ApiError::Invalid { message, .. } => Refusal::Invalid(message),
            ApiError::NotFound(m) => Refusal::NotFound(m),
            ApiError::InsufficientStorage(m) => Refusal::InsufficientStorage(m),
            ApiError::ClusterVersion { message, .. } => Refusal::ClusterVersion(message),
            other => Refusal::Internal(other.to_string()),
        }
    }
}

impl Refusal {
    /// This refusal in a form a member whose build is of version `build` decodes.
    fn for_build(self, build: u32) -> Refusal {
        match self {
            Refusal::ClusterVersion(m) if build < CLUSTER_VERSION_REFUSAL_SINCE => {
                Refusal::Unavailable(m)
            }
            r => r,
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        match r {
            Refusal::NoLeader(m) => ApiError::NoLeader(m),
            Refusal::Unavailable(m) => ApiError::Unavailable(m),
            Refusal::Timeout(m) => ApiError::Timeout(m),
            Refusal::OutcomeUnknown(m) => ApiError::OutcomeUnknown(m),
            Refusal::Invalid(m) => ApiError::invalid("invalid_argument", m),
            Refusal::NotFound(m) => ApiError::NotFound(m),
            Refusal::Internal(m) => ApiError::Internal(m),
            Refusal::InsufficientStorage(m) => ApiError::InsufficientStorage(m),
            // A batch's refusal does not say whether waiting helps: the client may retry.
            Refusal::ClusterVersion(message) => ApiError::ClusterVersion {
                message,
                retry: true,
            },
        }
    }
}

/// The leader's answer to one command of a batch.
pub type Answer = Result<Written, Refusal>;

/// Whether `cmd` is a small write ([`SMALL_WRITE_WEIGHT`] shards at most): it goes to the leader
/// in an exchange without large ones, since the leader answers an exchange once every write in
/// it is done, and admits small writes in a lane of their own.
fn small(cmd: &Command) -> bool {
    cmd.weight() <= SMALL_WRITE_WEIGHT
}

/// `batch` in parts of the same `key`, each in the order queued, the parts in the order of
/// their first write.
fn parts<T, K: PartialEq>(mut batch: Vec<T>, key: impl Fn(&T) -> K) -> Vec<Vec<T>> {
    let mut parts = Vec::new();
    while let Some(first) = batch.first() {
        let first = key(first);
        let (same, rest): (Vec<_>, Vec<_>) = batch.into_iter().partition(|q| key(q) == first);
        batch = rest;
        parts.push(same);
    }
    parts
}

/// An upper bound of a command's encoded size, for bounding batches without encoding twice.
fn wire_bytes(cmd: &Command) -> usize {
    // Varint u64s take at most 9 bytes; a shard report is three of them.
    32 + match cmd {
        Command::RegisterDatanode { addr, .. } => addr.len(),
        Command::RegisterDatanodeAtLeast { addr, .. } => addr.len() + 9,
        Command::RegisterShards { shards, .. } => shards.len() * 27,
        Command::DeregisterShards { shards, .. } => shards.len() * 9,
        Command::DeregisterShardsOf { shards, .. } => shards.len() * 9 + 9,
        Command::RemoveDatanode { .. } => 0,
        Command::RemoveDatanodePiece { .. } => 9,
        Command::PruneReplicas { .. } => 18,
        Command::Put { key, value, .. } | Command::RestorePut { key, value } => {
            key.len() + value.len()
        }
        Command::Delete { key, .. } => key.len(),
        Command::SetClusterVersion { .. } => 5,
        Command::RaiseEpochFloor { .. } | Command::ClaimForRestore { .. } => 9,
        Command::BeginRestore { .. } | Command::BeginRestoreHoldingKeys { .. } => 45,
        Command::EndRestore => 1,
    }
}

struct Queued {
    target: ForwardTo,
    command: Command,
    answer: oneshot::Sender<Result<Written, ApiError>>,
}

/// A follower's queue of writes for the leader. Cloning shares the queue; the task that
/// drains it ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Batcher {
    link: Arc<Link>,
    queue: Arc<OnceLock<mpsc::UnboundedSender<Queued>>>,
}

/// What sending a batch needs (and all the queue's task holds).
#[derive(Debug)]
struct Link {
    leader: LeaderLink,
    timeout: Duration,
    /// Per leader address: the places for batches out there.
    places: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Batcher {
    /// The batcher of node `id` (a build of `build_version`), sending with `client` and this
    /// node's `token`; a batch must be answered within `timeout`.
    pub fn new(
        id: u64,
        build_version: u32,
        cluster: ClusterId,
        client: PeerClient,
        token: Token,
        timeout: Duration,
    ) -> Self {
        Batcher {
            link: Arc::new(Link {
                leader: LeaderLink {
                    id,
                    build_version,
                    client,
                    token,
                    cluster,
                },
                timeout,
                places: Mutex::default(),
            }),
            queue: Arc::default(),
        }
    }

    /// Sends `command` to the leader `target` in the next batch and returns the leader's
    /// answer: `Ok` once the command is committed (durable on a quorum) and applied at the
    /// leader. The queue's task starts with the first write (on the caller's runtime).
    pub async fn send(&self, target: ForwardTo, command: Command) -> Result<Written, ApiError> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(self.link.clone().run(rx));
            tx
        });
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            target,
            command,
            answer,
        };
        if queue.send(queued).is_err() {
            return Err(ApiError::Unavailable(
                "the forwarding queue is closed".into(),
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(ApiError::Internal(
                "a forwarded write lost its answer".into(),
            ))
        })
    }
}

impl Link {
    /// Drains the queue into batches, at most [`MAX_IN_FLIGHT`] out at a time.
    async fn run(self: Arc<Self>, mut queue: mpsc::UnboundedReceiver<Queued>) {
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        while let Some(first) = queue.recv().await {
            // A batch stuck at a leader that stopped answering holds its slot until it times
            // out; writes behind it (perhaps for a new leader) wait for a slot only so long.
            let slot = tokio::time::timeout(SLOT_WAIT, slots.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok);
            let mut bytes = wire_bytes(&first.command);
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                match queue.try_recv() {
                    Ok(q) => {
                        bytes += wire_bytes(&q.command);
                        batch.push(q);
                    }
                    Err(_) => break,
                }
            }
            let this = self.clone();
            tokio::spawn(async move { this.send_batches(batch, slot).await });
        }
    }

    /// Sends `batch`, one exchange per leader it names (one, unless the leader just changed),
    /// concurrently, each once it has a place at its leader. `slot` is given up as soon as a
    /// part must wait for a place, so that it holds back no batch queued behind.
    async fn send_batches(&self, batch: Vec<Queued>, slot: Option<OwnedSemaphorePermit>) {
        let slot = Mutex::new(slot);
        let parts = parts(batch, |q| (q.target.addr.clone(), small(&q.command)));
        futures::future::join_all(parts.into_iter().map(|part| self.send_part(part, &slot))).await;
    }

    /// Sends `part` (writes for one leader) once it has a place there, waiting at most the
    /// exchange's timeout: past it, every write of the part is refused unsent (`no_leader`).
    /// Writes whose callers went away meanwhile are not sent; a part whose callers all went
    /// away stops waiting at once, so that callers who give up and retry against a stalled
    /// leader do not pile up parts (and their commands) for the whole timeout.
    async fn send_part(&self, mut part: Vec<Queued>, slot: &Mutex<Option<OwnedSemaphorePermit>>) {
        let target = part[0].target.clone();
        let places = self.places_at(&target.addr);
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => Some(place),
            Err(_) => {
                drop(slot.lock().unwrap_or_else(|e| e.into_inner()).take());
                let all_gone =
                    futures::future::join_all(part.iter_mut().map(|q| q.answer.closed()));
                tokio::select! {
                    waited = tokio::time::timeout(self.timeout, places.acquire_owned()) => {
                        waited.ok().and_then(Result::ok)
                    }
                    _ = all_gone => return,
                }
            }
        };
        let Some(_place) = place else {
            let e = ApiError::NoLeader(format!(
                "the leader (node {} at {}) is slow: this member's batches took all \
                 {MAX_OUT_PER_LEADER} places there for {:?}; this write was not sent",
                target.leader_id, target.addr, self.timeout
            ));
            for q in part {
                let _ = q.answer.send(Err(e.clone()));
            }
            return;
        };
        let part: Vec<Queued> = part.into_iter().filter(|q| !q.answer.is_closed()).collect();
        if !part.is_empty() {
            self.send_one_batch(part).await;
        }
    }

    /// The places for batches at the leader at `addr`.
    fn places_at(&self, addr: &str) -> Arc<Semaphore> {
        let mut map = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(addr) {
            // Forget leaders no batch is out at or waiting for (addresses of past leaders).
            map.retain(|_, s| Arc::strong_count(s) > 1);
        }
        map.entry(addr.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_OUT_PER_LEADER)))
            .clone()
    }

    async fn send_one_batch(&self, batch: Vec<Queued>) {
        let target = batch[0].target.clone();
        let commands: Vec<&Command> = batch.iter().map(|q| &q.command).collect();
        match self.exchange(&target, &commands).await {
            Ok(answers) => {
                for (q, a) in batch.into_iter().zip(answers) {
                    let _ = q.answer.send(a.map_err(ApiError::from));
                }
            }
            Err(e) => {
                for q in batch {
                    let _ = q.answer.send(Err(e.clone()));
                }
            }
        }
    }

    async fn exchange(
        &self,
        target: &ForwardTo,
        commands: &[&Command],
    ) -> Result<Vec<Answer>, ApiError> {
        let answers: Vec<Answer> = self
            .leader
            .exchange(
                target,
                PATH_FORWARD_BATCH,
                "a batch",
                self.timeout,
                commands,
            )
            .await?;
        if answers.len() != commands.len() {
            // It took the batch: any of the writes may have been made.
            return Err(ApiError::OutcomeUnknown(format!(
                "the leader (node {} at {}) answered {} of {} forwarded writes",
                target.leader_id,
                target.addr,
                answers.len(),
                commands.len()
            )));
        }
        Ok(answers)
    }
}

/// The leader's end: proposes every command of the batch on `node`, all at once, and answers
/// each, in order. Never forwards: a node that does not lead refuses each with `no_leader`.
pub async fn serve(node: MetaNode, headers: HeaderMap, body: Bytes) -> Response {
    // The forwarding member's build (none named: one that predates versions).
    let build = version_of(&headers);
    // A sender batches at most `MAX_BATCH` commands: refused before anything is decoded or
    // proposed, a longer batch (a token holder's, not a member's) cannot make the leader hold
    // millions of proposals at once.
    match codec::sequence_len(&body) {
        Some(n) if n > MAX_BATCH as u64 => {
            return ApiError::invalid(
                "bad_batch",
                format!("a forwarded batch of {n} commands: at most {MAX_BATCH}"),
            )
            .into_response()
        }
        _ => {}
    }
    let commands: Vec<Command> = match codec::decode_bounded::<_, SERVE_DECODE_LIMIT>(&body) {
        Ok(c) => c,
        Err(e) => {
            return ApiError::invalid("bad_batch", format!("undecodable forwarded batch: {e}"))
                .into_response()
        }
    };
    let answers: Vec<Answer> = futures::future::join_all(commands.into_iter().map(|c| async {
        if let Err(e) = validate_command(&c) {
            return Err(Refusal::Invalid(e.to_string()));
        }
        node.write_forwarded(c, build)
            .await
            .map_err(|e| Refusal::of(e).for_build(build))
    }))
    .await;
    match codec::encode(&answers) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => ApiError::Internal(format!("encoding a batch's answers: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests;
