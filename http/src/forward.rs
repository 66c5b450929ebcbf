//! Forwarding: a request that reaches a follower but must be answered by the leader is replayed
//! there, so clients can talk to any member.
//!
//! Registry and key-value writes do not come this way: their handlers send the command itself
//! to the leader (`writer.rs`, `forward_batch.rs`). The middleware here replays the rest:
//! linearizable reads that a follower does not answer itself (`follower_read.rs`), membership
//! changes, and a write whose node learned that it does not lead only from its Raft core. It
//! buffers the request body (bounded by the body limit, which is where 413 `body_too_large`
//! comes from), runs the handler, and if the handler answered "forward to leader" sends the same
//! method, path, query, body and `Authorization` header to the leader and streams its answer
//! back. A replayed request carries a marker header; a node receiving one never forwards again
//! (it answers 503 `no_leader`), so a stale leader hint cannot loop. A read (GET, HEAD), a
//! membership change or a heartbeat that no leader answered goes round again once this node
//! learns of the next leader (`failover.rs`); the leader's own 503 `no_leader` to such a replay
//! is read here to tell it from others.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use meta_consensus::ClusterId;

use crate::auth::Token;
use crate::bounded_body::read_bounded;
use crate::cluster_identity;
use crate::error::{ApiError, ForwardTo, ReadIndexHint};
use crate::failover;
use crate::follower_read::READ_INDEX;
use crate::forward_batch::Batcher;
use crate::limits::MAX_BODY_BYTES;
use crate::peer_client::{failure, PeerClient};
use crate::raw_path;
use crate::state::SharedState;

/// Marks a request forwarded by another member; its value is that member's id.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("x-metaserver-forwarded-by");

/// How long the leader may take to answer a forwarded request (its own request timeout,
/// plus slack).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers of the leader's answer that are relayed to the client.
const RELAYED: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::RETRY_AFTER,
    HeaderName::from_static("x-revision"),
];

/// Sends requests on to the leader. Cloning shares the connection pool.
#[derive(Clone, Debug)]
pub struct Forwarder {
    id: u64,
    client: PeerClient,
    token: Token,
    /// Sent with a replayed request, so the leader can tell a member's replay (whose read
    /// index it may trust) from a client's request that only claims to be one.
    cluster: ClusterId,
    /// Writes go to the leader as commands, in batches.
    batcher: Batcher,
}

/// The parts of a request needed to replay it.
struct Replay {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Replay {
    /// The path and query to replay.
    fn path(&self) -> &str {
        self.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    }

    /// Whether the request may be asked again of any leader (see [`may_ask_again`]).
    fn may_ask_again(&self) -> bool {
        may_ask_again(&self.method, self.uri.path())
    }

    /// Whether the request moves the leadership: its leader answers once another node leads.
    fn moves_leader(&self) -> bool {
        self.method == Method::PUT && self.uri.path() == "/v1/cluster/leader"
    }
}

/// Whether a request may be asked again of another leader, and dropped at a leader that stopped
/// answering: a read (changes nothing wherever it is answered), a heartbeat (the leader notes in
/// memory when it heard the datanode: a leader that hears it again, or a new leader that hears it
/// first, notes what the datanode meant), or a membership change (a target state: adding a
/// learner again at its address, setting the same voters, address or leader again, or making
/// a voter a voter again, changes nothing; removing a learner or a voter again answers 404).
/// Writes of commands are not (`writer.rs` says which of their refusals may be sent on).
fn may_ask_again(method: &Method, path: &str) -> bool {
    match *method {
        Method::GET | Method::HEAD => true,
        Method::POST => path == "/v1/cluster/learners" || is_heartbeat(path),
        Method::PUT => {
            path == "/v1/cluster/voters"
                || path.starts_with("/v1/cluster/voters/")
                || path == "/v1/cluster/leader"
                || path.starts_with("/v1/cluster/members/")
        }
        Method::DELETE => {
            path.starts_with("/v1/cluster/learners/") || path.starts_with("/v1/cluster/voters/")
        }
        _ => false,
    }
}

/// Whether `path` is a datanode's heartbeat (`/v1/datanodes/{id}/heartbeat`).
fn is_heartbeat(path: &str) -> bool {
    path.strip_prefix("/v1/datanodes/")
        .and_then(|rest| rest.strip_suffix("/heartbeat"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// Maps a failed request to the leader `target`: no connection made (nothing was sent) is 503
/// `no_leader`; no answer in time is 504 `timeout`; a connection that broke after the request
/// went out is 504 `outcome_unknown` when the request may change something (`acts`: the leader
/// may have acted on it), else 503 `no_leader`.
pub(crate) fn leader_failed(target: &ForwardTo, e: &reqwest::Error, acts: bool) -> ApiError {
    let leader = format!("the leader (node {} at {})", target.leader_id, target.addr);
    if e.is_connect() {
        ApiError::NoLeader(format!("{leader} is unreachable: {}", failure(e)))
    } else if e.is_timeout() {
        leader_late(target)
    } else if acts {
        ApiError::OutcomeUnknown(format!(
            "{leader} broke off the exchange after the request went out ({e}): it may have been \
             acted on"
        ))
    } else {
        ApiError::NoLeader(format!("{leader} broke off the exchange: {e}"))
    }
}

/// The leader `target` did not answer within [`FORWARD_TIMEOUT`].
fn leader_late(target: &ForwardTo) -> ApiError {
    ApiError::Timeout(format!(
        "the leader (node {} at {}) did not answer in time",
        target.leader_id, target.addr
    ))
}

/// The whole body of the leader's short answer `response`, within [`FORWARD_TIMEOUT`].
async fn small_body(
    response: reqwest::Response,
    target: &ForwardTo,
    acts: bool,
) -> Result<bytes::Bytes, ApiError> {
    match tokio::time::timeout(FORWARD_TIMEOUT, response.bytes()).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(leader_failed(target, &e, acts)),
        Err(_) => Err(leader_late(target)),
    }
}

impl Forwarder {
    /// The forwarder of node `id` (a build of `build_version`) of cluster `cluster`, speaking
    /// to the leader with `client`.
    pub fn new(
        id: u64,
        build_version: u32,
        token: Token,
        cluster: ClusterId,
        client: PeerClient,
    ) -> Self {
        Forwarder {
            id,
            batcher: Batcher::new(
                id,
                build_version,
                cluster.clone(),
                client.clone(),
                token.clone(),
                FORWARD_TIMEOUT,
            ),
            client,
            token,
            cluster,
        }
    }

    /// The connection pool to the leader (shared with everything else that asks it).
    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    /// The queue of forwarded writes (commands) for the leader.
    pub fn batcher(&self) -> &Batcher {
        &self.batcher
    }

    /// Replays `replay` at the leader `target` in an exchange of its own and streams the
    /// answer back. A read with the leader's `read_index` carries it along.
    async fn replay(
        &self,
        target: &ForwardTo,
        read_index: Option<ReadIndexHint>,
        replay: Replay,
    ) -> Response {
        let (url, raw_path) = raw_path::replay_url(&self.client, &target.addr, replay.path());
        tracing::debug!(leader = target.leader_id, %url, "forwarding to the leader");
        // A request that may be asked again (a read, a heartbeat, a membership change: see
        // [`may_ask_again`]) whose exchange broke is not answered `outcome_unknown`, as a write
        // would be, but `no_leader`, and goes round to the next leader (`failover.rs`).
        let ask_again = replay.may_ask_again();
        let acts = !ask_again;
        let mut request = self
            .client
            .http()
            .request(replay.method, &url)
            .header(FORWARDED_BY, self.id)
            .body(replay.body);
        if let Some(ReadIndexHint(index)) = read_index {
            request = request.header(READ_INDEX, index);
        }
        if let Some(raw) = raw_path {
            request = request.header(raw_path::RAW_PATH, raw);
        }
        if let Some(cluster) = cluster_identity::header_value(&self.cluster) {
            request = request.header(cluster_identity::CLUSTER, cluster);
        }
        for name in [header::CONTENT_TYPE, header::ACCEPT] {
            if let Some(value) = replay.headers.get(&name) {
                request = request.header(name, value);
            }
        }
        // The request is this member's now (the client was authenticated here): it carries
        // the member token, so that the leader takes its member headers as a member's. Without
        // a token here, the client's own credentials go along.
        match self.token.header_value() {
            Some(value) => request = request.header(header::AUTHORIZATION, value),
            None => {
                if let Some(value) = replay.headers.get(header::AUTHORIZATION) {
                    request = request.header(header::AUTHORIZATION, value);
                }
            }
        }
        // The time limit is the answer's head's, and then each piece's of its body
        // (`with_patience`): a long answer that its client reads slowly is not cut off.
        let response = match tokio::time::timeout(FORWARD_TIMEOUT, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return leader_failed(target, &e, acts).into_response(),
            Err(_) => return leader_late(target).into_response(),
        };
        let status = response.status();
        let mut relayed = Response::builder().status(status.as_u16());
        for name in RELAYED {
            if let Some(value) = response.headers().get(name.as_str()) {
                if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                    relayed = relayed.header(name, value);
                }
            }
        }
        let small = response
            .content_length()
            .is_some_and(|n| n <= MAX_REFUSAL_BYTES);
        let refusal = status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST;
        if refusal && small {
            // A route or a query this node took and the leader does not know: the leader runs
            // an older build (this one's leader would take it as this node did).
            let body = match small_body(response, target, acts).await {
                Ok(body) => body,
                Err(failed) => return failed.into_response(),
            };
            if let Some(refused) = unknown_to_older_build(&body) {
                return ApiError::ClusterVersion {
                    retry: false,
                    message: format!(
                        "the leader (node {} at {}) runs an older build, which does not take \
                         this request ({refused}): upgrade it (restarted on a newer build, it \
                         hands its leadership to another member) and ask again",
                        target.leader_id, target.addr
                    ),
                }
                .into_response();
            }
            return relayed
                .body(Body::from(body))
                .unwrap_or_else(|e| ApiError::Internal(e.to_string()).into_response());
        }
        let body = if ask_again && status == StatusCode::SERVICE_UNAVAILABLE && small {
            // A leader's refusal of a read or a membership change is read here: one that says it
            // does not lead makes the request go on to the next leader (`failover.rs`).
            let body = match small_body(response, target, acts).await {
                Ok(body) => body,
                Err(failed) => return failed.into_response(),
            };
            if let Some(refused) = no_leader_message(&body) {
                return ApiError::NoLeader(format!(
                    "the leader (node {} at {}) refused: {refused}",
                    target.leader_id, target.addr
                ))
                .into_response();
            }
            Body::from(body)
        } else {
            Body::from_stream(with_patience(
                Box::pin(response.bytes_stream()),
                FORWARD_TIMEOUT,
            ))
        };
        relayed
            .body(body)
            .unwrap_or_else(|e| ApiError::Internal(e.to_string()).into_response())
    }
}

/// `chunks`, ended with an error once none came for `patience` after it was asked for: a
/// leader that stalls in the middle of an answer does not hold its client for ever, while a
/// client that reads a long answer slowly (the pieces are asked for as it reads) is not cut
/// off, as a limit on the whole exchange cut it.
fn with_patience<S, E>(
    chunks: S,
    patience: Duration,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    use futures::StreamExt;
    futures::stream::unfold(Some(chunks), move |state| async move {
        let mut chunks = state?;
        match tokio::time::timeout(patience, chunks.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(chunks))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => {
                let stalled = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the leader stopped sending its answer",
                );
                Some((Err(stalled), None))
            }
        }
    })
}

/// 415 `unsupported_encoding` for a body sent with a `Content-Encoding` other than
/// `identity`, or a `Transfer-Encoding` other than `chunked` (the HTTP layer undoes that one
/// only): no route decodes one, and a compressed value would be stored as it came.
fn encoded(headers: &HeaderMap) -> Option<ApiError> {
    encoded_as(headers, header::CONTENT_ENCODING, "identity")
        .or_else(|| encoded_as(headers, header::TRANSFER_ENCODING, "chunked"))
}

/// The refusal of the codings `name` lists besides `identity` and `undone`, if any.
fn encoded_as(headers: &HeaderMap, name: HeaderName, undone: &str) -> Option<ApiError> {
    let encodings: Vec<_> = headers.get_all(&name).iter().collect();
    let plain = encodings.iter().all(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').map(str::trim).all(|e| {
                e.is_empty() || e.eq_ignore_ascii_case("identity") || e.eq_ignore_ascii_case(undone)
            })
        })
    });
    (!plain).then(|| {
        let named: Vec<_> = encodings
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        ApiError::UnsupportedEncoding(format!(
            "{name} {named:?} is not supported: send the body unencoded"
        ))
    })
}

/// The largest refusal of a read that [`Forwarder::replay`] reads to see whether it says
/// `no_leader` (an error body is a few hundred bytes).
const MAX_REFUSAL_BYTES: u64 = 64 * 1024;

/// The message of an error body that says the route, a query parameter or a field of the
/// body is unknown: a leader of an older build answers so to a request that a newer one takes
/// (404 `not_found` "no route for ...", 400 `invalid_query` "this route takes no query
/// parameters ..." or "... unknown field ...", 400 `invalid_body` "... unknown field ...";
/// this node parsed the query and the body before it forwarded them).
fn unknown_to_older_build(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    let message = error.get("message")?.as_str()?;
    let unknown = match error.get("code")?.as_str()? {
        "not_found" => message.starts_with("no route for "),
        "invalid_query" => {
            message.starts_with("this route takes no query parameters")
                || message.contains("unknown field `")
        }
        "invalid_body" => message.contains("unknown field `"),
        _ => false,
    };
    unknown.then(|| message.to_owned())
}

/// The message of an error body whose code is `no_leader`.
fn no_leader_message(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    (error.get("code")?.as_str()? == "no_leader")
        .then(|| error.get("message")?.as_str().map(str::to_owned))
        .flatten()
}

/// Route layer of the admin API: buffers the body, runs the handler, forwards if told to.
pub async fn forward_to_leader(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = encoded(&parts.headers) {
        return refused.into_response();
    }
    let body = match read_bounded(
        &parts.headers,
        body,
        MAX_BODY_BYTES,
        state.body_timeout,
        false,
    )
    .await
    {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let forwarded = parts.headers.contains_key(&FORWARDED_BY);
    // A replay from a member of another cluster (its membership names this address as its
    // leader's) is refused before the handler runs; one without the header (a build that
    // predates cluster ids), or to a node that knows no cluster yet, passes.
    if forwarded {
        let theirs = parts
            .headers
            .get(cluster_identity::CLUSTER)
            .and_then(cluster_identity::parse);
        if let Some(refused) = cluster_identity::refuse_other_cluster(&state, theirs) {
            return refused;
        }
    }
    if forwarded || !may_ask_again(&parts.method, parts.uri.path()) {
        return answer(&state, parts, body, next).await;
    }
    // A read or a membership change rides out a leader change (`failover.rs`).
    let node = state.node.clone();
    failover::read(&node, || {
        answer(&state, parts.clone(), body.clone(), next.clone())
    })
    .await
}

/// Runs the handler on the request `parts` with `body`, and replays the request at the leader
/// if the handler answered "forward to leader" (unless another member replayed it here).
async fn answer(state: &SharedState, parts: Parts, body: Bytes, next: Next) -> Response {
    let forwarded = parts.headers.contains_key(&FORWARDED_BY);
    let replay = Replay {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    };
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let Some(target) = response.extensions().get::<ForwardTo>().cloned() else {
        return response;
    };
    if forwarded {
        // Already forwarded once: the leader hint was stale. The 503 tells the client to retry.
        return response;
    }
    if let Some(silent) = failover::refused_as_silent(&state.node, target.leader_id) {
        return silent.into_response();
    }
    let read_index = response.extensions().get::<ReadIndexHint>().copied();
    if !replay.may_ask_again() {
        return state.forwarder.replay(&target, read_index, replay).await;
    }
    // A read or a membership change gives up on a leader that stopped answering once another
    // one leads. Its `no_leader` came from another member: this node leading (handing over)
    // does not make it a leader without a quorum.
    let moves_leader = replay.moves_leader();
    let replayed = async { Ok(state.forwarder.replay(&target, read_index, replay).await) };
    let replayed = if moves_leader {
        failover::unless_moved_from(&state.node, target.leader_id, replayed).await
    } else {
        failover::unless_deposed(&state.node, target.leader_id, replayed).await
    };
    let mut response = replayed.unwrap_or_else(IntoResponse::into_response);
    if let Some(refused) = response
        .extensions_mut()
        .get_mut::<failover::NoLeaderAnswer>()
    {
        refused.elsewhere = true;
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces that come within the patience pass however long the whole takes; a stall past
    /// it ends the body with an error.
    #[tokio::test(start_paused = true)]
    async fn a_relayed_body_ends_only_when_the_leader_stalls() {
        use futures::StreamExt;
        let patience = Duration::from_secs(30);
        let slow = |gaps: Vec<u64>| {
            Box::pin(futures::stream::iter(gaps).then(|gap| async move {
                tokio::time::sleep(Duration::from_secs(gap)).await;
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x"))
            }))
        };
        // Ten pieces 20 s apart: 200 s in all, each within the patience.
        let whole: Vec<_> = with_patience(slow(vec![20; 10]), patience).collect().await;
        assert_eq!(whole.len(), 10);
        assert!(whole.iter().all(Result::is_ok));
        let stalled: Vec<_> = with_patience(slow(vec![1, 31, 1]), patience)
            .collect()
            .await;
        assert_eq!(stalled.len(), 2, "the piece after the stall ends it");
        assert!(stalled[0].is_ok());
        let e = stalled[1].as_ref().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }

    #[test]
    fn only_an_identity_encoding_is_taken() {
        let with = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(header::CONTENT_ENCODING, HeaderValue::from_static(v));
            }
            encoded(&headers).map(|e| (e.code(), e.to_string()))
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&["identity"]), None);
        assert_eq!(with(&["Identity", "identity, identity"]), None);
        for refused in [&["gzip"][..], &["identity", "br"], &["identity, deflate"]] {
            let (code, message) = with(refused).expect("refused");
            assert_eq!(code, "unsupported_encoding");
            assert!(message.contains(refused[refused.len() - 1]), "{message}");
        }
        let transferred = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static(value));
            encoded(&headers).map(|e| (e.code(), e.to_string()))
        };
        assert_eq!(transferred("chunked"), None);
        assert_eq!(transferred("Chunked"), None);
        let (code, message) = transferred("gzip, chunked").expect("refused");
        assert_eq!(code, "unsupported_encoding");
        assert!(message.contains("transfer-encoding"), "{message}");
    }

    #[test]
    fn what_an_older_leader_says_of_a_request_it_does_not_know_is_told_apart() {
        let body = |code: &str, message: &str| {
            serde_json::json!({ "error": { "code": code, "message": message } }).to_string()
        };
        let unknown = |code, message| unknown_to_older_build(body(code, message).as_bytes());
        for (code, message) in [
            ("not_found", "no route for PUT /v1/cluster/epoch-floor"),
            (
                "invalid_query",
                "this route takes no query parameters, got \"epoch=3\"",
            ),
            (
                "invalid_query",
                "invalid query string \"restore=true\": Failed to deserialize query string: \
                 unknown field `restore`, expected `if_revision` or `history`",
            ),
            (
                "invalid_body",
                "invalid request body: unknown field `if_fresh`, expected `at_least` at line 1 \
                 column 30",
            ),
        ] {
            assert_eq!(unknown(code, message).as_deref(), Some(message));
        }
        assert_eq!(unknown("not_found", "datanode 7 not found"), None);
        assert_eq!(
            unknown("invalid_query", "invalid query string \"a=1\""),
            None
        );
        assert_eq!(unknown("conflict", "no route for"), None);
        assert_eq!(
            unknown(
                "invalid_body",
                "invalid request body: missing field `at_least`"
            ),
            None
        );
        assert_eq!(unknown_to_older_build(b"not json"), None);
    }

    #[test]
    fn reads_and_membership_changes_may_be_asked_again() {
        let again = |m: Method, p: &str| may_ask_again(&m, p);
        assert!(again(Method::GET, "/v1/shards/1"));
        assert!(again(Method::HEAD, "/v1/kv/a"));
        assert!(again(Method::POST, "/v1/cluster/learners"));
        assert!(again(Method::PUT, "/v1/cluster/voters"));
        assert!(again(Method::PUT, "/v1/cluster/leader"));
        assert!(again(Method::PUT, "/v1/cluster/members/4"));
        assert!(again(Method::DELETE, "/v1/cluster/learners/4"));
        assert!(again(Method::PUT, "/v1/cluster/voters/4"));
        assert!(again(Method::DELETE, "/v1/cluster/voters/4"));
        // A heartbeat: the leader notes in memory when it heard the datanode.
        assert!(again(Method::POST, "/v1/datanodes/7/heartbeat"));
        assert!(!again(Method::POST, "/v1/datanodes//heartbeat"));
        assert!(!again(Method::POST, "/v1/datanodes/7/x/heartbeat"));
        // Commands: a write asked again could be made twice.
        assert!(!again(Method::PUT, "/v1/datanodes/7"));
        assert!(!again(Method::POST, "/v1/datanodes/7/shards"));
        assert!(!again(Method::DELETE, "/v1/kv/a"));
        assert!(!again(Method::POST, "/v1/cluster/snapshot"));
        assert!(!again(Method::PUT, "/v1/cluster/epoch-floor"));
    }

    /// `method path` with an empty JSON body, replayed by `forwarder` at `target`.
    async fn replayed(
        forwarder: &Forwarder,
        target: &ForwardTo,
        method: Method,
        path: &'static str,
    ) -> Response {
        let replay = Replay {
            method,
            uri: Uri::from_static(path),
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{}"),
        };
        forwarder.replay(target, None, replay).await
    }

    /// Whether `response` is marked as no leader's answer, to go round to the next leader.
    fn no_leader_answer(response: &Response) -> bool {
        response
            .extensions()
            .get::<failover::NoLeaderAnswer>()
            .is_some()
    }

    /// The forwarder of node 2, with no token.
    fn forwarder() -> Forwarder {
        Forwarder::new(
            2,
            meta_consensus::BUILD_VERSION,
            Token::new(None),
            ClusterId::default(),
            PeerClient::plain(),
        )
    }

    /// A leader's 503 `no_leader` to a replayed read or membership change is marked as no
    /// leader's answer, so the request goes round to the next leader (`failover.rs`); to any
    /// other request it is relayed as it came.
    #[tokio::test]
    async fn a_refusal_by_a_former_leader_sends_reads_and_membership_changes_round() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let refuses = axum::Router::new().fallback(|| async {
            ApiError::NoLeader("node 1 is not the leader".into()).into_response()
        });
        let serving = tokio::spawn(async move { axum::serve(listener, refuses).await });
        let forwarder = forwarder();
        let target = ForwardTo { leader_id: 1, addr };
        for (method, path, goes_round) in [
            (Method::GET, "/v1/shards/1", true),
            (Method::PUT, "/v1/cluster/voters", true),
            (Method::POST, "/v1/cluster/learners", true),
            (Method::POST, "/v1/datanodes/7/heartbeat", true),
            (Method::POST, "/v1/cluster/snapshot", false),
        ] {
            let response = replayed(&forwarder, &target, method.clone(), path).await;
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(no_leader_answer(&response), goes_round, "{method} {path}");
        }
        serving.abort();
    }

    /// A leader that stops while it answers (killed: the exchange breaks after the request
    /// went out) leaves a membership change, a heartbeat or a read to go round to the next
    /// leader; another request may have been acted on, so its outcome is unknown.
    #[tokio::test]
    async fn a_broken_exchange_sends_what_may_be_asked_again_round() {
        use tokio::io::AsyncReadExt;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let breaking = tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                // The request arrives; the connection closes without an answer.
                let mut head = [0u8; 1024];
                let _ = conn.read(&mut head).await;
            }
        });
        let forwarder = forwarder();
        let target = ForwardTo { leader_id: 1, addr };
        for (method, path, goes_round) in [
            (Method::PUT, "/v1/cluster/voters", true),
            (Method::DELETE, "/v1/cluster/learners/4", true),
            (Method::PUT, "/v1/cluster/leader", true),
            (Method::POST, "/v1/datanodes/7/heartbeat", true),
            (Method::GET, "/v1/shards/1", true),
            (Method::POST, "/v1/cluster/snapshot", false),
            (Method::PUT, "/v1/cluster/epoch-floor", false),
        ] {
            let response = replayed(&forwarder, &target, method.clone(), path).await;
            let marked = no_leader_answer(&response);
            let expected = if goes_round {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::GATEWAY_TIMEOUT
            };
            assert_eq!(
                (response.status(), marked),
                (expected, goes_round),
                "{method} {path}"
            );
        }
        breaking.abort();
    }

    #[test]
    fn only_a_no_leader_refusal_is_taken_for_one() {
        let no_leader = ApiError::NoLeader("no leader is known".into());
        let body = serde_json::json!({
            "error": { "code": no_leader.code(), "message": no_leader.to_string() }
        });
        assert_eq!(
            no_leader_message(body.to_string().as_bytes()).as_deref(),
            Some(no_leader.to_string().as_str())
        );
        let overloaded = br#"{"error":{"code":"overloaded","message":"too many watches"}}"#;
        assert_eq!(no_leader_message(overloaded), None);
        assert_eq!(no_leader_message(b"no_leader"), None);
        assert_eq!(
            no_leader_message(br#"{"error":{"code":"no_leader"}}"#),
            None
        );
    }
}
