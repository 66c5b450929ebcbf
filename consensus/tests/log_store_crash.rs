//! The log store's contract under power loss: random appends, votes, truncations and purges
//! over a file system that loses every unsynced byte (and may persist part of the last write)
//! at a crash. After the crash every entry whose flush was reported, every saved vote, every
//! purge and every truncation is there, and nothing else is but entries of an append in flight,
//! in order. Seeded: a failure names its seed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use meta_consensus::{Command, Entry, LogId, LogStore, TypeConfig, Vote};
use meta_store::fs::{CrashPoint, FaultyFileSystem};
use meta_store::WalOptions;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
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
            value: vec![0; (index % 300) as usize],
            if_revision: None,
        }),
    }
}

/// What the log must hold after a crash.
#[derive(Default)]
struct Model {
    /// Entries whose flush was reported, by index: their term.
    durable: BTreeMap<u64, u64>,
    /// Entries of the append in flight at the crash (they may or may not be there).
    in_flight: BTreeMap<u64, u64>,
    vote: Option<Vote>,
    purged: Option<LogId>,
}

fn open(fs: &FaultyFileSystem, segment_bytes: u64) -> LogStore {
    let opts = WalOptions {
        segment_bytes,
        ..WalOptions::default()
    };
    LogStore::open_with(Arc::new(fs.clone()), Path::new("/wal"), opts).unwrap()
}

/// Appends `entries` and waits until their flush is reported.
async fn append_flushed(log: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    log.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

/// Runs one seeded history of `ops` operations, crashes, reopens and checks the model.
async fn history(seed: u64, ops: usize) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let fs = FaultyFileSystem::new();
    // Small segments in some histories: appends then move to new segments often.
    let segment_bytes = if rng.bool() { 4096 } else { 1 << 20 };
    let mut log = open(&fs, segment_bytes);
    let mut m = Model::default();
    let mut term = 1;
    let mut last = 0u64;
    let vote = Vote::new_committed(term, 1);
    log.save_vote(&vote).await.unwrap();
    m.vote = Some(vote);
    for _ in 0..ops {
        match rng.u8(0..10) {
            0 => {
                term += 1;
                let vote = Vote::new_committed(term, 1);
                log.save_vote(&vote).await.unwrap();
                m.vote = Some(vote);
            }
            1 if last > m.purged.map_or(0, |p| p.index) + 1 => {
                // A truncation, then an append that makes it durable.
                let floor = m.purged.map_or(0, |p| p.index);
                let keep = rng.u64(floor..last);
                let kept = match m.durable.get(&keep) {
                    Some(&t) => Some(log_id(t, keep)),
                    // Everything after the purge point (or the whole log).
                    None => m.purged,
                };
                log.truncate_after(kept).await.unwrap();
                m.durable.retain(|i, _| *i <= keep);
                last = keep;
                term += 1;
                let vote = Vote::new_committed(term, 1);
                log.save_vote(&vote).await.unwrap();
                m.vote = Some(vote);
                append_flushed(&mut log, vec![entry(term, last + 1)]).await;
                last += 1;
                m.durable.insert(last, term);
            }
            2 if last > m.purged.map_or(0, |p| p.index) + 2 => {
                let floor = m.purged.map_or(0, |p| p.index);
                let upto = rng.u64(floor + 1..last);
                let id = log_id(m.durable[&upto], upto);
                log.purge(id).await.unwrap();
                m.purged = Some(id);
                m.durable.retain(|i, _| *i > upto);
            }
            3 => {
                if let Some((&i, &t)) = m.durable.iter().next_back() {
                    log.save_committed(Some(log_id(t, i))).await.unwrap();
                }
            }
            _ => {
                let n = rng.u64(1..6);
                let entries = (last + 1..=last + n).map(|i| entry(term, i)).collect();
                append_flushed(&mut log, entries).await;
                for i in last + 1..=last + n {
                    m.durable.insert(i, term);
                }
                last += n;
            }
        }
    }
    // Sometimes a truncation with nothing flushed after it (a new leader's entries conflict):
    // once it returned, the entries it dropped must not come back.
    let floor = m.purged.map_or(0, |p| p.index);
    if last > floor + 1 && rng.u8(0..3) == 0 {
        let keep = rng.u64(floor..last);
        let kept = match m.durable.get(&keep) {
            Some(&t) => Some(log_id(t, keep)),
            None => m.purged,
        };
        log.truncate_after(kept).await.unwrap();
        m.durable.retain(|i, _| *i <= keep);
        last = keep;
        // The new leader's entries, of a newer term (no vote saved: a vote waits for a barrier,
        // which would make the truncation durable whatever `truncate_after` did).
        term += 1;
    }
    // An append in flight: written, its flush not waited for.
    let n = rng.u64(0..4);
    let (tx, mut rx) = TypeConfig::oneshot();
    if n > 0 {
        let entries: Vec<Entry> = (last + 1..=last + n).map(|i| entry(term, i)).collect();
        log.append(entries, IOFlushed::signal(tx)).await.unwrap();
        for i in last + 1..=last + n {
            m.in_flight.insert(i, term);
        }
    }
    let unsynced = fs.unsynced_ops();
    let point = CrashPoint {
        persist_ops: rng.usize(0..=unsynced),
        torn_bytes: rng.usize(0..64),
    };
    fs.crash(point);
    // Reported flushed before the crash: then it must be there.
    if n > 0 && matches!(rx.try_recv(), Ok(Ok(()))) {
        m.durable.append(&mut m.in_flight);
    }
    drop(log);

    let mut log = open(&fs, segment_bytes);
    let at = format!("seed {seed} ({ops} ops, crash {point:?} of {unsynced} unsynced)");
    assert_eq!(log.read_vote().await.unwrap(), m.vote, "{at}: the vote");
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, m.purged, "{at}: the purge point");
    let held: BTreeMap<u64, u64> = log
        .try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.log_id.index, e.log_id.leader_id.term))
        .collect();
    for (i, t) in &m.durable {
        assert_eq!(held.get(i), Some(t), "{at}: flushed entry {i} of term {t}");
    }
    let durable_end = m.durable.keys().next_back().copied().unwrap_or(0);
    let tail: BTreeMap<u64, u64> = held
        .range(durable_end + 1..)
        .map(|(i, t)| (*i, *t))
        .collect();
    let in_flight = tail.iter().all(|(i, t)| m.in_flight.get(i) == Some(t));
    assert!(
        in_flight,
        "{at}: entries {tail:?} after the flushed ones are not the append in flight ({:?}) \
         (a truncated one came back?)",
        m.in_flight
    );
    let first = m.purged.map_or(1, |p| p.index + 1);
    let indexes: Vec<u64> = held.keys().copied().collect();
    let expected: Vec<u64> = (first..first + indexes.len() as u64).collect();
    assert_eq!(
        indexes, expected,
        "{at}: the log is not contiguous from {first}"
    );
}

/// Histories per run; `LOG_STORE_CRASH_SEEDS=N` runs N, for a longer search.
const SEEDS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_entries_votes_and_purges_survive_a_power_loss() {
    let seeds = std::env::var("LOG_STORE_CRASH_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SEEDS);
    for seed in 0..seeds {
        history(seed, 5 + (seed as usize % 40)).await;
    }
}

/// A new leader's truncation of a conflicting tail is durable when `truncate_after` returns,
/// though nothing is flushed after it: openraft installs a snapshot right after it, and a
/// registry durable at the snapshot's log id beside a log whose truncated entries came back
/// would be a store openraft refuses to start from.
#[tokio::test]
async fn a_truncation_survives_a_power_loss_with_nothing_flushed_after_it() {
    let fs = FaultyFileSystem::new();
    let mut log = open(&fs, 1 << 20);
    append_flushed(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
    // The new leader's vote comes after the entries: the truncation is a logical one.
    let vote = Vote::new(2, 2);
    log.save_vote(&vote).await.unwrap();
    log.truncate_after(Some(log_id(1, 3))).await.unwrap();
    fs.crash(CrashPoint::default());
    drop(log);

    let mut log = open(&fs, 1 << 20);
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(
        state.last_log_id,
        Some(log_id(1, 3)),
        "the truncated entries came back"
    );
}

/// A purge whose marker is durable but whose old segments cannot be removed yet (no file
/// descriptor to sync the directory with) succeeds: openraft would stop the node for a failed
/// purge. The segments go later, and the purge holds after a crash.
#[tokio::test]
async fn a_purge_that_cannot_remove_its_segments_yet_succeeds() {
    let fs = FaultyFileSystem::new();
    let opts = WalOptions {
        segment_bytes: 4096,
        descriptor_wait: std::time::Duration::from_millis(50),
        ..WalOptions::default()
    };
    let open = |fs: &FaultyFileSystem| {
        LogStore::open_with(Arc::new(fs.clone()), Path::new("/wal"), opts.clone()).unwrap()
    };
    let mut log = open(&fs);
    // Some 20 KB of entries: several segments.
    for i in 1..=200 {
        append_flushed(&mut log, vec![entry(1, i)]).await;
    }
    fs.run_out_of_descriptors(0, usize::MAX);
    log.purge(log_id(1, 190))
        .await
        .expect("the purge is durable");
    fs.run_out_of_descriptors(0, 0);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 190)));
    append_flushed(&mut log, vec![entry(1, 201)]).await;
    fs.crash(CrashPoint::default());
    drop(log);

    let mut log = open(&fs);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 190)));
    assert_eq!(state.last_log_id, Some(log_id(1, 201)));
    let held = log.try_get_log_entries(..).await.unwrap();
    assert_eq!(held.first().map(|e| e.log_id.index), Some(191));
}
