//! A node's configuration: identity, data dir, barrier mode, snapshot pacing and policy,
//! sled cache size and Raft timing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use meta_store::BarrierMode;

use crate::addresses::Addresses;
use crate::cluster_id::ClusterId;
use crate::cluster_version::{PeerVersions, BUILD_VERSION};
use crate::error::{Error, Result};
use crate::free_space::FreeSpace;
use crate::peer_refusals::PeerRefusals;
use crate::removal_notice::RemovalNotice;
use crate::snapshot_pace::SnapshotPace;
use crate::types::NodeId;

/// Most entries the leader puts in one AppendEntries request. Each entry holds one client
/// command, so a transport that bounds a command's size bounds a request's size with this
/// (the HTTP transport checks, at compile time, that such a request fits in one of its
/// frames). 64 is more than the entries queued behind one request at 64 clients.
pub const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// How to open a [`MetaNode`](crate::MetaNode).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    /// The address peers and clients reach this node at (stored in the membership).
    pub addr: String,
    /// Holds `wal/`, `registry/` (sled) and `snapshots/`.
    pub data_dir: PathBuf,
    /// `Shared` (group commit, the default) or `Own` (every log entry its own barrier; benches).
    pub barrier: BarrierMode,
    /// Pace of snapshot export, downloads and streams to members, in bytes per second; 0 =
    /// unlimited. Changeable at runtime.
    pub snapshot_max_bytes_per_sec: u64,
    /// The limiter that paces them, shared with the transport (which streams snapshots to
    /// members through it); set to `snapshot_max_bytes_per_sec` when the node opens.
    pub snapshot_pace: SnapshotPace,
    /// sled page cache size.
    pub sled_cache_bytes: u64,
    /// Build a snapshot automatically once this many entries were applied since the last one;
    /// 0 = only on request.
    pub snapshot_logs_since_last: u64,
    /// Log entries already in a snapshot that are kept for lagging followers.
    pub max_in_snapshot_log_to_keep: u64,
    /// How many snapshot files to keep.
    pub snapshots_to_keep: usize,
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// How long a write or linearizable read may wait for commit/apply.
    pub request_timeout: Duration,
    /// How long a received snapshot may take to install.
    pub install_snapshot_timeout: Duration,
    /// WAL segment size.
    pub wal_segment_bytes: u64,
    /// Admission window of the leader: writes in flight (proposed, not yet applied) may hold
    /// at most this many shards between them (a command weighs its shard count, at least 1).
    /// Further writes wait before they are proposed, so the applied index stays close to the
    /// committed one and a linearizable read never queues behind more than this much apply
    /// work, even during a registration storm.
    pub max_pending_shards: u32,
    /// How much history of changes the node keeps for watchers, in units: an event costs one
    /// unit plus one per shard id it names and one per 8 bytes of its key or address (see
    /// `change_feed.rs`). 0 keeps none: every watch from an index before the newest event is
    /// told the history is compacted.
    pub watch_history: usize,
    /// The leader refuses writes that add data (507) while the data dir's file system has
    /// less free than this, and any member a snapshot that would leave less free; 0 turns the
    /// write guard off (the room a snapshot's install takes is checked still; see
    /// `node/free_space.rs`).
    pub min_free_bytes: u64,
    /// How the free space of the data dir's file system is read: `statvfs` unless a test
    /// stands in a disk as full as it needs.
    pub free_space: FreeSpace,
    /// The leader calls a registered datanode down when it has sent no heartbeat for this long
    /// (see `liveness.rs`).
    pub datanode_timeout: Duration,
    /// The cluster this node belongs to, shared with the transport (which sends it with every
    /// message to a member and refuses messages of another cluster); filled from the data dir at
    /// open, set when the node initializes a cluster or is first reached by a member.
    pub cluster_id: ClusterId,
    /// A member's notice that this node was removed from the cluster, shared with the
    /// transport, which hands it the notices that come back with answers to vote requests.
    pub removal_notice: RemovalNotice,
    /// The members' current addresses, kept by the node from its membership and shared with
    /// the transport, which sends every message to the address there.
    pub addresses: Addresses,
    /// The versions of the members' builds, shared with the transport, which notes the
    /// version every answer to this node's messages carries (see `cluster_version.rs`).
    pub peer_versions: PeerVersions,
    /// The members that refuse this node's messages as another cluster's, shared with the
    /// transport, which notes every member's answer (see `peer_refusals.rs`).
    pub peer_refusals: PeerRefusals,
    /// The version this node's build answers with and applies up to: [`BUILD_VERSION`]; tests
    /// set it lower to play a member of an older build.
    pub build_version: u32,
    /// Whether a cluster this node forms raises its version to its members' builds as soon as
    /// every member answered (`node/versions.rs`). `false` plays a cluster formed by a build
    /// before that, whose version rises only when a command needs it (tests of upgrades).
    pub raise_version_at_formation: bool,
    /// Added to every WAL sync, to emulate a disk with slower barriers: benchmarks only.
    pub emulated_sync_latency: Duration,
    /// The file system the log's files go through; `None` is the operating system's. Tests
    /// give one that loses unsynced bytes at a simulated power loss.
    pub wal_fs: Option<Arc<dyn meta_store::FileSystem>>,
}

impl NodeConfig {
    /// A configuration with defaults for everything but identity and place.
    pub fn new(id: NodeId, addr: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            id,
            addr: addr.into(),
            data_dir: data_dir.into(),
            barrier: BarrierMode::Shared,
            snapshot_max_bytes_per_sec: 0,
            snapshot_pace: SnapshotPace::default(),
            sled_cache_bytes: 64 << 20,
            snapshot_logs_since_last: 100_000,
            max_in_snapshot_log_to_keep: 10_000,
            snapshots_to_keep: 2,
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
            request_timeout: Duration::from_secs(10),
            install_snapshot_timeout: Duration::from_secs(600),
            wal_segment_bytes: 64 << 20,
            max_pending_shards: 4_096,
            watch_history: crate::change_feed::DEFAULT_HISTORY,
            cluster_id: ClusterId::default(),
            removal_notice: RemovalNotice::default(),
            addresses: Addresses::default(),
            peer_versions: PeerVersions::default(),
            peer_refusals: PeerRefusals::default(),
            build_version: BUILD_VERSION,
            raise_version_at_formation: true,
            min_free_bytes: 128 << 20,
            free_space: FreeSpace::default(),
            datanode_timeout: Duration::from_secs(10),
            emulated_sync_latency: Duration::ZERO,
            wal_fs: None,
        }
    }

    /// The longest election timeout: how long a member may wait before it campaigns.
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.election_max_ms)
    }

    /// Checks the values that openraft or the stores would refuse later.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.addr.is_empty() {
            return bad("node address is empty".into());
        }
        if self.heartbeat_ms == 0 || self.election_min_ms <= self.heartbeat_ms {
            return bad(format!(
                "election_min_ms ({}) must exceed heartbeat_ms ({}) > 0",
                self.election_min_ms, self.heartbeat_ms
            ));
        }
        if self.election_max_ms <= self.election_min_ms {
            return bad(format!(
                "election_max_ms ({}) must exceed election_min_ms ({})",
                self.election_max_ms, self.election_min_ms
            ));
        }
        if self.snapshots_to_keep == 0 {
            return bad("snapshots_to_keep must be at least 1".into());
        }
        if self.max_pending_shards == 0 {
            return bad("max_pending_shards must be at least 1".into());
        }
        if self.build_version == 0 || self.build_version > BUILD_VERSION {
            return bad(format!(
                "build_version must be between 1 and {BUILD_VERSION}"
            ));
        }
        if self.datanode_timeout.is_zero() {
            return bad("datanode_timeout must be more than zero".into());
        }
        if !(meta_store::MIN_SEGMENT_BYTES..=meta_store::MAX_SEGMENT_BYTES)
            .contains(&self.wal_segment_bytes)
        {
            return bad(format!(
                "wal_segment_bytes must be between {} and {}",
                meta_store::MIN_SEGMENT_BYTES,
                meta_store::MAX_SEGMENT_BYTES
            ));
        }
        Ok(())
    }

    pub(crate) fn wal_dir(&self) -> PathBuf {
        self.data_dir.join("wal")
    }

    pub(crate) fn registry_dir(&self) -> PathBuf {
        self.data_dir.join("registry")
    }

    pub(crate) fn snapshot_dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// The openraft configuration derived from this one: batching of client writes and of
    /// storage appends, loopback-friendly timeouts, the streaming snapshot timeout and the
    /// snapshot policy.
    pub(crate) fn raft_config(&self) -> Result<openraft::Config> {
        let policy = if self.snapshot_logs_since_last == 0 {
            openraft::SnapshotPolicy::Never
        } else {
            openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_logs_since_last)
        };
        let cfg = openraft::Config {
            cluster_name: "metaserver".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_min_ms,
            election_timeout_max: self.election_max_ms,
            install_snapshot_timeout: self.install_snapshot_timeout.as_millis() as u64,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            max_append_entries: Some(4096),
            api_batch_capacity: 4096,
            api_batch_linger_ms: 0,
            replication_lag_threshold: self.max_in_snapshot_log_to_keep.max(1000) * 2,
            snapshot_policy: policy,
            max_in_snapshot_log_to_keep: self.max_in_snapshot_log_to_keep,
            purge_batch_size: 1,
            backoff: "20ms 40ms ...500ms".into(),
            // A follower that lost entries it acknowledged (a damaged log cut at recovery, a
            // lost disk) comes back with a shorter log than the leader recorded as matched; the
            // rest of the quorum still holds them, so the leader re-replicates instead of
            // panicking (see ARCHITECTURE.md, Decisions).
            allow_log_reversion: Some(true),
            // A node that cannot hear the leader but reaches the others (a one-way cut, a
            // member stopping with its port closed) asks first whether it could win, and does
            // not raise its term when it could not: it cannot depose a healthy leader.
            enable_pre_vote: Some(true),
            // A restarted leader stands for election like any node. Restored at once, a leader
            // whose own log lost entries in a power loss (it commits once a quorum of followers
            // holds them durably, before its own barrier) led with a shorter log than the
            // quorum's and overwrote acknowledged writes on the followers.
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        cfg.validate()
            .map_err(|e| Error::InvalidArgument(format!("raft config: {e}")))
    }
}
