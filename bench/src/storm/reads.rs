//! The read workload (`--workload reads`): N concurrent clients, each reading one shard's
//! replica set per request (`GET /v1/shards/{id}`, linearizable) in a closed loop, spread over
//! all members, against a registry of [`SHARDS`] shards; measures reads per second and request
//! latency.
//!
//! Two arms, interleaved: `follower` (the servers' default: a follower answers a read itself once
//! it applied the leader's read index) and `replay` (`--follower-reads false`: a follower replays
//! every read at the leader).

use std::time::{Duration, Instant};

use anyhow::Result;

use super::api::{Api, ShardSpec};
use super::cluster::Cluster;
use super::cpu_usage::{Cores, CpuUsage};
use super::single::{register_datanode, ClientTally};
use crate::report::{median, percentile, print_table};

/// Shards registered before the reads start; each read asks for one of them.
pub const SHARDS: u64 = 10_000;

/// How followers answer linearizable reads in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadArm {
    /// With the leader's read index, from their own registry (the default).
    Follower,
    /// By replaying every read at the leader (`--follower-reads false`).
    Replay,
}

impl ReadArm {
    pub const ALL: [ReadArm; 2] = [ReadArm::Follower, ReadArm::Replay];

    pub fn name(self) -> &'static str {
        match self {
            ReadArm::Follower => "follower",
            ReadArm::Replay => "replay",
        }
    }

    /// The server flags that select the arm.
    pub fn server_flags(self) -> &'static [&'static str] {
        match self {
            ReadArm::Follower => &[],
            ReadArm::Replay => &["--follower-reads=false"],
        }
    }
}

/// One measured point of the read workload.
#[derive(Clone, Debug)]
pub struct ReadPoint {
    pub arm: ReadArm,
    pub round: usize,
    pub clients: usize,
    /// Reads answered 200 per second in the measured window.
    pub per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Requests that failed in the measured window.
    pub errors: u64,
    /// Cores used by the client and the servers in the window.
    pub cores: Cores,
}

/// The read workload on one cluster.
pub struct ReadWorkload<'a> {
    pub cluster: &'a mut Cluster,
    pub api: &'a Api,
    pub arm: ReadArm,
    pub round: usize,
    pub warmup: Duration,
    pub measure: Duration,
}

impl ReadWorkload<'_> {
    /// Registers [`SHARDS`] shards of one datanode at the leader.
    pub async fn preload(&mut self) -> Result<()> {
        let leader = self.cluster.base(self.cluster.leader()).to_string();
        let epoch = register_datanode(self.api, &leader, 1).await?;
        let shards: Vec<ShardSpec> = (0..SHARDS)
            .map(|id| ShardSpec {
                id,
                generation: 1,
                size: 64 << 20,
            })
            .collect();
        for batch in shards.chunks(1_000) {
            self.api
                .register_shards(&leader, 1, epoch, batch)
                .await
                .map_err(|e| anyhow::anyhow!("preload shards: {e}"))?;
        }
        Ok(())
    }

    /// Runs `clients` closed-loop readers for the warm-up plus the measured window.
    pub async fn run(&mut self, clients: usize) -> Result<ReadPoint> {
        let bases = self.cluster.bases_leader_first();
        let start = Instant::now();
        let measure_from = start + self.warmup;
        let end = measure_from + self.measure;
        let readers: Vec<_> = (0..clients)
            .map(|c| {
                let base = bases[c % bases.len()].clone();
                Ok(tokio::spawn(client_loop(
                    self.api.fresh()?,
                    base,
                    c as u64,
                    measure_from,
                    end,
                )))
            })
            .collect::<Result<_>>()?;
        tokio::time::sleep_until(measure_from.into()).await;
        let pids: Vec<u32> = self.cluster.pids().into_iter().map(|(_, p)| p).collect();
        let cpu = CpuUsage::start(&pids);
        tokio::time::sleep_until(end.into()).await;
        let cores = cpu.cores();

        let ClientTally {
            latencies_ms: mut latencies,
            errors,
            ..
        } = ClientTally::gather(readers, "read").await?;
        self.cluster.check_alive()?;
        Ok(ReadPoint {
            arm: self.arm,
            round: self.round,
            clients,
            per_sec: latencies.len() as f64 / self.measure.as_secs_f64(),
            p50_ms: percentile(&mut latencies, 0.50),
            p99_ms: percentile(&mut latencies, 0.99),
            errors,
            cores,
        })
    }
}

/// One reader: reads shard after shard (a fixed stride through the registry, a different start
/// per reader) until `end`; keeps the latencies of reads that completed in `[measure_from, end]`.
async fn client_loop(
    api: Api,
    base: String,
    reader: u64,
    measure_from: Instant,
    end: Instant,
) -> ClientTally {
    let mut tally = ClientTally::default();
    let mut shard = reader * 7_919 % SHARDS;
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let url = format!("{base}/v1/shards/{shard}");
        shard = (shard + 7_919) % SHARDS;
        let result = api.get_status(&url).await;
        let done = Instant::now();
        if !(done >= measure_from && done <= end) {
            continue;
        }
        match result {
            Ok(200) => tally.latencies_ms.push((done - sent).as_secs_f64() * 1e3),
            Ok(status) => {
                tally.errors += 1;
                tally.last_error = Some(format!("GET {url}: status {status}"));
            }
            Err(e) => {
                tally.errors += 1;
                tally.last_error = Some(e.to_string());
            }
        }
    }
}

/// Prints every run, then the medians over rounds with the follower/replay ratio.
pub fn print(points: &[ReadPoint]) {
    println!("\n### Linearizable reads, every run\n");
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                (p.round + 1).to_string(),
                p.arm.name().into(),
                p.clients.to_string(),
                format!("{:.0}", p.per_sec),
                format!("{:.2}", p.p50_ms),
                format!("{:.2}", p.p99_ms),
                format!("{:.2} / {:.2}", p.cores.client, p.cores.servers),
                p.errors.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "round",
            "arm",
            "clients",
            "reads/s",
            "p50 ms",
            "p99 ms",
            "client / servers cores",
            "errors",
        ],
        &rows,
    );
    println!("\n### Linearizable reads, medians over rounds\n");
    let mut clients: Vec<usize> = points.iter().map(|p| p.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let summary = |arm: ReadArm, c: usize| {
        let runs: Vec<&ReadPoint> = points
            .iter()
            .filter(|p| p.arm == arm && p.clients == c)
            .collect();
        let m = |g: fn(&ReadPoint) -> f64| median(&runs.iter().map(|p| g(p)).collect::<Vec<_>>());
        (!runs.is_empty()).then(|| {
            (
                m(|p| p.per_sec),
                m(|p| p.p50_ms),
                m(|p| p.p99_ms),
                m(|p| p.per_sec / p.cores.servers.max(1e-9)),
            )
        })
    };
    let rows: Vec<Vec<String>> = clients
        .into_iter()
        .map(|c| {
            let mut row = vec![c.to_string()];
            let both: Vec<_> = ReadArm::ALL.iter().map(|a| summary(*a, c)).collect();
            for s in &both {
                match s {
                    Some((rate, p50, p99, per_core)) => {
                        row.push(format!("{rate:.0}"));
                        row.push(format!("{p50:.2} / {p99:.2}"));
                        row.push(format!("{per_core:.0}"));
                    }
                    None => row.extend(["-".into(), "-".into(), "-".into()]),
                }
            }
            row.push(match (&both[0], &both[1]) {
                (Some(f), Some(r)) => format!("{:.2}", f.0 / r.0),
                _ => "-".into(),
            });
            row
        })
        .collect();
    print_table(
        &[
            "clients",
            "follower reads/s",
            "follower p50 / p99 ms",
            "follower reads per server core-second",
            "replay reads/s",
            "replay p50 / p99 ms",
            "replay reads per server core-second",
            "follower/replay",
        ],
        &rows,
    );
}
