//! Whether the registry on disk can be trusted: a marker file (`TRUSTED`) in the registry dir,
//! written once the registry opened cleanly and removed at its first failed write.
//!
//! Why: after failed writes (a full disk), sled 0.34 can recover a state that is not a prefix
//! of what it was given: writes of the last commits missing while a later last-applied record
//! is present. openraft trusts last-applied and would never apply those entries again, so
//! acknowledged writes would be lost on that member, and its reads would be wrong. A registry
//! that failed a write is therefore not reopened: the next start deletes it, and openraft
//! rebuilds it from the newest snapshot and the log (which keeps every entry after that
//! snapshot). Removing a file needs no free space, so the marker goes even on a full disk.

use std::path::{Path, PathBuf};

use crate::data_dir::write_durably;
use crate::error::{Error, Result};

/// Name of the marker file in the registry dir.
const TRUSTED: &str = "TRUSTED";

/// The registry dir's trust marker.
#[derive(Debug)]
pub(crate) struct TrustMarker {
    dir: PathBuf,
}

impl TrustMarker {
    /// Before the registry in `dir` opens: deletes it if it holds a registry without the
    /// marker (one that failed a write, or was written before this check existed). Blocking.
    ///
    /// Contract: when this returns `Ok`, `dir` is absent or holds a registry that never failed
    /// a write.
    pub(crate) fn check(dir: &Path) -> Result<TrustMarker> {
        let holds_registry = dir.join("db").exists() || dir.join("conf").exists();
        if holds_registry && !dir.join(TRUSTED).exists() {
            tracing::warn!(
                dir = %dir.display(),
                "the registry failed a write before (or predates its trust marker): deleting it; \
                 it is rebuilt from the newest snapshot and the log"
            );
            std::fs::remove_dir_all(dir)
                .map_err(|e| Error::io("delete untrusted registry", dir, e))?;
        }
        Ok(TrustMarker {
            dir: dir.to_path_buf(),
        })
    }

    /// Marks the registry trusted (it opened cleanly). Blocking.
    pub(crate) fn set(&self) -> Result<()> {
        if self.dir.join(TRUSTED).exists() {
            return Ok(());
        }
        write_durably(&self.dir, TRUSTED, "the registry never failed a write\n")
    }

    /// The registry failed a write: it is not to be reopened. Best effort (blocking): a marker
    /// that cannot be removed is logged.
    pub(crate) fn revoke(&self) {
        let path = self.dir.join(TRUSTED);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                let _ = std::fs::File::open(&self.dir).and_then(|d| d.sync_all());
                tracing::error!(
                    "the registry failed a write: the next start rebuilds it from the newest \
                     snapshot and the log"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(
                "the registry failed a write and its trust marker {} cannot be removed ({e}): \
                 delete the registry dir before the next start",
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_without_the_marker_is_deleted_and_one_with_it_kept() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("registry");
        // Absent: nothing to delete.
        let m = TrustMarker::check(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("db"), b"sled").unwrap();
        m.set().unwrap();
        TrustMarker::check(&dir).unwrap();
        assert!(dir.join("db").exists(), "trusted: kept");
        m.revoke();
        assert!(!dir.join(TRUSTED).exists());
        TrustMarker::check(&dir).unwrap();
        assert!(!dir.exists(), "untrusted: deleted");
    }
}
