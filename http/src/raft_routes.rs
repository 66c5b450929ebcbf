//! The Raft transport between processes, server side: the `/raft/...` routes.
//!
//! Each route decodes a bincode request, hands it to this node's Raft handle and answers
//! `RemoteResult<T>` in bincode: the Raft response, or the message of the failure (this node
//! is shutting down, its storage failed), which the caller treats as unreachable. A body that
//! does not decode is a 400 with the usual JSON error.
//!
//! Replication normally runs over `/raft/append-stream` instead of `/raft/append`: one
//! long-lived exchange per replication session whose request and response bodies are
//! sequences of frames (`frame.rs`), one AppendEntries request or answer each, so the leader
//! sends the next entries without waiting for the answer to the previous ones.
//!
//! A full snapshot arrives as one streamed body: a 4-byte big-endian length, the leader's vote
//! (bincode), then the snapshot file's bytes. They are written to a file in this node's data
//! dir as they arrive, verified, and installed.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use meta_consensus::{rpc_bounds, ImportRecords, MetaNode, Removal, TermAnswer, TypeConfig, Vote};
use openraft::raft::{TransferLeaderRequest, VoteRequest};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::bounded_body::bounded_raft_body;
use crate::error::ApiError;
use crate::frame::{encode_frame, frames, FrameError};
use crate::limits::{MAX_RAFT_BODY_BYTES, MAX_SMALL_RAFT_BODY_BYTES};
use meta_consensus::codec;

/// Append entries (and heartbeats).
pub const PATH_APPEND: &str = "/raft/append";
/// Append entries as a stream: one long-lived exchange per replication session.
pub const PATH_APPEND_STREAM: &str = "/raft/append-stream";
/// Request vote.
pub const PATH_VOTE: &str = "/raft/vote";
/// Pre-vote.
pub const PATH_PRE_VOTE: &str = "/raft/pre-vote";
/// Streamed full snapshot.
pub const PATH_SNAPSHOT: &str = "/raft/snapshot";
/// Transfer leadership.
pub const PATH_TRANSFER_LEADER: &str = "/raft/transfer-leader";
/// A rejoining member's question: this node's term and membership (`meta-consensus`'s
/// `TermAnswer`).
pub const PATH_TERM: &str = "/raft/term";

/// The header with which the leader announces a snapshot file's size in bytes, so that a member
/// without room to install it refuses before the body (a build that predates it sends none:
/// the member then looks once the file landed).
pub const SNAPSHOT_BYTES: header::HeaderName =
    header::HeaderName::from_static("x-metaserver-snapshot-bytes");

/// The header with which the leader announces the records a snapshot's import writes (its
/// pairs and the index entries derived, `PAIRS INDEX_ENTRIES`), which take most of the room a
/// registry of scattered shard ids needs: a member without that room refuses before the body,
/// rather than after each download of it. Without it (an older leader, or one that could not
/// count them), the member counts them once the file landed.
pub const SNAPSHOT_RECORDS: header::HeaderName =
    header::HeaderName::from_static("x-metaserver-snapshot-records");

/// [`SNAPSHOT_RECORDS`]'s value for `records`.
pub fn encode_snapshot_records(records: &ImportRecords) -> String {
    format!("{} {}", records.pairs, records.index_entries)
}

/// The records a [`SNAPSHOT_RECORDS`] value announces; `None` for one that does not parse.
pub fn decode_snapshot_records(value: &str) -> Option<ImportRecords> {
    let (pairs, index_entries) = value.split_once(' ')?;
    Some(ImportRecords {
        pairs: pairs.parse().ok()?,
        index_entries: index_entries.parse().ok()?,
    })
}

/// What a `/raft` route answers: the response, or why this node could not produce one.
pub type RemoteResult<T> = Result<T, String>;

/// Largest encoded vote accepted at the head of a snapshot stream.
const MAX_VOTE_BYTES: usize = 4096;

/// How many bytes of an arriving snapshot land between two looks at the free space (one
/// `statvfs`): a reserve may be a few MiB, and another process may fill the disk meanwhile.
const ROOM_CHECK_BYTES: u64 = 1 << 20;

/// The routes, for a router whose state yields the node.
pub fn raft_routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    MetaNode: axum::extract::FromRef<S>,
{
    // Each message is read whole first, bounded in size (its own limit) and in time.
    let bounded = |limit: usize| from_fn_with_state(limit, bounded_raft_body);
    Router::new()
        .route(
            PATH_APPEND,
            post(append).layer(bounded(MAX_RAFT_BODY_BYTES)),
        )
        .route(
            PATH_VOTE,
            post(vote).layer(bounded(MAX_SMALL_RAFT_BODY_BYTES)),
        )
        .route(
            PATH_PRE_VOTE,
            post(pre_vote).layer(bounded(MAX_SMALL_RAFT_BODY_BYTES)),
        )
        .route(
            PATH_TRANSFER_LEADER,
            post(transfer_leader).layer(bounded(MAX_SMALL_RAFT_BODY_BYTES)),
        )
        .route(
            PATH_TERM,
            post(term).layer(bounded(MAX_SMALL_RAFT_BODY_BYTES)),
        )
        .route(
            PATH_REMOVED,
            post(removed).layer(bounded(MAX_SMALL_RAFT_BODY_BYTES)),
        )
        .layer(DefaultBodyLimit::max(MAX_RAFT_BODY_BYTES))
        .route(PATH_SNAPSHOT, post(snapshot))
        .route(PATH_APPEND_STREAM, post(append_stream))
}

/// Encodes the head of a snapshot stream: length and vote.
pub fn encode_snapshot_prefix(vote: &Vote) -> std::io::Result<Vec<u8>> {
    let encoded = codec::encode(vote).map_err(std::io::Error::from)?;
    let mut prefix = Vec::with_capacity(4 + encoded.len());
    prefix.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    prefix.extend_from_slice(&encoded);
    Ok(prefix)
}

fn reply<T: Serialize>(result: RemoteResult<T>) -> Response {
    match codec::encode(&result) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => ApiError::Internal(format!("encoding a Raft response: {e}")).into_response(),
    }
}

fn bad_rpc(e: impl std::fmt::Display) -> Response {
    ApiError::invalid("bad_rpc", format!("undecodable Raft RPC: {e}")).into_response()
}

/// Decodes a Raft message and checks it against the bounds of terms and indexes (`check`);
/// `Err` says why it is refused.
fn decode_message<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    check: fn(&T) -> meta_consensus::Result<()>,
) -> Result<T, String> {
    let rpc = codec::decode(bytes).map_err(|e| format!("undecodable Raft RPC: {e}"))?;
    check(&rpc).map_err(|e| format!("refused Raft RPC: {e}"))?;
    Ok(rpc)
}

/// [`decode_message`] for a route: `Err` is 400 `bad_rpc`.
fn decode<T: serde::de::DeserializeOwned>(
    body: &[u8],
    check: fn(&T) -> meta_consensus::Result<()>,
) -> Result<T, ApiError> {
    decode_message(body, check).map_err(|e| ApiError::invalid("bad_rpc", e))
}

async fn append(State(node): State<MetaNode>, body: Bytes) -> Response {
    let rpc = match decode(&body, rpc_bounds::check_append) {
        Ok(rpc) => rpc,
        Err(refused) => return refused.into_response(),
    };
    reply(node.append_entries(rpc).await.map_err(|e| e.to_string()))
}

/// The follower's end of a streamed AppendEntries exchange: every request frame goes to
/// openraft's pipelined `stream_append`, and its answers go back, one frame each and in order,
/// as they complete. The exchange ends when the leader ends its body or an answer is an error
/// (a conflict, a higher vote: openraft ends the stream there). A frame that does not decode
/// ends the requests; the answers to those before it are sent, then the error.
async fn append_stream(State(node): State<MetaNode>, body: Body) -> Response {
    let refused: Arc<Mutex<Option<String>>> = Arc::default();
    let note = refused.clone();
    let requests = frames(body.into_data_stream(), MAX_RAFT_BODY_BYTES)
        .map(|frame| {
            let refused = match frame {
                Ok(f) => decode_message(&f, rpc_bounds::check_append),
                Err(e @ FrameError::TooLong(_)) => Err(e.to_string()),
                // The leader's connection broke off (it stopped, or closed it): routine.
                Err(FrameError::Broken(e)) => {
                    tracing::debug!("an append stream broke off: {e}");
                    return Err(e);
                }
            };
            if let Err(e) = &refused {
                tracing::warn!("a frame of an append stream was refused (the sender is not a leader of this build, or the bytes were damaged): {e}");
            }
            refused
        })
        .take_while(move |r| {
            if let Err(e) = r {
                *note.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
            }
            std::future::ready(r.is_ok())
        })
        .filter_map(|r| std::future::ready(r.ok()))
        // A stopping node ends the exchange, or the leader's long-lived request would hold
        // its drain to the end.
        .take_until({
            let node = node.clone();
            async move { node.closing().await }
        });
    let answers = node
        .stream_append(Box::pin(requests))
        .map(|r| r.map_err(|fatal| fatal.to_string()));
    let trailer =
        futures::stream::once(
            async move { refused.lock().unwrap_or_else(|p| p.into_inner()).take() },
        )
        .filter_map(|e| std::future::ready(e.map(Err)));
    let body = answers.chain(trailer).map(|answer: RemoteResult<_>| {
        encode_frame(&answer).map_err(|e| std::io::Error::other(format!("encoding an answer: {e}")))
    });
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

/// `POST /raft/term`: this node's term and membership, for a rejoining member.
async fn term(State(node): State<MetaNode>) -> Response {
    reply::<TermAnswer>(Ok(node.term_answer()))
}

async fn vote(State(node): State<MetaNode>, body: Bytes) -> Response {
    answer_vote(&node, &body, false).await
}

async fn pre_vote(State(node): State<MetaNode>, body: Bytes) -> Response {
    answer_vote(&node, &body, true).await
}

/// Answers a vote (or pre-vote) request, with the candidate's removal notice if it has one.
async fn answer_vote(node: &MetaNode, body: &[u8], pre: bool) -> Response {
    let rpc: VoteRequest<TypeConfig> = match decode(body, rpc_bounds::check_vote_request) {
        Ok(rpc) => rpc,
        Err(refused) => return refused.into_response(),
    };
    let removal = node.removal_of(&rpc);
    let answer = if pre {
        node.pre_vote(rpc).await
    } else {
        node.vote(rpc).await
    };
    with_removal(removal, reply(answer.map_err(|e| e.to_string())))
}

/// The route a leader posts a removal notice to (`Removal::encode`'s form as the body) after a
/// membership change removed the node: the leader stops replicating to it at once, so it could
/// not learn of it from the log (a learner never asks for votes either).
pub const PATH_REMOVED: &str = "/raft/removed";

/// `POST /raft/removed`: records the notice (it applies while this node's own membership is
/// older). Only from a member of this node's cluster: the sender's cluster id is required.
async fn removed(
    State(node): State<MetaNode>,
    headers: header::HeaderMap,
    body: Bytes,
) -> Response {
    if !headers.contains_key(crate::cluster_identity::CLUSTER) {
        return ApiError::invalid("bad_rpc", "a removal notice must carry the cluster id")
            .into_response();
    }
    let Some(removal) = std::str::from_utf8(&body).ok().and_then(Removal::decode) else {
        return bad_rpc("not a removal notice");
    };
    node.note_removal(removal);
    axum::http::StatusCode::NO_CONTENT.into_response()
}

/// Header of a vote answer that tells the candidate it was removed from the cluster
/// (`Removal::encode`'s form); see `MetaNode::removal_of`.
pub const REMOVED: header::HeaderName = header::HeaderName::from_static("x-metaserver-removed");

/// Adds the removal notice for the candidate, if there is one, to a vote answer.
fn with_removal(removal: Option<Removal>, mut response: Response) -> Response {
    if let Some(value) = removal.and_then(|r| header::HeaderValue::from_str(&r.encode()).ok()) {
        response.headers_mut().insert(REMOVED, value);
    }
    response
}

async fn transfer_leader(State(node): State<MetaNode>, body: Bytes) -> Response {
    let rpc: TransferLeaderRequest<TypeConfig> = match decode(&body, rpc_bounds::check_transfer) {
        Ok(rpc) => rpc,
        Err(refused) => return refused.into_response(),
    };
    reply(
        node.handle_transfer_leader(rpc)
            .await
            .map_err(|e| e.to_string()),
    )
}

async fn snapshot(
    State(node): State<MetaNode>,
    headers: header::HeaderMap,
    body: Body,
) -> Response {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
    };
    let announced = header(SNAPSHOT_BYTES).and_then(|v| v.parse::<u64>().ok());
    let records = header(SNAPSHOT_RECORDS).and_then(decode_snapshot_records);
    match receive_snapshot(&node, announced, records.unwrap_or_default(), body).await {
        Ok(response) => response,
        Err(response) => response,
    }
}

/// Reads the vote, lands the file, installs it. `Err` carries the answer to a failure.
/// `announced`: the file's size as the leader announced it, and `records` the records its import
/// writes (none when not announced).
async fn receive_snapshot(
    node: &MetaNode,
    announced: Option<u64>,
    records: ImportRecords,
    body: Body,
) -> Result<Response, Response> {
    let mut stream = body.into_data_stream();
    let mut head: Vec<u8> = Vec::new();
    // The vote's length and the vote itself, possibly split over several chunks.
    let vote_len = loop {
        if head.len() >= 4 {
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if len > MAX_VOTE_BYTES {
                return Err(bad_rpc(format!("snapshot vote of {len} bytes")));
            }
            if head.len() >= 4 + len {
                break len;
            }
        }
        match stream.next().await {
            Some(Ok(chunk)) => head.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(bad_rpc(format!("reading the snapshot stream: {e}"))),
            None => return Err(bad_rpc("snapshot stream ended before its vote")),
        }
    };
    let vote: Vote = codec::decode(&head[4..4 + vote_len]).map_err(bad_rpc)?;
    rpc_bounds::check_vote(&vote, "the leader's vote").map_err(bad_rpc)?;
    // Before the bytes arrive: a node that may not acknowledge this leader yet refuses, and
    // answers a deposed one with the higher vote, as the install would.
    match node.admit_snapshot(&vote).await {
        Ok(None) => {}
        Ok(Some(answer)) => return Ok(reply(Ok(answer))),
        Err(e) => return Err(reply::<()>(Err(e.to_string()))),
    }
    // The room to install it covers the room to receive it.
    match announced {
        Some(bytes) => node.check_room_for_snapshot(bytes, records, 0),
        None => node.check_room_to_receive(0),
    }
    .map_err(refuse_for_room)?;
    let temp = node
        .snapshot_receive_file()
        .await
        .map_err(|e| reply::<()>(Err(e.to_string())))?;
    let failed = |e: std::io::Error| {
        tracing::warn!("receiving a snapshot failed: {e}");
        bad_rpc(format!("receiving the snapshot failed: {e}"))
    };
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&temp)
        .await
        .map_err(failed)?;
    let mut received = (head.len() - 4 - vote_len) as u64;
    let mut checked = 0;
    file.write_all(&head[4 + vote_len..])
        .await
        .map_err(failed)?;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| failed(std::io::Error::other(e)))?;
        received += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(failed)?;
        if received - checked >= ROOM_CHECK_BYTES {
            checked = received;
            node.check_room_to_receive(received)
                .map_err(refuse_for_room)?;
        }
    }
    file.flush().await.map_err(failed)?;
    drop(file);
    tracing::debug!(bytes = received, "snapshot received, installing");
    let result = node.install_received_snapshot(vote, temp).await;
    match &result {
        Ok(_) => tracing::info!(bytes = received, "received a snapshot from the leader"),
        // The node logged it (a full disk refuses every resend; it says so once in a while).
        Err(meta_consensus::Error::NoRoomForSnapshot { .. }) => {}
        Err(e) => tracing::warn!("installing a received snapshot failed: {e}"),
    }
    Ok(reply(result.map_err(|e| e.to_string())))
}

/// Refuses a snapshot for want of room (`e`, which the node logged) at once, without reading
/// the rest: the answer is the install's result (not a 4xx), or, when the leader is still
/// sending, a connection closed under it. Either way the leader backs off before it sends
/// again, and the rest of the snapshot is not sent for nothing.
fn refuse_for_room(e: meta_consensus::Error) -> Response {
    reply::<()>(Err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announced_snapshot_records_round_trip_and_a_bad_value_is_none() {
        let records = ImportRecords {
            pairs: 1_000_151,
            index_entries: 1_000_000,
        };
        let value = encode_snapshot_records(&records);
        assert_eq!(decode_snapshot_records(&value), Some(records));
        for bad in ["", "1", "1 x", "-1 2", "1  2", "1 2 3"] {
            assert_eq!(decode_snapshot_records(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn snapshot_prefix_round_trip() {
        let vote = Vote::new(3, 2);
        let prefix = encode_snapshot_prefix(&vote).unwrap();
        let len = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
        assert_eq!(prefix.len(), 4 + len);
        let back: Vote = codec::decode(&prefix[4..]).unwrap();
        assert_eq!(back, vote);
    }
}
