//! Response bodies of the admin API. Their field names are part of the API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `PUT /v1/datanodes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRegistered {
    /// The datanode's id.
    pub id: u64,
    /// Its new incarnation epoch; shard batches must carry it.
    pub epoch: u64,
}

/// One datanode in `GET /v1/datanodes` and the body of `GET /v1/datanodes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeView {
    /// The datanode's id.
    pub id: u64,
    /// Its address, `host:port`.
    pub addr: String,
    /// Its current incarnation epoch.
    pub epoch: u64,
    /// How many shard replicas it holds.
    pub shards: u64,
    /// `true` while a removal of it that began has not ended (every request of it is fenced,
    /// whatever its epoch); left out otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removing: bool,
}

/// `GET /v1/datanodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeList {
    /// Registered datanodes, by id.
    pub datanodes: Vec<DatanodeView>,
    /// Cursor for the next page (`?after=`), `null` on the last page.
    pub next: Option<String>,
}

/// `POST /v1/datanodes/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRecorded {
    /// The leader calls the datanode down if no heartbeat follows within this many ms.
    pub timeout_ms: u64,
}

/// One datanode in `GET /v1/liveness`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeLivenessView {
    /// The datanode's id.
    pub id: u64,
    /// Its address, `host:port`.
    pub addr: String,
    /// Its current incarnation epoch.
    pub epoch: u64,
    /// How many shard replicas it holds.
    pub shards: u64,
    /// `alive` (heard within the timeout), `down` (not heard within the timeout) or `unknown`
    /// (not heard yet by a leader that has not listened for a whole timeout).
    pub state: String,
    /// Since its current incarnation's last heartbeat heard by this leader, if any.
    pub heard_ms_ago: Option<u64>,
    /// `true` while a removal of it that began has not ended (its heartbeats are fenced);
    /// left out otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removing: bool,
}

/// `GET /v1/liveness`: every registered datanode's liveness, as the leader heard them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessView {
    /// The leader that answers (heartbeats are kept by the leader only).
    pub leader_id: u64,
    /// A datanode is down after this many ms without a heartbeat.
    pub timeout_ms: u64,
    /// How long this leader has been collecting heartbeats, in ms.
    pub collecting_ms: u64,
    /// Registered datanodes (in the state asked for, if any), by id.
    pub datanodes: Vec<DatanodeLivenessView>,
    /// Cursor for the next page (`?after=`), `null` on the last page.
    pub next: Option<String>,
}

/// `DELETE /v1/datanodes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRemoved {
    /// The removed datanode's id.
    pub id: u64,
    /// How many replicas were dropped with it.
    pub replicas_removed: u64,
    /// Log index of the removal.
    pub index: u64,
}

/// `POST /v1/datanodes/{id}/shards`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardsRegistered {
    /// Replicas that were new or changed.
    pub accepted: u64,
    /// Replicas registered before with this generation and size (by this incarnation or an
    /// earlier one; either way they now count as reported by this one, for a prune).
    pub unchanged: u64,
    /// Shard ids refused because a higher generation is registered.
    pub stale: Vec<u64>,
    /// Log index of the batch.
    pub index: u64,
}

/// `DELETE /v1/datanodes/{id}/shards/{shard}` and `POST /v1/datanodes/{id}/prune`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardsDeregistered {
    /// Replicas removed (1 for a single replica).
    pub removed: u64,
    /// Log index of the removal.
    pub index: u64,
}

/// One replica in a shard listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntryView {
    /// Shard id.
    pub id: u64,
    /// The datanode holding this replica.
    pub datanode: u64,
    /// The replica's generation.
    pub generation: u64,
    /// The replica's size in bytes.
    pub size: u64,
}

/// `GET /v1/shards` and `GET /v1/datanodes/{id}/shards`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPage {
    /// Replicas in (shard, datanode) order, or shard order for one datanode.
    pub shards: Vec<ShardEntryView>,
    /// Cursor for the next page (`?after=`), `null` on the last page.
    pub next: Option<String>,
}

/// One replica of a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    /// The datanode holding it.
    pub datanode: u64,
    /// The replica's generation.
    pub generation: u64,
    /// The replica's size in bytes.
    pub size: u64,
}

/// `GET /v1/shards/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardView {
    /// Shard id.
    pub id: u64,
    /// Its replicas, by datanode.
    pub replicas: Vec<ReplicaView>,
}

/// `PUT /v1/kv/{key}` and `DELETE /v1/kv/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvWritten {
    /// The key's revision after the write (the write's log index).
    pub revision: u64,
    /// The history the revision counts in (give it back with `if_revision` as `history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

/// One key in `GET /v1/kv`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvKeyView {
    /// The key.
    pub key: String,
    /// Its revision.
    pub revision: u64,
}

/// `GET /v1/kv`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvKeyPage {
    /// Keys in order.
    pub keys: Vec<KvKeyView>,
    /// Cursor for the next page, `null` on the last page.
    pub next: Option<String>,
    /// The history the revisions count in (give it back with `if_revision` as `history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

/// The newest snapshot in `GET /v1/cluster`, and the answer of `POST /v1/cluster/snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotView {
    /// Last log index the snapshot covers.
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// WAL figures in `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalView {
    /// Records appended since the log was opened.
    pub appends: u64,
    /// fsync barriers run since the log was opened.
    pub barriers: u64,
    /// `appends / barriers` (0 before the first barrier).
    pub appends_per_barrier: f64,
}

/// `GET /v1/cluster`: this node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// This node's id.
    pub id: u64,
    /// `leader`, `leader_without_quorum`, `follower`, `candidate`, `learner`, `uninitialized`,
    /// `removed` or `shutdown`.
    pub role: String,
    /// The leader's id, if known.
    pub leader_id: Option<u64>,
    /// The leader's HTTP address, if known.
    pub leader_addr: Option<String>,
    /// Current term.
    pub term: u64,
    /// Voting members (of both voter sets while a voter change is half done).
    pub voters: Vec<u64>,
    /// While a voter change is half done (a joint membership, whose commits need a majority of
    /// each set), the old and the new voter set; `null` otherwise. The next `PUT
    /// /v1/cluster/voters` goes on from there to the voters it names.
    #[serde(default)]
    pub joint: Option<Vec<Vec<u64>>>,
    /// Non-voting members.
    pub learners: Vec<u64>,
    /// Every member's address, by id.
    pub nodes: BTreeMap<u64, String>,
    /// Index of the last log entry on this node.
    pub last_log_index: u64,
    /// Highest index known committed.
    pub committed: u64,
    /// Highest index applied to the registry.
    pub applied: u64,
    /// Highest index purged from this node's log (0 = none): a follower further behind than
    /// this catches up by snapshot.
    pub purged: u64,
    /// Newest snapshot, if any.
    pub snapshot: Option<SnapshotView>,
    /// Write-ahead log figures.
    pub wal: WalView,
    /// Registered datanodes.
    pub datanodes: u64,
    /// Registered shard replicas.
    pub replicas: u64,
    /// Each member's progress as the leader sees it, by id (on the leader only; empty on the
    /// others): what to watch before promoting a learner, or to find a member that is down.
    #[serde(default)]
    pub replication: BTreeMap<u64, ReplicationView>,
    /// The cluster's version as this node applied it: which log commands every member can
    /// apply. The leader raises it when a command first needs more, once every member runs a
    /// build of that version; it never goes back.
    #[serde(default)]
    pub cluster_version: u32,
    /// The highest cluster version this node's build applies.
    #[serde(default)]
    pub build_version: u32,
    /// The cluster's epoch floor as this node applied it (0: never raised): every
    /// registration's epoch is at least this (`PUT /v1/cluster/epoch-floor`; a restore raises
    /// it).
    #[serde(default)]
    pub epoch_floor: u64,
    /// A restore into the cluster that has not ended, as this node applied it: under way, or
    /// cut off part way (the cluster then holds part of a backup). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreView>,
    /// The build version each member answered the leader with recently, by id (`null`: no
    /// recent answer), on the leader only.
    #[serde(default)]
    pub member_versions: BTreeMap<u64, Option<u32>>,
    /// Bytes free on this node's data dir's file system (`null`: it could not be read).
    #[serde(default)]
    pub data_dir_free_bytes: Option<u64>,
    /// The free space below which this node, leading, refuses writes that add data
    /// (`--min-free-bytes`; 0: never).
    #[serde(default)]
    pub min_free_bytes: u64,
    /// While this node rejoins (it started on an empty data dir and does not hold the
    /// cluster's log yet): the term enough other voters told it (`term_floor`, `null` until
    /// they did), until then which of them it is waiting for (`waiting`), and whether it knows
    /// which cluster it belongs to (`knows_cluster`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejoin: Option<RejoinView>,
    /// On a node whose role is `removed`: the membership that left it out (`membership_index`,
    /// the log index of that change) and the members it names (`members`), as this node learned
    /// it. Its `voters`, `learners` and `nodes` are then the membership it last held, which may
    /// still name it: the leader stops replicating to a removed node before it could learn the
    /// change from the log. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_from: Option<RemovedFromView>,
    /// The members whose answers lately refused this node's messages because they belong to
    /// another cluster: on a node initialized on its own by mistake (a wiped node started with
    /// `--init`), its former peers; on their leader, that node. Absent when none did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_by: Vec<u64>,
    /// The members whose answers lately refused this node's token (401: one side was started
    /// with another `--token`): on such a member, the others; on their leader, that member.
    /// Absent when none did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_refused_by: Vec<u64>,
    /// `true` once this node began a planned stop (it hands its leadership over, if it leads,
    /// and closes): no leadership is handed to it. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopping: bool,
    /// Why this node refused the leader's snapshot for want of room, if it did in the last
    /// minute: it cannot catch up until it has room. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_refused: Option<String>,
    /// Why this node refuses its TLS files as they are now (renewed ones that do not work, or
    /// cannot be read): it serves with the ones it took before, and would not start with
    /// these. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_files_refused: Option<String>,
}

/// A restore that has not ended (see [`ClusterView::restore`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreView {
    /// The log index of the restore's claim on the cluster.
    pub claimed_at: u64,
    /// The backup it replays: its snapshot's index and what it holds.
    pub backup: BackupView,
}

/// What a backup holds (see [`RestoreView`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupView {
    pub index: u64,
    pub datanodes: u64,
    pub replicas: u64,
    pub keys: u64,
}

impl From<meta_consensus::RestoreMark> for RestoreView {
    fn from(m: meta_consensus::RestoreMark) -> Self {
        RestoreView {
            claimed_at: m.claimed_at,
            backup: BackupView {
                index: m.origin.index,
                datanodes: m.origin.datanodes,
                replicas: m.origin.replicas,
                keys: m.origin.keys,
            },
        }
    }
}

/// A rejoining node's progress (see [`ClusterView::rejoin`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejoinView {
    pub term_floor: Option<u64>,
    pub waiting: Option<String>,
    /// It knows which cluster it belongs to: it waits for that cluster's leader.
    #[serde(default)]
    pub knows_cluster: bool,
}

/// The membership a removed node was left out of (see [`ClusterView::removed_from`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedFromView {
    pub membership_index: u64,
    pub members: Vec<u64>,
}

/// One member's progress, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationView {
    /// The highest log index known to be on it (`None`: nothing yet).
    pub matched: Option<u64>,
    /// How many entries it is behind the leader's last.
    pub lag: u64,
    /// Milliseconds since it last answered the leader, or since the leader took office if it
    /// never has (`None` only in the moment before the leader notes when it took office).
    pub heard_ms: Option<u64>,
    /// Why it refused the leader's last snapshot for want of room, if it did in the last
    /// minute: it cannot catch up until it has room. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_refused: Option<String>,
}

/// `DELETE /v1/cluster/restore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreEndedView {
    /// The restore's mark removed: `null` when the cluster held none.
    pub ended: Option<RestoreView>,
}

/// `PUT /v1/cluster/epoch-floor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochFloorView {
    /// The cluster's epoch floor now: every registration gets an epoch of at least this.
    pub epoch_floor: u64,
}

/// `POST /v1/cluster/init`, `POST /v1/cluster/learners`, `PUT /v1/cluster/voters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipView {
    /// Voting members after the change.
    pub voters: Vec<u64>,
    /// The old and the new voter set while a voter change is half done (see
    /// [`ClusterView::joint`]); `null` otherwise.
    #[serde(default)]
    pub joint: Option<Vec<Vec<u64>>>,
    /// Non-voting members after the change.
    pub learners: Vec<u64>,
}

/// `PUT /v1/cluster/leader`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderView {
    /// The node that leads now: the one asked for.
    pub leader: u64,
    /// Its term.
    pub term: u64,
}

/// `GET /v1/config` and `PATCH /v1/config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    /// Snapshot rate (exports, downloads, streams to members) in bytes per second; 0 = unlimited.
    pub snapshot_max_bytes_per_sec: u64,
}

/// `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    /// `ok`, or what the node is waiting for.
    pub status: String,
}

/// `GET /v1/watch`: the changes after the index asked for, in log order, and the index to watch
/// from next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchPage {
    pub index: u64,
    /// The name of the history `index` counts in: give it back with the next watch
    /// (`history=`), so that an index of another cluster (one restored from a backup) is
    /// refused rather than taken as this one's. `None` on a node of no cluster.
    #[serde(default)]
    pub history: Option<String>,
    pub events: Vec<EventView>,
}

/// One change: the log index of the entry that made it, and what it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    pub index: u64,
    #[serde(flatten)]
    pub change: ChangeView,
}

/// What a change was, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChangeView {
    DatanodeRegistered {
        datanode: u64,
        addr: String,
        epoch: u64,
    },
    DatanodeRemoved {
        datanode: u64,
        replicas_removed: u64,
    },
    ReplicasRegistered {
        datanode: u64,
        shards: Vec<u64>,
    },
    ReplicasRemoved {
        datanode: u64,
        shards: Vec<u64>,
    },
    /// The key's revision is the event's index.
    KvPut {
        key: String,
    },
    KvDeleted {
        key: String,
    },
}
