//! The HTTP transport end to end: three nodes, each behind a real HTTP server on an
//! ephemeral loopback port, talking Raft over `/raft/...` with a token. Writes and
//! linearizable reads sent to followers are forwarded to the leader, or answered by the
//! follower with the leader's read index, and a learner that joins after the leader purged its
//! log catches up by a streamed snapshot (or, without room to install it, refuses it). Members of
//! different builds hold back commands an older build cannot apply.

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cluster_version;
mod disk_handover;
mod faults;
mod follower_reads;
mod helpers;
mod membership;
mod read_failover;
mod readiness;
mod rejoin;
mod snapshot_pace;
mod snapshot_room;
mod tls;
