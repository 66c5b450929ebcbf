//! Waits for the Raft metrics: a caller that asks openraft again after each wait asks it only
//! as often as something changed, not in a tight loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::transport::LocalRouter;
use crate::{MetaNode, Node, NodeConfig};

/// Bounds each wait of these tests.
const WAIT: Duration = Duration::from_secs(20);

/// A membership change made while another is not committed yet (a slow disk: every flush takes
/// 300 ms here) waits for it, asking openraft again only when the metrics changed: a fresh
/// receiver of the metrics took every value sent before it as new, so each wait ended at once
/// and openraft was asked (and logged an error) tens of thousands of times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_behind_an_uncommitted_one_asks_again_only_after_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = NodeConfig::new(1, "local-1", dir.path().join("node-1"));
    cfg.emulated_sync_latency = Duration::from_millis(300);
    let node = MetaNode::open(cfg, LocalRouter::new().network(1))
        .await
        .unwrap();
    node.lead_alone().await;
    // A change under way: the cluster's first membership until the leader's first entry is
    // flushed, or this one.
    let other = node.clone();
    let first = tokio::spawn(async move {
        other
            .membership_call(
                |raft| async move { raft.add_learner(2, Node::new("local-2"), false).await },
                || Ok(()),
            )
            .await
    });
    node.raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.membership_config.log_id() != m.committed_membership_config.log_id(),
            "a membership change is under way",
        )
        .await
        .unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let counted = asked.clone();
    node.membership_call(
        move |raft| {
            counted.fetch_add(1, Ordering::Relaxed);
            async move { raft.add_learner(3, Node::new("local-3"), false).await }
        },
        || Ok(()),
    )
    .await
    .unwrap();
    first.await.unwrap().unwrap();
    let asked = asked.load(Ordering::Relaxed);
    assert!(asked <= 10, "openraft was asked {asked} times");
    node.shutdown().await.unwrap();
}
