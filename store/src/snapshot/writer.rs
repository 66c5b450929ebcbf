//! Writing one snapshot: a temp file, paced and checksummed, made durable and renamed into place.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use tempfile::NamedTempFile;

use super::format::{Header, Trailer};
use super::gate::Passage;
use super::store::{sync_dir, TEMP_PREFIX};
use super::{SnapshotFile, SnapshotStore};
use crate::fs::DescriptorWait;
use crate::rate_limit::{RateLimiter, ThrottledWriter};
use crate::{Error, Result};

const WRITE_BUFFER: usize = 256 * 1024;
/// Every this many payload bytes the writer asks the kernel to start writing the file back, so
/// the final `sync_all` has little left to do and the disk sees a steady stream, not a burst.
const WRITEBACK_EVERY: u64 = 1 << 20;

/// A snapshot being written. The payload goes through [`std::io::Write`]: it is paced by the
/// limiter given to [`SnapshotStore::create`] and checksummed (CRC32C) as it passes.
///
/// Until [`SnapshotWriter::finish`] returns, the bytes live in a temp file in the snapshot
/// directory. Dropping the writer without finishing removes the temp file; a crash leaves it for
/// the next [`SnapshotStore::open`] to remove. Either way no file appears under the final name.
///
/// Writing blocks the calling thread (file IO and pacing sleeps): from async code, move the
/// writer into `tokio::task::spawn_blocking` and produce the payload there.
#[derive(Debug)]
pub struct SnapshotWriter {
    out: ThrottledWriter<BufWriter<NamedTempFile>>,
    store: SnapshotStore,
    name: String,
    meta: Vec<u8>,
    header_len: u64,
    payload_len: u64,
    crc: u32,
    /// File offset from which writeback has not been started yet.
    writeback_from: u64,
    /// Held until the writer is done with the directory; last, so that a dropped writer's temp
    /// file is gone before its passage ends.
    _passage: Passage,
}

impl SnapshotWriter {
    pub(crate) fn create(
        store: SnapshotStore,
        name: &str,
        meta: &[u8],
        limiter: Arc<RateLimiter>,
        passage: Passage,
    ) -> Result<SnapshotWriter> {
        let prefix = format!("{TEMP_PREFIX}{name}.");
        let mut temp = DescriptorWait::default()
            .open("create snapshot temp file", store.dir(), || {
                tempfile::Builder::new()
                    .prefix(&prefix)
                    .tempfile_in(store.dir())
            })
            .map_err(|e| Error::io("create snapshot temp file", store.dir(), e))?;
        let header = Header::encode(meta);
        temp.write_all(&header)
            .map_err(|e| Error::io("write snapshot header", temp.path(), e))?;
        let out = ThrottledWriter::new(BufWriter::with_capacity(WRITE_BUFFER, temp), limiter);
        Ok(SnapshotWriter {
            out,
            store,
            name: name.to_string(),
            meta: meta.to_vec(),
            header_len: header.len() as u64,
            payload_len: 0,
            crc: 0,
            writeback_from: 0,
            _passage: passage,
        })
    }

    /// The snapshot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The temp file the bytes are going to.
    pub fn temp_path(&self) -> &Path {
        self.out.get_ref().get_ref().path()
    }

    /// Payload bytes written so far.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// Completes the snapshot: settles the pacing, writes the trailer, `sync_all`s the file,
    /// renames it to `<name>.snap`, fsyncs the directory, and then deletes snapshots beyond the
    /// store's retention count (never this one). When it returns `Ok`, the snapshot is complete
    /// and durable under its final name. On error the temp file is removed and nothing under a
    /// final name changed, except that an error from the directory fsync leaves the renamed file
    /// in place (complete, but possibly not durable).
    pub fn finish(self) -> Result<SnapshotFile> {
        let SnapshotWriter {
            out,
            store,
            name,
            meta,
            header_len,
            payload_len,
            crc,
            writeback_from: _,
            // Bound before the temp file below, so dropped after it on every path: the
            // store's seal waits until the file is renamed, or gone.
            _passage,
        } = self;
        let buffered = out
            .finish()
            .map_err(|e| Error::io("write snapshot", store.dir(), e))?;
        let mut temp = buffered.into_inner().map_err(|e| {
            let (error, writer) = e.into_parts();
            Error::io("write snapshot", writer.get_ref().path(), error)
        })?;
        let trailer = Trailer { payload_len, crc };
        temp.write_all(&trailer.encode())
            .map_err(|e| Error::io("write snapshot trailer", temp.path(), e))?;
        temp.as_file()
            .sync_all()
            .map_err(|e| Error::io("sync snapshot", temp.path(), e))?;
        let path = store.path_of(&name);
        temp.persist(&path)
            .map_err(|e| Error::io("rename snapshot into place", &path, e.error))?;
        sync_dir("sync snapshot directory", store.dir())?;
        store.retire_old(&name);
        Ok(SnapshotFile {
            path,
            name,
            bytes: payload_len,
            file_bytes: header_len + payload_len + super::format::TRAILER_LEN,
            meta,
        })
    }

    /// Starts writeback of the payload written to the file so far, without waiting for it.
    fn start_writeback(&mut self) {
        let buffered = self.out.get_ref();
        let in_file = self.header_len + self.payload_len - buffered.buffer().len() as u64;
        let from = std::mem::replace(&mut self.writeback_from, in_file);
        start_writeback(buffered.get_ref().as_file(), from, in_file - from);
    }
}

impl Write for SnapshotWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let written = self.out.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..written]);
        self.payload_len += written as u64;
        if self.header_len + self.payload_len - self.writeback_from >= WRITEBACK_EVERY {
            self.start_writeback();
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Asks the kernel to start writing `len` bytes at `offset` back to disk, without waiting. A
/// hint only: errors are ignored, because the final `sync_all` reports any real failure.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return;
    }
    // SAFETY: sync_file_range only reads its integer arguments; the descriptor stays open for
    // the duration of the call because `file` is borrowed.
    let rc = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "sync_file_range failed");
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}
