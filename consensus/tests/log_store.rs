//! The log store over the write-ahead log keeps the vote, the committed id, truncations and
//! purges across a reopen, and the state machine re-applies idempotently.

use std::path::Path;
use std::sync::Arc;

use meta_consensus::{Command, Entry, LogId, LogStore, StateMachine, TypeConfig, Vote};
use meta_store::{BarrierMode, RateLimiter, WalOptions};
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::vote::leader_id_adv::LeaderId;
use openraft::EntryPayload;

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(LeaderId { term, node_id: 1 }, index)
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Command::Put {
            key: format!("k{index}"),
            value: vec![index as u8],
            if_revision: None,
        }),
    }
}

fn vote(term: u64) -> Vote {
    Vote::new_committed(term, 1)
}

fn open(dir: &Path) -> LogStore {
    LogStore::open(dir, WalOptions::default()).unwrap()
}

async fn append(log: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    log.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

async fn indexes(log: &mut LogStore) -> Vec<u64> {
    log.try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn appends_and_votes_across_segment_rolls_survive_reopen() {
    // Segments of 512 bytes: most appends move the log to a new segment (the path that runs
    // on a blocking thread).
    let small = || WalOptions {
        segment_bytes: 512,
        ..WalOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = LogStore::open(dir.path(), small()).unwrap();
        for i in 1..=120 {
            append(&mut log, vec![entry(1, i)]).await;
            if i % 7 == 0 {
                log.save_vote(&vote(1 + i / 7)).await.unwrap();
            }
        }
        let created = log.wal_metrics().segments_created;
        assert!(created > 5, "only {created} segments");
    }
    let mut log = LogStore::open(dir.path(), small()).unwrap();
    assert_eq!(indexes(&mut log).await, (1..=120).collect::<Vec<_>>());
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(1 + 119 / 7)));
}

#[tokio::test(flavor = "current_thread")]
async fn own_barriers_give_every_entry_a_barrier_and_shared_ones_one_per_append() {
    for (mode, barriers) in [(BarrierMode::Own, 5), (BarrierMode::Shared, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            barrier: mode,
            ..WalOptions::default()
        };
        let mut log = LogStore::open(dir.path(), opts).unwrap();
        let before = log.wal_metrics().barriers;
        append(&mut log, (1..=5).map(|i| entry(1, i)).collect()).await;
        assert_eq!(log.wal_metrics().barriers - before, barriers, "{mode:?}");
        assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4, 5]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_that_would_drop_the_vote_keeps_it_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
        // The vote record lies after the entries about to be truncated.
        log.save_vote(&vote(2)).await.unwrap();
        log.save_committed(Some(log_id(1, 3))).await.unwrap();
        log.truncate_after(Some(log_id(1, 5))).await.unwrap();
        append(&mut log, vec![entry(2, 6)]).await;
        assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4, 5, 6]);
    }
    let mut log = open(dir.path());
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(
        log.try_get_log_entries(6..7).await.unwrap()[0].log_id,
        log_id(2, 6)
    );
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(2)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_truncation_and_purge_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        log.save_vote(&vote(1)).await.unwrap();
        append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
        log.save_committed(Some(log_id(1, 8))).await.unwrap();
        log.truncate_after(Some(log_id(1, 9))).await.unwrap();
        log.purge(log_id(1, 4)).await.unwrap();
        assert_eq!(indexes(&mut log).await, vec![5, 6, 7, 8, 9]);
    }
    let mut log = open(dir.path());
    assert_eq!(indexes(&mut log).await, vec![5, 6, 7, 8, 9]);
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id, Some(log_id(1, 4)));
    assert_eq!(st.last_log_id, Some(log_id(1, 9)));
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(1)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 8)));
    // Purging everything leaves an empty log that still reports the purge point.
    log.purge(log_id(1, 9)).await.unwrap();
    drop(log);
    let mut log = open(dir.path());
    assert!(indexes(&mut log).await.is_empty());
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id, Some(log_id(1, 9)));
    assert_eq!(st.last_log_id, Some(log_id(1, 9)));
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(1)));
    append(&mut log, vec![entry(1, 10)]).await;
    assert_eq!(indexes(&mut log).await, vec![10]);
    // A hole is refused.
    let (tx, _rx) = TypeConfig::oneshot();
    assert!(log
        .append(vec![entry(1, 12)], IOFlushed::signal(tx))
        .await
        .is_err());
}

async fn apply(sm: &mut StateMachine, entries: Vec<Entry>) -> std::io::Result<()> {
    let items: Vec<std::io::Result<_>> = entries.into_iter().map(|e| Ok((e, None))).collect();
    sm.apply(futures::stream::iter(items)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapplying_after_reopen_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let open_sm = || {
        StateMachine::open(
            None,
            &dir.path().join("registry"),
            &dir.path().join("snapshots"),
            1 << 20,
            2,
            Arc::new(RateLimiter::unlimited()),
        )
        .unwrap()
    };
    let entries: Vec<Entry> = (1..=5).map(|i| entry(1, i)).collect();
    {
        let mut sm = open_sm();
        apply(&mut sm, entries.clone()).await.unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 5)));
    }
    let mut sm = open_sm();
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 5)));
    // The same entries again (as after a crash before the applied id was durable): skipped.
    apply(&mut sm, entries).await.unwrap();
    apply(&mut sm, vec![entry(1, 6)]).await.unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 6)));
}

/// A purge to an index below entries already written, then a later purge of exactly those
/// entries: the first purge's record is then the oldest record left, before entries past its
/// purge point, and the reopened log still starts after the newest purge point (it refused to
/// open: an entry "did not follow the log").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_below_written_entries_then_past_them_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        log.save_vote(&vote(1)).await.unwrap();
        append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
        log.purge(log_id(1, 6)).await.unwrap();
        append(&mut log, (11..=12).map(|i| entry(1, i)).collect()).await;
        log.purge(log_id(1, 10)).await.unwrap();
        append(&mut log, vec![entry(1, 13)]).await;
    }
    let mut log = open(dir.path());
    assert_eq!(indexes(&mut log).await, vec![11, 12, 13]);
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id, Some(log_id(1, 10)));
}

/// The emulated sync latency (benchmarks only) slows the log store's barriers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulated_sync_latency_slows_the_log_stores_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let latency = std::time::Duration::from_millis(30);
    let opts = WalOptions {
        extra_sync_latency: latency,
        ..WalOptions::default()
    };
    let mut log = LogStore::open(dir.path(), opts).unwrap();
    let started = std::time::Instant::now();
    append(&mut log, vec![entry(1, 1)]).await;
    assert!(started.elapsed() >= latency, "{:?}", started.elapsed());
}
