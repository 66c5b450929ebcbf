//! One exchange with the leader on a route between members: a bincode request, a bincode
//! answer, and the failures a follower renders for its client: 503 `no_leader` when the leader
//! cannot be reached, or answers 503 (it stops, is overloaded, or no longer leads), 409 (the
//! process at its address is of another cluster, or another node) or 408 (the body came too
//! slowly): it did nothing with the request; 500 `internal` when it refuses the request itself
//! (another 4xx: a token or a limit, it would refuse it again) or for a request that does not
//! encode; 504 `outcome_unknown` when the connection breaks after the request went out, the
//! leader fails otherwise, or its success does not decode (it may have acted on it); 504
//! `timeout` when it does not answer in time.

use std::time::Duration;

use axum::http::header;
use meta_consensus::{codec, BUILD_VERSION};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::Token;
use crate::cluster_identity::{addressed, VERSION};
use crate::error::{ApiError, ForwardTo};
use crate::forward::{leader_failed, FORWARDED_BY};

/// Where and how a member sends exchanges to the leader.
#[derive(Debug)]
pub(crate) struct LeaderLink {
    /// This member's id, sent as the forwarding marker.
    pub id: u64,
    pub client: reqwest::Client,
    pub token: Token,
    /// This member's cluster: the leader refuses an exchange of another cluster, and one for
    /// another node (the process at the address may no longer be the leader it was).
    pub cluster: meta_consensus::ClusterId,
}

impl LeaderLink {
    /// Posts `request` to `path` at the leader `target` and decodes its answer; `what` names
    /// the request in errors ("a read index", "a batch").
    pub(crate) async fn exchange<Q, A>(
        &self,
        target: &ForwardTo,
        path: &str,
        what: &str,
        timeout: Duration,
        request: &Q,
    ) -> Result<A, ApiError>
    where
        Q: Serialize + ?Sized,
        A: DeserializeOwned,
    {
        let leader = |text: String| {
            format!(
                "the leader (node {} at {}) {text}",
                target.leader_id, target.addr
            )
        };
        let body = codec::encode(request)
            .map_err(|e| ApiError::Internal(format!("encoding {what}: {e}")))?;
        let post = self
            .client
            .post(format!("http://{}{path}", target.addr))
            .timeout(timeout)
            .header(FORWARDED_BY, self.id)
            // The leader answers only in forms this build decodes (`forward_batch::serve`).
            .header(VERSION, BUILD_VERSION)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        let response = addressed(post, &self.token, &self.cluster, target.leader_id)
            .send()
            .await
            .map_err(|e| leader_failed(target, &e, true))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            ApiError::OutcomeUnknown(leader(format!(
                "broke off its answer to {what} ({e}): it may have been acted on"
            )))
        })?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            let refused = leader(format!("refused {what} ({status}): {text}"));
            return Err(
                if status == reqwest::StatusCode::SERVICE_UNAVAILABLE
                    || status == reqwest::StatusCode::CONFLICT
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT
                {
                    // Stopping, overloaded, or no longer leading; not this cluster's leader or not
                    // the node named (409: the address now serves another); or the body came too
                    // slowly (408). It did nothing with the request, and a later try may succeed.
                    ApiError::NoLeader(refused)
                } else if status.is_client_error() {
                    // Its token, its limits: it did nothing with it, and will refuse it again.
                    ApiError::Internal(refused)
                } else {
                    ApiError::OutcomeUnknown(refused)
                },
            );
        }
        // A success the member cannot read: the leader may have acted on the request.
        codec::decode(&bytes).map_err(|e| {
            ApiError::OutcomeUnknown(leader(format!(
                "answered {what} undecodably ({e}): it may have been acted on"
            )))
        })
    }
}
