//! Messages between members carry their cluster's id: the `/raft` routes refuse another
//! cluster's, a node without one adopts the first it is sent, and adding a learner that belongs
//! to another cluster is refused before anything changes.

mod common;

use axum::http::{Method, StatusCode};
use common::{call, leader_node, open_node};

const CLUSTER: &str = "x-metaserver-cluster";

#[tokio::test]
async fn a_node_refuses_messages_of_another_cluster_and_adopts_the_first_it_knows() {
    let fresh = open_node(None).await;
    assert_eq!(fresh.node.cluster_id(), None);
    // No id on either side: accepted (a fresh node's vote request carries none).
    let a = call(&fresh.app, Method::POST, "/raft/identity", "", &[]).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{a:?}");
    let a = call(
        &fresh.app,
        Method::POST,
        "/raft/identity",
        "",
        &[(CLUSTER, "00000000000000ab")],
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{a:?}");
    assert_eq!(fresh.node.cluster_id(), Some(0xab), "adopted");
    let a = call(
        &fresh.app,
        Method::POST,
        "/raft/identity",
        "",
        &[(CLUSTER, "cd")],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "other_cluster");
    // Every Raft route is guarded, not only the probe: a vote of another cluster is refused
    // before its body is looked at.
    let a = call(
        &fresh.app,
        Method::POST,
        "/raft/vote",
        "garbage",
        &[(CLUSTER, "cd")],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    let a = call(
        &fresh.app,
        Method::POST,
        "/raft/vote",
        "",
        &[(CLUSTER, "not hex")],
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");

    // A node that initializes a cluster makes an id of its own.
    let leader = leader_node(None).await;
    let id = leader
        .node
        .cluster_id()
        .expect("an initialized node knows its cluster");
    let ours = format!("{id:016x}");
    let a = call(
        &leader.app,
        Method::POST,
        "/raft/identity",
        "",
        &[(CLUSTER, &ours)],
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{a:?}");
    let a = call(
        &leader.app,
        Method::POST,
        "/raft/identity",
        "",
        &[(CLUSTER, "ab")],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
}
