//! A leader short of disk hands its leadership to a voter with room, so that writes go on:
//! node 1 here never has enough (its reserve is all the disk there is), the others do.

use reqwest::Method;
use serde_json::json;
use tempfile::TempDir;

use crate::common::wait_for;
use crate::helpers::{start_cluster_tuned, stop_all, Client};

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
    // Node 1 is made the leader (it may lead already, or have handed over already): it hands
    // the leadership on by itself.
    let (status, v) = client
        .send(
            Method::PUT,
            &servers[&2],
            "/v1/cluster/leader",
            Some(json!({"id": 1})),
        )
        .await;
    assert_eq!((status, &v["leader"]), (200, &json!(1)), "{v}");
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
