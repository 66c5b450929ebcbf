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
use meta_consensus::codec;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::Token;
use crate::cluster_identity::{addressed, VERSION};
use crate::error::{ApiError, ForwardTo};
use crate::forward::{leader_failed, FORWARDED_BY};
use crate::peer_client::PeerClient;

/// Where and how a member sends exchanges to the leader.
#[derive(Debug)]
pub(crate) struct LeaderLink {
    /// This member's id, sent as the forwarding marker.
    pub id: u64,
    /// This member's build version (its configured one, which tests set below the build's):
    /// the leader answers in forms that build decodes.
    pub build_version: u32,
    pub client: PeerClient,
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
            .http()
            .post(self.client.url(&target.addr, path))
            .timeout(timeout)
            .header(FORWARDED_BY, self.id)
            // The leader answers only in forms this build decodes (`forward_batch::serve`).
            .header(VERSION, self.build_version)
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
                } else if status == reqwest::StatusCode::UNAUTHORIZED {
                    // This member's token is not the leader's: no request through it can reach
                    // the leader, but one sent to another member can.
                    ApiError::Unavailable(leader(format!(
                        "refused this member's token ({status}): every member needs the same \
                         --token and --member-token; ask another member"
                    )))
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

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;
    use axum::routing::post;
    use axum::Router;
    use meta_consensus::ClusterId;

    use super::*;

    /// A leader that answers each exchange with the build version its sender named.
    async fn echoing_leader() -> String {
        let app = Router::new().route(
            "/echo",
            post(|headers: HeaderMap| async move {
                let named = headers.get(VERSION).and_then(|v| v.to_str().ok());
                codec::encode(&named.map(str::to_owned)).unwrap()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    #[tokio::test]
    async fn an_exchange_names_the_members_configured_build_not_the_compiled_one() {
        let addr = echoing_leader().await;
        let link = LeaderLink {
            id: 2,
            build_version: 1,
            client: PeerClient::plain(),
            token: Token::new(None),
            cluster: ClusterId::default(),
        };
        let target = ForwardTo { leader_id: 1, addr };
        let named: Option<String> = link
            .exchange(&target, "/echo", "a test", Duration::from_secs(10), &())
            .await
            .unwrap();
        // A test's member of an older build is answered as that build would be.
        assert_eq!(named.as_deref(), Some("1"));
    }

    /// A leader that refuses this member's token is no internal error of this member: the
    /// client is told to ask another member, and why.
    #[tokio::test]
    async fn a_refused_token_sends_the_client_to_another_member() {
        let app = Router::new().route(
            "/refuse",
            post(|| async { (axum::http::StatusCode::UNAUTHORIZED, "{}") }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let link = LeaderLink {
            id: 2,
            build_version: 1,
            client: PeerClient::plain(),
            token: Token::new(Some("other")),
            cluster: ClusterId::default(),
        };
        let target = ForwardTo { leader_id: 1, addr };
        let refused = link
            .exchange::<_, ()>(&target, "/refuse", "a test", Duration::from_secs(10), &())
            .await
            .unwrap_err();
        assert!(matches!(refused, ApiError::Unavailable(_)), "{refused:?}");
        assert!(
            refused.to_string().contains("the same --token"),
            "{refused}"
        );
    }
}
