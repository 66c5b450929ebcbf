//! Scenario 5: a follower is stopped, more than 100,000 replicas are registered, a snapshot is forced
//! so the leader purges its log, and the follower restarts while registrations continue: it installs
//! the snapshot (at a low snapshot rate over a slow link, so the transfer takes a few seconds) and
//! catches up by log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meta_tests::run_scenario;
use meta_tests::{note, poll_until, Cluster, ClusterConfig, Model, Storm, StormConfig};

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
    Storm::run_to_end(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::bulk((101..=104).collect(), 4_500, 6),
        seed,
        STEP,
    )
    .await?;
    let registered = model.lock().unwrap().acked().1;
    anyhow::ensure!(
        registered > 100_000,
        "only {registered} replicas acknowledged"
    );

    let leader_api = cluster.api(leader)?;
    let (index, bytes) = leader_api.snapshot_now().await?;
    // Openraft purges shortly after the snapshot; a follower started before that catches up by log.
    let purged = cluster.wait_purged(leader, index, STEP).await?;
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
        StormConfig::background(),
        seed,
    );
    storm.wait_progress(500, STEP).await?;
    let restarted = Instant::now();
    let env = [(String::from("METASERVER_SNAPSHOT_RATE"), rate.to_string())];
    cluster.start_node(follower, &env).await?;
    let installed = poll_until("the follower to install the snapshot", STEP, || async {
        let status = cluster.status(follower).await?;
        match status.snapshot_index {
            Some(at) if at >= index => Ok(Some(at)),
            other => anyhow::bail!("newest snapshot {other:?}, applied {}", status.applied),
        }
    })
    .await?;
    note(format!(
        "follower installed the snapshot at {installed} {:?} after its restart ({rate} bytes/s)",
        restarted.elapsed()
    ));
    // The rest comes by log, over a link at full speed again.
    cluster.set_link_rate(follower, None);
    cluster.wait_caught_up(&all, STEP).await?;
    storm.wait_progress(500, STEP).await?;

    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_behind_follower_installs_snapshot_then_catches_up() {
    let config = ClusterConfig {
        env: vec![(String::from("METASERVER_KEEP_LOGS"), String::from(KEEP_LOG))],
        ..ClusterConfig::default()
    };
    run_scenario(
        "far_behind_follower",
        "far-behind",
        config,
        Duration::from_secs(300),
        scenario,
    )
    .await;
}
