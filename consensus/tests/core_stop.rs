//! A node whose Raft core stopped (here: its log failed a sync, which the log never retries)
//! answers every later call with an error, also while callers give up on calls in flight.
//! openraft 0.10.0-alpha.37 records why its core stopped in a step that a call which found
//! the core stopped runs for everyone; a caller cancelled in that step (a timeout, a dropped
//! request) left it half done, and every later call panicked ("RaftCore should have already
//! quit"), the node's shutdown included.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use common::{addr, Cluster};
use meta_consensus::{Command, Consistency, Node};
use meta_store::fs::FaultyFileSystem;

fn put(key: String) -> Command {
    Command::Put {
        key,
        value: vec![7; 16],
        if_revision: None,
    }
}

/// A single-node cluster, initialized and leading, whose log is on a disk that can be made to
/// fail.
async fn single_node_on_a_faulty_disk(
) -> Result<(FaultyFileSystem, Cluster, meta_consensus::MetaNode)> {
    let disk = FaultyFileSystem::new();
    let mut c = Cluster::new()?;
    c.wal_fs.insert(1, Arc::new(disk.clone()));
    let node = c.start(1).await?;
    node.initialize([(1, Node::new(addr(1)))].into()).await?;
    c.leader().await?;
    Ok((disk, c, node))
}

/// One single-node cluster whose log fails while callers keep writing and reading, each giving
/// up after a random short time; afterwards no caller panicked and the node shuts down.
async fn core_stops_under_impatient_callers(seed: u64) -> Result<()> {
    let (disk, c, node) = single_node_on_a_faulty_disk().await?;

    let mut callers = tokio::task::JoinSet::new();
    for w in 0..16u64 {
        let node = node.clone();
        let mut rng = fastrand::Rng::with_seed(seed * 100 + w);
        callers.spawn(async move {
            // Until the node answers that it stopped (the core is gone for good then), for at
            // most `WAIT`; answers whether it did.
            let deadline = std::time::Instant::now() + common::WAIT;
            let mut n = 0u64;
            while std::time::Instant::now() < deadline {
                n += 1;
                let patience = Duration::from_micros(rng.u64(50..5_000));
                let answer = if rng.bool() {
                    tokio::time::timeout(patience, node.write(put(format!("{w}/{n}"))))
                        .await
                        .map(|r| r.map(|_| ()))
                } else {
                    tokio::time::timeout(patience, node.kv_get(Consistency::Linearizable, "k"))
                        .await
                        .map(|r| r.map(|_| ()))
                };
                if let Ok(Err(meta_consensus::Error::Stopped(_))) = answer {
                    return true;
                }
            }
            false
        });
    }
    // Some writes go through first; then every sync fails, and the core stops.
    let deadline = std::time::Instant::now() + common::WAIT;
    while node.status().committed.unwrap_or(0) < 50 {
        ensure!(
            std::time::Instant::now() < deadline,
            "seed {seed}: no progress"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    disk.set_fail_syncs(true);
    while let Some(joined) = callers.join_next().await {
        match joined {
            Ok(true) => {}
            Ok(false) => anyhow::bail!("seed {seed}: a caller never heard that the node stopped"),
            Err(e) => anyhow::bail!("seed {seed}: a caller failed: {e}"),
        }
    }
    // The node shuts down without a panic.
    c.router.unregister(1);
    let stopping = tokio::spawn(async move { node.shutdown().await });
    match tokio::time::timeout(Duration::from_secs(30), stopping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => anyhow::bail!("seed {seed}: the shutdown failed: {e}"),
        Err(_) => anyhow::bail!("seed {seed}: the shutdown hung"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_core_answers_errors_while_callers_give_up() -> Result<()> {
    let seeds = common::seed_count("CORE_STOP_SEEDS", 300);
    for seed in 0..seeds {
        core_stops_under_impatient_callers(seed).await?;
    }
    Ok(())
}

/// A shutdown whose caller gives up at once still closes the node: its data dir's lock is
/// released while a handle to the node is still held. Before, the steps after the caller's
/// first wait never ran, and the lock stayed until the last handle was dropped.
// One thread: the shutdown's first poll ends at its first wait, before any task it started ran.
#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_whose_caller_gives_up_still_closes_the_node() -> Result<()> {
    let mut c = Cluster::new()?;
    let node = c.start(1).await?;
    node.initialize([(1, Node::new(addr(1)))].into()).await?;
    c.leader().await?;
    c.router.unregister(1);
    c.nodes.remove(&1);
    let held = node.clone();
    // Polled once, then given up.
    let _ = futures::FutureExt::now_or_never(node.shutdown());
    drop(node);

    let lock = std::fs::File::open(c.dir(1).join("LOCK"))?;
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {
                ensure!(
                    std::time::Instant::now() < deadline,
                    "the data dir is still locked by a node whose shutdown was given up"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
    drop(held);
    Ok(())
}

/// A node whose core stopped after a failure names it in every answer (before, every request
/// was answered "shut down", and only the log said why); once shut down, it says that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_names_the_failure_in_its_answers() -> Result<()> {
    let (disk, c, node) = single_node_on_a_faulty_disk().await?;
    node.write(put("before".into())).await?;
    disk.set_fail_syncs(true);
    let failed = node.write(put("failing".into())).await;
    ensure!(
        failed.is_err(),
        "a write whose sync failed was acknowledged"
    );
    for answer in [
        node.write(put("after".into())).await.map(drop),
        node.kv_get(Consistency::Linearizable, "before")
            .await
            .map(drop),
    ] {
        match answer {
            Err(meta_consensus::Error::Stopped(why)) => {
                ensure!(
                    why.contains("sync"),
                    "the answer does not name the failure: {why}"
                )
            }
            other => anyhow::bail!("answered {other:?}"),
        }
    }
    c.router.unregister(1);
    // Its close reports the poisoned log.
    ensure!(node.shutdown().await.is_err(), "the close hid the failure");
    match node.write(put("shut".into())).await {
        Err(meta_consensus::Error::Shutdown) => Ok(()),
        other => anyhow::bail!("answered {other:?} once shut down"),
    }
}
