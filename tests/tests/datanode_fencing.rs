//! Scenario 7: a datanode re-registers (a new epoch) while a slow batch of its former incarnation is
//! still in flight: the old batch is rejected as fenced and nothing of it lands, on any node.

use std::time::Duration;

use meta_tests::held_request::HeldRequest;
use meta_tests::run_scenario;
use meta_tests::{derived_rng, note, Cluster, ClusterConfig, Consistency, Model, ShardReport};
use serde_json::json;

const STEP: Duration = Duration::from_secs(60);
const DATANODE: u64 = 500;
const ADDR: &str = "127.0.0.1:25000";

fn shards(rng: &mut fastrand::Rng, first: u64, count: u64) -> Vec<ShardReport> {
    (first..first + count)
        .map(|id| ShardReport {
            id,
            generation: rng.u64(1..5),
            size: rng.u64(1..1 << 30),
        })
        .collect()
}

/// Registers the datanode until a member answers, for at most [`STEP`]; returns its epoch.
async fn register_until_answered(api: &meta_tests::Api) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        match api.register_datanode(DATANODE, ADDR).await {
            Ok(epoch) => return Ok(epoch),
            Err(err) if tokio::time::Instant::now() < deadline => {
                note(format!("registration failed ({err}); again"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

async fn scenario(cluster: &mut Cluster, seed: u64) -> anyhow::Result<()> {
    let mut rng = derived_rng(seed, 7);
    let mut model = Model::default();
    let all = cluster.ids();
    let leader = cluster.wait_leader(&all, STEP).await?.id;
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    let api = cluster.api(leader)?;

    let mut epoch = api.register_datanode(DATANODE, ADDR).await?;
    model.datanode_acked(DATANODE, epoch);
    let kept = shards(&mut rng, 1, 100);
    let id = model.batch_sent(DATANODE, &kept);
    api.register_shards(DATANODE, epoch, &kept).await?;
    model.batch_acked(id);

    // A slow batch of the old incarnation, to the leader and then to a follower (which forwards it):
    // its last byte is held back until the datanode has re-registered.
    let mut next_shard = 1_000;
    for (round, target) in [leader, follower].into_iter().enumerate() {
        let old = shards(&mut rng, next_shard, 10_000);
        next_shard += 10_000;
        let body = serde_json::to_vec(&json!({ "epoch": epoch, "shards": old }))?;
        let addr = cluster
            .endpoints()
            .get(target)
            .ok_or_else(|| anyhow::anyhow!("node {target} down"))?;
        let path = format!("/v1/datanodes/{DATANODE}/shards");
        let held = HeldRequest::send_partial(addr, "POST", &path, body, 1).await?;
        let id = model.batch_sent(DATANODE, &old);

        let via = if round == 0 { follower } else { leader };
        let new_epoch = cluster.api(via)?.register_datanode(DATANODE, ADDR).await?;
        anyhow::ensure!(
            new_epoch > epoch,
            "re-registration gave epoch {new_epoch} after {epoch}"
        );
        model.datanode_acked(DATANODE, new_epoch);

        let (status, answer) = held.finish(STEP).await?;
        anyhow::ensure!(
            status == 409 && answer.contains("fenced"),
            "old-epoch batch sent to node {target} answered {status}: {answer}"
        );
        model.batch_rejected(id);
        note(format!(
            "round {round}: batch at epoch {epoch} fenced after re-registration at {new_epoch}"
        ));
        epoch = new_epoch;
    }

    // Races without holding anything back: each outcome is allowed, but it must be all or nothing.
    for round in 0..6 {
        let racing = shards(&mut rng, next_shard, 5_000);
        next_shard += 5_000;
        let id = model.batch_sent(DATANODE, &racing);
        let writer = cluster.api(all[rng.usize(..all.len())])?;
        let registrar = cluster.api(all[rng.usize(..all.len())])?;
        // A seeded head start for the batch varies which of the two commits first.
        let head_start = Duration::from_millis(rng.u64(0..60));
        let (batch, registration) =
            tokio::join!(writer.register_shards(DATANODE, epoch, &racing), async {
                tokio::time::sleep(head_start).await;
                registrar.register_datanode(DATANODE, ADDR).await
            });
        let new_epoch = match registration {
            Ok(epoch) => epoch,
            // No answer or no leader for a moment (a starved machine): registering again only
            // starts a newer epoch, which fences the batch all the same.
            Err(err) => {
                note(format!("race {round}: registration failed ({err}); again"));
                register_until_answered(&registrar).await?
            }
        };
        model.datanode_acked(DATANODE, new_epoch);
        note(format!(
            "race {round}: batch at epoch {epoch} {} (head start {head_start:?}), re-registration at {new_epoch}",
            if batch.is_ok() { "accepted" } else { "refused" }
        ));
        match batch {
            Ok(answer) => {
                anyhow::ensure!(
                    answer.accepted == racing.len() as u64,
                    "race {round}: {answer:?}"
                );
                model.batch_acked(id);
            }
            Err(err) if err.code() == Some("fenced") => model.batch_rejected(id),
            // No answer, or one without the outcome (a leader change on a starved machine):
            // the batch landed or not, but whole.
            Err(err) => {
                let listed = api
                    .list_shards(Some(DATANODE), Consistency::Linearizable)
                    .await?;
                let ids: std::collections::HashSet<u64> = listed.iter().map(|r| r.shard).collect();
                let landed = racing.iter().filter(|s| ids.contains(&s.id)).count();
                note(format!(
                    "race {round}: the batch failed otherwise ({err}); {landed} of {} landed",
                    racing.len()
                ));
                if landed == 0 {
                    model.batch_rejected(id);
                } else if landed == racing.len() {
                    model.batch_acked(id);
                } else {
                    anyhow::bail!("race {round}: {landed} of {} shards landed", racing.len());
                }
            }
        }
        epoch = new_epoch;
    }

    // The current incarnation registers normally.
    let current = shards(&mut rng, next_shard, 1_000);
    let id = model.batch_sent(DATANODE, &current);
    api.register_shards(DATANODE, epoch, &current).await?;
    model.batch_acked(id);

    let listed = api
        .list_shards(Some(DATANODE), Consistency::Linearizable)
        .await?;
    let want = model.replicas().len();
    anyhow::ensure!(
        listed.len() == want,
        "datanode {DATANODE} lists {} replicas, the model has {want}",
        listed.len()
    );
    cluster.assert_converged(&all, &model, "storm/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_datanode_fences_its_old_batch() {
    run_scenario(
        "datanode_fencing",
        "fencing",
        ClusterConfig::default(),
        Duration::from_secs(180),
        scenario,
    )
    .await;
}
