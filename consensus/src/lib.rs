//! The metaserver's replicated state machine: openraft over the `meta-store` write-ahead log,
//! with the shard registry kept in sled.
//!
//! - [`MetaNode`]: open a node from a data dir, write commands, read the registry with a
//!   consistency choice, manage membership, take snapshots, read status.
//! - [`Command`] / [`CommandResult`]: the registry's commands and their results.
//! - [`transport`]: the in-process transport (tests, benches); the crate is generic over
//!   openraft's network factory and knows nothing of HTTP.
//! - [`LogStore`] and [`StateMachine`]: the openraft storage implementations.
//! - [`Backup`]: a snapshot file's content, read offline (a restore replays it).
//! - [`ChangeEvent`]s: what applied entries changed, kept in a bounded history that
//!   [`MetaNode::watch`] serves to watchers.
//! - [`MetaNode::heartbeat`] and [`MetaNode::liveness`]: which datanodes are alive, as the
//!   leader heard them (soft state, not in the log).
//!
//! Why openraft 0.10 (pinned alpha) rather than the stable 0.9 line: 0.9 waits for every
//! append's fsync before doing anything else and never batches client writes, so writes queue
//! behind one barrier each and shared barriers cannot help. 0.10 hands appends to storage
//! asynchronously (the log store completes `IOFlushed` later, from the write-ahead log's
//! barrier thread), merges queued appends into one storage write (`max_append_entries`) and
//! batches client writes (`api_batch_capacity`).
//!
//! Layout of a node's data dir: `wal/` (the Raft log, vote and committed id), `registry/`
//! (sled), `snapshots/` (snapshot files), `snapshots-incoming/` (snapshots being received),
//! an `initialized` marker once the node formed a cluster, and `cluster-id` once it knows the
//! cluster it belongs to.

mod addresses;
mod admission;
mod apply_batch;
mod backup;
mod build_pauses;
mod build_room;
mod capture;
mod change_feed;
mod cluster_id;
mod cluster_version;
pub mod codec;
mod command;
mod config;
mod data_dir;
mod error;
mod free_space;
mod front_gap;
mod generation;
mod keys;
mod liveness;
mod log_record;
mod log_store;
mod node;
mod peer_refusals;
mod rebuild_source;
mod records;
mod registry;
mod registry_ahead;
mod rejoin_marker;
mod removal_notice;
pub mod rpc_bounds;
mod sm_stats;
mod snapshot_builder;
mod snapshot_data;
mod snapshot_format;
mod snapshot_pace;
mod sole_voter;
mod state_machine;
mod status;
mod term_probe;
pub mod transport;
mod trust_marker;
mod types;
mod uncancelled;
mod untold_removals;
mod view;
mod voter_rooms;

pub use addresses::Addresses;
pub use admission::SMALL_WRITE_WEIGHT;
pub use backup::Backup;
pub use change_feed::{Change, ChangeBatch, ChangeEvent, ChangeFilter, DEFAULT_HISTORY};
pub use cluster_id::{history_name, ClusterId};
pub use cluster_version::{
    split_after_version_raise, Behind, PeerVersions, BASE_VERSION, BUILD_VERSION,
};
pub use command::{Command, CommandResult, ShardReport};
pub use config::{NodeConfig, MAX_PAYLOAD_ENTRIES};
pub use data_dir::is_fresh as is_fresh_data_dir;
pub use error::{Error, Result};
pub use free_space::FreeSpace;
pub use liveness::{DatanodeLiveness, DatanodeState};
pub use log_store::LogStore;
pub use meta_store::{BarrierMode, WalMetrics, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES};
pub use node::MetaNode;
pub use peer_refusals::PeerRefusals;
pub use records::{RestoreMark, RestoreOrigin};
pub use registry::MAX_PAGE;
pub use removal_notice::{Removal, RemovalNotice};
pub use sm_stats::StateMachineStats;
pub use snapshot_builder::SnapshotBuilder;
pub use snapshot_data::SnapshotData;
pub use snapshot_format::ImportRecords;
pub use snapshot_pace::SnapshotPace;
pub use state_machine::StateMachine;
pub use status::{ClusterStatus, RejoinStatus, ReplicationLag, Role};
pub use term_probe::{ProbeMembers, TermAnswer, TermProbe};
pub use types::{
    Entry, LogId, Node, NodeId, Raft, SnapshotMeta, StoredMembership, TypeConfig, Vote,
};
pub use view::{
    Consistency, DatanodeInfo, Heartbeat, KvEntry, KvKey, LivenessReport, Page, ReplicaInfo,
    ShardEntry, ShardInfo, SnapshotInfo, Written,
};
