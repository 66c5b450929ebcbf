//! What a node's shutdown leaves to the next open of its data dir.

use std::sync::Arc;
use std::time::Duration;

use crate::state_machine::ApplyGate;
use crate::transport::LocalRouter;
use crate::{Command, MetaNode, NodeConfig};

/// Bounds each wait of these tests.
const WAIT: Duration = Duration::from_secs(20);

/// Node 1, not yet initialized, with its data dir in `dir`.
async fn open_one(dir: &std::path::Path) -> MetaNode {
    let cfg = NodeConfig::new(1, "local-1", dir.join("node-1"));
    MetaNode::open(cfg, LocalRouter::new().network(1))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_node_changes_no_snapshot_file_any_more() {
    let dir = tempfile::tempdir().unwrap();
    let node = open_one(dir.path()).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_returns_only_once_openraft_stopped_applying() {
    let dir = tempfile::tempdir().unwrap();
    let node = open_one(dir.path()).await;
    node.lead_alone().await;
    // openraft's state machine worker stops in the apply of the next write.
    let (reached, reached_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release) = tokio::sync::oneshot::channel();
    *node.inner.sm.apply_gate.lock() = Some(ApplyGate { reached, release });
    let writer = node.clone();
    tokio::spawn(async move {
        let put = Command::Put {
            key: "k".into(),
            value: b"v".to_vec(),
            if_revision: None,
        };
        writer.write(put).await
    });
    tokio::time::timeout(WAIT, reached_rx)
        .await
        .expect("the write reached the state machine")
        .unwrap();
    let closing = node.clone();
    let mut shutdown = tokio::spawn(async move { closing.shutdown().await });
    // The worker still applies: the registry must not be closed under it. (A shutdown slower
    // than this window would let the check pass without a wait; it cannot fail with one.)
    let early = tokio::time::timeout(Duration::from_millis(300), &mut shutdown).await;
    assert!(
        early.is_err(),
        "the shutdown returned while openraft's state machine worker was applying"
    );
    release_tx.send(()).unwrap();
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("the shutdown ends once the apply did")
        .unwrap()
        .unwrap();
    // Nothing but this handle holds the state machine (and with it sled's lock on the registry).
    assert_eq!(Arc::strong_count(&node.inner.sm), 1);
}

/// A registry that failed a commit (found by a read's commit, before the next apply) stops the
/// node: it served nothing, yet looked ready, until an entry came to apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_failed_a_commit_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = open_one(dir.path()).await;
    let members = [(1, crate::Node::new("local-1"))].into();
    node.initialize(members).await.unwrap();
    node.inner.sm.fail();
    let why = tokio::time::timeout(WAIT, node.stopped())
        .await
        .expect("the node runs on after its registry failed");
    // Named by this node's look at the registry, or by the core, which stops at the next apply
    // for the same reason.
    assert!(
        why.contains("registry failed a write") || why.contains("registry commit failed"),
        "{why}"
    );
    assert_eq!(node.status().role, crate::Role::Shutdown);
    closes_unflushed(&node).await;
}

/// Shuts `node`, whose registry failed a write, down: the log closes, and the registry is not
/// flushed (sled's flush can wait forever after a failed write), which the shutdown says.
async fn closes_unflushed(node: &MetaNode) {
    let closed = tokio::time::timeout(WAIT, node.shutdown())
        .await
        .expect("the shutdown ends");
    match closed {
        Err(e) => assert!(e.to_string().contains("the next start rebuilds it"), "{e}"),
        Ok(()) => panic!("a registry that failed a write was said to be closed cleanly"),
    }
}

/// A node whose core stopped (here its registry failed) or that shuts down passes no Raft
/// message on to openraft, which would refuse it with an error logged for each (a leader's
/// heartbeats and a candidate's votes keep coming until the process exits): it answers
/// [`crate::Error::Stopped`] naming the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_passes_no_raft_message_to_its_core() {
    use openraft::raft::{AppendEntriesRequest, VoteRequest};

    let dir = tempfile::tempdir().unwrap();
    let node = open_one(dir.path()).await;
    let heartbeat = || AppendEntriesRequest {
        vote: crate::Vote::new_committed(1, 2),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let ballot = || VoteRequest::new(crate::Vote::new(1, 2), None);
    node.inner.sm.fail();
    let append = node.append_entries(heartbeat()).await;
    let registry_failed = |e: &crate::Error| matches!(e, crate::Error::Stopped(why) if why.contains("the registry failed a write"));
    assert!(append.as_ref().is_err_and(registry_failed), "{append:?}");
    let vote = node.vote(ballot()).await;
    assert!(vote.as_ref().is_err_and(registry_failed), "{vote:?}");
    closes_unflushed(&node).await;
}
