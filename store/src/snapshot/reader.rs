//! Reading a snapshot file back, after verifying it end to end.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::format::{Header, Trailer, TRAILER_LEN};
use super::SnapshotFile;
use crate::fs::DescriptorWait;
use crate::{Error, Result};

const READ_BUFFER: usize = 256 * 1024;

/// The verified payload of a snapshot file, read with [`std::io::Read`].
///
/// [`SnapshotReader::open`] checks magic, version, header checksum, length and payload checksum
/// before it returns, so a caller never consumes a damaged snapshot. The payload checksum is
/// checked again as it is read: if the file changed in between, the read that reaches the end
/// fails with [`io::ErrorKind::InvalidData`].
#[derive(Debug)]
pub struct SnapshotReader {
    path: PathBuf,
    meta: Vec<u8>,
    payload_len: u64,
    expected_crc: u32,
    input: BufReader<io::Take<File>>,
    read: u64,
    crc: u32,
}

/// A file whose header and trailer were checked, positioned at the start of its payload.
pub(crate) struct Inspected {
    pub file: File,
    pub info: SnapshotFile,
    pub trailer: Trailer,
}

impl SnapshotReader {
    /// Opens and fully verifies the snapshot file at `path` (magic, format version, header
    /// checksum, length and payload checksum). A truncated or corrupted file is an
    /// [`Error::Corrupt`] that names the file and the offset; nothing is changed on disk.
    pub fn open(path: &Path) -> Result<SnapshotReader> {
        let Inspected {
            mut file,
            info,
            trailer,
        } = inspect(path)?;
        let header_len = info.file_bytes - info.bytes - TRAILER_LEN;
        let mut buf = vec![0u8; READ_BUFFER];
        let mut remaining = info.bytes;
        let mut crc = 0u32;
        while remaining > 0 {
            let want = remaining.min(READ_BUFFER as u64) as usize;
            file.read_exact(&mut buf[..want])
                .map_err(|e| Error::io("read snapshot payload", path, e))?;
            crc = crc32c::crc32c_append(crc, &buf[..want]);
            remaining -= want as u64;
        }
        if crc != trailer.crc {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                offset: header_len,
                reason: format!(
                    "payload checksum mismatch: stored {:#010x}, computed {crc:#010x}",
                    trailer.crc
                ),
            });
        }
        file.seek(SeekFrom::Start(header_len))
            .map_err(|e| Error::io("seek snapshot payload", path, e))?;
        Ok(SnapshotReader::reading(path, info, trailer, file))
    }

    /// Opens the snapshot file at `path` with its header and trailer checked (magic, version,
    /// header checksum, length), not its payload: the payload checksum is checked as it is
    /// read, and the read that reaches the end fails with [`io::ErrorKind::InvalidData`] on a
    /// mismatch. A caller that reads the payload to its end has verified the file with one
    /// read instead of [`SnapshotReader::open`]'s two; one that stops short has not.
    pub fn open_streaming(path: &Path) -> Result<SnapshotReader> {
        let Inspected {
            file,
            info,
            trailer,
        } = inspect(path)?;
        Ok(SnapshotReader::reading(path, info, trailer, file))
    }

    /// A reader of the payload of `file`, positioned at it.
    fn reading(path: &Path, info: SnapshotFile, trailer: Trailer, file: File) -> SnapshotReader {
        SnapshotReader {
            path: path.to_path_buf(),
            meta: info.meta,
            payload_len: info.bytes,
            expected_crc: trailer.crc,
            input: BufReader::with_capacity(READ_BUFFER, file.take(info.bytes)),
            read: 0,
            crc: 0,
        }
    }

    /// The caller's metadata from the header.
    pub fn meta(&self) -> &[u8] {
        &self.meta
    }

    /// The payload length in bytes.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Read for SnapshotReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.input.read(buf)?;
        if n == 0 {
            if self.read < self.payload_len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "snapshot {} ended at payload byte {} of {}",
                        self.path.display(),
                        self.read,
                        self.payload_len
                    ),
                ));
            }
            return Ok(0);
        }
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.read += n as u64;
        if self.read == self.payload_len && self.crc != self.expected_crc {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "snapshot {}: payload checksum mismatch (damaged, or changed since it was \
                     opened)",
                    self.path.display()
                ),
            ));
        }
        Ok(n)
    }
}

/// Checks the header and trailer of the snapshot file at `path` (not the payload checksum) and
/// returns the open file positioned at the payload.
pub(crate) fn inspect(path: &Path) -> Result<Inspected> {
    let mut file = DescriptorWait::default()
        .open("open snapshot", path, || File::open(path))
        .map_err(|e| Error::io("open snapshot", path, e))?;
    let file_len = file
        .metadata()
        .map_err(|e| Error::io("stat snapshot", path, e))?
        .len();
    let header = Header::read(&mut file, path, file_len)?;
    let header_len = Header::encoded_len(header.meta.len());
    let trailer_at = file_len - TRAILER_LEN;
    let mut raw = [0u8; TRAILER_LEN as usize];
    file.seek(SeekFrom::Start(trailer_at))
        .and_then(|_| file.read_exact(&mut raw))
        .map_err(|e| Error::io("read snapshot trailer", path, e))?;
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_path_buf(),
        offset: trailer_at,
        reason,
    };
    let trailer = Trailer::decode(&raw).ok_or_else(|| {
        corrupt(format!(
            "no trailer at the end of the file ({file_len} bytes): truncated or overwritten"
        ))
    })?;
    let held = trailer_at - header_len;
    if trailer.payload_len != held {
        return Err(corrupt(format!(
            "length mismatch: trailer says {} payload bytes, file holds {held}",
            trailer.payload_len
        )));
    }
    file.seek(SeekFrom::Start(header_len))
        .map_err(|e| Error::io("seek snapshot payload", path, e))?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Inspected {
        file,
        info: SnapshotFile {
            path: path.to_path_buf(),
            name,
            bytes: held,
            file_bytes: file_len,
            meta: header.meta,
        },
        trailer,
    })
}
