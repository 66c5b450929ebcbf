//! The log's marker records: a truncation of its tail and a purge of its prefix. Each is a
//! record appended and made durable like any other; no byte of the log is rewritten.

use super::{invalid, Batch, Wal};
use crate::error::{Error, Result};
use crate::fs::is_descriptor_shortage;
use crate::wal::record::Kind;
use crate::wal::{Lsn, Purge};

impl Wal {
    /// Drops every record with LSN at or above `lsn` by appending a truncate marker, and returns
    /// the marker's LSN. Later appends get LSNs above the marker's.
    ///
    /// Contract: on return the marker is durable (this call waits for a barrier): the dropped
    /// records are never returned again, also after a crash or restart. No byte is rewritten.
    /// `lsn` must be between 1 and `last_lsn() + 1`.
    pub fn truncate_from(&self, lsn: Lsn) -> Result<Lsn> {
        let marker = self.inner.with_writer(|w| {
            self.inner.check_writable()?;
            if lsn == 0 || lsn > w.next_lsn {
                return Err(invalid(
                    "truncate_from",
                    format!("LSN {lsn} outside 1..={}", w.next_lsn),
                ));
            }
            self.inner.write(w, Batch::Marker(Kind::Truncate, lsn))
        })?;
        self.inner.sync(marker)?;
        Ok(marker)
    }

    /// Drops every record with LSN at or below `lsn` by appending a purge marker; then deletes
    /// the segment files all of whose records are purged.
    ///
    /// Contract: on `Ok` the marker is durable (this call waits for a barrier), so the purged
    /// records are never returned again, also after a restart; whole segments no longer needed
    /// are deleted and the deletion is durable, unless [`Purge::leftover`] says why not (a
    /// failed delete, whose file the next open removes, or a directory that could not be opened
    /// for want of descriptors: no fsync ran, the log is not poisoned, and the next directory
    /// fsync makes the deletions durable).
    /// `lsn` must be between 1 and `last_lsn()`. On `Err` the marker may not be durable, or the
    /// fsync of the log directory failed: that poisons the log (it is never retried: every later
    /// append, sync and purge fails with [`Error::Poisoned`]).
    pub fn purge_to(&self, lsn: Lsn) -> Result<Purge> {
        let marker = self.inner.with_writer(|w| {
            self.inner.check_writable()?;
            if lsn == 0 || lsn >= w.next_lsn {
                return Err(invalid(
                    "purge_to",
                    format!("LSN {lsn} outside 1..={}", w.next_lsn - 1),
                ));
            }
            self.inner.write(w, Batch::Marker(Kind::Purge, lsn))
        })?;
        self.inner.sync(marker)?;
        // Only what this call's own marker, durable now, purges: a later purge may have written its
        // marker (raising the index's purge point) without its barrier yet.
        let obsolete = self.inner.index.write().take_obsolete_segments(lsn);
        if obsolete.is_empty() {
            return Ok(Purge {
                marker,
                leftover: None,
            });
        }
        // Under the directory lock, like a segment's creation, so that no other fsync of the
        // directory runs between a failed one and the poisoning; not under the write lock, so
        // appends go on meanwhile.
        self.inner.with_dir_lock(|| {
            self.inner.check_writable()?;
            // A failed delete leaves that file for later; the others go, and the fsync below
            // makes their deletion durable.
            let mut failed_delete = None;
            for seg in &obsolete {
                if let Err(e) = self.inner.fs.remove_file(&seg.path) {
                    failed_delete.get_or_insert(Error::io("remove purged segment", &seg.path, e));
                }
            }
            let left = |leftover| Ok(Purge { marker, leftover });
            let dir = &self.inner.dir;
            let fs = &self.inner.fs;
            // Only the open of the directory is retried, never the fsync. An open that still
            // found no descriptor ran no fsync: nothing to poison for, and the next directory
            // fsync (a segment's creation, a purge) covers these deletions.
            match self
                .inner
                .descriptor_wait
                .open("fsync log directory", dir, || fs.sync_dir(dir))
            {
                Ok(()) => left(failed_delete),
                Err(e) => {
                    let shortage = is_descriptor_shortage(&e);
                    let err = Error::io("fsync log directory", dir, e);
                    if shortage {
                        return left(Some(err));
                    }
                    self.inner.poison(err.to_string());
                    Err(err)
                }
            }
        })
    }
}
