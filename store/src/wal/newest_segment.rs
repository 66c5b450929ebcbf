//! `NEWEST`: a small file in the log's directory that names the log's newest segment, so that
//! recovery notices a newest segment that went missing.
//!
//! A segment's creation is durable (file, header, directory entry) before anything is written
//! to it, so a crash never loses a whole segment: recovery cuts torn tails, never files. A newest
//! segment deleted by hand, or lost to damage of the file system, leaves a log that reads as
//! whole, only shorter: acknowledged records and votes gone without a trace, which Raft cannot
//! tell from entries never received. So each segment, once its creation is durable and before
//! anything is appended to it, is named here (written in place and synced), and recovery refuses
//! a log whose newest segment is older than the one named (or whose named segment's header is
//! damaged: such a creation was complete).
//!
//! The file holds the segment's first LSN and a checksum (16 bytes, written in place at offset
//! 0). One that cannot be read (a crash tore its write, or its creation never completed) is
//! ignored with a warning: that one time nothing is checked, and the next segment names itself
//! again. A log written by a build that predates the file has none until its next segment; one
//! whose segments an older build rolled names an older segment, which checks less but never
//! refuses a sound log.

use std::io;
use std::path::Path;

use super::Lsn;
use crate::error::{Error, Result};
use crate::fs::FileSystem;

/// The file's name in the log directory (not a segment's name: listings skip it).
pub(crate) const NEWEST: &str = "NEWEST";

/// Bytes of the file: the LSN, a checksum of it, padding.
const LEN: usize = 16;

/// What the file holds for the segment that starts at `first`.
fn encode(first: Lsn) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..8].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(NEWEST.as_bytes()), &b[0..8]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The LSN in `bytes`, if they are what [`encode`] wrote.
fn decode(bytes: &[u8]) -> Option<Lsn> {
    let b: &[u8; LEN] = bytes.get(..LEN)?.try_into().ok()?;
    let first = Lsn::from_le_bytes(b[0..8].try_into().ok()?);
    (encode(first) == *b && first > 0).then_some(first)
}

/// The first LSN of the segment that `NEWEST` in `dir` names as the newest, if it names one. A
/// file that cannot be decoded is logged and read as naming none. Blocking.
pub(crate) fn read(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Lsn>> {
    let path = dir.join(NEWEST);
    let file = match fs.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    let mut bytes = [0u8; LEN];
    let named = match file.read_exact_at(&mut bytes, 0) {
        Ok(()) => decode(&bytes),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
        Err(e) => return Err(Error::io("read", &path, e)),
    };
    if named.is_none() {
        tracing::warn!(
            path = %path.display(),
            "the file naming the log's newest segment cannot be read (a crash tore its write): \
             this open does not check that the newest segment is there"
        );
    }
    Ok(named)
}

/// Names the segment that starts at `first` as the log's newest, in `dir`. Blocking.
///
/// Contract: on `Ok` the name is durable (the file's creation too). On an error the file may
/// hold the old name, the new one, or neither readably; the caller must not retry a failed sync
/// (the log is poisoned).
pub(crate) fn record(fs: &dyn FileSystem, dir: &Path, first: Lsn) -> Result<()> {
    let path = dir.join(NEWEST);
    let (file, created) = match fs.open(&path) {
        Ok(f) => (f, false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let f = fs
                .create_new(&path)
                .map_err(|e| Error::io("create", &path, e))?;
            (f, true)
        }
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    file.write_all_at(&encode(first), 0)
        .map_err(|e| Error::io("write", &path, e))?;
    if created {
        file.sync_all().map_err(|e| Error::io("fsync", &path, e))?;
        fs.sync_dir(dir)
            .map_err(|e| Error::io("fsync log directory", dir, e))
    } else {
        file.sync_data().map_err(|e| Error::io("fsync", &path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{CrashPoint, FaultyFileSystem};

    #[test]
    fn names_the_newest_segment_durably_and_ignores_a_torn_name() {
        let fs = FaultyFileSystem::new();
        let dir = Path::new("/wal");
        fs.create_dir_all(dir).unwrap();
        assert_eq!(read(&fs, dir).unwrap(), None, "absent: names none");
        record(&fs, dir, 7).unwrap();
        record(&fs, dir, 4096).unwrap();
        fs.crash(CrashPoint::default());
        assert_eq!(read(&fs, dir).unwrap(), Some(4096), "durable once recorded");
        // A torn write: the checksum no longer matches.
        let path = dir.join(NEWEST);
        fs.damage(&path, 1, &[0xff]).unwrap();
        assert_eq!(read(&fs, dir).unwrap(), None);
        record(&fs, dir, 9000).unwrap();
        assert_eq!(read(&fs, dir).unwrap(), Some(9000), "written again whole");
        // A short file: its creation never completed.
        fs.open(&path).unwrap().set_len(5).unwrap();
        assert_eq!(read(&fs, dir).unwrap(), None);
        assert_eq!(decode(&[0u8; LEN]), None, "zeros name nothing");
    }
}
