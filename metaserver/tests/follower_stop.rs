//! A follower stopped with SIGTERM exits without waiting out its drain: the leader's long-lived
//! replication request must not hold its 15 s drain (an audit measured 15.5 s, with the follower campaigning
//! meanwhile and deposing the leader when it came back).

mod common;

use common::{client, send};
use reqwest::Method;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_follower_exits_at_once() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let (mut nodes, addrs) = common::spawn_members(&dirs, &[]);
    let leader = common::form_cluster(&http, "http", &addrs, None).await;
    // A write, then the cluster idles: the leader keeps its replication streams open.
    let url = format!("http://{}/v1/kv/k", addrs[0]);
    let (status, v) = send(&http, Method::PUT, &url, None, Some("v".into()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    nodes[follower - 1].stop().await;
    nodes[follower - 1].assert_drained();
    for (i, node) in nodes.iter_mut().enumerate() {
        if i + 1 != follower {
            node.stop().await;
        }
    }
}
