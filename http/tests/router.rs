//! Every route of the router, and every error status, against a real single-node `MetaNode`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::{call, leader_node, open_node, test_config, wait_for};
use meta_consensus::transport::LocalRouter;
use meta_consensus::{Command, MetaNode, Node, Role};
use meta_http::{AppState, Token};
use serde_json::{json, Value};

#[tokio::test]
async fn probes_and_metrics() {
    let t = leader_node(None).await;
    let a = t.get("/healthz").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json(), json!({"status":"ok"}));
    let a = t.get("/readyz").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");

    t.register_datanode(3).await;
    let a = t.get("/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    for metric in [
        "metaserver_http_requests_total{route=\"/v1/datanodes/{id}\",method=\"PUT\",status=\"200\"} 1",
        "metaserver_http_request_duration_seconds_bucket",
        "metaserver_wal_appends_total",
        "metaserver_wal_barriers_total",
        "metaserver_wal_records_per_barrier",
        "metaserver_wal_barrier_seconds_bucket{le=\"+Inf\"}",
        "metaserver_raft_term 1",
        "metaserver_raft_leader 1",
        "metaserver_raft_is_leader 1",
        "metaserver_raft_commit_index",
        "metaserver_raft_applied_index",
        "metaserver_snapshot_builds_total",
        "metaserver_snapshot_build_failures_total 0",
        "metaserver_watches_waiting 0",
        "metaserver_snapshot_throttle_pauses_total",
        "metaserver_registry_datanodes 1",
        "metaserver_registry_replicas 0",
    ] {
        assert!(text.contains(metric), "missing {metric} in:\n{text}");
    }
}

#[tokio::test]
async fn readyz_waits_for_a_cluster() {
    let t = open_node(None).await;
    let a = t.get("/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.error_code(), "not_ready");
    assert!(a.headers.contains_key("retry-after"));
    assert_eq!(t.get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn datanodes_and_shards() {
    let t = leader_node(None).await;
    let epoch = t.register_datanode(7).await;
    assert!(epoch > 0);

    // A new registration is a new epoch.
    let again = t.register_datanode(7).await;
    assert!(again > epoch);
    let epoch = again;

    let a = t.get("/v1/datanodes").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json(),
        json!({"datanodes":[{"id":7,"addr":"10.0.0.7:9000","epoch":epoch,"shards":0}]})
    );
    for consistency in ["local", "lease", "linearizable"] {
        let a = t
            .get(&format!("/v1/datanodes/7?consistency={consistency}"))
            .await;
        assert_eq!(
            a.json(),
            json!({"id":7,"addr":"10.0.0.7:9000","epoch":epoch,"shards":0}),
            "{consistency}"
        );
    }
    let a = t.get("/v1/datanodes/8").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");

    // Register a batch.
    let body = json!({"epoch": epoch, "shards": [
        {"id": 1, "generation": 1, "size": 100},
        {"id": 2, "generation": 5, "size": 200},
        {"id": 3, "generation": 1, "size": 300},
    ]});
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = a.json();
    assert_eq!(v["accepted"], 3);
    assert_eq!(v["unchanged"], 0);
    assert_eq!(v["stale"], json!([]));
    assert!(v["index"].as_u64().unwrap() > epoch);

    // Idempotent re-registration, and a stale generation.
    let body = json!({"epoch": epoch, "shards": [
        {"id": 1, "generation": 1, "size": 100},
        {"id": 2, "generation": 4, "size": 200},
    ]});
    let v = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await
        .json();
    assert_eq!(
        (v["accepted"].clone(), v["unchanged"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(v["stale"], json!([2]));

    // Fenced: a former epoch.
    let before = t.digest().await;
    let body = json!({"epoch": epoch - 1, "shards": [{"id": 9, "generation": 1, "size": 1}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error_code(), "fenced");
    assert_eq!(t.digest().await, before);

    // Unknown datanode.
    let body = json!({"epoch": 1, "shards": [{"id": 9, "generation": 1, "size": 1}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/99/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");
    assert_eq!(t.digest().await, before);

    // One shard's replica set.
    let a = t.get("/v1/shards/2").await;
    assert_eq!(
        a.json(),
        json!({"id":2,"replicas":[{"datanode":7,"generation":5,"size":200}]})
    );
    let a = t.get("/v1/shards/42").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");

    // The datanode's count follows.
    assert_eq!(t.get("/v1/datanodes/7").await.json()["shards"], 3);

    // Deregister one replica; again is 404.
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7/shards/3", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["removed"], 1);
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7/shards/3", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");

    // Remove the datanode with its replicas; again is 404.
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["replicas_removed"], 2);
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    // A replica of a datanode that is not registered: 404 too.
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7/shards/1", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    assert_eq!(a.error_code(), "not_found");
    assert_eq!(t.get("/v1/shards/1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(t.get("/v1/datanodes").await.json(), json!({"datanodes":[]}));
}

/// Follows `next` cursors until the end, returning the shard items in order.
async fn all_pages(t: &common::TestNode, path: &str, limit: u64) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let uri = match &after {
            Some(c) => format!("{path}?limit={limit}&after={c}"),
            None => format!("{path}?limit={limit}"),
        };
        let a = t.get(&uri).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        let v = a.json();
        let page = v["shards"].as_array().unwrap();
        assert!(page.len() as u64 <= limit);
        items.extend(page.iter().cloned());
        match v["next"].as_str() {
            Some(c) => after = Some(c.to_owned()),
            None => return items,
        }
    }
    panic!("pagination did not end");
}

#[tokio::test]
async fn shard_listings_paginate() {
    let t = leader_node(None).await;
    for dn in [1u64, 2] {
        let epoch = t.register_datanode(dn).await;
        let shards: Vec<Value> = (0..25u64)
            .map(|i| json!({"id": i * 2 + dn, "generation": 1, "size": i}))
            .collect();
        let a = t
            .send(
                Method::POST,
                &format!("/v1/datanodes/{dn}/shards"),
                json!({"epoch": epoch, "shards": shards}).to_string(),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let all = all_pages(&t, "/v1/shards", 7).await;
    assert_eq!(all.len(), 50);
    let keys: Vec<(u64, u64)> = all
        .iter()
        .map(|v| (v["id"].as_u64().unwrap(), v["datanode"].as_u64().unwrap()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "in order, no repeats");

    let mine = all_pages(&t, "/v1/datanodes/2/shards", 10).await;
    assert_eq!(mine.len(), 25);
    assert!(mine.iter().all(|v| v["datanode"] == 2));

    // Default limit covers everything here; the last page says null.
    let v = t.get("/v1/shards").await.json();
    assert_eq!(v["shards"].as_array().unwrap().len(), 50);
    assert_eq!(v["next"], Value::Null);

    // A registered datanode without shards lists nothing; an unknown one is 404.
    t.register_datanode(3).await;
    let v = t.get("/v1/datanodes/3/shards").await.json();
    assert_eq!(v, json!({"shards":[],"next":null}));
    let a = t.get("/v1/datanodes/4/shards").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn key_value() {
    let t = leader_node(None).await;
    // Create only if absent.
    let a = t
        .send(Method::PUT, "/v1/kv/config/replication?if_revision=0", "3")
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let rev = a.json()["revision"].as_u64().unwrap();
    let a = t
        .send(Method::PUT, "/v1/kv/config/replication?if_revision=0", "4")
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error_code(), "revision_mismatch");
    assert_eq!(a.headers["x-revision"], rev.to_string().as_str());

    let a = t.get("/v1/kv/config/replication").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(&a.body[..], b"3");
    assert_eq!(a.headers["x-revision"], rev.to_string().as_str());
    assert_eq!(a.headers["content-type"], "application/octet-stream");

    // Compare-and-swap on the current revision; binary values round-trip.
    let a = t
        .send(
            Method::PUT,
            &format!("/v1/kv/config/replication?if_revision={rev}"),
            vec![0u8, 159, 146, 150, 255],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let rev2 = a.json()["revision"].as_u64().unwrap();
    assert!(rev2 > rev);
    assert_eq!(
        &t.get("/v1/kv/config/replication?consistency=local")
            .await
            .body[..],
        &[0u8, 159, 146, 150, 255]
    );

    // Percent-encoded keys, unconditional puts, listing by prefix.
    for key in ["config/a", "config/b%20c", "other"] {
        let a = t.send(Method::PUT, &format!("/v1/kv/{key}"), "x").await;
        assert_eq!(a.status, StatusCode::OK, "{key}: {a:?}");
    }
    let v = t.get("/v1/kv?prefix=config/").await.json();
    let keys: Vec<&str> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["config/a", "config/b c", "config/replication"]);
    assert_eq!(v["next"], Value::Null);
    let v = t.get("/v1/kv?prefix=config/&limit=2").await.json();
    assert_eq!(v["keys"].as_array().unwrap().len(), 2);
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let v = t
        .get(&format!("/v1/kv?prefix=config/&limit=2&after={next}"))
        .await
        .json();
    assert_eq!(v["keys"][0]["key"], "config/replication");

    // Listings page past the longest keys: their cursors are accepted back.
    let long: Vec<String> = ["a", "b"]
        .iter()
        .map(|c| format!("long/{}", c.repeat(1019)))
        .collect();
    for key in &long {
        let a = t.send(Method::PUT, &format!("/v1/kv/{key}"), "x").await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let v = t.get("/v1/kv?prefix=long/&limit=1").await.json();
    assert_eq!(v["keys"][0]["key"], long[0].as_str());
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let a = t
        .get(&format!("/v1/kv?prefix=long/&limit=1&after={next}"))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["keys"][0]["key"], long[1].as_str());

    // Delete with a wrong revision, then right; then it is gone.
    let a = t
        .send(
            Method::DELETE,
            "/v1/kv/config/replication?if_revision=1",
            Body::empty(),
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error_code(), "revision_mismatch");
    let a = t
        .send(
            Method::DELETE,
            &format!("/v1/kv/config/replication?if_revision={rev2}"),
            Body::empty(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.get("/v1/kv/config/replication").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");
    let a = t
        .send(Method::DELETE, "/v1/kv/config/replication", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cluster_membership_and_config() {
    let t = leader_node(None).await;
    let v = t.get("/v1/cluster").await.json();
    assert_eq!(v["id"], 1);
    assert_eq!(v["role"], "leader");
    assert_eq!(v["leader_id"], 1);
    assert_eq!(v["leader_addr"], "127.0.0.1:1");
    assert_eq!(v["voters"], json!([1]));
    assert_eq!(v["learners"], json!([]));
    assert!(v["term"].as_u64().unwrap() >= 1);
    assert!(v["committed"].as_u64().unwrap() >= 1);
    for field in [
        "last_log_index",
        "applied",
        "wal",
        "snapshot",
        "datanodes",
        "replicas",
    ] {
        assert!(v.get(field).is_some(), "{field} missing: {v}");
    }
    assert!(v["wal"]["appends_per_barrier"].is_number());
    assert_eq!(v["purged"], 0, "a fresh log has purged nothing");

    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error_code(), "already_initialized");

    // A learner that is never reachable still joins the membership.
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/learners",
            r#"{"id":4,"addr":"127.0.0.1:9"}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["learners"], json!([4]));
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1]}"#)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["voters"], json!([1]));
    // A voter that is not a learner is refused.
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1,5]}"#)
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    assert_eq!(t.get("/v1/cluster").await.json()["voters"], json!([1]));
    // So is promoting the unreachable learner: it would leave the cluster without a quorum.
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1,4]}"#)
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "conflict");
    let v = t.get("/v1/cluster").await.json();
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1]), &json!([4])));
    let a = t.send(Method::PUT, "/v1/kv/still-writable", "x").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // A learner again at its address is a no-op; at another address, or a voter, a conflict.
    for (body, status) in [
        (r#"{"id":4,"addr":"127.0.0.1:9"}"#, StatusCode::OK),
        (r#"{"id":4,"addr":"127.0.0.1:10"}"#, StatusCode::CONFLICT),
        (r#"{"id":1,"addr":"127.0.0.1:11"}"#, StatusCode::CONFLICT),
    ] {
        let a = t.send(Method::POST, "/v1/cluster/learners", body).await;
        assert_eq!(a.status, status, "{body}: {a:?}");
    }
    // Learners can be removed; voters and strangers cannot.
    for (id, status) in [
        (1, StatusCode::CONFLICT),
        (4, StatusCode::OK),
        (4, StatusCode::NOT_FOUND),
    ] {
        let a = t
            .send(
                Method::DELETE,
                &format!("/v1/cluster/learners/{id}"),
                Body::empty(),
            )
            .await;
        assert_eq!(a.status, status, "remove {id}: {a:?}");
    }
    let v = t.get("/v1/cluster").await.json();
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1]), &json!([])));

    let a = t.get("/v1/config").await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":0}));
    let a = t
        .send(
            Method::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":1048576}"#,
        )
        .await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":1048576}));
    assert_eq!(t.node.snapshot_rate(), 1_048_576);
    let a = t.send(Method::PATCH, "/v1/config", "{}").await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":1048576}));
}

#[tokio::test]
async fn init_on_a_fresh_node() {
    let t = open_node(None).await;
    let a = t.get("/v1/cluster").await;
    assert_eq!(a.json()["role"], "uninitialized", "{a:?}");
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json(), json!({"voters":[1],"learners":[]}));
    wait_for(|| t.node.status().role == Role::Leader, "leader").await;
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn snapshots_build_and_download() {
    let t = leader_node(None).await;
    let a = t.get("/v1/cluster/snapshot").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");

    let epoch = t.register_datanode(1).await;
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    t.send(Method::POST, "/v1/datanodes/1/shards", body.to_string())
        .await;
    let a = t
        .send(Method::POST, "/v1/cluster/snapshot", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = a.json();
    let index = v["index"].as_u64().unwrap();
    assert!(index >= 3, "{v}");
    assert!(v["bytes"].as_u64().unwrap() > 0);

    let a = t.get("/v1/cluster/snapshot").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/octet-stream");
    let file = t.node.newest_snapshot_file().unwrap();
    assert_eq!(&a.body[..], &std::fs::read(file).unwrap()[..]);
    assert_eq!(
        t.get("/v1/cluster").await.json()["snapshot"]["index"],
        index
    );
}

#[tokio::test]
async fn wrong_method_and_unknown_route() {
    let t = leader_node(None).await;
    for (method, uri) in [
        (Method::POST, "/v1/shards"),
        (Method::DELETE, "/v1/cluster"),
        (Method::GET, "/v1/cluster/init"),
        (Method::PATCH, "/v1/datanodes/1"),
        (Method::POST, "/v1/kv/a"),
        (Method::GET, "/raft/vote"),
        (Method::POST, "/healthz"),
    ] {
        let a = t.send(method.clone(), uri, Body::empty()).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert_eq!(a.error_code(), "method_not_allowed");
    }
    for uri in ["/", "/v2/shards", "/v1/datanodes/1/other"] {
        let a = t.get(uri).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(a.error_code(), "not_found");
    }
}

#[tokio::test]
async fn no_leader_answers_503_with_retry_after() {
    // A node that was never initialized knows no leader.
    let t = open_node(None).await;
    let before = t.digest().await;
    let a = t
        .send(Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#)
        .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    assert_eq!(a.headers["retry-after"], "1");
    // It says why: it belongs to no cluster.
    let message = a.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("not a member"), "{message}");
    let a = t.get("/v1/datanodes").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    // A local read is answered from this node's state.
    assert_eq!(
        t.get("/v1/datanodes?consistency=local").await.status,
        StatusCode::OK
    );
    assert_eq!(t.digest().await, before);
}

#[tokio::test]
async fn raft_routes_refuse_garbage() {
    let t = leader_node(None).await;
    for path in [
        "/raft/append",
        "/raft/vote",
        "/raft/pre-vote",
        "/raft/transfer-leader",
        "/raft/snapshot",
    ] {
        let a = t.send(Method::POST, path, vec![1u8, 2, 3]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(a.error_code(), "bad_rpc", "{path}");
    }
    // A message larger than its route takes is refused before its body is read, and the
    // connection is not kept (the rest of the body is never read).
    let huge = (64 * 1024 + 1).to_string();
    for path in [
        "/raft/vote",
        "/raft/pre-vote",
        "/raft/transfer-leader",
        "/raft/removed",
        "/raft/identity",
        "/raft/read-index",
    ] {
        let a = call(&t.app, Method::POST, path, "", &[("content-length", &huge)]).await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {a:?}");
        assert_eq!(a.error_code(), "body_too_large", "{path}");
        assert_eq!(a.headers["connection"], "close", "{path}");
    }
    assert_eq!(t.node.status().role, Role::Leader);
}

/// A Raft message past the bounds of terms and indexes is refused, whoever sent it: a vote
/// request of term u64::MAX (with `leadership_transfer`, which skips the leader's lease) was
/// granted and persisted, and the node's Raft core then panicked at every start.
#[tokio::test]
async fn raft_messages_past_the_largest_term_are_refused() {
    use meta_consensus::{codec, TypeConfig, Vote};
    use openraft::raft::VoteRequest;

    let t = leader_node(None).await;
    let before = t.node.status();
    let mut rpc = VoteRequest::<TypeConfig>::new(Vote::new(u64::MAX, 99), None);
    rpc.leadership_transfer = true;
    let body = codec::encode(&rpc).unwrap();
    for path in ["/raft/vote", "/raft/pre-vote"] {
        let a = t.send(Method::POST, path, body.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}: {a:?}");
        assert_eq!(a.error_code(), "bad_rpc", "{path}");
    }
    let after = t.node.status();
    assert_eq!((after.role, after.term), (Role::Leader, before.term));
}

#[tokio::test]
async fn token_is_required_except_for_probes() {
    let t = leader_node(Some("s3cret")).await;
    let before = t.digest().await;
    for (method, uri, body) in [
        (Method::GET, "/v1/cluster", ""),
        (Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#),
        (Method::GET, "/v1/shards", ""),
        (Method::PUT, "/v1/kv/a", "x"),
        (Method::POST, "/raft/vote", ""),
        (Method::POST, "/raft/append", ""),
    ] {
        for headers in [
            vec![],
            vec![("authorization", "Bearer wrong")],
            vec![("authorization", "Bearer s3cret2")],
            vec![("authorization", "s3cret")],
            vec![("authorization", "Basic s3cret")],
        ] {
            let a = call(&t.app, method.clone(), uri, body.to_owned(), &headers).await;
            assert_eq!(
                a.status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {headers:?}"
            );
            assert_eq!(a.error_code(), "unauthorized");
            assert!(a.headers.contains_key("www-authenticate"), "{a:?}");
        }
    }
    assert_eq!(t.digest().await, before);
    for uri in ["/healthz", "/readyz", "/metrics"] {
        let a = t.get(uri).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
    }
    let auth = [("authorization", "Bearer s3cret")];
    let a = call(&t.app, Method::GET, "/v1/cluster", "", &auth).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = call(
        &t.app,
        Method::PUT,
        "/v1/datanodes/1",
        r#"{"addr":"10.0.0.1:1"}"#,
        &auth,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
}

/// Three in-process nodes with short request timeouts; returns them and the leader's id.
async fn three_nodes(dir: &std::path::Path) -> (LocalRouter, BTreeMap<u64, MetaNode>, u64) {
    let router = LocalRouter::new();
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let mut cfg = test_config(id, &format!("127.0.0.1:{id}"), &dir.join(id.to_string()));
        cfg.request_timeout = Duration::from_millis(300);
        let node = MetaNode::open(cfg, router.network(id)).await.unwrap();
        router.register(node.clone());
        nodes.insert(id, node);
    }
    let members = (1..=3u64)
        .map(|id| (id, Node::new(format!("127.0.0.1:{id}"))))
        .collect();
    nodes[&1].initialize(members).await.unwrap();
    wait_for(
        || {
            let leader = nodes[&1].status().leader_id;
            leader.is_some() && nodes.values().all(|n| n.status().leader_id == leader)
        },
        "all three agree on a leader",
    )
    .await;
    let leader = nodes[&1].status().leader_id.unwrap();
    (router, nodes, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_once_and_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let (router, nodes, leader) = three_nodes(dir.path()).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let app = meta_http::router(AppState::new(nodes[&follower].clone(), Token::new(None)));

    // A request another member already forwarded is not forwarded again.
    let a = call(
        &app,
        Method::PUT,
        "/v1/datanodes/1",
        r#"{"addr":"10.0.0.1:1"}"#,
        &[("x-metaserver-forwarded-by", "3")],
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");

    // A leader cut off from both followers cannot commit: 504 within its request timeout, or
    // 503 no_leader if a starved machine let its lease lapse first (it then refuses to
    // propose at all); nothing is acknowledged either way.
    let leader_app = meta_http::router(AppState::new(nodes[&leader].clone(), Token::new(None)));
    router.isolate(leader);
    let before = nodes[&follower].registry_digest().await.unwrap();
    let a = call(&leader_app, Method::PUT, "/v1/kv/k", "v", &[]).await;
    let refused = (a.status, a.error_code());
    assert!(
        refused == (StatusCode::GATEWAY_TIMEOUT, "timeout".to_string())
            || refused == (StatusCode::SERVICE_UNAVAILABLE, "no_leader".to_string()),
        "{a:?}"
    );
    // Nothing reached the followers.
    assert_eq!(nodes[&follower].registry_digest().await.unwrap(), before);
    router.heal_all();
    for node in nodes.values() {
        node.shutdown().await.unwrap();
    }
}

/// A read that a member replays with the leader's read index (a follower that did not catch up
/// in time) is answered by the receiver from its own registry once it applied that index, even
/// by a follower, which would otherwise refuse a replayed read; an index it never reaches ends
/// in 504 within the request timeout, and an index that does not parse counts as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_replayed_with_a_read_index_is_answered_once_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, nodes, leader) = three_nodes(dir.path()).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let app = meta_http::router(AppState::new(nodes[&follower].clone(), Token::new(None)));
    let written = nodes[&leader]
        .write(Command::Put {
            key: "k".into(),
            value: b"v1".to_vec(),
            if_revision: None,
        })
        .await
        .unwrap();
    let forwarded = ("x-metaserver-forwarded-by", "3");
    // In-process members carry no cluster id; over HTTP the first message gives them one.
    nodes[&follower].accept_cluster(0xab).await.unwrap();
    let member = ("x-metaserver-cluster", "00000000000000ab");
    // The write was acknowledged by a quorum that may not include this follower; with the
    // 300 ms request timeout, waiting for it inside the request fails on a loaded machine.
    nodes[&follower]
        .wait_applied(written.index, common::DEADLINE)
        .await
        .unwrap();

    let index = written.index.to_string();
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", &index)],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(&a.body[..], b"v1");

    // Only a member's replay is trusted with a read index: without the cluster's id (which
    // clients never see) the headers are a client's claim, and the read is not answered here.
    for claim in [
        vec![forwarded, ("x-metaserver-read-index", index.as_str())],
        vec![
            forwarded,
            ("x-metaserver-cluster", "00000000000000cd"),
            ("x-metaserver-read-index", index.as_str()),
        ],
    ] {
        let a = call(&app, Method::GET, "/v1/kv/k", "", &claim).await;
        assert_eq!(
            a.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{claim:?}: {a:?}"
        );
    }

    let a = call(&app, Method::GET, "/v1/kv/k", "", &[forwarded]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", "soon")],
    )
    .await;
    assert_eq!(a.error_code(), "no_leader", "{a:?}");

    let beyond = (written.index + 1_000).to_string();
    let a = call(
        &app,
        Method::GET,
        "/v1/kv/k",
        "",
        &[forwarded, member, ("x-metaserver-read-index", &beyond)],
    )
    .await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{a:?}");
    for node in nodes.values() {
        node.shutdown().await.unwrap();
    }
}

/// A body that stalls part way is answered 408 once the body timeout passes, and the
/// connection is not kept; a declared length over the limit is refused before any byte is
/// read. Neither changes anything.
#[tokio::test]
async fn stalled_and_oversized_bodies_are_refused() {
    use futures::StreamExt as _;

    let t = leader_node(None).await;
    let app = meta_http::router(
        AppState::new(t.node.clone(), Token::new(None))
            .with_body_timeout(Duration::from_millis(300)),
    );
    let stalled = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
        b"{\"addr\"",
    ))])
    .chain(futures::stream::pending());
    let a = tokio::time::timeout(
        Duration::from_secs(20),
        call(
            &app,
            Method::PUT,
            "/v1/datanodes/7",
            Body::from_stream(stalled),
            &[("content-length", "100")],
        ),
    )
    .await
    .expect("a stalled body is answered");
    assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{a:?}");
    assert_eq!(a.error_code(), "body_timeout");
    assert_eq!(a.headers["connection"], "close");

    // Declared far over the limit, with no body at all: answered at once.
    let a = tokio::time::timeout(
        Duration::from_secs(20),
        call(
            &app,
            Method::GET,
            "/v1/cluster",
            Body::from_stream(futures::stream::pending::<
                Result<bytes::Bytes, std::io::Error>,
            >()),
            &[("content-length", "99999999999")],
        ),
    )
    .await
    .expect("an oversized body is answered");
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
    assert_eq!(a.error_code(), "body_too_large");
    assert_eq!(t.get("/v1/datanodes").await.json(), json!({"datanodes":[]}));
}
