//! The leader's check of forwarded commands: each is held to the rules of the request that
//! carried it.

use meta_consensus::Command;

use super::datanodes::{validate_min_epoch, validate_shard_ids};
use super::fields::{validate_addr, validate_key, validate_new_key, validate_value};
use crate::error::ApiError;

/// Checks a command as the request that carries it was checked. A member that forwards a write
/// has checked it already; the leader checks it again, since `/raft/forward-commands` is an
/// endpoint anyone holding the token (or anyone, without one) can call.
pub fn validate_command(cmd: &Command) -> Result<(), ApiError> {
    match cmd {
        Command::RegisterDatanode { addr, .. } => validate_addr(addr),
        Command::RegisterDatanodeAtLeast {
            addr, min_epoch, ..
        } => {
            validate_addr(addr)?;
            validate_min_epoch(*min_epoch)
        }
        Command::RegisterShards { shards, .. } => {
            validate_shard_ids(shards.iter().map(|s| s.id), shards.len())
        }
        Command::DeregisterShards { shards, .. } | Command::DeregisterShardsOf { shards, .. } => {
            validate_shard_ids(shards.iter().copied(), shards.len())
        }
        Command::RemoveDatanode { .. }
        | Command::PruneReplicas { .. }
        | Command::RemoveDatanodePiece { .. } => Ok(()),
        Command::Put { key, value, .. } | Command::RestorePut { key, value } => {
            validate_new_key(key)?;
            validate_value(value)
        }
        Command::Delete { key, .. } => validate_key(key),
        Command::RaiseEpochFloor { at_least }
        | Command::ClaimForRestore { at_least }
        | Command::BeginRestore { at_least, .. }
        | Command::BeginRestoreHoldingKeys { at_least, .. } => validate_min_epoch(*at_least),
        Command::EndRestore => Ok(()),
        Command::SetClusterVersion { .. } => Err(ApiError::invalid(
            "bad_command",
            "the cluster's version is raised by its leader only",
        )),
    }
}
