//! Command-line options of the registration storm benchmark.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use super::cluster::MEMBERS;

/// How a cluster runs: its barrier mode (the server's `barrier` setting, `--barrier`), and
/// whether its members speak TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arm {
    /// Writers share fsync barriers (the default design).
    Shared,
    /// Every log entry (every client write) takes its own barrier (the naive design).
    Own,
    /// As `shared`, with every member, and the bench's clients, on TLS: what TLS costs.
    Tls,
}

impl Arm {
    /// The arm's name as the JSON output spells it.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Shared => "shared",
            Arm::Own => "own",
            Arm::Tls => "tls",
        }
    }

    /// The server's `--barrier` setting of the arm.
    pub fn barrier(self) -> &'static str {
        match self {
            Arm::Shared | Arm::Tls => "shared",
            Arm::Own => "own",
        }
    }
}

/// Which workloads to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workloads {
    /// Single-shard writes only.
    Single,
    /// The restart storm only.
    Storm,
    /// Both (the default).
    Both,
    /// Linearizable reads only, with followers answering them (`follower`) against replaying
    /// them at the leader (`replay`), interleaved; `--arms` does not apply.
    Reads,
    /// One datanode with `--removal-replicas` replicas removed while admin reads run; `--arms`
    /// does not apply (compare builds with `--server-binary`).
    Removal,
}

/// `meta-bench storm`: the registration storm against a real three-node cluster of `metaserver` processes.
#[derive(Debug, Parser)]
#[command(name = "meta-bench storm")]
pub struct Options {
    /// Seconds each single-shard point is measured (after a short warm-up).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Concurrent clients of the single-shard workload, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Rounds of interleaved arms (A B A B for 2); every run gets a fresh cluster.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Arms to run, in this order within each round.
    #[arg(long, value_delimiter = ',', default_value = "shared,own")]
    pub arms: Vec<Arm>,
    /// Which workloads to run.
    #[arg(long, value_enum, default_value = "both")]
    pub workload: Workloads,
    /// Datanodes of the restart storm (all register at once).
    #[arg(long, default_value_t = 100)]
    pub datanodes: u64,
    /// Shards each datanode registers in the storm.
    #[arg(long, default_value_t = 10_000)]
    pub shards_per_datanode: u64,
    /// Shards per registration request in the storm.
    #[arg(long, default_value_t = 1_000)]
    pub batch: u64,
    /// Replicas of the datanode that `--workload removal` removes.
    #[arg(long, default_value_t = 1_000_000)]
    pub removal_replicas: u64,
    /// Interval of each admin probe during the storm (the reads and the key write), in
    /// milliseconds.
    #[arg(long, default_value_t = 10)]
    pub admin_interval_ms: u64,
    /// Consistency of the storm's shard reads (`?consistency=`): `linearizable` (read index,
    /// the servers' default) or `lease`.
    #[arg(long, default_value = "linearizable", value_parser = ["linearizable", "lease"])]
    pub admin_consistency: String,
    /// Seconds to wait for a fresh cluster to elect a leader and become ready.
    #[arg(long, default_value_t = 60)]
    pub startup_timeout: u64,
    /// Log filter for the servers (`RUST_LOG` of the children); the bench's own `RUST_LOG` if unset, else `warn`.
    #[arg(long)]
    pub server_log: Option<String>,
    /// Async worker threads of each server (`--worker-threads`) [default: the machine's cores
    /// divided among the three servers, at least 1]; 0 passes no flag (the server's default).
    #[arg(long)]
    pub server_threads: Option<usize>,
    /// An extra flag for every server, e.g. `--server-arg=--max-pending-shards=4096`; repeatable.
    #[arg(long, allow_hyphen_values = true)]
    pub server_arg: Vec<String>,
    /// Run this server binary instead of building `metaserver` with cargo (to compare two builds).
    #[arg(long)]
    pub server_binary: Option<std::path::PathBuf>,
    /// With `--workload removal`: a second server binary (build B) to compare with the first
    /// (build A) in the same run, rounds alternating A B, then B A.
    #[arg(long)]
    pub compare_binary: Option<std::path::PathBuf>,
    /// With the single-shard workload: measure `--slow-sync-clients` clients once more in each
    /// arm, on servers whose every fdatasync takes this many microseconds longer
    /// (`--emulated-sync-latency-us`), as on a disk without a write cache; reported apart
    /// from the targets. 0 skips it, as does an emulated latency in `--server-arg`.
    #[arg(long, default_value_t = 1000)]
    pub slow_sync_us: u64,
    /// Clients of the slow-sync pass.
    #[arg(long, default_value_t = 16)]
    pub slow_sync_clients: usize,
    /// Keep the data dirs and server logs of every run (under `target/bench/storm-runs/`).
    #[arg(long)]
    pub keep_data: bool,
}

/// Settings shared by every server process of a run.
#[derive(Debug, Clone)]
pub struct ServerFlags {
    /// `RUST_LOG` of the servers.
    pub log: String,
    /// `--worker-threads` of each server; 0 = not passed.
    pub worker_threads: usize,
    /// Further flags, passed as given.
    pub extra: Vec<String>,
    /// The `tls` arm's certificates (made when that arm runs).
    pub certs: Option<super::certs::BenchCerts>,
}

impl Options {
    /// Parses `args` (the words after `storm`) and checks them.
    pub fn parse(args: &[String]) -> Result<Options> {
        let options: Options = crate::cli::parse("storm", args)?;
        options.check()?;
        Ok(options)
    }

    fn check(&self) -> Result<()> {
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            bail!("--seconds must be a positive number, got {}", self.seconds);
        }
        if self.clients.is_empty() || self.clients.contains(&0) {
            bail!("--clients must list positive numbers");
        }
        if self.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        if self.arms.is_empty() {
            bail!("--arms must name at least one arm");
        }
        if self.datanodes == 0 || self.shards_per_datanode == 0 {
            bail!("--datanodes and --shards-per-datanode must be positive");
        }
        if self.batch == 0 || self.batch > 10_000 {
            bail!("--batch must be between 1 and 10000 (the API's limit)");
        }
        if self.removal_replicas == 0 {
            bail!("--removal-replicas must be positive");
        }
        if self.admin_interval_ms == 0 {
            bail!("--admin-interval-ms must be positive");
        }
        if self.slow_sync_clients == 0 {
            bail!("--slow-sync-clients must be positive");
        }
        if self.compare_binary.is_some() && !self.runs_removal() {
            bail!("--compare-binary compares builds in the removal workload only (--workload removal)");
        }
        Ok(())
    }

    /// How long a single-shard point is measured.
    pub fn measure(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    /// The warm-up before a single-shard point is measured: a fifth of it, at most one second.
    pub fn warmup(&self) -> Duration {
        Duration::from_secs_f64((self.seconds * 0.2).min(1.0))
    }

    /// Whether the single-shard workload runs.
    pub fn runs_single(&self) -> bool {
        matches!(self.workload, Workloads::Single | Workloads::Both)
    }

    /// Whether the restart storm runs.
    pub fn runs_storm(&self) -> bool {
        matches!(self.workload, Workloads::Storm | Workloads::Both)
    }

    /// Whether the single-shard workload runs once more on servers with slower syncs: not
    /// when `--server-arg` emulates a latency already (the flag would be given twice).
    pub fn runs_slow_sync(&self) -> bool {
        self.runs_single()
            && self.slow_sync_us > 0
            && !self
                .server_arg
                .iter()
                .any(|a| a.contains("emulated-sync-latency"))
    }

    /// Whether the removal workload runs.
    pub fn runs_removal(&self) -> bool {
        self.workload == Workloads::Removal
    }

    /// Whether the read workload runs.
    pub fn runs_reads(&self) -> bool {
        self.workload == Workloads::Reads
    }

    /// How every server process is started.
    pub fn server_flags(&self) -> ServerFlags {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ServerFlags {
            log: self
                .server_log
                .clone()
                .or_else(|| std::env::var("RUST_LOG").ok())
                .unwrap_or_else(|| "warn".to_string()),
            worker_threads: self
                .server_threads
                .unwrap_or((cores / MEMBERS as usize).max(1)),
            extra: self.server_arg.clone(),
            certs: None,
        }
    }
}
