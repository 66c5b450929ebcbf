//! A file system that makes every sync slower by a fixed delay: emulates a disk whose barriers
//! cost more than this machine's, for benchmarks only. Durability is the wrapped file system's:
//! the delay comes after its sync returns.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{FileHandle, FileSystem};

/// Wraps a file system; `sync_data`, `sync_all` and `sync_dir` each take `extra` longer.
pub struct SlowSyncFileSystem {
    inner: Arc<dyn FileSystem>,
    extra: Duration,
}

impl SlowSyncFileSystem {
    /// `inner`, with every sync `extra` slower.
    pub fn new(inner: Arc<dyn FileSystem>, extra: Duration) -> Self {
        SlowSyncFileSystem { inner, extra }
    }

    fn wrap(&self, inner: Box<dyn FileHandle>) -> Box<dyn FileHandle> {
        Box::new(SlowSyncFile {
            inner,
            extra: self.extra,
        })
    }
}

impl fmt::Debug for SlowSyncFileSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlowSync({:?} + {:?})", self.inner, self.extra)
    }
}

impl FileSystem for SlowSyncFileSystem {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.read_dir(dir)
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        Ok(self.wrap(self.inner.create_new(path)?))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        Ok(self.wrap(self.inner.open(path)?))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)?;
        std::thread::sleep(self.extra);
        Ok(())
    }
}

/// A file of [`SlowSyncFileSystem`].
#[derive(Debug)]
struct SlowSyncFile {
    inner: Box<dyn FileHandle>,
    extra: Duration,
}

impl FileHandle for SlowSyncFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        std::thread::sleep(self.extra);
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()?;
        std::thread::sleep(self.extra);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.inner.allocate(len)
    }

    fn drop_cache(&self) {
        self.inner.drop_cache()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::OsFileSystem;
    use std::time::Instant;

    #[test]
    fn syncs_take_the_extra_time_and_data_passes_through() {
        let dir = tempfile::tempdir().unwrap();
        let fs = SlowSyncFileSystem::new(Arc::new(OsFileSystem), Duration::from_millis(20));
        let path = dir.path().join("f");
        let file = fs.create_new(&path).unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        let started = Instant::now();
        file.sync_data().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(20));
        let again = fs.open(&path).unwrap();
        let mut buf = [0u8; 5];
        again.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(fs.read_dir(dir.path()).unwrap(), vec!["f".to_string()]);
    }
}
