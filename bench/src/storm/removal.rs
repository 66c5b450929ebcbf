//! A large removal (`--workload removal`): one datanode registers `--removal-replicas` shards,
//! then `DELETE /v1/datanodes/{id}`, sent to a follower, removes it while the admin probes read
//! (`admin_probe.rs`). Measures how long the removal took and the admin reads' latency while it
//! ran: a removal in one log entry holds up every entry behind it for its whole apply, one in
//! pieces for a piece's. To compare two server builds, give the second as `--compare-binary`:
//! rounds alternate A B, then B A, in one run, and the medians and the paired ratios of each
//! round are printed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::task::JoinSet;

use super::admin_probe::AdminProbe;
use super::api::{Api, ShardSpec};
use super::cluster::Cluster;
use super::single::register_datanode;
use crate::report::{median, percentile, print_table};

/// The datanode that is registered and removed.
const DATANODE: u64 = 1;
/// Registration requests in flight while the datanode's shards are registered.
const IN_FLIGHT: usize = 8;

/// One measured removal.
#[derive(Clone, Debug)]
pub struct RemovalPoint {
    pub round: usize,
    /// Which server build ran: 0 for A (`--server-binary` or the cargo build), 1 for B
    /// (`--compare-binary`).
    pub build: usize,
    pub replicas: u64,
    /// From the DELETE's start to its answer.
    pub seconds: f64,
    pub admin_p50_ms: f64,
    pub admin_p99_ms: f64,
    pub admin_max_ms: f64,
    pub admin_reads: usize,
    /// Admin reads that failed or were not sent (a stalled server).
    pub admin_failed: u64,
}

/// Registers [`DATANODE`] with `replicas` shards in batches of `batch` through the leader,
/// then removes it through a follower while the admin probes (a read every `admin_interval`)
/// run.
pub async fn run(
    cluster: &Cluster,
    api: &Api,
    round: usize,
    replicas: u64,
    batch: u64,
    admin_interval: Duration,
    admin_consistency: &str,
) -> Result<RemovalPoint> {
    let leader = cluster.base(cluster.leader()).to_string();
    let bases = cluster.bases_leader_first();
    let follower = bases.get(1).context("a follower")?.clone();
    let epoch = register_datanode(api, &leader, DATANODE).await?;
    // IN_FLIGHT tasks, each taking the next batch until all are registered.
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (api, leader, next) = (api.clone(), leader.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= replicas {
                    return Ok::<(), anyhow::Error>(());
                }
                let shards: Vec<ShardSpec> = (first..(first + batch).min(replicas))
                    .map(|id| ShardSpec {
                        id,
                        generation: 1,
                        size: 64 << 20,
                    })
                    .collect();
                api.register_shards(&leader, DATANODE, epoch, &shards)
                    .await
                    .context("register the datanode's shards")?;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.context("a registering task")??;
    }

    let probe = AdminProbe::start(api, bases, replicas, admin_interval, admin_consistency)?;
    // Let the probes run a little before, so the reads around the removal's start count too.
    tokio::time::sleep(admin_interval * 10).await;
    let start = Instant::now();
    let removed = api.remove_datanode(&follower, DATANODE).await;
    let seconds = start.elapsed().as_secs_f64();
    tokio::time::sleep(admin_interval * 10).await;
    let admin = probe.stop().await;
    let removed = removed.context("remove the datanode")?;
    let mut admin = admin?;
    anyhow::ensure!(
        removed == replicas,
        "the removal dropped {removed} replicas of {replicas}"
    );
    let admin_reads = admin.shard_ms.len() + admin.cluster_ms.len();
    // A read that failed or was never sent counts as slower than any, as in the storm: a build
    // that stalls must not get a lower p99 for the samples it lost.
    let unanswered = (admin.errors + admin.skipped) as usize;
    let mut all: Vec<f64> = admin
        .shard_ms
        .drain(..)
        .chain(admin.cluster_ms.drain(..))
        .chain(std::iter::repeat_n(f64::INFINITY, unanswered))
        .collect();
    Ok(RemovalPoint {
        round,
        build: 0,
        replicas,
        seconds,
        admin_p50_ms: percentile(&mut all, 0.50),
        admin_p99_ms: percentile(&mut all, 0.99),
        admin_max_ms: percentile(&mut all, 1.0),
        admin_reads,
        admin_failed: admin.errors + admin.skipped,
    })
}

/// Prints every removal and the medians.
pub fn print(points: &[RemovalPoint]) {
    println!("\n### A large removal, every run\n");
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                (p.round + 1).to_string(),
                BUILDS[p.build].to_string(),
                p.replicas.to_string(),
                format!("{:.2}", p.seconds),
                format!("{:.2}", p.admin_p50_ms),
                format!("{:.2}", p.admin_p99_ms),
                format!("{:.2}", p.admin_max_ms),
                p.admin_reads.to_string(),
                p.admin_failed.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "round",
            "build",
            "replicas",
            "removal s",
            "admin p50 ms",
            "admin p99 ms",
            "admin max ms",
            "admin reads",
            "failed or not sent",
        ],
        &rows,
    );
    for (build, name) in BUILDS.iter().enumerate() {
        let runs: Vec<&RemovalPoint> = points.iter().filter(|p| p.build == build).collect();
        if runs.is_empty() {
            continue;
        }
        let m =
            |g: fn(&RemovalPoint) -> f64| median(&runs.iter().map(|p| g(p)).collect::<Vec<_>>());
        println!(
            "\nbuild {name} medians: removal {:.2} s, admin p99 {:.2} ms, admin max {:.2} ms",
            m(|p| p.seconds),
            m(|p| p.admin_p99_ms),
            m(|p| p.admin_max_ms)
        );
    }
    let pairs = paired(points);
    if !pairs.is_empty() {
        let ratio = |g: fn(&RemovalPoint) -> f64| {
            median(&pairs.iter().map(|(a, b)| g(b) / g(a)).collect::<Vec<_>>())
        };
        println!(
            "B / A, median of the {} rounds' ratios: removal time {:.2}, admin p99 {:.2}",
            pairs.len(),
            ratio(|p| p.seconds),
            ratio(|p| p.admin_p99_ms)
        );
    }
}

/// The names of the two builds.
pub const BUILDS: [&str; 2] = ["A", "B"];

/// Each round's run of build A with its run of build B.
fn paired(points: &[RemovalPoint]) -> Vec<(&RemovalPoint, &RemovalPoint)> {
    points
        .iter()
        .filter(|a| a.build == 0)
        .filter_map(|a| {
            points
                .iter()
                .find(|b| b.build == 1 && b.round == a.round)
                .map(|b| (a, b))
        })
        .collect()
}
