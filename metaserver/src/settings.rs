//! A node's settings, merged from the command line and environment (clap), the TOML file and
//! the defaults, and checked before anything starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use meta_consensus::{BarrierMode, NodeConfig};
use serde::Deserialize;

use crate::boolish::Boolish;
use crate::cli::ServeArgs;
use crate::tls_files::TlsFiles;

/// The most `--emulated-sync-latency-us` may add to a sync.
const MAX_EMULATED_SYNC_LATENCY: Duration = Duration::from_secs(1);

/// Default listen address of `metaserver` and `serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7101";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "metaserver-data";

/// The `--config` file: the same settings as the flags, in snake_case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    id: Option<u64>,
    listen: Option<String>,
    advertise: Option<String>,
    data_dir: Option<PathBuf>,
    peers: Option<String>,
    init: Option<Boolish>,
    token: Option<String>,
    member_token: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    barrier: Option<String>,
    /// `snapshot_rate`, as the flag; `snapshot_max_bytes_per_sec`, as the runtime setting.
    #[serde(alias = "snapshot_max_bytes_per_sec")]
    snapshot_rate: Option<u64>,
    snapshot_logs_since_last: Option<u64>,
    keep_logs: Option<u64>,
    sled_cache_bytes: Option<u64>,
    wal_segment_bytes: Option<u64>,
    worker_threads: Option<usize>,
    max_pending_shards: Option<u32>,
    watch_history: Option<usize>,
    min_free_bytes: Option<u64>,
    datanode_timeout_ms: Option<u64>,
    emulated_sync_latency_us: Option<u64>,
    idle_timeout_secs: Option<u64>,
    follower_reads: Option<Boolish>,
    stop_delay_ms: Option<u64>,
}

/// Everything a node needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSettings {
    /// This node's id.
    pub id: u64,
    /// Where to listen.
    pub listen: String,
    /// An inherited listening socket to serve instead of binding `listen`.
    pub listen_fd: Option<i32>,
    /// Address given to peers and clients; `None` = the bound address.
    pub advertise: Option<String>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Initial members for `init`.
    pub peers: BTreeMap<u64, String>,
    /// Initialize on the first start.
    pub init: bool,
    /// Shared secret.
    pub token: Option<String>,
    /// The members' own secret (`None`: they use `token`).
    pub member_token: Option<String>,
    /// The node's TLS files, if it speaks TLS.
    pub tls: Option<TlsFiles>,
    /// WAL barrier mode.
    pub barrier: BarrierMode,
    /// Snapshot rate of exports, downloads and streams to members (bytes/s, 0 = unlimited).
    pub snapshot_rate: u64,
    /// Automatic snapshot policy (0 = only on request); `None` keeps the node's default.
    pub snapshot_logs_since_last: Option<u64>,
    /// Log entries kept after a snapshot; `None` keeps the node's default.
    pub keep_logs: Option<u64>,
    /// sled cache size; `None` keeps the node's default.
    pub sled_cache_bytes: Option<u64>,
    /// Size of a WAL segment file; `None`: the node's default.
    pub wal_segment_bytes: Option<u64>,
    /// Async runtime worker threads; `None` = one per CPU core.
    pub worker_threads: Option<usize>,
    /// Admission window of the leader in shards; `None` keeps the node's default.
    pub max_pending_shards: Option<u32>,
    /// History kept for watchers, in units; `None` keeps the node's default.
    pub watch_history: Option<usize>,
    /// Free space the leader keeps before refusing writes; `None` keeps the node's default.
    pub min_free_bytes: Option<u64>,
    /// Silence after which the leader calls a datanode down; `None` keeps the node's default.
    pub datanode_timeout: Option<Duration>,
    /// Added to every WAL sync (benchmarks only); zero by default.
    pub emulated_sync_latency: Duration,
    /// How long a connection may wait for a request's headers; `None` = forever.
    pub idle_timeout: Option<Duration>,
    /// Followers answer linearizable reads with the leader's read index (default), or
    /// replay them at the leader.
    pub follower_reads: bool,
    /// How long a stopping node keeps serving with `/readyz` at 503 before it closes its port.
    pub stop_delay: Duration,
}

/// The smallest sled page cache accepted (sled itself refuses less than 256 bytes, by
/// panicking once the data dir was made).
const MIN_SLED_CACHE_BYTES: u64 = 1 << 20;

/// The longest idle timeout accepted: longer ones overflow the clock's arithmetic.
const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// The most runtime worker threads a node starts: more is a typo, and the OS refuses to
/// spawn them long before a number that large.
const MAX_WORKER_THREADS: usize = 1024;

/// Whether `addr` (`host:port`) names the unspecified address (`0.0.0.0`, `[::]`): one to
/// listen on, not one to be reached at.
pub(crate) fn unspecified(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
}

/// Parses `1=ADDR,2=ADDR` (blank: none). An empty entry (two commas in a row, or one at either end) is
/// refused: it is most likely a shell variable that expanded to nothing, and the cluster would
/// form without that member.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>> {
    let mut peers: BTreeMap<u64, String> = BTreeMap::new();
    if text.trim().is_empty() {
        // No entry at all: the caller says that it names no peer.
        return Ok(peers);
    }
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            bail!(
                "the peers {text:?} hold an empty entry (two commas in a row, or one at either \
                 end; a variable that expanded to nothing?): give ID=ADDR for every member"
            );
        }
        let Some((id, addr)) = item.split_once('=') else {
            bail!("peer {item:?} is not ID=ADDR");
        };
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("peer id {id:?} is not an unsigned integer"))?;
        if id == 0 {
            bail!("peer id 0: node ids start at 1");
        }
        let addr = addr.trim();
        meta_http::request::validate_addr(addr).map_err(|e| anyhow::anyhow!("peer {id}: {e}"))?;
        if let Some((other, _)) = peers.iter().find(|(_, a)| a.as_str() == addr) {
            bail!("peers {other} and {id} are both at {addr}: each member needs its own address");
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            bail!("peer {id} is given twice");
        }
    }
    Ok(peers)
}

/// Parses `shared` or `own`.
pub fn parse_barrier(text: &str) -> Result<BarrierMode> {
    match text {
        "shared" => Ok(BarrierMode::Shared),
        "own" => Ok(BarrierMode::Own),
        other => bail!("--barrier must be \"shared\" or \"own\", not {other:?}"),
    }
}

/// `token` (`what` names its flag), refused if it is empty (read as "no token", an empty value
/// would switch authentication off unnoticed, also over a token the config file sets) or if
/// no header can carry it ([`check_token_text`]).
fn set_token(token: Option<String>, what: &str) -> Result<Option<String>> {
    let Some(t) = token.as_deref() else {
        return Ok(None);
    };
    if t.trim().is_empty() {
        bail!("{what} is empty: give a token or leave it unset");
    }
    check_token_text(t, what)?;
    Ok(token)
}

/// Refuses a token (`what` names its setting) that no HTTP header carries as it is: one with
/// blanks around it (a token read from a file with its newline would have every request
/// refused) or with characters other than visible ASCII.
pub(crate) fn check_token_text(t: &str, what: &str) -> Result<()> {
    if t.trim() != t {
        bail!(
            "{what} begins or ends with whitespace (blanks around it: a newline read from a \
             file?): no client sends it so, and every request would be refused; remove it"
        );
    }
    if let Some(c) = t.chars().find(|c| !c.is_ascii_graphic()) {
        bail!(
            "{what} holds {c:?}: a bearer token is visible ASCII (no blanks or control \
             characters), which an HTTP header can carry"
        );
    }
    Ok(())
}

/// `e`, a refusal of the settings that begins with a flag (and perhaps its environment
/// variable), begins with the config file's key instead when only the file gave that setting
/// (`from_file`: flag and key).
fn in_file_terms(e: anyhow::Error, from_file: &[(&str, &str)]) -> anyhow::Error {
    let text = e.to_string();
    let named = from_file.iter().find_map(|(flag, key)| {
        let rest = text.strip_prefix(flag)?;
        let rest = match rest.strip_prefix(" (METASERVER_") {
            Some(env) => &env[env.find(')')? + 1..],
            None => rest,
        };
        rest.starts_with([' ', ':']).then_some((key, rest))
    });
    match named {
        Some((key, rest)) => anyhow::anyhow!("{key} (in the config file){rest}"),
        None => e,
    }
}

fn read_file(path: &Path) -> Result<FileSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    // The two names of one setting: toml's own error for both would say the first is given
    // twice.
    if let Ok(table) = toml::from_str::<toml::Table>(&text) {
        if table.contains_key("snapshot_rate") && table.contains_key("snapshot_max_bytes_per_sec") {
            bail!(
                "config file {}: snapshot_rate and snapshot_max_bytes_per_sec are two names of \
                 one setting: give one",
                path.display()
            );
        }
    }
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

impl ServeSettings {
    /// Merges flags/environment over the config file over the defaults. `default_mode` is the
    /// command-less `metaserver`: as node 1 without peers, it initializes itself unless told
    /// otherwise.
    pub fn resolve(args: &ServeArgs, default_mode: bool) -> Result<Self> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        // The settings that only the config file gave, as (flag, key): a refusal of one names
        // the key, not a flag the operator never gave.
        macro_rules! only_in_file {
            ($($field:ident => $flag:literal),* $(,)?) => {
                [$((
                    $flag,
                    stringify!($field),
                    args.$field.is_none() && file.$field.is_some(),
                )),*]
            };
        }
        let from_file: Vec<(&str, &str)> = only_in_file![
            id => "--id",
            worker_threads => "--worker-threads",
            wal_segment_bytes => "--wal-segment-bytes",
            max_pending_shards => "--max-pending-shards",
            datanode_timeout_ms => "--datanode-timeout-ms",
            sled_cache_bytes => "--sled-cache-bytes",
            idle_timeout_secs => "--idle-timeout-secs",
            emulated_sync_latency_us => "--emulated-sync-latency-us",
            watch_history => "--watch-history",
            listen => "--listen",
            advertise => "--advertise",
            peers => "--peers",
            token => "--token",
            member_token => "--member-token",
            data_dir => "--data-dir",
            barrier => "--barrier",
        ]
        .into_iter()
        .filter(|(_, _, only)| *only)
        .map(|(flag, key, _)| (flag, key))
        .collect();
        Self::merge(args, file, default_mode).map_err(|e| in_file_terms(e, &from_file))
    }

    /// [`ServeSettings::resolve`] with the config file read: merges and checks.
    fn merge(args: &ServeArgs, file: FileSettings, default_mode: bool) -> Result<Self> {
        let peers = match args.peers.as_deref().or(file.peers.as_deref()) {
            Some(text) => {
                let peers = parse_peers(text)
                    .map_err(|e| anyhow::anyhow!("--peers (METASERVER_PEERS): {e}"))?;
                if peers.is_empty() {
                    // An empty value (an unset variable in a unit file, say) would otherwise
                    // read as "no peers": a node told to initialize would form a cluster alone.
                    bail!("--peers (METASERVER_PEERS) names no peer: give ID=ADDR,.. or leave it unset");
                }
                peers
            }
            None => BTreeMap::new(),
        };
        let token = set_token(
            args.token.clone().or(file.token),
            "--token (METASERVER_TOKEN)",
        )?;
        let member_token = set_token(
            args.member_token.clone().or(file.member_token),
            "--member-token (METASERVER_MEMBER_TOKEN)",
        )?;
        let data_dir = args.data_dir.clone().or(file.data_dir);
        // An empty path would put the node's files in the working directory (and one of
        // blanks in a directory named so there).
        let blank = |d: &PathBuf| d.to_str().is_some_and(|s| s.trim().is_empty());
        if data_dir.as_ref().is_some_and(blank) {
            bail!(
                "--data-dir (METASERVER_DATA_DIR) is empty: give a directory or leave it unset \
                 (default {DEFAULT_DATA_DIR})"
            );
        }
        let tls = TlsFiles::resolve(
            args.tls_cert.clone().or(file.tls_cert),
            args.tls_key.clone().or(file.tls_key),
            args.tls_ca.clone().or(file.tls_ca),
        )?;
        // The command-less node initializes itself only as the one node it is documented to
        // be: an id other than 1 says it is meant to join a cluster (a forgotten `serve`), and
        // a cluster of its own would refuse to join any (`other_cluster`) until wiped.
        let id = args.id.or(file.id).unwrap_or(1);
        let init = args
            .init
            .or(file.init.map(|b| b.0))
            .unwrap_or(default_mode && peers.is_empty() && id == 1);
        let barrier = match args.barrier.as_deref().or(file.barrier.as_deref()) {
            Some(text) => parse_barrier(text)?,
            None => BarrierMode::Shared,
        };
        let settings = ServeSettings {
            id,
            listen: args
                .listen
                .clone()
                .or(file.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.to_owned()),
            listen_fd: args.listen_fd,
            advertise: args.advertise.clone().or(file.advertise),
            data_dir: data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            peers,
            init,
            token,
            member_token,
            tls,
            barrier,
            snapshot_rate: args.snapshot_rate.or(file.snapshot_rate).unwrap_or(0),
            snapshot_logs_since_last: args
                .snapshot_logs_since_last
                .or(file.snapshot_logs_since_last),
            keep_logs: args.keep_logs.or(file.keep_logs),
            sled_cache_bytes: args.sled_cache_bytes.or(file.sled_cache_bytes),
            wal_segment_bytes: args.wal_segment_bytes.or(file.wal_segment_bytes),
            worker_threads: args.worker_threads.or(file.worker_threads),
            max_pending_shards: args.max_pending_shards.or(file.max_pending_shards),
            watch_history: args.watch_history.or(file.watch_history),
            min_free_bytes: args.min_free_bytes.or(file.min_free_bytes),
            datanode_timeout: args
                .datanode_timeout_ms
                .or(file.datanode_timeout_ms)
                .map(Duration::from_millis),
            emulated_sync_latency: Duration::from_micros(
                args.emulated_sync_latency_us
                    .or(file.emulated_sync_latency_us)
                    .unwrap_or(0),
            ),
            idle_timeout: match args.idle_timeout_secs.or(file.idle_timeout_secs) {
                None => Some(meta_http::server::DEFAULT_IDLE_TIMEOUT),
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
            },
            follower_reads: args
                .follower_reads
                .or(file.follower_reads.map(|b| b.0))
                .unwrap_or(true),
            stop_delay: Duration::from_millis(
                args.stop_delay_ms.or(file.stop_delay_ms).unwrap_or(0),
            ),
        };
        settings.check()?;
        Ok(settings)
    }

    fn check(&self) -> Result<()> {
        if self.id == 0 {
            bail!("--id must be at least 1 (0 means \"no node\" in metrics and status)");
        }
        if self
            .worker_threads
            .is_some_and(|n| !(1..=MAX_WORKER_THREADS).contains(&n))
        {
            bail!("--worker-threads must be at least 1 and at most {MAX_WORKER_THREADS}");
        }
        if let Some(n) = self.wal_segment_bytes {
            let (min, max) = (
                meta_consensus::MIN_SEGMENT_BYTES,
                meta_consensus::MAX_SEGMENT_BYTES,
            );
            if !(min..=max).contains(&n) {
                bail!(
                    "--wal-segment-bytes must be between {min} and {max} (1 GiB): a restart reads \
                     a segment into memory whole"
                );
            }
        }
        if self.max_pending_shards == Some(0) {
            bail!("--max-pending-shards must be at least 1");
        }
        if self.datanode_timeout == Some(Duration::ZERO) {
            bail!("--datanode-timeout-ms must be at least 1");
        }
        if self
            .sled_cache_bytes
            .is_some_and(|n| n < MIN_SLED_CACHE_BYTES)
        {
            bail!("--sled-cache-bytes must be at least {MIN_SLED_CACHE_BYTES} (1 MiB)");
        }
        if self.idle_timeout.is_some_and(|t| t > MAX_IDLE_TIMEOUT) {
            bail!(
                "--idle-timeout-secs must be at most {} (a year; 0 waits forever)",
                MAX_IDLE_TIMEOUT.as_secs()
            );
        }
        // The members keep an idle connection to each other for a second less than this: a
        // server that closed it sooner could cut the next Raft message sent on it.
        let min = meta_http::server::MEMBERS_IDLE_TIMEOUT;
        if self.idle_timeout.is_some_and(|t| t < min) {
            bail!(
                "--idle-timeout-secs must be 0 (never close) or at least {}: the members keep \
                 idle connections to each other open for {} s, and a server that closes them \
                 sooner could cut a Raft message sent on one",
                min.as_secs(),
                min.as_secs() - 1
            );
        }
        // A sync slowed by seconds would make the node unusable (its open, and its stop, wait
        // for syncs): far past any disk it could stand for.
        if self.emulated_sync_latency > MAX_EMULATED_SYNC_LATENCY {
            bail!(
                "--emulated-sync-latency-us must be at most {} (a second); got {}",
                MAX_EMULATED_SYNC_LATENCY.as_micros(),
                self.emulated_sync_latency.as_micros()
            );
        }
        if self.watch_history == Some(0) {
            bail!(
                "--watch-history must be at least 1 (with none, every watch would be answered 410)"
            );
        }
        // Checked here, not only by the bind, so that the refusal names the setting.
        if self.listen_fd.is_none() {
            meta_http::request::check_listen_addr(&self.listen).map_err(|why| {
                anyhow::anyhow!(
                    "--listen (METASERVER_LISTEN) {:?} is not host:port: {why}",
                    self.listen
                )
            })?;
        }
        if let Some(addr) = &self.advertise {
            meta_http::request::validate_addr(addr)
                .map_err(|e| anyhow::anyhow!("--advertise: {e}"))?;
            if unspecified(addr) {
                bail!("--advertise {addr}: the other members cannot reach a node at an unspecified address; give one they can reach");
            }
        }
        if let Some((id, addr)) = self.peers.iter().find(|(_, a)| unspecified(a)) {
            bail!("--peers gives node {id} the unspecified address {addr}: give one the members can reach");
        }
        // `--peers` naming this node elsewhere than `--advertise` is refused only when a
        // cluster is initialized from them (`initial_members`): a node restarted at a new
        // address (README, "Move a node") keeps the `--peers` it was started with, which
        // nothing reads any more.
        Ok(())
    }

    /// The node configuration, once the advertised address is known.
    pub fn node_config(&self, addr: &str) -> NodeConfig {
        let mut cfg = NodeConfig::new(self.id, addr, &self.data_dir);
        cfg.barrier = self.barrier;
        cfg.snapshot_max_bytes_per_sec = self.snapshot_rate;
        if let Some(n) = self.snapshot_logs_since_last {
            cfg.snapshot_logs_since_last = n;
        }
        if let Some(n) = self.keep_logs {
            cfg.max_in_snapshot_log_to_keep = n;
        }
        if let Some(n) = self.sled_cache_bytes {
            cfg.sled_cache_bytes = n;
        }
        if let Some(n) = self.wal_segment_bytes {
            cfg.wal_segment_bytes = n;
        }
        if let Some(n) = self.max_pending_shards {
            cfg.max_pending_shards = n;
        }
        if let Some(n) = self.watch_history {
            cfg.watch_history = n;
        }
        if let Some(n) = self.min_free_bytes {
            cfg.min_free_bytes = n;
        }
        if let Some(t) = self.datanode_timeout {
            cfg.datanode_timeout = t;
        }
        cfg.emulated_sync_latency = self.emulated_sync_latency;
        cfg
    }

    /// The address this node gives the members, listening at `bound`: --advertise, else its
    /// entry in --peers, else the bound address. A node that forms a cluster (--init) must give
    /// one the members can reach: the membership keeps it, and a learner added later would
    /// send its writes to an unspecified address (its own host).
    pub fn advertised(&self, bound: std::net::SocketAddr) -> Result<String> {
        let addr = self
            .advertise
            .clone()
            .or_else(|| self.peers.get(&self.id).cloned())
            .unwrap_or_else(|| bound.to_string());
        if self.init && unspecified(&addr) {
            bail!(
                "listening on all interfaces ({bound}) without --advertise: the cluster this \
                 node forms would name it at {addr}, where no other member can reach it; give \
                 --advertise HOST:PORT (an address the members can reach)"
            );
        }
        Ok(addr)
    }

    /// A warning for a node whose address comes from its `--peers` entry (no `--advertise`)
    /// but that listens elsewhere, as after a restart with a new `--listen` and the old
    /// `--peers`: the members go on sending to the old address, where nothing may answer.
    /// `None` when the two can be the same socket (the same port, and the same host or a bound
    /// address on all interfaces) or an entry is not an IP address and port.
    pub fn listening_elsewhere(&self, bound: std::net::SocketAddr, addr: &str) -> Option<String> {
        if self.advertise.is_some() {
            return None;
        }
        let told: std::net::SocketAddr = addr.parse().ok()?;
        let same =
            told.port() == bound.port() && (bound.ip().is_unspecified() || told.ip() == bound.ip());
        (!same).then(|| {
            format!(
                "--peers names this node (id {}) at {addr}, but it listens at {bound}: the \
                 members are told {addr}; if that does not reach this node (it moved), give \
                 --advertise HOST:PORT, or correct --peers",
                self.id
            )
        })
    }

    /// A warning for a node that initializes from a `--peers` list that does not name it: it
    /// joins them as one more voter at `addr`, which a list meant to name every member (with
    /// a wrong `--id`, say) did not intend.
    pub fn unnamed_in_peers(&self, addr: &str) -> Option<String> {
        (!self.peers.is_empty() && !self.peers.contains_key(&self.id)).then(|| {
            format!(
                "--peers does not name this node (id {}): it joins them at {addr}, in a cluster \
                 of {} voters",
                self.id,
                self.peers.len() + 1
            )
        })
    }

    /// The members to initialize with: `--peers` (plus this node at `addr`, where it answers),
    /// or this node alone. Refused, before anything is initialized, as the init route refuses
    /// them (`InitBody::validate`, `InitBody::validate_names`): `--peers` naming this node at another address, or another
    /// node at this one, would give the membership an address where nothing answers, or one
    /// process for two members.
    pub fn initial_members(&self, addr: &str) -> Result<BTreeMap<u64, String>> {
        let mut members = self.peers.clone();
        members.entry(self.id).or_insert_with(|| addr.to_owned());
        let body = meta_http::request::InitBody { members };
        body.validate()
            .and_then(|()| body.validate_names(self.id, addr))
            .map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
        Ok(body.members)
    }
}

#[cfg(test)]
mod tests;
