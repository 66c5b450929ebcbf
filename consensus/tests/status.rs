//! What a node reports about its peers: the leader tells how long ago it heard each member, a
//! figure that grows while a member is down even when nothing is written (the lag does not).

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::{Cluster, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reports_how_long_ago_it_heard_each_member() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let follower = if l.id() == 1 { 2 } else { 1 };
    let heard = |id| {
        l.status()
            .replication
            .iter()
            .find(|r| r.node == id)
            .and_then(|r| r.heard_ms)
    };
    let fresh = heard(follower).context("the leader heard its follower")?;
    // Heartbeats every 100 ms: well within the election timeout.
    anyhow::ensure!(fresh < 700, "heard {fresh} ms ago");
    c.stop(follower).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        if heard(follower).is_some_and(|ms| ms >= 1_500) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "a stopped member still counts as heard: {:?}",
                l.status().replication
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lag = l
        .status()
        .replication
        .iter()
        .find(|r| r.node == follower)
        .map(|r| r.lag);
    anyhow::ensure!(lag == Some(0), "nothing written, no lag: {lag:?}");
    c.shutdown().await
}
