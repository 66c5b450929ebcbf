//! Messages between members carry their cluster's id: the `/raft` routes refuse another
//! cluster's, a node without one adopts the first it is sent, and adding a learner that belongs
//! to another cluster is refused before anything changes.

mod common;

use axum::http::{Method, StatusCode};
use axum::Router;
use common::{call, leader_node, open_node};

const CLUSTER: &str = "x-metaserver-cluster";

/// The status of `POST path` with `body`, carrying `cluster` as the sender's id if given.
async fn status_of(
    app: &Router,
    path: &str,
    body: &'static str,
    cluster: Option<&str>,
) -> StatusCode {
    let headers: Vec<(&str, &str)> = cluster.map(|c| (CLUSTER, c)).into_iter().collect();
    call(app, Method::POST, path, body, &headers).await.status
}

#[tokio::test]
async fn a_node_refuses_messages_of_another_cluster_and_adopts_the_first_it_knows() {
    let fresh = open_node(None).await;
    let app = &fresh.app;
    assert_eq!(fresh.node.cluster_id(), None);
    // No id on either side: accepted (a fresh node's vote request carries none).
    assert_eq!(
        status_of(app, "/raft/identity", "", None).await,
        StatusCode::NO_CONTENT
    );
    let ab = Some("00000000000000ab");
    assert_eq!(
        status_of(app, "/raft/identity", "", ab).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(fresh.node.cluster_id(), Some(0xab), "adopted");
    let a = call(app, Method::POST, "/raft/identity", "", &[(CLUSTER, "cd")]).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "other_cluster");
    // Every Raft route is guarded, not only the probe: a vote of another cluster is refused
    // before its body is looked at.
    let cd = Some("cd");
    assert_eq!(
        status_of(app, "/raft/vote", "garbage", cd).await,
        StatusCode::CONFLICT
    );
    let bad = Some("not hex");
    assert_eq!(
        status_of(app, "/raft/vote", "", bad).await,
        StatusCode::BAD_REQUEST
    );

    // A node that initializes a cluster makes an id of its own.
    let leader = leader_node(None).await;
    let id = leader
        .node
        .cluster_id()
        .expect("an initialized node knows its cluster");
    let ours = format!("{id:016x}");
    let app = &leader.app;
    assert_eq!(
        status_of(app, "/raft/identity", "", Some(&ours)).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        status_of(app, "/raft/identity", "", Some("ab")).await,
        StatusCode::CONFLICT
    );
}

/// A node that adopted a cluster's id without joining it (the probe of an add that then failed)
/// and is then initialized forms a cluster of its own id: under the other's, its messages would
/// pass that cluster's checks, and an add of it would mix two histories.
#[tokio::test]
async fn a_node_that_adopted_an_id_without_joining_forms_its_cluster_under_a_fresh_one() {
    let fresh = open_node(None).await;
    let ab = Some("00000000000000ab");
    assert_eq!(
        status_of(&fresh.app, "/raft/identity", "", ab).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(fresh.node.cluster_id(), Some(0xab));
    let init = call(
        &fresh.app,
        Method::POST,
        "/v1/cluster/init",
        r#"{"members":{"1":"127.0.0.1:1"}}"#,
        &[],
    )
    .await;
    assert!(init.status.is_success(), "{init:?}");
    let id = fresh.node.cluster_id().expect("a cluster id");
    assert_ne!(id, 0xab, "formed a cluster under the adopted id");
    assert_eq!(
        status_of(&fresh.app, "/raft/identity", "", ab).await,
        StatusCode::CONFLICT,
        "the other cluster's messages are refused"
    );
    // It is durable: a restart reads the new id.
    let recorded = std::fs::read_to_string(fresh.dir.path().join("cluster-id")).unwrap();
    assert_eq!(recorded.trim(), format!("{id:016x}"));
}

/// A message names its addressee: a node refuses one for another id (409 `wrong_node`) before
/// anything else, so a membership that names this node's address for another node never gets
/// answers from it.
#[tokio::test]
async fn a_node_refuses_messages_for_another_node() {
    let leader = leader_node(None).await;
    let app = &leader.app;
    let a = call(
        app,
        Method::POST,
        "/raft/vote",
        "garbage",
        &[("x-metaserver-to", "7")],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "wrong_node");
    let a = call(
        app,
        Method::POST,
        "/raft/identity",
        "",
        &[("x-metaserver-to", "x")],
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    let own = leader.node.id().to_string();
    let a = call(
        app,
        Method::POST,
        "/raft/identity",
        "",
        &[("x-metaserver-to", &own)],
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{a:?}");
}

/// What members ask the leader (forwarded writes, read indexes) is checked as the Raft
/// messages are: another cluster's (the address now serves another cluster's leader) or
/// another node's is refused before its body is looked at, and a node that knows no cluster
/// answers that it leads none (503) instead of joining the sender's cluster.
#[tokio::test]
async fn the_leaders_exchanges_refuse_other_clusters_and_nodes() {
    let leader = leader_node(None).await;
    let app = &leader.app;
    for path in ["/raft/forward-commands", "/raft/read-index"] {
        let a = call(app, Method::POST, path, "garbage", &[(CLUSTER, "cd")]).await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{path}: {a:?}");
        assert_eq!(a.error_code(), "other_cluster", "{path}");
        let a = call(
            app,
            Method::POST,
            path,
            "garbage",
            &[("x-metaserver-to", "7")],
        )
        .await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{path}: {a:?}");
        assert_eq!(a.error_code(), "wrong_node", "{path}");
    }

    let fresh = open_node(None).await;
    for path in ["/raft/forward-commands", "/raft/read-index"] {
        let a = call(
            &fresh.app,
            Method::POST,
            path,
            "garbage",
            &[(CLUSTER, "00000000000000ab")],
        )
        .await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {a:?}");
        assert_eq!(a.error_code(), "no_leader", "{path}");
    }
    assert_eq!(fresh.node.cluster_id(), None, "not adopted");
}
