//! Removing a datanode. In a cluster of version 3 (`cluster_version.rs`) a removal goes to the
//! log in pieces of bounded work (`RemoveDatanodePiece`), so that removing a datanode that holds
//! a million replicas holds up other writes and reads no more than a storm batch does, and the
//! removed datanode's epoch is kept as the floor of its id's next registration. From version 4
//! the first piece also fences the incarnation it removes, so the datanode's batches cannot
//! keep the removal going. The leader raises the version as far as every member allows (4, else
//! 3); below 3 (a member runs an older build, or did not answer), a removal goes as one entry
//! (`RemoveDatanode`), as before: a removal never waits for the cluster's version. From version 7
//! the first piece also marks the datanode as being removed, so that the epoch it raised the
//! datanode to, which no registration gave, is fenced as well.
//!
//! The leader answers a `RemoveDatanode` with one entry (after raising the version, if it does):
//! the first piece, or the whole removal. The caller proposes the next pieces itself, one write
//! each (the HTTP handler does), so a forwarded removal holds up no other write of its batch.

use super::MetaNode;
use crate::cluster_version::{FENCING_REMOVAL, PIECEWISE_REMOVAL, REMOVAL_MARK};
use crate::command::Command;
use crate::error::Result;
use crate::view::{Consistency, Written};

impl MetaNode {
    /// The write of `RemoveDatanode { id }`: `RemovalPiece` (the first piece; the caller sends
    /// `RemoveDatanodePiece` with its `registered_index` until one answers `gone`), or
    /// `DatanodeRemoved` (the whole removal, in one entry).
    ///
    /// One entry for a datanode unknown here (the answer is `existed: false`, and a typo raises
    /// no version), or when the cluster's version stays below 3: a member is behind, or the
    /// raise failed (it may still commit; the single entry is right at either version).
    pub(super) async fn remove_datanode(&self, id: u64) -> Result<Written> {
        self.check_open()?;
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        // As of the lease: a fresh leader may not have applied a recent registration yet.
        let known = self.datanode(Consistency::Lease, id).await?.is_some();
        // The newest way every member allows: pieces whose first marks the datanode as being
        // removed, else pieces whose first fences the incarnation, else pieces, else one entry.
        let pieces = known
            && (self.try_version(REMOVAL_MARK).await.unwrap_or(false)
                || self.try_version(FENCING_REMOVAL).await.unwrap_or(false)
                || self.try_version(PIECEWISE_REMOVAL).await.unwrap_or(false));
        let cmd = match pieces {
            true => Command::RemoveDatanodePiece {
                id,
                registered_index: None,
            },
            false => Command::RemoveDatanode { id },
        };
        self.write_one(cmd).await
    }

    /// [`MetaNode::write`] of a command that a member whose build is of version `build`
    /// forwarded: a removal from a build that predates pieces (it could neither decode the
    /// first piece's answer nor send the rest) goes as one entry. Such a member can be in a
    /// cluster of version 3 only until it applies the raise, at which it stops.
    pub async fn write_forwarded(&self, cmd: Command, build: u32) -> Result<Written> {
        match cmd {
            Command::RemoveDatanode { .. } if build < PIECEWISE_REMOVAL => {
                self.write_one(cmd).await
            }
            cmd => self.write(cmd).await,
        }
    }
}
