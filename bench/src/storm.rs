//! The registration storm benchmark (`meta-bench storm`): a real three-node cluster of `metaserver`
//! release processes on loopback, driven through the HTTP API v1 that datanodes use.
//!
//! Two workloads, each in two arms (`shared` and `own` WAL barriers, set through the server's
//! `--barrier` setting), interleaved A B A B with a fresh cluster for every run:
//! single-shard writes at several client counts, and the restart storm (every datanode registers all
//! its shards at once while admin reads run); then single-shard writes once more on servers whose
//! fdatasync is slowed (`slow_sync`), apart from the targets. Prints markdown tables and writes
//! `target/bench/storm.json` and `target/bench/storm.svg`.

mod admin_probe;
mod api;
mod certs;
mod chart;
mod cluster;
mod cpu_usage;
mod options;
mod reads;
mod reaper;
mod removal;
mod restart;
mod results;
mod server_build;
mod single;
mod slow_sync;
mod wal_figures;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use self::api::Api;
use self::certs::BenchCerts;
use self::cluster::Cluster;
use self::options::{Arm, Options, ServerFlags};
use self::reads::{ReadArm, ReadWorkload};
use self::reaper::Reaper;
use self::restart::{Pass, StormWorkload};
use self::results::Results;
use self::server_build::ServerBuild;
use self::single::{Route, SingleWorkload};
use crate::report::out_dir;

/// How long a stopping server may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the benchmark with the words after `storm` as options (`--help` lists them).
pub fn run(args: &[String]) -> Result<()> {
    let options = Options::parse(args)?;
    let binary = match &options.server_binary {
        Some(path) => path.clone(),
        None => ServerBuild::run()?.binary,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let mut results = Results::default();
    let load_before = load_average();
    let outcome = runtime.block_on(drive(&options, &binary, &mut results));
    Reaper::kill_all();
    println!(
        "\nmachine: {} cores; load average (1, 5, 15 min) at start {load_before}, at end {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    if !options.server_arg.is_empty() {
        println!(
            "extra server flags: {} (the targets are for servers without them)",
            options.server_arg.join(" ")
        );
    }
    results.print();
    if outcome.is_ok() {
        results.write()?;
    }
    outcome
}

/// The first three fields of `/proc/loadavg`, to show how busy the shared machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The single-shard points to measure, in order: every client count spread over the members
/// (one client talks to the leader), and right after one client, one client at a follower, so
/// that the forwarded path is measured alone too.
fn single_points(clients: &[usize]) -> Vec<(usize, Route)> {
    let mut points = Vec::new();
    for &c in clients {
        points.push((c, Route::Spread));
        if c == 1 {
            points.push((c, Route::Follower));
        }
    }
    points
}

/// The single-shard workload of round `round` and `arm` on `cluster`.
fn single_workload<'a>(
    cluster: &'a mut Cluster,
    api: &'a Api,
    arm: Arm,
    round: usize,
    options: &Options,
) -> SingleWorkload<'a> {
    SingleWorkload {
        cluster,
        api,
        arm,
        round,
        warmup: options.warmup(),
        measure: options.measure(),
    }
}

/// Runs every round and arm, each on a fresh cluster, collecting into `results`.
async fn drive(options: &Options, binary: &Path, results: &mut Results) -> Result<()> {
    Reaper::install();
    let runs_dir = out_dir()?.join("storm-runs");
    let mut server = options.server_flags();
    if options.arms.contains(&Arm::Tls) && (options.runs_single() || options.runs_storm()) {
        server.certs = Some(BenchCerts::make(&runs_dir.join("tls"))?);
    }
    let api = Api::new(server.certs.as_ref().map(|c| c.ca.as_path()))?;
    let per_arm = if options.runs_single() {
        single_points(&options.clients).len()
    } else {
        0
    } + usize::from(options.runs_storm())
        + usize::from(options.runs_slow_sync());
    let steps = if options.runs_removal() {
        options.rounds * (1 + usize::from(options.compare_binary.is_some()))
    } else if options.runs_reads() {
        options.rounds * ReadArm::ALL.len() * options.clients.len()
    } else {
        options.rounds * options.arms.len() * per_arm
    } as u64;
    let progress = MultiProgress::new();
    let overall = progress.add(ProgressBar::new(steps));
    overall.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} points  {msg}")
            .context("progress template")?
            .progress_chars("=> "),
    );
    overall.enable_steady_tick(Duration::from_millis(200));
    // The slow-sync pass's servers: every WAL sync slowed on purpose.
    let mut slow_sync_server = server.clone();
    slow_sync_server.extra.push(format!(
        "--emulated-sync-latency-us={}",
        options.slow_sync_us
    ));
    progress.suspend(|| {
        eprintln!(
            "servers: {} async worker thread(s) each (--server-threads; 0 = server default)",
            server.worker_threads
        )
    });
    let start_cluster_with = |arm, flags| {
        Cluster::start(
            binary,
            arm,
            &runs_dir,
            flags,
            options.keep_data,
            Duration::from_secs(options.startup_timeout),
            &api,
        )
    };
    let start_cluster = |arm| start_cluster_with(arm, &server);

    if options.runs_removal() {
        // Build A, and build B if given: A B, then B A.
        let mut builds = vec![binary.to_path_buf()];
        builds.extend(options.compare_binary.clone());
        for round in 0..options.rounds {
            let mut order: Vec<usize> = (0..builds.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for build in order {
                let tag = format!("round {} build {}", round + 1, removal::BUILDS[build]);
                overall.set_message(format!("{tag}: starting a cluster"));
                let mut cluster = Cluster::start(
                    &builds[build],
                    Arm::Shared,
                    &runs_dir,
                    &server,
                    options.keep_data,
                    Duration::from_secs(options.startup_timeout),
                    &api,
                )
                .await?;
                overall.set_message(format!("{tag}: a removal"));
                let p = removal::run(
                    &cluster,
                    &api,
                    round,
                    options.removal_replicas,
                    options.batch,
                    Duration::from_millis(options.admin_interval_ms),
                    &options.admin_consistency,
                )
                .await;
                cluster.stop(STOP_GRACE);
                let p = removal::RemovalPoint { build, ..p? };
                progress.suspend(|| {
                    eprintln!(
                        "{tag}: removed {} replicas in {:.2} s, admin p99 {:.2} ms, max {:.2} ms",
                        p.replicas, p.seconds, p.admin_p99_ms, p.admin_max_ms
                    )
                });
                results.removals.push(p);
                overall.inc(1);
            }
        }
        overall.finish_and_clear();
        return Ok(());
    }

    if options.runs_reads() {
        drive_reads(
            options, binary, &runs_dir, &server, &api, &progress, &overall, results,
        )
        .await?;
        overall.finish_and_clear();
        return Ok(());
    }

    for round in 0..options.rounds {
        // A B, then B A: neither arm always runs first (right after the build, or while the
        // last cluster's data dir is being deleted).
        let mut arms = options.arms.clone();
        if round % 2 == 1 {
            arms.reverse();
        }
        for &arm in &arms {
            let tag = format!("round {} {}", round + 1, arm.name());
            if options.runs_single() {
                overall.set_message(format!("{tag}: starting a cluster"));
                let mut cluster = start_cluster(arm).await?;
                let mut workload = single_workload(&mut cluster, &api, arm, round, options);
                let mut next_datanode = 1;
                for (clients, route) in single_points(&options.clients) {
                    let label = route.label(clients);
                    overall.set_message(format!("{tag}: single-shard writes, {label} client(s)"));
                    let p = workload.run(clients, next_datanode, route).await?;
                    next_datanode += clients as u64;
                    progress.suspend(|| eprintln!(
                        "{tag}: single {label:>3} clients: {:>8.0} reg/s  p50 {:.2} ms  p99 {:.2} ms",
                        p.per_sec, p.p50_ms, p.p99_ms
                    ));
                    results.single.push(p);
                    overall.inc(1);
                }
                cluster.stop(STOP_GRACE);
            }
            if options.runs_slow_sync() {
                let clients = options.slow_sync_clients;
                let us = options.slow_sync_us;
                overall.set_message(format!(
                    "{tag}: starting a cluster whose fdatasyncs take {us} µs longer"
                ));
                let mut cluster = start_cluster_with(arm, &slow_sync_server).await?;
                let mut workload = single_workload(&mut cluster, &api, arm, round, options);
                overall.set_message(format!("{tag}: {clients} client(s), syncs {us} µs longer"));
                let p = workload.run(clients, 1, Route::Spread).await;
                cluster.stop(STOP_GRACE);
                let p = p?;
                progress.suspend(|| eprintln!(
                    "{tag}: single {clients:>3} clients, syncs {us} µs longer: {:>8.0} reg/s  p50 {:.2} ms  p99 {:.2} ms",
                    p.per_sec, p.p50_ms, p.p99_ms
                ));
                results.slow_sync.push(p);
                results.slow_sync_us = us;
                overall.inc(1);
            }
            if options.runs_storm() {
                overall.set_message(format!("{tag}: starting a cluster"));
                let mut cluster = start_cluster(arm).await?;
                let mut workload = StormWorkload {
                    cluster: &mut cluster,
                    api: &api,
                    arm,
                    round,
                    pass: Pass::Fresh,
                    datanodes: options.datanodes,
                    shards_per_datanode: options.shards_per_datanode,
                    batch: options.batch,
                    admin_interval: Duration::from_millis(options.admin_interval_ms),
                    admin_consistency: options.admin_consistency.clone(),
                };
                for pass in [Pass::Fresh, Pass::Again] {
                    let what = match pass {
                        Pass::Fresh => "storm",
                        Pass::Again => "storm again",
                    };
                    overall.set_message(format!("{tag}: {what}"));
                    let bar = progress.add(ProgressBar::new(0));
                    bar.set_style(
                        ProgressStyle::with_template(&format!(
                            "  {what} [{{bar:30}}] {{human_pos}}/{{human_len}} replicas {{per_sec}} eta {{eta}}"
                        ))
                        .context("progress template")?
                        .progress_chars("=> "),
                    );
                    workload.pass = pass;
                    let p = workload.run(&bar).await;
                    bar.finish_and_clear();
                    progress.remove(&bar);
                    let p = p?;
                    progress.suspend(|| {
                        eprintln!(
                            "{tag}: {what} {} replicas ({} pruned) in {:.2} s ({:.0}/s), admin p99 {:.2} ms",
                            p.replicas, p.pruned, p.seconds, p.per_sec, p.admin_p99_ms
                        )
                    });
                    match pass {
                        Pass::Fresh => results.storm.push(p),
                        Pass::Again => results.again.push(p),
                    }
                }
                overall.inc(1);
                cluster.stop(STOP_GRACE);
            }
        }
    }
    overall.finish_and_clear();
    Ok(())
}

/// The read workload: both read arms, interleaved (A B, then B A), each on a fresh cluster.
#[allow(clippy::too_many_arguments)]
async fn drive_reads(
    options: &Options,
    binary: &Path,
    runs_dir: &Path,
    server: &ServerFlags,
    api: &Api,
    progress: &MultiProgress,
    overall: &ProgressBar,
    results: &mut Results,
) -> Result<()> {
    for round in 0..options.rounds {
        // A B, then B A: neither arm always runs first on a fresh machine state.
        let mut arms = ReadArm::ALL;
        if round % 2 == 1 {
            arms.reverse();
        }
        for arm in arms {
            let tag = format!("round {} {}", round + 1, arm.name());
            overall.set_message(format!("{tag}: starting a cluster"));
            let mut flags = server.clone();
            flags
                .extra
                .extend(arm.server_flags().iter().map(|f| f.to_string()));
            let mut cluster = Cluster::start(
                binary,
                Arm::Shared,
                runs_dir,
                &flags,
                options.keep_data,
                Duration::from_secs(options.startup_timeout),
                api,
            )
            .await?;
            let mut workload = ReadWorkload {
                cluster: &mut cluster,
                api,
                arm,
                round,
                warmup: options.warmup(),
                measure: options.measure(),
            };
            overall.set_message(format!("{tag}: registering the shards to read"));
            workload.preload().await?;
            for &clients in &options.clients {
                overall.set_message(format!("{tag}: reads, {clients} client(s)"));
                let p = workload.run(clients).await?;
                progress.suspend(|| {
                    eprintln!(
                        "{tag}: reads {clients:>3} clients: {:>8.0} reads/s  p50 {:.2} ms  p99 {:.2} ms",
                        p.per_sec, p.p50_ms, p.p99_ms
                    )
                });
                results.reads.push(p);
                overall.inc(1);
            }
            cluster.stop(STOP_GRACE);
        }
    }
    Ok(())
}
