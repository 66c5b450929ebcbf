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
use meta_consensus::{codec, ClusterId, Command, MetaNode, Written};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::auth::Token;
use crate::cluster_identity::version_of;
use crate::error::{ApiError, ForwardTo};
use crate::leader_exchange::LeaderLink;
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
    /// 503 `no_leader`: the receiver does not lead (any more), or there is no quorum.
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
        match ApiError::from(e) {
            ApiError::NoLeader(m) => Refusal::NoLeader(m),
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
        Command::Put { key, value, .. } => key.len() + value.len(),
        Command::Delete { key, .. } => key.len(),
        Command::SetClusterVersion { .. } => 5,
        Command::RaiseEpochFloor { .. } => 9,
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
        client: reqwest::Client,
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
    async fn send_batches(&self, mut batch: Vec<Queued>, slot: Option<OwnedSemaphorePermit>) {
        let slot = Mutex::new(slot);
        let mut parts = Vec::new();
        while let Some(first) = batch.first() {
            let addr = first.target.addr.clone();
            let (same, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|q| q.target.addr == addr);
            batch = rest;
            parts.push(same);
        }
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
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use futures::FutureExt;
    use meta_consensus::CommandResult;

    /// The index a stand-in leader answers for the write of key `w<N>`: 100 + N.
    fn index_of(cmd: &Command) -> u64 {
        match cmd {
            Command::Put { key, .. } => 100 + key[1..].parse::<u64>().unwrap(),
            other => panic!("unexpected command {other}"),
        }
    }

    /// A stand-in leader that reports each batch's keys, holds its answer until released,
    /// then answers every write as written at [`index_of`], except key `w13`, which it
    /// refuses as a node that does not lead would.
    async fn fake_leader() -> (String, mpsc::UnboundedReceiver<Vec<String>>, Arc<Semaphore>) {
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let gate = release.clone();
        let app = Router::new().route(
            PATH_FORWARD_BATCH,
            post(move |body: Bytes| {
                let seen = seen_tx.clone();
                let gate = gate.clone();
                async move {
                    let commands: Vec<Command> = codec::decode(&body).unwrap();
                    let keys = commands
                        .iter()
                        .map(|c| match c {
                            Command::Put { key, .. } => key.clone(),
                            other => panic!("unexpected command {other}"),
                        })
                        .collect();
                    seen.send(keys).unwrap();
                    gate.acquire().await.unwrap().forget();
                    let answers: Vec<Answer> = commands
                        .iter()
                        .map(|c| match index_of(c) {
                            113 => Err(Refusal::of(meta_consensus::Error::ForwardToLeader {
                                leader_id: 3,
                                leader_addr: "127.0.0.1:1".into(),
                            })),
                            index => Ok(Written {
                                index,
                                result: CommandResult::Empty,
                            }),
                        })
                        .collect();
                    codec::encode(&answers).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, seen_rx, release)
    }

    /// The next thing the stand-in leader saw; fails the test if it saw nothing within 10 s.
    async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the stand-in leader heard nothing in time")
            .expect("the stand-in leader is gone")
    }

    fn write(i: u64) -> Command {
        Command::Put {
            key: format!("w{i}"),
            value: b"v".to_vec(),
            if_revision: None,
        }
    }

    /// The refusals of a build that predates versions, as it decodes them.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum RefusalOfVersion1 {
        NoLeader(String),
        Unavailable(String),
        Timeout(String),
        OutcomeUnknown(String),
        Invalid(String),
        NotFound(String),
        Internal(String),
        InsufficientStorage(String),
    }

    #[test]
    fn a_member_of_an_older_build_gets_refusals_it_decodes() {
        let refused = || Refusal::ClusterVersion("node 3 runs a build of version 1".into());
        let decode = |r: Refusal| {
            let answers: Vec<Answer> = vec![Err(r)];
            let bytes = codec::encode(&answers).unwrap();
            codec::decode::<Vec<Result<Written, RefusalOfVersion1>>>(&bytes)
        };
        let old = decode(refused().for_build(1)).unwrap();
        assert!(
            matches!(&old[..], [Err(RefusalOfVersion1::Unavailable(m))] if m.contains("node 3")),
            "{old:?}"
        );
        // Sent as it is, the refusal would fail the whole batch's answer there.
        assert!(decode(refused().for_build(2)).is_err());
        assert_eq!(refused().for_build(2), refused());
    }

    fn batcher(timeout: Duration) -> Batcher {
        Batcher::new(
            2,
            meta_consensus::BUILD_VERSION,
            ClusterId::default(),
            crate::network::peer_client(),
            Token::new(None),
            timeout,
        )
    }

    #[tokio::test]
    async fn writes_queued_behind_busy_batches_go_together_and_get_their_own_answers() {
        let (addr, mut seen, release) = fake_leader().await;
        let target = ForwardTo { leader_id: 1, addr };
        let b = batcher(Duration::from_secs(30));
        let mut first = Box::pin(b.send(target.clone(), write(0)));
        assert!((&mut first).now_or_never().is_none());
        // The first write leaves alone; with one more batch allowed out, the next write leaves
        // at once too, and takes the writes queued behind it.
        assert_eq!(next(&mut seen).await, vec!["w0".to_string()]);
        let mut rest: Vec<_> = (1..5)
            .map(|i| Box::pin(b.send(target.clone(), write(i))))
            .collect();
        for f in &mut rest {
            assert!(f.now_or_never().is_none(), "queued, not answered");
        }
        let second = next(&mut seen).await;
        assert_eq!(second, (1..5).map(|i| format!("w{i}")).collect::<Vec<_>>());
        release.add_permits(2);
        assert_eq!(first.await.unwrap().index, 100);
        for (i, f) in rest.into_iter().enumerate() {
            assert_eq!(f.await.unwrap().index, 101 + i as u64);
        }
    }

    #[tokio::test]
    async fn a_refused_write_gets_its_refusal_and_the_others_of_its_batch_their_answers() {
        let (addr, mut seen, release) = fake_leader().await;
        let target = ForwardTo { leader_id: 1, addr };
        let b = batcher(Duration::from_secs(30));
        // Two slots taken, so the next three go together.
        let mut busy: Vec<_> = (0..2)
            .map(|i| Box::pin(b.send(target.clone(), write(i))))
            .collect();
        for f in &mut busy {
            assert!(f.now_or_never().is_none());
            next(&mut seen).await;
        }
        let mut batch: Vec<_> = (12..15)
            .map(|i| Box::pin(b.send(target.clone(), write(i))))
            .collect();
        for f in &mut batch {
            assert!(f.now_or_never().is_none());
        }
        release.add_permits(3);
        assert_eq!(next(&mut seen).await, vec!["w12", "w13", "w14"]);
        let answers = futures::future::join_all(batch).await;
        assert_eq!(answers[0].as_ref().unwrap().index, 112);
        let refused = answers[1].as_ref().unwrap_err();
        assert_eq!(
            (refused.status().as_u16(), refused.code()),
            (503, "no_leader"),
            "{refused}"
        );
        assert_eq!(answers[2].as_ref().unwrap().index, 114);
    }

    /// The leader (node 1) at `addr`.
    fn to(addr: &str) -> ForwardTo {
        ForwardTo {
            leader_id: 1,
            addr: addr.to_string(),
        }
    }

    /// A forwarded write under way.
    type Pending<'a> =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Written, ApiError>> + Send + 'a>>;

    /// Sends the writes `keys` to `target` one at a time, each once the previous one's batch
    /// reached the stand-in leader (so each leaves in a batch of its own), and returns them.
    async fn one_batch_each<'a>(
        b: &'a Batcher,
        target: &ForwardTo,
        keys: std::ops::Range<u64>,
        seen: &mut mpsc::UnboundedReceiver<Vec<String>>,
    ) -> Vec<Pending<'a>> {
        let mut out: Vec<Pending<'a>> = Vec::new();
        for i in keys {
            let mut w: Pending<'a> = Box::pin(b.send(target.clone(), write(i)));
            assert!((&mut w).now_or_never().is_none());
            let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
                .await
                .expect("a batch with a place goes");
            assert_eq!(keys.unwrap(), vec![format!("w{i}")]);
            out.push(w);
        }
        out
    }

    /// Waits until a batch waits for a place at the leader at `addr`, every place taken: its
    /// semaphore is then held by the map, the places taken, the waiting batch and this.
    async fn parked_at(b: &Batcher, addr: &str) {
        let places = b.link.places_at(addr);
        let parked = async {
            while Arc::strong_count(&places) < 1 + MAX_OUT_PER_LEADER + 1 + 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), parked)
            .await
            .expect("the batch past the cap waits for a place");
        assert_eq!(places.available_permits(), 0);
    }

    #[tokio::test]
    async fn batches_stuck_at_a_silent_leader_do_not_hold_back_writes_for_another() {
        let (silent, mut seen, _never) = fake_leader().await;
        let (live, _seen_live, release) = fake_leader().await;
        release.add_permits(1);
        let b = batcher(Duration::from_secs(300));
        // Both slots go to batches the silent leader never answers.
        let _stuck = one_batch_each(&b, &to(&silent), 0..2, &mut seen).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), b.send(to(&live), write(7)))
            .await
            .expect("the write for the live leader is answered");
        assert_eq!(answer.unwrap().index, 107);
    }

    #[tokio::test]
    async fn a_silent_leader_holds_at_most_so_many_batches_of_one_follower() {
        let (silent, mut seen, release) = fake_leader().await;
        let (live, _seen_live, live_release) = fake_leader().await;
        live_release.add_permits(1);
        let b = batcher(Duration::from_secs(300));
        // One write at a time, each once the previous batch has reached the leader: every one
        // leaves in a batch of its own, the first two in the slots, the rest without. (Keys from
        // w20: the stand-in refuses w13.)
        let cap = MAX_OUT_PER_LEADER as u64;
        let out = one_batch_each(&b, &to(&silent), 20..20 + cap, &mut seen).await;
        let mut waiting = Box::pin(b.send(to(&silent), write(50)));
        assert!((&mut waiting).now_or_never().is_none());
        parked_at(&b, &silent).await;
        assert!(seen.try_recv().is_err(), "a batch past the cap went");
        // The cap is per leader: a write for another still goes.
        let answer = tokio::time::timeout(Duration::from_secs(10), b.send(to(&live), write(7)))
            .await
            .expect("the write for the live leader is answered");
        assert_eq!(answer.unwrap().index, 107);
        // One answer frees a place, and the waiting batch takes it.
        release.add_permits(1);
        let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .expect("the waiting batch goes once a place is free");
        assert_eq!(keys.unwrap(), vec!["w50".to_string()]);
        release.add_permits(MAX_OUT_PER_LEADER);
        for (i, w) in out.into_iter().enumerate() {
            assert_eq!(w.await.unwrap().index, 120 + i as u64);
        }
        assert_eq!(waiting.await.unwrap().index, 150);
    }

    #[tokio::test]
    async fn a_batch_for_two_leaders_sends_each_part_on_its_own() {
        let (silent, mut seen, _never) = fake_leader().await;
        let (live, mut seen_live, release) = fake_leader().await;
        release.add_permits(1);
        let b = batcher(Duration::from_secs(300));
        // Both slots go to batches the silent leader never answers.
        let _stuck = one_batch_each(&b, &to(&silent), 0..2, &mut seen).await;
        // Queued together while the slots are taken: one batch, a part for each leader.
        let mut old = Box::pin(b.send(to(&silent), write(5)));
        assert!((&mut old).now_or_never().is_none());
        let new = b.send(to(&live), write(7));
        let answer = tokio::time::timeout(Duration::from_secs(10), new)
            .await
            .expect("the part for the live leader does not wait for the silent one");
        assert_eq!(answer.unwrap().index, 107);
        assert_eq!(next(&mut seen).await, vec!["w5".to_string()]);
        assert_eq!(next(&mut seen_live).await, vec!["w7".to_string()]);
    }

    #[tokio::test]
    async fn a_write_whose_caller_went_away_while_it_waited_is_not_sent() {
        let (addr, mut seen, release) = fake_leader().await;
        let target = ForwardTo { leader_id: 1, addr };
        let b = batcher(Duration::from_secs(300));
        let cap = MAX_OUT_PER_LEADER as u64;
        let out = one_batch_each(&b, &target, 20..20 + cap, &mut seen).await;
        // Every place is taken: the handles to the places are those of the batches out.
        let places = b.link.places_at(&target.addr);
        let out_only = Arc::strong_count(&places);
        let mut gone = Box::pin(b.send(target.clone(), write(60)));
        assert!((&mut gone).now_or_never().is_none());
        parked_at(&b, &target.addr).await;
        let count_until = |what: &'static str, done: fn(usize, usize) -> bool| {
            let places = places.clone();
            async move {
                let reached = async {
                    while !done(Arc::strong_count(&places) - 1, out_only) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                };
                tokio::time::timeout(Duration::from_secs(10), reached)
                    .await
                    .expect(what);
            }
        };
        count_until("the write's batch waits for a place", |now, out| now > out).await;
        drop(gone);
        // The abandoned write's batch stops waiting at once, no place freed: it holds nothing
        // (a handle to the places, its command) for the rest of the timeout.
        count_until("the abandoned batch still waits for a place", |now, out| {
            now == out
        })
        .await;
        drop(places);
        // The next batch is the next write's.
        release.add_permits(1);
        let next = b.send(target.clone(), write(61));
        let mut next = Box::pin(next);
        assert!((&mut next).now_or_never().is_none());
        let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .expect("the next write goes");
        assert_eq!(keys.unwrap(), vec!["w61".to_string()]);
        release.add_permits(MAX_OUT_PER_LEADER + 1);
        assert_eq!(next.await.unwrap().index, 161);
        for w in out {
            w.await.unwrap();
        }
    }

    #[tokio::test]
    async fn an_unreachable_leader_fails_every_write_of_the_batch_with_503() {
        let refused = crate::refused_port::RefusedPort::new();
        let target = ForwardTo {
            leader_id: 1,
            addr: format!("127.0.0.1:{}", refused.port),
        };
        let b = batcher(Duration::from_secs(5));
        let answers =
            futures::future::join_all((0..3).map(|i| b.send(target.clone(), write(i)))).await;
        for a in answers {
            let e = a.unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), (503, "no_leader"), "{e}");
            assert!(e.to_string().contains("unreachable"), "{e}");
        }
    }

    /// A leader that answers every batch with `status` and `body`.
    async fn answering(status: u16, body: &'static [u8]) -> String {
        let app = Router::new().route(
            PATH_FORWARD_BATCH,
            post(move || async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    /// What a member answers for a write by what the leader did with its batch: refused it
    /// without acting (another cluster or node at the address, a body too slow: try again,
    /// 503), or took it and answered what the member cannot read (it may have acted: 504).
    #[tokio::test]
    async fn a_leaders_answer_maps_to_whether_it_may_have_acted() {
        let b = batcher(Duration::from_secs(5));
        for (status, body, expected) in [
            (409, &b"{}"[..], (503, "no_leader")),
            (408, &b"{}"[..], (503, "no_leader")),
            (401, &b"{}"[..], (500, "internal")),
            (200, &b"\xff\xff\xff"[..], (504, "outcome_unknown")),
        ] {
            let target = ForwardTo {
                leader_id: 1,
                addr: answering(status, body).await,
            };
            let e = b.send(target, write(1)).await.unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), expected, "{status}: {e}");
        }
    }

    #[test]
    fn refusals_keep_the_status_and_code_of_the_leaders_error() {
        use meta_consensus::Error as E;
        for (e, status, code) in [
            (E::NoLeader, 503, "no_leader"),
            (E::Shutdown, 503, "unavailable"),
            (E::Timeout, 504, "timeout"),
            (E::OutcomeUnknown("x".into()), 504, "outcome_unknown"),
            (E::InvalidArgument("x".into()), 400, "invalid_argument"),
            (E::NotFound("x".into()), 404, "not_found"),
            (E::Snapshot("x".into()), 500, "internal"),
        ] {
            let refusal = Refusal::of(e);
            let back: Refusal = codec::decode(&codec::encode(&refusal).unwrap()).unwrap();
            let api = ApiError::from(back);
            assert_eq!((api.status().as_u16(), api.code()), (status, code), "{api}");
        }
    }
}
