//! Finding a stopped node's write-ahead log segments and damaging them the way a crash or a bad
//! disk would: a torn tail with garbage after it, or one flipped byte in an older segment.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The log segments under `data_dir`, oldest first. Found by listing: files named by a number (the
/// first record number they hold, e.g. `00000000000000000001.wal`) in a folder whose name contains
/// `wal`.
pub fn wal_segments(data_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    collect(data_dir, false, &mut found)?;
    let mut keyed: Vec<(u128, PathBuf)> = found
        .into_iter()
        .filter_map(|path| {
            let number = path.file_stem()?.to_str()?.parse::<u128>().ok()?;
            Some((number, path))
        })
        .collect();
    keyed.sort();
    Ok(keyed.into_iter().map(|(_, path)| path).collect())
}

fn collect(dir: &Path, in_wal: bool, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if entry.file_type()?.is_dir() {
            collect(&path, in_wal || name.contains("wal"), out)?;
        } else if in_wal && !name.starts_with('.') && !name.contains("tmp") {
            out.push(path);
        }
    }
    Ok(())
}

/// Cuts the segment at `cut` (a torn write) and appends `garbage` there.
pub fn tear_tail(path: &Path, cut: u64, garbage: &[u8]) -> anyhow::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.set_len(cut)?;
    file.seek(SeekFrom::Start(cut))?;
    file.write_all(garbage)?;
    file.sync_all()?;
    Ok(())
}

/// Inverts the byte at `offset`.
pub fn flip_byte(path: &Path, offset: u64) -> anyhow::Result<()> {
    let mut file = OpenOptions::new().read(true).write(true).open(path)?;
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut byte)?;
    byte[0] ^= 0xFF;
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(&byte)?;
    file.sync_all()?;
    Ok(())
}

/// Where one record lies in a segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordSpan {
    /// Offset of the record header.
    pub offset: u64,
    /// Header plus payload.
    pub len: u64,
    /// Offset of the payload.
    pub payload: u64,
}

/// Segment header size of the log's on-disk format.
const SEGMENT_HEADER_LEN: u64 = 24;
/// Record header size: payload length (u32), CRC32C (u32), LSN (u64), kind (u8).
const RECORD_HEADER_LEN: u64 = 17;

/// The records of a segment, found by walking the record headers of the log's on-disk format
/// (checksums are not verified here). The walk stops at the first header that cannot start a record
/// (LSN 0, unknown kind, or a length past the end of the file), e.g. the zeros of a preallocated tail.
pub fn record_spans(path: &Path) -> anyhow::Result<Vec<RecordSpan>> {
    let bytes = std::fs::read(path)?;
    let mut spans = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN;
    while pos + RECORD_HEADER_LEN <= bytes.len() as u64 {
        let at = pos as usize;
        let payload_len = u32::from_le_bytes(bytes[at..at + 4].try_into()?) as u64;
        let lsn = u64::from_le_bytes(bytes[at + 8..at + 16].try_into()?);
        let kind = bytes[at + 16];
        let len = RECORD_HEADER_LEN + payload_len;
        if lsn == 0 || !(1..=3).contains(&kind) || pos + len > bytes.len() as u64 {
            break;
        }
        spans.push(RecordSpan {
            offset: pos,
            len,
            payload: pos + RECORD_HEADER_LEN,
        });
        pos += len;
    }
    Ok(spans)
}

/// Writes, right after the record `last`, the start of one more record (the header of a copy of
/// `last` with the next LSN, and half its payload) followed by `garbage`: the state a crash leaves
/// when it interrupts the write of a record, which therefore was never synced nor acknowledged.
/// Returns the offset of the torn record.
pub fn append_torn_record(path: &Path, last: RecordSpan, garbage: &[u8]) -> anyhow::Result<u64> {
    let bytes = std::fs::read(path)?;
    let record = &bytes[last.offset as usize..(last.offset + last.len) as usize];
    let mut torn =
        record[..RECORD_HEADER_LEN as usize + (last.len - RECORD_HEADER_LEN) as usize / 2].to_vec();
    let lsn = u64::from_le_bytes(torn[8..16].try_into()?) + 1;
    torn[8..16].copy_from_slice(&lsn.to_le_bytes());
    torn.extend_from_slice(garbage);
    let at = last.offset + last.len;
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(at))?;
    file.write_all(&torn)?;
    file.sync_all()?;
    Ok(at)
}
