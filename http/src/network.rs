//! The Raft transport between processes, client side: openraft's network factory over HTTP.
//!
//! One pooled HTTP/1.1 client (keep-alive, no Nagle delay) carries every RPC to every peer;
//! bodies are bincode through the consensus crate's codec module (the one place that knows
//! the encoding). Replication streams AppendEntries over one exchange per session
//! (`append_stream.rs`); vote and transfer-leader RPCs, and AppendEntries when openraft sends
//! one alone, are bounded by openraft's per-RPC soft TTL plus an allowance for the body's
//! size. A full snapshot is streamed from its file with no overall timeout (a registry of a
//! million replicas must get through), ending early only when openraft cancels it. A peer that
//! cannot be connected to, or that is shutting down, answers openraft's `Unreachable`, which
//! makes openraft back off before retrying (with the backoff of the node's Raft configuration).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use meta_consensus::{
    Addresses, ClusterId, Node, NodeConfig, NodeId, PeerVersions, ProbeMembers, Removal,
    RemovalNotice, SnapshotData, SnapshotPace, TermProbe, TypeConfig, Vote,
};
use openraft::alias::SnapshotOf;
use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::append_stream::{answers, requests, AnswerPolicy, Frames, Outstanding};
use crate::auth::Token;
use crate::cluster_identity;
use crate::frame::frames;
use crate::limits::MAX_RAFT_BODY_BYTES;
use crate::log_throttle::LogThrottle;
use crate::peer_client::{failure, PeerClient};
use crate::raft_routes::{
    encode_snapshot_prefix, encode_snapshot_records, RemoteResult, PATH_APPEND, PATH_APPEND_STREAM,
    PATH_PRE_VOTE, PATH_SNAPSHOT, PATH_TRANSFER_LEADER, PATH_VOTE, REMOVED, SNAPSHOT_BYTES,
    SNAPSHOT_RECORDS,
};
use crate::term_probe::HttpTermProbe;
use peer_failures::{PeerFailures, Unanswered};
use room_backoff::{RoomBackoff, ROOM_REFUSAL};

/// One answer of a streamed AppendEntries exchange, as openraft takes it.
type StreamAnswer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;
use meta_consensus::codec;

/// Slowest pace (bytes per second) assumed for sending, decoding and durably appending an RPC
/// body on a busy peer: each RPC's deadline grows by its body's size at this pace. 10 MB/s
/// proved too optimistic on a CPU-starved machine (a 1 MiB append missed its deadline on every
/// resend and the write timed out); at 2 MB/s the largest body (8 MiB) may take 4 s, and only
/// replication to that one peer waits that long. Heartbeats keep the short deadline.
const SLOW_BYTES_PER_SEC: u64 = 2_000_000;

/// An RPC's deadline: openraft's soft TTL (derived from the heartbeat interval, sized for small
/// bodies) plus the time `body_bytes` take at [`SLOW_BYTES_PER_SEC`], so a large AppendEntries
/// is not timed out, and resent forever, merely for being large.
fn rpc_timeout(option: &RPCOption, body_bytes: usize) -> Duration {
    let transfer_micros = body_bytes as u64 * 1_000_000 / SLOW_BYTES_PER_SEC;
    option.soft_ttl() + Duration::from_micros(transfer_micros)
}

/// How many times [`rpc_timeout`] an AppendEntries to a peer may take after `timeouts`
/// exchanges with it in a row ran out of time: twice as long per timeout, at most
/// [`MAX_PATIENCE`] times. A peer too starved for a large append's deadline would otherwise
/// miss it on every resend, and the write would time out although the peer is alive.
fn patience(timeouts: u32) -> u32 {
    1 << timeouts.min(MAX_PATIENCE.trailing_zeros())
}

/// The most [`patience`] grows to: a 1 MiB append may then take about 4.5 s.
const MAX_PATIENCE: u32 = 8;

/// Counts the AppendEntries exchanges with one peer that ran out of time in a row (see
/// [`patience`]); kept by the network factory, so it outlives a connection. Only exchanges
/// that carried entries count: openraft sends heartbeats (entry-less, on a connection of their
/// own) every heartbeat interval, and a starved peer answers them in time while a large append
/// misses its deadline; counting their answers reset the patience before the resend could use
/// it, so such an append never got more than twice its deadline.
#[derive(Debug, Default)]
struct Patience(AtomicU32);

impl Patience {
    fn deadline(&self, option: &RPCOption, body_bytes: usize) -> Duration {
        rpc_timeout(option, body_bytes) * patience(self.0.load(Ordering::Relaxed))
    }

    /// Records how an exchange ended.
    fn record<T>(&self, answer: &Result<T, RPCError<TypeConfig>>) {
        match answer {
            Ok(_) => self.0.store(0, Ordering::Relaxed),
            Err(RPCError::Timeout(_)) => {
                let _ = self
                    .0
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some(n.saturating_add(1))
                    });
            }
            Err(_) => {}
        }
    }
}

/// Maps a failed exchange from `from` to `target` at `base`: no connection is `Unreachable`
/// (openraft backs off), an expired deadline is `Timeout`, anything else a `NetworkError`.
fn rpc_error(
    from: NodeId,
    target: NodeId,
    base: &str,
    action: RPCTypes,
    timeout: Duration,
    e: reqwest::Error,
) -> RPCError<TypeConfig> {
    // The causes too: a refused certificate is otherwise told from a network failure by
    // nothing. A connection that could not be made in time is unreachable, not an RPC that
    // timed out.
    let why = || format!("node {target} at {base}: {}", failure(&e));
    if e.is_connect() || (e.is_request() && !e.is_timeout()) {
        RPCError::Unreachable(Unreachable::from_string(why()))
    } else if e.is_timeout() {
        RPCError::Timeout(Timeout {
            action,
            id: from,
            target,
            timeout,
        })
    } else {
        RPCError::Network(NetworkError::from_string(why()))
    }
}

/// openraft's network factory over HTTP. Cloning shares the connection pool.
#[derive(Clone, Debug)]
pub struct HttpNetwork {
    id: NodeId,
    client: PeerClient,
    token: Token,
    cluster: ClusterId,
    removal: RemovalNotice,
    addresses: Addresses,
    versions: PeerVersions,
    refusals: PeerFailures,
    patience: Arc<Mutex<HashMap<NodeId, Arc<Patience>>>>,
    /// The snapshot sends logged at INFO, per member and snapshot file.
    snapshot_notices: Arc<LogThrottle<NodeId, PathBuf>>,
    /// The members that refused snapshots for want of room, and how long to wait.
    room_backoff: Arc<RoomBackoff>,
    /// The node's snapshot rate limiter: snapshots streamed to members are paced with its
    /// exports and downloads (`NodeConfig::snapshot_pace`).
    snapshot_pace: SnapshotPace,
    /// This node and its address ([`cluster_identity::FROM`]), sent with every message.
    sender: Option<reqwest::header::HeaderValue>,
}

impl HttpNetwork {
    /// The network of the node `cfg` configures; every RPC carries `token` when one is set.
    /// It shares the node's handles: every RPC carries the cluster's id once it is known
    /// (`NodeConfig::cluster_id`), and removal notices that come back with vote answers reach
    /// the node (`NodeConfig::removal_notice`), and so do the build versions the members
    /// answer with (`NodeConfig::peer_versions`) and their refusals of this node's messages as
    /// another cluster's (`NodeConfig::peer_refusals`).
    pub fn new(cfg: &NodeConfig, token: Token) -> Self {
        HttpNetwork {
            id: cfg.id,
            client: PeerClient::plain(),
            token,
            cluster: cfg.cluster_id.clone(),
            removal: cfg.removal_notice.clone(),
            addresses: cfg.addresses.clone(),
            versions: cfg.peer_versions.clone(),
            refusals: PeerFailures::new(cfg.peer_refusals.clone()),
            patience: Arc::default(),
            snapshot_notices: Arc::default(),
            room_backoff: Arc::default(),
            snapshot_pace: cfg.snapshot_pace.clone(),
            sender: cluster_identity::from_value(cfg.id, &cfg.addr),
        }
    }
}

impl HttpNetwork {
    /// Speaks to the members with `client` (TLS, when the node has it) rather than plain HTTP.
    pub fn with_client(mut self, client: PeerClient) -> Self {
        self.client = client;
        self
    }
}

impl ProbeMembers for HttpNetwork {
    fn term_probe(&self) -> Arc<dyn TermProbe> {
        Arc::new(HttpTermProbe::new(
            self.client.clone(),
            self.token.clone(),
            self.cluster.clone(),
        ))
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetwork {
    type Network = HttpConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> HttpConnection {
        let base = self.client.url(&node.addr, "");
        // Parsed once: AppendEntries is the hottest RPC and URL parsing is not free.
        let append_url = reqwest::Url::parse(&format!("{base}{PATH_APPEND}")).ok();
        HttpConnection {
            from: self.id,
            target,
            addr: node.addr.clone(),
            base,
            append_url,
            addresses: self.addresses.clone(),
            client: self.client.clone(),
            token: self.token.clone(),
            cluster: self.cluster.clone(),
            removal: self.removal.clone(),
            versions: self.versions.clone(),
            refusals: self.refusals.clone(),
            sender: self.sender.clone(),
            patience: self
                .patience
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(target)
                .or_default()
                .clone(),
            snapshot_notices: self.snapshot_notices.clone(),
            room_backoff: self.room_backoff.clone(),
            snapshot_pace: self.snapshot_pace.clone(),
        }
    }
}

/// RPCs from this node to one peer.
#[derive(Debug)]
pub struct HttpConnection {
    from: NodeId,
    target: NodeId,
    /// The target's address, and the scheme (`http://` or `https://`) + it.
    addr: String,
    base: String,
    /// `base` + [`PATH_APPEND`], parsed; `None` if the address does not parse (then every
    /// request fails the same way when it is built).
    append_url: Option<reqwest::Url>,
    /// The members' current addresses: a member moved by a membership change is sent its
    /// messages at its new address (openraft keeps this connection across that change).
    addresses: Addresses,
    client: PeerClient,
    token: Token,
    cluster: ClusterId,
    removal: RemovalNotice,
    /// Where the build version of each answer is noted (`cluster_identity::VERSION`).
    versions: PeerVersions,
    /// Where the target's refusals of this node's messages are noted (as another cluster's,
    /// or of its token), and its answers that take one.
    refusals: PeerFailures,
    /// This node and its address ([`cluster_identity::FROM`]).
    sender: Option<reqwest::header::HeaderValue>,
    patience: Arc<Patience>,
    snapshot_notices: Arc<LogThrottle<NodeId, PathBuf>>,
    room_backoff: Arc<RoomBackoff>,
    snapshot_pace: SnapshotPace,
}

impl HttpConnection {
    /// Takes the target's address from the membership if it moved since this connection was
    /// made. Called before every message.
    fn follow_move(&mut self) {
        let Some(addr) = self.addresses.moved_from(self.target, &self.addr) else {
            return;
        };
        tracing::info!(target_node = self.target, from = %self.addr, to = %addr, "member moved");
        self.base = self.client.url(&addr, "");
        self.append_url = reqwest::Url::parse(&format!("{}{PATH_APPEND}", self.base)).ok();
        self.addr = addr;
    }

    fn request(&self, path: &str) -> reqwest::RequestBuilder {
        let builder = match &self.append_url {
            Some(url) if path == PATH_APPEND => self.client.http().post(url.clone()),
            _ => self.client.http().post(format!("{}{}", self.base, path)),
        };
        let mut request = builder.header(reqwest::header::CONTENT_TYPE, "application/octet-stream");
        if let Some(sender) = &self.sender {
            request = request.header(cluster_identity::FROM, sender.clone());
        }
        cluster_identity::addressed(request, &self.token, &self.cluster, self.target)
    }

    /// Maps a failed exchange; see [`rpc_error`].
    fn rpc_error(
        &self,
        action: RPCTypes,
        timeout: Duration,
        e: reqwest::Error,
    ) -> RPCError<TypeConfig> {
        rpc_error(self.from, self.target, &self.base, action, timeout, e)
    }

    /// Decodes a peer's answer: a refusal of the request (4xx: another cluster, another
    /// node, another token) is `Refused`, `Unreachable` to openraft, as for a streamed append,
    /// so that openraft backs off at once rather than resend what will be refused again;
    /// another non-2xx status or an undecodable body is a network error; an error the peer
    /// reports (it is shutting down, its storage failed, it does not vote) is `Refused` too.
    fn answer<T: DeserializeOwned>(
        &self,
        status: reqwest::StatusCode,
        body: &[u8],
    ) -> Result<T, RemoteFailure> {
        self.refusals.note(self.target, status, body);
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            let message = format!("node {} answered {status}: {text}", self.target);
            return Err(if status.is_client_error() {
                RemoteFailure::Refused(message)
            } else {
                RemoteFailure::Network(message)
            });
        }
        let result: RemoteResult<T> = codec::decode(body)
            .map_err(|e| RemoteFailure::Network(format!("node {}: {e}", self.target)))?;
        result.map_err(|message| RemoteFailure::Refused(format!("node {}: {message}", self.target)))
    }

    /// Asks for a vote or a pre-vote at `path`. A peer that answers refusing it (it does not
    /// vote yet, it gave a lease to a leader, it refuses this node's token or cluster) gave no
    /// vote: that is its answer, a rejection, not a failure to reach it, which openraft warns
    /// of as an unreachable node (several times a second from a member with a wrong token; the
    /// refusal is logged once here, `peer_failures.rs`).
    async fn ask_vote(
        &self,
        path: &str,
        rpc: &VoteRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let body = codec::encode(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match self.exchange(path, RPCTypes::Vote, body, option).await {
            // No answer (a member down) is no vote either: the failure is logged once in 30 s
            // (`peer_failures.rs`), where openraft warned of each, about once a second per
            // member down while no leader is elected.
            Err(Failed::NoAnswer(e)) => {
                tracing::debug!(target = self.target, "no answer to a vote request: {e}");
                Ok(VoteResponse::new(Vote::new(0, 0), None, false))
            }
            Err(Failed::Answered(RemoteFailure::Refused(why))) => {
                tracing::debug!(target = self.target, "vote refused: {why}");
                // With the least vote there is: openraft adopts a vote higher than its own
                // from an answer, and a pre-vote asks with the candidate's next term, which it
                // has not taken (answered with the request's own vote, every refused pre-vote
                // round raised the candidate's term; with the term before, a vote of a higher
                // node id in the candidate's term made it forget its leader).
                Ok(VoteResponse::new(Vote::new(0, 0), None, false))
            }
            answer => answer.map_err(Failed::into_rpc),
        }
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        action: RPCTypes,
        rpc: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let body = codec::encode(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.send(path, action, body, option).await
    }

    /// Sends an encoded request body and decodes the answer.
    async fn send<Resp: DeserializeOwned>(
        &self,
        path: &str,
        action: RPCTypes,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        self.exchange(path, action, body, option)
            .await
            .map_err(Failed::into_rpc)
    }

    /// [`HttpConnection::send`], telling a peer's answer from no answer.
    async fn exchange<Resp: DeserializeOwned>(
        &self,
        path: &str,
        action: RPCTypes,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, Failed> {
        let timeout = rpc_timeout(option, body.len());
        let response = self
            .request(path)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                self.versions.forget(self.target);
                let how = Unanswered::of(&e);
                let failed = self.rpc_error(action, timeout, e);
                self.refusals.failed(self.target, &failed, how);
                Failed::NoAnswer(failed)
            })?;
        let status = response.status();
        if status.is_success() {
            self.versions.note(
                self.target,
                cluster_identity::version_of(response.headers()),
            );
        }
        if let Some(removal) = response
            .headers()
            .get(REMOVED)
            .and_then(|v| v.to_str().ok())
            .and_then(Removal::decode)
        {
            self.removal.note(removal);
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failed::NoAnswer(self.rpc_error(action, timeout, e)))?;
        self.answer(status, &bytes).map_err(Failed::Answered)
    }
}

/// How an exchange with a peer failed.
enum Failed {
    /// No answer: no connection, no answer in time, an answer cut off.
    NoAnswer(RPCError<TypeConfig>),
    /// The peer answered, refusing the request or failing it.
    Answered(RemoteFailure),
}

impl Failed {
    fn into_rpc(self) -> RPCError<TypeConfig> {
        match self {
            Failed::NoAnswer(e) => e,
            Failed::Answered(failure) => failure.into_rpc(),
        }
    }
}

/// The least time between two replication exchanges with a member whose last answer refused
/// this node's messages as another cluster's.
const REFUSED_PAUSE: Duration = Duration::from_secs(5);

/// Most AppendEntries requests a streamed exchange has unanswered. In the single-shard bench
/// (interleaved runs), a window of 1 against 8: the same at one client, +17% at 16 clients
/// (4,500/s against 3,860, server CPU per registration 318 us against 395) and +12% at 64:
/// one request at a time lets the entries submitted meanwhile gather into the next one, while
/// the stream still saves the HTTP exchange per request.
const APPEND_WINDOW: usize = 1;

/// A peer's failure, before it becomes one of openraft's error types.
enum RemoteFailure {
    /// It refused the request, or reports an error of its own: `Unreachable` to openraft.
    Refused(String),
    Network(String),
}

impl RemoteFailure {
    fn into_rpc(self) -> RPCError<TypeConfig> {
        match self {
            RemoteFailure::Refused(m) => RPCError::Unreachable(Unreachable::from_string(m)),
            RemoteFailure::Network(m) => RPCError::Network(NetworkError::from_string(m)),
        }
    }

    fn into_streaming(self) -> StreamingError<TypeConfig> {
        match self {
            RemoteFailure::Refused(m) => StreamingError::Unreachable(Unreachable::from_string(m)),
            RemoteFailure::Network(m) => StreamingError::Network(NetworkError::from_string(m)),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for HttpConnection {
    type SnapshotData = SnapshotData;

    /// Sends one request to the follower's `/raft/append` and waits for its answer. openraft
    /// replicates through [`Self::stream_append`] and calls this only from its default
    /// streaming, which that replaces; it is the plain form of the same RPC.
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_move();
        self.call(PATH_APPEND, RPCTypes::AppendEntries, &rpc, &option)
            .await
    }

    /// Streams the session's requests to the follower's `/raft/append-stream` as frames of one
    /// request body and reads its answers, in order, from the response (see `append_stream.rs`).
    /// At most `APPEND_WINDOW` requests are unanswered at a time. Setting up the exchange must
    /// take at most openraft's soft TTL; after that each answer is due within the deadline of
    /// `rpc_timeout` for its request's size, longer after timeouts (`patience`).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, StreamAnswer>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        self.follow_move();
        Box::pin(async move {
            // openraft waits out its backoff when the request stream yields a request, so the
            // first one is taken before connecting: otherwise a peer that refuses connections
            // would be retried at once, in a loop, with a warning each time.
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(futures::stream::empty().boxed());
            };
            // A member that refused this node's messages as another cluster's (wiped, and
            // initialized on its own) refuses them until it rejoins: asked at openraft's pace,
            // twice a second, each refusal costs both sides a connection and a warning.
            if let Some(wait) = self.refusals.wait_before_asking(self.target, REFUSED_PAUSE) {
                tokio::time::sleep(wait).await;
            }
            // Whether this exchange carried entries yet: only then do its answers say how much
            // time appends to this peer need (see `Patience`).
            let carried = Arc::new(AtomicBool::new(false));
            let input = futures::stream::iter([first]).chain(input).inspect({
                let carried = carried.clone();
                move |rpc: &AppendEntriesRequest<TypeConfig>| {
                    if !rpc.entries.is_empty() {
                        carried.store(true, Ordering::Relaxed);
                    }
                }
            });
            let outstanding = Arc::new(Outstanding::default());
            let body = requests(input, outstanding.clone(), APPEND_WINDOW);
            let timed_out = {
                let (from, target) = (self.from, self.target);
                move |timeout| {
                    RPCError::Timeout(Timeout {
                        action: RPCTypes::AppendEntries,
                        id: from,
                        target,
                        timeout,
                    })
                }
            };
            let exchange = self
                .request(PATH_APPEND_STREAM)
                .body(reqwest::Body::wrap_stream(body))
                .send();
            let (peer, from, target, base) = (
                format!("node {} at {}", self.target, self.base),
                self.from,
                self.target,
                self.base.clone(),
            );
            let refusals = self.refusals.clone();
            // The peer's build version comes with the exchange's headers, once; it is noted
            // with every answer, since a session may last for hours and only recent answers
            // count (see `meta-consensus`'s `cluster_version.rs`).
            let version = Arc::new(AtomicU32::new(0));
            let session_version = version.clone();
            let connecting = async move {
                let response = exchange.await.map_err(|e| {
                    let how = Unanswered::of(&e);
                    let failed = rpc_error(
                        from,
                        target,
                        &base,
                        RPCTypes::AppendEntries,
                        Duration::ZERO,
                        e,
                    );
                    refusals.failed(target, &failed, how);
                    failed
                })?;
                let status = response.status();
                if !status.is_success() {
                    let body = response.bytes().await.unwrap_or_default();
                    refusals.note(target, status, &body);
                    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
                    let message = format!("node {target} answered {status}: {text}");
                    // A peer that refuses the exchange (a token mismatch, not a member's
                    // address) will refuse it again: back off at once.
                    if status.is_client_error() {
                        return Err(RPCError::Unreachable(Unreachable::from_string(message)));
                    }
                    return Err(RPCError::Network(NetworkError::from_string(message)));
                }
                refusals.accepted(target);
                session_version.store(
                    cluster_identity::version_of(response.headers()),
                    Ordering::Relaxed,
                );
                let frames: Frames = frames(response.bytes_stream(), MAX_RAFT_BODY_BYTES)
                    .map(|frame| frame.map_err(|e| e.to_string()))
                    .boxed();
                Ok(frames)
            };
            let patience = self.patience.clone();
            let policy = AnswerPolicy {
                peer,
                deadline: Box::new(move |bytes| patience.deadline(&option, bytes)),
                timed_out: Box::new(timed_out),
            };
            let (patience, versions) = (self.patience.clone(), self.versions.clone());
            let failures = self.refusals.clone();
            Ok(answers(Box::pin(connecting), outstanding, policy)
                .inspect(move |answer| {
                    if carried.load(Ordering::Relaxed) {
                        patience.record(answer);
                    }
                    // A member that takes the connection and then answers nothing (a paused
                    // process, a stalled host) ends the exchange this way; a refusal is noted
                    // where it is read, and a failed connect where it fails.
                    if let Err(e @ (RPCError::Network(_) | RPCError::Timeout(_))) = answer {
                        failures.failed(target, e, Unanswered::Other);
                    }
                    let v = version.load(Ordering::Relaxed);
                    if answer.is_err() {
                        // The member may be restarting, perhaps as another build.
                        versions.forget(target);
                    } else if v != 0 {
                        versions.note(target, v);
                    }
                })
                .boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_move();
        self.ask_vote(PATH_VOTE, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_move();
        self.ask_vote(PATH_PRE_VOTE, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.follow_move();
        let mut cancel = std::pin::pin!(cancel);
        // A member that refused the last one for want of room gets the next later
        // (`network/room_backoff.rs`).
        if let Some(wait) = self
            .room_backoff
            .wait(self.target, std::time::Instant::now())
        {
            tracing::debug!(
                target_node = self.target,
                ?wait,
                "snapshot waits: no room there"
            );
            tokio::select! {
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                () = tokio::time::sleep(wait) => {}
            }
        }
        let network = |m: String| StreamingError::Network(NetworkError::from_string(m));
        let prefix = encode_snapshot_prefix(&vote).map_err(|e| network(e.to_string()))?;
        let path = snapshot.snapshot.path().to_path_buf();
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| network(format!("opening snapshot {}: {e}", path.display())))?;
        let file_bytes = file
            .metadata()
            .await
            .map_err(|e| network(format!("reading snapshot {}: {e}", path.display())))?
            .len();
        let bytes = snapshot.snapshot.payload_bytes();
        // Counted once per snapshot (a read of the file whole): a member without room for the
        // registry they make refuses before the body.
        let data = snapshot.snapshot.clone();
        let counted = tokio::task::spawn_blocking(move || data.import_records()).await;
        let records = counted
            .map_err(|e| e.to_string())
            .and_then(|counted| counted.map_err(|e| e.to_string()))
            .inspect_err(|e| {
                tracing::debug!(
                    target_node = self.target,
                    "not announcing the snapshot's records: {e}"
                )
            })
            .ok();
        match self
            .snapshot_notices
            .note(self.target, path.clone(), std::time::Instant::now())
        {
            Some(0) => tracing::info!(
                target_node = self.target,
                file = %path.display(),
                bytes,
                "streaming snapshot"
            ),
            Some(again) => tracing::info!(
                target_node = self.target,
                file = %path.display(),
                bytes,
                "streaming snapshot again (sent {again} more times since the last line)"
            ),
            None => {
                tracing::debug!(target_node = self.target, file = %path.display(), "streaming snapshot")
            }
        }
        // Paced with the node's other snapshot traffic (the rate is the operator's bound on
        // it); a node that begins to close lifts the rate, and so ends a pause.
        let file = self.snapshot_pace.paced(file);
        let stream =
            futures::stream::once(async move { Ok::<Bytes, std::io::Error>(prefix.into()) }).chain(
                tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024),
            );
        // No timeout: a large snapshot takes as long as it takes; openraft cancels it when
        // replication to this peer stops (leadership lost, peer removed).
        let exchange = async {
            let mut request = self
                .request(PATH_SNAPSHOT)
                .header(SNAPSHOT_BYTES, file_bytes);
            if let Some(records) = &records {
                request = request.header(SNAPSHOT_RECORDS, encode_snapshot_records(records));
            }
            let response = request
                .body(reqwest::Body::wrap_stream(stream))
                .send()
                .await
                .map_err(|e| self.rpc_error(RPCTypes::InstallSnapshot, Duration::ZERO, e))?;
            let status = response.status();
            let bytes = response
                .bytes()
                .await
                .map_err(|e| self.rpc_error(RPCTypes::InstallSnapshot, Duration::ZERO, e))?;
            Ok::<_, RPCError<TypeConfig>>((status, bytes))
        };
        let (status, bytes) = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            result = exchange => result.map_err(StreamingError::from)?,
        };
        let answer = self.answer(status, &bytes);
        // The leader's status and a refused promotion name a member short of room.
        match &answer {
            Err(RemoteFailure::Refused(m)) if RoomBackoff::is_room_refusal(m) => {
                self.room_backoff
                    .refused(self.target, std::time::Instant::now());
                let why = m.find(ROOM_REFUSAL).map_or(m.as_str(), |at| &m[at..]);
                self.refusals
                    .snapshot_answered(self.target, Some(why.to_owned()));
            }
            _ => {
                self.room_backoff.cleared(self.target);
                self.refusals.snapshot_answered(self.target, None);
            }
        }
        answer.map_err(RemoteFailure::into_streaming)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_move();
        self.call(
            PATH_TRANSFER_LEADER,
            RPCTypes::TransferLeader,
            &req,
            &option,
        )
        .await
    }
}

mod peer_failures;
mod room_backoff;

#[cfg(test)]
mod tests;
