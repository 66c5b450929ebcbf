//! Which cluster a message between members belongs to: every Raft RPC carries the sender's
//! cluster id (header [`CLUSTER`], hex), and the `/raft` routes refuse one of another cluster
//! (409 `other_cluster`; the sender counts the peer as unreachable and backs off). A node that
//! knows no cluster yet adopts the id of the first message (see `meta-consensus`'s
//! `cluster_id.rs`). Adding a learner first asks the new node ([`PATH_IDENTITY`]), so that a
//! node initialized on its own (started with `--init` by mistake) is refused with a clear
//! answer instead of being added and then refused by every message.

use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use meta_consensus::{ClusterId, BASE_VERSION};
use std::time::Instant;

use crate::auth::Token;
use crate::error::ApiError;
use crate::log_throttle::LogThrottle;
use crate::peer_client::{failure, tls_error, PeerClient};
use crate::state::SharedState;

/// The header that carries the sender's cluster id.
pub const CLUSTER: HeaderName = HeaderName::from_static("x-metaserver-cluster");

/// The header that names the node a message between members is for (decimal id): the
/// receiver refuses a message for another id (409 `wrong_node`), so a membership entry that
/// names the address of another process (a typo, or one process added twice) is never served
/// by that process: it would otherwise answer, and vote, for two members.
pub const TO: HeaderName = HeaderName::from_static("x-metaserver-to");

/// The header with which [`MemberLink::confirm`] asks a node to answer only if it belongs to
/// the sender's cluster already: a fresh node would otherwise adopt the cluster's id and pass.
pub const MEMBER_ONLY: HeaderName = HeaderName::from_static("x-metaserver-member-only");

/// The header with which [`PATH_IDENTITY`] answers: the answering node's id. Only a metaserver
/// that checked the addressee answers with it (`confirm` requires it).
pub const IDENTITY: HeaderName = HeaderName::from_static("x-metaserver-id");

/// The header with which [`PATH_IDENTITY`] answers the answering process's instance: a number
/// drawn when the node's server state is made, so that two addresses that reach one process
/// (a member moved from an IP address to a name for it, on the same port) tell it, where two
/// processes with the same id never share one. Builds that predate it send none.
pub const INSTANCE: HeaderName = HeaderName::from_static("x-metaserver-instance");

/// The header that names a build's version (see `meta-consensus`'s `cluster_version.rs`): a
/// node answers every Raft message and identity question with it, and the sender notes it; a
/// member sends it with what it forwards to the leader, which answers in forms that build
/// decodes. A build that predates versions sends none, which reads as [`BASE_VERSION`].
pub const VERSION: HeaderName = HeaderName::from_static("x-metaserver-version");

/// The header with which a leader asks a node to add ([`MemberLink::probe`]) for a build that
/// applies the cluster's version, named here: a node whose build applies less refuses (409
/// `build_too_old`) before it adopts the sender's cluster id, so that a refused add leaves it
/// free to join another cluster once upgraded. Builds that predate the header ignore it (and the
/// leader's own check still refuses the add).
pub const CLUSTER_VERSION: HeaderName = HeaderName::from_static("x-metaserver-cluster-version");

/// The header with which a leader with a separate member token asks a node to add
/// ([`MemberLink::probe`]) for the cluster's client token, as a fingerprint
/// ([`Token::client_fingerprint`]): a node started with another `--token` refuses (409
/// `conflict`) before it adopts the cluster's id. The member token it shares says nothing of
/// the client token, and datanodes holding the cluster's token would be refused there. Builds
/// that predate the header ignore it.
pub const CLIENT_TOKEN: HeaderName = HeaderName::from_static("x-metaserver-client-token");

/// The header that names the sender of a Raft message and its address (`id=addr`): a member
/// that rejoins asks the leader there for the cluster's term (`meta-consensus`'s
/// `node/rejoin_gate.rs`), having no membership of its own to find it in.
pub const FROM: HeaderName = HeaderName::from_static("x-metaserver-from");

/// The value of [`FROM`] for node `id` at `addr`; `None` if the address cannot be a header.
pub fn from_value(id: u64, addr: &str) -> Option<axum::http::HeaderValue> {
    axum::http::HeaderValue::from_str(&format!("{id}={addr}")).ok()
}

/// The sender and address a [`FROM`] header names, if it is one.
pub(crate) fn parse_from(value: &axum::http::HeaderValue) -> Option<(u64, &str)> {
    let (id, addr) = value.to_str().ok()?.split_once('=')?;
    let id = id.parse().ok()?;
    (!addr.is_empty() && addr.len() <= 256).then_some((id, addr))
}

/// The build version an answer from a member names ([`VERSION`]).
pub fn version_of(headers: &axum::http::HeaderMap) -> u32 {
    headers
        .get(VERSION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(BASE_VERSION)
}

/// The route a leader asks before it adds a learner: 204 if the node may join the sender's
/// cluster, 409 `other_cluster` if it belongs to another.
pub const PATH_IDENTITY: &str = "/raft/identity";

/// The header value for `cluster`, if the id is known.
pub fn header_value(cluster: &ClusterId) -> Option<String> {
    cluster.get().map(|id| format!("{id:016x}"))
}

/// The cluster id a [`CLUSTER`] header value names; `None` if it is not one.
pub fn parse(value: &axum::http::HeaderValue) -> Option<u64> {
    value
        .to_str()
        .ok()
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .filter(|id| *id != 0)
}

/// Middleware of the `/raft` routes: refuses a message of another cluster (first: it says
/// more), then one for another node, then one that asks for a build newer than this one
/// ([`CLUSTER_VERSION`]), and only then lets a node that knows no cluster yet adopt the
/// sender's. Every answer names this node's build version ([`VERSION`]).
pub async fn check_cluster(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    versioned(&state, request, next, true).await
}

/// Middleware of the routes on which members ask the leader (forwarded writes, read indexes):
/// as [`check_cluster`], but a node that knows no cluster adopts none. It leads none, and a
/// write or a read index from a cluster it never joined must not make it join one: such a
/// request is answered 503 `no_leader` (the sender's view of the leader is out of date).
pub async fn check_member(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    versioned(&state, request, next, false).await
}

/// [`checked`], its answer naming this node's build version.
async fn versioned(state: &SharedState, request: Request, next: Next, adopt: bool) -> Response {
    let version = state.node.config().build_version;
    let mut response = checked(state, request, next, adopt).await;
    response
        .headers_mut()
        .insert(VERSION, axum::http::HeaderValue::from(version));
    response
}

/// The checks of [`check_cluster`]; `adopt`: a node without a cluster joins the sender's.
async fn checked(state: &SharedState, request: Request, next: Next, adopt: bool) -> Response {
    let node = &state.node;
    let theirs = match request.headers().get(CLUSTER) {
        // Sent by a node that knows no cluster (a fresh node's vote request).
        None => None,
        Some(value) => match parse(value) {
            Some(id) => Some(id),
            None => {
                return ApiError::invalid("bad_rpc", "the cluster id header is not a hex id")
                    .into_response()
            }
        },
    };
    if let Some(refused) = refuse_other_cluster(state, theirs) {
        return refused;
    }
    if request.headers().contains_key(MEMBER_ONLY) && node.cluster_id().is_none() {
        return ApiError::WrongNode(format!(
            "node {} here holds no cluster's data: it is a new node, not the member that moved",
            node.id()
        ))
        .into_response();
    }
    if let Some(value) = request.headers().get(TO) {
        let Some(to) = value.to_str().ok().and_then(|v| v.parse::<u64>().ok()) else {
            return ApiError::invalid("bad_rpc", "the addressee header is not a node id")
                .into_response();
        };
        if to != node.id() {
            if let Some(since) = state
                .refusals
                .note(Refused::WrongNode(to), (), Instant::now())
            {
                tracing::warn!(
                    "refused a message for node {to} sent to this node's address ({}): this is \
                     node {}{}",
                    node.addr(),
                    node.id(),
                    more(since)
                );
            }
            return ApiError::WrongNode(format!(
                "this is node {}, not node {to}: node {to} was looked for at this address (a \
                 membership or a request to add it names it for node {to}); give node {to} its \
                 own address",
                node.id()
            ))
            .into_response();
        }
    }
    if let Some(value) = request.headers().get(CLUSTER_VERSION) {
        let Some(cluster) = value.to_str().ok().and_then(|v| v.parse::<u32>().ok()) else {
            return ApiError::invalid("bad_rpc", "the cluster version header is not a number")
                .into_response();
        };
        let build = node.config().build_version;
        if cluster > build {
            return ApiError::BuildTooOld(format!(
                "node {} runs a build that applies cluster version {build} at most, and the \
                 cluster is at version {cluster}: upgrade it first",
                node.id()
            ))
            .into_response();
        }
    }
    if let Some(fingerprint) = request.headers().get(CLIENT_TOKEN) {
        // Salted with the cluster's id, or nothing before a cluster is formed.
        let cluster = request
            .headers()
            .get(CLUSTER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !state
            .token
            .same_client_token(cluster, fingerprint.as_bytes())
        {
            let why = match state.token.is_set() {
                true => {
                    "another client token (--token, METASERVER_TOKEN) than the node adding it: \
                     datanodes and operators holding the cluster's token would be refused here"
                }
                false => {
                    "no client token (--token, METASERVER_TOKEN), unlike the node adding it: it \
                     would take anyone's requests"
                }
            };
            return ApiError::Conflict(format!(
                "node {} was started with {why}; start it with the cluster's token",
                node.id()
            ))
            .into_response();
        }
    }
    let Some(theirs) = theirs else {
        return next.run(request).await;
    };
    if !adopt && node.cluster_id().is_none() {
        return ApiError::NoLeader(format!(
            "node {} belongs to no cluster yet, so it leads none",
            node.id()
        ))
        .into_response();
    }
    match node.accept_cluster(theirs).await {
        Ok(()) => {
            // Parsed only while this node rejoins: that is when it needs the address.
            if node.is_rejoining() {
                if let Some((id, addr)) = request.headers().get(FROM).and_then(parse_from) {
                    node.note_member_address(id, addr);
                }
            }
            next.run(request).await
        }
        Err(meta_consensus::Error::OtherCluster { ours, theirs }) => {
            other_cluster(&state.refusals, ours, theirs)
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// What the routes between members refuse, by cause: each is logged once, then at most every
/// 30 s with the count of refusals between ([`LogThrottle`]), since the sender retries for as
/// long as the cause lasts (a node wiped and initialized anew retries several times a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Refused {
    /// Messages of this other cluster.
    OtherCluster(u64),
    /// Messages for this other node, sent to this node's address.
    WrongNode(u64),
}

/// `" (N more since the last line)"` for a repeated line that left `since` refusals unlogged.
fn more(since: u64) -> String {
    if since == 0 {
        String::new()
    } else {
        format!(" ({since} more refused since the last line)")
    }
}

/// The refusal (409 `other_cluster`, logged) of a message whose sender names cluster `theirs`
/// while this node belongs to another; `None` when they agree, or either is not known.
pub fn refuse_other_cluster(state: &SharedState, theirs: Option<u64>) -> Option<Response> {
    match (theirs, state.node.cluster_id()) {
        (Some(theirs), Some(ours)) if theirs != ours => {
            Some(other_cluster(&state.refusals, ours, theirs))
        }
        _ => None,
    }
}

fn other_cluster(refusals: &LogThrottle<Refused>, ours: u64, theirs: u64) -> Response {
    if let Some(since) = refusals.note(Refused::OtherCluster(theirs), (), Instant::now()) {
        tracing::warn!(
            ours = format!("{ours:016x}"),
            theirs = format!("{theirs:016x}"),
            "refused a message from another cluster{}",
            more(since)
        );
    }
    ApiError::OtherCluster(meta_consensus::Error::OtherCluster { ours, theirs }.to_string())
        .into_response()
}

/// Whether an answer to a message between members (`status`, `body`) refused it as another
/// cluster's (409 `other_cluster`).
pub fn refuses_as_other_cluster(status: reqwest::StatusCode, body: &[u8]) -> bool {
    status == reqwest::StatusCode::CONFLICT
        && serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v["error"]["code"] == "other_cluster")
}

/// Whether an answer with `status` and `body` is a TLS node's to a plain request (400
/// `tls_required`, `server.rs`).
pub fn asks_for_tls(status: reqwest::StatusCode, body: &[u8]) -> bool {
    status == reqwest::StatusCode::BAD_REQUEST
        && serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v["error"]["code"] == "tls_required")
}

/// `POST /raft/identity`: past [`check_cluster`], the node may join the sender's cluster.
pub async fn identity(State(state): State<SharedState>) -> Response {
    let node = &state.node;
    let mut answer = (
        axum::http::StatusCode::NO_CONTENT,
        [
            (IDENTITY, node.id().to_string()),
            (INSTANCE, format!("{:016x}", state.instance)),
        ],
    )
        .into_response();
    // The cluster it belongs to, so that an initialize can tell a node of another cluster.
    if let Some(value) = header_value(&node.config().cluster_id)
        .and_then(|v| axum::http::HeaderValue::from_str(&v).ok())
    {
        answer.headers_mut().insert(CLUSTER, value);
    }
    answer
}

/// Adds what every request from this node to another member carries: the token, this
/// cluster's id once it is known, and the addressee (`to`).
pub fn addressed(
    request: reqwest::RequestBuilder,
    token: &Token,
    cluster: &ClusterId,
    to: u64,
) -> reqwest::RequestBuilder {
    let mut request = request.header(TO, to.to_string());
    if let Some(value) = token.header_value() {
        request = request.header(axum::http::header::AUTHORIZATION, value);
    }
    match header_value(cluster) {
        Some(value) => request.header(CLUSTER, value),
        None => request,
    }
}

/// How a node's admin handlers speak to another node as members of one cluster (asking its
/// identity, telling it it was removed): the connection pool, the token and the cluster's id.
#[derive(Clone, Copy)]
pub struct MemberLink<'a> {
    pub client: &'a PeerClient,
    pub token: &'a Token,
    pub cluster: &'a ClusterId,
}

impl MemberLink<'_> {
    /// `POST path` at `addr` for node `id`; `None` while this node knows no cluster id.
    pub fn post(&self, id: u64, addr: &str, path: &str) -> Option<reqwest::RequestBuilder> {
        self.cluster.get()?;
        Some(self.post_carrying(self.cluster, id, addr, path))
    }

    /// `POST path` at `addr` for node `id`, carrying `cluster`'s id if it knows one.
    fn post_carrying(
        &self,
        cluster: &ClusterId,
        id: u64,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let request = self
            .client
            .http()
            .post(self.client.url(addr, path))
            .timeout(std::time::Duration::from_secs(5));
        addressed(request, self.token, cluster, id)
    }

    /// Adds the client token's fingerprint for `cluster` ([`CLIENT_TOKEN`]) to a question to a
    /// node that may join, with a separate member token: without one, a node with another
    /// client token refuses the member token too (401).
    fn with_client_token(
        &self,
        request: reqwest::RequestBuilder,
        cluster: &str,
    ) -> reqwest::RequestBuilder {
        match self.token.has_member_token() {
            true => request.header(CLIENT_TOKEN, self.token.client_fingerprint(cluster)),
            false => request,
        }
    }

    /// Asks the node at `addr` whether it may join this cluster, of version `cluster_version`,
    /// as node `id`: [`ApiError::OtherCluster`] if it answers that it belongs to another,
    /// [`ApiError::WrongNode`] if it is another node, [`ApiError::BuildTooOld`] if its build
    /// cannot apply that version, [`ApiError::Conflict`] if it refuses this cluster's token or
    /// answers as no metaserver would (4xx, or 5xx without naming its build). `Ok` if it may
    /// (with the version of its build when a metaserver consented), or if it cannot be asked (a
    /// node may be added before it is started). A fresh node that consents belongs to this
    /// cluster from then on; one that refuses adopted nothing.
    pub async fn probe(
        &self,
        id: u64,
        addr: &str,
        cluster_version: u32,
    ) -> Result<Option<u32>, ApiError> {
        let Some(mut request) = self.post(id, addr, PATH_IDENTITY) else {
            return Ok(None);
        };
        if let Some(cluster) = header_value(self.cluster) {
            request = self.with_client_token(request, &cluster);
        }
        let asked = request
            .header(CLUSTER_VERSION, cluster_version.to_string())
            .send()
            .await;
        match asked {
            Ok(answer) => {
                let status = answer.status();
                let consented = status == reqwest::StatusCode::NO_CONTENT
                    && answer.headers().contains_key(IDENTITY);
                let version = consented.then(|| version_of(answer.headers()));
                let metaserver = answer.headers().contains_key(VERSION);
                refusal(answer, addr).await?;
                if status.is_client_error() || (status.is_server_error() && !metaserver) {
                    return Err(not_a_metaserver(id, addr, status));
                }
                Ok(version)
            }
            // Something answers there that this node cannot trust: adding it would leave a
            // member no message reaches.
            Err(e) => match tls_error(&e) {
                Some(tls) => Err(untrusted(id, addr, tls)),
                None => Ok(None),
            },
        }
    }

    /// Like [`MemberLink::probe`], but node `id` must answer at `addr`, as a node that belongs
    /// to this cluster already (a member's new address is only taken from the member itself,
    /// restarted there from its data): [`ApiError::Conflict`] if nothing answers there,
    /// [`ApiError::WrongNode`] if a new node with that id does. Two processes answering for one
    /// member could vote twice. `Ok` with the process that answered.
    pub async fn confirm(&self, id: u64, addr: &str) -> Result<Instance, ApiError> {
        match self.ask_member(id, addr).await {
            Some(Ok(answer)) => {
                if is_node(&answer, id) {
                    return Ok(Instance::of(&answer));
                }
                refusal(answer, addr).await?;
                Err(ApiError::Conflict(format!(
                    "what answers at {addr} is not node {id} of this cluster"
                )))
            }
            Some(Err(e)) => Err(match tls_error(&e) {
                Some(tls) => untrusted(id, addr, tls),
                None => ApiError::Conflict(format!(
                    "node {id} does not answer at {addr} ({}): start it there first",
                    failure(&e)
                )),
            }),
            None => Err(ApiError::Conflict(
                "this node knows no cluster id to ask with".into(),
            )),
        }
    }

    /// Asks what answers at the address of each of `members` but `me`, before a cluster of them
    /// is initialized here (which cannot be undone): [`ApiError::WrongNode`] if another node
    /// answers, [`ApiError::OtherCluster`] if the node belongs to a cluster already (it would
    /// refuse every message of the new one), [`ApiError::Conflict`] if it refuses the token or
    /// is not a metaserver. A member that does not answer, or whose metaserver answers 5xx (it
    /// is stopping, say), passes: members may start after the one that initializes. The
    /// question carries no cluster id, so no node adopts one; builds that do not name their
    /// cluster pass. A node that holds a cluster id is refused whatever the id: the initialize
    /// makes a fresh one.
    pub async fn check_init_members(
        &self,
        me: u64,
        members: &std::collections::BTreeMap<u64, String>,
    ) -> Result<(), ApiError> {
        let asks = members
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(id, addr)| self.check_init_member(*id, addr));
        futures::future::try_join_all(asks).await.map(|_| ())
    }

    async fn check_init_member(&self, id: u64, addr: &str) -> Result<(), ApiError> {
        let request = self.post_carrying(&ClusterId::default(), id, addr, PATH_IDENTITY);
        let request = self.with_client_token(request, "");
        let answer = match request.send().await {
            Ok(answer) => answer,
            Err(e) => {
                return match tls_error(&e) {
                    Some(tls) => Err(untrusted(id, addr, tls)),
                    None => Ok(()),
                }
            }
        };
        if is_node(&answer, id) {
            // Any cluster's: the initialize records a fresh id, also over one this node adopted
            // (from a failed add) that the peer may have adopted too.
            let Some(theirs) = answer.headers().get(CLUSTER).and_then(parse) else {
                return Ok(());
            };
            return Err(ApiError::OtherCluster(format!(
                "node {id} at {addr} belongs to a cluster already ({theirs:016x}), and would \
                 refuse every message of the one initialized here: if this node is a member of \
                 that cluster whose data dir was lost, start it without --init and it rejoins; \
                 to form a new cluster, start node {id} on an empty data dir first"
            )));
        }
        let status = answer.status();
        // A metaserver names its build on every answer of these routes, also a refusal.
        let metaserver = answer.headers().contains_key(VERSION);
        if status.is_server_error() && metaserver {
            return Ok(());
        }
        refusal(answer, addr).await?;
        Err(not_a_metaserver(id, addr, status))
    }

    /// The process that answers at `addr` as node `id` of this cluster, holding its data (it
    /// runs there); `None` if none does.
    pub async fn answers_as(&self, id: u64, addr: &str) -> Option<Instance> {
        match self.ask_member(id, addr).await {
            Some(Ok(answer)) if is_node(&answer, id) => Some(Instance::of(&answer)),
            _ => None,
        }
    }

    /// Sends [`PATH_IDENTITY`] to `addr`, for node `id` of this cluster that belongs to it
    /// already; `None` while this node knows no cluster id.
    async fn ask_member(&self, id: u64, addr: &str) -> Option<reqwest::Result<reqwest::Response>> {
        let request = self.post(id, addr, PATH_IDENTITY)?;
        Some(request.header(MEMBER_ONLY, "1").send().await)
    }
}

/// The process that answered an identity question, as its [`INSTANCE`] header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance(Option<u64>);

impl Instance {
    fn of(answer: &reqwest::Response) -> Instance {
        let named = answer.headers().get(INSTANCE).and_then(|v| v.to_str().ok());
        Instance(named.and_then(|v| u64::from_str_radix(v, 16).ok()))
    }

    /// Whether `other` is certainly this very process: both named the same instance (a build
    /// that names none is never taken for another answer's process).
    pub fn same_process(self, other: Instance) -> bool {
        self.0.is_some() && self.0 == other.0
    }
}

/// The refusal of a member whose TLS handshake failed: it answers, but this node cannot trust
/// it (or it does not speak TLS), so no message of the cluster would reach it.
fn untrusted(id: u64, addr: &str, tls: &rustls::Error) -> ApiError {
    if matches!(tls, rustls::Error::InvalidMessage(_)) {
        // It answered something that is no TLS: plain HTTP.
        return ApiError::Conflict(format!(
            "node {id} at {addr} does not speak TLS ({tls}), and every member of this cluster \
             does: start it with --tls-cert, --tls-key and --tls-ca"
        ));
    }
    ApiError::Conflict(format!(
        "node {id} at {addr} answers, but the TLS handshake with it failed ({tls}): it needs a \
         certificate that an authority of --tls-ca signed for the host of {addr}"
    ))
}

/// The refusal of an address where something else than a metaserver answers.
fn not_a_metaserver(id: u64, addr: &str, status: reqwest::StatusCode) -> ApiError {
    ApiError::Conflict(format!(
        "what answers at {addr} is not a metaserver node (it answered {status}): give node {id} \
         the address it listens at"
    ))
}

/// Whether an answer to [`PATH_IDENTITY`] is node `id`'s consent: 204 with its id.
fn is_node(answer: &reqwest::Response, id: u64) -> bool {
    answer.status() == reqwest::StatusCode::NO_CONTENT
        && answer
            .headers()
            .get(IDENTITY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            == Some(id)
}

/// What an answer to [`PATH_IDENTITY`] refuses, if anything: 401 (another token) and 409
/// (another cluster, another node or an older build) refuse; anything else does not.
async fn refusal(answer: reqwest::Response, addr: &str) -> Result<(), ApiError> {
    let status = answer.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(ApiError::Conflict(format!(
            "the node at {addr} refuses this cluster's token: start it with the same --token \
             and --member-token"
        )));
    }
    if status == reqwest::StatusCode::FORBIDDEN {
        // A node without a token on loopback answers only the names it knows (`auth.rs`).
        return Err(ApiError::Conflict(format!(
            "the node at {addr} refuses requests addressed to that name (a node without a \
             token that listens on loopback takes only names without a dot and those its \
             settings give): start it with --advertise {addr}"
        )));
    }
    if status != reqwest::StatusCode::CONFLICT && status != reqwest::StatusCode::BAD_REQUEST {
        return Ok(());
    }
    let bad_request = status == reqwest::StatusCode::BAD_REQUEST;
    let text = answer.text().await.unwrap_or_default();
    if bad_request {
        // A TLS node answers a plain request so (`server.rs`); any other 400 is no member's.
        return match text.contains("\"tls_required\"") {
            true => Err(ApiError::Conflict(format!(
                "the node at {addr} speaks TLS only, and this cluster plain HTTP: every member \
                 has TLS, or none"
            ))),
            false => Ok(()),
        };
    }
    let error = serde_json::from_str::<serde_json::Value>(&text).ok();
    let code = error
        .as_ref()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
    let message = error
        .as_ref()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(text);
    let message = format!("the node at {addr} refuses to join: {message}");
    Err(match code.as_deref() {
        Some("wrong_node") => ApiError::WrongNode(message),
        Some("build_too_old") => ApiError::BuildTooOld(message),
        Some("conflict") => ApiError::Conflict(message),
        _ => ApiError::OtherCluster(message),
    })
}

#[cfg(test)]
mod tests {
    use super::Instance;

    #[test]
    fn only_answers_naming_one_instance_are_one_process() {
        assert!(Instance(Some(7)).same_process(Instance(Some(7))));
        assert!(!Instance(Some(7)).same_process(Instance(Some(8))));
        // A build that names none may be any process.
        assert!(!Instance(None).same_process(Instance(None)));
        assert!(!Instance(None).same_process(Instance(Some(7))));
        assert!(!Instance(Some(7)).same_process(Instance(None)));
    }
}
