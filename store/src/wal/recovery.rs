//! Recovery on open: scans every segment, verifies every record, and cuts a torn or corrupt tail off
//! the newest segment (the only physical truncate, done before any writer starts). An invalid
//! record followed by valid ones is a torn write, and cut too, only in the newest segment, only if
//! a whole sector before the next valid record reads as zeros (see `lost_sector`), and only if no
//! single flipped bit makes the invalid record valid (see `bit_flip`): an acknowledged record
//! whose payload holds zeros, damaged later, must not be cut. Otherwise, and in any older
//! segment, it is corruption and the log refuses to open, naming the file and offset.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bit_flip;
use super::index::Index;
use super::newest_segment::{self, NEWEST};
use super::record::{self, RecordMeta};
use super::segment::{self, Segment, SEGMENT_HEADER_LEN};
use super::{Lsn, WalOptions};
use crate::error::{Error, Result};
use crate::fs::{DescriptorWait, FileSystem};

/// The state recovery hands to the log.
pub(crate) struct Recovered {
    pub index: Index,
    /// The newest segment; appends continue in it.
    pub tail: Arc<Segment>,
    /// Where the next record goes in the tail.
    pub tail_offset: u64,
}

/// One segment after its scan.
struct Scanned {
    segment: Arc<Segment>,
    records: Vec<RecordMeta>,
    /// Offset just past the last valid record.
    end: u64,
    /// The LSN after the last valid record.
    next: Lsn,
    /// What follows the last valid record of the newest segment and is to be cut off at `end`,
    /// once every check has passed.
    cut: Option<Cut>,
}

/// Bytes after the last valid record of the newest segment, to be cut off.
enum Cut {
    /// Valid-looking records after a sector that never reached the disk: `count` records with
    /// these LSNs, never acknowledged.
    TornWrite {
        count: usize,
        lsns: RangeInclusive<Lsn>,
    },
    /// A torn or corrupt last record, or garbage.
    Tail,
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn prealloc(opts: &WalOptions) -> Option<u64> {
    opts.preallocate.then_some(opts.segment_bytes)
}

/// Recovers the log in `dir` (creating it if needed). On success everything recovered is durable,
/// the directory's entries included. Every check runs before any file is changed, so an open
/// that fails on damage leaves the log as it found it.
pub(crate) fn recover(fs: &dyn FileSystem, dir: &Path, opts: &WalOptions) -> Result<Recovered> {
    fs.create_dir_all(dir)
        .map_err(|e| Error::io("create log directory", dir, e))?;
    // The directory's own entry, made durable before anything in it is relied on: a power loss
    // soon after the first start would otherwise lose the whole log, votes included.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs.sync_dir(parent)
            .map_err(|e| Error::io("fsync the log directory's parent", parent, e))?;
    }
    let names = fs
        .read_dir(dir)
        .map_err(|e| Error::io("list log directory", dir, e))?;
    let mut firsts: Vec<Lsn> = names
        .iter()
        .filter_map(|n| segment::parse_name(n))
        .collect();
    firsts.sort_unstable();
    let named = newest_segment::read(fs, dir)?;

    // A newest segment without a valid header is a creation torn by a crash: nothing was ever
    // written to it, so it goes (unless it holds valid records, which means damage), but only
    // once every check below has passed: a log that refuses to open is left as it was found.
    // The newest segment, opened and read here, is scanned below without opening it again.
    let mut tail = None;
    let mut torn = Vec::new();
    while let Some(&first) = firsts.last() {
        let seg = Segment::open(fs, dir, first)?;
        let bytes = seg.read_all()?;
        if segment::header_ok(&bytes, first) {
            tail = Some((seg, bytes));
            break;
        }
        if record::find_valid(&bytes, 0, first, first).is_some() {
            return Err(corrupt(&seg.path, 0, "invalid segment header"));
        }
        torn.push((first, seg.path.clone()));
        firsts.pop();
    }
    // A newest segment whose creation completed is never lost to a crash: one older than the
    // segment `NEWEST` names means a segment was deleted or damaged (see `newest_segment.rs`).
    if let Some(named) = named.filter(|&n| firsts.last().is_none_or(|&found| found < n)) {
        let found = match firsts.last() {
            Some(found) => format!("the newest segment there starts at LSN {found}"),
            None => "no other segment is there".to_string(),
        };
        return Err(corrupt(
            &dir.join(segment::file_name(named)),
            0,
            format!(
                "this segment is missing, or its header is damaged, but {NEWEST} names it as \
                 the log's newest ({found}): records from LSN {named} on would be lost \
                 silently, so the log refuses to open"
            ),
        ));
    }
    if firsts.is_empty() {
        // Nothing else to check: the torn creations go, and the log starts where the oldest did.
        remove_torn(fs, dir, &torn)?;
        let first = torn.last().map_or(1, |(first, _)| *first);
        return fresh(fs, dir, first, opts);
    }

    let mut scanned: Vec<Scanned> = Vec::with_capacity(firsts.len());
    let mut run_start = 0;
    for (i, &first) in firsts.iter().enumerate() {
        let is_last = i + 1 == firsts.len();
        let (segment, bytes) = match (is_last, tail.take()) {
            (true, Some((seg, bytes))) => (Arc::new(seg), bytes),
            _ => {
                let seg = Arc::new(Segment::open(fs, dir, first)?);
                let bytes = seg.read_all()?;
                (seg, bytes)
            }
        };
        if !segment::header_ok(&bytes, first) {
            return Err(corrupt(&segment.path, 0, "invalid segment header"));
        }
        if let Some(prev) = scanned.last() {
            if first < prev.next {
                return Err(corrupt(
                    &segment.path,
                    0,
                    format!(
                        "segment starts at LSN {first} but the previous one ends at LSN {}",
                        prev.next - 1
                    ),
                ));
            }
            if first > prev.next {
                run_start = i;
            }
        }
        let scan = scan(segment, &bytes, is_last)?;
        scanned.push(scan);
    }

    let mut index = Index::new(firsts[run_start]);
    for s in &scanned[run_start..] {
        index.add_segment(s.segment.clone());
        for r in &s.records {
            index.push(s.segment.first_lsn, r);
        }
    }
    // Segments before a gap are leftovers of a purge whose deletions were not all durable; any
    // record they hold that is not purged means records are missing.
    if run_start > 0 {
        let prev = &scanned[run_start - 1];
        if prev.next - 1 > index.purged_to() {
            return Err(corrupt(
                &prev.segment.path,
                prev.end,
                format!(
                    "records from LSN {} to {} are missing",
                    prev.next,
                    firsts[run_start] - 1
                ),
            ));
        }
    }
    let mut obsolete: Vec<Arc<Segment>> = scanned[..run_start]
        .iter()
        .map(|s| s.segment.clone())
        .collect();
    obsolete.extend(index.take_obsolete_segments(Lsn::MAX));

    // Every check passed: from here on recovery changes files.
    remove_torn(fs, dir, &torn)?;
    let last = scanned.pop().expect("at least one segment");
    if let Some(cut) = &last.cut {
        cut_tail(opts, &last.segment, last.end, cut)?;
    }
    // What recovery read may still sit only in the page cache (a process crash): make it durable
    // so that the log can start with everything durable. First: the newest segment may hold the
    // purge marker that makes the segments removed below obsolete, and it must not be lost
    // with them gone.
    // A newest segment shorter than a preallocated one (its creation's preallocation failed on
    // a full disk, or an earlier start had preallocation off) is preallocated now: appends would
    // otherwise grow it, each barrier would update its size too, and a full disk would fail
    // an append rather than this open.
    let grown = match prealloc(opts) {
        Some(len) => {
            let size = last
                .segment
                .file
                .size()
                .map_err(|e| Error::io("stat recovered segment", &last.segment.path, e))?;
            if size < len {
                segment::preallocate(&*last.segment.file, len, &last.segment.path)?;
            }
            size < len
        }
        None => false,
    };
    let synced = match grown {
        // Its new size too.
        true => last.segment.file.sync_all(),
        false => last.segment.file.sync_data(),
    };
    synced.map_err(|e| Error::io("fsync recovered segment", &last.segment.path, e))?;
    for seg in &obsolete {
        fs.remove_file(&seg.path)
            .map_err(|e| Error::io("remove purged segment", &seg.path, e))?;
    }
    // Always, also with nothing removed: the newest segment's directory entry may never have
    // been made durable (its creation's directory fsync failed, or the process died before it,
    // and the file is still listed after a restart without a power loss). Appends to it are
    // acknowledged from now on, so its name must survive a power loss first.
    fs.sync_dir(dir)
        .map_err(|e| Error::io("fsync log directory", dir, e))?;
    // A log an older build wrote (or whose name a crash tore) gets its newest segment named.
    if named != Some(last.segment.first_lsn) {
        newest_segment::record(fs, dir, last.segment.first_lsn)?;
    }
    Ok(Recovered {
        index,
        tail: last.segment,
        tail_offset: last.end,
    })
}

/// Creates the first segment of an empty log.
fn fresh(fs: &dyn FileSystem, dir: &Path, first: Lsn, opts: &WalOptions) -> Result<Recovered> {
    let tail = Arc::new(Segment::create(
        fs,
        dir,
        first,
        prealloc(opts),
        DescriptorWait::new(opts.descriptor_wait),
    )?);
    newest_segment::record(fs, dir, first)?;
    let mut index = Index::new(first);
    index.add_segment(tail.clone());
    Ok(Recovered {
        index,
        tail,
        tail_offset: SEGMENT_HEADER_LEN,
    })
}

/// Verifies the records of one segment in order, and deals with what follows the last valid one:
/// zeros are the unused (preallocated) rest; anything else is either a torn tail of the newest
/// segment (to be cut off by the caller, see [`Scanned::cut`]) or corruption (an error). Changes
/// nothing.
fn scan(segment: Arc<Segment>, bytes: &[u8], is_last: bool) -> Result<Scanned> {
    let first = segment.first_lsn;
    let mut pos = SEGMENT_HEADER_LEN as usize;
    let mut next = first;
    let mut records = Vec::new();
    let mut cut = None;
    while let Some(meta) = record::decode(bytes, pos, first, next) {
        if meta.lsn != next {
            break;
        }
        pos += meta.size() as usize;
        next += 1;
        records.push(meta);
    }
    if record::skip_zeros(bytes, pos) < bytes.len() {
        let path = &segment.path;
        if !is_last {
            return Err(corrupt(path, pos as u64, "invalid record"));
        }
        let valid = record::find_valid(bytes, pos + 1, first, next);
        if valid.is_some_and(|valid| !lost_sector(bytes, pos, valid)) {
            return Err(corrupt(
                path,
                pos as u64,
                "invalid record followed by valid records (not a torn write: the bytes are not \
                 zeros)",
            ));
        }
        // A record written whole (perhaps synced and acknowledged), then damaged: cutting it
        // could lose an acknowledged write.
        if let Some(flip) = damaged_bit(bytes, pos, first, next) {
            let what = match valid {
                Some(_) => "invalid record followed by valid records",
                None => "invalid last record",
            };
            return Err(corrupt(
                path,
                pos as u64,
                format!(
                    "{what} (not a torn write: one flipped bit explains it, bit {} of the byte at \
                     offset {})",
                    flip.bit, flip.offset
                ),
            ));
        }
        cut = Some(match valid {
            Some(valid) => {
                let (count, lsns) = valid_records(bytes, valid, first, next);
                Cut::TornWrite { count, lsns }
            }
            None => Cut::Tail,
        });
    }
    Ok(Scanned {
        segment,
        records,
        end: pos as u64,
        next,
        cut,
    })
}

/// Cuts what follows the last valid record (at `end`) off the newest segment, preallocates it
/// again and syncs it.
fn cut_tail(opts: &WalOptions, segment: &Segment, end: u64, cut: &Cut) -> Result<()> {
    let path = &segment.path;
    match cut {
        Cut::TornWrite { count, lsns } => tracing::warn!(
            path = %path.display(),
            offset = end,
            dropped_records = count,
            dropped_lsns = %format!("{}..={}", lsns.start(), lsns.end()),
            "cutting a torn write off the log: a sector before the valid-looking records after \
             it reads as zeros, as one that never reached the disk before a crash does, so no \
             completed sync covered them (unless the disk itself zeroed that sector)"
        ),
        Cut::Tail => tracing::warn!(
            path = %path.display(),
            offset = end,
            "cutting a torn or corrupt tail off the log"
        ),
    }
    let file = &segment.file;
    file.set_len(end)
        .map_err(|e| Error::io("cut torn tail", path, e))?;
    if let Some(len) = prealloc(opts) {
        segment::preallocate(&**file, len, path)?;
    }
    file.sync_all()
        .map_err(|e| Error::io("fsync after cutting tail", path, e))
}

/// Removes segments whose creation was torn (no valid header, no records), and makes the
/// removal durable.
fn remove_torn(fs: &dyn FileSystem, dir: &Path, torn: &[(Lsn, PathBuf)]) -> Result<()> {
    if torn.is_empty() {
        return Ok(());
    }
    for (_, path) in torn {
        tracing::warn!(path = %path.display(), "removing a segment whose creation was torn");
        fs.remove_file(path)
            .map_err(|e| Error::io("remove torn segment", path, e))?;
    }
    fs.sync_dir(dir)
        .map_err(|e| Error::io("fsync log directory", dir, e))
}

/// The smallest unit a disk writes: a crash may persist some sectors of a write and not others.
const SECTOR: usize = 512;

/// Whether the invalid bytes from `pos` up to the next valid record at `valid` are a write torn by
/// a crash: some sector that overlaps them and does not hold the start of that record reads as
/// zeros over its part of them (in the sector of `pos`, the bytes before `pos` belong to the last
/// valid record). A segment is preallocated with zeros and only ever appended to, so a sector whose
/// newest write never landed reads as zeros past the durable end. The records after such a sector
/// were written by a sync that never completed (a completed fdatasync covers every byte before
/// them), so none was acknowledged and cutting at `pos` loses nothing acknowledged. Damage to
/// synced bytes (flipped bits) usually leaves non-zero garbage and is refused; but a record whose
/// own payload holds an aligned zero sector passes this test when damaged, so the caller also
/// refuses when one flipped bit explains the invalid record (`bit_flip::find`).
fn lost_sector(bytes: &[u8], pos: usize, valid: usize) -> bool {
    (pos / SECTOR..valid / SECTOR).any(|k| {
        let from = (k * SECTOR).max(pos);
        bytes[from..(k + 1) * SECTOR].iter().all(|&b| b == 0)
    })
}

/// A bit whose flip makes the invalid record at `pos` valid, unless that bit lies in bytes a
/// crash may have lost: a zero byte in a sector whose part from `pos` is all zeros, or in the
/// zeros that run to the end of the segment. A lost sector (or a torn last write) that held just
/// one set bit is one flip from valid too; there a torn write is as likely as damage, and a
/// refusal would stop the node after a mere power loss.
fn damaged_bit(bytes: &[u8], pos: usize, first: Lsn, next: Lsn) -> Option<bit_flip::Flip> {
    let flip = bit_flip::find(bytes, pos, first, next)?;
    let at = flip.offset;
    if bytes[at] == 0 {
        let sector = at / SECTOR * SECTOR;
        let part = &bytes[sector.max(pos)..(sector + SECTOR).min(bytes.len())];
        if part.iter().all(|&b| b == 0) || record::skip_zeros(bytes, at) == bytes.len() {
            return None;
        }
    }
    Some(flip)
}

/// How many valid-looking records start at or after `from`, and their LSN range.
fn valid_records(
    bytes: &[u8],
    from: usize,
    first: Lsn,
    min_lsn: Lsn,
) -> (usize, RangeInclusive<Lsn>) {
    let (mut count, mut low, mut high) = (0, Lsn::MAX, 0);
    let mut at = from;
    while let Some(found) = record::find_valid(bytes, at, first, min_lsn) {
        let Some(meta) = record::decode(bytes, found, first, min_lsn) else {
            break;
        };
        count += 1;
        low = low.min(meta.lsn);
        high = high.max(meta.lsn);
        at = found + meta.size() as usize;
    }
    (count, low..=high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{CrashPoint, FaultyFileSystem};
    use crate::wal::Wal;

    const DIR: &str = "/log";
    /// Where record 2 (b) starts and where its payload starts, after the segment header and a
    /// one-byte record 1.
    const B_AT: usize = 24 + 17 + 1;
    const B_PAYLOAD: usize = B_AT + 17;

    fn open(fs: &FaultyFileSystem) -> Result<Wal> {
        let opts = WalOptions {
            segment_bytes: 1 << 20,
            ..WalOptions::default()
        };
        Wal::open_with(Arc::new(fs.clone()), DIR, opts)
    }

    fn seg() -> std::path::PathBuf {
        Path::new(DIR).join(segment::file_name(1))
    }

    /// A 2000-byte payload with zeros over file offsets 459..1159 (so the aligned sector
    /// 512..1024 is zeros) and non-zero bytes elsewhere: a value that happens to hold zeros.
    fn payload_with_zeros() -> Vec<u8> {
        let mut p: Vec<u8> = (0..2000u32).map(|i| (i * 131 % 251) as u8 | 1).collect();
        p[400..1100].fill(0);
        const { assert!(B_PAYLOAD + 400 < 512 && B_PAYLOAD + 1100 > 1024) };
        p
    }

    /// Writes a, b (`b`), c and d, syncing after a and, if `ack_all`, after d too; then a power
    /// loss that keeps every write. Returns the file system.
    fn a_b_c_d(b: &[u8], ack_all: bool) -> FaultyFileSystem {
        let fs = FaultyFileSystem::new();
        let wal = open(&fs).unwrap();
        wal.append(b"a").unwrap();
        wal.sync(1).unwrap();
        for p in [b, b"c", b"d"] {
            wal.append(p).unwrap();
        }
        if ack_all {
            wal.sync(4).unwrap();
        }
        fs.crash(CrashPoint {
            persist_ops: fs.unsynced_ops(),
            torn_bytes: 0,
        });
        drop(wal);
        let bytes = fs.contents(&seg()).unwrap();
        let c_at = B_PAYLOAD + b.len();
        assert_eq!(&bytes[c_at + 17..c_at + 18], b"c");
        fs
    }

    fn flip_bit(fs: &FaultyFileSystem, offset: usize, bit: u8) {
        let byte = fs.contents(&seg()).unwrap()[offset] ^ (1 << bit);
        fs.damage(&seg(), offset as u64, &[byte]).unwrap();
    }

    #[test]
    fn one_flipped_bit_in_an_acknowledged_record_with_a_zero_sector_is_refused() {
        // (byte offset, bit): payload bits outside the zeros and in them (not in the aligned
        // sector), then the length (2000 -> 2001 and -> 4048), LSN, kind and checksum fields.
        let flips = [
            (B_PAYLOAD + 100, 2),
            (B_PAYLOAD + 1999, 7),
            (470, 0),
            (B_AT, 0),
            (B_AT + 1, 3),
            (B_AT + 8, 0),
            (B_AT + 15, 7),
            (B_AT + 16, 1),
            (B_AT + 4, 5),
        ];
        for (offset, bit) in flips {
            let fs = a_b_c_d(&payload_with_zeros(), true);
            flip_bit(&fs, offset, bit);
            let bytes = fs.contents(&seg()).unwrap();
            assert!(lost_sector(&bytes, B_AT, B_PAYLOAD + 2000), "would be cut");
            match open(&fs) {
                Err(Error::Corrupt {
                    path,
                    offset: at,
                    reason,
                }) => {
                    assert_eq!((path, at), (seg(), B_AT as u64));
                    let expected = format!("bit {bit} of the byte at offset {offset}");
                    assert!(reason.contains("one flipped bit"), "{reason}");
                    assert!(reason.contains(&expected), "{reason}");
                }
                other => panic!("flip at {offset} bit {bit}: expected Corrupt, got {other:?}"),
            }
            assert_eq!(
                fs.contents(&seg()).unwrap(),
                bytes,
                "a failed open changes nothing"
            );
        }
    }

    /// Writes `records` after a synced record a, syncs the first `acked` of them too, then a
    /// power loss that keeps every write. Returns the file system.
    fn a_then(records: &[&[u8]], acked: u64) -> FaultyFileSystem {
        let fs = FaultyFileSystem::new();
        let wal = open(&fs).unwrap();
        wal.append(b"a").unwrap();
        wal.sync(1).unwrap();
        for r in records {
            wal.append(r).unwrap();
        }
        if acked > 0 {
            wal.sync(1 + acked).unwrap();
        }
        fs.crash(CrashPoint {
            persist_ops: fs.unsynced_ops(),
            torn_bytes: 0,
        });
        fs
    }

    #[test]
    fn one_flipped_bit_in_the_last_record_is_refused_not_cut() {
        let noise: Vec<u8> = (0..2000u32).map(|i| (i * 131 % 251) as u8 | 1).collect();
        for (offset, bit) in [(B_PAYLOAD + 700, 3), (B_AT + 2, 0), (B_AT + 5, 6)] {
            let fs = a_then(&[&noise], 1);
            flip_bit(&fs, offset, bit);
            match open(&fs) {
                Err(Error::Corrupt {
                    offset: at, reason, ..
                }) => {
                    assert_eq!(at, B_AT as u64);
                    assert!(reason.contains("invalid last record"), "{reason}");
                    assert!(reason.contains(&format!("bit {bit} of the byte at offset {offset}")));
                }
                other => panic!("flip at {offset} bit {bit}: expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_lost_write_that_held_one_set_bit_is_still_cut() {
        // The last write's final byte (one set bit) never landed: one flip from valid, but in the
        // zeros that run to the end, so a torn write as likely as damage.
        let mut ends_in_one: Vec<u8> = (0..2000u32).map(|i| (i * 131 % 251) as u8 | 1).collect();
        *ends_in_one.last_mut().unwrap() = 0x01;
        let fs = a_then(&[&ends_in_one], 0);
        fs.damage(&seg(), (B_PAYLOAD + 1999) as u64, &[0]).unwrap();
        let wal = open(&fs).unwrap();
        assert_eq!(wal.read_range(..).unwrap(), [(1, b"a".to_vec())]);
        drop(wal);
        // A lost sector in the middle of the record, whose part of b held one set bit, with
        // records after it that landed.
        let mut one_bit_sector = payload_with_zeros();
        one_bit_sector[700 - B_PAYLOAD] = 0x40;
        let fs = a_then(&[&one_bit_sector, b"c", b"d"], 0);
        fs.damage(&seg(), 700, &[0]).unwrap();
        assert!(lost_sector(
            &fs.contents(&seg()).unwrap(),
            B_AT,
            B_PAYLOAD + 2000
        ));
        let wal = open(&fs).unwrap();
        assert_eq!(wal.read_range(..).unwrap(), [(1, b"a".to_vec())]);
    }

    #[test]
    fn a_lost_middle_sector_is_still_cut_as_a_torn_write() {
        let noise: Vec<u8> = (0..2000u32).map(|i| (i * 131 % 251) as u8).collect();
        for b in [noise, payload_with_zeros()] {
            let fs = a_b_c_d(&b, false);
            // The sector 1536..2048, in the middle of b, never landed; c and d did.
            fs.damage(&seg(), 1536, &[0; SECTOR]).unwrap();
            let wal = open(&fs).unwrap();
            assert_eq!(wal.last_lsn(), 1);
            assert_eq!(wal.read_range(..).unwrap(), [(1, b"a".to_vec())]);
        }
    }

    #[test]
    fn lost_sector_needs_a_zero_sector_before_the_next_record() {
        let mut bytes = vec![0xA5; 4 * SECTOR];
        // Zeros from `pos` to the end of its sector: only the bytes from `pos` on count.
        bytes[100..SECTOR].fill(0);
        assert!(lost_sector(&bytes, 100, 3 * SECTOR));
        assert!(!lost_sector(&bytes, 99, 3 * SECTOR));
        // A zero sector in the middle counts; one that holds the next record's start does not.
        let mut bytes = vec![0xA5; 4 * SECTOR];
        bytes[2 * SECTOR..3 * SECTOR].fill(0);
        assert!(lost_sector(&bytes, 100, 3 * SECTOR));
        assert!(!lost_sector(&bytes, 100, 3 * SECTOR - 1));
        assert!(!lost_sector(&bytes, 100, 2 * SECTOR + 10));
        // A sector with one non-zero byte is not lost.
        bytes[3 * SECTOR - 1] = 1;
        assert!(!lost_sector(&bytes, 100, 3 * SECTOR));
    }

    #[test]
    fn valid_records_counts_what_a_cut_drops() {
        let mut bytes = vec![0xA5; 40];
        record::encode(&mut bytes, 7, 12, record::Kind::Data, b"x");
        bytes.extend([0; 30]);
        record::encode(&mut bytes, 7, 13, record::Kind::Data, b"y");
        assert_eq!(valid_records(&bytes, 0, 7, 10), (2, 12..=13));
        assert_eq!(valid_records(&bytes, 0, 7, 13), (1, 13..=13));
    }
}
