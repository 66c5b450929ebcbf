//! A member whose log lost its oldest segment (deleted or lost, never purged) starts when its
//! registry or newest snapshot holds the entries before the log's first one: it purges the log
//! up to them, and holds every acknowledged write. When nothing holds them, the start is
//! refused naming the log dir, and the log is left as it was.

mod common;

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use common::Cluster;
use meta_consensus::{Command, Consistency, MetaNode, NodeConfig};

const KEYS: usize = 60;

fn small_segments(cfg: &mut NodeConfig) {
    cfg.wal_segment_bytes = 4096;
    // A snapshot leaves the log unpurged, so that its segments stay from the first.
    cfg.max_in_snapshot_log_to_keep = 1_000_000;
}

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        // Large enough that a few dozen writes span several segments.
        value: vec![b'v'; 400],
        if_revision: None,
    }
}

/// As [`small_segments`], but a snapshot purges the log up to 10 entries before it: the
/// record of that purge lies in a later segment than the oldest one left.
fn small_segments_purged(cfg: &mut NodeConfig) {
    cfg.wal_segment_bytes = 4096;
    cfg.max_in_snapshot_log_to_keep = 10;
}

/// A converged three-voter cluster with small log segments that took [`KEYS`] writes, and a
/// follower of it (built a snapshot half way, if `snapshot`), stopped; its log is never purged.
async fn stopped_follower(snapshot: bool) -> Result<(Cluster, u64)> {
    let (c, id, purged) = stopped_follower_tuned(small_segments, snapshot).await?;
    ensure!(purged.is_none(), "the follower's log was purged");
    Ok((c, id))
}

/// As [`stopped_follower`], tuned by `tune`; also answers the follower's purge point.
async fn stopped_follower_tuned(
    tune: fn(&mut NodeConfig),
    snapshot: bool,
) -> Result<(Cluster, u64, Option<u64>)> {
    let mut c = Cluster::three_tuned(tune).await?;
    let l = c.leader().await?;
    for i in 0..KEYS / 2 {
        l.write(put(&format!("k/{i}"))).await?;
    }
    let id = if l.id() == 1 { 2 } else { 1 };
    c.converged().await?;
    if snapshot {
        c.node(id).snapshot_now().await?;
    }
    for i in KEYS / 2..KEYS {
        l.write(put(&format!("k/{i}"))).await?;
    }
    c.converged().await?;
    let purged = c.node(id).status().purged;
    c.stop(id).await?;
    Ok((c, id, purged))
}

/// The segments of the log in `wal`, oldest first.
fn segments(wal: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(wal)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|x| x == "wal"));
    files.sort();
    Ok(files)
}

/// A converged three-voter cluster tuned by `tune` that took [`KEYS`] writes, and its leader.
async fn written(tune: fn(&mut NodeConfig)) -> Result<(Cluster, MetaNode)> {
    let c = Cluster::three_tuned(tune).await?;
    let l = c.leader().await?;
    for i in 0..KEYS {
        l.write(put(&format!("k/{i}"))).await?;
    }
    c.converged().await?;
    Ok((c, l))
}

/// Takes the oldest segment of node `id`'s log away, and answers where it went.
fn lose_oldest_segment(c: &Cluster, id: u64) -> Result<(PathBuf, PathBuf)> {
    let wal = c.dir(id).join("wal");
    let all = segments(&wal)?;
    ensure!(all.len() >= 3, "the log spans {} segments only", all.len());
    let aside = c.dir(id).with_extension("oldest-segment");
    std::fs::rename(&all[0], &aside)?;
    Ok((all[0].clone(), aside))
}

/// Starts node `id`, which must come back whole: purged past its lost front, holding every
/// key, taking the cluster's next writes, and opening as usual after that.
async fn starts_whole(mut c: Cluster, id: u64) -> Result<()> {
    let n = c.start(id).await?;
    ensure!(
        n.status().purged.is_some(),
        "the log was not purged over its lost front"
    );
    common::holds_keys(&n, KEYS).await?;
    let l = c.leader().await?;
    l.write(put("after")).await?;
    c.converged().await?;
    drop((n, l));
    c.stop(id).await?;
    let n = c.start(id).await?;
    common::holds_keys(&n, KEYS).await?;
    n.kv_get(Consistency::Local, "after")
        .await?
        .context("the write after the restart was lost")?;
    c.converged().await?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_registry_covers_its_lost_oldest_segment_starts() -> Result<()> {
    let (c, id) = stopped_follower(false).await?;
    lose_oldest_segment(&c, id)?;
    starts_whole(c, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_snapshot_covers_its_lost_oldest_segment_starts() -> Result<()> {
    let (c, id) = stopped_follower(true).await?;
    lose_oldest_segment(&c, id)?;
    // Only the snapshot holds the lost entries.
    std::fs::remove_dir_all(c.dir(id).join("registry"))?;
    starts_whole(c, id).await
}

/// The oldest segment left after a purge is lost: the log begins past its purge point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_log_lost_its_oldest_segment_after_a_purge_starts() -> Result<()> {
    let (c, id, purged) = stopped_follower_tuned(small_segments_purged, true).await?;
    ensure!(purged.is_some(), "the follower's log was not purged");
    lose_oldest_segment(&c, id)?;
    starts_whole(c, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_oldest_segment_that_nothing_covers_refuses_the_start() -> Result<()> {
    let (mut c, id) = stopped_follower(false).await?;
    let (oldest, aside) = lose_oldest_segment(&c, id)?;
    std::fs::remove_dir_all(c.dir(id).join("registry"))?;
    let wal = c.dir(id).join("wal");
    let contents = |wal: &Path| -> Result<Vec<(PathBuf, Vec<u8>)>> {
        segments(wal)?
            .into_iter()
            .map(|p| Ok((p.clone(), std::fs::read(&p)?)))
            .collect()
    };
    let before = contents(&wal)?;
    let refused = c
        .start_refused(id, "a member that lost entries nothing else holds")
        .await?;
    ensure!(
        refused.contains(&wal.display().to_string())
            && refused.contains("lacks entries 0 to")
            && refused.contains("oldest segment"),
        "the refusal names the log and why: {refused}"
    );
    ensure!(
        contents(&wal)? == before,
        "the refused start changed the log's segments"
    );
    // With the segment back, the member replays its log into a new registry.
    std::fs::rename(&aside, &oldest)?;
    let n = c.start(id).await?;
    c.converged().await?;
    common::holds_keys(&n, KEYS).await?;
    drop(n);
    c.shutdown().await
}

/// The oldest segment held the follower's vote (written when it first heard of the leader's
/// term, and not again while the term stays): the member comes back with that vote, restored
/// from its newest entry, not with none (with none it could vote twice in a term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lost_oldest_segment_held_its_vote_gets_it_back() -> Result<()> {
    let (mut c, l) = written(small_segments).await?;
    let id = if l.id() == 1 { 2 } else { 1 };
    let term = c.node(id).status().term;
    drop(l);
    c.stop(id).await?;
    lose_oldest_segment(&c, id)?;
    // Cut off until it was looked at: the leader's first message would give it a vote again.
    let others: Vec<u64> = c.nodes.keys().copied().collect();
    for other in &others {
        c.router.cut(id, *other);
    }
    let n = c.start(id).await?;
    ensure!(
        n.status().term == term,
        "it came back at term {}, not {term}",
        n.status().term
    );
    c.router.heal_all();
    c.converged().await?;
    common::holds_keys(&n, KEYS).await?;
    drop(n);
    c.shutdown().await
}

/// Every member lost its oldest segment, and with it its vote: they all come back with their
/// votes restored, elect a leader and hold every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_members_all_lost_their_oldest_segment_elects_a_leader() -> Result<()> {
    let (mut c, l) = written(small_segments).await?;
    drop(l);
    for id in 1..=3 {
        c.stop(id).await?;
    }
    for id in 1..=3 {
        lose_oldest_segment(&c, id)?;
    }
    for id in 1..=3 {
        c.start(id).await?;
    }
    let l = c.leader().await?;
    l.write(put("after")).await?;
    c.converged().await?;
    for n in c.nodes.values() {
        common::holds_keys(n, KEYS).await?;
    }
    drop(l);
    c.shutdown().await
}
