//! A registry that failed a write (its trust marker gone), or that was open when the machine
//! went down, is not reopened: the node deletes it and rebuilds it from the newest snapshot and
//! the log, and holds every acknowledged write.

mod common;

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use common::Cluster;
use meta_consensus::{Command, Consistency, MetaNode, NodeConfig};

fn snapshot_friendly(cfg: &mut NodeConfig) {
    cfg.max_in_snapshot_log_to_keep = 0;
}

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: key.as_bytes().to_vec(),
        if_revision: None,
    }
}

/// A cluster whose members each took a snapshot (and purged their logs up to it) between two
/// rounds of writes, converged; a follower, stopped; and the registry digest they share.
async fn stopped_follower_of_a_snapshotted_cluster() -> Result<(Cluster, u64, u64)> {
    let mut c = Cluster::three_tuned(snapshot_friendly).await?;
    let l = c.leader().await?;
    for i in 0..20 {
        l.write(put(&format!("before/{i}"))).await?;
    }
    // Every node builds a snapshot and purges its log up to it.
    for n in c.nodes.values() {
        n.snapshot_now().await?;
    }
    for i in 0..20 {
        l.write(put(&format!("after/{i}"))).await?;
    }
    let (_, digest) = c.converged().await?;
    let id = if l.id() == 1 { 2 } else { 1 };
    ensure!(
        c.dir(id).join("registry").join("OPEN").exists(),
        "a running node's registry is marked open"
    );
    c.stop(id).await?;
    Ok((c, id, digest))
}

/// Starts node `id` again, which must rebuild its registry (a file left in it goes with it),
/// and checks that the rebuilt registry holds what the others do.
async fn rebuilt(mut c: Cluster, id: u64, digest: u64) -> Result<()> {
    // Shows whether the registry was deleted rather than reopened.
    let left_over = c.dir(id).join("registry").join("left-over");
    std::fs::write(&left_over, b"x")?;
    let n = c.start(id).await?;
    ensure!(!left_over.exists(), "the registry was reopened");
    ensure!(
        c.dir(id).join("registry").join("TRUSTED").exists(),
        "the rebuilt registry is trusted"
    );
    c.converged().await?;
    let (_, again) = n.registry_digest().await?;
    ensure!(again == digest, "the rebuilt registry differs");
    for key in ["before/0", "before/19", "after/0", "after/19"] {
        n.kv_get(Consistency::Local, key)
            .await?
            .with_context(|| format!("{key} lost by the rebuild"))?;
    }
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_registry_is_rebuilt_from_the_snapshot_and_the_log() -> Result<()> {
    let (c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    let marker = c.dir(id).join("registry").join("TRUSTED");
    ensure!(
        marker.exists(),
        "a cleanly opened registry is marked trusted"
    );
    std::fs::remove_file(&marker)?;
    rebuilt(c, id, digest).await
}

/// A node that shuts down closes its registry cleanly (a later boot reopens it); one whose
/// registry was left open in an earlier boot of the machine (sled's files of large values may
/// be lost) rebuilds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_left_open_in_an_earlier_boot_is_rebuilt() -> Result<()> {
    let (c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    let open = c.dir(id).join("registry").join("OPEN");
    ensure!(
        !open.exists(),
        "a node that shut down closed its registry cleanly"
    );
    // As if the node had died and the machine gone down before it started again.
    std::fs::write(&open, "an-earlier-boot\n")?;
    rebuilt(c, id, digest).await
}

/// An untrusted registry that cannot be rebuilt (the newest snapshot is gone and the log was
/// purged up to it) is left as it was: the start fails, naming why, before anything is deleted;
/// once the snapshot is back, the next start rebuilds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_registry_is_kept_when_it_cannot_be_rebuilt() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    std::fs::remove_file(c.dir(id).join("registry").join("TRUSTED"))?;
    let snapshots = c.dir(id).join("snapshots");
    let aside = c.dir(id).with_extension("snapshots-aside");
    std::fs::rename(&snapshots, &aside)?;
    std::fs::create_dir(&snapshots)?;
    let db = c.dir(id).join("registry").join("db");
    ensure!(db.exists(), "the registry has its sled files");
    let refused = c
        .start_refused(id, "a node without the snapshot its purged log needs")
        .await?;
    ensure!(
        refused.contains("cannot be rebuilt") && refused.contains("snapshot"),
        "the refusal names why: {refused}"
    );
    ensure!(
        db.exists(),
        "the registry was deleted although it cannot be rebuilt"
    );
    std::fs::remove_dir(&snapshots)?;
    std::fs::rename(&aside, &snapshots)?;
    rebuilt(c, id, digest).await
}

/// Flips a byte in the middle of node `id`'s newest snapshot file (its payload: the header
/// and trailer stay sound); returns the file and its sound bytes.
fn damage_newest_snapshot(c: &Cluster, id: u64) -> Result<(PathBuf, Vec<u8>)> {
    let newest = common::newest_file(&c.dir(id).join("snapshots"), "snap")?;
    let sound = std::fs::read(&newest)?;
    let mut damaged = sound.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x20;
    std::fs::write(&newest, &damaged)?;
    Ok((newest, sound))
}

/// Starts node `id` again and checks that its registry, completed, matches `digest`.
async fn completed(mut c: Cluster, id: u64, digest: u64) -> Result<()> {
    let n = c.start(id).await?;
    holds_everything(c, n, digest).await
}

/// Checks that node `n` of `c`, started again, converges to a registry matching `digest`;
/// then shuts the cluster down.
async fn holds_everything(c: Cluster, n: MetaNode, digest: u64) -> Result<()> {
    c.converged().await?;
    let (_, again) = n.registry_digest().await?;
    ensure!(again == digest, "the completed registry differs");
    drop(n);
    c.shutdown().await
}

/// A registry that is gone, on a member whose log is purged up to a snapshot that is gone too,
/// cannot be completed: the start fails naming what is missing (not with openraft's message
/// about log indexes), and succeeds once the snapshot is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_registry_without_the_snapshot_it_needs_is_named() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    std::fs::remove_dir_all(c.dir(id).join("registry"))?;
    let snapshots = c.dir(id).join("snapshots");
    let aside = c.dir(id).with_extension("snapshots-aside");
    std::fs::rename(&snapshots, &aside)?;
    std::fs::create_dir(&snapshots)?;
    let refused = c
        .start_refused(
            id,
            "a node without its registry and the snapshot to rebuild it",
        )
        .await?;
    ensure!(
        refused.contains("nothing can complete it") && refused.contains("no snapshot"),
        "the refusal names what is missing: {refused}"
    );
    std::fs::remove_dir(&snapshots)?;
    std::fs::rename(&aside, &snapshots)?;
    completed(c, id, digest).await
}

/// An untrusted registry whose rebuild would rest on a snapshot that does not read back whole
/// (a payload byte rotted: its header and trailer are sound) is kept, and the start fails
/// naming the damage, rather than deleting the registry and then failing to install the
/// snapshot at every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_registry_is_kept_when_the_snapshot_it_needs_is_damaged() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    std::fs::remove_file(c.dir(id).join("registry").join("TRUSTED"))?;
    let (newest, sound) = damage_newest_snapshot(&c, id)?;
    let refused = c
        .start_refused(id, "a node whose rebuild needs a damaged snapshot")
        .await?;
    ensure!(
        refused.contains("cannot be rebuilt") && refused.contains("damaged"),
        "the refusal names the damage: {refused}"
    );
    ensure!(
        c.dir(id).join("registry").join("db").exists(),
        "the registry was deleted although its rebuild needs a damaged snapshot"
    );
    std::fs::write(&newest, &sound)?;
    rebuilt(c, id, digest).await
}

/// Nor can a registry that is gone be completed from a snapshot that does not read back
/// whole: the start fails naming the damage and the remedy (it failed in openraft's install,
/// with a raw "corrupt data" error, after a log line saying a new snapshot was being built),
/// and succeeds once the snapshot is sound again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_registry_whose_snapshot_is_damaged_is_named() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    std::fs::remove_dir_all(c.dir(id).join("registry"))?;
    let (newest, sound) = damage_newest_snapshot(&c, id)?;
    let refused = c
        .start_refused(id, "a node without its registry whose snapshot is damaged")
        .await?;
    ensure!(
        refused.contains("nothing can complete it")
            && refused.contains("damaged")
            && refused.contains("intact copy"),
        "the refusal names the damage: {refused}"
    );
    std::fs::write(&newest, &sound)?;
    completed(c, id, digest).await
}

/// Cuts node `id`'s newest snapshot short (its trailer gone, as a copy that did not finish
/// leaves it); returns the file, its sound bytes and where a start sets it aside.
fn cut_newest_snapshot(c: &Cluster, id: u64) -> Result<(PathBuf, Vec<u8>, PathBuf)> {
    let newest = common::newest_file(&c.dir(id).join("snapshots"), "snap")?;
    let sound = std::fs::read(&newest)?;
    std::fs::write(&newest, &sound[..sound.len() - 30])?;
    let aside = newest.with_extension("snap.damaged");
    Ok((newest, sound, aside))
}

/// A newest snapshot cut short is set aside, kept for the operator, and the node starts from
/// its registry and log with everything (the start used to stop, naming the remedy: set it
/// aside by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newest_snapshot_cut_short_is_set_aside() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    let (newest, sound, aside) = cut_newest_snapshot(&c, id)?;
    let n = c.start(id).await?;
    ensure!(
        std::fs::read(&aside)? == sound[..sound.len() - 30],
        "the damaged snapshot is kept, set aside"
    );
    if newest.exists() {
        ensure!(std::fs::read(&newest)? != sound[..sound.len() - 30]);
    }
    holds_everything(c, n, digest).await
}

/// A newest snapshot cut short that a deleted registry needed: the start fails naming where it
/// was set aside, and succeeds once an intact copy is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_set_aside_that_was_needed_is_named() -> Result<()> {
    let (mut c, id, digest) = stopped_follower_of_a_snapshotted_cluster().await?;
    std::fs::remove_dir_all(c.dir(id).join("registry"))?;
    let (newest, sound, aside) = cut_newest_snapshot(&c, id)?;
    let refused = c
        .start_refused(
            id,
            "a node without its registry whose snapshot was cut short",
        )
        .await?;
    ensure!(
        refused.contains("nothing can complete it")
            && refused.contains(&format!("set aside as {}", aside.display()))
            && refused.contains("intact copy"),
        "the refusal names the snapshot set aside: {refused}"
    );
    std::fs::write(&newest, &sound)?;
    completed(c, id, digest).await
}
