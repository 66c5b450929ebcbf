//! Three-node in-process cluster tests: election, replication, leader loss, restarts,
//! snapshot catch-up, fencing, key-value compare-and-swap and follower forwarding.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{addr, register, shard, Cluster, WAIT};
use meta_consensus::{
    ChangeFilter, Command, CommandResult, Consistency, Error, MetaNode, Node, NodeConfig, Role,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elects_one_leader_and_replicates_to_all() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let st = leader.status();
    assert_eq!(st.voters, vec![1, 2, 3]);
    assert_eq!(st.leader_addr.as_deref(), Some(addr(leader.id()).as_str()));

    register(&leader, 7, 0..20).await?;
    leader
        .register_shards(
            7,
            leader
                .datanode(Consistency::Linearizable, 7)
                .await?
                .unwrap()
                .epoch,
            (100..1100).map(|s| shard(s, 3)).collect(),
        )
        .await?;
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.status().replicas, 1020);
        assert_eq!(n.status().datanodes, 1);
    }

    // Every node serves the data locally, with the same pages.
    for n in c.nodes.values() {
        let dn = n
            .datanode(Consistency::Local, 7)
            .await?
            .context("datanode")?;
        assert_eq!(dn.shards, 1020);
        let s = n.shard(Consistency::Local, 5).await?.context("shard 5")?;
        assert_eq!(s.replicas.len(), 1);
        assert_eq!(s.replicas[0].datanode, 7);
    }
    // Pagination walks every replica exactly once, in order.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = leader
            .shards(Consistency::Linearizable, after.as_deref(), 333)
            .await?;
        seen.extend(page.items.iter().map(|e| e.shard));
        match page.next {
            // A cursor that does not advance would page for ever.
            Some(n) if after.as_ref() != Some(&n) => after = Some(n),
            Some(n) => anyhow::bail!("the cursor stays at {n}"),
            None => break,
        }
    }
    let want: Vec<u64> = (0..20).chain(100..1100).collect();
    assert_eq!(seen, want);
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = leader
            .datanode_shards(Consistency::Local, 7, after.as_deref(), 100)
            .await?;
        seen.extend(page.items.iter().map(|e| e.shard));
        match page.next {
            // A cursor that does not advance would page for ever.
            Some(n) if after.as_ref() != Some(&n) => after = Some(n),
            Some(n) => anyhow::bail!("the cursor stays at {n}"),
            None => break,
        }
    }
    assert_eq!(seen, want);
    assert!(matches!(
        leader
            .shards(Consistency::Local, Some("not-a-cursor"), 10)
            .await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        leader.shards(Consistency::Local, None, 0).await,
        Err(Error::InvalidArgument(_))
    ));
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_answers_forward_to_leader() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let follower = c.nodes.values().find(|n| n.id() != leader.id()).unwrap();
    let cmd = Command::Put {
        key: "k".into(),
        value: b"v".to_vec(),
        if_revision: None,
    };
    match follower.write(cmd.clone()).await {
        Err(Error::ForwardToLeader {
            leader_id,
            leader_addr,
        }) => {
            assert_eq!(leader_id, leader.id());
            assert_eq!(leader_addr, addr(leader.id()));
        }
        other => panic!("expected ForwardToLeader, got {other:?}"),
    }
    for c in [Consistency::Linearizable, Consistency::Lease] {
        match follower.read_barrier(c).await {
            Err(Error::ForwardToLeader { leader_id, .. }) => assert_eq!(leader_id, leader.id()),
            other => panic!("expected ForwardToLeader for {c:?}, got {other:?}"),
        }
    }
    // `route` says the same without proposing: the follower sends the command on, the leader
    // proposes it.
    assert_eq!(
        follower.route(&cmd)?,
        Some((leader.id(), addr(leader.id())))
    );
    assert_eq!(leader.route(&cmd)?, None);
    // Bad input is refused before it reaches the log, or is sent anywhere.
    let before = leader.status().last_log_index;
    let bad = Command::Put {
        key: String::new(),
        value: vec![],
        if_revision: None,
    };
    for node in [follower, &leader] {
        assert!(matches!(node.route(&bad), Err(Error::InvalidArgument(_))));
    }
    assert!(matches!(
        leader.write(bad).await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(leader.status().last_log_index, before);
    let w = leader.write(cmd).await?;
    // A lease read on the leader sees the write it acknowledged.
    let e = leader.kv_get(Consistency::Lease, "k").await?.context("k")?;
    assert_eq!(e.revision, w.index);
    follower.wait_applied(w.index, WAIT).await?;
    let e = follower
        .kv_get(Consistency::Local, "k")
        .await?
        .context("k")?;
    assert_eq!(e.revision, w.index);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_stale_generations_and_idempotent_reregistration() -> Result<()> {
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    let e1 = register(&l, 1, 0..0).await?;

    let r = l
        .register_shards(1, e1, vec![shard(10, 5), shard(11, 5)])
        .await?;
    assert_eq!(
        r.result,
        CommandResult::ShardsRegistered {
            accepted: 2,
            unchanged: 0,
            stale: vec![]
        }
    );
    // Identical: unchanged. Lower generation: stale (per shard). Higher: accepted.
    let r = l
        .register_shards(1, e1, vec![shard(10, 5), shard(11, 4), shard(12, 1)])
        .await?;
    assert_eq!(
        r.result,
        CommandResult::ShardsRegistered {
            accepted: 1,
            unchanged: 1,
            stale: vec![11]
        }
    );
    let before = l.registry_digest().await?;
    let r = l.register_shards(1, e1, vec![shard(10, 5)]).await?;
    assert!(matches!(
        r.result,
        CommandResult::ShardsRegistered {
            unchanged: 1,
            accepted: 0,
            ..
        }
    ));
    assert_eq!(
        l.registry_digest().await?,
        before,
        "re-registration changed nothing"
    );

    // A restarted datanode gets a new epoch; its former incarnation is fenced.
    let w = l.register_datanode(1, "dn-1-restarted").await?;
    let CommandResult::DatanodeRegistered { epoch: e2, .. } = w.result else {
        panic!("{:?}", w.result)
    };
    assert!(e2 > e1);
    let r = l.register_shards(1, e1, vec![shard(13, 1)]).await?;
    assert_eq!(r.result, CommandResult::Fenced { current_epoch: e2 });
    assert!(l.shard(Consistency::Linearizable, 13).await?.is_none());
    let r = l.register_shards(1, e2, vec![shard(13, 1)]).await?;
    assert!(matches!(
        r.result,
        CommandResult::ShardsRegistered { accepted: 1, .. }
    ));
    let dn = l.datanode(Consistency::Linearizable, 1).await?.unwrap();
    assert_eq!(
        (dn.epoch, dn.shards, dn.addr.as_str()),
        (e2, 4, "dn-1-restarted")
    );

    let r = l.register_shards(99, 1, vec![shard(1, 1)]).await?;
    assert_eq!(r.result, CommandResult::UnknownDatanode { id: 99 });

    let r = l
        .write(Command::DeregisterShards {
            datanode: 1,
            shards: vec![10, 10, 77],
        })
        .await?;
    assert_eq!(r.result, CommandResult::ShardsDeregistered { removed: 1 });
    assert_eq!(common::remove_datanode(&l, 1).await?, 3);
    assert!(l.shard(Consistency::Linearizable, 11).await?.is_none());
    assert_eq!(l.status().replicas, 0);
    c.converged().await?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_compare_and_swap() -> Result<()> {
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    let put = |key: &str, v: &str, if_revision| Command::Put {
        key: key.into(),
        value: v.as_bytes().to_vec(),
        if_revision,
    };
    let w1 = l.write(put("cfg/a", "1", Some(0))).await?;
    assert_eq!(w1.result, CommandResult::Put { revision: w1.index });
    let w = l.write(put("cfg/a", "x", Some(0))).await?;
    assert_eq!(
        w.result,
        CommandResult::RevisionMismatch { current: w1.index }
    );
    let w2 = l.write(put("cfg/a", "2", Some(w1.index))).await?;
    assert_eq!(w2.result, CommandResult::Put { revision: w2.index });
    let w = l.write(put("cfg/a", "y", Some(w1.index))).await?;
    assert_eq!(
        w.result,
        CommandResult::RevisionMismatch { current: w2.index }
    );
    let e = l.kv_get(Consistency::Linearizable, "cfg/a").await?.unwrap();
    assert_eq!((e.value.as_slice(), e.revision), (&b"2"[..], w2.index));

    l.write(put("cfg/b", "b", None)).await?;
    l.write(put("other", "o", None)).await?;
    let page = l
        .kv_list(Consistency::Linearizable, "cfg/", None, 1)
        .await?;
    assert_eq!(page.items[0].key, "cfg/a");
    let page2 = l
        .kv_list(Consistency::Linearizable, "cfg/", page.next.as_deref(), 10)
        .await?;
    assert_eq!(page2.items.len(), 1);
    assert_eq!(page2.items[0].key, "cfg/b");
    assert!(page2.next.is_none());

    let del = |if_revision| Command::Delete {
        key: "cfg/a".into(),
        if_revision,
    };
    let w = l.write(del(Some(w1.index))).await?;
    assert_eq!(
        w.result,
        CommandResult::RevisionMismatch { current: w2.index }
    );
    let w = l.write(del(Some(w2.index))).await?;
    assert_eq!(
        w.result,
        CommandResult::Deleted {
            existed: true,
            revision: w.index
        }
    );
    assert!(l
        .kv_get(Consistency::Linearizable, "cfg/a")
        .await?
        .is_none());
    let w = l.write(del(Some(0))).await?;
    assert_eq!(
        w.result,
        CommandResult::Deleted {
            existed: false,
            revision: w.index
        }
    );
    c.converged().await?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loss_keeps_every_acknowledged_registration() -> Result<()> {
    let mut c = Cluster::three().await?;
    let old = c.leader().await?;
    register(&old, 3, 0..30).await?;
    let old_id = old.id();
    drop(old);
    c.stop(old_id).await?;

    let new = c.leader().await?;
    assert_ne!(new.id(), old_id);
    let dn = new
        .datanode(Consistency::Linearizable, 3)
        .await?
        .context("datanode 3")?;
    assert_eq!(dn.shards, 30);
    for s in 0..30 {
        assert!(
            new.shard(Consistency::Linearizable, s).await?.is_some(),
            "shard {s}"
        );
    }
    // The survivors still make progress.
    new.register_shards(3, dn.epoch, vec![shard(1000, 1)])
        .await?;

    // The old leader comes back as a follower and catches up from its data dir.
    c.start(old_id).await?;
    c.converged().await?;
    assert_eq!(c.node(old_id).status().role, Role::Follower);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_follower_catches_up_from_its_data_dir() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let epoch = register(&l, 4, 0..10).await?;
    let f = c.nodes.keys().copied().find(|id| *id != l.id()).unwrap();
    c.converged().await?;
    c.stop(f).await?;
    for s in 10..40 {
        l.register_shards(4, epoch, vec![shard(s, 1)]).await?;
    }
    // Cut off while it restarts, so the leader cannot reach it before the read below.
    c.router.isolate(f);
    let n = c.start(f).await?;
    // It kept what it had (read before it can have caught up: the leader has not reached it).
    let kept = n
        .datanode(Consistency::Local, 4)
        .await?
        .context("kept datanode")?;
    assert_eq!(kept.shards, 10, "kept {kept:?}");
    c.router.heal_all();
    c.converged().await?;
    let dn = n.datanode(Consistency::Local, 4).await?.unwrap();
    assert_eq!(dn.shards, 40);
    c.shutdown().await
}

/// Waits until `leader` purged its log up to `index`.
async fn until_purged(leader: &MetaNode, index: u64) -> Result<()> {
    leader
        .raft()
        .wait(Some(WAIT))
        .metrics(
            move |m| m.purged.as_ref().map(|p| p.index) >= Some(index),
            "purged",
        )
        .await?;
    Ok(())
}

fn snapshot_friendly(cfg: &mut NodeConfig) {
    cfg.max_in_snapshot_log_to_keep = 0;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_requested_while_an_older_build_runs_covers_every_write_before_it() -> Result<()>
{
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    let epoch = register(&l, 5, 0..2000).await?;
    let first = l.snapshot_now().await?;
    // Exports now take about a second.
    l.set_snapshot_rate(first.bytes.max(1));
    l.register_shards(5, epoch, vec![shard(8000, 1)]).await?;
    // A build starts: its export pausing for the rate shows that it captured its point. The
    // state machine defers a trigger while the previous build still holds its capture, so
    // trigger until one runs.
    let pauses = l.status().snapshot_throttle_pauses;
    let started = tokio::time::timeout(WAIT, async {
        loop {
            l.raft().trigger().snapshot().await?;
            for _ in 0..100 {
                if l.status().snapshot_throttle_pauses > pauses {
                    return anyhow::Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    })
    .await;
    started.context("no snapshot build started")??;
    // A write lands after that build's capture.
    let w = l.register_shards(5, epoch, vec![shard(9000, 1)]).await?;
    // openraft drops the trigger of this request while the older build runs; the request must
    // still end with a snapshot that holds the write, not wait out its 600 s timeout.
    let snap = tokio::time::timeout(Duration::from_secs(60), l.snapshot_now())
        .await
        .context("a snapshot requested during an older build never came")??;
    ensure!(
        snap.index >= w.index,
        "snapshot {snap:?} misses write {w:?}"
    );
    l.set_snapshot_rate(0);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_behind_learner_catches_up_by_snapshot_then_log() -> Result<()> {
    let mut c = Cluster::three_tuned(snapshot_friendly).await?;
    let l = c.leader().await?;
    let epoch = register(&l, 5, 0..5).await?;
    l.register_shards(5, epoch, (5..3000).map(|s| shard(s, 2)).collect())
        .await?;
    l.write(Command::Put {
        key: "k".into(),
        value: vec![1; 100],
        if_revision: None,
    })
    .await?;
    let snap = l.snapshot_now().await?;
    assert!(snap.bytes > 0);
    let last = l.status().last_log_index.unwrap();
    assert!(snap.index >= last - 1, "snapshot {snap:?}, last {last}");
    // The leader purges its log up to the snapshot.
    until_purged(&l, snap.index).await?;

    // A new node joins as a learner: the log it needs is gone, so it gets the snapshot.
    let learner = c.start(4).await?;
    l.add_learner(4, Node::new(addr(4))).await?;
    learner.wait_applied(snap.index, WAIT).await?;
    // ... and then the log.
    let w = l.register_shards(5, epoch, vec![shard(5000, 1)]).await?;
    learner.wait_applied(w.index, WAIT).await?;
    let st = learner.status();
    assert_eq!(st.role, Role::Learner);
    assert!(
        st.state_machine.snapshot_installs >= 1,
        "{:?}",
        st.state_machine
    );
    assert_eq!(st.replicas, 3001);
    // What changed before the snapshot is not known to it: a watch from before is refused.
    match learner
        .watch(Some(0), 0, ChangeFilter::All, 10, Duration::ZERO)
        .await
    {
        Err(Error::Compacted { floor, .. }) => assert!(floor >= snap.index, "floor {floor}"),
        other => panic!("expected compacted, got {other:?}"),
    }
    c.converged().await?;

    // Promote it: a four-voter cluster.
    l.change_voters(BTreeSet::from([1, 2, 3, 4])).await?;
    assert_eq!(l.status().voters, vec![1, 2, 3, 4]);

    // Restarted, the learner keeps the installed registry (never behind its purge point).
    drop(learner);
    c.stop(4).await?;
    let again = c.start(4).await?;
    assert_eq!(
        again.status().replicas,
        3001,
        "registry as installed and applied"
    );
    c.converged().await?;
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_installs_a_snapshot_at_disk_speed_and_keeps_the_file_it_received() -> Result<()> {
    let mut c = Cluster::three_tuned(snapshot_friendly).await?;
    let l = c.leader().await?;
    register(&l, 5, 0..3000).await?;
    let snap = l.snapshot_now().await?;
    until_purged(&l, snap.index).await?;
    let learner = c.start(4).await?;
    // At this export rate a copy of the snapshot would take minutes: an install must not be
    // paced by it (a member catching up should do so as fast as its disk allows).
    let rate = 256;
    ensure!(
        snap.bytes / rate > 2 * WAIT.as_secs(),
        "snapshot {snap:?} too small for the check"
    );
    learner.set_snapshot_rate(rate);
    l.add_learner(4, Node::new(addr(4))).await?;
    learner.wait_applied(snap.index, WAIT).await?;
    let st = learner.status();
    assert!(
        st.state_machine.snapshot_installs >= 1,
        "{:?}",
        st.state_machine
    );
    assert_eq!(st.snapshot_throttle_pauses, 0);
    // The received file became the member's snapshot: nothing is left in the incoming dir,
    // and its snapshot dir holds the one file, verified.
    let listed = |dir: &str| -> Result<Vec<std::path::PathBuf>> {
        Ok(std::fs::read_dir(c.dir(4).join(dir))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?)
    };
    ensure!(
        listed("snapshots-incoming")?.is_empty(),
        "{:?}",
        listed("snapshots-incoming")
    );
    let kept = listed("snapshots")?;
    ensure!(kept.len() == 1, "{kept:?}");
    let reader = meta_store::SnapshotStore::open_reader(&kept[0])?;
    ensure!(
        reader.payload_len() == snap.bytes,
        "{kept:?} against {snap:?}"
    );
    learner.set_snapshot_rate(0);
    drop(learner);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_registry_and_membership() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    register(&l, 6, 0..15).await?;
    l.write(Command::Put {
        key: "x".into(),
        value: b"1".to_vec(),
        if_revision: Some(0),
    })
    .await?;
    let digest = c.converged().await?;
    let membership = l.status().voters;
    assert!(matches!(
        l.initialize(BTreeMap::from([(1, Node::new(addr(1)))]))
            .await,
        Err(Error::AlreadyInitialized)
    ));
    // A node's data dir is released when its last handle is dropped.
    drop(l);
    for id in 1..=3 {
        c.stop(id).await?;
    }
    for id in 1..=3 {
        c.start(id).await?;
    }
    let l = c.leader().await?;
    assert_eq!(c.converged().await?, digest);
    assert_eq!(l.status().voters, membership);
    for n in c.nodes.values() {
        assert!(n.is_initialized().await?);
        assert!(matches!(
            n.initialize(BTreeMap::from([(n.id(), Node::new(addr(n.id())))]))
                .await,
            Err(Error::AlreadyInitialized)
        ));
    }
    // Still writable.
    let dn = l.datanode(Consistency::Linearizable, 6).await?.unwrap();
    l.register_shards(6, dn.epoch, vec![shard(99, 1)]).await?;
    c.converged().await?;
    c.shutdown().await
}
