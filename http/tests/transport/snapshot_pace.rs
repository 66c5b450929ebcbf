//! The snapshot rate paces the snapshots a leader streams to members, with its exports and
//! downloads: the operator's bound on a node's snapshot traffic holds whatever its cause.

use crate::helpers::{join_by_snapshot, leader_with_purged_log, start_with};

/// A learner that joins after the leader purged its log takes a snapshot; with a snapshot rate
/// set, the leader's stream pauses to keep it (and the learner still gets all of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_streamed_to_a_member_is_paced() {
    let dir = tempfile::tempdir().unwrap();
    let leader = leader_with_purged_log(&dir, 1000).await;
    // About a third of a second for the snapshot's 20 KB; built before the rate was set, so
    // every pause from now on is the stream's.
    leader.node.set_snapshot_rate(64 << 10);
    let paused_before = leader.node.status().snapshot_throttle_pauses;

    let learner = start_with(2, &dir, None).await;
    join_by_snapshot(&leader, &learner).await;
    assert!(
        leader.node.status().snapshot_throttle_pauses > paused_before,
        "the stream was not paced"
    );
    let (records, digest) = learner.node.registry_digest().await.unwrap();
    assert_eq!(
        (records, digest),
        leader.node.registry_digest().await.unwrap()
    );
    learner.stop().await;
    leader.stop().await;
}
