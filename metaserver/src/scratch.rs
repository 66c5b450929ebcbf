//! A scratch directory next to a backup, for the registry that checks or reads it, owned by the
//! command's async task: interrupting the command removes it, even while a blocking thread
//! still writes into it; and where a backup being saved goes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Removal retries: a blocking thread may create a file in the directory while it is removed.
const REMOVE_ATTEMPTS: usize = 5;

/// A directory `.metaserver-scratch-XXXXXX` in a given directory, removed with everything in it
/// when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates the directory in `dir`.
    pub fn new_in(dir: &Path) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix(".metaserver-scratch-")
            .tempdir_in(dir)
            .with_context(|| format!("creating a scratch directory in {}", dir.display()))?;
        Ok(ScratchDir { path: temp.keep() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        for _ in 0..REMOVE_ATTEMPTS {
            match std::fs::remove_dir_all(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => continue,
            }
        }
        tracing::warn!(dir = %self.path.display(), "could not remove a scratch directory");
    }
}

/// The directory a file is in (`.` for a bare name).
pub fn parent_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The file a backup saved as `file` is to replace: `file` itself when it is a regular file or
/// does not exist, the file a symbolic link leads to (the link stays; the backup is written
/// next to its target and renamed over it). Anything else, a directory, a device, a pipe or a
/// link that leads nowhere, is refused: the save renames a new file over the path, which would
/// replace it rather than write into it.
pub fn backup_target(file: &Path) -> Result<PathBuf> {
    let meta = match std::fs::symlink_metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(file.to_path_buf()),
        other => other.with_context(|| format!("looking at {}", file.display()))?,
    };
    if meta.is_file() {
        return Ok(file.to_path_buf());
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::canonicalize(file).with_context(|| {
            format!(
                "{} is a symbolic link that leads to no file: give the path of the backup file",
                file.display()
            )
        })?;
        return backup_target(&target);
    }
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file (a device, a pipe or a socket)"
    };
    anyhow::bail!(
        "{} is {kind}: a backup is a file of its own, which the save puts in place by renaming \
         it over that path; give the path of a file, or of one to create",
        file.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_replaces_a_file_or_a_link_s_target_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.snap");
        assert_eq!(backup_target(&new).unwrap(), new);
        let old = dir.path().join("old.snap");
        std::fs::write(&old, b"x").unwrap();
        assert_eq!(backup_target(&old).unwrap(), old);
        let link = dir.path().join("latest.snap");
        std::os::unix::fs::symlink("old.snap", &link).unwrap();
        let target = backup_target(&link).unwrap();
        assert_eq!(target, std::fs::canonicalize(&old).unwrap());
        let dangling = dir.path().join("dangling.snap");
        std::os::unix::fs::symlink("nowhere.snap", &dangling).unwrap();
        let e = format!("{:#}", backup_target(&dangling).unwrap_err());
        assert!(e.contains("leads to no file"), "{e}");
        let e = format!("{:#}", backup_target(dir.path()).unwrap_err());
        assert!(e.contains("is a directory"), "{e}");
        let e = format!("{:#}", backup_target(Path::new("/dev/null")).unwrap_err());
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_scratch_dir_is_removed_with_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = ScratchDir::new_in(dir.path()).unwrap();
        let path = scratch.path().to_path_buf();
        std::fs::create_dir(path.join("backup-x")).unwrap();
        std::fs::write(path.join("backup-x/db"), b"registry").unwrap();
        drop(scratch);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
