//! Recovery on open: a torn or garbage tail is cut, and so are valid records after a sector that
//! never reached the disk; corruption in the middle of the log is an error naming the file and
//! offset, and opening then changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meta_store::fs::{CrashPoint, FaultyFileSystem, FileSystem};
use meta_store::{Error, Wal, WalOptions};

fn opts(preallocate: bool, segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        preallocate,
        ..WalOptions::default()
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

/// Writes records "record-NN" for 1..=n and closes the log.
fn write_records(dir: &Path, o: &WalOptions, n: usize) {
    let wal = Wal::open(dir, o.clone()).unwrap();
    for i in 1..=n {
        wal.append(format!("record-{i:02}").as_bytes()).unwrap();
    }
    wal.close().unwrap();
}

/// The offset of the header of the record whose payload is `payload`, and its file.
fn find_record(dir: &Path, payload: &str) -> (PathBuf, u64) {
    for path in segments(dir) {
        let bytes = std::fs::read(&path).unwrap();
        if let Some(pos) = bytes
            .windows(payload.len())
            .position(|w| w == payload.as_bytes())
        {
            return (path, pos as u64 - 17);
        }
    }
    panic!("{payload} not found");
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn payloads(wal: &Wal) -> Vec<String> {
    wal.read_range(..)
        .unwrap()
        .into_iter()
        .map(|(_, p)| String::from_utf8(p).unwrap())
        .collect()
}

#[test]
fn garbage_after_the_last_record_is_cut() {
    for preallocate in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(preallocate, 1 << 20);
        write_records(dir.path(), &o, 10);
        let (path, at) = find_record(dir.path(), "record-10");
        let end = at + 17 + 9;
        patch(&path, end, &[0xFF; 37]);

        let wal = Wal::open(dir.path(), o.clone()).unwrap();
        assert_eq!(wal.last_lsn(), 10);
        assert_eq!(payloads(&wal).len(), 10);
        // Cut physically: only zeros (preallocated space) or nothing follows the last record.
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            bytes[end as usize..].iter().all(|&b| b == 0),
            "prealloc={preallocate}"
        );
        if !preallocate {
            assert_eq!(bytes.len() as u64, end);
        }
        assert_eq!(wal.append(b"record-11").unwrap(), 11);
        wal.close().unwrap();
        let wal = Wal::open(dir.path(), o).unwrap();
        assert_eq!(payloads(&wal).last().unwrap(), "record-11");
    }
}

#[test]
fn a_torn_last_record_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(true, 1 << 20);
    write_records(dir.path(), &o, 5);
    let (path, at) = find_record(dir.path(), "record-05");
    // Only the first 12 bytes of the last record reached the disk.
    patch(&path, at + 12, &[0; 14]);
    let wal = Wal::open(dir.path(), o).unwrap();
    assert_eq!(wal.last_lsn(), 4);
    assert_eq!(wal.read(5).unwrap(), None);
    assert_eq!(wal.append(b"again").unwrap(), 5);
}

fn assert_corrupt_at(result: Result<Wal, Error>, path: &Path, offset: u64) {
    match result {
        Err(e @ Error::Corrupt { .. }) => {
            let Error::Corrupt {
                path: p, offset: o, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((p.as_path(), *o), (path, offset));
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&offset.to_string()), "{msg}");
        }
        other => panic!(
            "expected Corrupt at {}:{offset}, got {other:?}",
            path.display()
        ),
    }
}

#[test]
fn corruption_followed_by_valid_records_names_file_and_offset() {
    for preallocate in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(preallocate, 1 << 20);
        write_records(dir.path(), &o, 10);
        let (path, at) = find_record(dir.path(), "record-04");
        patch(&path, at + 20, b"X");
        let before = std::fs::read(&path).unwrap();
        assert_corrupt_at(Wal::open(dir.path(), o.clone()), &path, at);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "a failed open changes nothing"
        );
        // A damaged length field is found the same way.
        patch(&path, at + 20, b"c");
        patch(&path, at, &[0xEE]);
        assert_corrupt_at(Wal::open(dir.path(), o), &path, at);
    }
}

#[test]
fn corruption_in_an_older_segment_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(true, 256);
    write_records(dir.path(), &o, 40);
    assert!(segments(dir.path()).len() > 3);
    let (path, at) = find_record(dir.path(), "record-02");
    assert_eq!(path, segments(dir.path())[0]);
    patch(&path, at + 17, b"?");
    assert_corrupt_at(Wal::open(dir.path(), o.clone()), &path, at);

    // The last record of an older segment damaged so that it reads as zeros: the records are
    // missing, which is reported too.
    patch(&path, at + 17, b"r");
    let (path, at) = find_record(dir.path(), "record-16");
    let next = find_record(dir.path(), "record-17").0;
    assert_ne!(path, next, "record-16 ends its segment");
    patch(&path, at, &[0; 26]);
    match Wal::open(dir.path(), o) {
        Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Every file of the log directory with its bytes.
fn dir_contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    v.sort();
    v
}

/// Missing records make the open fail; it must not first cut the newest segment's garbage tail
/// or remove a torn segment creation, which an operator examining the damage would want to see.
#[test]
fn an_open_that_finds_missing_records_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(true, 256);
    write_records(dir.path(), &o, 40);
    let all = segments(dir.path());
    assert!(all.len() > 3);
    std::fs::remove_file(&all[1]).unwrap();
    let (newest, at) = find_record(dir.path(), "record-40");
    patch(&newest, at + 26, b"garbage!");
    std::fs::write(dir.path().join(format!("{:020}.wal", 41)), b"MSWAL").unwrap();
    let before = dir_contents(dir.path());

    match Wal::open(dir.path(), o) {
        Err(Error::Corrupt { path, reason, .. }) => {
            assert_eq!(path, all[0], "{reason}");
            assert!(reason.contains("missing"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        dir_contents(dir.path()) == before,
        "the failed open changed the log directory"
    );
}

#[test]
fn a_torn_segment_creation_is_removed() {
    let fs = FaultyFileSystem::new();
    let dir = Path::new("/log");
    let o = opts(true, 1 << 20);
    let wal = Wal::open_with(Arc::new(fs.clone()), dir, o.clone()).unwrap();
    wal.append(b"a").unwrap();
    wal.close().unwrap();
    // A crash during creation left a segment without its header.
    let torn = dir.join(format!("{:020}.wal", 2));
    let f = fs.create_new(&torn).unwrap();
    f.write_all_at(b"MSWAL", 0).unwrap();
    f.sync_all().unwrap();
    fs.sync_dir(dir).unwrap();
    drop(wal);
    let wal = Wal::open_with(Arc::new(fs.clone()), dir, o).unwrap();
    assert_eq!(wal.last_lsn(), 1);
    assert!(fs.contents(&torn).is_none());
    assert_eq!(wal.append(b"b").unwrap(), 2);
}

#[test]
fn a_damaged_byte_found_on_read_is_an_error() {
    let fs = FaultyFileSystem::new();
    let dir = Path::new("/log");
    let wal = Wal::open_with(Arc::new(fs.clone()), dir, WalOptions::default()).unwrap();
    wal.append(b"hello").unwrap();
    let seg = dir.join(format!("{:020}.wal", 1));
    fs.damage(&seg, 24 + 17, b"J").unwrap();
    assert!(matches!(wal.read(1), Err(Error::Corrupt { .. })));
    assert!(matches!(wal.read_range(..), Err(Error::Corrupt { .. })));
}

/// Record "a" synced, then a 5000-byte record b and a small record c written but not synced, and
/// a power loss that persists b and c. Returns the segment and the offsets of b and c.
fn synced_a_then_unsynced_b_c(fs: &FaultyFileSystem, o: &WalOptions) -> (PathBuf, u64, u64) {
    let dir = Path::new("/log");
    let wal = Wal::open_with(Arc::new(fs.clone()), dir, o.clone()).unwrap();
    wal.append(b"a").unwrap();
    wal.sync(1).unwrap();
    assert_eq!(wal.append(&[b'b'; 5000]).unwrap(), 2);
    assert_eq!(wal.append(b"c").unwrap(), 3);
    fs.crash(CrashPoint {
        persist_ops: fs.unsynced_ops(),
        torn_bytes: 0,
    });
    drop(wal);
    let seg = dir.join(format!("{:020}.wal", 1));
    let (a_end, c_at) = (24 + 17 + 1, 24 + 17 + 1 + 17 + 5000);
    let bytes = fs.contents(&seg).unwrap();
    assert_eq!(&bytes[c_at as usize + 17..c_at as usize + 18], b"c");
    (seg, a_end, c_at)
}

#[test]
fn valid_records_after_a_lost_earlier_sector_are_a_torn_tail() {
    let fs = FaultyFileSystem::new();
    let dir = Path::new("/log");
    let o = opts(true, 1 << 20);
    let (seg, a_end, _) = synced_a_then_unsynced_b_c(&fs, &o);
    // Page 0's newest writeback never landed: on disk it is as last synced, header and record a,
    // then zeros; b's later sectors and c did land.
    fs.damage(&seg, a_end, &vec![0u8; 4096 - a_end as usize])
        .unwrap();

    let wal = Wal::open_with(Arc::new(fs.clone()), dir, o.clone()).unwrap();
    assert_eq!(wal.last_lsn(), 1);
    assert_eq!(payloads(&wal), ["a"]);
    // Cut physically: only the preallocated zeros follow record a.
    let bytes = fs.contents(&seg).unwrap();
    assert!(bytes[a_end as usize..].iter().all(|&b| b == 0));
    assert_eq!(wal.append(b"d").unwrap(), 2);
    wal.sync(2).unwrap();
    assert_eq!(wal.append(b"e").unwrap(), 3);
    fs.crash(CrashPoint::default());
    drop(wal);
    let wal = Wal::open_with(Arc::new(fs.clone()), dir, o).unwrap();
    assert_eq!(payloads(&wal), ["a", "d"]);
}

fn assert_refused_as_not_torn(fs: &FaultyFileSystem, o: &WalOptions, seg: &Path, at: u64) {
    let before = fs.contents(seg).unwrap();
    let result = Wal::open_with(Arc::new(fs.clone()), Path::new("/log"), o.clone());
    if let Err(Error::Corrupt { reason, .. }) = &result {
        assert!(reason.contains("not a torn write"), "{reason}");
    }
    assert_corrupt_at(result, seg, at);
    assert_eq!(
        fs.contents(seg).unwrap(),
        before,
        "a failed open changes nothing"
    );
}

#[test]
fn garbage_before_valid_records_is_refused() {
    let fs = FaultyFileSystem::new();
    let o = opts(true, 1 << 20);
    let (seg, a_end, _) = synced_a_then_unsynced_b_c(&fs, &o);
    // The same layout, but b's first sectors hold non-zero garbage: damage, not a lost write.
    fs.damage(&seg, a_end, &vec![0xA5; 4096 - a_end as usize])
        .unwrap();
    assert_refused_as_not_torn(&fs, &o, &seg, a_end);
}

#[test]
fn zeros_only_in_the_sector_of_the_next_valid_record_are_refused() {
    let fs = FaultyFileSystem::new();
    let o = opts(true, 1 << 20);
    let (seg, a_end, c_at) = synced_a_then_unsynced_b_c(&fs, &o);
    // Garbage up to the sector that holds c's start, zeros from there to c: that sector landed
    // (it holds c), so its zeros say nothing about a lost write.
    let c_sector = c_at / 512 * 512;
    assert!(c_sector > a_end && c_sector < c_at);
    fs.damage(&seg, a_end, &vec![0xA5; (c_sector - a_end) as usize])
        .unwrap();
    fs.damage(&seg, c_sector, &vec![0; (c_at - c_sector) as usize])
        .unwrap();
    assert_refused_as_not_torn(&fs, &o, &seg, a_end);
}

/// A newest segment deleted (by hand, or lost with the file system's damage) leaves a log that
/// reads as whole, only shorter: `NEWEST` names it, so the open refuses and changes nothing. A
/// log without `NEWEST` (an older build's) gets one at its next open.
#[test]
fn a_missing_newest_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(true, 256);
    write_records(dir.path(), &o, 40);
    let all = segments(dir.path());
    assert!(all.len() > 3);
    let newest = all.last().unwrap().clone();
    let marker = dir.path().join("NEWEST");
    // Named by the roll that created it (an open names only the segment it ends in).
    let named = u64::from_le_bytes(std::fs::read(&marker).unwrap()[..8].try_into().unwrap());
    let first: u64 = newest
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(named, first, "the log names its newest segment");

    // An older build's log: no marker. The open names the newest segment again.
    std::fs::remove_file(&marker).unwrap();
    Wal::open(dir.path(), o.clone()).unwrap().close().unwrap();
    assert!(marker.exists(), "the open named the newest segment");

    std::fs::remove_file(&newest).unwrap();
    let before = dir_contents(dir.path());
    match Wal::open(dir.path(), o.clone()) {
        Err(Error::Corrupt { path, reason, .. }) => {
            assert_eq!(path, newest, "{reason}");
            assert!(
                reason.contains("NEWEST") && reason.contains("missing"),
                "{reason}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        dir_contents(dir.path()) == before,
        "the failed open changed the log directory"
    );
    // Every segment gone, the marker left: refused too, not a fresh log.
    for seg in segments(dir.path()) {
        std::fs::remove_file(seg).unwrap();
    }
    match Wal::open(dir.path(), o) {
        Err(Error::Corrupt { path, reason, .. }) => {
            assert_eq!(path, newest, "{reason}");
            assert!(reason.contains("no other segment"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A newest segment shorter than a preallocated one (its preallocation failed on a full disk, or
/// an earlier start had preallocation off) is preallocated at open, its records kept.
#[test]
fn a_short_newest_segment_is_preallocated_at_open() {
    let dir = tempfile::tempdir().unwrap();
    write_records(dir.path(), &opts(false, 1 << 20), 3);
    let newest = segments(dir.path()).pop().unwrap();
    assert!(std::fs::metadata(&newest).unwrap().len() < 1 << 20);
    let wal = Wal::open(dir.path(), opts(true, 1 << 20)).unwrap();
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), 1 << 20);
    assert_eq!(payloads(&wal), ["record-01", "record-02", "record-03"]);
    wal.append(b"record-04").unwrap();
    wal.close().unwrap();
    let wal = Wal::open(dir.path(), opts(true, 1 << 20)).unwrap();
    assert_eq!(payloads(&wal).len(), 4);
    wal.close().unwrap();
}
