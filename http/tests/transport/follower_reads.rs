//! Linearizable and lease reads at followers: answered with the leader's read index, replayed
//! at the leader, or answered by the leader when follower reads are off.

use std::time::Duration;

use meta_http::follower_read::CatchUp;
use serde_json::json;

use meta_consensus::Command;

use crate::helpers::{http_client, served, start_cluster_with, the_leader, Client, Server, TOKEN};

/// Linearizable and lease reads at a follower see every write acknowledged before them (each
/// read follows a write acknowledged by another member). With time to catch up and no backlog
/// limit, the follower answers them with the leader's read index: the leader answers read
/// indexes, not the reads. With no time, a follower that has not applied the index yet replays
/// the read with it; by default, one still applying replays it at once too. The reads are right
/// either way, and the followers count how each was answered. With follower reads off, the
/// leader answers the reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_answer_linearizable_reads_with_the_leaders_read_index() {
    let client = Client {
        http: http_client(),
    };
    let patient = CatchUp {
        wait: Duration::from_secs(10),
        max_backlog: u64::MAX,
    };
    let hasty = CatchUp {
        wait: Duration::ZERO,
        max_backlog: u64::MAX,
    };
    let arms = [
        Some(patient),
        Some(hasty),
        Some(meta_http::follower_read::CATCH_UP),
        None,
    ];
    for follower_reads in arms {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_cluster_with(&dir, follower_reads).await;
        let leader = servers[&1].node.status().leader_id.unwrap();
        let followers: Vec<&Server> = servers
            .iter()
            .filter(|(id, _)| **id != leader)
            .map(|(_, s)| s)
            .collect();
        let l = &servers[&leader];
        for i in 0..40u64 {
            // Written at the leader or through the other follower, read at this one.
            let (writer, reader) = match i % 3 {
                0 => (l, followers[0]),
                1 => (followers[1], followers[0]),
                _ => (followers[0], followers[1]),
            };
            let (status, v) = client
                .send(
                    reqwest::Method::PUT,
                    writer,
                    "/v1/kv/follower-read",
                    Some(json!({"value": i.to_string()})),
                )
                .await;
            assert_eq!(status, 200, "{v}");
            let consistency = if i % 2 == 0 { "linearizable" } else { "lease" };
            let (status, v) = client
                .send(
                    reqwest::Method::GET,
                    reader,
                    &format!("/v1/kv/follower-read?consistency={consistency}"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["value"], i.to_string(), "read {i} ({consistency}): {v}");
        }
        let read_indexes = served(&client, l, "POST", "/raft/read-index").await;
        let replayed = served(&client, l, "GET", "/v1/kv/{*key}").await;
        // What the followers counted: every read answered locally, replayed with the index or
        // replayed at once, as many replayed as the leader answered, and no more exchanges than
        // reads that asked for an index.
        let mut counted = [0u64; 4];
        for f in &followers {
            let metrics = client
                .send(reqwest::Method::GET, f, "/metrics", None)
                .await
                .1;
            let metrics = metrics.as_str().unwrap();
            for (i, name) in [
                "metaserver_follower_reads_total{outcome=\"local\"}",
                "metaserver_follower_reads_total{outcome=\"replayed\"}",
                "metaserver_follower_reads_total{outcome=\"behind\"}",
                "metaserver_read_index_exchanges_total",
            ]
            .iter()
            .enumerate()
            {
                counted[i] += metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} ")))
                    .map_or(0, |n| n.parse::<u64>().unwrap());
            }
        }
        let [local, with_index, behind, exchanges] = counted;
        match follower_reads {
            Some(catch_up) => {
                assert_eq!(local + with_index + behind, 40, "{counted:?}");
                assert_eq!(with_index + behind, replayed, "{counted:?}");
                assert!(exchanges <= local + with_index, "{counted:?}");
                assert_eq!(read_indexes > 0, exchanges > 0, "{counted:?}");
                if catch_up == patient {
                    assert_eq!(replayed, 0, "the leader answered reads sent to followers");
                }
                if catch_up.max_backlog == u64::MAX {
                    assert_eq!(behind, 0, "{counted:?}");
                }
                println!(
                    "{catch_up:?}: local, replayed with the index, at once, exchanges: {counted:?}"
                );
            }
            None => {
                assert_eq!(read_indexes, 0);
                assert_eq!(replayed, 40, "every read was replayed at the leader");
                assert_eq!(counted, [0, 0, 0, 0]);
            }
        }
        for server in servers.values() {
            server.node.shutdown().await.unwrap();
        }
    }
}

/// Sends `GET path` to `server` over a plain connection, so that the path reaches it exactly as
/// written (an HTTP client would resolve its `.` and `..` segments first), and returns the
/// status and the body.
async fn raw_get(server: &Server, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: \
         close\r\n\r\n",
        server.addr
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    if !chunked {
        return (status, body.to_string());
    }
    let (mut rest, mut text) = (body, String::new());
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            return (status, text);
        }
        text.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// A key with a `..` segment (written before the rule against them) read through a follower
/// that replays reads at the leader: the leader reads that key, not the one an HTTP client's
/// URL parser makes of the path (`a/%2E%2E/b` is `b` to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_read_keeps_the_dot_segments_of_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster_with(&dir, None).await;
    let leader = the_leader(&servers);
    let follower = servers.values().find(|s| s.addr != leader.addr).unwrap();
    for (key, value) in [("a/../b", "dotted"), ("b", "plain")] {
        leader
            .node
            .write(Command::Put {
                key: key.into(),
                value: value.as_bytes().to_vec(),
                if_revision: None,
            })
            .await
            .unwrap();
    }
    for path in ["/v1/kv/a/%2E%2E/b", "/v1/kv/a/../b"] {
        let (status, body) = raw_get(follower, path).await;
        assert_eq!((status, body.as_str()), (200, "dotted"), "{path}");
    }
    assert_eq!(raw_get(follower, "/v1/kv/b").await, (200, "plain".into()));
    let client = Client::new();
    // The leader routed and counted the replays as the reads they are.
    assert_eq!(served(&client, leader, "GET", "/v1/kv/{*key}").await, 3);
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}
