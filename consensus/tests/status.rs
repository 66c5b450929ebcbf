//! What a node reports about its peers: the leader tells how long ago it heard each member, a
//! figure that grows while a member is down even when nothing is written (the lag does not),
//! and a new leader reports a member it never heard from as silent since it took office.

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::{Cluster, WAIT};
use meta_consensus::{MetaNode, NodeId, ReplicationLag};
use openraft::async_runtime::watch::WatchReceiver as _;

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

/// A leader reports itself heard at every moment, also as a single voter with nothing written
/// (its own record would otherwise grow from its election on, and a "member down" alert on the
/// figure would fire on every idle single-node cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_reports_itself_heard_also_as_the_only_voter() -> Result<()> {
    let c = Cluster::voters(1).await?;
    let l = c.leader().await?;
    // Time passes with nothing written, as on an idle cluster.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let own = heard(replication(&l, l.id()));
    ensure!(
        own == Some(0),
        "the only voter reports itself heard {own:?} ms ago"
    );
    c.shutdown().await
}

/// A member that is down when leadership changes hands is still reported silent by the new
/// leader, which never heard from it: from when it took office, growing (a "member down"
/// alert on that figure must not clear because the leader changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_reports_a_member_it_never_heard_from_as_silent() -> Result<()> {
    let mut c = Cluster::three().await?;
    let old = c.leader().await?;
    c.converged().await?;
    let down = (1..=3).find(|i| *i != old.id()).context("a follower")?;
    c.stop(down).await?;
    let mut new = None;
    let mut metrics = old.raft().metrics();
    for _ in 0..100 {
        new = old.hand_over_leadership(Duration::from_secs(5)).await?;
        if new.is_some() {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
    let new = c.node(new.context("no voter took over")?).clone();
    let heard = |n: &MetaNode| {
        n.status()
            .replication
            .iter()
            .find(|r| r.node == down)
            .and_then(|r| r.heard_ms)
    };
    let deadline = std::time::Instant::now() + WAIT;
    let first = loop {
        if let Some(ms) = heard(&new) {
            break ms;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the new leader never reported node {down}: {:?}",
            new.status().replication
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    };
    let mut later = first;
    while later <= first {
        ensure!(
            std::time::Instant::now() < deadline,
            "the silence never grew"
        );
        let _ = tokio::time::timeout(Duration::from_millis(20), metrics.changed()).await;
        later = heard(&new).context("the report went away")?;
    }
    c.shutdown().await
}

/// A follower whose leader and other voter stopped names no leader once the leader has been
/// silent for two election timeouts: openraft names the last leader until another one is
/// elected, which this follower, without a quorum, waits for in vain. A leader heard from is
/// named again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_left_without_a_quorum_names_no_silent_leader() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let others: Vec<NodeId> = (1..=3).filter(|id| *id != leader).collect();
    let (survivor, other) = (others[0], others[1]);
    let named = |c: &Cluster| c.node(survivor).status().leader_id;
    ensure!(named(&c) == Some(leader), "{:?}", c.node(survivor).status());
    // Polls (at most until the deadline) until the survivor names a leader, or names none.
    let deadline = Instant::now() + WAIT;
    let until_named = |c: &Cluster, some: bool| {
        let status = c.node(survivor).status();
        let done = status.leader_id.is_some() == some;
        async move {
            ensure!(
                done || Instant::now() < deadline,
                "node {survivor} should {} a leader by now: {status:?}",
                if some { "name" } else { "name no" }
            );
            if !done {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(done)
        }
    };
    c.stop(other).await?;
    c.stop(leader).await?;
    while !until_named(&c, false).await? {}
    // With a quorum again, it names the leader elected then.
    c.start(other).await?;
    while !until_named(&c, true).await? {}
    c.shutdown().await
}

/// A restarted follower's saved vote names the leader of its last run, which openraft names at
/// once; that leader may be down now. The follower names it only once it hears from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_names_its_last_leader_only_once_it_hears_from_it() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let follower = (1..=3).find(|id| *id != leader).context("a follower")?;
    ensure!(c.node(follower).status().leader_id == Some(leader));
    // Cut from the leader only: the other voter keeps hearing the leader and votes for nobody
    // else, so the follower's saved vote stays the one it restarts with.
    c.router.cut(leader, follower);
    c.stop(follower).await?;
    let node = c.start(follower).await?;
    let saved = || node.raft().server_metrics().borrow_watched().current_leader;
    ensure!(
        saved() == Some(leader),
        "openraft names no leader after the restart: the test shows nothing"
    );
    let status = node.status();
    // Openraft still named it after the status was taken: it named it all along.
    if saved() == Some(leader) {
        ensure!(status.leader_id.is_none(), "{status:?}");
    }
    c.router.heal(leader, follower);
    let deadline = Instant::now() + WAIT;
    while node.status().leader_id != Some(leader) {
        ensure!(
            Instant::now() < deadline,
            "node {follower} never named its leader again: {:?}",
            node.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.shutdown().await
}
