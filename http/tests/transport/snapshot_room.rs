//! A member without room to install a snapshot refuses it and stays as it was: a learner that
//! joins after the leader purged its log needs a snapshot, and one whose disk (here, its
//! reserve) leaves no room refuses every one the leader sends, keeps running, and keeps no
//! received file.

use meta_consensus::{Command, Node, Role};

use crate::common::wait_for;
use crate::helpers::{start_alone, start_tuned, Client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_room_refuses_a_snapshot_and_stays_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;
    for i in 0..20 {
        let put = Command::Put {
            key: format!("k{i}"),
            value: vec![7; 100],
            if_revision: None,
        };
        leader.node.write(put).await.unwrap();
    }
    let snapshot = leader.node.snapshot_now().await.unwrap();
    wait_for(
        || leader.node.status().purged >= Some(snapshot.index),
        "the leader purges its log up to the snapshot",
    )
    .await;

    // No file system has this much room.
    let learner = start_tuned(2, &dir, None, |cfg| cfg.min_free_bytes = u64::MAX).await;
    leader
        .node
        .add_learner(2, Node::new(learner.addr.clone()))
        .await
        .unwrap();
    // Refused, and sent again: the refusal is not fatal on either side.
    wait_for(
        || {
            learner
                .node
                .status()
                .state_machine
                .snapshot_install_refusals
                >= 2
        },
        "the learner refuses the leader's snapshot twice",
    )
    .await;
    // Still running, and still without the membership, which comes with the snapshot.
    let status = learner.node.status();
    assert_eq!(status.role, Role::Uninitialized, "{status:?}");
    assert_eq!(status.state_machine.snapshot_installs, 0, "{status:?}");
    assert!(status.applied < Some(snapshot.index), "{status:?}");
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
    // Refused before a byte of it landed.
    assert!(kept.is_empty(), "received files kept: {kept:?}");

    // The leader is unharmed and still takes writes.
    let put = Command::Put {
        key: "after".into(),
        value: b"v".to_vec(),
        if_revision: None,
    };
    leader.node.write(put).await.unwrap();

    let (status, metrics) = Client::new()
        .send(reqwest::Method::GET, &learner, "/metrics", None)
        .await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap();
    let value = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("metaserver_snapshot_install_refusals_total") >= 2);
    // What an operator alerts on: the free space, and the reserve it is measured against.
    assert!(value("metaserver_data_dir_free_bytes") > 0);
    assert_eq!(value("metaserver_min_free_bytes"), i64::MAX as u64);
}
