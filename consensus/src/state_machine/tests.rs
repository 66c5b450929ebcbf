//! Tests of the state machine: deferred applies, heavy entries, snapshots.

use openraft::vote::leader_id_adv::LeaderId;

use super::*;
use crate::command::ShardReport;
use crate::snapshot_data::read_meta;
use openraft::storage::RaftSnapshotBuilder;

/// A state machine whose deferred batch waits for an hour (or a reader), however slow the
/// machine running the test.
pub(super) fn open(dir: &Path) -> StateMachine {
    let mut sm = StateMachine::open(
        None,
        &dir.join("registry"),
        &dir.join("snapshots"),
        1 << 20,
        2,
        Arc::new(RateLimiter::unlimited()),
    )
    .unwrap();
    Arc::get_mut(&mut sm.shared).unwrap().defer_max_age = Duration::from_secs(3600);
    sm
}

pub(super) fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(cmd),
    }
}

/// A datanode, then one shard per entry, each applied alone; the kv `k` last.
fn workload() -> Vec<Entry> {
    let mut out = vec![entry(
        1,
        Command::RegisterDatanode {
            id: 7,
            addr: "a".into(),
        },
    )];
    for i in 0..20u64 {
        out.push(entry(
            2 + i,
            Command::RegisterShards {
                datanode: 7,
                epoch: 1,
                shards: vec![ShardReport {
                    id: i,
                    generation: 1,
                    size: 1,
                }],
            },
        ));
    }
    out.push(entry(
        22,
        Command::Put {
            key: "k".into(),
            value: b"v".to_vec(),
            if_revision: None,
        },
    ));
    out
}

#[test]
fn applied_writes_wait_in_memory_until_a_reader_commits_them() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    let mut results = Vec::new();
    for e in workload() {
        results.extend(shared.apply_entries(&[e], Mode::Deferred).unwrap());
    }
    // Every entry was answered from the batch (each shard was new), and the counters moved.
    let accepted =
        |r: &CommandResult| matches!(r, CommandResult::ShardsRegistered { accepted: 1, .. });
    assert_eq!(results.iter().filter(|r| accepted(r)).count(), 20);
    assert_eq!((shared.replicas(), shared.datanodes()), (20, 1));
    assert_eq!(shared.applied().0.map(|l| l.index), Some(22));
    // Nothing reached sled yet, and point reads see it all.
    assert!(shared.registry.content().unwrap().is_empty());
    assert_eq!(shared.shard(19).unwrap().unwrap().replicas.len(), 1);
    assert!(shared.shard(20).unwrap().is_none());
    assert_eq!(shared.datanode(7).unwrap().unwrap().shards, 20);
    assert_eq!(shared.kv_get("k").unwrap().unwrap().value, b"v");
    assert!(shared.kv_get("other").unwrap().is_none());
    shared.commit_deferred().unwrap();
    assert_eq!(
        shared.registry.shard(19).unwrap().unwrap().replicas.len(),
        1
    );
    assert!(shared.registry.kv_get("k").unwrap().is_some());
    // A deferred removal hides what the registry still holds.
    let gone = [
        entry(
            23,
            Command::DeregisterShards {
                datanode: 7,
                shards: vec![19],
            },
        ),
        entry(
            24,
            Command::Delete {
                key: "k".into(),
                if_revision: None,
            },
        ),
    ];
    shared.apply_entries(&gone, Mode::Deferred).unwrap();
    assert!(shared.registry.shard(19).unwrap().is_some());
    assert!(shared.shard(19).unwrap().is_none());
    assert!(shared.kv_get("k").unwrap().is_none());
    assert_eq!(shared.datanode(7).unwrap().unwrap().shards, 19);
    shared.commit_deferred().unwrap();
    let content = shared.registry.content().unwrap();
    // Reopened, the registry holds the same state at the same last-applied.
    drop(shared);
    drop(sm);
    let sm = open(dir.path());
    assert_eq!(sm.shared().registry.content().unwrap(), content);
    assert_eq!(sm.shared().applied().0.map(|l| l.index), Some(24));
    assert_eq!((sm.shared().replicas(), sm.shared().datanodes()), (19, 1));
}

/// Entry `index`: datanode 7 (epoch 1) registers the shards `ids`.
fn register(index: u64, ids: std::ops::Range<u64>) -> Entry {
    entry(
        index,
        Command::RegisterShards {
            datanode: 7,
            epoch: 1,
            shards: ids
                .map(|id| ShardReport {
                    id,
                    generation: 1,
                    size: 1,
                })
                .collect(),
        },
    )
}

#[test]
fn heavy_is_decided_per_entry() {
    let single = |index: u64| register(index, index..index + 1);
    // Sixty single-shard registrations in one call are light, however much they touch
    // together; one entry of a hundred shards is heavy, alone or among light ones.
    let light: Vec<Entry> = (1..=60).map(single).collect();
    assert!(work(&light) > HEAVY_ENTRY_OPS);
    assert!(!is_heavy(&light));
    let big = register(61, 1000..1100);
    assert!(is_heavy(std::slice::from_ref(&big)));
    let mut mixed = light.clone();
    mixed.push(big);
    assert!(is_heavy(&mixed));
}

#[test]
fn a_heavy_apply_commits_the_deferred_batch_and_then_itself() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    let entries = workload();
    for e in &entries[..5] {
        shared
            .apply_entries(std::slice::from_ref(e), Mode::Deferred)
            .unwrap();
    }
    assert!(shared.registry.content().unwrap().is_empty());
    let heavy = register(23, 1000..1100);
    shared.apply_entries(&[heavy], Mode::Heavy).unwrap();
    // Both are in the registry without a reader committing anything.
    assert!(shared.deferred.lock().is_none());
    assert!(shared.registry.shard(3).unwrap().is_some());
    assert!(shared.registry.shard(1099).unwrap().is_some());
    assert_eq!(shared.registry.current().replica_count().unwrap(), 104);
    assert_eq!(shared.applied().0.map(|l| l.index), Some(23));
}

/// A state machine in `dir` that applied [`workload`] one entry at a time, and the snapshot
/// it builds right after (at index 22).
/// A snapshot `sm` builds now.
pub(super) async fn snapshot_now(sm: &mut StateMachine) -> SnapshotOf<TypeConfig, SnapshotData> {
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

/// A state machine in a fresh dir that installed `snapshot`, and its dir.
pub(super) async fn installed(
    snapshot: SnapshotOf<TypeConfig, SnapshotData>,
) -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    tokio::task::spawn_blocking(move || shared.install(&snapshot.meta, &snapshot.snapshot))
        .await
        .unwrap()
        .unwrap();
    (dir, sm)
}

async fn workload_snapshot(dir: &Path) -> (StateMachine, SnapshotOf<TypeConfig, SnapshotData>) {
    let mut sm = open(dir);
    for e in workload() {
        sm.shared().apply_entries(&[e], Mode::Deferred).unwrap();
    }
    let snapshot = snapshot_now(&mut sm).await;
    assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(22));
    (sm, snapshot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_right_after_applies_holds_every_applied_entry() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sm, snapshot) = workload_snapshot(a.path()).await;
    let other = open(b.path());
    let shared = other.shared();
    let meta = snapshot.meta.clone();
    tokio::task::spawn_blocking(move || shared.install(&meta, &snapshot.snapshot))
        .await
        .unwrap()
        .unwrap();
    let want = sm.shared().registry.content().unwrap();
    assert_eq!(want.len(), 1 + 1 + 1, "a datanode, one bucket, one key");
    assert_eq!(other.shared().registry.content().unwrap(), want);
    assert_eq!(
        (other.shared().replicas(), other.shared().datanodes()),
        (20, 1)
    );
}

/// The cluster's version rises with `SetClusterVersion` and never falls, travels in snapshots
/// and survives a reopen (as does the cluster's epoch floor); a build older than it refuses the
/// entry and the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_version_is_kept_and_older_builds_refuse_it() {
    use crate::cluster_version::BASE_VERSION;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut sm = open(dirs[0].path());
    let shared = sm.shared();
    assert_eq!(shared.cluster_version(), BASE_VERSION);
    let mut entries = workload();
    entries.push(entry(23, Command::SetClusterVersion { version: 2 }));
    entries.push(entry(24, Command::SetClusterVersion { version: 1 }));
    entries.push(entry(25, Command::RaiseEpochFloor { at_least: 77 }));
    let results = shared.apply_entries(&entries, Mode::Deferred).unwrap();
    assert_eq!(results[24], CommandResult::EpochFloor { floor: 77 });
    assert_eq!(shared.epoch_floor(), 77);
    assert_eq!(results[22], CommandResult::ClusterVersion { version: 2 });
    assert_eq!(
        results[23],
        CommandResult::ClusterVersion { version: 2 },
        "never lowered"
    );
    assert_eq!(shared.cluster_version(), 2);
    let snapshot = snapshot_now(&mut sm).await;

    // A build older than the snapshot's cluster version refuses it and keeps its registry.
    let other = open(dirs[1].path());
    other.set_build_version(1);
    let install = |other: &StateMachine| {
        let (shared, meta, data) = (
            other.shared(),
            snapshot.meta.clone(),
            snapshot.snapshot.clone(),
        );
        tokio::task::spawn_blocking(move || shared.install(&meta, &data))
    };
    let refused = install(&other).await.unwrap();
    assert!(
        matches!(
            refused,
            Err(Error::BuildTooOld {
                build: 1,
                cluster: 2
            })
        ),
        "{refused:?}"
    );
    assert_eq!(other.shared().cluster_version(), BASE_VERSION);
    assert_eq!(other.shared().epoch_floor(), 0);
    assert!(other.shared().registry.content().unwrap().is_empty());
    other.set_build_version(2);
    install(&other).await.unwrap().unwrap();
    assert_eq!(other.shared().cluster_version(), 2);
    assert_eq!(other.shared().epoch_floor(), 77);
    assert_eq!(
        other.shared().registry.content().unwrap(),
        shared.registry.content().unwrap()
    );

    // An older build stops at the entry that raises the version past it.
    let old = open(dirs[2].path());
    old.set_build_version(1);
    let raise = [entry(1, Command::SetClusterVersion { version: 2 })];
    let refused = old.shared().apply_entries(&raise, Mode::Deferred);
    assert!(
        matches!(
            refused,
            Err(Error::BuildTooOld {
                build: 1,
                cluster: 2
            })
        ),
        "{refused:?}"
    );
    assert_eq!(old.shared().cluster_version(), BASE_VERSION);

    // The version is in the registry: a reopen finds it.
    shared.commit_deferred().unwrap();
    drop((shared, snapshot, sm));
    let reopened = open(dirs[0].path());
    assert_eq!(reopened.shared().cluster_version(), 2);
    assert_eq!(reopened.shared().epoch_floor(), 77);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_snapshot_is_known_without_opening_a_file() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_leader, newer) = workload_snapshot(a.path()).await;

    // A follower captures at index 10 and, before that export finishes, installs the
    // leader's newer snapshot: the stale build does not become the current snapshot.
    let mut follower = open(b.path());
    for e in &workload()[..10] {
        follower
            .shared()
            .apply_entries(std::slice::from_ref(e), Mode::Deferred)
            .unwrap();
    }
    let mut stale = follower.get_snapshot_builder().await;
    let shared = follower.shared();
    let (meta, data) = (newer.meta.clone(), newer.snapshot.clone());
    tokio::task::spawn_blocking(move || shared.install(&meta, &data))
        .await
        .unwrap()
        .unwrap();
    let built = stale.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(10));
    assert_eq!(
        follower.shared().registry.retired_count(),
        0,
        "the generation the install retired is dropped once the export that read it ends"
    );

    // With the snapshot directory gone, the current snapshot is still known: openraft's
    // request for it needs no descriptor, no listing and no read.
    let dir = b.path().join("snapshots");
    let moved = b.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, newer.meta);
    assert_eq!(current.snapshot.path().parent(), Some(dir.as_path()));
    assert_eq!(follower.shared().last_snapshot().unwrap().index, 22);
    std::fs::rename(&moved, &dir).unwrap();

    // The kept copy is a complete snapshot, and the newest by name when the node reopens.
    let (meta, _) = read_meta(current.snapshot.path()).unwrap();
    assert_eq!(meta, newer.meta);
    drop((stale, built, current, follower));
    let mut reopened = open(b.path());
    let current = reopened.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, newer.meta);
}

/// An install whose registry write fails (a full disk while the new generation is made
/// active) leaves the state machine refusing to apply, and the registry untrusted, so that the
/// next start rebuilds it instead of reopening what sled kept of the failed writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_that_fails_a_registry_write_distrusts_the_registry() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_leader, snapshot) = workload_snapshot(a.path()).await;
    let follower = open(b.path());
    follower
        .shared()
        .apply_entries(&workload()[..3], Mode::Deferred)
        .unwrap();
    let marker = b.path().join("registry").join("TRUSTED");
    assert!(marker.exists(), "a cleanly opened registry is trusted");

    follower
        .shared()
        .registry
        .fail_next_activation
        .store(true, Ordering::Release);
    let (shared, meta, data) = (
        follower.shared(),
        snapshot.meta.clone(),
        snapshot.snapshot.clone(),
    );
    let installed = tokio::task::spawn_blocking(move || shared.install(&meta, &data))
        .await
        .unwrap();
    assert!(
        matches!(installed, Err(Error::Registry { .. })),
        "{installed:?}"
    );
    assert!(!marker.exists(), "the registry is no longer trusted");
    let next = entry(
        4,
        Command::Put {
            key: "after".into(),
            value: vec![1],
            if_revision: None,
        },
    );
    let refused = follower.shared().apply_entries(&[next], Mode::Deferred);
    assert!(refused.is_err(), "{refused:?}");
}

/// Replaces the snapshot directory under `dir` by a file, so that building a snapshot fails.
fn break_snapshot_dir(dir: &Path) {
    let snapshots = dir.join("snapshots");
    std::fs::remove_dir_all(&snapshots).unwrap();
    std::fs::write(&snapshots, "not a directory").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_keeps_the_older_snapshot_and_pauses_automatic_builds() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    let entries = workload();
    for e in &entries[..10] {
        sm.shared()
            .apply_entries(std::slice::from_ref(e), Mode::Deferred)
            .unwrap();
    }
    let older = snapshot_now(&mut sm).await;
    for e in &entries[10..] {
        sm.shared()
            .apply_entries(std::slice::from_ref(e), Mode::Deferred)
            .unwrap();
    }
    break_snapshot_dir(dir.path());
    let mut builder = sm.try_create_snapshot_builder(false).await.unwrap();
    let stood_in = builder.build_snapshot().await.unwrap();
    assert_eq!(stood_in.meta, older.meta, "the older snapshot stands in");
    assert_eq!(sm.shared().builds.in_a_row(), 1);
    drop(builder);
    assert!(
        sm.try_create_snapshot_builder(false).await.is_none(),
        "automatic builds pause"
    );
    let mut forced = sm.try_create_snapshot_builder(true).await.unwrap();
    forced.build_snapshot().await.unwrap();
    assert_eq!(sm.shared().builds.in_a_row(), 2);
    drop(forced);

    // Repaired, a requested build succeeds and automatic ones resume.
    let snapshots = dir.path().join("snapshots");
    std::fs::remove_file(&snapshots).unwrap();
    std::fs::create_dir(&snapshots).unwrap();
    let mut forced = sm.try_create_snapshot_builder(true).await.unwrap();
    let built = forced.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(22));
    assert_eq!(sm.shared().builds.in_a_row(), 0);
    assert_eq!(
        sm.shared().stats.snapshot().snapshot_build_failures,
        2,
        "the failures stay counted for metrics"
    );
    drop(forced);
    assert!(sm.try_create_snapshot_builder(false).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_build_answers_no_snapshot_and_pauses_automatic_builds() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    for e in workload() {
        sm.shared().apply_entries(&[e], Mode::Deferred).unwrap();
    }
    break_snapshot_dir(dir.path());
    let mut builder = sm.get_snapshot_builder().await;
    let answer = builder.build_snapshot().await.unwrap();
    assert_eq!(
        answer.meta,
        SnapshotMeta::default(),
        "no snapshot: openraft ignores it as not newer than its own"
    );
    assert!(sm.shared().current_snapshot().is_none());
    assert_eq!(sm.shared().builds.in_a_row(), 1);
    drop(builder);
    assert!(
        sm.try_create_snapshot_builder(false).await.is_none(),
        "automatic builds pause"
    );
    // Shutting down, a failed build is an error again (openraft is stopping anyway).
    sm.shared().closing.store(true, Ordering::Release);
    let mut forced = sm.try_create_snapshot_builder(true).await.unwrap();
    assert!(forced.build_snapshot().await.is_err());
}

#[test]
fn entries_whose_work_is_not_in_the_entry_are_heavy() {
    let piece = entry(
        1,
        Command::PruneReplicas {
            datanode: 7,
            epoch: 1,
            from_bucket: 0,
        },
    );
    let remove = entry(2, Command::RemoveDatanode { id: 7 });
    assert!(is_heavy(std::slice::from_ref(&piece)));
    assert!(is_heavy(std::slice::from_ref(&remove)));
    let put = entry(
        3,
        Command::Put {
            key: "k".into(),
            value: vec![1],
            if_revision: None,
        },
    );
    assert!(!is_heavy(std::slice::from_ref(&put)));
}

/// Entries `first..first + n`: each puts a key of its own.
fn puts(first: u64, n: u64) -> Vec<Entry> {
    (first..first + n)
        .map(|i| {
            entry(
                i,
                Command::Put {
                    key: format!("k{i}"),
                    value: vec![1],
                    if_revision: None,
                },
            )
        })
        .collect()
}

#[test]
fn an_inline_apply_never_commits_and_leaves_a_due_batch_to_a_blocking_call() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    let pending = || {
        shared
            .deferred
            .lock()
            .as_ref()
            .map_or(0, |d| d.batch.keys())
    };
    // Light calls run inline while the batch is not due; the fifth makes it due.
    for first in [1, 1001, 2001, 3001, 4001] {
        let call = puts(first, 1000);
        assert_eq!(mode(&call, shared.commit_due()), Mode::Inline);
        shared.apply_entries(&call, Mode::Inline).unwrap();
    }
    // It did not commit the batch: that would be a commit of 4,096 keys on the async runtime.
    assert!(pending() >= DEFER_MAX_KEYS);
    assert!(shared.registry.content().unwrap().is_empty());
    let next = 5001;
    assert!(shared.commit_due());
    // The next call, however light, runs on a blocking thread and commits the batch.
    let call = puts(next, 1);
    assert_eq!(mode(&call, shared.commit_due()), Mode::Deferred);
    shared.apply_entries(&call, Mode::Deferred).unwrap();
    assert!(shared.deferred.lock().is_none());
    assert!(shared.registry.kv_get("k1").unwrap().is_some());
    assert!(shared
        .registry
        .kv_get(&format!("k{next}"))
        .unwrap()
        .is_some());
    // Heavy entries and much light work never run inline.
    assert_eq!(mode(&[register(next + 1, 0..100)], false), Mode::Heavy);
    assert_eq!(mode(&puts(next + 1, 2000), false), Mode::Deferred);
}

#[test]
fn a_batch_opened_for_entries_applied_already_keeps_last_applied() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    let entries = workload();
    shared.apply_entries(&entries, Mode::Deferred).unwrap();
    shared.commit_deferred().unwrap();
    // Entries at or below last-applied are skipped; the batch their call opened still commits
    // last-applied as it was.
    shared.apply_entries(&entries[..3], Mode::Deferred).unwrap();
    assert!(shared.deferred.lock().is_some());
    shared.commit_deferred().unwrap();
    drop(shared);
    drop(sm);
    let sm = open(dir.path());
    assert_eq!(sm.shared().applied().0.map(|l| l.index), Some(22));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_moves_in_only_a_received_file_and_copies_any_other() {
    let a = tempfile::tempdir().unwrap();
    let (_sm, snapshot) = workload_snapshot(a.path()).await;
    let source = snapshot.snapshot.path().to_path_buf();
    let meta = snapshot.meta.clone();
    // Another store's snapshot is not this node's to move: copied.
    let (b, _other) = installed(snapshot).await;
    assert!(source.exists(), "the other store's snapshot was taken");
    assert_eq!(b.path().join("snapshots").read_dir().unwrap().count(), 1);
    // A received file is moved into the store.
    let c = tempfile::tempdir().unwrap();
    let third = open(c.path());
    let incoming = c.path().join("incoming");
    std::fs::create_dir(&incoming).unwrap();
    let temp = tempfile::NamedTempFile::new_in(&incoming)
        .unwrap()
        .into_temp_path();
    std::fs::copy(&source, &temp).unwrap();
    let (received_meta, data, _) = SnapshotData::open_received(temp).unwrap();
    assert_eq!(received_meta, meta);
    // Held here, a received file that was copied would still be in `incoming` below.
    let held = data.clone();
    let shared = third.shared();
    tokio::task::spawn_blocking(move || shared.install(&received_meta, &data))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(incoming.read_dir().unwrap().count(), 0, "moved, not copied");
    drop(held);
    let (_, kept) = third.shared().current_snapshot().unwrap();
    assert_eq!(
        kept.path().parent(),
        Some(c.path().join("snapshots").as_path())
    );
    assert_eq!(read_meta(kept.path()).unwrap().0, meta);
}

/// A received file is verified in the read that counts its records: one whose payload was
/// damaged in transit is refused (and deleted), and the records counted from a sound one are
/// what its leader counts from its own copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_received_file_is_refused_and_a_sound_one_counted() {
    let a = tempfile::tempdir().unwrap();
    let (_sm, snapshot) = workload_snapshot(a.path()).await;
    let source = snapshot.snapshot.path().to_path_buf();
    let received = |damage: bool| {
        let mut bytes = std::fs::read(&source).unwrap();
        if damage {
            // A payload byte in the middle: header and trailer stay sound.
            let at = bytes.len() / 2;
            bytes[at] ^= 0x01;
        }
        let temp = tempfile::NamedTempFile::new_in(a.path())
            .unwrap()
            .into_temp_path();
        std::fs::write(&temp, &bytes).unwrap();
        temp
    };
    let temp = received(true);
    let path = temp.to_path_buf();
    assert!(SnapshotData::open_received(temp).is_err());
    assert!(!path.exists(), "the refused file is deleted");
    let (_, _, records) = SnapshotData::open_received(received(false)).unwrap();
    assert!(records.pairs > 0, "{records:?}");
    assert_eq!(snapshot.snapshot.import_records().unwrap(), records);
}

/// A build on a disk below a quarter of the reserve fails as a full disk fails it, before it
/// writes anything, and keeps no file; with room it builds.
#[tokio::test]
async fn a_build_stops_short_of_filling_the_disk() {
    use crate::build_room::BuildRoom;
    use crate::free_space::FreeSpace;
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    for e in workload() {
        sm.shared().apply_entries(&[e], Mode::Deferred).unwrap();
    }
    let free = Arc::new(AtomicU64::new((8 << 20) / 4 - 1));
    let probe = free.clone();
    let space = FreeSpace::with(move |_| Ok(probe.load(Ordering::SeqCst)));
    sm.set_build_room(BuildRoom::new(space, dir.path().into(), 8 << 20));
    let since = std::time::Instant::now();
    let mut builder = sm.get_snapshot_builder().await;
    let answer = builder.build_snapshot().await.unwrap();
    assert_eq!(answer.meta, SnapshotMeta::default(), "no snapshot built");
    let failed = sm
        .shared()
        .builds
        .failed_since(since)
        .expect("the build failed");
    assert!(failed.out_of_space);
    drop(builder);
    let files = std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .count();
    assert_eq!(files, 0, "a failed build keeps no file");

    free.store((8 << 20) / 4, Ordering::SeqCst);
    let mut builder = sm.try_create_snapshot_builder(true).await.unwrap();
    let built = builder.build_snapshot().await.unwrap();
    assert!(built.meta.last_log_id.is_some());
}
