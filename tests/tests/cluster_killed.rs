//! Scenario 2: all three nodes are killed (SIGKILL) in the middle of a registration storm and
//! restarted from their data dirs with the same command lines: the cluster comes back without a
//! second initialize, and the registry matches the model.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meta_tests::run_scenario;
use meta_tests::{note, Cluster, ClusterConfig, Model, Storm, StormConfig};

const STEP: Duration = Duration::from_secs(60);

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let model = Arc::new(Mutex::new(Model::default()));
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::default(),
        seed,
    );
    storm.wait_progress(2_000, STEP).await?;

    let all = cluster.ids();
    let before = cluster.wait_leader(&all, STEP).await?;
    for id in &all {
        cluster.kill(*id);
    }
    // Everything acknowledged so far was committed at or below this index.
    let committed_before = before.committed;
    let acked_while_up = model.lock().unwrap().acked();
    note(format!("all killed after {acked_while_up:?} (batches, replicas) acknowledged, commit index >= {committed_before}"));

    // Node 1 gets `--init` again, as on its first start: it must not initialize a second time.
    for id in &all {
        cluster.start_node(*id, &[]).await?;
    }
    let after = cluster.wait_leader(&all, STEP).await?;
    // A restarted leader whose vote was committed may resume in its term; the term never goes back.
    anyhow::ensure!(
        after.term >= before.term,
        "term went back from {} to {}",
        before.term,
        after.term
    );
    // Every committed entry is durable on a quorum, and only a node holding all of them can win
    // the election. A node outside that quorum may come back shorter and catch up from the
    // leader (checked with the model at the end).
    anyhow::ensure!(
        after.last_log_index >= committed_before,
        "the new leader has last log index {} < {committed_before}",
        after.last_log_index
    );
    let mut holding = 0;
    for id in &all {
        let status = cluster.status(*id).await?;
        anyhow::ensure!(
            status.voters == all,
            "node {id} has voters {:?} after the restart",
            status.voters
        );
        holding += usize::from(status.last_log_index >= committed_before);
    }
    anyhow::ensure!(
        holding > all.len() / 2,
        "only {holding} of {} nodes came back holding the committed index {committed_before}",
        all.len()
    );
    let members: Vec<(u64, String)> = all
        .iter()
        .map(|id| (*id, cluster.raft_addr(*id).to_string()))
        .collect();
    match cluster.api(1)?.init(&members).await {
        Err(err) if err.status() == Some(409) => {}
        other => anyhow::bail!("a second initialize was not refused with 409: {other:?}"),
    }

    storm.wait_progress(2_000, STEP).await?;
    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_killed_mid_storm() {
    run_scenario(
        "whole_cluster_killed_mid_storm",
        "cluster-killed",
        ClusterConfig::default(),
        Duration::from_secs(240),
        scenario,
    )
    .await;
}
