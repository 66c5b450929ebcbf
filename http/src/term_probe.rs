//! The HTTP transport's `TermProbe`: a rejoining node asks a member for its term and
//! membership (`POST /raft/term`, `meta-consensus`'s `node/rejoin_gate.rs` says why).

use futures::future::BoxFuture;
use meta_consensus::{codec, ClusterId, NodeId, TermAnswer, TermProbe};

use crate::auth::Token;
use crate::cluster_identity;
use crate::peer_client::{failure, PeerClient};
use crate::raft_routes::{RemoteResult, PATH_TERM};

/// Largest answer read: a membership of a few members' addresses is far smaller.
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// Asks members over the node's pooled peer client, with the cluster's token and id.
pub(crate) struct HttpTermProbe {
    client: PeerClient,
    token: Token,
    cluster: ClusterId,
}

impl HttpTermProbe {
    pub(crate) fn new(client: PeerClient, token: Token, cluster: ClusterId) -> Self {
        HttpTermProbe {
            client,
            token,
            cluster,
        }
    }
}

impl TermProbe for HttpTermProbe {
    fn ask(
        &self,
        id: NodeId,
        addr: Option<String>,
    ) -> BoxFuture<'static, Result<TermAnswer, String>> {
        let Some(addr) = addr else {
            return Box::pin(std::future::ready(Err(
                "its address is not known yet".to_string()
            )));
        };
        let link = cluster_identity::MemberLink {
            client: &self.client,
            token: &self.token,
            cluster: &self.cluster,
        };
        let Some(request) = link.post(id, &addr, PATH_TERM) else {
            return Box::pin(std::future::ready(Err(
                "this node knows no cluster id to ask with yet".to_string(),
            )));
        };
        Box::pin(async move {
            let answer = request
                .send()
                .await
                .map_err(|e| format!("at {addr}: {}", failure(&e)))?;
            let status = answer.status();
            if !status.is_success() {
                return Err(format!("at {addr}: answered {status}"));
            }
            if answer.content_length().is_none_or(|n| n > MAX_ANSWER_BYTES) {
                return Err(format!("at {addr}: an answer of unknown or too large size"));
            }
            let body = answer
                .bytes()
                .await
                .map_err(|e| format!("at {addr}: {e}"))?;
            let answer: RemoteResult<TermAnswer> =
                codec::decode(&body).map_err(|e| format!("at {addr}: {e}"))?;
            answer.map_err(|e| format!("at {addr}: {e}"))
        })
    }
}
