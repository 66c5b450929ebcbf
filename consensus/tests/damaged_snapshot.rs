//! A leader whose newest snapshot file rotted on disk (a flipped payload byte, which only a read
//! of the whole file finds) builds a new one once it is asked for it, so that a member that
//! needs a snapshot gets one it accepts instead of the damaged file for ever.

mod common;

use std::io::{Seek, SeekFrom, Write};

use anyhow::{ensure, Context, Result};
use common::{addr, Cluster};
use meta_consensus::{Command, Consistency, MetaNode, Node};

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: key.as_bytes().to_vec(),
        if_revision: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_replaced_before_a_new_member_needs_it() -> Result<()> {
    let mut c = Cluster::three_tuned(|cfg| cfg.max_in_snapshot_log_to_keep = 0).await?;
    let l = c.leader().await?;
    for i in 0..200 {
        l.write(put(&format!("k/{i:03}"))).await?;
    }
    // The leader's log is purged up to its snapshot: a new member can only start from it.
    let snapshot = l.snapshot_now().await?;
    flip_a_payload_byte(&c.dir(l.id()))?;

    joins(&mut c, &l, 4, snapshot.index).await?;
    // The rebuilt file was read whole when it was first sent; it rots too. A member that
    // needs a snapshot a moment later still gets a sound one: a file asked for again is read
    // again (at most once a second).
    flip_a_payload_byte(&c.dir(l.id()))?;
    joins(&mut c, &l, 5, snapshot.index).await?;
    c.converged().await?;
    // A snapshot asked for with nothing applied since is not the damaged file handed back.
    flip_a_payload_byte(&c.dir(l.id()))?;
    l.snapshot_now().await?;
    let newest = newest_snapshot(&c.dir(l.id()))?;
    meta_store::SnapshotReader::open(&newest).context("the snapshot asked for is damaged")?;
    c.shutdown().await
}

/// Starts node `id`, adds it as a learner through `leader`, and waits until it installed a
/// snapshot up to `index`, holding the first and last keys written.
async fn joins(c: &mut Cluster, leader: &MetaNode, id: u64, index: u64) -> Result<()> {
    let learner = c.start(id).await?;
    leader.add_learner(id, Node::new(addr(id))).await?;
    learner
        .wait_applied(index, common::WAIT)
        .await
        .with_context(|| format!("new member {id} never installed a snapshot"))?;
    for key in ["k/000", "k/199"] {
        learner
            .kv_get(Consistency::Local, key)
            .await?
            .with_context(|| format!("{key} missing on new member {id}"))?;
    }
    Ok(())
}

/// The newest snapshot file in the data dir `dir`.
fn newest_snapshot(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    common::newest_file(&dir.join("snapshots"), "snap")
}

/// Flips a byte in the middle of the payload of the newest snapshot in the data dir `dir`, far
/// from the header and the trailer (which a start checks), as rot on disk would.
fn flip_a_payload_byte(dir: &std::path::Path) -> Result<()> {
    let file = newest_snapshot(dir)?;
    let len = std::fs::metadata(&file)?.len();
    ensure!(len > 1024, "a snapshot of {len} bytes");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)?;
    let at = len / 2;
    let mut byte = [0u8; 1];
    f.seek(SeekFrom::Start(at))?;
    std::io::Read::read_exact(&mut f, &mut byte)?;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(&[byte[0] ^ 0x40])?;
    f.sync_all()?;
    Ok(())
}

/// A member whose newest snapshot file was lost, leaving an older one that ends before its
/// log's purge point, builds a new one when it starts: openraft refuses to start from that
/// state (a debug build panics), and a release build sent the older one, which cannot bring a
/// member that needs a snapshot up to the log, again and again in a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_behind_the_purge_point_is_replaced_at_start() -> Result<()> {
    let mut c = Cluster::three_tuned(|cfg| cfg.max_in_snapshot_log_to_keep = 0).await?;
    let l = c.leader().await?;
    let id = if l.id() == 1 { 2 } else { 1 };
    let node = c.node(id).clone();
    let mut ends = Vec::new();
    for round in 0..2 {
        for i in 0..20 {
            let w = l.write(put(&format!("r{round}/{i}"))).await?;
            node.wait_applied(w.index, common::WAIT).await?;
        }
        ends.push(node.snapshot_now().await?.index);
    }
    drop(node);
    c.stop(id).await?;
    let newest = c
        .dir(id)
        .join("snapshots")
        .join(format!("snap-{:020}-{:020}.snap", ends[1], 1));
    ensure!(newest.exists(), "no snapshot file {}", newest.display());
    std::fs::remove_file(&newest)?;
    let n = c.start(id).await?;
    let deadline = std::time::Instant::now() + common::WAIT;
    while n.status().snapshot_index.is_none_or(|s| s < ends[1]) {
        ensure!(
            std::time::Instant::now() < deadline,
            "the snapshot stayed at {:?}, behind the purge point {}",
            n.status().snapshot_index,
            ends[1]
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(n);
    c.shutdown().await
}
