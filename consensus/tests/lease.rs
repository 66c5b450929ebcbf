//! Lease reads across a follower's restart. A leader serves `Consistency::Lease` reads without
//! asking a quorum while one acknowledged it within the lease, because a node that acknowledged
//! a leader votes for no other until that lease has passed. openraft keeps that promise in
//! memory only: a restarted node would vote at once, and help elect a new leader while the old
//! one still served lease reads that miss the new leader's writes.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{Cluster, WAIT};
use meta_consensus::{Command, Consistency, MetaNode, Role};

fn put(key: &str, value: u8) -> Command {
    Command::Put {
        key: key.into(),
        value: vec![value],
        if_revision: None,
    }
}

/// The leader is cut off and one follower restarts at once; the other follower then campaigns.
/// The restarted follower acknowledged the old leader within its lease, so it votes for no new
/// leader until that lease has passed: no write is acknowledged by a new leader while the old
/// one still serves lease reads. Before the fix, the restarted follower voted at once and the
/// old leader answered a lease read with the value the new leader had just overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_votes_for_no_new_leader_within_the_old_leaders_lease() -> Result<()> {
    // A lease of 6 s: the steps below take well under that on a loaded machine, so without
    // the fix the new leader's write lands inside the old leader's lease.
    let mut c = Cluster::three_tuned(|cfg| {
        cfg.election_min_ms = 3000;
        cfg.election_max_ms = 6000;
    })
    .await?;
    let old = c.leader().await?;
    let w = old.write(put("k", 1)).await?;
    c.wait_applied(w.index).await?;
    let followers: Vec<u64> = c.nodes.keys().copied().filter(|i| *i != old.id()).collect();
    let (restarted, candidate) = (followers[0], followers[1]);

    c.router.isolate(old.id());
    c.stop(restarted).await?;
    c.start(restarted).await?;
    c.router.isolate(old.id());
    let candidate: MetaNode = c.node(candidate).clone();
    candidate.raft().trigger().elect(false).await?;

    // Write through whichever of the two leads, until one acknowledges.
    let deadline = std::time::Instant::now() + WAIT;
    let new_write = loop {
        let two = [candidate.clone(), c.node(restarted).clone()];
        if let Some(leader) = two.iter().find(|n| n.status().role == Role::Leader) {
            if let Ok(Ok(w)) =
                tokio::time::timeout(Duration::from_secs(2), leader.write(put("k", 2))).await
            {
                break w;
            }
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no new leader took a write"
        );
        candidate
            .raft()
            .wait(Some(Duration::from_millis(100)))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != old.id()),
                "new leader",
            )
            .await
            .ok();
    };
    // A lease read on the old leader now must not answer the value the new leader replaced.
    let read =
        tokio::time::timeout(Duration::from_secs(2), old.kv_get(Consistency::Lease, "k")).await;
    if let Ok(Ok(Some(e))) = &read {
        ensure!(
            e.value == vec![2],
            "the cut-off old leader served a lease read of {:?} after a new leader acknowledged \
             the write at {} that replaced it",
            e.value,
            new_write.index
        );
    }
    c.router.heal_all();
    c.converged().await.context("after healing")?;
    c.shutdown().await
}
