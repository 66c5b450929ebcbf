//! A write whose answer is lost after it was submitted is reported as such: the client learns
//! that it may still commit, not that nothing was done.

mod common;

use std::time::Duration;

use anyhow::{bail, Result};
use common::{Cluster, WAIT};
use meta_consensus::{Command, Error};

/// The leader is cut off from both followers with a write appended to its log but not
/// committed, and then stops: the write may have reached a follower, which the next leader
/// would commit, so its answer is `OutcomeUnknown` (504), not `Shutdown` (503: "nothing was
/// done, send it again as it is").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_under_way_when_the_leader_stops_has_an_unknown_outcome() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    let id = leader.id();
    // A committed write first: the leader's lease is fresh, so the next one is proposed at once.
    leader
        .write(Command::Put {
            key: "before".into(),
            value: vec![1],
            if_revision: None,
        })
        .await?;
    let appended = leader.status().last_log_index;
    c.router.isolate(id);
    let write = {
        let leader = leader.clone();
        tokio::spawn(async move {
            leader
                .write(Command::Put {
                    key: "lost".into(),
                    value: vec![2],
                    if_revision: None,
                })
                .await
        })
    };
    // Proposed: it is in the leader's log (and can go no further).
    let deadline = tokio::time::Instant::now() + WAIT;
    while leader.status().last_log_index <= appended {
        if write.is_finished() {
            bail!("the write ended before it was appended: {:?}", write.await?);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the write was never appended: {:?}", leader.status());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.stop(id).await?;
    let answer = tokio::time::timeout(WAIT, write).await??;
    match answer {
        Err(Error::OutcomeUnknown(_)) => {}
        other => bail!("expected an unknown outcome, got {other:?}"),
    }
    c.shutdown().await
}
