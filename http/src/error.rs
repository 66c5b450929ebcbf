//! The one place where failures become HTTP answers.
//!
//! Every error the admin API returns is an [`ApiError`], and every `ApiError` renders as
//! `{"error":{"code":"snake_case_code","message":"what was wrong"}}` with the status its
//! variant maps to. Rejections of axum's extractors are converted here too (see `extract`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Seconds a client is told to wait before retrying when there is no leader.
pub const RETRY_AFTER_SECS: u64 = 1;

/// A failed admin API request: the status, a stable snake_case code and a message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or out of range (400). `code` names what was wrong.
    #[error("{message}")]
    Invalid {
        /// Stable snake_case code, for example `malformed_json` or `invalid_cursor`.
        code: &'static str,
        /// What was wrong, for a person.
        message: String,
    },
    /// The bearer token is missing or wrong (401).
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// The token is right, but not the one this request takes (403).
    #[error("{0}")]
    Forbidden(String),
    /// The addressed datanode, shard, key, snapshot or route does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not with this method (405).
    #[error("method not allowed for this path")]
    MethodNotAllowed,
    /// A shard batch or a prune carried an epoch that is not the datanode's current one, or
    /// the datanode is being removed (409).
    #[error("datanode {datanode}: epoch {epoch} is fenced ({})", fenced_because(*epoch, *current_epoch, *removing))]
    Fenced {
        /// The datanode the request was for.
        datanode: u64,
        /// The epoch the request carried.
        epoch: u64,
        /// The datanode's current epoch.
        current_epoch: u64,
        /// A removal of the datanode began and has not ended: every epoch is fenced.
        removing: bool,
    },
    /// A compare-and-swap on a key found another revision (409).
    #[error("key {key:?}: expected revision {expected}, current revision is {current}")]
    RevisionMismatch {
        /// The key written.
        key: String,
        /// The revision the request expected (0 = must not exist).
        expected: u64,
        /// The key's current revision (0 = absent).
        current: u64,
    },
    /// `POST /v1/cluster/init` on a node that was initialized before (409).
    #[error("this node is already initialized")]
    AlreadyInitialized,
    /// A membership change conflicts with the cluster's state (409).
    #[error("{0}")]
    Conflict(String),
    /// The leader's disk is nearly full; writes that add data are refused (507).
    #[error("{0}")]
    InsufficientStorage(String),
    /// A node or a message belongs to another cluster (409).
    #[error("{0}")]
    OtherCluster(String),
    /// A message between members reached a node with another id than its addressee: the
    /// membership names this node's address for another node (409).
    #[error("{0}")]
    WrongNode(String),
    /// A learner to add runs a build older than the cluster's version (409).
    #[error("{0}")]
    BuildTooOld(String),
    /// A command needs a cluster version the cluster cannot be raised to yet: some members run
    /// older builds or do not answer (503: it succeeds once they are upgraded, or back). With
    /// `Retry-After` only when `retry`, when a member did not answer (it may be starting):
    /// waiting does not upgrade a member that answered as an older build.
    #[error("{message}")]
    ClusterVersion { message: String, retry: bool },
    /// A watch asked for changes after an index this member no longer keeps the changes after
    /// (410): the client reads the state again and watches from a fresh index.
    #[error("{0}")]
    Compacted(String),
    /// The request body did not arrive in time (408; the connection is closed).
    #[error("{0}")]
    BodyTimeout(String),
    /// The request body is compressed or otherwise encoded (`Content-Encoding` other than
    /// `identity`), which no route decodes (415).
    #[error("{0}")]
    UnsupportedEncoding(String),
    /// The body, batch or value is larger than allowed (413).
    #[error("{message}")]
    TooLarge {
        /// `body_too_large`, `batch_too_large` or `value_too_large`.
        code: &'static str,
        /// What was too large, and the limit.
        message: String,
    },
    /// No leader is known or reachable, or there is no quorum (503, with `Retry-After`).
    #[error("no leader: {0}")]
    NoLeader(String),
    /// This node serves no cluster's requests, and waiting does not change that: it was
    /// removed from its cluster, or the voters of its cluster refuse its messages. 503
    /// `no_leader`, as clients that try another member expect, but without `Retry-After`:
    /// asking this node again does not help. (A node in no cluster yet is `NoLeader`: while a
    /// cluster forms, its members join it soon.)
    #[error("no leader: {0}")]
    NotServing(String),
    /// A restore into the cluster has not ended: a datanode's registration or unfenced drop,
    /// and a key's write if the restore holds keys back, waits until it does (503 `restoring`,
    /// with `Retry-After`).
    #[error("{0}")]
    Restoring(String),
    /// This node is shutting down or its storage failed (503, with `Retry-After`).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Every connection slot is taken and the request came on a connection kept for traffic
    /// between members (503, with `Retry-After`; the connection is closed).
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// A write could not be committed in time; it may still commit later (504).
    #[error("timed out: {0}")]
    Timeout(String),
    /// A write's entry was discarded by a leader change; it may or may not commit (504).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// This node is not the leader; the request should be sent to `addr`.
    ///
    /// The forwarding middleware replays the request there. Where nothing forwards (or the
    /// request was already forwarded once) it renders as 503 `no_leader`.
    #[error("not the leader; leader is node {leader_id} at {addr}")]
    ForwardToLeader {
        /// The leader's node id.
        leader_id: u64,
        /// The leader's HTTP address (`host:port`).
        addr: String,
        /// The leader's read index for this read, when this node obtained one but did not
        /// catch up with it in time: the replay carries it, and the receiver answers the read
        /// once it applied that index, without another round to a quorum.
        read_index: Option<u64>,
    },
    /// A bug or an unexpected failure (500).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Why a [`ApiError::Fenced`] request's epoch is fenced.
fn fenced_because(epoch: u64, current_epoch: u64, removing: bool) -> String {
    match (removing, epoch > current_epoch) {
        (true, _) => "the datanode is being removed: its removal began and has not ended, and \
                      no request of it is taken; register it again to keep it, or remove it \
                      again to end the removal"
            .to_owned(),
        (false, true) => format!("no registration gave it, the current epoch is {current_epoch}"),
        (false, false) => {
            format!("not the current incarnation, the current epoch is {current_epoch}")
        }
    }
}

impl ApiError {
    /// A 400 with the given code and message.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            code,
            message: message.into(),
        }
    }

    /// A 413 with the given code and message.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::TooLarge {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Fenced { .. }
            | ApiError::RevisionMismatch { .. }
            | ApiError::AlreadyInitialized
            | ApiError::Conflict(_)
            | ApiError::OtherCluster(_)
            | ApiError::WrongNode(_)
            | ApiError::BuildTooOld(_) => StatusCode::CONFLICT,
            ApiError::Compacted(_) => StatusCode::GONE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::NoLeader(_)
            | ApiError::NotServing(_)
            | ApiError::Unavailable(_)
            | ApiError::Restoring(_)
            | ApiError::Overloaded(_)
            | ApiError::ClusterVersion { .. }
            | ApiError::ForwardToLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) | ApiError::OutcomeUnknown(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable snake_case code of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid { code, .. } | ApiError::TooLarge { code, .. } => code,
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Fenced { .. } => "fenced",
            ApiError::RevisionMismatch { .. } => "revision_mismatch",
            ApiError::AlreadyInitialized => "already_initialized",
            ApiError::Conflict(_) => "conflict",
            ApiError::Compacted(_) => "compacted",
            ApiError::OtherCluster(_) => "other_cluster",
            ApiError::WrongNode(_) => "wrong_node",
            ApiError::BuildTooOld(_) => "build_too_old",
            ApiError::ClusterVersion { .. } => "cluster_version",
            ApiError::InsufficientStorage(_) => "insufficient_storage",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::UnsupportedEncoding(_) => "unsupported_encoding",
            ApiError::NoLeader(_) | ApiError::NotServing(_) | ApiError::ForwardToLeader { .. } => {
                "no_leader"
            }
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Restoring(_) => "restoring",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Timeout(_) => "timeout",
            ApiError::OutcomeUnknown(_) => "outcome_unknown",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<meta_consensus::Error> for ApiError {
    /// Maps the node's errors. `InvalidArgument` becomes 400 `invalid_argument`; listing
    /// handlers, where the only argument the node checks is the cursor, map it to
    /// `invalid_cursor` themselves.
    fn from(e: meta_consensus::Error) -> Self {
        use meta_consensus::Error as E;
        match e {
            E::ForwardToLeader {
                leader_id,
                leader_addr,
            } => ApiError::ForwardToLeader {
                leader_id,
                addr: leader_addr,
                read_index: None,
            },
            E::NoLeader => {
                ApiError::NoLeader("no leader is known (election running or no quorum)".into())
            }
            E::NotMember => ApiError::NoLeader(
                "this node is not a member of a cluster yet: initialize one (--init, or POST \
                 /v1/cluster/init) or add it from the leader (POST /v1/cluster/learners)"
                    .into(),
            ),
            E::RefusedByMembers { refusing } => ApiError::NotServing(format!(
                "no leader can be elected here: voters {refusing:?} refuse this node's messages, \
                 as they belong to another cluster. One side was initialized on its own (a node \
                 whose data dir was wiped, started with --init, say): if it is this node, send \
                 requests to those members, and to bring it back, stop it, wipe its data dir, \
                 start it without --init and add it from the leader"
            )),
            E::Removed { members } => ApiError::NotServing(format!(
                "this node was removed from the cluster, whose members are now {members:?}: send \
                 requests to one of them, and stop this node (or add it again as a learner)"
            )),
            E::Timeout => ApiError::Timeout(
                "the request could not complete in time (a write may still commit; a read changed \
                 nothing)"
                    .into(),
            ),
            E::OutcomeUnknown(m) => ApiError::OutcomeUnknown(m),
            E::AlreadyInitialized => ApiError::AlreadyInitialized,
            E::NotFound(m) => ApiError::NotFound(m),
            E::InvalidArgument(m) => ApiError::invalid("invalid_argument", m),
            E::Conflict(m) => ApiError::Conflict(m),
            e @ E::Compacted { .. } => ApiError::Compacted(e.to_string()),
            e @ E::OtherCluster { .. } => ApiError::OtherCluster(e.to_string()),
            e @ E::HandingOverForDisk { .. } => ApiError::NoLeader(e.to_string()),
            e @ (E::InsufficientStorage { .. }
            | E::QuorumShortOfDisk { .. }
            | E::NoRoomForSnapshot { .. }
            | E::NoRoomToBuildSnapshot(_)) => ApiError::InsufficientStorage(e.to_string()),
            E::ClusterVersionTooLow { ref behind, .. } => ApiError::ClusterVersion {
                retry: behind.iter().any(|b| b.version.is_none()),
                message: e.to_string(),
            },
            e @ E::LearnerTooOld { .. } => ApiError::BuildTooOld(e.to_string()),
            e @ E::LearnerNotHeard { .. } => ApiError::Conflict(e.to_string()),
            e @ E::BuildTooOld { .. } => ApiError::Unavailable(e.to_string()),
            E::Shutdown => ApiError::Unavailable("the node is shutting down".into()),
            e @ E::Stopped(_) => ApiError::Unavailable(e.to_string()),
            e @ (E::Rejoining(_) | E::Deposed { .. }) => ApiError::Unavailable(e.to_string()),
            e @ (E::Storage { .. }
            | E::Registry { .. }
            | E::RegistryUnreadable { .. }
            | E::RegistryNotRebuildable { .. }
            | E::Io { .. }
            | E::Corrupt { .. }
            | E::UndecodableLogRecord { .. }) => ApiError::Unavailable(e.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// The JSON body of every error answer.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The error's code and message.
    pub error: ErrorDetail<'a>,
}

/// The inner object of [`ErrorBody`].
#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    /// Stable snake_case code.
    pub code: &'a str,
    /// What was wrong, for a person.
    pub message: String,
}

/// Marks an error response whose request should be replayed at the leader.
#[derive(Debug, Clone)]
pub struct ForwardTo {
    /// The leader's node id.
    pub leader_id: u64,
    /// The leader's HTTP address (`host:port`).
    pub addr: String,
}

/// Marks an error response whose read should be replayed with this read index of the leader
/// (see [`ApiError::ForwardToLeader`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadIndexHint(pub u64);

/// Renders an error response with the given status, code and message.
pub fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code,
            message: bounded(message),
        },
    };
    let bytes = serde_json::to_vec(&body).unwrap_or_else(|_| b"{\"error\":{}}".to_vec());
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

/// The most of a message an error body carries: a message that quotes what the client sent
/// (an unknown field's name, a query string) is cut there, so that a 2 MiB body is not sent
/// back whole.
const MAX_MESSAGE_BYTES: usize = 4096;

/// `message`, cut at [`MAX_MESSAGE_BYTES`] (at a character's boundary), saying how much was cut.
fn bounded(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let cut = message.len() - end;
    message.truncate(end);
    message.push_str(&format!("... ({cut} more bytes)"));
    message
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // "Forward to leader" is a hand-off to the forwarding layer, not a failure; an
        // overload is logged by the listener, at most every few seconds, not per request; no
        // leader is an election under way, which the Raft log tells once, not once per
        // datanode request; a leader short of disk says so itself, once a minute, and hands
        // over if it can; a node that is not available (it rejoins its cluster, or its leader
        // refuses its token) logs why itself.
        let quiet = matches!(
            self,
            ApiError::ForwardToLeader { .. }
                | ApiError::Overloaded(_)
                | ApiError::NoLeader(_)
                | ApiError::NotServing(_)
                | ApiError::Unavailable(_)
                | ApiError::Restoring(_)
                | ApiError::InsufficientStorage(_)
        );
        if status.is_server_error() && !quiet {
            tracing::warn!(code = self.code(), "request failed: {self}");
        }
        let mut response = error_response(status, self.code(), self.to_string());
        match self {
            ApiError::ForwardToLeader {
                leader_id,
                addr,
                read_index,
            } => {
                response
                    .extensions_mut()
                    .insert(ForwardTo { leader_id, addr });
                if let Some(index) = read_index {
                    response.extensions_mut().insert(ReadIndexHint(index));
                }
            }
            ApiError::NoLeader(_) => {
                response
                    .extensions_mut()
                    .insert(crate::failover::NoLeaderAnswer { elsewhere: false });
            }
            ApiError::RevisionMismatch { current, .. } => {
                response
                    .headers_mut()
                    .insert("x-revision", HeaderValue::from(current));
            }
            ApiError::ClusterVersion { retry: false, .. } | ApiError::NotServing(_) => {
                response.headers_mut().remove(header::RETRY_AFTER);
            }
            ApiError::Overloaded(_) => {
                // A client that waits out the Retry-After on this connection would hold a
                // connection slot of an overloaded node meanwhile.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            ApiError::BodyTimeout(_)
            | ApiError::TooLarge {
                code: "body_too_large",
                ..
            } => {
                // The rest of the body may still come (a body over the limit is read past
                // it only so far): the connection cannot be reused, and the client is told so
                // rather than finding its next request unanswered.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            ApiError::Unauthorized => {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"metaserver\""),
                );
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut() {
        let short = "unknown field `x`".to_owned();
        assert_eq!(bounded(short.clone()), short);
        // A multi-byte character across the limit is not split.
        let long = format!("unknown field `{}`", "é".repeat(1_000_000));
        let cut = bounded(long.clone());
        assert!(cut.len() < MAX_MESSAGE_BYTES + 40, "{}", cut.len());
        assert!(cut.starts_with("unknown field `éé"));
        let more = long.len() - (MAX_MESSAGE_BYTES - 1);
        assert!(
            cut.ends_with(&format!("... ({more} more bytes)")),
            "{}",
            &cut[4000..]
        );
    }

    #[test]
    fn every_variant_has_a_distinct_status_and_code() {
        let cases = [
            (
                ApiError::invalid("malformed_json", "x"),
                400,
                "malformed_json",
            ),
            (ApiError::Unauthorized, 401, "unauthorized"),
            (ApiError::Forbidden("x".into()), 403, "forbidden"),
            (ApiError::NotFound("x".into()), 404, "not_found"),
            (ApiError::MethodNotAllowed, 405, "method_not_allowed"),
            (
                ApiError::Fenced {
                    datanode: 1,
                    epoch: 2,
                    current_epoch: 3,
                    removing: false,
                },
                409,
                "fenced",
            ),
            (ApiError::AlreadyInitialized, 409, "already_initialized"),
            (ApiError::Conflict("x".into()), 409, "conflict"),
            (ApiError::Compacted("x".into()), 410, "compacted"),
            (ApiError::OtherCluster("x".into()), 409, "other_cluster"),
            (ApiError::WrongNode("x".into()), 409, "wrong_node"),
            (
                ApiError::InsufficientStorage("x".into()),
                507,
                "insufficient_storage",
            ),
            (ApiError::BodyTimeout("x".into()), 408, "body_timeout"),
            (
                ApiError::too_large("batch_too_large", "x"),
                413,
                "batch_too_large",
            ),
            (
                ApiError::UnsupportedEncoding("x".into()),
                415,
                "unsupported_encoding",
            ),
            (ApiError::NoLeader("x".into()), 503, "no_leader"),
            (ApiError::Timeout("x".into()), 504, "timeout"),
            (ApiError::OutcomeUnknown("x".into()), 504, "outcome_unknown"),
            (ApiError::Internal("x".into()), 500, "internal"),
        ];
        for (error, status, code) in cases {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    #[test]
    fn a_node_stopped_by_a_failure_names_it() {
        let stopped = meta_consensus::Error::Stopped("fdatasync failed: EIO".into());
        let api = ApiError::from(stopped);
        assert_eq!((api.status().as_u16(), api.code()), (503, "unavailable"));
        let message = api.to_string();
        assert!(message.contains("fdatasync failed: EIO"), "{message}");
        assert!(message.contains("until it is restarted"), "{message}");
    }

    #[test]
    fn a_fenced_epoch_says_whether_it_was_ever_given() {
        let fenced = |epoch, removing| {
            ApiError::Fenced {
                datanode: 7,
                epoch,
                current_epoch: 3,
                removing,
            }
            .to_string()
        };
        let old = fenced(2, false);
        assert!(old.contains("not the current incarnation"), "{old}");
        assert!(old.contains("the current epoch is 3"), "{old}");
        let never = fenced(999, false);
        assert!(never.contains("no registration gave it"), "{never}");
        // Being removed, every epoch is fenced, the one the removal raised it to too: the
        // answer names the removal, not an epoch to send with.
        for epoch in [2, 3, 999] {
            let removing = fenced(epoch, true);
            assert!(removing.contains("is being removed"), "{removing}");
            assert!(!removing.contains("current epoch"), "{removing}");
        }
    }

    #[test]
    fn a_snapshot_build_without_room_is_insufficient_storage() {
        let e = ApiError::from(meta_consensus::Error::NoRoomToBuildSnapshot(
            "finish snapshot: No space left on device".into(),
        ));
        assert_eq!(e.status().as_u16(), 507, "{e:?}");
        assert_eq!(e.code(), "insufficient_storage");
    }

    /// A leader short of disk that hands its leadership over says to ask again (503
    /// `no_leader`, with `Retry-After`; a follower sends the write on to the next leader); one
    /// that stays short says 507.
    #[test]
    fn a_leader_handing_over_for_disk_says_to_ask_again() {
        let e = ApiError::from(meta_consensus::Error::HandingOverForDisk {
            free: 1,
            reserve: 2,
        });
        assert_eq!(e.code(), "no_leader", "{e:?}");
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let e = ApiError::from(meta_consensus::Error::InsufficientStorage {
            free: 1,
            reserve: 2,
        });
        assert_eq!(e.status().as_u16(), 507, "{e:?}");
    }

    /// An overloaded node closes the connection after its answer: a client waiting out the
    /// Retry-After on it would hold one of its connection slots meanwhile.
    #[test]
    fn an_overload_closes_the_connection() {
        let response = ApiError::Overloaded("full".into()).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    /// A body over the limit is not read to its end, so the connection closes after the
    /// answer: it says so. A value or batch over its own limit was read whole: the connection
    /// stays open.
    #[test]
    fn a_body_over_the_limit_closes_the_connection() {
        let response = ApiError::too_large("body_too_large", "big").into_response();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        let response = ApiError::too_large("value_too_large", "big").into_response();
        assert!(response.headers().get(header::CONNECTION).is_none());
    }

    #[test]
    fn no_leader_carries_retry_after() {
        let response = ApiError::NoLeader("election running".into()).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn a_removed_or_refused_node_does_not_say_to_retry() {
        let removed = meta_consensus::Error::Removed {
            members: vec![1, 2],
        };
        let refused = meta_consensus::Error::RefusedByMembers {
            refusing: vec![1, 2],
        };
        for e in [removed, refused] {
            let response = ApiError::from(e).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(response.headers().get(header::RETRY_AFTER).is_none());
            assert!(response
                .extensions()
                .get::<crate::failover::NoLeaderAnswer>()
                .is_none());
        }
    }

    #[test]
    fn a_version_refusal_says_to_retry_only_when_a_member_did_not_answer() {
        use meta_consensus::Behind;
        let refusal = |behind: Vec<Behind>| {
            ApiError::from(meta_consensus::Error::ClusterVersionTooLow {
                what: "RaiseEpochFloor(5)".into(),
                needed: 4,
                current: 1,
                behind,
            })
            .into_response()
        };
        let older = Behind {
            node: 3,
            version: Some(3),
        };
        let silent = Behind {
            node: 2,
            version: None,
        };
        // Waiting does not upgrade a member that answered as an older build.
        let response = refusal(vec![older]);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
        // A member that did not answer may be starting.
        for behind in [vec![silent], vec![older, silent]] {
            let response = refusal(behind);
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        }
    }

    #[test]
    fn forward_marks_the_response() {
        let response = ApiError::ForwardToLeader {
            leader_id: 2,
            addr: "127.0.0.1:7102".into(),
            read_index: None,
        }
        .into_response();
        let forward = response.extensions().get::<ForwardTo>().expect("marker");
        assert_eq!(forward.leader_id, 2);
        assert_eq!(forward.addr, "127.0.0.1:7102");
        assert!(response.extensions().get::<ReadIndexHint>().is_none());
        let response = ApiError::ForwardToLeader {
            leader_id: 2,
            addr: "127.0.0.1:7102".into(),
            read_index: Some(17),
        }
        .into_response();
        assert!(response.extensions().get::<ForwardTo>().is_some());
        assert_eq!(response.extensions().get::<ReadIndexHint>().unwrap().0, 17);
    }
}
