//! The restart storm: every datanode registers itself and then all its shards in batches, all
//! datanodes at once, while admin reads run; measures time to register everything, request latency,
//! admin-read latency, peak RSS of each server and the leader's WAL records per barrier.
//!
//! The same storm runs twice on one cluster: first into an empty registry ([`Pass::Fresh`]), then
//! again into the full one ([`Pass::Again`]): every datanode comes back having lost one replica in
//! [`LOST_EVERY`], reports the rest under a new epoch and prunes, as after a whole-cluster restart.
//! In the second, every datanode also sends a heartbeat a second while it reports, as a live one
//! would (the first is the workload as specified).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use super::admin_probe::AdminProbe;
use super::api::{Api, CallError, ShardSpec};
use super::cluster::Cluster;
use super::cpu_usage::{Cores, CpuUsage};
use super::options::Arm;
use super::single::register_datanode;
use super::wal_figures::WalFigures;
use crate::report::percentile;

/// How long one batch may keep being retried (no leader, timeouts) before the storm fails.
pub(super) const BATCH_DEADLINE: Duration = Duration::from_secs(120);

/// Replicas per shard in the generated layout: datanodes 1-3 hold shards of group 0, 4-6 group 1, ...
const REPLICATION: u64 = 3;

/// How often each datanode sends a heartbeat while it reports.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// One replica in this many is gone when the datanodes come back in [`Pass::Again`].
pub(super) const LOST_EVERY: u64 = 100;

/// Which storm of a cluster this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Into an empty registry: every replica is new.
    Fresh,
    /// Into the registry the fresh storm filled: every datanode registers again, reports what it
    /// still holds (all but one replica in [`LOST_EVERY`], each unchanged) and prunes the rest.
    Again,
}

impl Pass {
    /// Whether the datanode still holds its `k`-th shard in this pass.
    fn holds(self, k: u64) -> bool {
        self == Pass::Fresh || k % LOST_EVERY != LOST_EVERY - 1
    }
}

/// The measurements of one storm.
#[derive(Clone, Debug)]
pub struct StormPoint {
    pub arm: Arm,
    pub round: usize,
    pub pass: Pass,
    pub datanodes: u64,
    /// Replicas reported.
    pub replicas: u64,
    /// Replicas the prunes dropped (none in the fresh pass).
    pub pruned: u64,
    /// Latency of the prunes (again pass only).
    pub prune_p50_ms: Option<f64>,
    pub prune_p99_ms: Option<f64>,
    /// Latency of the heartbeats the datanodes send while they report (one a second each,
    /// the first right after registering), and how many failed.
    pub heartbeat_p50_ms: Option<f64>,
    pub heartbeat_p99_ms: Option<f64>,
    pub heartbeat_errors: u64,
    /// From the first request to the last acknowledged batch (and prune).
    pub seconds: f64,
    pub per_sec: f64,
    /// Latency of the shard-batch requests.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub admin_shard_p50_ms: f64,
    pub admin_shard_p99_ms: f64,
    pub admin_cluster_p50_ms: f64,
    pub admin_cluster_p99_ms: f64,
    /// All admin reads together.
    pub admin_p50_ms: f64,
    pub admin_p99_ms: f64,
    /// Admin reads answered (not counting the failed and the skipped).
    pub admin_reads: usize,
    pub admin_errors: u64,
    /// Admin reads not sent: too many were outstanding, or the probe did not run in time.
    pub admin_skipped: u64,
    /// Latency of the admin key writes (a failed or unsent one counts as slower than any).
    pub admin_write_p50_ms: f64,
    pub admin_write_p99_ms: f64,
    /// Peak RSS by member id, MiB.
    pub peak_rss_mib: Vec<(u64, f64)>,
    pub records_per_barrier: Option<f64>,
    /// Batch requests that had to be sent again (no leader, timeout, connection trouble).
    pub retries: u64,
    /// Whether every member's replica count matched what was acknowledged.
    pub verified: bool,
    /// Cores used by the client and the servers while the storm ran.
    pub cores: Cores,
}

/// What one datanode task measured.
struct DatanodeTally {
    latencies_ms: Vec<f64>,
    retries: u64,
    pruned: u64,
    prune_ms: Option<f64>,
    heartbeat_ms: Vec<f64>,
    heartbeat_errors: u64,
    finished: Instant,
}

/// The restart storm on one fresh cluster.
pub struct StormWorkload<'a> {
    pub cluster: &'a mut Cluster,
    pub api: &'a Api,
    pub arm: Arm,
    pub round: usize,
    pub pass: Pass,
    pub datanodes: u64,
    pub shards_per_datanode: u64,
    pub batch: u64,
    pub admin_interval: Duration,
    /// `?consistency=` of the shard reads.
    pub admin_consistency: String,
}

impl StormWorkload<'_> {
    /// Runs the storm; `bar` counts registered replicas.
    pub async fn run(&mut self, bar: &ProgressBar) -> Result<StormPoint> {
        let held = (0..self.shards_per_datanode)
            .filter(|&k| self.pass.holds(k))
            .count() as u64;
        let replicas = self.datanodes * held;
        let bases = self.cluster.bases_leader_first();
        let leader = self.cluster.leader();
        let leader_base = self.cluster.base(leader).to_string();
        let before = WalFigures::read(self.api, &leader_base).await;
        let groups = self.datanodes.div_ceil(REPLICATION);
        let probe = AdminProbe::start(
            self.api,
            bases.clone(),
            groups * self.shards_per_datanode,
            self.admin_interval,
            &self.admin_consistency,
        )?;

        bar.set_length(replicas);
        bar.set_position(0);
        let pids: Vec<u32> = self.cluster.pids().into_iter().map(|(_, p)| p).collect();
        let cpu = CpuUsage::start(&pids);
        let start = Instant::now();
        // Each datanode has an HTTP client of its own, as separate datanode processes do: its
        // connection closes when it is done, instead of idling in a pool shared with the others
        // while it holds one of the server's connection slots.
        let tasks: Vec<_> = (1..=self.datanodes)
            .map(|datanode| {
                let base = bases[(datanode as usize) % bases.len()].clone();
                Ok(tokio::spawn(datanode_storm(
                    self.api.fresh()?,
                    base,
                    datanode,
                    self.shards_per_datanode,
                    self.batch,
                    self.pass,
                    bar.clone(),
                )))
            })
            .collect::<Result<_>>()?;
        let mut latencies = Vec::with_capacity((replicas / self.batch + 1) as usize);
        let mut retries = 0;
        let mut pruned = 0;
        let mut prune_ms = Vec::new();
        let mut heartbeat_ms = Vec::new();
        let mut heartbeat_errors = 0;
        let mut finished = start;
        let mut failure = None;
        for t in tasks {
            match t.await.context("a datanode task panicked")? {
                Ok(tally) => {
                    latencies.extend(tally.latencies_ms);
                    retries += tally.retries;
                    pruned += tally.pruned;
                    prune_ms.extend(tally.prune_ms);
                    heartbeat_ms.extend(tally.heartbeat_ms);
                    heartbeat_errors += tally.heartbeat_errors;
                    finished = finished.max(tally.finished);
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        let cores = cpu.cores();
        let admin = probe.stop().await;
        self.cluster.check_alive()?;
        if let Some(e) = failure {
            return Err(e);
        }
        let admin = admin?;
        let seconds = (finished - start).as_secs_f64();

        let after_leader = self.cluster.refresh_leader(self.api).await;
        let records_per_barrier = if after_leader != leader {
            eprintln!("storm: the leader changed during the storm ({leader} -> {after_leader}); no records per barrier");
            None
        } else {
            let after = WalFigures::read(self.api, &leader_base).await;
            match (before, after) {
                (Ok(b), Ok(a)) => Some(b.records_per_barrier(&a)),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("storm: leader WAL figures: {e}");
                    None
                }
            }
        };
        // Every member counts from its own registry (a follower answers a linearizable read
        // once it applied the leader's read index), so a member that applied differently shows.
        let mut verified = true;
        // Each datanode holds what it reported, not only the total.
        for base in &bases {
            let counts =
                self.api.replica_counts(base).await.map_err(|e| {
                    anyhow::anyhow!("count replicas at {base} after the storm: {e}")
                })?;
            let registered: u64 = counts.values().sum();
            let wrong: Vec<(u64, u64)> = (1..=self.datanodes)
                .map(|d| (d, counts.get(&d).copied().unwrap_or(0)))
                .filter(|(_, n)| *n != held)
                .collect();
            if registered != replicas || !wrong.is_empty() {
                verified = false;
                eprintln!(
                    "storm: {base} holds {registered} replicas after the storm; {replicas} were \
                     acknowledged, {held} for each datanode; (datanode, count) off: {:?}",
                    &wrong[..wrong.len().min(5)]
                );
            }
        }
        // After the counts: the followers apply the storm's tail before they answer them, and
        // their peak may come then.
        let peak_rss_mib = self.cluster.peak_rss_mib()?;
        if admin.errors > 0 {
            eprintln!(
                "storm: {} admin read(s) failed; last: {}",
                admin.errors,
                admin.last_error.as_deref().unwrap_or("?")
            );
        }

        // A read that failed or was never sent counts as slower than any: more than 1% of
        // them and the p99 is infinite.
        let unanswered = (admin.errors + admin.skipped) as usize;
        let answered = admin.shard_ms.len() + admin.cluster_ms.len();
        let mut all_admin: Vec<f64> = admin
            .shard_ms
            .iter()
            .chain(&admin.cluster_ms)
            .copied()
            .chain(std::iter::repeat_n(f64::INFINITY, unanswered))
            .collect();
        let mut shard_ms = admin.shard_ms;
        let mut cluster_ms = admin.cluster_ms;
        let unsent = admin.write_unanswered as usize;
        let mut write_ms: Vec<f64> = admin.write_ms;
        write_ms.extend(std::iter::repeat_n(f64::INFINITY, unsent));
        Ok(StormPoint {
            arm: self.arm,
            round: self.round,
            pass: self.pass,
            datanodes: self.datanodes,
            replicas,
            pruned,
            prune_p50_ms: (!prune_ms.is_empty()).then(|| percentile(&mut prune_ms, 0.50)),
            prune_p99_ms: (!prune_ms.is_empty()).then(|| percentile(&mut prune_ms, 0.99)),
            heartbeat_p50_ms: (!heartbeat_ms.is_empty())
                .then(|| percentile(&mut heartbeat_ms, 0.50)),
            heartbeat_p99_ms: (!heartbeat_ms.is_empty())
                .then(|| percentile(&mut heartbeat_ms, 0.99)),
            heartbeat_errors,
            seconds,
            per_sec: replicas as f64 / seconds,
            p50_ms: percentile(&mut latencies, 0.50),
            p99_ms: percentile(&mut latencies, 0.99),
            admin_shard_p50_ms: percentile(&mut shard_ms, 0.50),
            admin_shard_p99_ms: percentile(&mut shard_ms, 0.99),
            admin_cluster_p50_ms: percentile(&mut cluster_ms, 0.50),
            admin_cluster_p99_ms: percentile(&mut cluster_ms, 0.99),
            admin_p50_ms: percentile(&mut all_admin, 0.50),
            admin_p99_ms: percentile(&mut all_admin, 0.99),
            admin_reads: answered,
            admin_errors: admin.errors,
            admin_skipped: admin.skipped,
            admin_write_p50_ms: percentile(&mut write_ms, 0.50),
            admin_write_p99_ms: percentile(&mut write_ms, 0.99),
            peak_rss_mib,
            records_per_barrier,
            retries,
            verified,
            cores,
        })
    }
}

/// One datanode coming back: registers itself (new epoch), then the shards it holds batch after
/// batch; in [`Pass::Again`], then prunes.
async fn datanode_storm(
    api: Api,
    base: String,
    datanode: u64,
    shards: u64,
    batch: u64,
    pass: Pass,
    bar: ProgressBar,
) -> Result<DatanodeTally> {
    let epoch = register_datanode(&api, &base, datanode).await?;
    let first_shard = (datanode - 1) / REPLICATION * shards;
    let mut tally = DatanodeTally {
        latencies_ms: Vec::with_capacity(shards.div_ceil(batch) as usize),
        retries: 0,
        pruned: 0,
        prune_ms: None,
        heartbeat_ms: Vec::new(),
        heartbeat_errors: 0,
        finished: Instant::now(),
    };
    // The fresh storm is the workload as specified; the second pass adds what live
    // datanodes also send.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let heartbeats = (pass == Pass::Again).then(|| {
        tokio::spawn(heartbeats(
            api.clone(),
            base.clone(),
            datanode,
            epoch,
            stopped,
        ))
    });
    let held: Vec<ShardSpec> = (0..shards)
        .filter(|&k| pass.holds(k))
        .map(|k| ShardSpec {
            id: first_shard + k,
            generation: 1,
            size: (64 << 20) + k,
        })
        .collect();
    for specs in held.chunks(batch as usize) {
        let n = specs.len() as u64;
        let (reply, ms) = retried(&bar, datanode, &mut tally, "register a batch", || {
            api.register_shards(&base, datanode, epoch, specs)
        })
        .await?;
        tally.latencies_ms.push(ms);
        let changed = match pass {
            Pass::Fresh => 0,
            Pass::Again => reply.accepted,
        };
        if !reply.stale.is_empty() || reply.accepted + reply.unchanged != n || changed != 0 {
            bail!("datanode {datanode}: batch of {n} answered {reply:?} ({pass:?})");
        }
        bar.inc(n);
    }
    if pass == Pass::Again {
        // A prune sent again after a lost answer drops nothing more: the registry's count is
        // what the run checks.
        let (pruned, ms) = retried(&bar, datanode, &mut tally, "prune", || {
            api.prune(&base, datanode, epoch)
        })
        .await?;
        tally.pruned = pruned;
        tally.prune_ms = Some(ms);
    }
    tally.finished = Instant::now();
    let _ = stop.send(true);
    if let Some(heartbeats) = heartbeats {
        (tally.heartbeat_ms, tally.heartbeat_errors) =
            heartbeats.await.context("the heartbeat task panicked")?;
    }
    Ok(tally)
}

/// Sends a heartbeat every [`HEARTBEAT_INTERVAL`] (the first at once) until `stop` says so;
/// returns their latencies in ms and how many failed.
async fn heartbeats(
    api: Api,
    base: String,
    datanode: u64,
    epoch: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Vec<f64>, u64) {
    let mut ticks = tokio::time::interval(HEARTBEAT_INTERVAL);
    let (mut latencies, mut errors) = (Vec::new(), 0);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return (latencies, errors),
        }
        let sent = Instant::now();
        match api.heartbeat(&base, datanode, epoch).await {
            Ok(()) => latencies.push(sent.elapsed().as_secs_f64() * 1e3),
            Err(_) => errors += 1,
        }
    }
}

/// Sends a request until it is answered (retrying what may succeed later, for up to
/// [`BATCH_DEADLINE`]); returns the answer and its latency in ms from the first attempt.
async fn retried<T, F, Fut>(
    bar: &ProgressBar,
    datanode: u64,
    tally: &mut DatanodeTally,
    what: &str,
    mut call: F,
) -> Result<(T, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    // The latency is the datanode's: from the first attempt to the answer, retries and the
    // pauses between them included.
    let first = Instant::now();
    let deadline = first + BATCH_DEADLINE;
    loop {
        match call().await {
            Ok(reply) => {
                return Ok((reply, first.elapsed().as_secs_f64() * 1e3));
            }
            Err(CallError::Retryable(e)) if Instant::now() < deadline => {
                tally.retries += 1;
                if tally.retries == 1 {
                    bar.suspend(|| eprintln!("storm: datanode {datanode} retries ({what}): {e}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => bail!("datanode {datanode}: {what}: {e}"),
        }
    }
}
