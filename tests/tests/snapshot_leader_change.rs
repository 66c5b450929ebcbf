//! Scenario 6: the leader is killed while a far-behind follower is installing a snapshot from it.
//! The remaining node becomes leader, the follower still ends up with the whole registry (by a new
//! snapshot or by log), and after the old leader restarts every node equals the model.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meta_tests::run_scenario;
use meta_tests::{note, poll_until, Cluster, ClusterConfig, Model, Storm, StormConfig};

const STEP: Duration = Duration::from_secs(90);

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let all = cluster.ids();
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    let other = *all
        .iter()
        .find(|id| **id != leader && **id != follower)
        .expect("a third node");
    cluster.stop(follower).await?;

    // 4 datanodes x 5 batches x 3,000 shards = 60,000 replicas.
    let model = Arc::new(Mutex::new(Model::default()));
    Storm::run_to_end(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::bulk((201..=204).collect(), 3_000, 5),
        seed,
        STEP,
    )
    .await?;

    // Both remaining nodes snapshot and purge, so whichever leads must send a snapshot.
    cluster.wait_caught_up(&[leader, other], STEP).await?;
    let mut bytes = 0;
    let mut snapshot_index = u64::MAX;
    for id in [leader, other] {
        let (index, size) = cluster.api(id)?.snapshot_now().await?;
        bytes = bytes.max(size);
        snapshot_index = snapshot_index.min(index);
        // Openraft purges shortly after the snapshot; until then the follower could catch up by log.
        cluster.wait_purged(id, index, STEP).await?;
        note(format!(
            "node {id}: snapshot at index {index}, {size} bytes"
        ));
    }
    // About eight seconds per transfer: the snapshot rate paces the files, the slowed link into the
    // follower (the harness's proxy) paces the transfer.
    let rate = (bytes / 8).max(32 * 1024);
    for id in [leader, other] {
        cluster.api(id)?.set_snapshot_rate(rate).await?;
    }
    cluster.set_link_rate(follower, Some(rate));

    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::background(),
        seed,
    );
    storm.wait_progress(500, STEP).await?;
    let env = [(String::from("METASERVER_SNAPSHOT_RATE"), rate.to_string())];
    cluster.start_node(follower, &env).await?;
    let data_dir = cluster.data_dir(follower);
    poll_until(
        "the follower to start receiving a snapshot",
        STEP,
        || async {
            let status = cluster.status(follower).await?;
            anyhow::ensure!(
                status.snapshot_index.is_none_or(|at| at < snapshot_index),
                "the follower installed the snapshot before it was seen arriving"
            );
            Ok(receiving_snapshot(&data_dir).then_some(()))
        },
    )
    .await?;
    cluster.kill(leader);
    note(format!(
        "leader {leader} killed while node {follower} receives its snapshot"
    ));
    cluster.set_link_rate(follower, None);

    let new = cluster.wait_leader(&[other, follower], STEP).await?;
    anyhow::ensure!(new.id == other, "node {} leads, expected {other}", new.id);
    storm.wait_progress(1_000, STEP).await?;
    cluster.wait_caught_up(&[other, follower], STEP).await?;

    cluster.start_node(leader, &[]).await?;
    storm.wait_progress(500, STEP).await?;
    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await
}

/// Whether a snapshot is arriving: a non-empty file whose path mentions `incoming` in the data dir
/// (where the server streams a snapshot before it verifies and installs it).
fn receiving_snapshot(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            receiving_snapshot(&path)
        } else {
            path.to_string_lossy().contains("incoming")
                && entry.metadata().is_ok_and(|m| m.len() > 0)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_change_during_snapshot_install() {
    let config = ClusterConfig {
        env: vec![(String::from("METASERVER_KEEP_LOGS"), String::from("0"))],
        ..ClusterConfig::default()
    };
    run_scenario(
        "leader_change_during_snapshot_install",
        "snapshot-leader-change",
        config,
        Duration::from_secs(300),
        scenario,
    )
    .await;
}
