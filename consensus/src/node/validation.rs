//! Limits on commands, checked before anything reaches the log.

use crate::command::Command;
use crate::error::{Error, Result};

/// Largest key (bytes) and value of the key-value space.
pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most shards one register/deregister command may carry.
pub const MAX_SHARDS_PER_COMMAND: usize = 100_000;

pub(super) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "key must be 1 to {MAX_KEY_BYTES} bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

fn check_shards(n: usize) -> Result<()> {
    if n > MAX_SHARDS_PER_COMMAND {
        return Err(Error::InvalidArgument(format!(
            "{n} shards in one command; at most {MAX_SHARDS_PER_COMMAND}"
        )));
    }
    Ok(())
}

/// Refuses commands the registry would never want, before they reach the log.
pub(super) fn validate(cmd: &Command) -> Result<()> {
    match cmd {
        Command::RegisterDatanode { addr, .. } | Command::RegisterDatanodeAtLeast { addr, .. } => {
            if addr.is_empty() || addr.len() > MAX_KEY_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "datanode address must be 1 to {MAX_KEY_BYTES} bytes"
                )));
            }
        }
        Command::RegisterShards { shards, .. } => check_shards(shards.len())?,
        Command::DeregisterShards { shards, .. } | Command::DeregisterShardsOf { shards, .. } => {
            check_shards(shards.len())?
        }
        Command::RemoveDatanode { .. }
        | Command::PruneReplicas { .. }
        | Command::RemoveDatanodePiece { .. }
        | Command::RaiseEpochFloor { .. } => {}
        Command::EndRestore => {}
        Command::ClaimForRestore { at_least }
        | Command::BeginRestore { at_least, .. }
        | Command::BeginRestoreHoldingKeys { at_least, .. } => {
            if *at_least == 0 {
                return Err(Error::InvalidArgument(
                    "a restore's claim raises the epoch floor to at least 1".into(),
                ));
            }
        }
        Command::Put { key, value, .. } | Command::RestorePut { key, value } => {
            check_key(key)?;
            if value.len() > MAX_VALUE_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "value of {} bytes; at most {MAX_VALUE_BYTES}",
                    value.len()
                )));
            }
        }
        Command::Delete { key, .. } => check_key(key)?,
        Command::SetClusterVersion { .. } => {
            return Err(Error::InvalidArgument(
                "the cluster's version is raised by its leader only, once every member runs a \
                 build of that version"
                    .into(),
            ))
        }
    }
    Ok(())
}
