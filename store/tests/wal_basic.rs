//! The log's single-threaded contract: appends, reads, markers, segments, reopen, bad input.

use std::sync::Arc;

use meta_store::fs::FaultyFileSystem;
use meta_store::FileSystem;
use meta_store::{BarrierMode, Error, Wal, WalOptions};

fn small_segments() -> WalOptions {
    WalOptions {
        segment_bytes: 512,
        ..WalOptions::default()
    }
}

fn segment_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

#[test]
fn append_read_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(
        (wal.last_lsn(), wal.durable_lsn(), wal.first_lsn()),
        (0, 0, None)
    );
    assert_eq!(wal.append(b"one").unwrap(), 1);
    assert_eq!(wal.append(b"").unwrap(), 2);
    assert_eq!(wal.append_batch(&[b"three", b"four"]).unwrap(), 4);
    // Readable at once, durable only after sync.
    assert_eq!(wal.read(1).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(wal.read(2).unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(wal.read(5).unwrap(), None);
    assert_eq!(wal.read(0).unwrap(), None);
    assert_eq!(wal.durable_lsn(), 0);
    wal.sync(3).unwrap();
    assert!(wal.durable_lsn() >= 3);
    wal.close().unwrap();
    assert_eq!(wal.durable_lsn(), 4);

    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(
        (wal.last_lsn(), wal.durable_lsn(), wal.first_lsn()),
        (4, 4, Some(1))
    );
    let all = wal.read_range(..).unwrap();
    let want: Vec<(u64, Vec<u8>)> = vec![
        (1, b"one".to_vec()),
        (2, vec![]),
        (3, b"three".to_vec()),
        (4, b"four".to_vec()),
    ];
    assert_eq!(all, want);
    assert_eq!(wal.read_range(2..=3).unwrap(), want[1..3].to_vec());
    assert_eq!(wal.read_range(3..3).unwrap(), vec![]);
    assert_eq!(wal.append(b"five").unwrap(), 5);
}

#[test]
fn truncate_hides_records_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    for i in 1..=5u8 {
        wal.append(&[i]).unwrap();
    }
    let marker = wal.truncate_from(3).unwrap();
    assert_eq!(marker, 6);
    assert!(
        wal.durable_lsn() >= marker,
        "the marker is durable on return"
    );
    assert_eq!(wal.read(3).unwrap(), None);
    assert_eq!(wal.read(6).unwrap(), None, "markers are not records");
    assert_eq!(wal.append(b"x").unwrap(), 7);
    let lsns =
        |w: &Wal| -> Vec<u64> { w.read_range(..).unwrap().into_iter().map(|r| r.0).collect() };
    assert_eq!(lsns(&wal), vec![1, 2, 7]);
    drop(wal);
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(lsns(&wal), vec![1, 2, 7]);
    assert_eq!(wal.read(4).unwrap(), None);
    assert_eq!(wal.last_lsn(), 7);
}

#[test]
fn purge_drops_prefix_and_deletes_whole_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), small_segments()).unwrap();
    let payload = [7u8; 100];
    for _ in 0..20 {
        wal.append(&payload).unwrap();
    }
    let before = segment_files(dir.path());
    assert!(before.len() >= 5, "small segments roll: {before:?}");
    assert_eq!(wal.metrics().segments_created as usize, before.len() - 1);
    let purge = wal.purge_to(15).unwrap();
    assert_eq!(purge.marker, 21);
    assert!(purge.leftover.is_none(), "{purge:?}");
    assert_eq!(wal.first_lsn(), Some(16));
    assert_eq!(wal.purged_to(), 15);
    assert_eq!(wal.read(15).unwrap(), None);
    assert_eq!(wal.read(16).unwrap().as_deref(), Some(&payload[..]));
    let after = segment_files(dir.path());
    assert!(after.len() < before.len(), "{after:?}");
    // The first remaining segment holds LSN 16 or starts right after it.
    let first_remaining: u64 = after[0].trim_end_matches(".wal").parse().unwrap();
    assert!(first_remaining <= 16);
    drop(wal);

    let wal = Wal::open(dir.path(), small_segments()).unwrap();
    assert_eq!(wal.first_lsn(), Some(16));
    let lsns: Vec<u64> = wal
        .read_range(..)
        .unwrap()
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(lsns, (16..=20).collect::<Vec<_>>());
    assert_eq!(wal.append(b"next").unwrap(), 22);
}

#[test]
fn a_failed_directory_fsync_after_a_purge_poisons_the_log() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", small_segments()).unwrap();
    let payload = [7u8; 100];
    for _ in 0..18 {
        wal.append(&payload).unwrap();
    }
    // The purge marker (an 8-byte payload) fits in the current segment.
    assert!(!wal.needs_roll([8]));
    let first_segment = std::path::Path::new("/log").join(format!("{:020}.wal", 1));
    assert!(fs.contents(&first_segment).is_some());
    fs.fail_next_dir_syncs(1);
    match wal.purge_to(15) {
        Err(Error::Io { op, .. }) => assert_eq!(op, "fsync log directory"),
        other => panic!("expected the failed directory fsync, got {other:?}"),
    }
    // The failure came after the marker and the deletions.
    assert_eq!(wal.purged_to(), 15);
    assert_eq!(fs.contents(&first_segment), None);
    // Never retried: the directory would sync now, yet every write fails.
    assert!(matches!(wal.append(b"next"), Err(Error::Poisoned(_))));
    assert!(matches!(wal.sync(wal.last_lsn()), Err(Error::Poisoned(_))));
    assert!(matches!(wal.purge_to(16), Err(Error::Poisoned(_))));
    assert!(matches!(wal.truncate_from(17), Err(Error::Poisoned(_))));
    assert_eq!(wal.read(16).unwrap().as_deref(), Some(&payload[..]));
}

#[test]
fn a_purge_that_cannot_delete_a_segment_holds_says_so_and_the_log_goes_on() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", small_segments()).unwrap();
    let payload = [7u8; 100];
    for _ in 0..20 {
        wal.append(&payload).unwrap();
    }
    let log = std::path::Path::new("/log");
    let segments = || -> Vec<String> {
        let mut names = fs.read_dir(log).unwrap();
        names.retain(|n| n.ends_with(".wal"));
        names.sort();
        names
    };
    let before = segments();
    assert!(before.len() >= 5, "small segments roll: {before:?}");
    fs.fail_next_removes(1);
    let purge = wal.purge_to(15).unwrap();
    assert!(
        matches!(&purge.leftover, Some(Error::Io { op, .. }) if *op == "remove purged segment"),
        "{purge:?}"
    );
    assert_eq!(wal.purged_to(), 15);
    assert_eq!(wal.read(15).unwrap(), None, "the purge holds");
    let after = segments();
    assert_eq!(after[0], before[0], "the first segment is left");
    assert!(
        !after.contains(&before[1]) && !after.contains(&before[2]),
        "the other emptied segments go: {before:?} -> {after:?}"
    );
    // Not poisoned.
    let next = wal.append(b"next").unwrap();
    wal.sync(next).unwrap();
    drop(wal);

    // The next open removes what was left, and reads from the purge point on.
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", small_segments()).unwrap();
    assert!(!segments().contains(&before[0]), "{:?}", segments());
    assert_eq!(wal.first_lsn(), Some(16));
    assert_eq!(wal.read(next).unwrap().as_deref(), Some(&b"next"[..]));
}

#[test]
fn records_larger_than_a_segment_get_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), small_segments()).unwrap();
    let big = vec![3u8; 2000];
    wal.append(b"a").unwrap();
    wal.append(&big).unwrap();
    wal.append(b"b").unwrap();
    wal.close().unwrap();
    let wal = Wal::open(dir.path(), small_segments()).unwrap();
    assert_eq!(wal.read(2).unwrap(), Some(big));
    assert_eq!(wal.read(3).unwrap().as_deref(), Some(&b"b"[..]));
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    wal.append(b"a").unwrap();
    let invalid = |r: Result<u64, Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(wal.append_batch(&[])));
    assert!(invalid(wal.truncate_from(0)));
    assert!(invalid(wal.truncate_from(3)));
    assert!(invalid(wal.purge_to(0).map(|p| p.marker)));
    assert!(invalid(wal.purge_to(2).map(|p| p.marker)));
    assert!(matches!(wal.sync(2), Err(Error::InvalidArgument { .. })));
    assert_eq!(wal.last_lsn(), 1);
    assert_eq!(wal.read_range(..).unwrap().len(), 1);
    let too_small = WalOptions {
        segment_bytes: 10,
        ..WalOptions::default()
    };
    assert!(matches!(
        Wal::open_with(Arc::new(FaultyFileSystem::new()), "/other", too_small),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn closed_log_refuses_calls() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let lsn = wal.append(b"a").unwrap();
    wal.close().unwrap();
    assert_eq!(wal.durable_lsn(), lsn);
    assert!(matches!(wal.append(b"b"), Err(Error::Closed)));
    assert!(matches!(wal.sync(lsn), Err(Error::Closed)));
    assert!(matches!(wal.read(lsn), Err(Error::Closed)));
    let (tx, rx) = std::sync::mpsc::channel();
    wal.on_durable(lsn, Box::new(move |r| tx.send(r).unwrap()));
    assert!(matches!(
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(),
        Err(Error::Closed)
    ));
    wal.close().unwrap();
}

#[test]
fn on_durable_fires_from_the_barrier_thread() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let lsn = wal.append_batch(&[b"a", b"b"]).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    wal.on_durable(lsn, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
    assert!(rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap());
    assert_eq!(wal.durable_lsn(), lsn);
    // Already durable: answered inline.
    wal.on_durable(1, Box::new(move |r| tx2.send(r.is_ok()).unwrap()));
    assert!(rx.try_recv().unwrap());
}

#[tokio::test]
async fn sync_async_resolves_without_blocking_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let mut last = 0;
    for i in 0..10u8 {
        last = wal.append(&[i]).unwrap();
    }
    let fut = wal.sync_async(last);
    tokio::time::timeout(std::time::Duration::from_secs(10), fut)
        .await
        .expect("resolved in time")
        .unwrap();
    assert!(wal.durable_lsn() >= last);
}

#[test]
fn own_mode_takes_a_barrier_per_sync() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    wal.set_barrier_mode(BarrierMode::Own);
    assert_eq!(wal.barrier_mode(), BarrierMode::Own);
    let lsn = wal.append(b"a").unwrap();
    wal.sync(lsn).unwrap();
    wal.sync(lsn).unwrap();
    assert_eq!(wal.metrics().barriers, 2);
    wal.set_barrier_mode(BarrierMode::Shared);
    wal.sync(lsn).unwrap();
    assert_eq!(wal.metrics().barriers, 2, "shared mode: already durable");
    let m = wal.metrics();
    assert_eq!(m.appends, 1);
    assert_eq!(m.records_synced, 1);
    assert_eq!(m.barrier_latency.count, 2);
}

/// Markers are records like any other in the counters: the records made durable never
/// outnumber those appended (they ran ahead by one per purge).
#[test]
fn markers_count_as_appended_records() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let mut last = 0;
    for _ in 0..5 {
        last = wal.append(b"a").unwrap();
    }
    wal.sync(last).unwrap();
    let _ = wal.purge_to(2).unwrap();
    let marker = wal.truncate_from(last).unwrap();
    wal.sync(marker).unwrap();
    let m = wal.metrics();
    assert_eq!(m.appends, 7, "five records and two markers");
    assert_eq!(m.records_synced, m.appends);
}

#[test]
fn needs_roll_predicts_every_move_to_a_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), small_segments()).unwrap();
    let mut rolls = 0;
    for i in 0..200usize {
        // Lengths that land exactly on, just under and just over segment boundaries.
        let lens = [1 + (i * 37) % 150, (i * 11) % 90];
        let batch: Vec<Vec<u8>> = lens.iter().map(|&n| vec![i as u8; n]).collect();
        let slices: Vec<&[u8]> = batch.iter().map(|b| b.as_slice()).collect();
        let predicted = wal.needs_roll(lens);
        let before = wal.metrics().segments_created;
        wal.append_batch(&slices).unwrap();
        let rolled = wal.metrics().segments_created > before;
        assert_eq!(predicted, rolled, "append {i} of {lens:?}");
        rolls += usize::from(rolled);
    }
    assert!(
        rolls > 20,
        "the test must cross many segments, crossed {rolls}"
    );
}

#[test]
fn an_emulated_sync_latency_slows_every_barrier() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        extra_sync_latency: std::time::Duration::from_millis(30),
        ..WalOptions::default()
    };
    let wal = Wal::open(dir.path(), opts).unwrap();
    let lsn = wal.append(b"record").unwrap();
    let started = std::time::Instant::now();
    wal.sync(lsn).unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(30));
    assert_eq!(wal.durable_lsn(), lsn);
}
