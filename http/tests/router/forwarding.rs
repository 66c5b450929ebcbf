//! Three in-process nodes: requests forwarded to the leader once, with timeouts, and reads
//! replayed with a read index.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use meta_consensus::transport::LocalRouter;
use meta_consensus::{Command, MetaNode, Node};
use meta_http::{AppState, Token};

use crate::common;
use crate::common::{call, test_config, wait_for};

/// Three in-process nodes with short request timeouts; returns them and the leader's id.
async fn three_nodes(dir: &std::path::Path) -> (LocalRouter, BTreeMap<u64, MetaNode>, u64) {
    let router = LocalRouter::new();
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let mut cfg = test_config(id, &format!("127.0.0.1:{id}"), &dir.join(id.to_string()));
        cfg.request_timeout = Duration::from_millis(300);
        let node = MetaNode::open(cfg, router.network(id)).await.unwrap();
        router.register(node.clone());
        nodes.insert(id, node);
    }
    let members = (1..=3u64)
        .map(|id| (id, Node::new(format!("127.0.0.1:{id}"))))
        .collect();
    nodes[&1].initialize(members).await.unwrap();
    wait_for(
        || {
            let leader = nodes[&1].status().leader_id;
            leader.is_some() && nodes.values().all(|n| n.status().leader_id == leader)
        },
        "all three agree on a leader",
    )
    .await;
    let leader = nodes[&1].status().leader_id.unwrap();
    (router, nodes, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_once_and_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let (router, nodes, leader) = three_nodes(dir.path()).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let app = meta_http::router(AppState::new(nodes[&follower].clone(), Token::new(None)));

    // A request another member already forwarded is not forwarded again.
    let a = call(
        &app,
        Method::PUT,
        "/v1/datanodes/1",
        r#"{"addr":"10.0.0.1:1"}"#,
        &[("x-metaserver-forwarded-by", "3")],
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");

    // A leader cut off from both followers cannot commit: 504 within its request timeout, or
    // 503 no_leader if a starved machine let its lease lapse first (it then refuses to
    // propose at all); nothing is acknowledged either way.
    let leader_app = meta_http::router(AppState::new(nodes[&leader].clone(), Token::new(None)));
    router.isolate(leader);
    let before = nodes[&follower].registry_digest().await.unwrap();
    let a = call(&leader_app, Method::PUT, "/v1/kv/k", "v", &[]).await;
    let refused = (a.status, a.error_code());
    assert!(
        refused == (StatusCode::GATEWAY_TIMEOUT, "timeout".to_string())
            || refused == (StatusCode::SERVICE_UNAVAILABLE, "no_leader".to_string()),
        "{a:?}"
    );
    // Nothing reached the followers.
    assert_eq!(nodes[&follower].registry_digest().await.unwrap(), before);
    router.heal_all();
    for node in nodes.values() {
        node.shutdown().await.unwrap();
    }
}

/// A request that a member of another cluster replays here (its membership names this
/// address as its leader's) is refused, and changes nothing; one of this cluster, or from a
/// build that sends no cluster id, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_from_another_cluster_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, nodes, leader) = three_nodes(dir.path()).await;
    let app = meta_http::router(AppState::new(nodes[&leader].clone(), Token::new(None)));
    // The node that initialized the cluster recorded its id.
    let ours = nodes[&leader].config().cluster_id.get().unwrap();
    let (ours, theirs) = (format!("{ours:016x}"), format!("{:016x}", ours ^ 1));
    let forwarded = ("x-metaserver-forwarded-by", "3");
    let before = nodes[&leader].registry_digest().await.unwrap();
    for (method, uri, body) in [
        (Method::PUT, "/v1/kv/x", "1"),
        (Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#),
        (Method::GET, "/v1/kv/k", ""),
    ] {
        let a = call(
            &app,
            method.clone(),
            uri,
            body,
            &[forwarded, ("x-metaserver-cluster", theirs.as_str())],
        )
        .await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{method} {uri}: {a:?}");
        assert_eq!(a.error_code(), "other_cluster");
    }
    assert_eq!(
        nodes[&leader].registry_digest().await.unwrap(),
        before,
        "a refused replay changed the registry"
    );
    for cluster in [vec![("x-metaserver-cluster", ours.as_str())], vec![]] {
        let mut headers = vec![forwarded];
        headers.extend(cluster);
        let a = call(&app, Method::PUT, "/v1/kv/x", "1", &headers).await;
        assert_eq!(a.status, StatusCode::OK, "{headers:?}: {a:?}");
    }
    for node in nodes.values() {
        node.shutdown().await.unwrap();
    }
}

/// A read that a member replays with the leader's read index (a follower that did not catch up
/// in time) is answered by the receiver from its own registry once it applied that index, even
/// by a follower, which would otherwise refuse a replayed read; an index it never reaches ends
/// in 504 within the request timeout, and an index that does not parse counts as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_replayed_with_a_read_index_is_answered_once_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, nodes, leader) = three_nodes(dir.path()).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let app = meta_http::router(AppState::new(nodes[&follower].clone(), Token::new(None)));
    let written = nodes[&leader]
        .write(Command::Put {
            key: "k".into(),
            value: b"v1".to_vec(),
            if_revision: None,
        })
        .await
        .unwrap();
    let forwarded = ("x-metaserver-forwarded-by", "3");
    // In-process members carry no cluster id; over HTTP the first message gives them one.
    nodes[&follower].accept_cluster(0xab).await.unwrap();
    let member = ("x-metaserver-cluster", "00000000000000ab");
    // The write was acknowledged by a quorum that may not include this follower; with the
    // 300 ms request timeout, waiting for it inside the request fails on a loaded machine.
    nodes[&follower]
        .wait_applied(written.index, common::DEADLINE)
        .await
        .unwrap();

    let index = written.index.to_string();
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", &index)],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(&a.body[..], b"v1");

    // Only a member's replay is trusted with a read index: without the cluster's id (which
    // clients never see) the headers are a client's claim, and the read is not answered here;
    // with another cluster's id it is refused as that cluster's.
    for (claim, refused) in [
        (
            vec![forwarded, ("x-metaserver-read-index", index.as_str())],
            (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
        ),
        (
            vec![
                forwarded,
                ("x-metaserver-cluster", "00000000000000cd"),
                ("x-metaserver-read-index", index.as_str()),
            ],
            (StatusCode::CONFLICT, "other_cluster"),
        ),
    ] {
        let a = call(&app, Method::GET, "/v1/kv/k", "", &claim).await;
        assert_eq!(
            (a.status, a.error_code().as_str()),
            refused,
            "{claim:?}: {a:?}"
        );
    }

    let a = call(&app, Method::GET, "/v1/kv/k", "", &[forwarded]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", "soon")],
    )
    .await;
    assert_eq!(a.error_code(), "no_leader", "{a:?}");

    let beyond = (written.index + 1_000).to_string();
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", &beyond)],
    )
    .await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{a:?}");
    for node in nodes.values() {
        node.shutdown().await.unwrap();
    }
}

/// A follower restarted while its leader is cut off from it never hears from the leader its
/// saved vote names: once that leader counts as silent, the answer says it was not heard from
/// since this node started (not that it fell silent some milliseconds ago).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_says_its_leader_was_not_heard_since_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let (router, mut nodes, leader) = three_nodes(dir.path()).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    router.cut(leader, follower);
    router.unregister(follower);
    // The registry's lock goes with the last handle to the node.
    let old = nodes.remove(&follower).unwrap();
    old.shutdown().await.unwrap();
    drop(old);
    let cfg = test_config(
        follower,
        &format!("127.0.0.1:{follower}"),
        &dir.path().join(follower.to_string()),
    );
    let node = MetaNode::open(cfg, router.network(follower)).await.unwrap();
    router.register(node.clone());
    wait_for(
        || node.silent_leader().is_some_and(|(l, _)| l == leader),
        "the leader counts as silent",
    )
    .await;
    let app = meta_http::router(AppState::new(node.clone(), Token::new(None)));
    let a = call(&app, Method::PUT, "/v1/kv/k", "v", &[]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert!(
        a.error_message()
            .contains("has not been heard from since this node started"),
        "{a:?}"
    );
    router.heal_all();
    node.shutdown().await.unwrap();
    for n in nodes.values() {
        n.shutdown().await.unwrap();
    }
}
