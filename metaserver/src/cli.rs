//! The command line: `metaserver` (one self-initializing node), `serve`, `local-cluster` and
//! the operator commands. Every serve option can also come from a `METASERVER_*` variable or
//! the `--config` TOML file (command line first, then environment, then file, then default).

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};

/// The metaserver: a replicated shard registry for a storage cluster.
#[derive(Debug, Parser)]
#[command(name = "metaserver", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Without a command: serve one node (id 1, 127.0.0.1:7101, ./metaserver-data) that
    /// initializes itself as a one-node cluster on its first start (not when given --peers,
    /// or an --id other than 1: use `serve` for a member of a cluster).
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub serve: ServeArgs,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one node of a cluster.
    Serve(Box<ServeArgs>),
    /// Run a whole cluster on loopback as child processes; Ctrl-C stops them all.
    LocalCluster(LocalClusterArgs),
    /// Show a member's view of the cluster.
    Status(ClientArgs),
    /// Ask every member for its status and readiness; fail, naming each problem, unless all
    /// answer, are ready and follow one leader.
    Health(HealthArgs),
    /// Show every datanode as the leader heard it: alive, down or unknown.
    Liveness(ClientArgs),
    /// List shard replicas (one JSON object per line), all or of one datanode.
    Shards(ShardsArgs),
    /// Register a datanode's shards from a JSON file.
    Register(RegisterArgs),
    /// Follow the changes (one JSON event per line), all or of one datanode or key prefix.
    Watch(WatchArgs),
    /// Snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Change the cluster's members: add, promote, remove, move the leadership.
    #[command(subcommand)]
    Member(MemberCommand),
}

/// Options of a node. Unset options fall back to the environment, the config file, then the
/// defaults shown.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (snake_case names).
    #[arg(long, env = "METASERVER_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id [default: 1].
    #[arg(long, env = "METASERVER_ID")]
    pub id: Option<u64>,
    /// Address to listen on; port 0 picks a free port [default: 127.0.0.1:7101].
    #[arg(long, env = "METASERVER_LISTEN")]
    pub listen: Option<String>,
    /// A listening socket this process inherited (its descriptor number), served instead of
    /// binding --listen; `local-cluster` hands each node the socket it bound for it.
    #[arg(long, hide = true)]
    pub listen_fd: Option<i32>,
    /// Address peers and clients reach this node at [default: its --peers entry, else the
    /// bound listen address].
    #[arg(long, env = "METASERVER_ADVERTISE")]
    pub advertise: Option<String>,
    /// Data directory [default: ./metaserver-data].
    #[arg(long, env = "METASERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Initial members, `1=ADDR,2=ADDR,3=ADDR` (used with --init).
    #[arg(long, env = "METASERVER_PEERS")]
    pub peers: Option<String>,
    /// Initialize the cluster (of --peers, or of this node alone) on the first start only
    /// (true/false, yes/no, on/off or 1/0) [default: false with `serve`; without a command,
    /// true unless given --peers or an --id other than 1].
    #[arg(
        long,
        env = "METASERVER_INIT",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new(),
        hide_possible_values = true
    )]
    pub init: Option<bool>,
    /// Require `Authorization: Bearer TOKEN` on every request but /healthz, /readyz, /metrics.
    #[arg(long, env = "METASERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The members' own token, for the Raft traffic and the requests members forward to their
    /// leader (default: --token). Only it opens the members' routes: a client holding --token
    /// cannot speak for a member. The same on every member.
    #[arg(long, env = "METASERVER_MEMBER_TOKEN", hide_env_values = true)]
    pub member_token: Option<String>,
    /// Serve over TLS with this certificate chain (PEM, the node's own first; it must name the
    /// host of the node's advertised address), and speak TLS to the other members. Give
    /// --tls-key and --tls-ca with it; every member of a cluster has TLS, or none.
    #[arg(long, env = "METASERVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "METASERVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The certificate authorities (PEM) the other members' certificates are checked against.
    #[arg(long, env = "METASERVER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// WAL barriers: `shared` (group commit) or `own` (an fsync per log entry, benchmarks) [default: shared].
    #[arg(long, env = "METASERVER_BARRIER")]
    pub barrier: Option<String>,
    /// Snapshot rate in bytes per second, of exports, downloads and snapshots streamed to
    /// members, 0 = unlimited [default: 0].
    #[arg(long, env = "METASERVER_SNAPSHOT_RATE")]
    pub snapshot_rate: Option<u64>,
    /// Build a snapshot after this many applied entries, 0 = only on request [default: 100000].
    #[arg(long, env = "METASERVER_SNAPSHOT_LOGS_SINCE_LAST")]
    pub snapshot_logs_since_last: Option<u64>,
    /// Log entries kept after a snapshot for lagging followers [default: 10000].
    #[arg(long, env = "METASERVER_KEEP_LOGS")]
    pub keep_logs: Option<u64>,
    /// Registry (sled) cache size in bytes, at least 1 MiB [default: 67108864].
    #[arg(long, env = "METASERVER_SLED_CACHE_BYTES")]
    pub sled_cache_bytes: Option<u64>,
    /// Size of a write-ahead log segment file in bytes, from 256 to 1 GiB [default: 67108864].
    #[arg(long, env = "METASERVER_WAL_SEGMENT_BYTES")]
    pub wal_segment_bytes: Option<u64>,
    /// Shards that writes in flight on the leader may hold between them; further writes wait
    /// before they are proposed, which bounds how long a linearizable read can queue behind
    /// apply work [default: 4096].
    #[arg(long, env = "METASERVER_MAX_PENDING_SHARDS")]
    pub max_pending_shards: Option<u32>,
    /// The leader refuses writes that add data (507 insufficient_storage; deletes still pass)
    /// while the data dir's file system has less free than this, and any member refuses a
    /// snapshot from the leader that would leave less than this free (or, even at 0, that it has
    /// no room to install: the snapshot and the registry its records make); 0 turns the write
    /// guard off
    /// [default: 134217728].
    #[arg(long, env = "METASERVER_MIN_FREE_BYTES")]
    pub min_free_bytes: Option<u64>,
    /// The leader calls a registered datanode down when it has sent no heartbeat
    /// (`POST /v1/datanodes/{id}/heartbeat`) for this many milliseconds; a datanode should beat
    /// every third of it [default: 10000].
    #[arg(long, env = "METASERVER_DATANODE_TIMEOUT_MS")]
    pub datanode_timeout_ms: Option<u64>,
    /// How much history of changes the node keeps for watchers (`GET /v1/watch`), in units: a
    /// change costs one unit plus one per shard id it names and one per 8 bytes of its key or
    /// address; a watcher further behind is told to read the state again [default: 1000000].
    #[arg(long, env = "METASERVER_WATCH_HISTORY")]
    pub watch_history: Option<usize>,
    /// Benchmarks only: add this many microseconds to every WAL sync, to see how the node
    /// behaves on a disk whose barriers are slower than this one's, at most 1000000 [default: 0].
    #[arg(long, env = "METASERVER_EMULATED_SYNC_LATENCY_US")]
    pub emulated_sync_latency_us: Option<u64>,
    /// Seconds a client connection may wait for its next request's headers before the server
    /// closes it; at least 5 (the members keep idle connections to each other for 4 s), or 0
    /// never to close idle connections [default: 120].
    #[arg(long, env = "METASERVER_IDLE_TIMEOUT_SECS")]
    pub idle_timeout_secs: Option<u64>,
    /// Whether a follower answers linearizable and lease reads from its own registry once it
    /// applied the leader's read index, instead of replaying them at the leader (true/false,
    /// yes/no, on/off or 1/0) [default: true].
    #[arg(
        long,
        env = "METASERVER_FOLLOWER_READS",
        value_parser = BoolishValueParser::new(),
        hide_possible_values = true
    )]
    pub follower_reads: Option<bool>,
    /// Milliseconds a stopping node keeps serving, with `/readyz` answering 503, before it
    /// closes its port: long enough for a load balancer's readiness checks to take it out of
    /// rotation first (a second signal ends the wait) [default: 0].
    #[arg(long, env = "METASERVER_STOP_DELAY_MS")]
    pub stop_delay_ms: Option<u64>,
    /// Async runtime worker threads, at most 1024 [default: one per CPU core]. When several
    /// nodes share a machine, give each its share of the cores: every extra thread costs
    /// wake-ups.
    #[arg(long, env = "METASERVER_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
}

/// Options of `local-cluster`.
#[derive(Debug, Clone, Args)]
pub struct LocalClusterArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Port of node 1; node N listens on base-port + N - 1. 0 picks free ports.
    #[arg(long, default_value_t = 7101)]
    pub base_port: u16,
    /// Directory holding node1/, node2/, ...
    #[arg(long, default_value = "metaserver-cluster")]
    pub data_dir: PathBuf,
    /// Token every node requires (also passed on to the nodes).
    #[arg(long, env = "METASERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// `serve` options given to every node, after `--` (for example `-- --barrier own
    /// --snapshot-rate 67108864`); the id, addresses, data dir, peers and `--init` are set by
    /// `local-cluster` itself.
    #[arg(last = true, value_name = "SERVE_OPTIONS")]
    pub serve_options: Vec<String>,
}

/// How operator commands reach a member.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Any member, `host:port`, `http://host:port` or `https://host:port`; or several,
    /// comma-separated: a request that one cannot answer (down, restarting, removed, no
    /// leader) goes to the next.
    #[arg(long, env = "METASERVER_SERVER", default_value = "127.0.0.1:7101")]
    pub server: String,
    /// Bearer token, if the cluster requires one.
    #[arg(long, env = "METASERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The members' own token, if the cluster has one: sent instead of --token. Forming a
    /// cluster, adding a learner and moving a member take it (they name where a member
    /// listens).
    #[arg(long, env = "METASERVER_MEMBER_TOKEN", hide_env_values = true)]
    pub member_token: Option<String>,
    /// Speak TLS to the members, checking their certificates against these authorities
    /// (PEM); `host:port` addresses then mean `https://host:port`.
    #[arg(long, env = "METASERVER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

impl ClientArgs {
    /// The client token given, if any: an empty one (a variable set to nothing) gives none.
    pub fn client_token(&self) -> Option<&str> {
        self.token.as_deref().filter(|t| !t.is_empty())
    }

    /// The member token given, if any (an empty one gives none): the commands send it instead
    /// of the client token.
    pub fn member_token(&self) -> Option<&str> {
        self.member_token.as_deref().filter(|t| !t.is_empty())
    }
}

/// Options of `health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Print the report as JSON rather than as a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `shards`.
#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only this datanode's replicas.
    #[arg(long)]
    pub datanode: Option<u64>,
}

/// Options of `watch`.
#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Start after this log index (default: now).
    #[arg(long)]
    pub after: Option<u64>,
    /// The history `--after` counts in, as a printed event names it: a cluster restored from a
    /// backup since then (which counts its indexes from 1 again) is refused rather than
    /// watched from an index that would skip its changes.
    #[arg(long, requires = "after")]
    pub history: Option<String>,
    /// Only this datanode's registry changes.
    #[arg(long, conflicts_with = "prefix")]
    pub datanode: Option<u64>,
    /// Only the changes of keys starting with this prefix.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Print the first answer that has events, then exit (for scripts).
    #[arg(long)]
    pub once: bool,
}

/// Options of `register`.
#[derive(Debug, Clone, Args)]
pub struct RegisterArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The datanode whose shards these are (it must be registered).
    #[arg(long)]
    pub datanode: u64,
    /// JSON: `[{"id":..,"generation":..,"size":..},..]` or `{"epoch":E,"shards":[..]}`.
    #[arg(long)]
    pub file: PathBuf,
    /// The file completes the datanode's report under its epoch: afterwards drop every replica
    /// of the datanode that no batch of that epoch registered (the file may then be empty).
    #[arg(long)]
    pub prune: bool,
}

/// `snapshot` subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Build a snapshot on the member and download it to FILE (a backup), verified before it
    /// replaces FILE.
    Save {
        #[command(flatten)]
        client: ClientArgs,
        /// Where to write the snapshot.
        file: PathBuf,
        /// Build it from the member's state as it is, without its leader's confirmation that
        /// it holds every acknowledged write: for a cluster that lost the majority of its
        /// voters, where no leader can confirm anything (it may miss the newest writes).
        #[arg(long)]
        local: bool,
        /// Keep the snapshot even if the cluster was being restored when it was built (a
        /// restore under way, or cut off part way: it may hold part of a backup only). The
        /// file keeps the restore's mark, and a restore of it asks for --partial too.
        #[arg(long)]
        partial: bool,
    },
    /// Replay a backup (from `snapshot save`) into an empty cluster: every datanode and its
    /// replicas (datanodes get new epochs) and every key (with new revisions).
    Restore {
        #[command(flatten)]
        client: ClientArgs,
        /// The backup to restore.
        file: PathBuf,
        /// Restore it even if it was saved while its cluster was being restored (with
        /// `snapshot save --partial`): it may hold part of a backup only.
        #[arg(long)]
        partial: bool,
    },
    /// End the restore that the cluster is marked with, keeping what the cluster holds: for a
    /// restore cut off part way whose writes are to be kept rather than restored again into
    /// fresh data dirs. Prints the mark it removed (`null`: there was none).
    EndRestore {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// The `member` commands. Each goes to any member (the leader makes the change), rides out a
/// leader change, and prints the membership (or the leader) it leaves.
#[derive(Debug, Clone, Subcommand)]
pub enum MemberCommand {
    /// Add node ID, started at ADDR without --init, as a learner (it catches up without
    /// voting); with --voter, then make it a voter once it caught up.
    Add {
        #[command(flatten)]
        client: ClientArgs,
        /// The node's id (its --id).
        id: u64,
        /// The address the members reach it at, `host:port` (its --advertise, else --listen).
        addr: String,
        /// Make it a voter too, once it caught up.
        #[arg(long)]
        voter: bool,
        /// How long to wait, with --voter, for it to catch up.
        #[arg(long, default_value_t = 60)]
        wait_secs: u64,
    },
    /// Make learner ID a voter, once it caught up (the other voters stay).
    Promote {
        #[command(flatten)]
        client: ClientArgs,
        /// The learner's id.
        id: u64,
        /// How long to wait for it to catch up.
        #[arg(long, default_value_t = 60)]
        wait_secs: u64,
    },
    /// Remove node ID from the cluster: a voter leaves the voters (the others stay), a learner
    /// the learners. Stop it afterwards.
    Remove {
        #[command(flatten)]
        client: ClientArgs,
        /// The member's id.
        id: u64,
    },
    /// Move the leadership to voter ID.
    Leader {
        #[command(flatten)]
        client: ClientArgs,
        /// The voter's id.
        id: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switches take what environments write for yes and no (`METASERVER_INIT=1`), not
    /// only `true` and `false`.
    #[test]
    fn switches_take_the_usual_spellings_of_yes_and_no() {
        let serve = |args: &[&str]| match Cli::try_parse_from(
            ["metaserver", "serve"].iter().chain(args).copied(),
        ) {
            Ok(Cli {
                command: Some(Command::Serve(serve)),
                ..
            }) => serve,
            other => panic!("{args:?}: {other:?}"),
        };
        for (given, meant) in [("1", true), ("yes", true), ("on", true), ("0", false)] {
            let args = serve(&["--init", given, "--follower-reads", given]);
            assert_eq!(args.init, Some(meant), "{given}");
            assert_eq!(args.follower_reads, Some(meant), "{given}");
        }
        assert_eq!(serve(&["--init"]).init, Some(true));
        assert!(Cli::try_parse_from(["metaserver", "serve", "--init", "maybe"]).is_err());
    }
}
