//! A leader short of disk hands its leadership to a voter with room, so that writes go on:
//! node 1 here never has enough (its reserve is all the disk there is), the others do.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use meta_consensus::FreeSpace;
use reqwest::Method;
use serde_json::json;
use tempfile::TempDir;

use crate::common::wait_for;
use crate::helpers::{
    hand_over, start_cluster_looking_rarely, start_cluster_tuned, stop_all, the_leader, Client,
    Server,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_short_of_disk_hands_over_to_a_voter_with_room() {
    let dir = TempDir::new().unwrap();
    let servers = start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |id, cfg| {
        if id == 1 {
            cfg.min_free_bytes = u64::MAX;
        }
    })
    .await;
    let client = Client::new();
    // Asked through the API, node 1 is refused the leadership: it is short of disk.
    let (status, v) = client
        .send(
            Method::PUT,
            &servers[&2],
            "/v1/cluster/leader",
            Some(json!({"id": 1})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("short of disk"),
        "{v}"
    );
    // Made the leader all the same (as an election may make it), or leading from the start,
    // it hands the leadership on by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(std::time::Instant::now() < deadline, "node 1 never led");
        let Some(leader) = servers[&2].node.status().leader_id else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        if leader == 1 {
            break;
        }
        if let Ok((1, _)) = servers[&leader].node.transfer_leadership(1).await {
            break;
        }
    }
    wait_for(
        || {
            let leader = servers[&1].node.status().leader_id;
            leader.is_some_and(|l| l != 1)
                && servers
                    .values()
                    .all(|s| s.node.status().leader_id == leader)
        },
        "a voter with room leads",
    )
    .await;
    // Writes sent to node 1 go on to the new leader, which takes them.
    let (status, v) = client
        .send(Method::PUT, &servers[&1], "/v1/kv/k", Some(json!("v")))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = client
        .send(Method::GET, &servers[&1], "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["min_free_bytes"], u64::MAX, "{v}");
    assert!(v["data_dir_free_bytes"].is_u64(), "{v}");
    stop_all(servers).await;
}

/// Voters short of disk that leave no majority with room stop writes, however much room the
/// leader has (507 naming them), deletes too: followers cannot refuse what the leader commits,
/// and those writes would fill their disks and stop them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_short_of_disk_stop_the_writes_that_would_fill_them() {
    let dir = TempDir::new().unwrap();
    let servers = start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |id, cfg| {
        if id != 1 {
            cfg.min_free_bytes = u64::MAX;
        }
    })
    .await;
    let client = Client::new();
    // Node 1 leads once the others hand it their leadership (they are short themselves), and
    // refuses once its look found them short.
    write_until(
        &client,
        &servers[&1],
        507,
        "voters [2, 3] are short of disk",
    )
    .await;
    assert_eq!(servers[&1].node.status().leader_id, Some(1));
    // Deletes too: they are written to the short voters' logs and registries.
    let (status, v) = client
        .send(Method::DELETE, &servers[&1], "/v1/kv/k", None)
        .await;
    assert_eq!(status, 507, "{v}");
    stop_all(servers).await;
}

/// A voter that is down counts as one without room: a write commits only with a majority, so
/// with one voter of three down and another short of disk, the short one's disk would take
/// every write until it stopped, and the cluster with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_voter_that_a_quorum_needs_is_not_filled_while_another_is_down() {
    let dir = TempDir::new().unwrap();
    let mut servers =
        start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |id, cfg| {
            if id == 2 {
                cfg.min_free_bytes = u64::MAX;
            }
        })
        .await;
    let client = Client::new();
    // Node 1 leads (node 2, short, would hand its leadership on).
    make_node_1_lead(&servers).await;
    // With node 2 short only, a majority (1 and 3) has room: writes go on.
    let (status, v) = client
        .send(Method::PUT, &servers[&1], "/v1/kv/k", Some(json!("v")))
        .await;
    assert_eq!(status, 200, "{v}");
    servers.remove(&3).unwrap().stop().await;
    write_until(&client, &servers[&1], 507, "voters [2, 3]").await;
    stop_all(servers).await;
}

/// Has node 1 lead, asking whoever leads to hand over, for at most 20 s.
async fn make_node_1_lead(servers: &BTreeMap<u64, Server>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while servers[&1].node.status().leader_id != Some(1) {
        assert!(std::time::Instant::now() < deadline, "node 1 never led");
        if let Some(leader) = servers[&1].node.status().leader_id {
            let _ = servers[&leader].node.transfer_leadership(1).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Sends writes to `server` until one is answered `status` with a message containing
/// `contains`, for at most 20 s.
async fn write_until(client: &Client, server: &Server, status: u16, contains: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (answered, v) = client
            .send(Method::PUT, server, "/v1/kv/k", Some(json!("v")))
            .await;
        let message = v["error"]["message"].as_str().unwrap_or_default();
        if answered == status && message.contains(contains) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no write answered {status} ({contains}): the last {answered} {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Voters that go short of disk between two of the leader's disk looks tell it themselves: the
/// writes that would fill them stop at once, not at the next look (here the leader looks only
/// when its role, leader or membership changes), and resume once the voters say they have
/// room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_that_go_short_of_disk_tell_the_leader_at_once() {
    let dir = TempDir::new().unwrap();
    let free = Arc::new(AtomicU64::new(u64::MAX));
    let servers = start_cluster_looking_rarely(&dir, |id, cfg| {
        if id != 1 {
            let free = free.clone();
            cfg.free_space = FreeSpace::with(move |_| Ok(free.load(Ordering::Relaxed)));
            cfg.min_free_bytes = 1 << 30;
        }
    })
    .await;
    let client = Client::new();
    make_node_1_lead(&servers).await;
    write_until(&client, &servers[&1], 200, "").await;
    free.store(0, Ordering::Relaxed);
    write_until(
        &client,
        &servers[&1],
        507,
        "voters [2, 3] are short of disk",
    )
    .await;
    assert_eq!(servers[&1].node.status().leader_id, Some(1));
    free.store(u64::MAX, Ordering::Relaxed);
    write_until(&client, &servers[&1], 200, "").await;
    stop_all(servers).await;
}

/// A node that began a planned stop says so (`stopping` in `GET /v1/cluster`), and takes no
/// leadership: a leader short of disk that the stopping one had handed over to gave the
/// leadership back to it, and the cluster had no leader for an election timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_takes_no_leadership() {
    let dir = TempDir::new().unwrap();
    let servers =
        start_cluster_tuned(&dir, Some(meta_http::follower_read::CATCH_UP), |_, _| {}).await;
    let client = Client::new();
    let old = the_leader(&servers).node.id();
    let new = hand_over(&servers[&old]).await;
    let (status, v) = client
        .send(Method::GET, &servers[&old], "/v1/cluster", None)
        .await;
    assert_eq!((status, &v["stopping"]), (200, &json!(true)), "{v}");
    let (_, v) = client
        .send(Method::GET, &servers[&new], "/v1/cluster", None)
        .await;
    assert!(v.get("stopping").is_none(), "{v}");
    let (status, v) = client
        .send(
            Method::PUT,
            &servers[&new],
            "/v1/cluster/leader",
            Some(json!({ "id": old })),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is stopping"),
        "{v}"
    );
    stop_all(servers).await;
}

/// A leadership move to a voter the leader has not heard from for the election timeout (here
/// stopped with its port taking connections nobody answers, as a paused process's) is refused
/// at once, before the leader asks it for its room: that question waited for its timeout, and
/// the move was refused after two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_a_paused_voter_is_refused_before_its_room_is_asked() {
    let dir = TempDir::new().unwrap();
    let mut servers = crate::helpers::start_cluster(&dir).await;
    let leader = the_leader(&servers).node.id();
    let to = servers.keys().copied().find(|id| *id != leader).unwrap();
    let paused = servers.remove(&to).unwrap().stop_keeping_port().await;
    paused.stop_answering();
    let node = servers[&leader].node.clone();
    let lease = node.config().election_timeout();
    wait_for(
        || {
            let heard = node
                .status()
                .replication
                .iter()
                .find(|r| r.node == to)
                .and_then(|r| r.heard_ms);
            heard.is_some_and(|ms| u128::from(ms) > lease.as_millis())
        },
        "the leader stops hearing from the paused voter",
    )
    .await;
    let started = std::time::Instant::now();
    let (status, v) = Client::new()
        .send(
            Method::PUT,
            &servers[&leader],
            "/v1/cluster/leader",
            Some(json!({ "id": to })),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(status, 409, "{v}");
    assert!(
        took < std::time::Duration::from_secs(1),
        "refused after {took:?}: {v}"
    );
    drop(paused);
    stop_all(servers).await;
}
