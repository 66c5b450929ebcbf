//! A write whose caller gave up still runs to its end. The admission window
//! (`max_pending_shards`) counts every write openraft has not answered, also one whose caller
//! gave up: a write that timed out is still in flight, and letting its room go let retries pile
//! unbounded work onto an overloaded leader, exactly when the window matters. And a datanode's
//! registration that commits after its caller gave up gives the new incarnation its grace
//! (`unknown`, not `down`, for a timeout), as one answered in time does.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Command, DatanodeState, Error, MetaNode, Node};
use meta_store::fs::FaultyFileSystem;

/// Waits until no write holds room in `node`'s admission window: openraft answered them all.
async fn window_empties(node: &MetaNode, what: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    while node.pending_shards() != 0 {
        ensure!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_timed_out_keeps_its_room_until_openraft_answers_it() -> Result<()> {
    let disk = FaultyFileSystem::new();
    let mut c = Cluster::new()?;
    c.tune = |cfg| {
        cfg.request_timeout = Duration::from_millis(500);
    };
    c.wal_fs.insert(1, Arc::new(disk.clone()));
    let node = c.start(1).await?;
    node.initialize([(1, Node::new(addr(1)))].into()).await?;
    c.leader().await?;

    // No sync completes: the write cannot commit, and its caller gives up.
    disk.gate().close();
    let put = Command::Put {
        key: "k".into(),
        value: vec![1],
        if_revision: None,
    };
    let answer = node.write(put).await;
    let held = node.pending_shards();
    // Syncs complete again before any check can fail: a sync held at the gate would keep the
    // runtime from ending.
    disk.gate().release();
    ensure!(
        matches!(answer, Err(Error::Timeout)),
        "a write that cannot commit answered {answer:?}"
    );
    ensure!(
        held == 1,
        "the write that timed out held {held} shards of the window, not 1"
    );

    // Once it commits, openraft answers it and its room is free again.
    window_empties(&node, "the committed write still holds its room").await?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_commits_after_its_caller_gave_up_gets_its_grace() -> Result<()> {
    // Long enough that the check below, which follows the registration's commit at once,
    // comes well within the grace even on a starved machine.
    const TIMEOUT: Duration = Duration::from_secs(8);
    let disk = FaultyFileSystem::new();
    let mut c = Cluster::new()?;
    c.tune = |cfg| {
        cfg.request_timeout = Duration::from_millis(500);
        cfg.datanode_timeout = TIMEOUT;
    };
    c.wal_fs.insert(1, Arc::new(disk.clone()));
    let node = c.start(1).await?;
    node.initialize([(1, Node::new(addr(1)))].into()).await?;
    c.leader().await?;

    // The leader has collected heartbeats for a whole timeout: a datanode it has no record of
    // is `down`.
    let deadline = std::time::Instant::now() + TIMEOUT + WAIT;
    while node.liveness().await?.collecting < TIMEOUT {
        ensure!(
            std::time::Instant::now() < deadline,
            "the leader never collected heartbeats for a timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // No sync completes: the registration cannot commit, and its caller gives up.
    disk.gate().close();
    let answer = node.register_datanode(7, "10.0.0.7:7000").await;
    disk.gate().release();
    ensure!(
        matches!(answer, Err(Error::Timeout)),
        "a registration that cannot commit answered {answer:?}"
    );

    // Once openraft answers it (its room in the window is free again: the answer came after
    // the registration was applied), the new incarnation is `unknown` for a timeout, not
    // `down`.
    window_empties(&node, "the registration was never answered").await?;
    let report = node.liveness().await?;
    let (_, liveness) = report
        .datanodes
        .iter()
        .find(|(d, _)| d.id == 7)
        .context("the registration never committed")?;
    ensure!(
        liveness.state == DatanodeState::Unknown,
        "a datanode registered a moment ago is {:?}",
        liveness.state
    );
    c.shutdown().await
}
