//! The admission window (`max_pending_shards`) and a new datanode's grace, also for writes whose
//! caller gave up, which still run to their end. The window queues writes and loses none, one
//! bigger than the window included, and counts every write openraft has not answered, also one
//! whose caller gave up: a write that timed out is still in flight, and letting its room go let
//! retries pile unbounded work onto an overloaded leader, exactly when the window matters. A
//! datanode just registered is `unknown`, not `down`, for a timeout (its grace), also when its
//! registration commits after its caller gave up.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{addr, shard, Cluster, WAIT};
use meta_consensus::{Command, CommandResult, DatanodeState, Error, MetaNode, Node};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_window_queues_writes_and_loses_none() -> Result<()> {
    // A window smaller than one command: a big command is clamped to the window (it runs
    // alone) instead of waiting forever, and every queued write completes.
    let c = Cluster::three_tuned(|cfg| cfg.max_pending_shards = 3).await?;
    let leader = c.leader().await?;
    let w = leader.register_datanode(1, "dn-1").await?;
    let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
        anyhow::bail!("unexpected {:?}", w.result);
    };
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..16u64 {
        let node = leader.clone();
        let n = if i % 2 == 0 { 5 } else { 1 };
        let shards = (0..n).map(|j| shard(i * 100 + j, 1)).collect();
        writes.spawn(async move { node.register_shards(1, epoch, shards).await });
    }
    let mut accepted = 0;
    while let Some(joined) = writes.join_next().await {
        match joined??.result {
            CommandResult::ShardsRegistered { accepted: a, .. } => accepted += a,
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert_eq!(accepted, 8 * 5 + 8);
    assert_eq!(leader.status().replicas, 48);
    c.shutdown().await
}

/// A datanode that registers with a leader that has collected heartbeats for longer than the
/// timeout is `unknown` until it has had a timeout to send its first heartbeat, not `down`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datanode_just_registered_is_not_reported_down() -> Result<()> {
    // Long enough that the read right after the registration falls within the grace even on
    // a loaded machine.
    const TIMEOUT: Duration = Duration::from_secs(3);
    let c = Cluster::three_tuned(|cfg| cfg.datanode_timeout = TIMEOUT).await?;
    let leader = c.leader().await?;
    let deadline = std::time::Instant::now() + WAIT;
    while leader.liveness().await?.collecting < TIMEOUT {
        ensure!(
            std::time::Instant::now() < deadline,
            "never collected a timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A machine so loaded that the registration and the read take a timeout tells nothing:
    // then another datanode tries again.
    for id in 9.. {
        let started = std::time::Instant::now();
        leader.register_datanode(id, format!("dn-{id}")).await?;
        let report = leader.liveness().await?;
        if started.elapsed() >= TIMEOUT {
            ensure!(
                std::time::Instant::now() < deadline,
                "never registered and read within a timeout"
            );
            continue;
        }
        let (_, state) = report
            .datanodes
            .iter()
            .find(|(d, _)| d.id == id)
            .context("the datanode is listed")?;
        ensure!(
            state.state == meta_consensus::DatanodeState::Unknown,
            "{state:?}"
        );
        break;
    }
    c.shutdown().await
}

/// A new leader listens for heartbeats from when it takes office, not from the first question
/// put to it: asked a timeout after its election, it calls a datanode that sent none down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_listens_from_its_election() -> Result<()> {
    const TIMEOUT: Duration = Duration::from_millis(800);
    let mut c = Cluster::new()?;
    c.tune = |cfg| cfg.datanode_timeout = TIMEOUT;
    for id in 1..=3 {
        c.start(id).await?;
    }
    c.node(1)
        .initialize((1..=3).map(|i| (i, Node::new(addr(i)))).collect())
        .await?;
    let old = c.leader().await?;
    old.register_datanode(7, "10.0.0.7:7000").await?;
    c.converged().await?;
    let old = old.id();
    c.stop(old).await?;
    let leader = c.leader().await?;
    // Nothing asks the new leader anything until a timeout after it led, and a margin for its
    // metrics task to note that it leads (on a loaded machine). Without the clock started at
    // election, the first question finds it has listened for nothing, however long the wait.
    tokio::time::sleep(TIMEOUT + Duration::from_millis(600)).await;
    let report = leader.liveness().await?;
    ensure!(
        report.collecting >= TIMEOUT,
        "a leader asked a timeout after its election says it collected for {:?}",
        report.collecting
    );
    let (_, liveness) = report
        .datanodes
        .iter()
        .find(|(d, _)| d.id == 7)
        .context("the registration is lost")?;
    ensure!(
        liveness.state == DatanodeState::Down,
        "a datanode that sent no heartbeat to a leader elected a timeout ago is {:?}",
        liveness.state
    );
    c.shutdown().await
}
