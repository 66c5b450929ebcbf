//! Scenario 1: the leader is killed (SIGKILL) in the middle of a registration storm; a new leader is
//! elected, registrations continue, the killed node restarts and catches up, and every node holds
//! every acknowledged replica exactly once. A watcher follows the changes throughout, moving
//! between members, and must have seen every acknowledged replica and key, in log order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meta_tests::registry_state::RegistryState;
use meta_tests::run_scenario;
use meta_tests::{note, Cluster, ClusterConfig, Consistency, Model, Storm, StormConfig, Watcher};

const STEP: Duration = Duration::from_secs(60);

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let model = Arc::new(Mutex::new(Model::default()));
    let watcher = Watcher::start(cluster.endpoints(), cluster.http(), STEP).await?;
    let storm = Storm::start(
        cluster.endpoints(),
        cluster.http(),
        model.clone(),
        StormConfig::default(),
        seed,
    );
    storm.wait_progress(2_000, STEP).await?;

    let all = cluster.ids();
    let old = cluster.wait_leader(&all, STEP).await?;
    cluster.kill(old.id);
    let rest: Vec<u64> = all.iter().copied().filter(|id| *id != old.id).collect();
    let new = cluster.wait_leader(&rest, STEP).await?;
    anyhow::ensure!(
        new.id != old.id && new.term > old.term,
        "no new leader: {new:?}"
    );
    note(format!(
        "leader {} killed at term {}; node {} leads at term {}",
        old.id, old.term, new.id, new.term
    ));
    storm.wait_progress(2_000, STEP).await?;

    cluster.start_node(old.id, &[]).await?;
    storm.wait_progress(1_000, STEP).await?;
    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await?;
    // Everything is applied everywhere now: the watcher catches up to the end of the log.
    let leader = cluster.wait_leader(&all, STEP).await?;
    let end = cluster.api(leader.id)?.cluster().await?.applied;
    watcher.wait_reached(end, STEP).await?;
    let watched = watcher.stop().await?;
    note(format!(
        "watcher: {} events, {} compacted answers",
        watched.events.len(),
        watched.compacted
    ));
    let state = RegistryState::fetch(
        &cluster.api(leader.id)?,
        Consistency::Linearizable,
        "storm/",
    )
    .await?;
    let violations = watched.violations(&model, &state, "storm/");
    anyhow::ensure!(violations.is_empty(), "watch: {violations:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_storm() {
    run_scenario(
        "leader_killed_mid_storm",
        "leader-killed",
        ClusterConfig::default(),
        Duration::from_secs(240),
        scenario,
    )
    .await;
}
