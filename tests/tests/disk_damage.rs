//! Scenario 4: disk damage on a stopped node. A torn last WAL record with garbage after it is cut
//! off at restart and the node catches up from the leader. A flipped byte in the middle of an older
//! segment (of the only one, when the log has not grown past one segment) makes the node refuse to
//! start, naming the file and offset; the documented recovery (remove it from the
//! voters, wipe its data dir, add it back as a learner, then as a voter) brings it back.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meta_tests::scenario::within;
use meta_tests::wal_files::{flip_byte, record_spans, tear_tail, wal_segments};
use meta_tests::{
    derived_rng, note, poll_until, test_seed, Cluster, ClusterConfig, Model, Storm, StormConfig,
};

const STEP: Duration = Duration::from_secs(60);

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let mut rng = derived_rng(seed, 4);
    let model = Arc::new(Mutex::new(Model::default()));
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::default(),
        seed,
    );
    storm.wait_progress(3_000, STEP).await?;

    // A torn tail: cut the last record of the newest segment in the middle, append garbage.
    let all = cluster.ids();
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let followers: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    let torn = followers[rng.usize(..followers.len())];
    cluster.kill(torn);
    let segments = wal_segments(&cluster.data_dir(torn))?;
    let newest = segments
        .last()
        .ok_or_else(|| anyhow::anyhow!("node {torn} has no WAL segment"))?;
    let last = *record_spans(newest)?
        .last()
        .ok_or_else(|| anyhow::anyhow!("no record in {}", newest.display()))?;
    let garbage: Vec<u8> = (0..rng.usize(16..200)).map(|_| rng.u8(1..)).collect();
    let cut = last.offset + (last.len / 2).max(1);
    tear_tail(newest, cut, &garbage)?;
    note(format!(
        "node {torn}: cut {} at offset {cut} (record at {} of {} bytes), appended {} garbage bytes",
        newest.display(),
        last.offset,
        last.len,
        garbage.len()
    ));
    cluster.start_node(torn, &[]).await?;
    storm.wait_progress(1_000, STEP).await?;
    cluster.wait_caught_up(&all, STEP).await?;

    // A flipped byte in the middle of the log, valid records after it: the node must refuse to start.
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let damaged = *all
        .iter()
        .find(|id| **id != leader && **id != torn)
        .unwrap_or(&torn);
    cluster.kill(damaged);
    let segments = wal_segments(&cluster.data_dir(damaged))?;
    // Segments are 64 MiB and the server has no setting for their size, so a test-sized log usually
    // has one: then the damage goes in the middle of it, where valid records follow just the same.
    let older = match segments.len() {
        0 => anyhow::bail!("node {damaged} has no WAL segment"),
        1 => &segments[0],
        n => &segments[rng.usize(..n - 1)],
    };
    note(format!("node {damaged}: {} segment(s)", segments.len()));
    let spans = record_spans(older)?;
    anyhow::ensure!(
        spans.len() >= 3,
        "{} holds {} records",
        older.display(),
        spans.len()
    );
    let victim = spans[spans.len() / 2];
    let flipped = victim.payload + (victim.len - (victim.payload - victim.offset)) / 2;
    flip_byte(older, flipped)?;
    note(format!(
        "node {damaged}: flipped the byte at {flipped} of {} (record at {})",
        older.display(),
        victim.offset
    ));
    let (status, output) = cluster.start_node_expecting_exit(damaged, STEP).await?;
    anyhow::ensure!(
        !status.success(),
        "node {damaged} exited with {status} despite the damage"
    );
    check_names_file_and_offset(&output, older, victim.offset, flipped)?;

    // Recovery: out of the voters, wipe, back as a learner, then a voter.
    let voters: Vec<u64> = all.iter().copied().filter(|id| *id != damaged).collect();
    let leader_api = cluster.api(leader)?;
    leader_api.set_voters(&voters).await?;
    wait_membership(cluster, leader, &voters).await?;
    cluster.wipe(damaged)?;
    cluster.start_node(damaged, &[]).await?;
    cluster
        .api(leader)?
        .add_learner(damaged, &cluster.raft_addr(damaged).to_string())
        .await?;
    cluster.wait_caught_up(&all, STEP).await?;
    cluster.api(leader)?.set_voters(&all).await?;
    wait_membership(cluster, leader, &all).await?;
    storm.wait_progress(1_000, STEP).await?;

    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await
}

/// The refusal must name the damaged segment and an offset inside (or at the start of) the record.
fn check_names_file_and_offset(
    output: &str,
    file: &Path,
    record: u64,
    flipped: u64,
) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let line = output
        .lines()
        .find(|line| line.contains(name))
        .ok_or_else(|| anyhow::anyhow!("the output does not name {name}:\n{output}"))?;
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty() && s.len() < 20)
        .filter_map(|s| s.parse().ok())
        .collect();
    anyhow::ensure!(
        numbers.iter().any(|n| (record..=flipped).contains(n)),
        "the message naming {name} gives no offset in {record}..={flipped}: {line}"
    );
    Ok(())
}

async fn wait_membership(cluster: &Cluster, leader: u64, voters: &[u64]) -> anyhow::Result<()> {
    poll_until(&format!("voters {voters:?}"), STEP, || async {
        let status = cluster.status(leader).await?;
        if status.voters == voters {
            Ok(Some(()))
        } else {
            anyhow::bail!("voters {:?}, learners {:?}", status.voters, status.learners)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_wal_is_cut_or_refused_and_recovered() {
    let seed = test_seed("disk_damage");
    let mut cluster = Cluster::start("disk-damage", ClusterConfig::default())
        .await
        .expect("start the cluster");
    within(
        "disk_damage",
        Duration::from_secs(300),
        scenario(&mut cluster, seed),
    )
    .await;
}
