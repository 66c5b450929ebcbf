//! The Raft routes refuse garbage, and messages past the largest term or index.

use axum::http::{Method, StatusCode};
use meta_consensus::Role;

use crate::common::{call, leader_node, open_node_tuned};

#[tokio::test]
async fn raft_routes_refuse_garbage() {
    let t = leader_node(None).await;
    for path in [
        "/raft/append",
        "/raft/vote",
        "/raft/pre-vote",
        "/raft/transfer-leader",
        "/raft/snapshot",
        "/raft/room",
    ] {
        let a = t.send(Method::POST, path, vec![1u8, 2, 3]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(a.error_code(), "bad_rpc", "{path}");
    }
    // A message larger than its route takes is refused before its body is read, and the
    // connection is not kept (the rest of the body is never read).
    let huge = (64 * 1024 + 1).to_string();
    for path in [
        "/raft/vote",
        "/raft/pre-vote",
        "/raft/transfer-leader",
        "/raft/removed",
        "/raft/identity",
        "/raft/read-index",
        "/raft/room",
    ] {
        let a = call(&t.app, Method::POST, path, "", &[("content-length", &huge)]).await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {a:?}");
        assert_eq!(a.error_code(), "body_too_large", "{path}");
        assert_eq!(a.headers["connection"], "close", "{path}");
    }
    assert_eq!(t.node.status().role, Role::Leader);
}

/// A room notice from a node that is not another voter of the leader's cluster (an outsider
/// holding the token, or the leader itself) notes nothing: 409, and writes still pass.
#[tokio::test]
async fn a_room_notice_from_no_other_voter_notes_nothing() {
    let t = leader_node(None).await;
    for id in [t.node.id(), 99] {
        let body = format!(r#"{{"id":{id},"short":true,"free":0,"reserve":1}}"#);
        let a = t.send(Method::POST, "/raft/room", body).await;
        assert_eq!(a.status, StatusCode::CONFLICT, "node {id}: {a:?}");
        assert!(
            a.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("node {id} is another voter")),
            "{a:?}"
        );
    }
    let a = t.send(Method::PUT, "/v1/kv/k", "v").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
}

/// A Raft message past the bounds of terms and indexes is refused, whoever sent it: a vote
/// request of term u64::MAX (with `leadership_transfer`, which skips the leader's lease) was
/// granted and persisted, and the node's Raft core then panicked at every start.
#[tokio::test]
async fn raft_messages_past_the_largest_term_are_refused() {
    use meta_consensus::{codec, TypeConfig, Vote};
    use openraft::raft::VoteRequest;

    let t = leader_node(None).await;
    let before = t.node.status();
    let mut rpc = VoteRequest::<TypeConfig>::new(Vote::new(u64::MAX, 99), None);
    rpc.leadership_transfer = true;
    let body = codec::encode(&rpc).unwrap();
    for path in ["/raft/vote", "/raft/pre-vote"] {
        let a = t.send(Method::POST, path, body.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}: {a:?}");
        assert_eq!(a.error_code(), "bad_rpc", "{path}");
    }
    let after = t.node.status();
    assert_eq!((after.role, after.term), (Role::Leader, before.term));
}

/// A fresh node asked whether it may join a cluster adopts that cluster's id only if its build
/// applies the version the asker names: one that refuses (409 `build_too_old`), or that is sent
/// a malformed version (400 `bad_rpc`), still belongs to no cluster.
#[tokio::test]
async fn a_fresh_node_takes_a_clusters_id_only_if_its_build_applies_the_clusters_version() {
    let t = open_node_tuned(None, |cfg| cfg.build_version = 2).await;
    let cluster = ("x-metaserver-cluster", "00000000000000ab");
    let to = ("x-metaserver-to", "1");
    let ask = |version: &'static str| {
        let app = t.app.clone();
        async move {
            let version = ("x-metaserver-cluster-version", version);
            call(
                &app,
                Method::POST,
                "/raft/identity",
                "",
                &[cluster, to, version],
            )
            .await
        }
    };
    let a = ask("two").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    assert_eq!(a.error_code(), "bad_rpc");
    let a = ask("3").await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "build_too_old");
    assert_eq!(a.headers["x-metaserver-version"], "2", "it names its build");
    assert_eq!(t.node.cluster_id(), None, "a refusing node adopts nothing");

    let a = ask("2").await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{a:?}");
    assert_eq!(a.headers["x-metaserver-id"], "1");
    assert_eq!(
        t.node.cluster_id(),
        Some(0xab),
        "a consenting node joins the cluster"
    );
}
