//! A node initialized on its own (started with `--init`, or with no arguments) cannot be added
//! to another cluster: the add is refused with a clear error and the cluster keeps its leader.

mod common;

use common::{client, poll, send, spawn};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_not_added_as_a_learner() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    // Two one-node clusters: each initializes itself on its first start.
    let mut a = spawn(a_dir.path(), a_dir.path(), &[], &env, false);
    let mut b = spawn(b_dir.path(), b_dir.path(), &[], &env, false);
    let (a_addr, b_addr) = (a.address(), b.address());
    let base = format!("http://{a_addr}");
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    poll(&http, &format!("http://{b_addr}/readyz"), None, |_| true).await;

    let body = json!({"id": 2, "addr": b_addr}).to_string();
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{base}/v1/cluster/learners"),
        None,
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "other_cluster", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--init"), "{message}");

    // Nothing changed: no learner, and the cluster still takes writes.
    let v = poll(&http, &format!("{base}/v1/cluster"), None, |_| true).await;
    assert_eq!(v["learners"], json!([]), "{v}");
    assert_eq!(v["role"], "leader", "{v}");
    let (status, v) = send(
        &http,
        Method::PUT,
        &format!("{base}/v1/kv/k"),
        None,
        Some("v".into()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    a.stop().await;
    b.stop().await;
}

/// A node restarted at another address has the cluster move it there: a one-node cluster's
/// membership (which learners and forwarding members read) names the new address, not the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_another_address_is_moved_there() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let mut first = spawn(dir.path(), dir.path(), &[], &env, false);
    let old = first.address();
    poll(&http, &format!("http://{old}/readyz"), None, |_| true).await;
    first.stop().await;
    // Held while the node starts again, so that its port 0 cannot give it the old port.
    let _old_port = std::net::TcpListener::bind(&old).unwrap();

    let mut second = spawn(dir.path(), dir.path(), &[], &env, false);
    let new = second.address();
    assert_ne!(old, new);
    let v = poll(&http, &format!("http://{new}/v1/cluster"), None, |v| {
        v["leader_addr"] == new.as_str()
    })
    .await;
    assert_eq!(v["role"], "leader", "{v}");
    second.stop().await;
}
