//! How a node reads the free space of its data dir's file system: `statvfs`, or a stand-in
//! that tests set to make a disk look as full as they need (see `node/free_space.rs` for what
//! the node does with it).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// What reads the free bytes of the file system holding a dir.
type Probe = dyn Fn(&Path) -> io::Result<u64> + Send + Sync;

/// Reads the bytes an unprivileged writer may still use on the file system holding a dir.
#[derive(Clone)]
pub struct FreeSpace(Arc<Probe>);

impl FreeSpace {
    /// A file system that always has `bytes` free, whatever is written (for tests).
    pub fn fixed(bytes: u64) -> FreeSpace {
        FreeSpace(Arc::new(move |_| Ok(bytes)))
    }

    /// A file system whose free bytes `probe` tells for a dir (for tests: one that fills as
    /// files land).
    pub fn with(probe: impl Fn(&Path) -> io::Result<u64> + Send + Sync + 'static) -> FreeSpace {
        FreeSpace(Arc::new(probe))
    }

    /// The bytes free on the file system holding `dir`.
    pub fn of(&self, dir: &Path) -> io::Result<u64> {
        (self.0)(dir)
    }
}

impl Default for FreeSpace {
    /// The file system's own answer (`statvfs`).
    fn default() -> FreeSpace {
        FreeSpace(Arc::new(statvfs_free))
    }
}

impl fmt::Debug for FreeSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FreeSpace")
    }
}

fn statvfs_free(dir: &Path) -> io::Result<u64> {
    let path = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `statvfs` writes only into the struct it is given, which lives on this stack
    // frame; `path` is a valid NUL-terminated string for the duration of the call.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_space_of_a_real_dir_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let real = FreeSpace::default();
        assert!(real.of(dir.path()).unwrap() > 0);
        assert!(real.of(&dir.path().join("missing")).is_err());
        assert_eq!(FreeSpace::fixed(7).of(dir.path()).unwrap(), 7);
    }
}
