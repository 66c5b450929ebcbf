//! A member without room for a snapshot refuses it and stays as it was: a learner that joins
//! after the leader purged its log needs a snapshot, and one whose disk is full, or has room to
//! receive the snapshot but not to install it, refuses every one the leader sends, keeps
//! running, and keeps no received file.

use std::sync::atomic::{AtomicU64, Ordering};

use meta_consensus::{Command, FreeSpace, Node, NodeConfig, Role};

use crate::common::wait_for;
use crate::helpers::{leader_with_purged_log, start_tuned, Client, Server};

/// Adds `learner` (node 2) to `leader`'s cluster, and waits until it refused the leader's
/// snapshot `times` times.
async fn add_until_refused(leader: &Server, learner: &Server, times: u64, what: &str) {
    leader
        .node
        .add_learner(2, Node::new(learner.addr.clone()))
        .await
        .unwrap();
    wait_for(
        || {
            learner
                .node
                .status()
                .state_machine
                .snapshot_install_refusals
                >= times
        },
        what,
    )
    .await;
}

/// Starts a leader with a purged log, then adds learner 2 (configured by `tune`) and waits
/// until it refused the leader's snapshot twice; checks that it stayed as it was and that the
/// leader still takes writes. Returns the leader and the learner.
async fn refused_twice(dir: &tempfile::TempDir, tune: fn(&mut NodeConfig)) -> (Server, Server) {
    let leader = leader_with_purged_log(dir, 100).await;
    let snapshot_index = leader.node.status().snapshot_index;

    let learner = start_tuned(2, dir, None, tune).await;
    // Refused, and sent again: the refusal is not fatal on either side.
    add_until_refused(
        &leader,
        &learner,
        2,
        "the learner refuses the leader's snapshot twice",
    )
    .await;
    // Still running, and still without the membership, which comes with the snapshot; a
    // learner all the same (the leader replicates to it), not a node of no cluster.
    let status = learner.node.status();
    assert_eq!(status.role, Role::Learner, "{status:?}");
    assert_eq!(status.leader_id, Some(1), "{status:?}");
    assert_eq!(status.state_machine.snapshot_installs, 0, "{status:?}");
    assert!(
        snapshot_index.is_some() && status.applied < snapshot_index,
        "{status:?}"
    );
    let (records, _) = learner.node.registry_digest().await.unwrap();
    let (leader_records, _) = leader.node.registry_digest().await.unwrap();
    assert!(
        records < 20 && leader_records >= 20,
        "{records} {leader_records}"
    );
    let incoming = dir.path().join("node2").join("snapshots-incoming");
    let kept: Vec<_> = std::fs::read_dir(&incoming)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    // Refused before a byte of it landed (the leader announces its size).
    assert!(kept.is_empty(), "received files kept: {kept:?}");

    // The leader is unharmed and still takes writes.
    let put = Command::Put {
        key: "after".into(),
        value: b"v".to_vec(),
        if_revision: None,
    };
    leader.node.write(put).await.unwrap();
    (leader, learner)
}

/// The value of metric `name` (a line `name value`) in `server`'s `/metrics`.
async fn metric(server: &Server, name: &str) -> u64 {
    let (status, metrics) = Client::new()
        .send(reqwest::Method::GET, server, "/metrics", None)
        .await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {metrics}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_full_disk_refuses_a_snapshot_and_stays_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (leader, learner) = refused_twice(&dir, |cfg| cfg.free_space = FreeSpace::fixed(0)).await;
    // What an operator alerts on: the refusals, the free space, and the reserve.
    let name = "metaserver_snapshot_install_refusals_total";
    assert!(metric(&learner, name).await >= 2);
    assert_eq!(metric(&learner, "metaserver_data_dir_free_bytes").await, 0);
    let reserve = learner.node.config().min_free_bytes;
    assert_eq!(metric(&learner, "metaserver_min_free_bytes").await, reserve);
    // Its status and its readiness say why it does not catch up.
    let (status, view) = Client::new()
        .send(reqwest::Method::GET, &learner, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200);
    let refused = view["snapshot_refused"].as_str().unwrap_or_default();
    assert!(refused.contains("no room for a snapshot"), "{view}");
    let (status, ready) = Client::new()
        .send(reqwest::Method::GET, &learner, "/readyz", None)
        .await;
    assert_eq!(status, 503, "{ready}");
    assert!(
        ready.to_string().contains("refuses the snapshot it needs"),
        "{ready}"
    );
    // The leader, asked to make it a voter, says why it does not catch up.
    let e = leader.node.add_voter(2).await.unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("refuses the leader's snapshot") && e.contains("no room for a snapshot"),
        "{e}"
    );
    // So does its status, with the learner's progress.
    let (status, view) = Client::new()
        .send(reqwest::Method::GET, &leader, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200);
    let refused = view["replication"]["2"]["snapshot_refused"].as_str();
    assert!(
        refused
            .unwrap_or_default()
            .contains("no room for a snapshot"),
        "{view}"
    );
    // The leader sends again later and later (1 s, 2 s, ...), not twice a second: two refusals
    // seen one after the other come at least a second apart. Both are seen as they come (the
    // time since the last one before is not known, so it does not count).
    let refusals = || {
        learner
            .node
            .status()
            .state_machine
            .snapshot_install_refusals
    };
    let seen = refusals();
    wait_for(
        || refusals() > seen,
        "the learner refuses the snapshot again",
    )
    .await;
    let (seen, since) = (refusals(), std::time::Instant::now());
    wait_for(
        || refusals() > seen,
        "the learner refuses the snapshot again",
    )
    .await;
    assert!(
        since.elapsed() >= std::time::Duration::from_secs(1),
        "sent again after {:?}",
        since.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_room_to_receive_but_not_to_install_refuses_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    // Exactly the reserve free: the snapshot may arrive, but its install would eat into it.
    let (_leader, learner) = refused_twice(&dir, |cfg| {
        cfg.min_free_bytes = 1 << 20;
        cfg.free_space = FreeSpace::fixed(1 << 20);
    })
    .await;
    let refusals = learner
        .node
        .status()
        .state_machine
        .snapshot_install_refusals;
    assert!(refusals >= 2, "{refusals}");
}

/// Without a reserve (`--min-free-bytes 0`), the room an install takes is still checked: an
/// install that ran out of space stopped the node, and at each restart it received the
/// snapshot again and stopped again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_reserve_still_refuses_a_snapshot_it_cannot_install() {
    let dir = tempfile::tempdir().unwrap();
    let (_leader, learner) = refused_twice(&dir, |cfg| {
        cfg.min_free_bytes = 0;
        cfg.free_space = FreeSpace::fixed(1000);
    })
    .await;
    let refusals = learner
        .node
        .status()
        .state_machine
        .snapshot_install_refusals;
    assert!(refusals >= 2, "{refusals}");
}

/// The disk of the test below: this many bytes, less what lands in the data dir's incoming
/// snapshot files.
static DISK_BYTES: AtomicU64 = AtomicU64::new(0);

/// What the files in `dir` take of its file system (none if it is missing): their blocks,
/// which round their bytes up.
fn bytes_in(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::read_dir(dir).map_or(0, |files| {
        files
            .filter_map(|f| f.ok()?.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum()
    })
}

/// The room a refusal of the learner below asked for: free space short of `need`, with
/// `disk` bytes on the disk (less what landed, which the member counts as its own).
fn room_asked(refusal: &str, disk: u64) -> u64 {
    let number_before = |word: &str| -> u64 {
        let head = &refusal[..refusal.find(word).unwrap_or_else(|| panic!("{refusal}"))];
        let digits = head.trim_end().rsplit(' ').next().unwrap();
        digits.parse().unwrap_or_else(|_| panic!("{refusal}"))
    };
    let (free, need) = (number_before(" bytes free"), number_before(" needed"));
    assert!(free < need, "{refusal}");
    need + (disk - free)
}

/// The most bytes of a snapshot the test below saw in the learner's incoming files.
static MOST_LANDED_BEFORE_ROOM: AtomicU64 = AtomicU64::new(0);

/// A member with exactly the room it asks for takes the snapshot, and the room it asks for
/// counts the records the import writes, not only the bytes: a registry of scattered shard ids
/// takes many times its snapshot on disk. The leader announces the records, so a member without
/// room for them refuses before a byte arrives (it downloaded the whole snapshot for each
/// refusal before); a file that arrives unannounced (an older leader's) is counted once it
/// landed, to the same room. The received file takes its own room (its blocks), which is not
/// counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_the_room_it_asks_for_takes_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let leader = crate::helpers::start_alone(&dir).await;
    let register = Command::RegisterDatanode {
        id: 7,
        addr: "dn7:1".into(),
    };
    let epoch = match leader.node.write(register).await.unwrap().result {
        meta_consensus::CommandResult::DatanodeRegistered { epoch, .. } => epoch,
        other => panic!("{other:?}"),
    };
    // One replica per bucket: a record and an index entry each.
    const REPLICAS: u64 = 2000;
    let shards = (0..REPLICAS)
        .map(|i| meta_consensus::ShardReport {
            id: i << 20,
            generation: 1,
            size: 1,
        })
        .collect();
    let register = Command::RegisterShards {
        datanode: 7,
        epoch,
        shards,
    };
    leader.node.write(register).await.unwrap();
    crate::helpers::snapshot_and_purge(&leader).await;
    let snapshot_file = std::fs::read_dir(dir.path().join("node1").join("snapshots"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("the leader keeps its snapshot");

    const RESERVE: u64 = 1 << 20;
    DISK_BYTES.store(0, Ordering::SeqCst);
    let learner = start_tuned(2, &dir, None, |cfg| {
        cfg.min_free_bytes = RESERVE;
        cfg.free_space = FreeSpace::with(|data_dir| {
            let landed = bytes_in(&data_dir.join("snapshots-incoming"));
            MOST_LANDED_BEFORE_ROOM.fetch_max(landed, Ordering::SeqCst);
            Ok(DISK_BYTES.load(Ordering::SeqCst).saturating_sub(landed))
        });
    })
    .await;
    leader
        .node
        .add_learner(2, Node::new(learner.addr.clone()))
        .await
        .unwrap();
    wait_for(
        || learner.node.snapshot_refused().is_some(),
        "the learner refuses the snapshot saying why",
    )
    .await;
    let refusal = learner.node.snapshot_refused().unwrap();
    let room = room_asked(&refusal, 0);
    assert_eq!(
        MOST_LANDED_BEFORE_ROOM.load(Ordering::SeqCst),
        0,
        "refused before a byte landed"
    );
    // The same file arriving unannounced (from an older leader), with `disk` bytes: refused
    // once it landed, and the whole room it asks.
    let incoming = dir.path().join("node2").join("snapshots-incoming");
    std::fs::create_dir_all(&incoming).unwrap();
    let vote = meta_consensus::Vote::new_committed(leader.node.status().term, 1);
    let unannounced = |disk: u64| {
        DISK_BYTES.store(disk, Ordering::SeqCst);
        let temp = tempfile::NamedTempFile::new_in(&incoming).unwrap();
        std::fs::copy(&snapshot_file, temp.path()).unwrap();
        let node = learner.node.clone();
        async move {
            match node
                .install_received_snapshot(vote, temp.into_temp_path())
                .await
            {
                Err(meta_consensus::Error::NoRoomForSnapshot { free, need, .. }) => {
                    need + (disk - free)
                }
                other => panic!("{other:?}"),
            }
        }
    };
    // With twice its size, refused for its bytes alone; the records ask a few hundred bytes
    // more for each scattered replica's record and index entry.
    let bytes = std::fs::metadata(&snapshot_file).unwrap().len();
    let for_bytes = unannounced(2 * bytes).await;
    assert!(
        room >= for_bytes + REPLICAS * 256,
        "{room}, {for_bytes} for the bytes"
    );
    // With one byte less than the room announced, refused for the records counted, asking the
    // same room.
    assert_eq!(unannounced(room - 1).await, room);
    let left: Vec<_> = std::fs::read_dir(&incoming).unwrap().collect();
    assert!(left.is_empty(), "the refused files are deleted: {left:?}");

    // With that room, it takes the leader's next snapshot.
    DISK_BYTES.store(room, Ordering::SeqCst);
    wait_for(
        || learner.node.status().state_machine.snapshot_installs >= 1,
        "the learner takes the snapshot",
    )
    .await;
    // Its status no longer names a refusal once it took the snapshot.
    assert_eq!(learner.node.snapshot_refused(), None);
    let (records, _) = learner.node.registry_digest().await.unwrap();
    let (leader_records, _) = leader.node.registry_digest().await.unwrap();
    assert_eq!(records, leader_records);
}

/// The most bytes of a snapshot the test below saw landed in the learner's data dir.
static MOST_LANDED: AtomicU64 = AtomicU64::new(0);

/// A member whose disk fills while a snapshot arrives (another process takes the room once the
/// first bytes landed) stops receiving it within about a MiB, not at the end of the file or
/// when the disk is full: the log and the registry share that disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_disk_fills_while_a_snapshot_arrives_stops_receiving_it() {
    let dir = tempfile::tempdir().unwrap();
    // 20 values of 300 KiB: a snapshot of about 6 MiB.
    let leader = leader_with_purged_log(&dir, 300 << 10).await;
    const RESERVE: u64 = 1 << 20;
    let learner = start_tuned(2, &dir, None, |cfg| {
        cfg.min_free_bytes = RESERVE;
        cfg.free_space = FreeSpace::with(|data_dir| {
            let landed = bytes_in(&data_dir.join("snapshots-incoming"));
            MOST_LANDED.fetch_max(landed, Ordering::SeqCst);
            Ok(if landed == 0 { 1 << 40 } else { RESERVE - 1 })
        });
    })
    .await;
    add_until_refused(
        &leader,
        &learner,
        1,
        "the learner refuses the snapshot as its disk fills",
    )
    .await;
    let most = MOST_LANDED.load(Ordering::SeqCst);
    assert!(
        most <= 3 << 20,
        "{most} bytes of the snapshot landed before the learner stopped"
    );
    assert_eq!(learner.node.status().state_machine.snapshot_installs, 0);
}
