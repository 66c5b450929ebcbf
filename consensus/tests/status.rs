//! What a node reports about its peers: the leader tells how long ago it heard each member, a
//! figure that grows while a member is down even when nothing is written (the lag does not).

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use common::{Cluster, WAIT};
use meta_consensus::{MetaNode, NodeId, ReplicationLag};

/// What `leader` reports of member `id`'s replication.
fn replication(leader: &MetaNode, id: NodeId) -> Option<ReplicationLag> {
    leader
        .status()
        .replication
        .into_iter()
        .find(|r| r.node == id)
}

/// Polls until what `leader` reports of `id` satisfies `ok` (at most [`WAIT`]).
async fn until_reported(
    leader: &MetaNode,
    id: NodeId,
    what: &str,
    ok: impl Fn(Option<ReplicationLag>) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !ok(replication(leader, id)) {
        if Instant::now() > deadline {
            bail!("{what}: {:?}", leader.status().replication);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Milliseconds since the leader heard the member, as reported in `r`.
fn heard(r: Option<ReplicationLag>) -> Option<u64> {
    r.and_then(|r| r.heard_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reports_how_long_ago_it_heard_each_member() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let follower = if l.id() == 1 { 2 } else { 1 };
    // Heartbeats every 100 ms: well within the election timeout. Polled rather than read once,
    // as one heartbeat may come late on a loaded machine.
    let recent = |r| heard(r).is_some_and(|ms| ms < 700);
    until_reported(
        &l,
        follower,
        "the leader never heard its follower recently",
        recent,
    )
    .await?;
    // The leader may not have heard the follower acknowledge the cluster's first entries yet
    // (a loaded machine): stop it once the leader counts it as holding the whole log, or it
    // stays behind for good.
    let caught_up = |r: Option<ReplicationLag>| r.is_some_and(|r| r.lag == 0);
    until_reported(&l, follower, "the follower never caught up", caught_up).await?;
    c.stop(follower).await?;
    let silent = |r| heard(r).is_some_and(|ms| ms >= 1_500);
    until_reported(
        &l,
        follower,
        "a stopped member still counts as heard",
        silent,
    )
    .await?;
    let lag = replication(&l, follower).map(|r| r.lag);
    anyhow::ensure!(lag == Some(0), "nothing written, no lag: {lag:?}");
    c.shutdown().await
}
