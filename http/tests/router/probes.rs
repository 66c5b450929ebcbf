//! The probes and the metrics: `/healthz`, `/readyz` (which waits for a cluster) and
//! `/metrics`.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::common::{leader_node, open_node};

#[tokio::test]
async fn probes_and_metrics() {
    let t = leader_node(None).await;
    let a = t.get("/healthz").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json(), json!({"status":"ok"}));
    let a = t.get("/readyz").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");

    t.register_datanode(3).await;
    let a = t.get("/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    for metric in [
        "metaserver_http_requests_total{route=\"/v1/datanodes/{id}\",method=\"PUT\",status=\"200\"} 1",
        "metaserver_http_request_duration_seconds_bucket",
        "metaserver_wal_appends_total",
        "metaserver_wal_barriers_total",
        "metaserver_wal_records_per_barrier",
        "metaserver_wal_barrier_seconds_bucket{le=\"+Inf\"}",
        "metaserver_raft_term 1",
        "metaserver_raft_leader 1",
        "metaserver_raft_is_leader 1",
        "metaserver_raft_commit_index",
        "metaserver_raft_applied_index",
        "metaserver_snapshot_builds_total",
        "metaserver_snapshot_build_failures_total 0",
        "metaserver_watches_waiting 0",
        "metaserver_snapshot_throttle_pauses_total",
        "metaserver_registry_datanodes 1",
        "metaserver_registry_replicas 0",
    ] {
        assert!(text.contains(metric), "missing {metric} in:\n{text}");
    }
    // Like every route that takes no body, the probes refuse one.
    for uri in ["/healthz", "/readyz", "/metrics"] {
        let a = t.send(Method::GET, uri, "garbage").await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{uri}: {a:?}");
        assert_eq!(a.error_code(), "unexpected_body", "{uri}");
    }
}

#[tokio::test]
async fn readyz_waits_for_a_cluster() {
    let t = open_node(None).await;
    let a = t.get("/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.error_code(), "not_ready");
    assert!(a.headers.contains_key("retry-after"));
    assert!(
        a.error_message().contains("not a member of a cluster"),
        "{a:?}"
    );
    assert_eq!(t.get("/healthz").await.status, StatusCode::OK);
    // A node with no Raft state that learned its cluster (a wiped voter no leader reached
    // yet) waits for that cluster's leader: no init.
    t.node.accept_cluster(0xabcdef12).await.unwrap();
    let a = t.get("/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    let message = a.error_message();
    assert!(
        message.contains("rejoining its cluster") && message.contains("needs no init"),
        "{message}"
    );
    let a = t.get("/v1/cluster").await;
    assert_eq!(a.json()["rejoin"]["knows_cluster"], true, "{a:?}");
}
