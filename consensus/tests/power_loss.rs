//! Power loss on every member at once: each node's log goes through a file system that loses
//! the bytes it never synced (keeping a random part of them, the last write possibly torn).
//! Writes run concurrently (and, in one variant, voter changes); then syncs stop completing,
//! appends pile up unsynced, and the power fails; after a restart of the whole cluster every
//! acknowledged write is there, on every member, and the members agree. A write is
//! acknowledged once it is durable on a quorum, so losing what was not synced anywhere loses
//! nothing acknowledged. Each registry is on the real disk and survives whole, as a registry
//! whose writes reached the disk before the log's would: a member may come back with a
//! registry ahead of its log. This found two faults: a leader restored its leadership at
//! startup with a log shorter than the quorum's (and overwrote acknowledged writes), and a
//! member whose registry was ahead of its log and its snapshot could not start. Seeded: a
//! failure names its seed.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Command, Consistency, MetaNode, Node, NodeId, Role};
use meta_store::fs::{CrashPoint, FaultyFileSystem};
use openraft::async_runtime::watch::WatchReceiver;

/// Writers running at once.
const WRITERS: u64 = 8;
/// How long one write or one membership call may take before the caller gives up on it.
const CALL: Duration = Duration::from_secs(5);

/// What runs besides the writes until the power fails.
#[derive(Clone, Copy, Debug)]
struct Variant {
    /// Snapshots built and the log purged every few dozen entries.
    snapshots: bool,
    /// A fourth node, and voter changes one after another, each to three of the four nodes.
    voter_changes: bool,
}

/// A voter change that was asked for, and whether it was acknowledged.
#[derive(Clone, Debug)]
struct VoterChange {
    voters: BTreeSet<NodeId>,
    acked: bool,
}

async fn power_loss(seed: u64, v: Variant) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let ids: Vec<NodeId> = if v.voter_changes {
        vec![1, 2, 3, 4]
    } else {
        vec![1, 2, 3]
    };
    let disks: Vec<FaultyFileSystem> = ids.iter().map(|_| FaultyFileSystem::new()).collect();
    let mut c = Cluster::new()?;
    if v.snapshots {
        // Snapshots and purges all along: the log's oldest records go while it is written.
        c.tune = |cfg| {
            cfg.snapshot_logs_since_last = 30;
            cfg.max_in_snapshot_log_to_keep = 5;
        };
    }
    for (id, disk) in ids.iter().zip(&disks) {
        c.wal_fs.insert(*id, Arc::new(disk.clone()));
    }
    for id in &ids {
        c.start(*id).await?;
    }
    let members = (1..=3).map(|i| (i, Node::new(addr(i)))).collect();
    c.node(1).initialize(members).await?;
    if v.voter_changes {
        c.leader().await?.add_learner(4, Node::new(addr(4))).await?;
    }
    c.converged().await?;

    // Writers put keys through random nodes until told to stop; each reports what was
    // acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let nodes: Vec<_> = c.nodes.values().cloned().collect();
        let stop = stop.clone();
        let mut rng = fastrand::Rng::with_seed(seed * 1000 + w);
        writers.spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let node = &nodes[rng.usize(..nodes.len())];
                let key = format!("w{w}/{n}");
                n += 1;
                let put = Command::Put {
                    key: key.clone(),
                    value: vec![w as u8; rng.usize(1..200)],
                    if_revision: None,
                };
                if let Ok(Ok(_)) = tokio::time::timeout(CALL, node.write(put)).await {
                    acked.push(key);
                }
            }
            acked
        });
    }
    let churn = v.voter_changes.then(|| {
        let nodes: Vec<_> = c.nodes.values().cloned().collect();
        let stop = stop.clone();
        let rng = fastrand::Rng::with_seed(seed * 1000 + 999);
        tokio::spawn(change_voters_until(nodes, stop, rng))
    });

    // Let some writes through, then the power fails everywhere at once.
    let target = rng.u64(20..200);
    let deadline = Instant::now() + WAIT;
    while c.leader().await?.status().committed.unwrap_or(0) < target {
        ensure!(Instant::now() < deadline, "seed {seed}: no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // From here no sync completes: appends pile up unsynced on every disk (and nothing more
    // is acknowledged) until the power fails.
    for disk in &disks {
        disk.gate().close();
    }
    let piled = Instant::now() + CALL;
    while disks.iter().any(|d| d.unsynced_ops() == 0) && Instant::now() < piled {
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
    stop.store(true, Ordering::SeqCst);
    let mut acked = Vec::new();
    while let Some(joined) = writers.join_next().await {
        acked.extend(joined?);
    }
    let changes = match churn {
        Some(task) => task.await?,
        None => Vec::new(),
    };
    // The nodes stop (their logs fail from the crash on; a stop may report that).
    for id in &ids {
        c.router.unregister(*id);
        if let Some(node) = c.nodes.remove(id) {
            let _ = tokio::time::timeout(Duration::from_secs(30), node.shutdown()).await;
        }
    }

    let context = || format!("seed {seed} ({v:?}): crash points {points:?}, changes {changes:?}");
    // Without an acknowledged write there is nothing to lose, and the check below checks nothing.
    ensure!(
        !acked.is_empty(),
        "no write was acknowledged; {}",
        context()
    );
    for id in &ids {
        c.start(*id)
            .await
            .with_context(|| format!("restart node {id}"))
            .with_context(context)?;
    }
    let leader = c.leader().await.with_context(context)?;
    let m = leader.status();
    let members: BTreeSet<NodeId> = m.voters.iter().chain(&m.learners).copied().collect();
    if v.voter_changes {
        check_voters(&leader, &changes).with_context(context)?;
    }
    // Every member applies what the leader has and holds every acknowledged write; the
    // members' registries agree. (A node the membership left out is no longer told anything.)
    let last = m.last_log_index.context("leader has a log")?;
    let mut digests = Vec::new();
    for id in &members {
        let node = c.node(*id);
        node.wait_applied(last, WAIT)
            .await
            .with_context(|| format!("node {id} applying {last}"))
            .with_context(context)?;
        for key in &acked {
            ensure!(
                node.kv_get(Consistency::Local, key).await?.is_some(),
                "node {id} lost the acknowledged {key}; {}",
                context()
            );
        }
        digests.push((*id, node.registry_digest().await?));
    }
    ensure!(
        digests.windows(2).all(|w| w[0].1 == w[1].1),
        "registries differ: {digests:?}; {}",
        context()
    );
    if v.voter_changes {
        // The cluster still takes changes and writes: back to the first three voters.
        set_voters(&c, BTreeSet::from([1, 2, 3]))
            .await
            .with_context(context)?;
        let put = Command::Put {
            key: "after".into(),
            value: vec![1],
            if_revision: None,
        };
        c.leader().await?.write(put).await.with_context(context)?;
    }
    println!(
        "seed {seed} ({v:?}): {} acknowledged writes kept, {} of {} voter changes acknowledged; \
         crash points {points:?}",
        acked.len(),
        changes.iter().filter(|c| c.acked).count(),
        changes.len(),
    );
    c.shutdown().await
}

/// Asks for voter changes, each to three random nodes of four, one after another until `stop`
/// (a node to be a voter is added as a learner first); returns each change asked for.
async fn change_voters_until(
    nodes: Vec<MetaNode>,
    stop: Arc<AtomicBool>,
    mut rng: fastrand::Rng,
) -> Vec<VoterChange> {
    let mut changes = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let Some(leader) = nodes.iter().find(|n| n.status().role == Role::Leader) else {
            tokio::task::yield_now().await;
            continue;
        };
        let left_out = nodes[rng.usize(..nodes.len())].id();
        let voters: BTreeSet<NodeId> = nodes
            .iter()
            .map(|n| n.id())
            .filter(|id| *id != left_out)
            .collect();
        let status = leader.status();
        let mut added = true;
        for id in &voters {
            if !status.voters.contains(id) && !status.learners.contains(id) {
                let add = leader.add_learner(*id, Node::new(addr(*id)));
                added &= matches!(tokio::time::timeout(CALL, add).await, Ok(Ok(())));
            }
        }
        if !added {
            continue;
        }
        let change = tokio::time::timeout(CALL, leader.change_voters(voters.clone())).await;
        // A change that failed may still have been proposed (and take effect, or be left half
        // done): it is recorded as asked for.
        let acked = matches!(change, Ok(Ok(())));
        changes.push(VoterChange { voters, acked });
    }
    changes
}

/// Checks that each voter set of the leader's membership is the last acknowledged change's,
/// or one asked for after it (which may or may not have taken effect), or, with none
/// acknowledged, the first three nodes.
fn check_voters(leader: &MetaNode, changes: &[VoterChange]) -> Result<()> {
    let last_acked = changes.iter().rposition(|c| c.acked);
    let mut allowed: Vec<BTreeSet<NodeId>> = match last_acked {
        Some(i) => changes[i..].iter().map(|c| c.voters.clone()).collect(),
        None => changes.iter().map(|c| c.voters.clone()).collect(),
    };
    if last_acked.is_none() {
        allowed.push(BTreeSet::from([1, 2, 3]));
    }
    let m = leader.raft().metrics().borrow_watched().clone();
    let configs = m.membership_config.membership().get_joint_config().clone();
    for config in &configs {
        ensure!(
            allowed.contains(config),
            "the voters {config:?} (of {configs:?}) are neither the last acknowledged change's \
             nor a later one's: allowed {allowed:?}"
        );
    }
    Ok(())
}

/// Makes `voters` the voters, adding any that is no member as a learner first; retries while
/// the new voters catch up.
async fn set_voters(c: &Cluster, voters: BTreeSet<NodeId>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let leader = c.leader().await?;
        let status = leader.status();
        let mut result = Ok(());
        for id in &voters {
            if result.is_ok() && !status.voters.contains(id) && !status.learners.contains(id) {
                result = leader.add_learner(*id, Node::new(addr(*id))).await;
            }
        }
        if result.is_ok() {
            result = leader.change_voters(voters.clone()).await;
        }
        match result {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("setting the voters {voters:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Seeds from `first`: 6 of them, or `POWER_LOSS_SEEDS=N` for a longer search.
fn seeds(first: u64) -> std::ops::Range<u64> {
    first..first + common::seed_count("POWER_LOSS_SEEDS", 6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_power_loss_of_every_member() -> Result<()> {
    let v = Variant {
        snapshots: false,
        voter_changes: false,
    };
    for seed in seeds(0) {
        power_loss(seed, v).await?;
    }
    Ok(())
}

/// The same with snapshots built and the log purged every few dozen entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_power_loss_amid_snapshots_and_purges() -> Result<()> {
    let v = Variant {
        snapshots: true,
        voter_changes: false,
    };
    for seed in seeds(100) {
        power_loss(seed, v).await?;
    }
    Ok(())
}

/// The same with voter changes running along the writes (and snapshots and purges): after the
/// restart the voters are the last acknowledged change's or a later one's, every member holds
/// every acknowledged write, and the cluster still takes changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_voter_changes_survive_a_power_loss() -> Result<()> {
    let v = Variant {
        snapshots: true,
        voter_changes: true,
    };
    for seed in seeds(200) {
        power_loss(seed, v).await?;
    }
    Ok(())
}
