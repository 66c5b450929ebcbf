//! Lease reads across a follower's restart. A leader serves `Consistency::Lease` reads without
//! asking a quorum while one acknowledged it within the lease, because a node that acknowledged
//! a leader votes for no other until that lease has passed. openraft keeps that promise in
//! memory only: a restarted node would vote at once, and help elect a new leader while the old
//! one still served lease reads that miss the new leader's writes, or campaign and become that
//! leader itself.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{Cluster, WAIT};
use meta_consensus::{Command, Consistency, MetaNode, NodeId, Role};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::VoteRequest;

fn put(key: &str, value: u8) -> Command {
    Command::Put {
        key: key.into(),
        value: vec![value],
        if_revision: None,
    }
}

/// The leader, once every member applied its write of 1 to `k`, and the two followers.
async fn leader_with_a_write(c: &Cluster) -> Result<(MetaNode, NodeId, NodeId)> {
    let old = c.leader().await?;
    let w = old.write(put("k", 1)).await?;
    c.wait_applied(w.index).await?;
    let followers: Vec<NodeId> = c.nodes.keys().copied().filter(|i| *i != old.id()).collect();
    Ok((old, followers[0], followers[1]))
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
    let (old, restarted, candidate) = leader_with_a_write(&c).await?;

    c.router.isolate(old.id());
    c.stop(restarted).await?;
    c.start(restarted).await?;
    c.router.isolate(old.id());
    let candidate: MetaNode = c.node(candidate).clone();
    candidate.raft().trigger().elect(false).await?;

    no_stale_lease_read(&old, &[candidate.id(), restarted], &c).await?;
    c.router.heal_all();
    c.converged().await.context("after healing")?;
    c.shutdown().await
}

/// Writes through whichever of `others` leads, until one acknowledges; then a lease read on
/// the cut-off `old` leader must not answer the value that write replaced.
async fn no_stale_lease_read(old: &MetaNode, others: &[NodeId], c: &Cluster) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    let new_write = loop {
        let leader = others
            .iter()
            .map(|id| c.node(*id))
            .find(|n| n.status().role == Role::Leader);
        if let Some(leader) = leader {
            let write = tokio::time::timeout(Duration::from_secs(2), leader.write(put("k", 2)));
            if let Ok(Ok(w)) = write.await {
                break w;
            }
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no new leader took a write"
        );
        c.node(others[0])
            .raft()
            .wait(Some(Duration::from_millis(100)))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != old.id()),
                "new leader",
            )
            .await
            .ok();
    };
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
    Ok(())
}

/// The other way a restarted follower could break the lease: by campaigning itself. The
/// leader is cut off from one follower until that follower's lease has run out (it would grant
/// a vote); the other follower restarts and the leader is cut off from it too. The restarted
/// follower acknowledged the leader just before, so it stands for no election until that
/// lease has passed. Before, it campaigned at its first election timeout (from 0.5 s after it
/// opened here), won the vote of the follower whose lease had run out, and acknowledged a
/// write while the old leader still served lease reads (a failure at most seeds: the timeout
/// is random, and one drawn near its maximum falls after the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_stands_for_no_election_within_the_old_leaders_lease() -> Result<()> {
    let mut c = Cluster::three_tuned(|cfg| {
        cfg.election_min_ms = 500;
        cfg.election_max_ms = 6000;
    })
    .await?;
    let (old, restarted, lapsed) = leader_with_a_write(&c).await?;

    // Cut off from the leader, `lapsed` would grant a vote once its lease ran out: ask it
    // (a pre-vote changes nothing) until it would.
    c.router.cut(old.id(), lapsed);
    let probe_of = |n: &MetaNode| {
        let m = n.raft().metrics().borrow_watched().clone();
        VoteRequest::new(
            meta_consensus::Vote::new(m.current_term + 1, restarted),
            m.last_applied,
        )
    };
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let node = c.node(lapsed).clone();
        if node.pre_vote(probe_of(&node)).await?.vote_granted {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "node {lapsed} kept its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    c.stop(restarted).await?;
    c.start(restarted).await?;
    c.router.isolate(old.id());
    no_stale_lease_read(&old, &[lapsed, restarted], &c).await?;
    c.router.heal_all();
    c.converged().await.context("after healing")?;
    c.shutdown().await
}

/// Holds the links between `leader` and the other voters (their messages wait unanswered, as
/// a paused process's), then polls until `done` holds of the leader (at most [`WAIT`]).
async fn hold_followers_until(
    c: &Cluster,
    leader: &MetaNode,
    done: impl Fn(&MetaNode) -> bool,
) -> Result<()> {
    for other in (1..=3).filter(|id| *id != leader.id()) {
        c.router.hold(leader.id(), other);
    }
    let deadline = std::time::Instant::now() + WAIT;
    while !done(leader) {
        ensure!(
            std::time::Instant::now() < deadline,
            "{:?}",
            leader.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A leader that no quorum has acknowledged for two election timeouts (its messages to the
/// followers go unanswered, as to paused processes) refuses a read at once, `NoLeader`, as it
/// does a write, so that its clients ask another member: it does not send a round of its own
/// that nobody answers and wait for it. (Its status says so from one election timeout on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_no_quorum_acknowledges_refuses_reads_at_once() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let lease = c.config(leader.id()).election_timeout();
    hold_followers_until(&c, &leader, |l| l.unacknowledged_for().is_some()).await?;
    for consistency in [Consistency::Linearizable, Consistency::Lease] {
        // Its own round would wait out the lease (an election timeout) for answers.
        let read = leader.kv_get(consistency, "k");
        match tokio::time::timeout(lease / 2, read).await {
            Ok(Err(meta_consensus::Error::NoLeader)) => {}
            Ok(other) => anyhow::bail!("{consistency:?}: {other:?}"),
            Err(_) => anyhow::bail!("{consistency:?}: the read waited for a round nobody answers"),
        }
    }
    c.router.heal_all();
    c.shutdown().await
}

/// Nor does it take a leadership move or a membership change: each is refused at once,
/// `NoLeader`, not with the target's silence (every voter is silent to it), after waiting the
/// lease for an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_no_quorum_acknowledges_refuses_a_leadership_move() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let lease = c.config(leader.id()).election_timeout();
    hold_followers_until(&c, &leader, |l| l.unacknowledged_for().is_some()).await?;
    let to = (1..=3).find(|i| *i != leader.id()).unwrap();
    match tokio::time::timeout(lease / 2, leader.transfer_leadership(to)).await {
        Ok(Err(meta_consensus::Error::NoLeader)) => {}
        Ok(other) => anyhow::bail!("{other:?}"),
        Err(_) => anyhow::bail!("the move waited for voters nobody hears"),
    }
    // Nor a move to itself (it answered that it leads), nor a membership change (it waited a
    // lease for answers, then was refused for a majority that does not answer).
    let me = leader.id();
    match tokio::time::timeout(lease / 2, leader.transfer_leadership(me)).await {
        Ok(Err(meta_consensus::Error::NoLeader)) => {}
        other => anyhow::bail!("a move to itself: {other:?}"),
    }
    match tokio::time::timeout(lease / 2, leader.remove_voter(to)).await {
        Ok(Err(meta_consensus::Error::NoLeader)) => {}
        Ok(other) => anyhow::bail!("a removal: {other:?}"),
        Err(_) => anyhow::bail!("the removal waited for voters nobody hears"),
    }
    c.router.heal_all();
    c.shutdown().await
}

/// A read under way at a leader whose quorum falls silent is refused at that moment, with the
/// writes under way, not when its own round gives up (up to an election timeout later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_under_way_is_refused_when_the_quorum_falls_silent() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let election = c.config(leader.id()).election_timeout();
    hold_followers_until(&c, &leader, |l| {
        l.status().role == Role::LeaderWithoutQuorum
    })
    .await?;
    // Half an election timeout into the last one before the quorum counts as silent: its own
    // round would wait for answers up to an election timeout from now.
    tokio::time::sleep(election / 2).await;
    let reader = leader.clone();
    let read = tokio::spawn(async move { reader.kv_get(Consistency::Linearizable, "k").await });
    tokio::time::timeout(WAIT, leader.quorum_silenced()).await?;
    match tokio::time::timeout(election / 4, read).await {
        Ok(Ok(Err(meta_consensus::Error::NoLeader))) => {}
        Ok(other) => anyhow::bail!("{other:?}"),
        Err(_) => anyhow::bail!("the read was not refused when the quorum fell silent"),
    }
    c.router.heal_all();
    c.shutdown().await
}
