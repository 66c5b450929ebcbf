//! A three-node cluster over HTTP: writes and reads at followers are forwarded, replication
//! streams, a new learner catches up by snapshot, and values of the largest size commit.

use std::time::{Duration, Instant};

use meta_consensus::Role;
use serde_json::{json, Value};

use crate::common::{wait_for, DEADLINE};
use crate::helpers::{http_client, start, start_cluster, Client, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let leader = servers[&1].node.status().leader_id.unwrap();
    let followers: Vec<u64> = servers.keys().copied().filter(|id| *id != leader).collect();
    let client = Client {
        http: http_client(),
    };

    // A write at a follower is forwarded to the leader.
    let f1 = &servers[&followers[0]];
    let f2 = &servers[&followers[1]];
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            f1,
            "/v1/datanodes/5",
            Some(json!({"addr": "10.0.0.5:9000"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let epoch = v["epoch"].as_u64().unwrap();
    for batch in 0..2u64 {
        let shards: Vec<Value> = (0..10_000u64)
            .map(|i| json!({"id": batch * 10_000 + i, "generation": 1, "size": i}))
            .collect();
        let (status, v) = client
            .send(
                reqwest::Method::POST,
                f2,
                "/v1/datanodes/5/shards",
                Some(json!({"epoch": epoch, "shards": shards})),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["accepted"], 10_000);
    }
    // Concurrent writes at a follower share forwarded batches; each gets its own answer.
    let writes = (0..30u64).map(|i| {
        let shards: Vec<Value> = (0..=i)
            .map(|j| json!({"id": 100_000 + i * 100 + j, "generation": 1, "size": 1}))
            .collect();
        let (client, f1) = (&client, f1);
        async move {
            client
                .send(
                    reqwest::Method::POST,
                    f1,
                    "/v1/datanodes/5/shards",
                    Some(json!({"epoch": epoch, "shards": shards})),
                )
                .await
        }
    });
    for (i, (status, v)) in futures::future::join_all(writes)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["accepted"], i + 1, "write {i}: {v}");
    }
    let expected_shards = 20_000 + (1..=30).sum::<u64>();
    // A linearizable read at a follower sees the writes.
    let (status, v) = client
        .send(reqwest::Method::GET, f1, "/v1/shards/19999", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["replicas"][0]["datanode"], 5);
    let (status, v) = client
        .send(reqwest::Method::GET, f2, "/v1/datanodes/5", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["shards"], expected_shards);

    // Replication ran over streamed exchanges, not one request per AppendEntries.
    for f in [f1, f2] {
        let (status, metrics) = client.send(reqwest::Method::GET, f, "/metrics", None).await;
        assert_eq!(status, 200);
        let metrics = metrics.as_str().expect("metrics are text");
        let streamed = "metaserver_http_requests_total{route=\"/raft/append-stream\",method=\"POST\",status=\"200\"}";
        assert!(metrics.contains(streamed), "{metrics}");
        assert!(!metrics.contains("route=\"/raft/append\""), "{metrics}");
    }
    // The writes sent to a follower reached the leader in forwarded batches.
    let (_, metrics) = client
        .send(reqwest::Method::GET, &servers[&leader], "/metrics", None)
        .await;
    let batches = "metaserver_http_requests_total{route=\"/raft/forward-commands\",method=\"POST\",status=\"200\"}";
    assert!(metrics.as_str().unwrap().contains(batches), "{metrics}");

    // The leader snapshots and purges its log; a new learner must catch up by snapshot.
    let l = &servers[&leader];
    let (status, v) = client
        .send(reqwest::Method::POST, l, "/v1/cluster/snapshot", None)
        .await;
    assert_eq!(status, 200, "{v}");
    let snapshot_index = v["index"].as_u64().unwrap();
    wait_for(
        || l.node.status().purged >= Some(snapshot_index),
        "the leader purges its log up to the snapshot",
    )
    .await;

    let learner = &start(4, &dir).await;
    let (status, v) = client
        .send(
            reqwest::Method::POST,
            &servers[&followers[0]],
            "/v1/cluster/learners",
            Some(json!({"id": 4, "addr": learner.addr})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["learners"], json!([4]));

    let target = l.node.status().applied;
    wait_for(
        || learner.node.status().applied >= target,
        "the learner catches up",
    )
    .await;
    assert!(
        learner.node.status().state_machine.snapshot_installs >= 1,
        "the learner caught up by snapshot"
    );
    let deadline = Instant::now() + DEADLINE;
    loop {
        let want = l.node.registry_digest().await.unwrap();
        let got = learner.node.registry_digest().await.unwrap();
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "learner registry {got:?} != {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(learner.node.status().role, Role::Learner);

    // Wrong token on the Raft routes: refused, the cluster is unaffected.
    let response = client
        .http
        .post(format!("http://{}/raft/vote", l.addr))
        .bearer_auth("wrong")
        .body(vec![1u8])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(l.node.status().role, Role::Leader);

    for server in servers.values().chain([learner]) {
        server.node.shutdown().await.unwrap();
    }
}

/// Values of the largest allowed size commit over the HTTP transport: an AppendEntries carrying
/// one is not timed out for its size, so it is not resent forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn largest_values_commit_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let client = http_client();
    let value = vec![b'v'; meta_http::limits::MAX_VALUE_BYTES];
    for i in 0..3 {
        // Sent to node 1: forwarded when it does not lead. A 503 (no leader for a moment on a
        // starved machine) is retried, as clients are told to; anything else must be 200.
        let deadline = Instant::now() + DEADLINE;
        loop {
            let response = client
                .put(format!("http://{}/v1/kv/big/{i}", servers[&1].addr))
                .bearer_auth(TOKEN)
                .body(value.clone())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            if status == 503 && Instant::now() < deadline {
                // Back off briefly before retrying, as the Retry-After answer asks.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(status, 200, "write {i}: {text}");
            break;
        }
    }
    wait_for(
        || servers[&1].node.status().leader_id.is_some(),
        "a leader with a quorum",
    )
    .await;
    let leader = servers[&1].node.status().leader_id.unwrap();
    let target = servers[&leader].node.status().applied;
    wait_for(
        || servers.values().all(|s| s.node.status().applied >= target),
        "every node applies the large values",
    )
    .await;
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}
