//! Removing a datanode. In a cluster of version 3 (`cluster_version.rs`) a removal goes to the
//! log in pieces of bounded work (`RemoveDatanodePiece`), one after the other, so that removing
//! a datanode that holds a million replicas holds up other writes and reads no more than a
//! storm batch does, and the removed datanode's epoch is kept as the floor of its id's next
//! registration. Below version 3 (a member runs an older build, or did not answer), it goes as
//! one entry (`RemoveDatanode`), as before: a removal never waits for the cluster's version.

use super::MetaNode;
use crate::cluster_version::PIECEWISE_REMOVAL;
use crate::command::{Command, CommandResult};
use crate::error::{Error, Result};
use crate::view::Written;

impl MetaNode {
    /// Removes datanode `id` and every replica it holds (the write of `RemoveDatanode`).
    /// Returns `DatanodeRemoved` (`existed: false` for an unknown datanode) with the replicas
    /// removed by all its entries, at the index of the last.
    ///
    /// The pieces run in a task of their own, so a caller that goes away does not stop a
    /// removal half way. One that fails half way (the leader changed) has dropped some of the
    /// datanode's replicas; the datanode stays registered with the rest, and sending the
    /// removal again finishes it.
    pub(super) async fn remove_datanode(&self, id: u64) -> Result<Written> {
        self.check_open()?;
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        if !self.try_version(PIECEWISE_REMOVAL).await? {
            return self.write_one(Command::RemoveDatanode { id }).await;
        }
        let node = self.clone();
        tokio::spawn(async move { node.remove_in_pieces(id).await })
            .await
            .map_err(|e| Error::Raft(format!("the removal of datanode {id} failed: {e}")))?
    }

    /// Proposes pieces until one drops the datanode's record, or finds it gone.
    async fn remove_in_pieces(&self, id: u64) -> Result<Written> {
        let mut replicas_removed = 0;
        let mut existed = false;
        loop {
            let written = self.write_one(Command::RemoveDatanodePiece { id }).await?;
            let gone = match written.result {
                CommandResult::RemovalPiece { removed, gone } => {
                    existed = true;
                    replicas_removed += removed;
                    gone
                }
                // Unknown from the start, or removed by another removal since a piece of this
                // one.
                CommandResult::UnknownDatanode { .. } => true,
                other => {
                    return Err(Error::Raft(format!(
                        "a piece of the removal of datanode {id} answered {other:?}"
                    )))
                }
            };
            if gone {
                return Ok(Written {
                    index: written.index,
                    result: CommandResult::DatanodeRemoved {
                        existed,
                        replicas_removed,
                    },
                });
            }
        }
    }
}
