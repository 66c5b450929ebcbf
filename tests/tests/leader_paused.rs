//! Scenario: the leader's process is paused (SIGSTOP, as a stalled VM or a debugger would) for
//! longer than an election timeout. The others elect a new leader, which takes a write. Reads
//! sent to the paused node meanwhile wait in its sockets; once it runs again it finds the
//! others moved on, learns of the new leader and sends the reads there: each answers the new
//! leader's write. Before, most of them were answered 503 `no_leader` in the moment between
//! the node learning that it no longer leads and learning who does.

use std::time::Duration;

use meta_tests::held_request::HeldRequest;
use meta_tests::{note, run_scenario, Cluster, ClusterConfig, Consistency};

const STEP: Duration = Duration::from_secs(60);

/// Reads queued at the paused node, of each consistency that asks the leader.
const READS_EACH: usize = 8;

async fn scenario(cluster: &mut Cluster, _seed: u64) -> anyhow::Result<()> {
    let all = cluster.ids();
    let old = cluster.wait_leader(&all, STEP).await?;
    cluster.api(old.id)?.kv_put("k", b"before", None).await?;
    let addr = cluster
        .endpoints()
        .get(old.id)
        .ok_or_else(|| anyhow::anyhow!("node {} has no address", old.id))?;
    cluster.pause(old.id)?;
    // Queued first, before the others elect a leader: at the front of the queue, the paused
    // node handles them before it learns that another leads (they were answered 503
    // `no_leader`: a leader without a quorum's acknowledgements, which it could not read).
    let early = queue_reads_at(addr).await;
    let queued = queue_reads(cluster, old.id, addr).await;
    cluster.resume(old.id)?;
    let (early, queued) = (early?, queued?);
    let mut refused = Vec::new();
    for (path, read) in early {
        let (status, body) = read.finish(STEP).await?;
        // Sent before the write of `after`: either value.
        if status != 200 || !matches!(body.as_str(), "before" | "after") {
            refused.push(format!("{path} (early): {status} {body}"));
        }
    }
    for (path, read) in queued {
        let (status, body) = read.finish(STEP).await?;
        if status != 200 || body != "after" {
            refused.push(format!("{path}: {status} {body}"));
        }
    }
    anyhow::ensure!(
        refused.is_empty(),
        "reads queued at the paused old leader failed: {refused:#?}"
    );
    let settled = cluster.wait_leader(&all, STEP).await?;
    let value = cluster
        .api(old.id)?
        .kv_get("k", Consistency::Linearizable)
        .await?;
    anyhow::ensure!(
        value.as_ref().is_some_and(|(v, _)| v == b"after"),
        "node {} read {value:?} after it rejoined (node {} leads)",
        old.id,
        settled.id
    );
    Ok(())
}

/// Queues reads of each consistency that asks the leader at `addr`, the paused node.
async fn queue_reads_at(addr: std::net::SocketAddr) -> anyhow::Result<Vec<(String, HeldRequest)>> {
    let mut queued = Vec::new();
    for consistency in ["linearizable", "lease"] {
        for _ in 0..READS_EACH {
            let path = format!("/v1/kv/k?consistency={consistency}");
            queued.push((
                path.clone(),
                HeldRequest::send_whole(addr, "GET", &path).await?,
            ));
        }
    }
    Ok(queued)
}

/// While node `paused` is paused: waits for the others to elect a leader, writes `after` there
/// and queues reads of it at `addr`, the paused node.
async fn queue_reads(
    cluster: &Cluster,
    paused: u64,
    addr: std::net::SocketAddr,
) -> anyhow::Result<Vec<(String, HeldRequest)>> {
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != paused)
        .collect();
    let new = cluster.wait_leader(&others, STEP).await?;
    let revision = cluster.api(new.id)?.kv_put("k", b"after", None).await?;
    note(format!(
        "node {paused} paused; node {} leads at term {} and wrote k at {revision}",
        new.id, new.term
    ));
    queue_reads_at(addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_queued_at_a_paused_leader_go_to_the_new_one() {
    run_scenario(
        "reads_queued_at_a_paused_leader_go_to_the_new_one",
        "leader-paused",
        ClusterConfig::default(),
        Duration::from_secs(180),
        scenario,
    )
    .await;
}
