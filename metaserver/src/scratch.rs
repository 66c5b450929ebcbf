//! A scratch directory next to a backup, for the registry that checks or reads it, owned by the
//! command's async task: interrupting the command removes it, even while a blocking thread
//! still writes into it.

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

#[cfg(test)]
mod tests {
    use super::*;

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
