//! The cluster's version over HTTP: the leader learns each member's build version from its
//! answers, a command the cluster cannot take yet is refused with 503 `cluster_version` (also
//! when a follower forwards it), and a learner whose build is older than the cluster is refused
//! with 409 `build_too_old`. A removal goes in pieces only once every member applies them, and
//! the cluster keeps an epoch floor only once every member does.

use std::collections::BTreeMap;

use meta_http::follower_read::CATCH_UP;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::common::wait_for;
use crate::helpers::{
    http_client, served_with, start_alone, start_cluster_tuned, start_tuned, the_leader, Client,
    Server, TOKEN,
};

/// Starts node `id` as a build of `build_version`.
async fn start(id: u64, dir: &TempDir, build_version: u32) -> Server {
    start_tuned(id, dir, Some(CATCH_UP), |cfg| {
        cfg.build_version = build_version
    })
    .await
}

/// Starts nodes 1 to 3 (of the given builds) as one cluster and waits until they agree on a
/// leader.
async fn start_cluster(dir: &TempDir, builds: [u32; 3]) -> BTreeMap<u64, Server> {
    start_cluster_tuned(dir, Some(CATCH_UP), |id, cfg| {
        cfg.build_version = builds[id as usize - 1]
    })
    .await
}

/// Waits until `leader` knows the build of each of members 1 to 3, `builds`.
async fn builds_known(leader: &Server, builds: [u32; 3]) {
    let want: BTreeMap<u64, Option<u32>> = (1..=3)
        .map(|id| (id, Some(builds[id as usize - 1])))
        .collect();
    wait_for(
        || leader.node.status().member_versions == want,
        "the leader knows every member's build",
    )
    .await;
}

/// The leader of `servers`, and one of its followers.
fn leader_and_follower(servers: &BTreeMap<u64, Server>) -> (&Server, &Server) {
    let leader = the_leader(servers);
    let follower = servers
        .values()
        .find(|s| s.node.id() != leader.node.id())
        .unwrap();
    (leader, follower)
}

/// Sends a request; answers the status, the `Retry-After` header and the JSON body.
async fn send(
    method: reqwest::Method,
    server: &Server,
    path: &str,
    body: Value,
) -> (u16, Option<String>, Value) {
    let mut request = http_client()
        .request(method, format!("http://{}{path}", server.addr))
        .bearer_auth(TOKEN);
    // Null sends no body: routes that take none refuse one.
    if !body.is_null() {
        request = request.body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, retry, json)
}

/// Registers datanode 7 at `server`; returns its epoch.
async fn register(server: &Server) -> u64 {
    let body = json!({"addr": "10.0.0.7:9000"});
    let (status, _, answer) = send(reqwest::Method::PUT, server, "/v1/datanodes/7", body).await;
    assert_eq!(status, 200, "{answer}");
    answer["epoch"].as_u64().unwrap()
}

async fn prune(server: &Server, epoch: u64) -> (u16, Option<String>, Value) {
    let body = json!({ "epoch": epoch });
    send(reqwest::Method::POST, server, "/v1/datanodes/7/prune", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_an_older_build_holds_new_commands_back() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir, [2, 2, 1]).await;
    let leader = the_leader(&servers);
    // The leader hears each member's build in its answers (its own build it knows).
    let want = BTreeMap::from([(1, Some(2)), (2, Some(2)), (3, Some(1))]);
    wait_for(
        || leader.node.status().member_versions == want,
        "the leader knows every member's build",
    )
    .await;
    // The status shows them too. A member whose answer came late (a loaded machine) counts as
    // not heard until it answers again, a heartbeat later: read until every build shows.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let cluster = loop {
        let (status, _, cluster) =
            send(reqwest::Method::GET, leader, "/v1/cluster", Value::Null).await;
        assert_eq!(status, 200, "{cluster}");
        if cluster["member_versions"] == json!({"1": 2, "2": 2, "3": 1}) {
            break cluster;
        }
        assert!(std::time::Instant::now() < deadline, "{cluster}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(cluster["cluster_version"], 1, "{cluster}");

    let epoch = register(leader).await;
    for server in servers.values() {
        // At the leader, and forwarded by a follower: the same refusal.
        let (status, retry, answer) = prune(server, epoch).await;
        assert_eq!(status, 503, "node {}: {answer}", server.node.id());
        assert_eq!(
            retry, None,
            "waiting does not upgrade node 3: no Retry-After"
        );
        assert_eq!(answer["error"]["code"], "cluster_version", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("node 3 runs a build of version 1"),
            "{message}"
        );
    }
    for server in servers.values() {
        assert_eq!(server.node.cluster_version(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_of_an_older_build_is_not_added() {
    let dir = tempfile::tempdir().unwrap();
    // A build of this version.
    let leader = start_alone(&dir).await;
    let epoch = register(&leader).await;
    let (status, _, answer) = prune(&leader, epoch).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(leader.node.cluster_version(), 2);

    let old = start(2, &dir, 1).await;
    let add = json!({"id": 2, "addr": old.addr});
    let learners = "/v1/cluster/learners";
    let (status, _, answer) = send(reqwest::Method::POST, &leader, learners, add).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "build_too_old", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("upgrade it first"),
        "the node refused: {message}"
    );
    assert!(leader.node.status().learners.is_empty());
    assert_eq!(
        old.node.cluster_id(),
        None,
        "the refused node took no cluster's id: once upgraded it may join any"
    );

    let current = start(3, &dir, 2).await;
    let add = json!({"id": 3, "addr": current.addr});
    let (status, _, answer) = send(reqwest::Method::POST, &leader, learners, add).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(leader.node.status().learners, vec![3]);
}

/// Registers datanode 7 at `leader` with 10,000 shards (three pieces of a removal), then,
/// once `leader` heard every member's build, removes it through `via`; answers the removal's
/// status and body. (A leader that did not hear a member recently, as on a loaded machine,
/// removes in one entry rather than wait: this test is about what the builds allow.)
async fn register_and_remove(leader: &Server, via: &Server) -> (u16, Value) {
    let epoch = register(leader).await;
    for chunk in 0..10u64 {
        let shards: Vec<Value> = (chunk * 1_000..(chunk + 1) * 1_000)
            .map(|id| json!({"id": id, "generation": 1, "size": 1}))
            .collect();
        let body = json!({"epoch": epoch, "shards": shards});
        let path = "/v1/datanodes/7/shards";
        let (status, _, answer) = send(reqwest::Method::POST, leader, path, body).await;
        assert_eq!(status, 200, "{answer}");
    }
    wait_for(
        || leader.node.member_versions().values().all(Option::is_some),
        "the leader heard every member's build",
    )
    .await;
    let (status, _, answer) =
        send(reqwest::Method::DELETE, via, "/v1/datanodes/7", Value::Null).await;
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_sent_to_a_follower_goes_in_pieces_once_every_member_applies_them() {
    for (builds, version) in [([3, 3, 2], 1), ([3, 3, 3], 3), ([4, 4, 4], 4)] {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_cluster(&dir, builds).await;
        let (leader, follower) = leader_and_follower(&servers);
        let (status, answer) = register_and_remove(leader, follower).await;
        assert_eq!(status, 200, "builds {builds:?}: {answer}");
        assert_eq!(answer["replicas_removed"], 10_000, "{answer}");
        let (status, _, answer) =
            send(reqwest::Method::GET, leader, "/v1/datanodes/7", Value::Null).await;
        assert_eq!(status, 404, "{answer}");
        // Read from each member's own state once it applied the removal: on a loaded machine
        // leadership may have moved, and a member that no longer leads answers reads by asking
        // the leader, before it applied as far itself.
        wait_for(
            || {
                servers
                    .values()
                    .all(|s| s.node.cluster_version() == version)
            },
            &format!("builds {builds:?}: every member at version {version}"),
        )
        .await;
        // Removed again: unknown.
        let (status, _, answer) = send(
            reqwest::Method::DELETE,
            follower,
            "/v1/datanodes/7",
            Value::Null,
        )
        .await;
        assert_eq!(status, 404, "{answer}");
    }
}

/// Raises the cluster's epoch floor to `at_least` through `server`.
async fn raise_floor(server: &Server, at_least: u64) -> (u16, Value) {
    let body = json!({ "at_least": at_least });
    let (status, _, answer) = send(
        reqwest::Method::PUT,
        server,
        "/v1/cluster/epoch-floor",
        body,
    )
    .await;
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epoch_floor_waits_for_every_member_and_then_holds_for_every_registration() {
    const FLOOR: u64 = 1 << 40;
    for builds in [[4, 4, 3], [4, 4, 4]] {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_cluster(&dir, builds).await;
        let (leader, follower) = leader_and_follower(&servers);
        builds_known(leader, builds).await;
        // Through a follower first, which has not applied the version yet: the request, not a
        // batch of commands (which a leader of an older build could not decode), goes to the
        // leader, and the leader raises the version, or refuses.
        let (status, answer) = raise_floor(follower, FLOOR).await;
        let replayed = served_with(
            &Client::new(),
            leader,
            "PUT",
            "/v1/cluster/epoch-floor",
            status,
        )
        .await;
        assert_eq!(replayed, 1, "the leader answered the request itself");
        if builds[2] < 4 {
            assert_eq!(status, 503, "{answer}");
            assert_eq!(answer["error"]["code"], "cluster_version", "{answer}");
            let (status, answer) = raise_floor(leader, FLOOR).await;
            assert_eq!(status, 503, "{answer}");
            // Nothing changed: registrations start at the log index.
            assert!(register(follower).await < FLOOR);
            assert_eq!(leader.node.cluster_version(), 1);
            assert_eq!(leader.node.status().epoch_floor, 0);
            continue;
        }
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer, json!({ "epoch_floor": FLOOR }));
        // A lower floor lowers nothing.
        let (status, answer) = raise_floor(leader, 5).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer, json!({ "epoch_floor": FLOOR }));
        assert_eq!(leader.node.cluster_version(), 4);
        // The status and the metrics show it (the leader applied the raise before it answered).
        let (_, _, cluster) = send(reqwest::Method::GET, leader, "/v1/cluster", Value::Null).await;
        assert_eq!(cluster["epoch_floor"], FLOOR, "{cluster}");
        let (_, _, metrics) = send(reqwest::Method::GET, leader, "/metrics", Value::Null).await;
        let gauge = format!("\nmetaserver_epoch_floor {FLOOR}\n");
        assert!(metrics.as_str().unwrap().contains(&gauge), "{metrics}");
        assert_eq!(register(follower).await, FLOOR);
        assert_eq!(register(leader).await, FLOOR + 1);
    }
}

/// A restore's marked claim, and its end, wait for every member to run a build of version 8: a
/// cluster with a member of build 7 refuses them (503 `cluster_version`, nothing written) and
/// still takes the plain claim; once every member runs it, the mark shows on every member until
/// the end removes it, both sent through a follower. A claim that holds keys back waits for
/// every member to run a build of version 9: with one of build 8 it is refused (503
/// `cluster_version`, nothing written), the marked claim goes on, a client's key write goes on
/// and the restore's own (`restore=true`) is refused; in a cluster of builds 9, a client's key
/// write is refused (503 `restoring`) and the restore's own goes on, until the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_mark_waits_for_every_member() {
    let marked = json!({
        "at_least": 1_000,
        "if_fresh": true,
        "restore": {"index": 9, "datanodes": 1, "replicas": 2, "keys": 3},
    });
    let mut held = marked.clone();
    held["hold_keys"] = json!(true);
    for builds in [[8, 8, 7], [9, 9, 8], [9, 9, 9]] {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_cluster(&dir, builds).await;
        let (leader, follower) = leader_and_follower(&servers);
        builds_known(leader, builds).await;
        let put = reqwest::Method::PUT;
        let delete = reqwest::Method::DELETE;
        let keys_wait = builds[2] >= 9;
        if !keys_wait {
            let (status, _, answer) = send(
                put.clone(),
                follower,
                "/v1/cluster/epoch-floor",
                held.clone(),
            )
            .await;
            assert_eq!(status, 503, "{answer}");
            assert_eq!(answer["error"]["code"], "cluster_version", "{answer}");
        }
        let claim = match keys_wait {
            true => held.clone(),
            false => marked.clone(),
        };
        let (status, _, answer) =
            send(put.clone(), follower, "/v1/cluster/epoch-floor", claim).await;
        if builds[2] < 8 {
            assert_eq!(status, 503, "{answer}");
            assert_eq!(answer["error"]["code"], "cluster_version", "{answer}");
            let (status, _, answer) =
                send(delete.clone(), follower, "/v1/cluster/restore", Value::Null).await;
            assert_eq!(status, 503, "{answer}");
            assert_eq!(leader.node.status().epoch_floor, 0);
            let plain = json!({"at_least": 1_000, "if_fresh": true});
            let (status, _, answer) =
                send(put.clone(), follower, "/v1/cluster/epoch-floor", plain).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(leader.node.status().restore, None);
            assert_eq!(leader.node.cluster_version(), 6);
            continue;
        }
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer, json!({ "epoch_floor": 1_000 }));
        let claimed_at = leader.node.status().restore.expect("marked").claimed_at;
        for server in servers.values() {
            wait_for(
                || {
                    server
                        .node
                        .status()
                        .restore
                        .is_some_and(|r| r.claimed_at == claimed_at && r.origin.keys == 3)
                },
                "every member shows the mark",
            )
            .await;
        }
        let client_put = |key: &'static str| send(put.clone(), follower, key, json!("client"));
        let restore_put = "/v1/kv/restored?restore=true";
        let (status, retry, answer) = client_put("/v1/kv/client").await;
        let (restored, _, restored_answer) =
            send(put.clone(), follower, restore_put, json!("restore")).await;
        if keys_wait {
            assert_eq!((status, retry.is_some()), (503, true), "{answer}");
            assert_eq!(answer["error"]["code"], "restoring", "{answer}");
            assert_eq!(restored, 200, "{restored_answer}");
            let (status, _, answer) = send(put.clone(), follower, restore_put, json!("2")).await;
            assert_eq!(status, 409, "{answer}");
            assert_eq!(answer["error"]["code"], "revision_mismatch", "{answer}");
        } else {
            assert_eq!(status, 200, "{answer}");
            assert_eq!(restored, 503, "{restored_answer}");
            assert_eq!(
                restored_answer["error"]["code"], "cluster_version",
                "{restored_answer}"
            );
        }
        let (status, _, answer) =
            send(delete.clone(), follower, "/v1/cluster/restore", Value::Null).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["ended"]["claimed_at"], claimed_at, "{answer}");
        assert_eq!(answer["ended"]["backup"]["replicas"], 2, "{answer}");
        for server in servers.values() {
            wait_for(
                || server.node.status().restore.is_none(),
                "no member shows the mark",
            )
            .await;
        }
        assert_eq!(leader.node.cluster_version(), builds[2].min(9));
        if keys_wait {
            let (status, _, answer) = client_put("/v1/kv/client").await;
            assert_eq!(status, 200, "{answer}");
            let (status, _, answer) = send(put.clone(), follower, restore_put, json!("3")).await;
            assert_eq!(status, 409, "{answer}");
            assert_eq!(answer["error"]["code"], "conflict", "{answer}");
            assert!(
                answer["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("no restore is under way"),
                "{answer}"
            );
        }
    }
}
