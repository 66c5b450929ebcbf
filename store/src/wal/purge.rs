//! What a purge of the log's prefix did ([`crate::wal::Wal::purge_to`]): its marker is durable,
//! and the segment files it emptied are deleted, or left for later with the reason.

use crate::error::Error;
use crate::wal::Lsn;

/// The outcome of a purge whose marker is durable.
#[derive(Debug)]
#[must_use = "a purge may have left segment files behind: say so"]
pub struct Purge {
    /// The purge marker's LSN.
    pub marker: Lsn,
    /// Why the deletion of segment files that the purge emptied is not done, or not durable, if
    /// it is not: a delete failed (the next open removes that file), or the directory found no
    /// file descriptor for its fsync (none ran, so the log is not poisoned; the next directory
    /// fsync, at a segment's creation or a purge, makes the deletions durable). The purge holds
    /// either way, and nothing is read from those files again.
    pub leftover: Option<Error>,
}
