//! Whether this node is still getting the cluster's log back after starting with no Raft state:
//! a marker file (`REJOINING`) in the data dir, written durably at an open that found no log and
//! no vote, and removed once the node holds the log again (below).
//!
//! Why: a node with no Raft state cannot tell a new member from one whose data dir was lost,
//! and a voter that lost its data dir may have helped commit writes it no longer holds. It must
//! not vote for a candidate that lacks them until a leader has fed it the log again. Its first
//! message from a leader gives it a term (openraft saves the leader's vote before it looks at
//! the log), so "no term and no log" stops describing it within a heartbeat, long before it has
//! the log back: the marker keeps the rule until then, across restarts too. The node has the log
//! back once its log durably holds an entry of its current term (so the leader of that term's
//! log up to it: every entry committed before that term, which that leader held when elected)
//! at or past the commit index of the first message that reached it from that leader (entries
//! committed in that same term, which its former self may have acknowledged, are at or below
//! it; a deposed leader of an older term, cut off, may reach it first, and its commit index
//! says nothing of them); see `node/votes.rs`.

use std::path::{Path, PathBuf};

use crate::data_dir::{remove_if_present, write_durably};
use crate::error::Result;

/// Name of the marker file in the data dir.
const REJOINING: &str = "REJOINING";

/// The data dir's rejoin marker.
#[derive(Debug)]
pub(crate) struct RejoinMarker {
    dir: PathBuf,
}

impl RejoinMarker {
    /// The marker of the data dir `dir`.
    pub(crate) fn new(dir: &Path) -> RejoinMarker {
        RejoinMarker {
            dir: dir.to_path_buf(),
        }
    }

    /// Whether the marker is there. Blocking (one `stat`).
    pub(crate) fn is_set(&self) -> bool {
        self.dir.join(REJOINING).exists()
    }

    /// Sets the marker. Blocking.
    ///
    /// Contract: on `Ok` the marker survives a crash (file and directory entry are fsynced).
    pub(crate) fn set(&self) -> Result<()> {
        write_durably(
            &self.dir,
            REJOINING,
            "this node started with no Raft state: it votes for no candidate with a log until \
             it holds the cluster's log again\n",
        )
    }

    /// Removes the marker. Blocking. The removal is not fsynced: a marker that comes back after
    /// a crash only keeps the rule until the node holds such an entry again.
    pub(crate) fn clear(&self) -> Result<()> {
        remove_if_present(&self.dir, REJOINING, "remove rejoin marker")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_set_and_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let marker = RejoinMarker::new(dir.path());
        assert!(!marker.is_set());
        marker.set().unwrap();
        assert!(marker.is_set());
        assert!(RejoinMarker::new(dir.path()).is_set(), "read from the disk");
        marker.clear().unwrap();
        assert!(!marker.is_set());
        marker.clear().unwrap();
    }
}
