//! Whether the registry on disk can be trusted: a marker file (`TRUSTED`) in the registry dir,
//! written once the registry opened cleanly and removed at its first failed write; and a
//! second one (`OPEN`) that says the registry is open, and in which boot of the machine.
//!
//! Why `TRUSTED`: after failed writes (a full disk), sled 0.34 can recover a state that is not
//! a prefix of what it was given: writes of the last commits missing while a later last-applied
//! record is present. openraft trusts last-applied and would never apply those entries again, so
//! acknowledged writes would be lost on that member, and its reads would be wrong. A registry
//! that failed a write is therefore not reopened: the next start deletes it, and openraft
//! rebuilds it from the newest snapshot and the log (which keeps every entry after that
//! snapshot). Removing a file needs no free space, so the marker goes even on a full disk.
//!
//! Why `OPEN`: sled 0.34 writes a log message larger than a quarter of its segment (a value
//! over about 128 KiB, or a page of keys that large) to a file of its own under `blobs/`, and
//! never fsyncs that file or its directory; its flush makes only the pointer in its log
//! durable. After a power loss the file can be gone while later writes, and a later
//! last-applied record, are there: sled skips the dangling pointer, and the registry is again
//! not a prefix of what it was given. A process that dies leaves its writes in the page cache,
//! so only the machine going down loses them: a registry found open in an earlier boot of the
//! machine (`OPEN` names another boot id) is deleted and rebuilt like an untrusted one. A clean
//! close removes `OPEN`, so an ordinary restart or reboot keeps the registry.

use std::path::{Path, PathBuf};

use crate::data_dir::write_durably;
use crate::error::{Error, Result};
use crate::rebuild_source::RebuildSource;

/// Name of the marker file in the registry dir.
const TRUSTED: &str = "TRUSTED";

/// Name of the file that says the registry is open; it holds the boot id of that boot.
const OPEN: &str = "OPEN";

/// Where Linux says which boot of the machine this is (a new random id at every boot).
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[cfg(test)]
thread_local! {
    /// Tests: the boot id that [`TrustMarker::check`] sees on this thread, in place of the
    /// machine's.
    pub(crate) static BOOT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The id of the machine's current boot; `unknown` where the system does not say (then a
/// registry left open is kept, as before this check existed).
fn boot_id() -> String {
    #[cfg(test)]
    if let Some(boot) = BOOT.with(|b| b.borrow().clone()) {
        return boot;
    }
    match std::fs::read_to_string(BOOT_ID) {
        Ok(id) => id.trim().to_string(),
        Err(e) => {
            tracing::warn!(
                "cannot read the boot id ({BOOT_ID}: {e}): a registry left open by \
                            a machine that went down cannot be told from one left by a process"
            );
            "unknown".into()
        }
    }
}

/// The registry dir's trust markers.
#[derive(Debug)]
pub(crate) struct TrustMarker {
    dir: PathBuf,
    /// The machine's current boot id.
    boot: String,
    /// The registry failed a write since it opened ([`TrustMarker::revoke`]).
    revoked: std::sync::atomic::AtomicBool,
}

impl TrustMarker {
    /// Before the registry in `dir` opens: deletes it if it holds a registry without the
    /// `TRUSTED` marker (one that failed a write, or was written before this check existed),
    /// or one that was open when the machine went down (`OPEN` names an earlier boot). Blocking.
    ///
    /// Contract: when this returns `Ok`, `dir` is absent or holds a registry that never failed
    /// a write and was closed cleanly or left open in this boot (so every write it was given is
    /// in the page cache if not on disk). A registry to be deleted that `source` could not
    /// rebuild is an error instead, and stays as it is.
    pub(crate) fn check(dir: &Path, source: &RebuildSource) -> Result<TrustMarker> {
        let boot = boot_id();
        let holds_registry = dir.join("db").exists() || dir.join("conf").exists();
        if holds_registry && !dir.join(TRUSTED).exists() {
            source.check(dir, "failed a write (or predates its trust marker)")?;
            tracing::warn!(
                dir = %dir.display(),
                "the registry failed a write before (or predates its trust marker): deleting it; \
                 it is rebuilt from the newest snapshot and the log"
            );
            std::fs::remove_dir_all(dir)
                .map_err(|e| Error::io("delete untrusted registry", dir, e))?;
        } else if holds_registry {
            let open = dir.join(OPEN);
            let left_open = match std::fs::read_to_string(&open) {
                Ok(text) => Some(text.trim().to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io("read", &open, e)),
            };
            if left_open.as_ref().is_some_and(|b| *b != boot) {
                source.check(dir, "was open when the machine went down")?;
                tracing::warn!(
                    dir = %dir.display(),
                    "the machine went down while the registry was open, and sled does not make \
                     the files of its large values durable: deleting the registry; it is rebuilt \
                     from the newest snapshot and the log"
                );
                std::fs::remove_dir_all(dir)
                    .map_err(|e| Error::io("delete registry left open", dir, e))?;
            }
        }
        Ok(TrustMarker {
            dir: dir.to_path_buf(),
            boot,
            revoked: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Records durably that the registry is open in this boot. Call it once sled opened the
    /// dir and before the registry writes anything. Blocking.
    pub(crate) fn opened(&self) -> Result<()> {
        let open = self.dir.join(OPEN);
        if std::fs::read_to_string(&open).is_ok_and(|b| b.trim() == self.boot) {
            return Ok(());
        }
        write_durably(&self.dir, OPEN, &format!("{}\n", self.boot))
    }

    /// The registry was flushed and is written no more: it is closed cleanly, and a later boot
    /// may reopen it. Blocking. A marker that cannot be removed is logged (the next boot then
    /// rebuilds the registry, which loses nothing).
    pub(crate) fn closed(&self) {
        let open = self.dir.join(OPEN);
        match std::fs::remove_file(&open) {
            Ok(()) => {
                if let Err(e) = std::fs::File::open(&self.dir).and_then(|d| d.sync_all()) {
                    tracing::warn!(
                        "fsync {} after closing the registry: {e}",
                        self.dir.display()
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("remove {}: {e}", open.display()),
        }
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
        self.revoked
            .store(true, std::sync::atomic::Ordering::Release);
        self.remove("failed a write", tracing::Level::ERROR);
    }

    /// Whether the registry failed a write since it opened: the next start rebuilds it.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The registry is sound but is to be rebuilt (it applied entries its log lost): the next
    /// open deletes it. Best effort (blocking), as [`TrustMarker::revoke`].
    pub(crate) fn rebuild_next(&self) {
        self.remove("is to be rebuilt", tracing::Level::INFO);
    }

    /// Removes `TRUSTED`, logging why (`the registry {why}`) at `level`.
    fn remove(&self, why: &str, level: tracing::Level) {
        let path = self.dir.join(TRUSTED);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                let _ = std::fs::File::open(&self.dir).and_then(|d| d.sync_all());
                let message = format!(
                    "the registry {why}: the next start rebuilds it from the newest snapshot and \
                     the log"
                );
                if level == tracing::Level::ERROR {
                    tracing::error!("{message}");
                } else {
                    tracing::info!("{message}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(
                "the registry {why} and its trust marker {} cannot be removed ({e}): delete the \
                 registry dir before the next start",
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
        let m = TrustMarker::check(&dir, &RebuildSource::default()).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("db"), b"sled").unwrap();
        m.set().unwrap();
        TrustMarker::check(&dir, &RebuildSource::default()).unwrap();
        assert!(dir.join("db").exists(), "trusted: kept");
        m.revoke();
        assert!(!dir.join(TRUSTED).exists());
        TrustMarker::check(&dir, &RebuildSource::default()).unwrap();
        assert!(!dir.exists(), "untrusted: deleted");
    }

    #[test]
    fn a_registry_that_cannot_be_rebuilt_is_kept() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("registry");
        let lost = RebuildSource {
            purged: Some(10),
            ..RebuildSource::default()
        };
        let m = opened_in(&dir, "boot-a");
        // Left open in an earlier boot.
        let e = in_boot("boot-b", || TrustMarker::check(&dir, &lost)).unwrap_err();
        assert!(e.to_string().contains("machine went down"), "{e}");
        assert!(dir.join("db").exists(), "kept");
        // Failed a write.
        m.revoke();
        let e = in_boot("boot-a", || TrustMarker::check(&dir, &lost)).unwrap_err();
        assert!(e.to_string().contains("failed a write"), "{e}");
        assert!(dir.join("db").exists(), "kept");
        // The snapshot is back.
        let back = RebuildSource {
            purged: Some(10),
            snapshot: Some(10),
            ..RebuildSource::default()
        };
        in_boot("boot-a", || TrustMarker::check(&dir, &back)).unwrap();
        assert!(!dir.exists(), "deleted once it can be rebuilt");
    }

    /// Runs `f` as if the machine's boot id were `boot`.
    fn in_boot<T>(boot: &str, f: impl FnOnce() -> T) -> T {
        BOOT.with(|b| *b.borrow_mut() = Some(boot.into()));
        let out = f();
        BOOT.with(|b| *b.borrow_mut() = None);
        out
    }

    /// A trusted registry in `dir`, opened in boot `boot`.
    fn opened_in(dir: &Path, boot: &str) -> TrustMarker {
        in_boot(boot, || {
            let m = TrustMarker::check(dir, &RebuildSource::default()).unwrap();
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("db"), b"sled").unwrap();
            m.opened().unwrap();
            m.set().unwrap();
            m
        })
    }

    #[test]
    fn a_registry_left_open_is_kept_in_the_same_boot_and_deleted_after_a_reboot() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("registry");
        opened_in(&dir, "boot-a");
        // The process died; the machine did not.
        in_boot("boot-a", || {
            TrustMarker::check(&dir, &RebuildSource::default()).unwrap()
        });
        assert!(dir.join("db").exists(), "left open in this boot: kept");
        // The machine went down with the registry open.
        in_boot("boot-b", || {
            TrustMarker::check(&dir, &RebuildSource::default()).unwrap()
        });
        assert!(!dir.exists(), "left open in an earlier boot: deleted");
    }

    #[test]
    fn a_registry_closed_cleanly_is_kept_after_a_reboot() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("registry");
        let m = opened_in(&dir, "boot-a");
        m.closed();
        assert!(!dir.join(OPEN).exists());
        in_boot("boot-b", || {
            TrustMarker::check(&dir, &RebuildSource::default()).unwrap()
        });
        assert!(dir.join("db").exists(), "closed cleanly: kept");
        // Reopened in the new boot, the marker names it.
        let m = in_boot("boot-b", || {
            let m = TrustMarker::check(&dir, &RebuildSource::default()).unwrap();
            m.opened().unwrap();
            m
        });
        assert_eq!(std::fs::read_to_string(dir.join(OPEN)).unwrap(), "boot-b\n");
        drop(m);
    }
}
