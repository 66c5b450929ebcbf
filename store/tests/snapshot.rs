//! Snapshot files: round trip, crash before the rename, damaged files, retention.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use meta_store::rate_limit::{Clock, Pacer};
use meta_store::snapshot::DEFAULT_KEEP;
use meta_store::{Error, RateLimiter, SnapshotReader, SnapshotStore};
use parking_lot::Mutex;

/// A clock that moves only when slept on, so paced writes take no real time.
#[derive(Debug, Default)]
struct FakeClock {
    now: Mutex<std::time::Duration>,
}

impl Clock for FakeClock {
    fn now(&self) -> std::time::Duration {
        *self.now.lock()
    }

    fn sleep(&self, duration: std::time::Duration) {
        *self.now.lock() += duration;
    }
}

fn unlimited() -> Arc<RateLimiter> {
    Arc::new(RateLimiter::unlimited())
}

/// Deterministic pseudo-random bytes.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn name(index: u64) -> String {
    format!("{index:020}-{:020}", 1)
}

/// Writes a complete snapshot with `data` in uneven pieces (and empty writes in between).
fn write_snapshot(store: &SnapshotStore, name: &str, meta: &[u8], data: &[u8]) -> PathBuf {
    let mut writer = store.create(name, meta, unlimited()).unwrap();
    let mut rest = data;
    let mut step = 1;
    while !rest.is_empty() {
        let n = rest.len().min(step);
        writer.write_all(&rest[..n]).unwrap();
        assert_eq!(writer.write(&[]).unwrap(), 0);
        writer.flush().unwrap();
        rest = &rest[n..];
        step = step * 3 + 1;
    }
    writer.finish().unwrap().path
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn read_all(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let mut reader = SnapshotStore::open_reader(path).unwrap();
    let meta = reader.meta().to_vec();
    let mut data = Vec::new();
    reader.read_to_end(&mut data).unwrap();
    assert_eq!(data.len() as u64, reader.payload_len());
    (meta, data)
}

/// Asserts that opening `path` fails with a corruption error that names the file and contains
/// `needle`, and that the failed open changed nothing on disk.
fn assert_rejected(path: &Path, needle: &str) {
    let before = fs::read(path).unwrap();
    let err = SnapshotStore::open_reader(path).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let message = err.to_string();
    let file_name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        message.contains(file_name),
        "error does not name the file: {message}"
    );
    assert!(
        message.contains(needle),
        "expected {needle:?} in: {message}"
    );
    assert_eq!(
        fs::read(path).unwrap(),
        before,
        "a failed open changed the file"
    );
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path().join("snapshots"), DEFAULT_KEEP).unwrap();
    assert!(store.newest().unwrap().is_none());
    assert!(store.list().unwrap().is_empty());

    let data = payload(3 << 20, 1);
    let meta = b"last log id 42, membership {1,2,3}".to_vec();
    let mut writer = store.create(&name(42), &meta, unlimited()).unwrap();
    assert!(writer.temp_path().starts_with(store.dir()));
    for piece in data.chunks(100_000) {
        writer.write_all(piece).unwrap();
        assert_eq!(writer.write(&[]).unwrap(), 0);
        writer.flush().unwrap();
    }
    assert_eq!(writer.payload_len(), data.len() as u64);
    let file = writer.finish().unwrap();
    assert_eq!(file.name, name(42));
    assert_eq!(file.path, store.dir().join(format!("{}.snap", name(42))));
    assert_eq!(file.bytes, data.len() as u64);
    assert_eq!(file.file_bytes, fs::metadata(&file.path).unwrap().len());
    assert_eq!(file.meta, meta);
    assert_eq!(dir_entries(store.dir()), vec![format!("{}.snap", name(42))]);

    assert_eq!(store.newest().unwrap(), Some(file.clone()));
    assert_eq!(store.list().unwrap(), vec![file.clone()]);
    let (read_meta, read_data) = read_all(&file.path);
    assert_eq!(read_meta, meta);
    assert!(read_data == data, "payload differs");

    // An empty payload and empty metadata round-trip too.
    let path = write_snapshot(&store, &name(43), b"", b"");
    let (read_meta, read_data) = read_all(&path);
    assert!(read_meta.is_empty() && read_data.is_empty());
    assert_eq!(store.newest().unwrap().unwrap().name, name(43));
}

#[test]
fn a_paced_snapshot_keeps_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), DEFAULT_KEEP).unwrap();
    let clock = Arc::new(FakeClock::default());
    let rate = 4_000_000;
    let limiter = Arc::new(RateLimiter::with_clock(rate, clock.clone()));
    let data = payload(1 << 20, 2);
    let mut writer = store.create(&name(1), b"m", limiter.clone()).unwrap();
    for piece in data.chunks(8192) {
        writer.write_all(piece).unwrap();
    }
    let file = writer.finish().unwrap();
    assert_eq!(read_all(&file.path).1, data);
    assert!(limiter.pauses() > 100);
    // The whole payload was charged: the fake clock moved by exactly its time at the rate
    // (up to a nanosecond of rounding per pause).
    let elapsed = clock.now();
    let ideal = Pacer::cost(data.len() as u64, rate);
    assert!(elapsed >= ideal && elapsed - ideal < std::time::Duration::from_micros(1));
}

#[test]
fn a_crash_before_the_rename_leaves_no_final_file_and_the_temp_is_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 1).unwrap();
    let old = write_snapshot(&store, &name(1), b"old", &payload(10_000, 3));

    // The process dies mid-write: the writer is never finished nor dropped.
    let mut writer = store.create(&name(2), b"new", unlimited()).unwrap();
    writer.write_all(&payload(1 << 20, 4)).unwrap();
    writer.flush().unwrap();
    let temp = writer.temp_path().to_path_buf();
    std::mem::forget(writer);

    assert!(temp.exists());
    assert!(!store.path_of(&name(2)).exists());
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|f| f.name).collect();
    assert_eq!(
        listed,
        vec![name(1)],
        "only the complete snapshot is listed"
    );
    assert_eq!(store.newest().unwrap().unwrap().path, old);

    // So is the temp file of an earlier build, named `.tmp-snap-<name>`.
    let earlier = temp.with_file_name(format!(".tmp-snap-{}.snap", name(3)));
    std::fs::write(&earlier, b"partial").unwrap();

    // The next open removes the temp files and keeps the complete snapshot.
    let reopened = SnapshotStore::open(dir.path(), 1).unwrap();
    assert!(!temp.exists());
    assert!(!earlier.exists());
    assert_eq!(
        dir_entries(reopened.dir()),
        vec![format!("{}.snap", name(1))]
    );
    assert_eq!(read_all(&old).0, b"old");
}

#[test]
fn dropping_an_unfinished_writer_removes_its_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), DEFAULT_KEEP).unwrap();
    let mut writer = store.create(&name(7), b"meta", unlimited()).unwrap();
    writer.write_all(&payload(100_000, 5)).unwrap();
    let temp = writer.temp_path().to_path_buf();
    assert!(temp.exists());
    drop(writer);
    assert!(!temp.exists());
    assert!(dir_entries(dir.path()).is_empty());
    assert!(store.newest().unwrap().is_none());
}

#[test]
fn a_flipped_byte_is_rejected_with_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 10).unwrap();
    let meta = b"some metadata".to_vec();
    let data = payload(500_000, 6);
    let header_len = 16 + meta.len() as u64 + 4;

    // (offset to flip, expected words in the error)
    let len = header_len + data.len() as u64 + 16;
    let cases = [
        (header_len + 250_000, "payload checksum mismatch"),
        (header_len, "payload checksum mismatch"),
        (len - 17, "payload checksum mismatch"),
        (len - 8, "payload checksum mismatch"), // the stored checksum itself
        (len - 1, "no trailer"),                // the trailer magic
        (len - 16, "length mismatch"),          // the stored length
        (20, "header checksum mismatch"),       // the metadata
        (0, "bad magic"),
        (8, "unknown format version"),
        (header_len - 1, "header checksum mismatch"), // the header checksum itself
    ];
    for (i, (offset, needle)) in cases.into_iter().enumerate() {
        let path = write_snapshot(&store, &name(i as u64), &meta, &data);
        let mut bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        bytes[offset as usize] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        assert_rejected(&path, needle);
    }
}

/// A streaming reader checks the payload as it reads it: a sound file reads whole, and a
/// flipped payload byte fails the read that reaches the end, naming the file.
#[test]
fn a_streaming_reader_checks_the_payload_as_it_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 10).unwrap();
    let data = payload(300_000, 8);
    let path = write_snapshot(&store, &name(1), b"m", &data);
    let mut whole = Vec::new();
    SnapshotReader::open_streaming(&path)
        .unwrap()
        .read_to_end(&mut whole)
        .unwrap();
    assert_eq!(whole, data);

    let mut bytes = fs::read(&path).unwrap();
    let header_len = 16 + 1 + 4;
    bytes[header_len + 150_000] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    // Its header and trailer are sound: it opens, and only the read finds the damage.
    let mut reader = SnapshotReader::open_streaming(&path).unwrap();
    let err = reader.read_to_end(&mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    let message = err.to_string();
    assert!(message.contains("payload checksum mismatch"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[test]
fn a_truncated_file_is_rejected_with_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 10).unwrap();
    let data = payload(200_000, 7);
    let full = 16 + 4 + 4 + data.len() as u64 + 16;
    for (i, keep) in [full - 1, full - 16, full / 2, 40, 23, 10, 0]
        .into_iter()
        .enumerate()
    {
        let path = write_snapshot(&store, &name(i as u64), b"meta", &data);
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(keep).unwrap();
        drop(file);
        assert_rejected(&path, "truncated");
    }
}

#[test]
fn a_foreign_file_under_a_snapshot_name_is_reported_by_list() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), DEFAULT_KEEP).unwrap();
    fs::write(store.path_of("0001"), b"this is not a snapshot at all").unwrap();
    let err = store.list().unwrap_err();
    assert!(err.to_string().contains("0001.snap"), "{err}");
    assert!(err.to_string().contains("bad magic"), "{err}");
}

#[test]
fn retention_keeps_exactly_k() {
    for keep in [1, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(dir.path(), keep).unwrap();
        assert_eq!(store.keep(), keep);
        for i in 1..=6u64 {
            write_snapshot(&store, &name(i), &i.to_le_bytes(), &payload(1000, i));
            let names: Vec<String> = store.list().unwrap().into_iter().map(|f| f.name).collect();
            let first = (i as usize).saturating_sub(keep) + 1;
            let expected: Vec<String> = (first as u64..=i).map(name).collect();
            assert_eq!(names, expected, "keep {keep} after snapshot {i}");
            assert_eq!(dir_entries(dir.path()).len(), expected.len());
        }
        // Every kept snapshot is intact.
        for file in store.list().unwrap() {
            assert_eq!(read_all(&file.path).0, file.meta);
        }
    }
}

#[test]
fn retention_never_deletes_the_snapshot_just_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 1).unwrap();
    write_snapshot(&store, &name(10), b"", b"newer");
    // An older name (for example a snapshot installed from a leader that lags this one's name).
    write_snapshot(&store, &name(5), b"", b"older");
    let names: Vec<String> = store.list().unwrap().into_iter().map(|f| f.name).collect();
    assert_eq!(names, vec![name(5), name(10)]);
}

#[test]
fn bad_arguments_are_rejected_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        SnapshotStore::open(dir.path().join("s"), 0),
        Err(Error::InvalidArgument { .. })
    ));
    let store = SnapshotStore::open(dir.path().join("s"), DEFAULT_KEEP).unwrap();
    let long = "x".repeat(201);
    for bad in [
        "",
        ".hidden",
        "../escape",
        "a/b",
        "a b",
        "snap\0",
        long.as_str(),
    ] {
        let err = store.create(bad, b"", unlimited()).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{bad:?}: {err:?}"
        );
    }
    let huge = vec![0u8; (16 << 20) + 1];
    assert!(matches!(
        store.create("ok", &huge, unlimited()),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(dir_entries(store.dir()).is_empty());
    assert!(dir_entries(dir.path()) == vec!["s".to_string()]);
}

#[test]
fn a_snapshot_of_the_same_name_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), DEFAULT_KEEP).unwrap();
    write_snapshot(&store, &name(3), b"first", b"one");
    let path = write_snapshot(&store, &name(3), b"second", b"two");
    assert_eq!(read_all(&path), (b"second".to_vec(), b"two".to_vec()));
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn a_sealed_store_takes_no_new_writer_and_its_seal_waits_for_the_one_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), DEFAULT_KEEP).unwrap();
    let mut writer = store.create(&name(1), b"meta", unlimited()).unwrap();
    writer.write_all(&payload(4096, 1)).unwrap();
    let (listed, listing) = std::sync::mpsc::channel();
    let sealer = {
        let store = store.clone();
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            store.seal();
            // What the directory holds once the seal returned: it must not change any more.
            listed.send(dir_entries(&dir)).unwrap();
        })
    };
    // A clone shares the seal: wait (bounded, no sleep) until it refuses new writers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match store.create(&name(2), b"meta", unlimited()) {
            Err(Error::Closed) => break,
            Ok(refused_too_late) => drop(refused_too_late),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(std::time::Instant::now() < deadline, "the seal never began");
        std::thread::yield_now();
    }
    // The writer created before the seal still finishes, and the seal returns only after it.
    writer.finish().unwrap();
    let after_seal = listing
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the seal returns once the writer in flight finished");
    sealer.join().unwrap();
    assert_eq!(after_seal, vec![format!("{}.snap", name(1))]);
    assert_eq!(dir_entries(dir.path()), after_seal);
}

#[test]
fn adopting_a_file_moves_it_in_whole_and_a_damaged_or_late_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path().join("store"), 1).unwrap();
    let old = write_snapshot(&store, &name(1), b"old", &payload(1000, 1));
    // A snapshot written elsewhere on the same file system, as a received one is.
    let elsewhere = SnapshotStore::open(dir.path().join("incoming"), 1).unwrap();
    let data = payload(50_000, 2);
    let received = write_snapshot(&elsewhere, "received", b"new", &data);

    let adopted = store.adopt(&received, &name(2)).unwrap();
    assert!(!received.exists(), "moved, not copied");
    assert_eq!(adopted.name, name(2));
    assert_eq!(adopted.path, store.path_of(&name(2)));
    assert_eq!(adopted.bytes, data.len() as u64);
    assert_eq!(adopted.meta, b"new");
    assert_eq!(read_all(&adopted.path), (b"new".to_vec(), data));
    assert!(!old.exists(), "retention applies as after a write");
    assert_eq!(store.list().unwrap(), vec![adopted.clone()]);

    // A damaged file is refused where it is; the store is unchanged.
    let damaged = write_snapshot(&elsewhere, "damaged", b"bad", &payload(1000, 3));
    let len = fs::metadata(&damaged).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    assert!(store.adopt(&damaged, &name(3)).is_err());
    assert!(damaged.exists());
    assert_eq!(store.list().unwrap(), vec![adopted.clone()]);

    // A sealed store takes nothing in.
    let late = write_snapshot(&elsewhere, "late", b"late", &payload(1000, 4));
    store.seal();
    assert!(matches!(store.adopt(&late, &name(4)), Err(Error::Closed)));
    assert!(late.exists());
    assert_eq!(store.list().unwrap(), vec![adopted]);
}

/// A newest snapshot whose ends do not read back (cut short, overwritten) is set aside under a
/// free name that keeps it for the operator, and the next one stands in for it; one written by
/// a newer build is not damage, and is neither set aside nor skipped.
#[test]
fn damaged_newest_snapshots_are_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), 10).unwrap();
    let data = payload(10_000, 8);
    let sound = write_snapshot(&store, &name(1), b"meta", &data);
    let cut = write_snapshot(&store, &name(2), b"meta", &data);
    let overwritten = write_snapshot(&store, &name(3), b"meta", &data);
    let len = fs::metadata(&cut).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len - 30)
        .unwrap();
    fs::write(&overwritten, b"not a snapshot").unwrap();
    // An earlier set-aside under the first free name.
    let taken = dir.path().join(format!("{}.snap.damaged", name(3)));
    fs::write(&taken, b"x").unwrap();

    let (newest, aside) = store.newest_setting_aside_damaged().unwrap();
    assert_eq!(newest.unwrap().path, sound);
    let expected = vec![
        dir.path().join(format!("{}.snap.damaged-2", name(3))),
        dir.path().join(format!("{}.snap.damaged", name(2))),
    ];
    assert_eq!(aside, expected);
    assert_eq!(fs::read(&expected[0]).unwrap(), b"not a snapshot");
    assert_eq!(fs::metadata(&expected[1]).unwrap().len(), len - 30);
    assert_eq!(fs::read(&taken).unwrap(), b"x");
    assert_eq!(store.list().unwrap().len(), 1);
    let (again, none) = store.newest_setting_aside_damaged().unwrap();
    assert_eq!(again.unwrap().path, sound);
    assert!(none.is_empty());

    // A newer build's format (version 2) is refused, and left where it is.
    let newer = write_snapshot(&store, &name(4), b"meta", &data);
    let mut bytes = fs::read(&newer).unwrap();
    bytes[8] = 2;
    fs::write(&newer, &bytes).unwrap();
    let err = store.newest_setting_aside_damaged().unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("newer build"), "{err}");
    assert!(newer.exists());
    // A version no build comes near (a bit flipped in its third byte) is damage: set aside.
    bytes[8] = 1;
    bytes[10] = 1;
    fs::write(&newer, &bytes).unwrap();
    let (newest, aside) = store.newest_setting_aside_damaged().unwrap();
    assert_eq!(newest.unwrap().path, sound);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(!newer.exists());
    fs::remove_file(&aside[0]).unwrap();
    let newer = write_snapshot(&store, &name(4), b"meta", &data);

    // Nothing sound left: none stands in.
    fs::remove_file(&newer).unwrap();
    fs::write(&sound, b"").unwrap();
    let (none, aside) = store.newest_setting_aside_damaged().unwrap();
    assert!(none.is_none());
    assert_eq!(aside.len(), 1);
}
