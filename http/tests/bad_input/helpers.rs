//! What the matrix is made of: one bad request and its expected answer, and the populated
//! node the requests are sent to.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::common::{call, leader_node, TestNode};

pub const TOKEN: &str = "matrix-token";
pub const AUTH: (&str, &str) = ("authorization", "Bearer matrix-token");

/// One bad request and what it must answer.
pub struct Case {
    pub what: &'static str,
    pub method: Method,
    pub uri: String,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, &'static str)>,
    pub status: StatusCode,
    pub code: &'static str,
}

pub fn case(
    what: &'static str,
    method: Method,
    uri: impl Into<String>,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        what,
        method,
        uri: uri.into(),
        body: body.into(),
        headers: vec![AUTH],
        status: StatusCode::from_u16(status).unwrap(),
        code,
    }
}

/// A node with a token, datanode 7 holding one shard, and one key.
pub async fn populated() -> (TestNode, u64) {
    let t = leader_node(Some(TOKEN)).await;
    let a = call(
        &t.app,
        Method::PUT,
        "/v1/datanodes/7",
        r#"{"addr":"10.0.0.7:9000"}"#,
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let epoch = a.json()["epoch"].as_u64().unwrap();
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 3, "size": 10}]});
    let a = call(
        &t.app,
        Method::POST,
        "/v1/datanodes/7/shards",
        body.to_string(),
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The report is complete (the prune drops nothing). The first prune raises the cluster's
    // version: done here, the refused prunes of the cases change nothing at all.
    let prune = json!({ "epoch": epoch }).to_string();
    let a = call(
        &t.app,
        Method::POST,
        "/v1/datanodes/7/prune",
        prune,
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(t.node.cluster_version(), 2);
    let a = call(&t.app, Method::PUT, "/v1/kv/existing", "v", &[AUTH]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    (t, epoch)
}
