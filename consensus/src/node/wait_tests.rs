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

/// A request waiting for the next leader gives up once its node begins to close: it held the
/// drain for the whole wait, when every member stopped at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_next_leader_ends_when_the_node_closes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = NodeConfig::new(1, "local-1", dir.path().join("node-1"));
    let node = MetaNode::open(cfg, LocalRouter::new().network(1))
        .await
        .unwrap();
    node.lead_alone().await;
    // Node 1 leads: a wait for a leader other than it, in its term, has nothing to wait for.
    let other = node.clone();
    let term = node.term();
    let waiting = tokio::spawn(async move { other.next_leader(Some(1), term, WAIT * 3).await });
    node.begin_close();
    let next = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the wait ended once the node began to close")
        .unwrap();
    assert_eq!(next, None);
    node.shutdown().await.unwrap();
}
