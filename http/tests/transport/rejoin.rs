//! A voter that lost its data dir, over HTTP: it finds the leader at the address the leader's
//! messages name, asks the other voters for the cluster's term (`POST /raft/term`), and takes
//! nothing from any leader until they all answered.

use std::time::{Duration, Instant};

use meta_consensus::Consistency;
use openraft::async_runtime::watch::WatchReceiver as _;

use crate::common::{wait_for, DEADLINE};
use crate::helpers::{start_at, start_cluster, the_leader, Client};

/// Nodes a, b (leading) and c: c loses its data dir and comes back at its address while a is
/// down. Since a cannot tell it the cluster's term, c takes none of b's entries (so it cannot
/// acknowledge them either); once a is back, it takes the log, ends its rejoin, and b commits
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_waits_for_every_other_voter() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster(&dir).await;
    let b = the_leader(&servers).node.id();
    let others: Vec<u64> = servers.keys().copied().filter(|id| *id != b).collect();
    let (a, c) = (others[0], others[1]);
    let written = servers[&b]
        .node
        .register_datanode(7, "dn-7".to_string())
        .await
        .unwrap();

    let c_port = servers.remove(&c).unwrap().stop_keeping_port().await;
    let a_port = servers.remove(&a).unwrap().stop_keeping_port().await;
    std::fs::remove_dir_all(dir.path().join(format!("node{c}"))).unwrap();
    let wiped = start_at(c, &dir, c_port).await;

    // Two election timeouts and more: b's messages reach c, which asks a in vain.
    let mut metrics = wiped.node.raft().metrics();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let last = metrics.borrow_watched().last_log_index;
        assert_eq!(
            last, None,
            "the node that lost its data dir took entries while a voter could not tell it the term"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
    assert!(wiped.node.is_rejoining());
    // Its status says whom it waits for.
    let (status, view) = Client::new()
        .send(reqwest::Method::GET, &wiped, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["rejoin"]["term_floor"],
        serde_json::Value::Null,
        "{view}"
    );
    let waiting = view["rejoin"]["waiting"].as_str().unwrap_or_default();
    assert!(waiting.contains(&format!("node {a}")), "{view}");

    let back = start_at(a, &dir, a_port).await;
    wait_for(
        || !wiped.node.is_rejoining(),
        "the rejoin ends once a answers",
    )
    .await;
    let leader = servers[&b].node.clone();
    let again = tokio::time::timeout(DEADLINE, leader.register_datanode(8, "dn-8".to_string()))
        .await
        .expect("a write commits once all three answer")
        .unwrap();
    assert!(again.index > written.index);
    wait_for(
        || wiped.node.status().applied >= Some(again.index),
        "the node that lost its data dir holds the log again",
    )
    .await;
    assert!(wiped
        .node
        .datanode(Consistency::Local, 7)
        .await
        .unwrap()
        .is_some());
    for server in servers.into_values().chain([wiped, back]) {
        server.stop().await;
    }
}
