//! Tests of the log store that need its internals: replication reads around the purge point,
//! and purges that leave files behind or fail.

use openraft::type_config::TypeConfigExt;
use openraft::vote::leader_id_adv::LeaderId;
use openraft::EntryPayload;

use super::*;
use crate::Command;

fn log_id(index: u64) -> LogId {
    LogId::new(
        LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

fn entry(index: u64) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command::Put {
            key: format!("k{index}"),
            value: vec![index as u8],
            if_revision: None,
        }),
    }
}

/// Appends entries 1 to `last` to `log`, each flushed before the next.
async fn append_up_to(log: &mut LogStore, last: u64) {
    for i in 1..=last {
        let (tx, rx) = TypeConfig::oneshot();
        log.append(vec![entry(i)], IOFlushed::signal(tx))
            .await
            .unwrap();
        rx.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_replication_read_from_below_the_purge_point_starts_at_the_first_live_entry() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments: the first live entry ends up in an older segment than the tail.
    let opts = WalOptions {
        segment_bytes: 512,
        ..WalOptions::default()
    };
    let mut log = LogStore::open(dir.path(), opts).unwrap();
    append_up_to(&mut log, 60).await;
    log.purge(log_id(20)).await.unwrap();
    let lsn = log.shared.index.read().lsn_of(21).unwrap();
    assert!(
        !log.shared.wal.in_tail(lsn),
        "entry 21 is in the tail segment"
    );

    // Below the purge point no entry has an LSN, so an unclamped start would read inline.
    assert!(log.reads_inline(5));
    let (start, end) = log.replication_range(5, 61);
    assert_eq!((start, end), (21, 61));
    assert!(!log.reads_inline(start), "an older segment is read inline");
    let got: Vec<u64> = log
        .limited_get_log_entries(5, 61)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(got, (21..=60).collect::<Vec<_>>());
}

/// A purge whose marker is durable holds even when a segment it emptied cannot be deleted:
/// openraft would take an error for a failed disk and stop the node. A failed directory
/// fsync is such a failure, and stays one.
#[tokio::test(flavor = "current_thread")]
async fn a_purge_that_cannot_delete_an_emptied_segment_holds_and_the_log_goes_on() {
    let fs = meta_store::fs::FaultyFileSystem::new();
    let opts = WalOptions {
        segment_bytes: 512,
        ..WalOptions::default()
    };
    let dir = Path::new("/log");
    let mut log = LogStore::open_with(Arc::new(fs.clone()), dir, opts).unwrap();
    let append = async |log: &mut LogStore, i: u64| {
        let (tx, rx) = TypeConfig::oneshot();
        log.append(vec![entry(i)], IOFlushed::signal(tx))
            .await
            .unwrap();
        rx.await.unwrap().unwrap();
    };
    let segments = || -> Vec<String> {
        let mut names = meta_store::FileSystem::read_dir(&fs, dir).unwrap();
        names.retain(|n| n.ends_with(".wal"));
        names.sort();
        names
    };
    for i in 1..=60 {
        append(&mut log, i).await;
    }
    let before = segments();
    fs.fail_next_removes(1);
    log.purge(log_id(40)).await.unwrap();
    let after = segments();
    assert_eq!(after[0], before[0], "the first emptied segment is left");
    assert!(!after.contains(&before[1]), "the next one goes: {after:?}");
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(40)));
    append(&mut log, 61).await;

    fs.fail_next_dir_syncs(1);
    let failed = log.purge(log_id(55)).await;
    assert!(failed.is_err(), "a failed directory fsync stops the node");
    let (tx, _rx) = TypeConfig::oneshot();
    let refused = log.append(vec![entry(62)], IOFlushed::signal(tx)).await;
    assert!(refused.is_err(), "and the log refuses further writes");
}

/// A log whose oldest live segment is gone (its entries after the purge point missing) opens,
/// naming the entries it lacks, for the node to judge (`front_gap.rs`); one that lost a segment
/// in the middle is refused at open, with a message that names the file.
#[tokio::test(flavor = "current_thread")]
async fn a_gap_after_the_purge_point_is_named_and_one_within_the_log_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        segment_bytes: 512,
        ..WalOptions::default()
    };
    let mut log = LogStore::open(dir.path(), opts.clone()).unwrap();
    append_up_to(&mut log, 60).await;
    log.purge(log_id(20)).await.unwrap();
    drop(log);
    let mut segments: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    assert!(segments.len() > 2, "{segments:?}");
    let kept = dir.path().join("kept");
    std::fs::copy(&segments[0], &kept).unwrap();
    std::fs::remove_file(&segments[0]).unwrap();
    let log = LogStore::open(dir.path(), opts.clone()).unwrap();
    let (from, to) = log.lost_front().expect("the lost front is named");
    assert_eq!(from, 21, "the entries after the purge point are lost");
    assert!(to > from && to < 60, "lost {from} to {to}");
    drop(log);
    std::fs::rename(&kept, &segments[0]).unwrap();
    std::fs::remove_file(&segments[1]).unwrap();
    // The log itself finds records missing between two segments.
    let e = LogStore::open(dir.path(), opts).err().expect("refused");
    let message = e.to_string();
    assert!(message.contains("are missing"), "{message}");
    assert!(
        message.contains(&*dir.path().to_string_lossy()),
        "{message}"
    );
}

#[test]
fn a_record_that_passes_its_checksum_but_does_not_decode_is_named_a_newer_builds() {
    let dir = tempfile::tempdir().unwrap();
    let wal = meta_store::wal::Wal::open(dir.path(), WalOptions::default()).unwrap();
    // An enum variant index no build of `LogRecord` has, as a newer build's record would be.
    let lsn = wal.append(&[200, 0, 0, 0]).unwrap();
    wal.sync(lsn).unwrap();
    wal.close().unwrap();
    drop(wal);
    match LogStore::open(dir.path(), WalOptions::default()) {
        Err(Error::UndecodableLogRecord { lsn: at, .. }) => assert_eq!(at, lsn),
        Err(other) => panic!("expected an undecodable record, got {other}"),
        Ok(_) => panic!("expected an undecodable record, the log opened"),
    }
}

/// A storage error handed to openraft says its cause once, with no sources for openraft to
/// print again, and keeps the IO error's kind: a full disk stays `StorageFull`.
#[test]
fn a_storage_error_for_openraft_is_one_message_of_its_kind() {
    let full = io::Error::from_raw_os_error(libc::ENOSPC);
    let e = store_err("append log records")(meta_store::Error::io("write", "f", full));
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    assert!(std::error::Error::source(&e).is_none());
    let text = e.to_string();
    assert!(text.contains("append log records"), "{text}");
    assert_eq!(text.matches("No space left").count(), 1, "{text}");
    let closed = store_err("sync")(meta_store::Error::Closed);
    assert_eq!(closed.kind(), io::ErrorKind::Other);
}
