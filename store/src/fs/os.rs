//! The real file system: positional IO on `std::fs::File`, `fdatasync`, and `fallocate` on Linux.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{FileHandle, FileSystem};

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFileSystem;

impl FileSystem for OsFileSystem {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(OsFile(file)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(OsFile(file)))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// An open OS file.
#[derive(Debug)]
struct OsFile(File);

impl FileHandle for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.0.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    #[cfg(target_os = "linux")]
    fn drop_cache(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is owned by `self.0` and open for the duration of the call.
        let rc =
            unsafe { libc::posix_fadvise(self.0.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            tracing::debug!(error = %io::Error::from_raw_os_error(rc), "posix_fadvise failed");
        }
    }

    #[cfg(target_os = "linux")]
    fn allocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        loop {
            // SAFETY: the descriptor is owned by `self.0` and open for the duration of the call.
            let rc = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                    return Err(io::Error::new(io::ErrorKind::Unsupported, err))
                }
                _ => return Err(err),
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn allocate(&self, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}
