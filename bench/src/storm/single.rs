//! The single-shard workload: N concurrent clients, each registering one shard per request in a
//! closed loop, spread over all members; measures registrations per second and request latency.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::api::{Api, CallError, ShardSpec};
use super::cluster::Cluster;
use super::cpu_usage::{Cores, CpuUsage};
use super::options::Arm;
use super::wal_figures::WalFigures;
use crate::report::percentile;

/// How long a datanode keeps retrying its registration (no leader, timeouts, connection
/// trouble, overload): as long as a storm batch may, since a datanode that gave up sooner
/// would fail a storm whose connections wait for the servers' slots.
const REGISTER_DEADLINE: Duration = super::restart::BATCH_DEADLINE;

/// Which members the clients of one point talk to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Spread over all members, the leader first: one client talks to the leader, more clients
    /// spread evenly, so that most of them are forwarded.
    Spread,
    /// Every client talks to a follower, so every write is forwarded to the leader.
    Follower,
}

impl Route {
    /// How the tables name the point's client count.
    pub fn label(self, clients: usize) -> String {
        match self {
            Route::Spread => clients.to_string(),
            Route::Follower => format!("{clients} via a follower"),
        }
    }
}

/// One measured point of the single-shard workload.
#[derive(Clone, Debug)]
pub struct SinglePoint {
    pub arm: Arm,
    pub round: usize,
    pub clients: usize,
    pub route: Route,
    /// Registrations acknowledged per second in the measured window.
    pub per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Requests that failed in the measured window (not in the latencies, nor in `per_sec`).
    pub errors: u64,
    /// Leader WAL records per barrier in the window, when the metrics could be read and the
    /// leader did not change.
    pub records_per_barrier: Option<f64>,
    /// Cores used by the client and the servers in the window.
    pub cores: Cores,
}

/// What one client measured.
#[derive(Default)]
pub(super) struct ClientTally {
    pub latencies_ms: Vec<f64>,
    pub errors: u64,
    pub last_error: Option<String>,
}

impl ClientTally {
    /// Joins the clients' tallies into one; fails if no `what` (a request) succeeded, and
    /// reports failed ones on stderr.
    pub(super) async fn gather(
        clients: Vec<tokio::task::JoinHandle<ClientTally>>,
        what: &str,
    ) -> Result<ClientTally> {
        let count = clients.len();
        let mut all = ClientTally::default();
        for c in clients {
            let tally = c.await.context("a client task failed")?;
            all.latencies_ms.extend(tally.latencies_ms);
            all.errors += tally.errors;
            all.last_error = tally.last_error.or(all.last_error);
        }
        if all.latencies_ms.is_empty() {
            bail!(
                "no {what} succeeded with {count} client(s); last error: {}",
                all.last_error.as_deref().unwrap_or("none")
            );
        }
        if let Some(e) = &all.last_error {
            eprintln!(
                "storm: {} failed {what}(s) with {count} client(s); last: {e}",
                all.errors
            );
        }
        Ok(all)
    }
}

/// The single-shard workload at one client count.
pub struct SingleWorkload<'a> {
    pub cluster: &'a mut Cluster,
    pub api: &'a Api,
    pub arm: Arm,
    pub round: usize,
    pub warmup: Duration,
    pub measure: Duration,
}

impl SingleWorkload<'_> {
    /// Registers one datanode per client (datanode ids from `first_datanode`), then runs `clients`
    /// closed-loop writers for the warm-up plus the measured window and returns the point.
    pub async fn run(
        &mut self,
        clients: usize,
        first_datanode: u64,
        route: Route,
    ) -> Result<SinglePoint> {
        let mut bases = self.cluster.bases_leader_first();
        if route == Route::Follower {
            bases.remove(0);
        }
        let mut targets = Vec::with_capacity(clients);
        for c in 0..clients {
            let base = bases[c % bases.len()].clone();
            let datanode = first_datanode + c as u64;
            let epoch = register_datanode(self.api, &base, datanode).await?;
            targets.push((base, datanode, epoch));
        }
        let leader = self.cluster.leader();
        let leader_base = self.cluster.base(leader).to_string();
        let start = Instant::now();
        let measure_from = start + self.warmup;
        let end = measure_from + self.measure;
        let workers: Vec<_> = targets
            .into_iter()
            .map(|(base, datanode, epoch)| {
                // A client of its own, as a separate datanode process has.
                let api = self.api.fresh()?;
                Ok(tokio::spawn(client_loop(
                    api,
                    base,
                    datanode,
                    epoch,
                    measure_from,
                    end,
                )))
            })
            .collect::<Result<_>>()?;

        tokio::time::sleep_until(measure_from.into()).await;
        let before = WalFigures::read(self.api, &leader_base).await;
        let pids: Vec<u32> = self.cluster.pids().into_iter().map(|(_, p)| p).collect();
        let cpu = CpuUsage::start(&pids);
        tokio::time::sleep_until(end.into()).await;
        let cores = cpu.cores();
        let after = WalFigures::read(self.api, &leader_base).await;

        let ClientTally {
            latencies_ms: mut latencies,
            errors,
            ..
        } = ClientTally::gather(workers, "registration").await?;
        self.cluster.check_alive()?;
        // Figures of a member that stopped leading in the window are not the leader's.
        let after_leader = self.cluster.refresh_leader(self.api).await;
        let records_per_barrier = match (before, after) {
            _ if after_leader != leader => {
                eprintln!(
                    "storm: the leader changed in the window ({leader} -> {after_leader}); no \
                     records per barrier"
                );
                None
            }
            (Ok(b), Ok(a)) => Some(b.records_per_barrier(&a)),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("storm: leader WAL figures: {e}");
                None
            }
        };
        let per_sec = latencies.len() as f64 / self.measure.as_secs_f64();
        Ok(SinglePoint {
            arm: self.arm,
            round: self.round,
            clients,
            route,
            per_sec,
            p50_ms: percentile(&mut latencies, 0.50),
            p99_ms: percentile(&mut latencies, 0.99),
            errors,
            records_per_barrier,
            cores,
        })
    }
}

/// Registers a datanode, retrying while the cluster cannot answer, for up to [`REGISTER_DEADLINE`].
pub async fn register_datanode(api: &Api, base: &str, datanode: u64) -> Result<u64> {
    let deadline = Instant::now() + REGISTER_DEADLINE;
    loop {
        match api
            .register_datanode(
                base,
                datanode,
                &format!("127.0.0.1:{}", 20_000 + datanode % 40_000),
            )
            .await
        {
            Ok(epoch) => return Ok(epoch),
            Err(CallError::Retryable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => bail!("register datanode {datanode}: {e}"),
        }
    }
}

/// One client: registers shard after shard until `end`; keeps the latencies of requests that
/// completed in `[measure_from, end]`.
async fn client_loop(
    api: Api,
    base: String,
    datanode: u64,
    epoch: u64,
    measure_from: Instant,
    end: Instant,
) -> ClientTally {
    let mut tally = ClientTally::default();
    let mut next_shard = datanode << 32;
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let shard = ShardSpec {
            id: next_shard,
            generation: 1,
            size: 64 << 20,
        };
        next_shard += 1;
        let result = api.register_shards(&base, datanode, epoch, &[shard]).await;
        let done = Instant::now();
        let counted = done >= measure_from && done <= end;
        match result {
            Ok(reply) if reply.accepted == 1 => {
                if counted {
                    tally.latencies_ms.push((done - sent).as_secs_f64() * 1e3);
                }
            }
            Ok(reply) => {
                if counted {
                    tally.errors += 1;
                }
                tally.last_error = Some(format!("shard {} not accepted: {reply:?}", shard.id));
            }
            Err(e) => {
                if counted {
                    tally.errors += 1;
                }
                tally.last_error = Some(e.to_string());
                // Do not spin on a cluster that has no leader for a moment.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}
