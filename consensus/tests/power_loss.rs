//! Power loss on every member at once: each node's log goes through a file system that loses
//! the bytes it never synced (keeping a random part of them, the last write possibly torn).
//! Writes run concurrently; then syncs stop completing, appends pile up unsynced, and the power
//! fails; after a restart of the whole cluster every acknowledged write is there, on every
//! member, and the members agree. A write is acknowledged once it is durable on a quorum, so
//! losing what was not synced anywhere loses nothing acknowledged. Each registry is on the real
//! disk and survives whole, as a registry whose writes reached the disk before the log's would:
//! a member may come back with a registry ahead of its log. This found two faults: a leader
//! restored its leadership at startup with a log shorter than the quorum's (and overwrote
//! acknowledged writes), and a member whose registry was ahead of its log and its snapshot
//! could not start. Seeded: a failure names its seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Command, Consistency, Node};
use meta_store::fs::{CrashPoint, FaultyFileSystem};

/// Writers running at once.
const WRITERS: u64 = 8;

async fn power_loss(seed: u64, snapshots: bool) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let disks: Vec<FaultyFileSystem> = (0..3).map(|_| FaultyFileSystem::new()).collect();
    let mut c = Cluster::new()?;
    if snapshots {
        // Snapshots and purges all along: the log's oldest records go while it is written.
        c.tune = |cfg| {
            cfg.snapshot_logs_since_last = 30;
            cfg.max_in_snapshot_log_to_keep = 5;
        };
    }
    for (i, disk) in disks.iter().enumerate() {
        c.wal_fs.insert(i as u64 + 1, Arc::new(disk.clone()));
    }
    for id in 1..=3 {
        c.start(id).await?;
    }
    let members = (1..=3).map(|i| (i, Node::new(addr(i)))).collect();
    c.node(1).initialize(members).await?;
    c.converged().await?;

    // Writers put keys through random members until told to stop; each reports what was
    // acknowledged.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let nodes: Vec<_> = c.nodes.values().cloned().collect();
        let stop = stop.clone();
        let mut rng = fastrand::Rng::with_seed(seed * 1000 + w);
        writers.spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let node = &nodes[rng.usize(..nodes.len())];
                let key = format!("w{w}/{n}");
                n += 1;
                let put = Command::Put {
                    key: key.clone(),
                    value: vec![w as u8; rng.usize(1..200)],
                    if_revision: None,
                };
                let written = tokio::time::timeout(Duration::from_secs(5), node.write(put)).await;
                if let Ok(Ok(_)) = written {
                    acked.push(key);
                }
            }
            acked
        });
    }
    // Let some writes through, then the power fails everywhere at once.
    let target = rng.u64(20..200);
    let deadline = std::time::Instant::now() + WAIT;
    while c.leader().await?.status().committed.unwrap_or(0) < target {
        ensure!(
            std::time::Instant::now() < deadline,
            "seed {seed}: no progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // From here no sync completes: appends pile up unsynced on every disk (and nothing more
    // is acknowledged) until the power fails.
    for disk in &disks {
        disk.gate().close();
    }
    let piled = std::time::Instant::now() + Duration::from_secs(5);
    while disks.iter().any(|d| d.unsynced_ops() == 0) && std::time::Instant::now() < piled {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut points = Vec::new();
    for disk in &disks {
        let unsynced = disk.unsynced_ops();
        let point = CrashPoint {
            persist_ops: rng.usize(0..=unsynced),
            torn_bytes: rng.usize(0..200),
        };
        disk.crash(point);
        points.push((point, unsynced));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut acked = Vec::new();
    while let Some(joined) = writers.join_next().await {
        acked.extend(joined?);
    }
    // The members stop (their logs fail from the crash on; a stop may report that).
    for id in 1..=3 {
        c.router.unregister(id);
        if let Some(node) = c.nodes.remove(&id) {
            let _ = tokio::time::timeout(Duration::from_secs(30), node.shutdown()).await;
        }
    }

    for id in 1..=3 {
        c.start(id)
            .await
            .with_context(|| format!("seed {seed}: restart node {id} after {points:?}"))?;
    }
    c.converged()
        .await
        .with_context(|| format!("seed {seed}: after {points:?}"))?;
    for (id, node) in &c.nodes {
        for key in &acked {
            ensure!(
                node.kv_get(Consistency::Local, key).await?.is_some(),
                "seed {seed}: node {id} lost the acknowledged {key} (crash points {points:?})"
            );
        }
    }
    println!(
        "seed {seed}: {} acknowledged writes kept; crash points {points:?}",
        acked.len()
    );
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_power_loss_of_every_member() -> Result<()> {
    for seed in 0..6 {
        power_loss(seed, false).await?;
    }
    Ok(())
}

/// The same with snapshots built and the log purged every few dozen entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_power_loss_amid_snapshots_and_purges() -> Result<()> {
    for seed in 100..106 {
        power_loss(seed, true).await?;
    }
    Ok(())
}
