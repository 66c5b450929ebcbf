//! A member restarted at another address has the cluster move it there. The membership still
//! names its old address, where the others keep sending it messages, so it asks the members
//! (itself first: a one-node cluster's leader is itself) to move it with
//! `PUT /v1/cluster/members/{id}`; a member that does not lead forwards the request to the
//! leader, which first makes sure that this node answers at the new address. It asks again,
//! backing off up to 30 s, until the membership names the new address or the node stops.

use std::time::Duration;

use meta_consensus::MetaNode;
use meta_http::{PeerClient, Token};

/// Longest wait between two rounds of asking.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs until the membership names this node at `addr`, the node is no member, or it stops.
pub async fn follow(node: MetaNode, token: Token, client: PeerClient, addr: String) {
    // A node listening on all interfaces without --advertise has no address to give (it warns
    // at start); asking to be moved to 0.0.0.0 would be refused for ever.
    if crate::settings::unspecified(&addr) {
        return;
    }
    let id = node.id();
    let mut backoff = Duration::from_millis(500);
    loop {
        let members = node.status().nodes;
        let old = match members.get(&id) {
            Some(known) if *known != addr => known.clone(),
            _ => return,
        };
        let askees = std::iter::once(addr.clone()).chain(
            members
                .into_iter()
                .filter(|(m, _)| *m != id)
                .map(|(_, a)| a),
        );
        // Each member's answer, for the warning below: it says why the move is refused (no
        // answer at the new address, members of another cluster).
        let mut answers = Vec::new();
        for askee in askees {
            let mut request = client
                .http()
                .put(client.url(&askee, &format!("/v1/cluster/members/{id}")))
                .timeout(Duration::from_secs(20))
                .body(serde_json::json!({ "addr": addr }).to_string());
            if let Some(value) = token.header_value() {
                request = request.header(reqwest::header::AUTHORIZATION, value);
            }
            match request.send().await {
                Ok(r) if r.status().is_success() => {
                    tracing::info!(%old, new = %addr, "the cluster moved this node to its new address");
                    return;
                }
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                        .unwrap_or(text);
                    let message: String = message.chars().take(300).collect();
                    answers.push(format!("{askee} answered {status}: {message}"));
                }
                Err(e) => answers.push(format!("{askee}: {}", meta_http::peer_client::failure(&e))),
            }
        }
        tracing::warn!(
            %old, new = %addr,
            "no member has moved this node to its new address yet; asking again in {backoff:?}. \
             The answers: {}",
            answers.join("; ")
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = node.closing() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
