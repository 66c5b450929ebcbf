//! Concurrency: many writers, shared barriers, poisoning after a failed sync, and a shortage of
//! file descriptors.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use meta_store::fs::{CrashPoint, FaultyFileSystem};
use meta_store::{BarrierMode, Error, Wal, WalOptions};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds or the deadline passes.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::yield_now();
    }
}

#[test]
fn eight_writers_every_durable_record_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(Wal::open(dir.path(), WalOptions::default()).unwrap());
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let wal = wal.clone();
            thread::spawn(move || {
                let mut acked = Vec::new();
                for r in 0..12 {
                    let payload = format!("writer {w} record {r}").into_bytes();
                    let lsn = wal.append(&payload).unwrap();
                    wal.sync(lsn).unwrap();
                    assert!(wal.durable_lsn() >= lsn);
                    acked.push((lsn, payload));
                }
                acked
            })
        })
        .collect();
    let mut acked: Vec<(u64, Vec<u8>)> = writers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    acked.sort();
    // Barrier counts depend on timing: deliberately not asserted here.
    drop(wal);

    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let all = wal.read_range(..).unwrap();
    assert_eq!(all.len(), 96);
    assert_eq!(
        all, acked,
        "each acknowledged record exactly once, at its LSN"
    );
    let mut payloads: Vec<&Vec<u8>> = all.iter().map(|(_, p)| p).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), 96);
}

#[test]
fn one_further_barrier_covers_everyone_who_appended_while_the_first_was_held() {
    const WRITERS: u64 = 6;
    let fs = FaultyFileSystem::new();
    let wal =
        Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap());
    let before = wal.metrics();
    assert_eq!(before.barriers, 0);

    let first = wal.append(b"first").unwrap();
    fs.gate().close();
    let first_sync = {
        let wal = wal.clone();
        thread::spawn(move || wal.sync(first))
    };
    assert!(
        fs.gate().wait_held(1, TIMEOUT),
        "first barrier reached the gate"
    );

    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let wal = wal.clone();
            thread::spawn(move || {
                let lsn = wal.append(format!("writer {i}").as_bytes()).unwrap();
                wal.sync(lsn).map(|()| lsn)
            })
        })
        .collect();
    wait_for("all writers to append", || {
        wal.last_lsn() == first + WRITERS
    });
    assert_eq!(
        wal.durable_lsn(),
        0,
        "nothing durable while the barrier is held"
    );
    fs.gate().release();

    first_sync.join().unwrap().unwrap();
    for w in writers {
        let lsn = w.join().unwrap().unwrap();
        assert!(wal.durable_lsn() >= lsn);
    }
    let m = wal.metrics();
    assert_eq!(
        m.barriers, 2,
        "the held barrier plus exactly one more: {m:?}"
    );
    assert_eq!(m.records_synced, 1 + WRITERS);
    assert_eq!(wal.durable_lsn(), first + WRITERS);
}

#[test]
fn a_failed_sync_fails_every_waiter_and_every_later_call() {
    let fs = FaultyFileSystem::new();
    let wal =
        Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap());
    let ok = wal.append(b"ok").unwrap();
    wal.sync(ok).unwrap();

    let first = wal.append(b"doomed").unwrap();
    fs.gate().close();
    let first_sync = {
        let wal = wal.clone();
        thread::spawn(move || wal.sync(first))
    };
    assert!(fs.gate().wait_held(1, TIMEOUT));
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let wal = wal.clone();
            thread::spawn(move || {
                let lsn = wal.append(&[i]).unwrap();
                wal.sync(lsn)
            })
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    wait_for("waiters to append", || wal.last_lsn() == first + 4);
    wal.on_durable(first + 4, Box::new(move |r| tx.send(r).unwrap()));
    fs.fail_next_syncs(1);
    fs.gate().release();

    assert!(matches!(
        first_sync.join().unwrap(),
        Err(Error::Poisoned(_))
    ));
    for w in waiters {
        assert!(matches!(w.join().unwrap(), Err(Error::Poisoned(_))));
    }
    assert!(matches!(
        rx.recv_timeout(TIMEOUT).unwrap(),
        Err(Error::Poisoned(_))
    ));

    // Never retried: the file system would succeed now, yet every call fails without a sync.
    let syncs = fs.sync_count();
    assert!(matches!(wal.sync(first), Err(Error::Poisoned(_))));
    assert!(matches!(wal.sync(ok), Err(Error::Poisoned(_))));
    assert!(matches!(wal.append(b"more"), Err(Error::Poisoned(_))));
    assert!(matches!(wal.truncate_from(1), Err(Error::Poisoned(_))));
    assert!(matches!(wal.purge_to(1), Err(Error::Poisoned(_))));
    assert!(matches!(
        futures_lite_block_on(wal.sync_async(first)),
        Err(Error::Poisoned(_))
    ));
    assert!(matches!(wal.close(), Err(Error::Poisoned(_))));
    assert_eq!(fs.sync_count(), syncs);
    assert_eq!(wal.metrics().barriers, 1, "only the successful one");
}

/// A sync of segment S held in flight while a roll, which must sync S before it moves on, comes
/// along; then one of the two syncs fails. On Linux the other may then return Ok for the lost
/// bytes (the error is reported once), so no sync may report durability once the log is
/// poisoned, and the roll must not run its sync beside a barrier's. Checked through a crash:
/// whatever was reported durable must be there.
fn a_sync_beside_a_rolls_failed_fsync_reports_nothing_durable(mode: BarrierMode) {
    for _ in 0..5 {
        let fs = FaultyFileSystem::new();
        let opts = WalOptions {
            segment_bytes: 256,
            preallocate: false,
            ..WalOptions::default()
        };
        let wal = Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap());
        wal.set_barrier_mode(mode);
        let lsn = wal.append(&[1u8; 100]).unwrap();
        fs.gate().close();
        let (tx, rx) = std::sync::mpsc::channel();
        let held = {
            let wal = wal.clone();
            thread::spawn(move || match mode {
                // Shared: the barrier runs inline on this thread.
                BarrierMode::Shared => tx.send(wal.sync(lsn).is_ok()).unwrap(),
                // Own: the barrier thread runs it for its owner.
                BarrierMode::Own => {
                    wal.on_durable(lsn, Box::new(move |r| tx.send(r.is_ok()).unwrap()))
                }
            })
        };
        assert!(fs.gate().wait_held(1, TIMEOUT));
        // The next record does not fit: the append rolls to a new segment.
        let roll = {
            let wal = wal.clone();
            thread::spawn(move || wal.append(&[2u8; 100]))
        };
        // Without serialized syncs the roll's sync reaches the gate too; with them it never
        // does, and this returns false after the bound. Either way the checks below must hold.
        fs.gate().wait_held(2, Duration::from_millis(300));
        fs.fail_next_syncs(1);
        fs.gate().release();
        let rolled = roll.join().unwrap();
        held.join().unwrap();
        let reported_durable = rx.recv_timeout(TIMEOUT).unwrap();
        assert!(
            rolled.is_err(),
            "a sync failed, so the roll cannot have gone on"
        );
        assert!(matches!(wal.append(b"later"), Err(Error::Poisoned(_))));

        fs.crash(CrashPoint::default());
        drop(wal);
        let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
        if reported_durable {
            assert_eq!(
                wal.read(lsn).unwrap().as_deref(),
                Some(&[1u8; 100][..]),
                "record {lsn} was reported durable but is gone after a crash"
            );
        }
    }
}

#[test]
fn a_shared_sync_beside_a_rolls_failed_fsync_reports_nothing_durable() {
    a_sync_beside_a_rolls_failed_fsync_reports_nothing_durable(BarrierMode::Shared);
}

#[test]
fn an_own_barrier_beside_a_rolls_failed_fsync_reports_nothing_durable() {
    a_sync_beside_a_rolls_failed_fsync_reports_nothing_durable(BarrierMode::Own);
}

/// Runs a future to completion on a small runtime.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_failed_write_poisons_the_log() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let lsn = wal.append(b"a").unwrap();
    fs.set_fail_writes(true);
    assert!(matches!(wal.append(b"b"), Err(Error::Io { .. })));
    fs.set_fail_writes(false);
    assert!(matches!(wal.append(b"c"), Err(Error::Poisoned(_))));
    assert!(matches!(wal.sync(lsn), Err(Error::Poisoned(_))));
    assert_eq!(wal.last_lsn(), lsn);
}

#[test]
fn callbacks_may_call_back_into_the_log() {
    let fs = FaultyFileSystem::new();
    let wal =
        Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap());
    let lsn = wal.append(b"a").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let inner = wal.clone();
    wal.on_durable(
        lsn,
        Box::new(move |r| {
            r.unwrap();
            // Runs on the barrier thread: appending and asking again must not deadlock.
            let next = inner.append(b"b").unwrap();
            let tx2 = tx.clone();
            inner.on_durable(next, Box::new(move |r| tx2.send(r.is_ok()).unwrap()));
            tx.send(true).unwrap();
        }),
    );
    assert!(rx.recv_timeout(TIMEOUT).unwrap());
    assert!(rx.recv_timeout(TIMEOUT).unwrap());
    assert_eq!(wal.durable_lsn(), 2);
}

#[test]
fn a_purge_that_finds_no_descriptor_for_the_directory_fails_without_poisoning() {
    let fs = FaultyFileSystem::new();
    let opts = one_record_segments(Duration::from_millis(50));
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap();
    let first = wal.append(&[1; 100]).unwrap();
    let second = wal.append(&[2; 100]).unwrap();
    wal.sync(second).unwrap();
    // Opening the directory to sync the removal fails for longer than the wait: no fsync runs.
    fs.run_out_of_descriptors(0, usize::MAX);
    let purge = wal.purge_to(first).unwrap();
    assert!(
        matches!(&purge.leftover, Some(Error::Io { op, .. }) if *op == "fsync log directory"),
        "the purge holds, and says why its emptied segment may still be there: {purge:?}"
    );
    fs.run_out_of_descriptors(0, 0);
    // Not poisoned: the log goes on, and the next directory fsync covers the deletion.
    let third = wal.append(&[3; 100]).unwrap();
    wal.sync(third).unwrap();
    drop(wal);
    fs.crash(Default::default());
    let first_segment = std::path::Path::new("/log/00000000000000000001.wal");
    assert!(
        fs.contents(first_segment).is_none(),
        "the deletion is durable"
    );
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
    assert_eq!(wal.read(first).unwrap(), None, "purged");
    assert_eq!(wal.read(third).unwrap(), Some(vec![3; 100]));
}

#[test]
fn a_segment_waiting_behind_a_failed_purge_fsync_is_not_created() {
    let fs = FaultyFileSystem::new();
    let opts = one_record_segments(TIMEOUT);
    let wal = Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap());
    let first = wal.append(&[1; 100]).unwrap();
    let second = wal.append(&[2; 100]).unwrap();
    wal.sync(second).unwrap();
    // The purge (its marker starts a segment) deletes the first segment, then waits in its
    // directory fsync; an append that starts a segment waits behind it.
    fs.dir_gate().close();
    let purging = {
        let wal = wal.clone();
        thread::spawn(move || wal.purge_to(first))
    };
    let held = fs.dir_gate().wait_held(1, TIMEOUT);
    let synced = fs.gate().passed();
    let appending = {
        let wal = wal.clone();
        thread::spawn(move || wal.append(&[3; 100]))
    };
    // The append synced the old segment: next it waits for the directory lock. (Should it get
    // there only after the release, it finds the log poisoned all the same.)
    wait_for("the append's sync of the old segment", || {
        fs.gate().passed() > synced
    });
    let passed = fs.dir_gate().passed();
    // The purge's directory fsync fails; the segment's creation must not fsync the directory
    // after it (that would be a retried fsync).
    fs.fail_next_dir_syncs(1);
    fs.dir_gate().release();
    assert!(held, "the purge reached its directory fsync");
    let purged = purging.join().unwrap();
    assert!(
        matches!(&purged, Err(Error::Io { op, .. }) if *op == "fsync log directory"),
        "{purged:?}"
    );
    let appended = appending.join().unwrap();
    assert!(matches!(appended, Err(Error::Poisoned(_))), "{appended:?}");
    assert_eq!(
        fs.dir_gate().passed(),
        passed + 1,
        "one directory fsync ran"
    );
}

/// Options whose segments hold one 100-byte record each, so every append starts a segment.
fn one_record_segments(descriptor_wait: Duration) -> WalOptions {
    WalOptions {
        segment_bytes: 256,
        descriptor_wait,
        ..WalOptions::default()
    }
}

#[test]
fn a_shortage_of_descriptors_when_a_segment_starts_is_waited_out() {
    let fs = FaultyFileSystem::new();
    let opts = one_record_segments(TIMEOUT);
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap();
    let first = wal.append(&[1; 100]).unwrap();
    let segments = wal.metrics().segments_created;
    // The next append moves to a new segment; creating it fails three times.
    fs.run_out_of_descriptors(0, 3);
    let second = wal.append(&[2; 100]).unwrap();
    assert_eq!(wal.metrics().segments_created, segments + 1);
    // The one after that creates its segment, then opening the directory to sync fails twice.
    fs.run_out_of_descriptors(1, 2);
    let third = wal.append(&[3; 100]).unwrap();
    wal.sync(third).unwrap();
    // Purging opens the directory to sync the removal of old segments.
    fs.run_out_of_descriptors(0, 1);
    let purge = wal.purge_to(first).unwrap();
    assert!(purge.leftover.is_none(), "the open is retried: {purge:?}");
    let last = wal.append(&[4; 100]).unwrap();
    wal.sync(last).unwrap();
    drop(wal);

    fs.crash(Default::default());
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
    assert_eq!(wal.read(first).unwrap(), None, "purged");
    assert_eq!(wal.read(second).unwrap(), Some(vec![2; 100]));
    assert_eq!(wal.read(third).unwrap(), Some(vec![3; 100]));
    assert_eq!(wal.read(last).unwrap(), Some(vec![4; 100]));
}

#[test]
fn a_lasting_shortage_of_descriptors_poisons_the_log_after_the_wait() {
    let fs = FaultyFileSystem::new();
    let wait = Duration::from_millis(20);
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", one_record_segments(wait)).unwrap();
    let first = wal.append(&[1; 100]).unwrap();
    wal.sync(first).unwrap();
    fs.run_out_of_descriptors(0, usize::MAX);
    let started = Instant::now();
    match wal.append(&[2; 100]) {
        Err(Error::Io { op, source, .. }) => {
            assert_eq!(op, "create segment");
            assert!(meta_store::fs::is_descriptor_shortage(&source), "{source}");
        }
        other => panic!("expected the shortage, got {other:?}"),
    }
    assert!(started.elapsed() >= wait, "waited before giving up");
    fs.run_out_of_descriptors(0, 0);
    assert!(matches!(wal.append(&[3; 100]), Err(Error::Poisoned(_))));
    assert_eq!(wal.read(first).unwrap(), Some(vec![1; 100]));
}

/// A process restart after a failed fdatasync: the failed bytes may still be in the page cache
/// (Linux keeps them as clean pages), so recovery must read what the disk holds. Everything a
/// reopened log holds must then survive a power loss.
#[test]
fn a_restart_after_a_failed_sync_recovers_only_what_the_disk_holds() {
    let fs = FaultyFileSystem::new();
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let kept = wal.append(b"kept").unwrap();
    wal.sync(kept).unwrap();
    let lost = wal.append(b"lost").unwrap();
    fs.fail_next_syncs(1);
    assert!(matches!(wal.sync(lost), Err(Error::Poisoned(_))));
    drop(wal);

    // The process restarts; the machine does not.
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    let recovered = wal.last_lsn();
    assert_eq!(recovered, kept, "the failed record is not on the disk");
    drop(wal);
    fs.crash(CrashPoint::default());
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", WalOptions::default()).unwrap();
    assert_eq!(wal.last_lsn(), recovered);
    assert_eq!(wal.read(kept).unwrap().as_deref(), Some(&b"kept"[..]));
}

#[test]
fn appends_go_on_while_a_purge_syncs_the_directory() {
    let fs = FaultyFileSystem::new();
    // Segments of a few 100-byte records each.
    let opts = WalOptions {
        segment_bytes: 1024,
        ..WalOptions::default()
    };
    let wal = Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap());
    let first = wal.append(&[1; 100]).unwrap();
    let segments = wal.metrics().segments_created;
    let mut last = first;
    while wal.metrics().segments_created == segments {
        last = wal.append(&[2; 100]).unwrap();
    }
    wal.sync(last).unwrap();

    // The purge deletes the first segment, then waits in its directory fsync.
    fs.dir_gate().close();
    let purging = {
        let wal = wal.clone();
        thread::spawn(move || wal.purge_to(last - 1))
    };
    let held = fs.dir_gate().wait_held(1, TIMEOUT);
    // Meanwhile an append (in the current segment) and its barrier go through.
    let appending = {
        let wal = wal.clone();
        thread::spawn(move || {
            let lsn = wal.append(&[3; 100]).unwrap();
            wal.sync(lsn).unwrap();
            lsn
        })
    };
    let deadline = Instant::now() + TIMEOUT;
    while !appending.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    let went_on = appending.is_finished();
    fs.dir_gate().release();
    assert!(held, "the purge reached its directory fsync");
    assert!(went_on, "the append waited for the purge's directory fsync");
    let third = appending.join().unwrap();
    let purge = purging.join().unwrap().unwrap();
    assert!(purge.leftover.is_none(), "{purge:?}");
    drop(wal);

    fs.crash(Default::default());
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
    assert_eq!(wal.read(first).unwrap(), None, "purged");
    assert_eq!(wal.read(third).unwrap(), Some(vec![3; 100]));
}

/// A restart (without a power loss) after a segment's creation failed at its directory fsync
/// finds the segment listed and appends to it: recovery must make its name durable before any
/// append to it is acknowledged, or a later power loss takes the acknowledged records with it.
#[test]
fn a_segment_whose_directory_fsync_failed_is_made_durable_at_the_next_open() {
    let fs = FaultyFileSystem::new();
    let opts = one_record_segments(TIMEOUT);
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap();
    let a = wal.append(&[1; 100]).unwrap();
    wal.sync(a).unwrap();
    // The next append starts a segment; its directory fsync fails and poisons the log.
    fs.fail_next_dir_syncs(1);
    assert!(wal.append(&[2; 100]).is_err());
    drop(wal);

    // The process restarts; the machine does not.
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap();
    let b = wal.append(&[3; 100]).unwrap();
    wal.sync(b).unwrap();
    drop(wal);
    fs.crash(CrashPoint::default());
    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
    assert_eq!(wal.read(a).unwrap(), Some(vec![1; 100]));
    assert_eq!(
        wal.read(b).unwrap(),
        Some(vec![3; 100]),
        "an acknowledged record survives the power loss"
    );
}

/// Two purges at once: the first, once its marker is durable, deletes only the segments it
/// purged itself, not those of the second, whose marker is written but not yet durable (a crash
/// then loses that marker, and the records it would have purged must still be there).
#[test]
fn a_purge_deletes_only_what_its_own_durable_marker_purges() {
    let fs = FaultyFileSystem::new();
    let opts = one_record_segments(TIMEOUT);
    let wal = Arc::new(Wal::open_with(Arc::new(fs.clone()), "/log", opts.clone()).unwrap());
    let mut last = 0;
    for i in 0..10u8 {
        last = wal.append(&[i; 100]).unwrap();
    }
    wal.sync(last).unwrap();
    // The first purge's marker (the next LSN) is held in its barrier.
    fs.gate().close();
    let first_purge = {
        let wal = wal.clone();
        thread::spawn(move || wal.purge_to(3))
    };
    assert!(fs.gate().wait_held(1, TIMEOUT), "the first purge syncs");
    // A callback on that marker runs on the first purge's thread after its barrier and before
    // its deletions; it holds the thread there until the second purge has written its marker.
    let (reached_tx, reached_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    wal.on_durable(
        last + 1,
        Box::new(move |outcome| {
            outcome.unwrap();
            reached_tx.send(()).unwrap();
            let _ = go_rx.recv_timeout(TIMEOUT);
        }),
    );
    fs.gate().release();
    reached_rx.recv_timeout(TIMEOUT).unwrap();
    fs.gate().close();
    let second_purge = {
        let wal = wal.clone();
        thread::spawn(move || wal.purge_to(8))
    };
    assert!(fs.gate().wait_held(1, TIMEOUT), "the second purge syncs");
    go_tx.send(()).unwrap();
    let purge = first_purge.join().unwrap().unwrap();
    assert!(purge.leftover.is_none(), "{purge:?}");
    // Power fails while the second purge's marker is not durable.
    fs.crash(CrashPoint::default());
    assert!(second_purge.join().unwrap().is_err());
    drop(wal);

    let wal = Wal::open_with(Arc::new(fs.clone()), "/log", opts).unwrap();
    assert_eq!(wal.read(3).unwrap(), None, "the first purge is durable");
    for lsn in 4..=last {
        assert!(
            wal.read(lsn).unwrap().is_some(),
            "record {lsn} was purged only by the lost marker"
        );
    }
}
