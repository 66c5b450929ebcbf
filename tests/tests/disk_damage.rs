//! Scenario 4: disk damage on a stopped node. A torn last WAL record with garbage after it is cut
//! off at restart and the node catches up from the leader. A flipped byte in the middle of an older
//! segment (of the only one, when the log has not grown past one segment) makes the node refuse to
//! start, naming the file and offset; the documented recovery (remove it from the
//! voters, wipe its data dir, add it back as a learner, then as a voter) brings it back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meta_tests::run_scenario;
use meta_tests::wal_files::{
    append_torn_record, flip_byte, record_spans, tear_tail, wal_segments, RecordSpan,
};
use meta_tests::{
    derived_rng, note, poll_until, Cluster, ClusterConfig, Model, Storm, StormConfig,
};

const STEP: Duration = Duration::from_secs(60);

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let mut rng = derived_rng(seed, 4);
    let model = Arc::new(Mutex::new(Model::default()));
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::background(),
        seed,
    );
    storm.wait_progress(3_000, STEP).await?;

    let all = cluster.ids();
    // A torn write: a record cut off mid-way by the crash (never acknowledged), garbage after it.
    let torn = a_follower(cluster, &mut rng).await?;
    cluster.kill(torn);
    let (newest, last) = last_record(cluster, torn, |_| true)?;
    let garbage: Vec<u8> = (0..rng.usize(16..200)).map(|_| rng.u8(1..)).collect();
    let at = append_torn_record(&newest, last, &garbage)?;
    note(format!(
        "node {torn}: torn record at offset {at} of {}, then {} garbage bytes",
        newest.display(),
        garbage.len()
    ));
    cluster.start_node(torn, &[]).await?;
    storm.wait_progress(1_000, STEP).await?;
    cluster.wait_caught_up(&all, STEP).await?;

    // Cut the log in the middle of its last registration batch, garbage after the cut. The storm
    // is paused first and the follower has caught up, so the leader knows the follower acknowledged
    // that entry: the node drops the torn tail (acknowledged entries with it) and must catch up from
    // the leader. A failure is kept for the end; the cluster is then repaired by restarting the
    // nodes that no longer agree, so the rest of the scenario still runs.
    storm.stop().await?;
    let committed_before = cluster.wait_caught_up(&all, STEP).await?;
    let torn = a_follower(cluster, &mut rng).await?;
    cluster.kill(torn);
    let (newest, last) = last_record(cluster, torn, |span| span.len >= 200)?;
    let cut = last.offset + last.len / 2;
    tear_tail(&newest, cut, &garbage)?;
    note(format!(
        "node {torn}: cut {} at offset {cut}, inside the record at {} of {} bytes; {} garbage bytes",
        newest.display(),
        last.offset,
        last.len,
        garbage.len()
    ));
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig {
            datanodes: (11..=13).collect(),
            kv_prefix: String::from("storm2/"),
            ..StormConfig::background()
        },
        seed,
    );
    cluster.start_node(torn, &[]).await?;
    // New entries after the restart: catching up means taking them, not only having applied
    // (sled already held what the cut dropped from the log).
    storm.wait_progress(200, STEP).await?;
    let caught_up = async {
        let target = cluster
            .wait_caught_up(&all, Duration::from_secs(20))
            .await?;
        anyhow::ensure!(
            target > committed_before,
            "nothing was committed after the restart ({target} <= {committed_before})"
        );
        let status = cluster.status(torn).await?;
        anyhow::ensure!(
            status.last_log_index >= target,
            "node {torn} applied {target} but its log ends at {}",
            status.last_log_index
        );
        Ok(())
    };
    let reverted = match caught_up.await {
        Ok(()) => Ok(()),
        Err(err) => {
            note(format!("after the cut: {err:#}"));
            restart_disagreeing(cluster).await?;
            cluster.wait_caught_up(&all, STEP).await?;
            Err(err.context(format!(
                "node {torn}: the cluster did not reconverge after the node dropped acknowledged entries"
            )))
        }
    };
    storm.wait_progress(500, STEP).await?;

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
    cluster.assert_converged(&all, &model, "storm").await?;
    reverted
}

/// A random follower of the current leader.
async fn a_follower(cluster: &Cluster, rng: &mut fastrand::Rng) -> anyhow::Result<u64> {
    let all = cluster.ids();
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let followers: Vec<u64> = all.into_iter().filter(|id| *id != leader).collect();
    Ok(followers[rng.usize(..followers.len())])
}

/// The newest segment of `node` and its last record that satisfies `pick`.
fn last_record(
    cluster: &Cluster,
    node: u64,
    pick: impl Fn(&RecordSpan) -> bool,
) -> anyhow::Result<(PathBuf, RecordSpan)> {
    let segments = wal_segments(&cluster.data_dir(node))?;
    let newest = segments
        .last()
        .ok_or_else(|| anyhow::anyhow!("node {node} has no WAL segment"))?
        .clone();
    let last = record_spans(&newest)?
        .into_iter()
        .rev()
        .find(|span| pick(span))
        .ok_or_else(|| anyhow::anyhow!("no suitable record in {}", newest.display()))?;
    Ok((newest, last))
}

/// Restarts every node that does not answer, or claims to lead at a term older than another
/// node's: a node whose Raft core stopped keeps serving its last view.
async fn restart_disagreeing(cluster: &mut Cluster) -> anyhow::Result<()> {
    let mut statuses = Vec::new();
    for id in cluster.ids() {
        statuses.push((id, cluster.status(id).await.ok()));
    }
    let newest = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().map(|s| s.term))
        .max()
        .unwrap_or(0);
    for (id, status) in statuses {
        let stale = match &status {
            None => true,
            Some(s) => s.is_leader() && s.term < newest,
        };
        if stale {
            note(format!(
                "restarting node {id} ({status:?})",
                status = status.map(|s| (s.role, s.term))
            ));
            cluster.kill(id);
            cluster.start_node(id, &[]).await?;
        }
    }
    Ok(())
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
    run_scenario(
        "disk_damage",
        "disk-damage",
        ClusterConfig::default(),
        Duration::from_secs(300),
        scenario,
    )
    .await;
}
