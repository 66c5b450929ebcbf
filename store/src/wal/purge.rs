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
    /// Why segment files that the purge emptied are still on disk, if they are: a delete
    /// failed, or the directory found no file descriptor for its fsync (none ran, so the log is
    /// not poisoned). The purge holds either way, and nothing is read from those files again;
    /// the next directory fsync (a segment's creation, a purge) or open removes them.
    pub leftover: Option<Error>,
}
