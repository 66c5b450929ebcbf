//! A follower stopped with SIGTERM exits without waiting out its drain: the leader's long-lived
//! replication request must not hold its 15 s drain (an audit measured 15.5 s, with the follower campaigning
//! meanwhile and deposing the leader when it came back). The leader then says that it does not
//! answer, and so it does of a follower that is paused.

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
    // The leader says, once in a while, that the follower does not answer (openraft's two
    // lines per retry are left out by the default log filter, which these nodes, run with
    // RUST_LOG=warn, do not use: `logging.rs` tests it).
    let said = format!("node {follower} does not answer this node's messages");
    nodes[leader - 1].wait_logged(&said).await;
    for (i, node) in nodes.iter_mut().enumerate() {
        if i + 1 != follower {
            node.stop().await;
        }
    }
}

/// A follower that takes connections and answers nothing (a paused process) is named in the
/// leader's log too, once in a while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_is_named_in_the_leaders_log() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let (mut nodes, addrs) = common::spawn_members(&dirs, &[]);
    let leader = common::form_cluster(&http, "http", &addrs, None).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    nodes[follower - 1].signal(libc::SIGSTOP);
    // A paused process left by a failing test is killed when its `Proc` drops.
    let said = format!("node {follower} does not answer this node's messages");
    nodes[leader - 1].wait_logged(&said).await;
    nodes[follower - 1].signal(libc::SIGCONT);
    for node in &mut nodes {
        node.stop().await;
    }
}
