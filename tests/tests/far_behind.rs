//! Scenario 5: a follower is stopped, more than 100,000 replicas are registered, a snapshot is forced
//! so the leader purges its log, and the follower restarts while registrations continue: it installs
//! the snapshot (at a low snapshot rate over a slow link, so the transfer takes a few seconds) and
//! catches up by log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meta_tests::scenario::within;
use meta_tests::{note, poll_until, test_seed, Cluster, ClusterConfig, Model, Storm, StormConfig};

const STEP: Duration = Duration::from_secs(90);

/// The server keeps this many log entries behind a snapshot; the scenario needs them purged.
const KEEP_LOG: &str = "0";

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let all = cluster.ids();
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    cluster.stop(follower).await?;
    let started_at = cluster.status(leader).await?.applied;

    // 4 datanodes x 6 batches x 4,500 shards = 108,000 replicas.
    let model = Arc::new(Mutex::new(Model::default()));
    let bulk = StormConfig {
        datanodes: (101..=104).collect(),
        batch: 4_500,
        batches_per_datanode: Some(6),
        kv_writers: 0,
        kv_prefix: String::from("bulk/"),
    };
    let load = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        bulk,
        seed,
    );
    load.wait_finished(STEP).await?;
    load.stop().await?;
    let registered = model.lock().unwrap().acked().1;
    anyhow::ensure!(
        registered > 100_000,
        "only {registered} replicas acknowledged"
    );

    let leader_api = cluster.api(leader)?;
    let (index, bytes) = leader_api.snapshot_now().await?;
    // Openraft purges shortly after the snapshot; a follower started before that catches up by log.
    let purged = wait_purged(cluster, leader, index).await?;
    note(format!(
        "snapshot at index {index}, {bytes} bytes; leader purged up to {purged}, the follower stopped at {started_at}"
    ));

    // About four seconds of transfer. The server's snapshot rate paces snapshot files as they are
    // written; the link into the follower (the harness's proxy) is slowed to the same rate, so the
    // transfer itself takes that long too.
    let rate = (bytes / 4).max(64 * 1024);
    leader_api.set_snapshot_rate(rate).await?;
    cluster.set_link_rate(follower, Some(rate));
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::default(),
        seed,
    );
    storm.wait_progress(500, STEP).await?;
    let restarted = Instant::now();
    let env = [(String::from("METASERVER_SNAPSHOT_RATE"), rate.to_string())];
    cluster.start_node(follower, &env).await?;
    cluster.wait_caught_up(&all, STEP).await?;
    let status = cluster.status(follower).await?;
    note(format!(
        "follower caught up to {} after {:?} ({rate} bytes/s); its snapshot: {:?}",
        status.applied,
        restarted.elapsed(),
        status.snapshot_index
    ));
    // Checked after the convergence below, so a failure here still shows whether data was lost.
    let installed = match status.snapshot_index {
        Some(at) if at >= index => Ok(()),
        other => Err(anyhow::anyhow!(
            "the follower caught up without installing the snapshot at {index} (its newest snapshot: {other:?})"
        )),
    };
    cluster.set_link_rate(follower, None);
    storm.wait_progress(1_000, STEP).await?;

    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await?;
    installed
}

/// Waits until node `id` has purged its log up to `index` (from `/metrics`).
async fn wait_purged(cluster: &Cluster, id: u64, index: u64) -> anyhow::Result<u64> {
    poll_until(
        &format!("node {id} to purge its log up to {index}"),
        STEP,
        || async {
            let purged = cluster
                .api(id)?
                .metric("metaserver_raft_purged_index")
                .await?;
            match purged {
                Some(p) if p >= index as f64 => Ok(Some(p as u64)),
                other => anyhow::bail!("purged index {other:?}"),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_behind_follower_installs_snapshot_then_catches_up() {
    let seed = test_seed("far_behind_follower");
    let config = ClusterConfig {
        env: vec![(String::from("METASERVER_KEEP_LOGS"), String::from(KEEP_LOG))],
        ..ClusterConfig::default()
    };
    let mut cluster = Cluster::start("far-behind", config)
        .await
        .expect("start the cluster");
    within(
        "far_behind_follower",
        Duration::from_secs(300),
        scenario(&mut cluster, seed),
    )
    .await;
}
