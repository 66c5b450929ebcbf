//! What a node's shutdown leaves to the next open of its data dir.

use crate::transport::LocalRouter;
use crate::{MetaNode, NodeConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_node_changes_no_snapshot_file_any_more() {
    let dir = tempfile::tempdir().unwrap();
    let router = LocalRouter::new();
    let cfg = NodeConfig::new(1, "local-1", dir.path().join("node-1"));
    let node = MetaNode::open(cfg, router.network(1)).await.unwrap();
    let store = node.inner.sm.snapshots.clone();
    let limiter = node.inner.sm.limiter.clone();
    node.shutdown().await.unwrap();
    // The dir is released: a snapshot build openraft left running must not rename its file
    // (and retire older ones) under a later open of it.
    let late = store.create("late", b"meta", limiter);
    assert!(
        matches!(late, Err(meta_store::Error::Closed)),
        "a snapshot writer was created after the shutdown: {late:?}"
    );
}
