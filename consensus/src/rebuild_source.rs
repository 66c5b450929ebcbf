//! What a node would rebuild its registry from: the newest snapshot and the log after it. A
//! registry that is not to be reopened (it failed a write, was left open in an earlier boot of
//! the machine, or cannot be read) is deleted only when those two hold every entry it applied;
//! otherwise the node refuses to start and leaves it as it is, since it may be the only copy
//! left on this member (the newest snapshot file lost while the log was purged up to it).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What the registry can be rebuilt from, looked at before one is deleted. The default, a log
/// never purged, holds every entry (a scratch registry, a backup's or a test's, has nothing to
/// rebuild from, and needs nothing).
#[derive(Clone, Debug, Default)]
pub(crate) struct RebuildSource {
    /// The entry the log is purged up to, if it is.
    pub(crate) purged: Option<u64>,
    /// The entry the newest snapshot ends at, if there is one.
    pub(crate) snapshot: Option<u64>,
    /// The newest snapshot's file, read whole before a registry is deleted in reliance on it
    /// (its payload may have rotted since it was written; a start checks only its ends).
    pub(crate) snapshot_file: Option<PathBuf>,
    /// Newer snapshots that did not read back, set aside (where they are now), newest first.
    pub(crate) set_aside: Vec<PathBuf>,
}

impl RebuildSource {
    /// `Ok` when the registry in `dir`, which is not to be reopened because it `why` (e.g.
    /// "failed a write"), can be deleted: the snapshot and the log together hold every entry
    /// from the first. Else [`Error::RegistryNotRebuildable`], naming the dir and what is
    /// missing.
    pub(crate) fn check(&self, dir: &Path, why: &str) -> Result<()> {
        let Some((purged, missing)) = self.gap().or_else(|| self.damaged_snapshot()) else {
            return Ok(());
        };
        Err(Error::RegistryNotRebuildable {
            path: dir.to_path_buf(),
            reason: format!(
                "{why}, so it is not reopened, and it cannot be rebuilt: the log is purged up to \
                 entry {purged} and {missing}. It is left as it is. {REMEDY}"
            ),
        })
    }

    /// `Ok` when the registry in `dir`, which applied entries up to `applied` (0: none, as a
    /// registry that was deleted), can be brought up to the log: it is not behind the log's
    /// purge point, or the newest snapshot reaches that point and reads back whole (read only
    /// when the registry is behind). Else [`Error::RegistryNotRebuildable`], naming the dir and
    /// what is missing (before Raft starts: openraft would fail with a message about log
    /// indexes, or about the snapshot's corrupt data).
    pub(crate) fn check_behind(&self, dir: &Path, applied: u64) -> Result<()> {
        if self.purged.is_none_or(|purged| applied >= purged) {
            return Ok(());
        }
        let Some((purged, missing)) = self.gap().or_else(|| self.damaged_snapshot()) else {
            return Ok(());
        };
        Err(Error::RegistryNotRebuildable {
            path: dir.to_path_buf(),
            reason: format!(
                "holds entries up to {applied} only (it may have been deleted), and nothing can \
                 complete it: the log is purged up to entry {purged} and {missing}. {REMEDY}"
            ),
        })
    }

    /// The purge point and what is wrong with the snapshot that reaches it, when the log is
    /// purged and the snapshot's file does not read back whole. Blocking: reads the file.
    fn damaged_snapshot(&self) -> Option<(u64, String)> {
        let purged = self.purged?;
        let file = self.snapshot_file.as_ref()?;
        let damage = meta_store::SnapshotReader::open(file).err()?;
        Some((
            purged,
            format!("the newest snapshot, which reaches it, is damaged ({damage})"),
        ))
    }

    /// The purge point and what is missing to reach it, when the snapshot does not.
    fn gap(&self) -> Option<(u64, String)> {
        let purged = self.purged?;
        let missing = match self.snapshot {
            Some(s) if s >= purged => return None,
            Some(s) => format!("the newest snapshot ends at entry {s}"),
            None => "there is no snapshot".to_string(),
        };
        let missing = match self.set_aside.as_slice() {
            [] => missing,
            aside => format!(
                "{missing} (a snapshot that did not read back was set aside as {})",
                aside
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Some((purged, missing))
    }
}

/// What an operator does about a registry that cannot be rebuilt.
const REMEDY: &str = "Put the missing snapshot file (or an intact copy of the damaged one) \
                      back into the snapshots dir, or replace this member's data dir (remove it \
                      from the voters, wipe the dir, add it again as a learner)";

#[cfg(test)]
mod tests {
    use super::*;

    fn check(purged: Option<u64>, snapshot: Option<u64>) -> Result<()> {
        RebuildSource {
            purged,
            snapshot,
            snapshot_file: None,
            set_aside: Vec::new(),
        }
        .check(Path::new("/r"), "failed a write")
    }

    #[test]
    fn a_registry_is_deleted_only_when_the_snapshot_reaches_the_purge_point() {
        assert!(
            check(None, None).is_ok(),
            "a log never purged holds every entry"
        );
        assert!(check(None, Some(5)).is_ok());
        assert!(check(Some(10), Some(10)).is_ok());
        assert!(check(Some(10), Some(12)).is_ok());
        let none = check(Some(10), None).unwrap_err().to_string();
        assert!(
            none.contains("/r") && none.contains("failed a write"),
            "{none}"
        );
        assert!(
            none.contains("purged up to entry 10") && none.contains("no snapshot"),
            "{none}"
        );
        let older = check(Some(10), Some(9)).unwrap_err().to_string();
        assert!(older.contains("ends at entry 9"), "{older}");
        let aside = RebuildSource {
            purged: Some(10),
            snapshot: Some(9),
            snapshot_file: None,
            set_aside: vec![PathBuf::from("/s/10.snap.damaged")],
        };
        let named = aside.check(Path::new("/r"), "x").unwrap_err().to_string();
        assert!(
            named.contains("ends at entry 9 (a snapshot that did not read back was set aside as /s/10.snap.damaged)"),
            "{named}"
        );
        let scratch = RebuildSource::default().check(Path::new("/r"), "x");
        assert!(scratch.is_ok(), "a scratch registry is never kept");
    }
}
