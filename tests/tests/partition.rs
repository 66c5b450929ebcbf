//! Scenario 3: the leader is cut off from both other nodes by the proxies that carry all traffic
//! between nodes. It cannot commit and stops acting as leader; the majority elects a leader and keeps
//! accepting writes; after the heal the cluster reconverges. Throughout, linearizable reads (by
//! read index or by the leader's lease) never return a state older than a write acknowledged
//! before the read began.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meta_tests::run_scenario;
use meta_tests::{
    note, Api, Cluster, ClusterConfig, LinearizableWorkload, Model, Storm, StormConfig,
};

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
    let reads =
        LinearizableWorkload::start(cluster.endpoints(), cluster.http(), "lin/", 3, 6, seed);
    storm.wait_progress(1_000, STEP).await?;

    let all = cluster.ids();
    let old = cluster.wait_leader(&all, STEP).await?;
    let reads_before = reads.reads();
    cluster.isolate(old.id);
    // From the moment it is cut off, writes sent to the isolated leader are never acknowledged,
    // whatever role it reports meanwhile.
    let probes = tokio::spawn(probe_writes(
        cluster.api(old.id)?.with_timeout(Duration::from_secs(15)),
        PROBE_WINDOW,
    ));
    let majority: Vec<u64> = all.iter().copied().filter(|id| *id != old.id).collect();
    let new = cluster.wait_leader(&majority, STEP).await?;
    anyhow::ensure!(
        new.id != old.id && new.term > old.term,
        "the majority did not elect: {new:?}"
    );
    note(format!(
        "node {} isolated at term {}; node {} leads at term {}",
        old.id, old.term, new.id, new.term
    ));

    // The isolated node never acknowledges a write, and stops acting as leader: it reports another
    // role, or refuses writes with 503 `no_leader`. A failure here is kept and reported at the end,
    // so the rest of the scenario still runs.
    let isolated = cluster.api(old.id)?.with_timeout(Duration::from_secs(15));
    let step_down = step_down(&isolated).await;
    match &step_down {
        Ok(how) => note(format!("isolated node {}: {how}", old.id)),
        Err(err) => note(format!("isolated node {}: {err:#}", old.id)),
    }

    let refused = probes.await??;
    note(format!(
        "isolated node {}: refused {refused} write(s) sent to it in the first {PROBE_WINDOW:?}",
        old.id
    ));

    storm.wait_progress(1_000, STEP).await?;
    let reads_in_partition = reads.reads() - reads_before;

    cluster.heal();
    let healed = cluster.wait_leader(&all, STEP).await?;
    note(format!(
        "healed: node {} leads at term {}",
        healed.id, healed.term
    ));
    storm.wait_progress(500, STEP).await?;

    let history = reads.stop().await?;
    let violations = history.violations();
    anyhow::ensure!(
        violations.is_empty(),
        "{} linearizability violations, first: {:?}",
        violations.len(),
        &violations[..violations.len().min(10)]
    );
    anyhow::ensure!(
        reads_in_partition > 0 && history.reads.len() > reads_before + reads_in_partition,
        "too few reads recorded: {reads_before} before the partition, {reads_in_partition} during"
    );
    note(format!("checked {}", history.summary()));

    let model = storm.stop().await?.lock().unwrap().clone();
    cluster.assert_converged(&all, &model, "storm/").await?;
    step_down.map(|_| ())
}

/// How long writes are sent to the isolated leader from the moment it is cut off: longer than
/// its lease and the two election timeouts after which it gives writes up.
const PROBE_WINDOW: Duration = Duration::from_secs(6);

/// Sends writes to the isolated node, one after another, for `window`; fails if any is
/// acknowledged. Returns how many got an answer refusing them (at least one must).
async fn probe_writes(isolated: Api, window: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + window;
    let (mut refused, mut unanswered) = (0u64, 0u64);
    for probe in 0.. {
        let key = format!("probe/cut-{probe}");
        match isolated.kv_put(&key, b"from the minority", None).await {
            Ok(revision) => {
                anyhow::bail!("the isolated leader acknowledged {key} at revision {revision}")
            }
            Err(err) if err.status().is_some() => refused += 1,
            Err(_) => unanswered += 1,
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(
        refused > 0,
        "no write sent to the isolated leader was answered ({unanswered} got no answer)"
    );
    Ok(refused)
}

/// Waits until the isolated leader stops acting as leader; fails at once if it acknowledges a
/// write.
async fn step_down(isolated: &Api) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    for probe in 0.. {
        let status = isolated.cluster().await?;
        if !status.is_leader() {
            return Ok(format!("reports role {}", status.role));
        }
        let key = format!("probe/{probe}");
        let started = Instant::now();
        match isolated.kv_put(&key, b"from the minority", None).await {
            Ok(revision) => {
                anyhow::bail!("the isolated leader acknowledged {key} at revision {revision}")
            }
            Err(err) if err.code() == Some("no_leader") => {
                return Ok(format!("refuses writes: {err}"));
            }
            Err(err) => last = format!("{err} after {:?}", started.elapsed()),
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    anyhow::bail!(
        "the isolated leader still reports role leader after 30 s and does not refuse writes with \
         no_leader; last write answered: {last}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_steps_down_and_reads_stay_linearizable() {
    run_scenario(
        "partitioned_leader",
        "partition",
        ClusterConfig::default(),
        Duration::from_secs(240),
        scenario,
    )
    .await;
}
