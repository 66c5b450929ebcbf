//! The only voter of a cluster whose log lost entries its registry applied (log files cut or
//! gone) holds the only copy of them: it keeps the registry, as a snapshot, where a member of
//! several voters would rebuild it; with no vote of the registry's term left, it refuses to
//! start and changes nothing.

mod common;

use std::path::Path;

use anyhow::{ensure, Context, Result};
use common::Cluster;
use meta_consensus::{Command, Consistency};

const KEYS: usize = 40;

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: key.as_bytes().to_vec(),
        if_revision: None,
    }
}

/// A single-voter cluster that acknowledged [`KEYS`] writes, stopped cleanly (its registry
/// holds them all), and the index of the last one.
async fn stopped_single_voter() -> Result<(Cluster, u64)> {
    let mut c = Cluster::voters(1).await?;
    let l = c.leader().await?;
    let mut last = 0;
    for i in 0..KEYS {
        last = l.write(put(&format!("k/{i}"))).await?.index;
    }
    c.stop(1).await?;
    Ok((c, last))
}

/// Cuts `bytes` off the end of what the newest log segment in `wal` holds (the segment is
/// preallocated: its written part ends at its last byte that is not zero), as a damaged disk
/// might; recovery takes the cut record for a torn write.
fn cut_log_tail(wal: &Path, bytes: usize) -> Result<()> {
    let newest = common::newest_file(wal, "wal")?;
    let data = std::fs::read(&newest)?;
    let written = data
        .iter()
        .rposition(|b| *b != 0)
        .context("a written segment")?
        + 1;
    ensure!(written > bytes, "the segment holds {written} bytes");
    let file = std::fs::OpenOptions::new().write(true).open(&newest)?;
    file.set_len((written - bytes) as u64)?;
    Ok(())
}

/// Takes node 1's log dir aside, checks that the node refuses to start without it, saying why,
/// and runs `also` on the data dir it left; then puts the log back, where the refused start left no
/// log dir of its own.
async fn refused_without_its_log(
    c: &mut Cluster,
    also: impl Fn(&Path) -> Result<()>,
) -> Result<()> {
    let wal = c.dir(1).join("wal");
    let aside = c.dir(1).with_extension("wal-aside");
    std::fs::rename(&wal, &aside)?;
    let refused = c.start_refused(1, "a sole voter without its log").await?;
    ensure!(
        refused.contains("only voter") && refused.contains("holds no vote"),
        "the refusal names why: {refused}"
    );
    also(&c.dir(1))?;
    ensure!(!wal.exists(), "the refused start left a log dir behind");
    std::fs::rename(&aside, &wal)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_voter_keeps_a_registry_its_log_fell_behind() -> Result<()> {
    let (mut c, last) = stopped_single_voter().await?;
    // About the last dozen writes' records.
    cut_log_tail(&c.dir(1).join("wal"), 600)?;
    let n = c.start(1).await?;
    common::holds_keys(&n, KEYS).await?;
    let snapshot = n
        .status()
        .snapshot_index
        .context("the kept registry is a snapshot")?;
    ensure!(
        snapshot >= last,
        "the snapshot ends at {snapshot}, before the last write {last}"
    );
    // It leads again and takes writes after the kept entries.
    let l = c.leader().await?;
    let next = l.write(put("after")).await?.index;
    ensure!(next > last, "a write after the kept ones got index {next}");
    // And it opens as usual from then on (the registry's lock goes with the last handle).
    drop((n, l));
    c.stop(1).await?;
    let n = c.start(1).await?;
    common::holds_keys(&n, KEYS).await?;
    n.kv_get(Consistency::Local, "after")
        .await?
        .context("the write after the kept ones was lost")?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_voter_without_its_log_refuses_to_start_and_keeps_its_registry() -> Result<()> {
    let (mut c, _) = stopped_single_voter().await?;
    refused_without_its_log(&mut c, |dir| {
        ensure!(
            dir.join("registry").join("TRUSTED").exists(),
            "the registry was not kept as it was"
        );
        ensure!(
            !dir.join("REJOINING").exists(),
            "the refused start marked the node as rejoining"
        );
        Ok(())
    })
    .await?;
    let n = c.start(1).await?;
    common::holds_keys(&n, KEYS).await?;
    c.shutdown().await
}

/// With a snapshot that covers the registry, the registry is not ahead of what the node holds,
/// but the log's vote is still gone: started, the node would lead term 1 over entries of a
/// later term (openraft then panics, and the log refuses every later start as inverted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_voter_whose_log_lost_its_vote_refuses_to_start() -> Result<()> {
    let (mut c, _) = stopped_single_voter().await?;
    // A restart elects it again, in a later term; the snapshot ends in that term.
    let n = c.start(1).await?;
    let l = c.leader().await?;
    l.write(put("later")).await?;
    let snapshot = l.snapshot_now().await?;
    ensure!(snapshot.index > 0, "no snapshot");
    drop((n, l));
    c.stop(1).await?;
    refused_without_its_log(&mut c, |_| Ok(())).await?;
    let n = c.start(1).await?;
    common::holds_keys(&n, KEYS).await?;
    c.leader().await?.write(put("after")).await?;
    drop(n);
    c.shutdown().await
}
