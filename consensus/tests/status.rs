//! What a node reports about its peers: the leader tells how long ago it heard each member, a
//! figure that grows while a member is down even when nothing is written (the lag does not).

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use common::{Cluster, WAIT};
use meta_consensus::{MetaNode, NodeId};

/// Milliseconds since `leader` heard `id`, as its status reports them.
fn heard(leader: &MetaNode, id: NodeId) -> Option<u64> {
    leader
        .status()
        .replication
        .iter()
        .find(|r| r.node == id)
        .and_then(|r| r.heard_ms)
}

/// How far behind the leader's log `leader` reports member `id`.
fn lag_of(leader: &MetaNode, id: NodeId) -> Option<u64> {
    leader
        .status()
        .replication
        .iter()
        .find(|r| r.node == id)
        .map(|r| r.lag)
}

/// Polls until what `leader` reports of `id` satisfies `ok` (at most [`WAIT`]).
async fn until_heard(
    leader: &MetaNode,
    id: NodeId,
    what: &str,
    ok: impl Fn(Option<u64>) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !ok(heard(leader, id)) {
        if Instant::now() > deadline {
            bail!("{what}: {:?}", leader.status().replication);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reports_how_long_ago_it_heard_each_member() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let follower = if l.id() == 1 { 2 } else { 1 };
    // Heartbeats every 100 ms: well within the election timeout. Polled rather than read once,
    // as one heartbeat may come late on a loaded machine.
    let recent = |h: Option<u64>| h.is_some_and(|ms| ms < 700);
    until_heard(
        &l,
        follower,
        "the leader never heard its follower recently",
        recent,
    )
    .await?;
    // The leader may not have heard the follower acknowledge the cluster's first entries yet
    // (a loaded machine): stop it once the leader counts it as holding the whole log, or it
    // stays behind for good.
    let deadline = Instant::now() + WAIT;
    while lag_of(&l, follower) != Some(0) {
        if Instant::now() > deadline {
            bail!("the follower never caught up: {:?}", l.status().replication);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.stop(follower).await?;
    let silent = |h: Option<u64>| h.is_some_and(|ms| ms >= 1_500);
    until_heard(
        &l,
        follower,
        "a stopped member still counts as heard",
        silent,
    )
    .await?;
    let lag = lag_of(&l, follower);
    anyhow::ensure!(lag == Some(0), "nothing written, no lag: {lag:?}");
    c.shutdown().await
}
