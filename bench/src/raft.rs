//! The `raft` benchmark: an in-process three-node cluster (in-process transport, each node's
//! data dir on the working disk) registering shards through the node API.
//!
//! Points: 1, 4, 16 and 64 concurrent registrants of one shard per call, and registrants
//! sending batches of 1,000 shards, each with shared barriers (`shared`) and with one barrier
//! per log entry (`own`, switched at runtime on every node), interleaved A B A B. Then the
//! longest stall of `apply` while a snapshot of one million replicas is built.
//!
//! `meta-bench raft [--seconds S] [--rounds R] [--registrants 1,4,16,64] [--batch-registrants 1,4]
//! [--snapshot-replicas N] [--dir DIR]` (`--help` explains them); the seconds can also come from `RAFT_BENCH_SECONDS`.
//! Prints a table and writes `target/bench/raft.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use meta_consensus::transport::LocalRouter;
use meta_consensus::{
    BarrierMode, CommandResult, MetaNode, Node, NodeConfig, NodeId, Role, ShardReport,
};
use serde_json::json;

use crate::{cli, report};

const BATCH: usize = 1000;
/// Export pace while measuring the apply stall (bytes per second).
const SNAPSHOT_PACE: u64 = 8_000_000;

/// `meta-bench raft`: an in-process three-node cluster registering shards, shared against own barriers.
#[derive(Debug, clap::Parser)]
#[command(name = "meta-bench raft")]
struct Config {
    /// Seconds each point is measured, per round.
    #[arg(long, env = "RAFT_BENCH_SECONDS", default_value_t = 3.0)]
    seconds: f64,
    /// Rounds of interleaved arms (A B A B for 2).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Concurrent registrants of one shard per call, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    registrants: Vec<usize>,
    /// Concurrent registrants of 1,000-shard batches, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    batch_registrants: Vec<usize>,
    /// Replicas in the registry while the apply stall during a snapshot is measured.
    #[arg(long, default_value_t = 1_000_000)]
    snapshot_replicas: u64,
    /// Directory for the nodes' data dirs.
    #[arg(long, default_value_os_t = report::target_dir())]
    dir: PathBuf,
}

fn parse(args: &[String]) -> Result<Config> {
    let cfg: Config = cli::parse("raft", args)?;
    if !(cfg.seconds.is_finite() && cfg.seconds > 0.0) || cfg.rounds == 0 {
        bail!("--seconds and --rounds must be positive");
    }
    if cfg.registrants.contains(&0) || cfg.batch_registrants.contains(&0) {
        bail!("every registrant count must be positive");
    }
    Ok(cfg)
}

/// Runs the benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let cfg = parse(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(cfg))
}

struct Cluster {
    router: LocalRouter,
    nodes: BTreeMap<NodeId, MetaNode>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(base: &Path) -> Result<Cluster> {
        std::fs::create_dir_all(base)?;
        let dir = tempfile::Builder::new()
            .prefix("raft-bench-")
            .tempdir_in(base)?;
        let router = LocalRouter::new();
        let mut nodes = BTreeMap::new();
        for id in 1..=3u64 {
            let mut c =
                NodeConfig::new(id, format!("node-{id}"), dir.path().join(format!("n{id}")));
            c.snapshot_logs_since_last = 0;
            c.max_in_snapshot_log_to_keep = 1_000_000;
            c.heartbeat_ms = 100;
            c.election_min_ms = 1000;
            c.election_max_ms = 2000;
            c.request_timeout = Duration::from_secs(60);
            let node = MetaNode::open(c, router.network(id)).await?;
            router.register(node.clone());
            nodes.insert(id, node);
        }
        let members = (1..=3u64)
            .map(|i| (i, Node::new(format!("node-{i}"))))
            .collect();
        nodes[&1].initialize(members).await?;
        let c = Cluster {
            router,
            nodes,
            _dir: dir,
        };
        c.leader().await?;
        Ok(c)
    }

    async fn leader(&self) -> Result<MetaNode> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(n) = self
                .nodes
                .values()
                .find(|n| n.status().role == Role::Leader)
            {
                // Wait until it can take writes (its first entry committed).
                let n = n.clone();
                let last = n.status().last_log_index.unwrap_or(0);
                n.wait_applied(last, Duration::from_secs(30)).await?;
                return Ok(n);
            }
            if Instant::now() > deadline {
                bail!("no leader");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn set_mode(&self, mode: BarrierMode) {
        for n in self.nodes.values() {
            n.set_barrier_mode(mode);
        }
    }

    async fn shutdown(self) -> Result<()> {
        for (id, n) in &self.nodes {
            self.router.unregister(*id);
            n.shutdown().await?;
        }
        Ok(())
    }
}

/// One measured point.
struct Point {
    registrants: usize,
    batch: usize,
    arm: &'static str,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    appends_per_barrier: f64,
}

/// Registrants each own a datanode (registered once) and register fresh shards.
struct Registrants {
    epochs: Vec<(u64, u64)>,
    next_shard: Arc<AtomicU64>,
}

async fn registrants(leader: &MetaNode, n: usize, first_dn: u64) -> Result<Registrants> {
    let mut epochs = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let dn = first_dn + i;
        let w = leader.register_datanode(dn, format!("dn-{dn}")).await?;
        let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
            bail!("register datanode: {:?}", w.result);
        };
        epochs.push((dn, epoch));
    }
    Ok(Registrants {
        epochs,
        next_shard: Arc::new(AtomicU64::new(first_dn << 32)),
    })
}

async fn measure(
    leader: &MetaNode,
    regs: &Registrants,
    batch: usize,
    seconds: f64,
    arm: &'static str,
) -> Result<Point> {
    let before = leader.status().wal;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for &(dn, epoch) in &regs.epochs {
        let (leader, stop, next) = (leader.clone(), stop.clone(), regs.next_shard.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                let shards = (first..first + batch as u64)
                    .map(|id| ShardReport {
                        id,
                        generation: 1,
                        size: 4096,
                    })
                    .collect();
                let t = Instant::now();
                let w = leader.register_shards(dn, epoch, shards).await?;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                match w.result {
                    CommandResult::ShardsRegistered { accepted, .. } => done += accepted,
                    other => bail!("register shards: {other:?}"),
                }
            }
            anyhow::Ok((done, lat))
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    let mut lat = Vec::new();
    for t in tasks {
        let (d, l) = t.await??;
        total += d;
        lat.extend(l);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = leader.status().wal;
    let barriers = after.barriers.saturating_sub(before.barriers);
    let appends = after.appends.saturating_sub(before.appends);
    Ok(Point {
        registrants: regs.epochs.len(),
        batch,
        arm,
        per_sec: total as f64 / elapsed,
        p50_ms: report::percentile(&mut lat, 0.5),
        p99_ms: report::percentile(&mut lat, 0.99),
        appends_per_barrier: if barriers == 0 {
            0.0
        } else {
            appends as f64 / barriers as f64
        },
    })
}

/// On a fresh cluster, fills the registry with exactly `replicas` replicas, then builds a
/// snapshot while a writer keeps registering; reports the longest `apply` during the build.
async fn snapshot_stall(base: &Path, replicas: u64, seconds: f64) -> Result<serde_json::Value> {
    let cluster = Cluster::start(base).await?;
    let leader = cluster.leader().await?;
    let stall = snapshot_stall_on(&leader, replicas, seconds).await;
    drop(leader);
    cluster.shutdown().await?;
    stall
}

async fn snapshot_stall_on(
    leader: &MetaNode,
    replicas: u64,
    seconds: f64,
) -> Result<serde_json::Value> {
    let fill = Instant::now();
    let regs = registrants(leader, 4, 1).await?;
    // The writer below registers on the first datanode; the fill leaves room for it.
    let remaining = Arc::new(AtomicU64::new(replicas));
    let mut tasks = Vec::new();
    for &(dn, epoch) in &regs.epochs {
        let (leader, next, remaining) =
            (leader.clone(), regs.next_shard.clone(), remaining.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let take = remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                        (r > 0).then(|| r - r.min(BATCH as u64))
                    })
                    .map(|r| r.min(BATCH as u64))
                    .unwrap_or(0);
                if take == 0 {
                    return anyhow::Ok(());
                }
                let first = next.fetch_add(take, Ordering::Relaxed);
                let shards = (first..first + take)
                    .map(|id| ShardReport {
                        id,
                        generation: 1,
                        size: 4096,
                    })
                    .collect();
                leader.register_shards(dn, epoch, shards).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = leader.status().replicas;
    println!(
        "filled a fresh registry with {total} replicas in {:.1} s",
        fill.elapsed().as_secs_f64()
    );

    // A writer of single-shard registrations runs throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let window_max = Arc::new(AtomicU64::new(0));
    let writer = {
        let (leader, stop, next, max) = (
            leader.clone(),
            stop.clone(),
            regs.next_shard.clone(),
            window_max.clone(),
        );
        let (dn, epoch) = regs.epochs[0];
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = next.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                leader
                    .register_shards(
                        dn,
                        epoch,
                        vec![ShardReport {
                            id,
                            generation: 1,
                            size: 1,
                        }],
                    )
                    .await?;
                max.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        })
    };
    // Baseline window without a snapshot.
    leader.reset_apply_maxima();
    window_max.store(0, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(seconds.min(2.0))).await;
    let base = leader.status().state_machine;
    let base_write_max = window_max.swap(0, Ordering::Relaxed);
    leader.reset_apply_maxima();
    // Pace the export (about two seconds for this registry) so that many applies run while
    // it is built; the pace is the node's runtime-adjustable snapshot rate.
    leader.set_snapshot_rate(SNAPSHOT_PACE);
    let applies_before = base.applies;
    let t = Instant::now();
    let snap = leader.snapshot_now().await?;
    let build = t.elapsed();
    leader.set_snapshot_rate(0);
    let during = leader.status().state_machine;
    let applies_during = during.applies - applies_before;
    let write_max = window_max.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    writer.await??;
    let stall_us = during.apply_max_micros.max(during.builder_start_max_micros);
    println!(
        "snapshot of {total} replicas: {} bytes in {:.2} s at {} B/s, {applies_during} applies meanwhile; \
         longest apply during the build {:.2} ms (builder start {:.3} ms; baseline {:.2} ms); \
         longest write {:.2} ms (baseline {:.2} ms)",
        snap.bytes,
        build.as_secs_f64(),
        SNAPSHOT_PACE,
        during.apply_max_micros as f64 / 1e3,
        during.builder_start_max_micros as f64 / 1e3,
        base.apply_max_micros as f64 / 1e3,
        write_max as f64 / 1e3,
        base_write_max as f64 / 1e3,
    );
    Ok(json!({
        "arm": "snapshot_stall",
        "replicas": total,
        "stall_ms": stall_us as f64 / 1e3,
        "baseline_apply_max_ms": base.apply_max_micros as f64 / 1e3,
        "builder_start_ms": during.builder_start_max_micros as f64 / 1e3,
        "max_write_ms": write_max as f64 / 1e3,
        "baseline_max_write_ms": base_write_max as f64 / 1e3,
        "build_seconds": build.as_secs_f64(),
        "snapshot_rate_bytes_per_sec": SNAPSHOT_PACE,
        "applies_during_build": applies_during,
        "snapshot_bytes": snap.bytes,
    }))
}

async fn bench(cfg: Config) -> Result<()> {
    let cluster = Cluster::start(&cfg.dir).await?;
    let leader = cluster.leader().await?;
    println!(
        "raft bench: 3 nodes in {}, leader {}, {} s per point, {} rounds",
        cfg.dir.display(),
        leader.id(),
        cfg.seconds,
        cfg.rounds
    );
    let mut groups: Vec<(usize, usize)> = cfg.registrants.iter().map(|&r| (r, 1)).collect();
    groups.extend(cfg.batch_registrants.iter().map(|&r| (r, BATCH)));
    let mut sets = Vec::new();
    let mut next_dn = 1;
    for &(r, batch) in &groups {
        sets.push((registrants(&leader, r, next_dn).await?, batch));
        next_dn += r as u64;
    }
    let mut points: Vec<Point> = Vec::new();
    for round in 0..cfg.rounds {
        for (regs, batch) in &sets {
            // Interleave the arms; alternate which goes first from round to round.
            let arms: [(&'static str, BarrierMode); 2] = if round % 2 == 0 {
                [("shared", BarrierMode::Shared), ("own", BarrierMode::Own)]
            } else {
                [("own", BarrierMode::Own), ("shared", BarrierMode::Shared)]
            };
            for (arm, mode) in arms {
                cluster.set_mode(mode);
                let p = measure(&leader, regs, *batch, cfg.seconds, arm).await?;
                println!(
                    "round {round}: registrants {} batch {} {arm}: {:.0}/s p50 {:.2} ms p99 {:.2} ms, {:.2} appends/barrier",
                    p.registrants, p.batch, p.per_sec, p.p50_ms, p.p99_ms, p.appends_per_barrier
                );
                points.push(p);
            }
        }
    }
    cluster.set_mode(BarrierMode::Shared);

    // Medians over rounds.
    let mut rows = Vec::new();
    let mut json_rows = Vec::new();
    let mut median_rate: BTreeMap<(usize, usize, &str), f64> = BTreeMap::new();
    for &(r, batch) in &groups {
        for arm in ["shared", "own"] {
            let sel: Vec<&Point> = points
                .iter()
                .filter(|p| p.registrants == r && p.batch == batch && p.arm == arm)
                .collect();
            let med = |f: fn(&Point) -> f64| {
                report::median(&sel.iter().map(|p| f(p)).collect::<Vec<_>>())
            };
            let (rate, p50, p99, apb) = (
                med(|p| p.per_sec),
                med(|p| p.p50_ms),
                med(|p| p.p99_ms),
                med(|p| p.appends_per_barrier),
            );
            median_rate.insert((r, batch, arm), rate);
            rows.push(vec![
                r.to_string(),
                batch.to_string(),
                arm.to_string(),
                format!("{rate:.0}"),
                format!("{p50:.2}"),
                format!("{p99:.2}"),
                format!("{apb:.2}"),
            ]);
            json_rows.push(json!({
                "registrants": r,
                "batch": batch,
                "arm": arm,
                "registrations_per_sec": rate,
                "p50_ms": p50,
                "p99_ms": p99,
                "appends_per_barrier": apb,
            }));
        }
    }
    println!();
    report::print_table(
        &[
            "registrants",
            "batch",
            "arm",
            "registrations/s",
            "p50 ms",
            "p99 ms",
            "leader WAL appends/barrier",
        ],
        &rows,
    );
    if let (Some(one), Some(sixteen)) = (
        median_rate.get(&(1, 1, "shared")),
        median_rate.get(&(16, 1, "shared")),
    ) {
        println!(
            "\n16 registrants / 1 registrant (shared): {:.2}x (target >= 6x)",
            sixteen / one
        );
    }
    for &(r, batch) in &groups {
        if let (Some(s), Some(o)) = (
            median_rate.get(&(r, batch, "shared")),
            median_rate.get(&(r, batch, "own")),
        ) {
            println!(
                "registrants {r} batch {batch}: shared / own = {:.2}x",
                s / o
            );
        }
    }
    let best_batch = cfg
        .batch_registrants
        .iter()
        .filter_map(|&r| median_rate.get(&(r, BATCH, "shared")))
        .fold(0.0f64, |a, &b| a.max(b));
    println!("batches of {BATCH}: {best_batch:.0} shard registrations/s (target >= 150000)");

    drop(leader);
    cluster.shutdown().await?;
    if cfg.snapshot_replicas > 0 {
        let stall = snapshot_stall(&cfg.dir, cfg.snapshot_replicas, cfg.seconds).await?;
        println!(
            "apply stall during the snapshot: {} ms (target <= 50 ms)",
            stall["stall_ms"]
        );
        json_rows.push(stall);
    }
    let path = report::write_json("raft.json", &serde_json::Value::Array(json_rows))?;
    println!("wrote {}", path.display());
    Ok(())
}
