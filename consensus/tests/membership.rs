//! Membership changes that meet each other: openraft takes one change at a time, and a call
//! that arrives while another is uncommitted waits for it instead of failing with a conflict.

mod common;

use std::collections::BTreeSet;

use anyhow::Result;
use common::{addr, Cluster};
use meta_consensus::Node;

/// Four learners added at once all join. Each change is proposed while others are still being
/// committed (they start together and each needs a quorum's fsync), which openraft refuses as
/// "in progress"; before the calls waited, most of them failed with a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_learner_additions_all_succeed() -> Result<()> {
    let mut c = Cluster::three().await?;
    for id in 4..=7 {
        c.start(id).await?;
    }
    let leader = c.leader().await?;
    let adds = (4..=7).map(|id| {
        let leader = leader.clone();
        async move { leader.add_learner(id, Node::new(addr(id))).await }
    });
    let results = futures::future::join_all(adds).await;
    for (id, r) in (4..=7).zip(results) {
        assert!(r.is_ok(), "adding learner {id}: {r:?}");
    }
    let learners: BTreeSet<_> = leader.status().learners.into_iter().collect();
    assert_eq!(learners, BTreeSet::from([4, 5, 6, 7]));

    // Removals at once wait for each other the same way.
    let removes = (4..=7).map(|id| {
        let leader = leader.clone();
        async move { leader.remove_learner(id).await }
    });
    for (id, r) in (4..=7).zip(futures::future::join_all(removes).await) {
        assert!(r.is_ok(), "removing learner {id}: {r:?}");
    }
    assert!(leader.status().learners.is_empty());
    c.shutdown().await
}
