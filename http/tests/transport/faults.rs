//! Peers that fail: an unreachable peer is retried with backoff, a write outlives the leader
//! it was forwarded to (also one whose Raft core stopped), writes that reach a member while no leader takes them (a hand-over, an
//! election) wait for the next leader instead of failing, and a write sent to a leader that
//! stopped answering is answered once another one leads.

use std::time::{Duration, Instant};

use meta_consensus::Node;
use tokio::net::TcpListener;

use crate::common::wait_for;
use crate::helpers::{
    hand_over, http_client, keep_writing, put_kv, slow_election_cluster, start_alone,
    start_cluster, start_cluster_tuned, stop_all, stop_writing, the_leader, TOKEN,
};

/// A peer that cannot be replicated to is retried with openraft's backoff, not in a loop: a
/// leader whose learner's address accepts connections and drops them at once makes at most a
/// few attempts a second (heartbeats and replication together), where without the backoff it
/// made thousands (and logged a warning for each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_is_retried_with_backoff() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;

    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let dropper = tokio::spawn(async move {
        while let Ok((socket, _)) = dead.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            drop(socket);
        }
    });
    leader
        .node
        .add_learner(2, Node::new(dead_addr))
        .await
        .unwrap();

    // Count attempts until there are 40: with the backoff (20 ms doubling to 500 ms) and
    // heartbeats every 50 ms that takes well over a second; without it, milliseconds.
    // Attempts made while add_learner waited for its commit do not count: the time is
    // measured from here, so the attempts must be too.
    let started = Instant::now();
    let before = attempts.load(Ordering::Relaxed);
    wait_for(
        || attempts.load(Ordering::Relaxed) >= before + 40,
        "40 attempts to reach the peer",
    )
    .await;
    let took = started.elapsed();
    dropper.abort();
    assert!(
        took >= Duration::from_millis(1000),
        "40 attempts in {took:?}: the peer is retried without backoff"
    );
}

/// A write sent to a follower whose leader just stopped is not refused: the stopped leader did
/// nothing with it (its port is closed), so the follower sends it on to the leader elected
/// next, within what is left of the request timeout, and the client gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_outlives_the_leader_it_was_forwarded_to() {
    let dir = tempfile::tempdir().unwrap();
    // The write waits for the next leader within what is left of its request timeout. A minute
    // keeps this test about whether a leader is elected at all, not how fast on a loaded
    // machine: the two survivors of a new cluster's first leader used to elect none (a member
    // that had not learned its first entry committed refused its vote, `node/votes.rs`).
    let mut servers =
        start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |_, cfg| {
            cfg.request_timeout = std::time::Duration::from_secs(60)
        })
        .await;
    let leader = the_leader(&servers).node.id();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    let old = servers.remove(&leader).unwrap();
    let old_node = old.node.clone();
    // Its port closes first (once its server task has ended, its listener is gone); its Raft
    // core runs on, so the follower still names it.
    old.task.abort();
    while !old.task.is_finished() {
        tokio::task::yield_now().await;
    }
    drop(old);
    assert_eq!(servers[&follower].node.status().leader_id, Some(leader));
    let put = {
        let http = http_client();
        let url = format!("http://{}/v1/kv/after-the-leader", servers[&follower].addr);
        tokio::spawn(async move {
            let r = http
                .put(url)
                .bearer_auth(TOKEN)
                .body("\"x\"")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
    };
    // Then the leader stops, and the others elect a new one.
    old_node.shutdown().await.unwrap();
    let (status, text) = put.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let new = servers[&follower].node.status().leader_id;
    assert!(new.is_some() && new != Some(leader), "{new:?}");
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}

/// A write forwarded to a leader whose Raft core stopped (a storage failure stops it so, and
/// a stopping node closes its core before its port) while its HTTP server still answers is
/// refused there before it is proposed: the follower sends it on to the leader elected next,
/// and the client gets its answer. It used to get the stopped leader's 503 `unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_forwarded_to_a_leader_whose_core_stopped_goes_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |_, cfg| {
        cfg.request_timeout = std::time::Duration::from_secs(60)
    })
    .await;
    let leader = the_leader(&servers).node.id();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    servers[&leader].node.shutdown().await.unwrap();
    assert_eq!(servers[&follower].node.status().leader_id, Some(leader));
    let answer = put_kv(&servers[&follower], "after-the-core-stopped").await;
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let new = servers[&follower].node.status().leader_id;
    assert!(new.is_some() && new != Some(leader), "{new:?}");
    for (id, server) in &servers {
        if *id != leader {
            server.node.shutdown().await.unwrap();
        }
    }
}

/// Writes sent while a leader hands its leadership over (as it does before a planned stop) are
/// taken by the next leader. At the leader, its core refuses them while the hand-over runs
/// (they were replayed at the new leader before it had won its election, and refused with 503
/// `no_leader`); at a follower, one may arrive after it voted and before it hears from the new
/// leader (it knows no leader then, and refused them at once). Every write is answered 200,
/// and every one answered is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_sent_to_a_leader_that_hands_over_are_taken_by_the_next() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let leader = the_leader(&servers);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    // Two writers at each member.
    let addrs = servers.values().chain(servers.values());
    let writers = keep_writing(
        addrs.map(|s| s.addr.clone()).collect(),
        "hand-over/",
        &stop,
        &done,
    );
    wait_for(
        || done.load(Ordering::Relaxed) >= 20,
        "the writers to start",
    )
    .await;
    let new = hand_over(leader).await;
    // The writers go on past the hand-over, now forwarded to the new leader.
    let after = done.load(Ordering::Relaxed) + 30;
    wait_for(
        || done.load(Ordering::Relaxed) >= after,
        "writes after the hand-over",
    )
    .await;
    let refused = stop_writing(&stop, writers).await;
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
    let answered = done.load(Ordering::Relaxed);
    let list = http_client()
        .get(format!(
            "http://{}/v1/kv?prefix=hand-over/&limit=10000",
            servers[&new].addr
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let stored = list["keys"].as_array().expect("a key listing").len() as u64;
    assert_eq!(stored, answered, "{list}");
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}

/// A write forwarded to a leader that stopped answering (a paused process: its port takes
/// connections, nothing answers) is answered 504 `outcome_unknown` once the others elected a
/// new leader and the old one stayed silent for two election timeouts more, not after the
/// forwarding timeout (30 s, then 504 `timeout`): the old leader may have made it, so it is not
/// sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_to_a_leader_that_stopped_answering_is_answered_once_another_leads() {
    let dir = tempfile::tempdir().unwrap();
    // Elections slow enough that the follower still names the old leader when the write
    // arrives, and a request timeout that outlasts the forwarding timeout.
    let (mut servers, leader, follower) = slow_election_cluster(&dir, None).await;
    let port = servers.remove(&leader).unwrap().stop_keeping_port().await;
    port.stop_answering();
    assert_eq!(servers[&follower].node.status().leader_id, Some(leader));
    let put = put_kv(&servers[&follower], "to-a-paused-leader").await;
    let status = put.status().as_u16();
    let body: serde_json::Value = put.json().await.unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (504, Some("outcome_unknown")),
        "{body}"
    );
    let new = servers[&follower].node.status().leader_id;
    assert!(new.is_some() && new != Some(leader), "{new:?}");
    stop_all(servers).await;
    drop(port);
}
