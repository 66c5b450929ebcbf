//! A member without room to install a snapshot refuses it and stays as it was: a learner that
//! joins after the leader purged its log needs a snapshot, and one whose disk (here, its
//! reserve) leaves no room refuses every one the leader sends, keeps running, and keeps no
//! received file.

mod common;

use std::collections::BTreeMap;

use common::{test_config, wait_for};
use meta_consensus::{Command, MetaNode, Node, NodeConfig, Role};
use meta_http::{AppState, HttpNetwork, Token};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

struct Server {
    node: MetaNode,
    addr: String,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts node `id` behind an HTTP server on an ephemeral loopback port; `tune` adjusts its
/// config.
async fn start(id: u64, dir: &TempDir, tune: fn(&mut NodeConfig)) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = test_config(id, &addr, &dir.path().join(format!("node{id}")));
    cfg.snapshot_logs_since_last = 0;
    cfg.max_in_snapshot_log_to_keep = 0;
    tune(&mut cfg);
    let token = Token::new(None);
    let network = HttpNetwork::new(&cfg, token.clone());
    let node = MetaNode::open(cfg, network).await.unwrap();
    let app = meta_http::router(AppState::new(node.clone(), token));
    let task = tokio::spawn(async move {
        axum::serve(meta_http::LimitedListener::new(listener, 1_000), app)
            .await
            .unwrap();
    });
    Server { node, addr, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_room_refuses_a_snapshot_and_stays_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start(1, &dir, |_| {}).await;
    leader
        .node
        .initialize(BTreeMap::from([(1, Node::new(leader.addr.clone()))]))
        .await
        .unwrap();
    wait_for(|| leader.node.status().role == Role::Leader, "node 1 leads").await;
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
    let learner = start(2, &dir, |cfg| cfg.min_free_bytes = u64::MAX).await;
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
    // A file may be arriving right now; none stays: each refused one was deleted.
    assert!(kept.len() <= 1, "received files kept: {kept:?}");

    // The leader is unharmed and still takes writes.
    let put = Command::Put {
        key: "after".into(),
        value: b"v".to_vec(),
        if_revision: None,
    };
    leader.node.write(put).await.unwrap();

    let metrics = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{}/metrics", learner.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("metaserver_snapshot_install_refusals_total "))
        .unwrap_or_else(|| panic!("no refusal counter in {metrics}"));
    let count: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 2, "{line}");
}
