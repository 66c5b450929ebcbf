//! What a node with no Raft state (new, or a voter whose data dir was lost) answers its
//! clients while it rejoins its cluster.

mod common;

use anyhow::{ensure, Result};
use common::Cluster;
use meta_consensus::{Command, Error, MetaNode};
use openraft::async_runtime::watch::WatchReceiver as _;

/// A node with no Raft state that a leader contacted, while too few voters answer its question
/// for the cluster's term, says that it waits for them: it answered that it is in no cluster
/// and should be initialized, which would split a member whose data dir was lost off as a
/// cluster of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_that_waits_for_the_term_says_so_not_that_it_needs_an_init() -> Result<()> {
    use openraft::raft::AppendEntriesRequest;

    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let others: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let (down, wiped) = (others[0], others[1]);
    c.converged().await?;
    let lm = c.node(leader).raft().metrics().borrow_watched().clone();
    c.stop(down).await?;
    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    c.stop(leader).await?;
    let empty = c.start(wiped).await?;
    let heartbeat = AppendEntriesRequest {
        vote: lm.vote,
        prev_log_id: lm.last_applied,
        entries: vec![],
        leader_commit: lm.local_committed,
    };
    let answer = empty.append_entries(heartbeat).await;
    ensure!(matches!(answer, Err(Error::Rejoining(_))), "{answer:?}");
    let put = Command::Put {
        key: "k".into(),
        value: vec![],
        if_revision: None,
    };
    match empty.write(put).await {
        Err(Error::Rejoining(why)) => ensure!(why.contains("needs no --init"), "{why}"),
        other => anyhow::bail!("a write at the waiting node: {other:?}"),
    }
    let status = empty.status();
    ensure!(
        status.rejoin.is_some_and(|r| r.waiting.is_some()),
        "the status says what it waits for"
    );
    c.shutdown().await
}

/// A node with no Raft state that no leader reached yet but that knows its cluster (a
/// member's message gave it the id: a voter whose data dir was lost, restarted while too few
/// voters are up to elect a leader) says that it waits for that cluster, not that it should
/// be initialized; a node that knows no cluster still says it is in none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_a_known_cluster_waits_for_its_leader_not_for_an_init() -> Result<()> {
    let mut c = Cluster::three().await?;
    // No leader to reach it: the others are down.
    for id in 1..=3 {
        c.stop(id).await?;
    }
    std::fs::remove_dir_all(c.dir(3))?;
    let empty = c.start(3).await?;
    let put = || Command::Put {
        key: "k".into(),
        value: vec![],
        if_revision: None,
    };
    match empty.write(put()).await {
        Err(Error::NotMember) => {}
        other => anyhow::bail!("a node of no cluster: {other:?}"),
    }
    let knows = |n: &MetaNode| n.status().rejoin.map(|r| r.knows_cluster);
    ensure!(knows(&empty) == Some(false), "{:?}", empty.status().rejoin);
    empty.accept_cluster(0xabcdef12).await?;
    ensure!(knows(&empty) == Some(true), "{:?}", empty.status().rejoin);
    match empty.write(put()).await {
        Err(Error::Rejoining(why)) => ensure!(
            why.contains("belongs to a cluster")
                && why.contains("needs no --init")
                && !why.contains("abcdef12"),
            "{why}"
        ),
        other => anyhow::bail!("a node of a known cluster: {other:?}"),
    }
    c.shutdown().await
}
