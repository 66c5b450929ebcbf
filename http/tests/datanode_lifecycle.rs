//! A datanode's life as the registry sees it: a full report after a restart, ended by a prune;
//! heartbeats, and the leader's liveness report.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::{leader_node, leader_node_tuned, TestNode};
use serde_json::{json, Value};

/// A datanode that restarts reports every replica it holds under its new epoch, then prunes:
/// what it no longer holds is gone, what it reported stays, other datanodes are untouched.
#[tokio::test]
async fn a_full_report_ends_with_a_prune() {
    let t = leader_node(None).await;
    let register = |datanode: u64, epoch: u64, ids: &[u64]| {
        let shards: Vec<_> = ids
            .iter()
            .map(|&id| json!({"id": id, "generation": 1, "size": 10}))
            .collect();
        (
            format!("/v1/datanodes/{datanode}/shards"),
            json!({"epoch": epoch, "shards": shards}).to_string(),
        )
    };
    let old = t.register_datanode(7).await;
    let other = t.register_datanode(8).await;
    for (path, body) in [register(7, old, &[1, 2, 3]), register(8, other, &[2])] {
        let a = t.send(Method::POST, &path, body).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }

    // The restart: a new incarnation that holds 1 and 4 only.
    let epoch = t.register_datanode(7).await;
    let (path, body) = register(7, epoch, &[1, 4]);
    let a = t.send(Method::POST, &path, body).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // Datanode 8's report is complete: its prune drops nothing. Being the cluster's first
    // prune, it raises the cluster's version, so the refused prune below changes nothing at all.
    let a = t
        .send(
            Method::POST,
            "/v1/datanodes/8/prune",
            json!({"epoch": other}).to_string(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["removed"], 0);
    // The former incarnation cannot prune.
    let before = t.digest().await;
    let a = t
        .send(
            Method::POST,
            "/v1/datanodes/7/prune",
            json!({"epoch": old}).to_string(),
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "fenced");
    assert_eq!(t.digest().await, before);

    let prune = json!({"epoch": epoch}).to_string();
    let a = t
        .send(Method::POST, "/v1/datanodes/7/prune", prune.clone())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["removed"], 2);
    let index = a.json()["index"].as_u64().unwrap();
    assert!(index > epoch);
    let held: Vec<u64> = t.get("/v1/datanodes/7/shards").await.json()["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_u64().unwrap())
        .collect();
    assert_eq!(held, [1, 4]);
    // A later page of an unknown datanode is 404, as its first page is, not an empty end.
    let next = t.get("/v1/datanodes/7/shards?limit=1").await.json()["next"].clone();
    let next = next.as_str().expect("a cursor");
    let a = t.get(&format!("/v1/datanodes/7/shards?after={next}")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t
        .get(&format!("/v1/datanodes/99/shards?after={next}"))
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    assert_eq!(t.get("/v1/datanodes/7").await.json()["shards"], 2);
    assert_eq!(
        t.get("/v1/shards/2").await.json(),
        json!({"id":2,"replicas":[{"datanode":8,"generation":1,"size":10}]})
    );
    assert_eq!(t.get("/v1/shards/3").await.status, StatusCode::NOT_FOUND);
    // The watch names what went.
    let a = t
        .get(&format!("/v1/watch?after={}&wait_ms=0", index - 1))
        .await;
    assert_eq!(
        a.json()["events"],
        json!([{"index": index, "kind": "replicas_removed", "datanode": 7, "shards": [2, 3]}])
    );
    // Pruning again drops nothing.
    let a = t.send(Method::POST, "/v1/datanodes/7/prune", prune).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["removed"], 0);
}

/// The liveness report's entry for datanode `id`.
fn entry(v: &Value, id: u64) -> Value {
    v["datanodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The ids of the datanodes a page of `/v1/liveness` lists, in order.
fn listed_ids(v: &Value) -> Vec<u64> {
    v["datanodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

async fn heartbeat(t: &TestNode, id: u64, epoch: u64) -> common::Answer {
    let body = json!({ "epoch": epoch }).to_string();
    t.send(Method::POST, &format!("/v1/datanodes/{id}/heartbeat"), body)
        .await
}

/// Heartbeats make a datanode's current incarnation alive (with a timeout no test run outlasts),
/// a former incarnation's heartbeat is fenced and counts for nothing, and a removed datanode
/// leaves the report.
#[tokio::test]
async fn heartbeats_and_liveness() {
    let t = leader_node_tuned(None, |c| c.datanode_timeout = Duration::from_secs(600)).await;
    let old = t.register_datanode(7).await;
    let epoch = t.register_datanode(7).await;
    t.register_datanode(8).await;

    let a = heartbeat(&t, 7, epoch).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json(), json!({"timeout_ms": 600_000}));
    let v = t.get("/v1/liveness").await.json();
    assert_eq!(v["leader_id"], 1);
    assert_eq!(v["timeout_ms"], 600_000);
    let d7 = entry(&v, 7);
    assert_eq!(d7["state"], "alive", "{v}");
    assert_eq!(d7["epoch"], epoch, "{v}");
    assert!(d7["heard_ms_ago"].is_u64(), "{v}");
    // Never heard, by a leader that has listened for less than the timeout.
    assert_eq!(entry(&v, 8)["state"], "unknown", "{v}");
    assert!(entry(&v, 8)["heard_ms_ago"].is_null(), "{v}");
    let metrics = String::from_utf8(t.get("/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("\nmetaserver_datanodes_alive 1\n"),
        "{metrics}"
    );
    // One state only.
    let ids = |v: Value| listed_ids(&v);
    assert_eq!(ids(t.get("/v1/liveness?state=alive").await.json()), [7]);
    assert_eq!(ids(t.get("/v1/liveness?state=unknown").await.json()), [8]);
    assert!(ids(t.get("/v1/liveness?state=down").await.json()).is_empty());

    // Pages by id, within the state asked for: the cursor is a datanode listing's.
    for id in [3, 12, 9] {
        t.register_datanode(id).await;
    }
    let v = t.get("/v1/liveness?limit=2").await.json();
    assert_eq!(ids(v.clone()), [3, 7]);
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let v = t
        .get(&format!("/v1/liveness?limit=2&after={next}"))
        .await
        .json();
    assert_eq!(ids(v.clone()), [8, 9]);
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let v = t.get(&format!("/v1/liveness?after={next}")).await.json();
    assert_eq!((ids(v.clone()), &v["next"]), (vec![12], &Value::Null));
    let v = t.get("/v1/liveness?state=unknown&limit=3").await.json();
    assert_eq!(
        (ids(v.clone()), &v["next"]),
        (vec![3, 8, 9], &json!("0000000000000009"))
    );
    let v = t.get("/v1/datanodes?limit=1").await.json();
    let next = v["next"].as_str().unwrap().to_owned();
    let v = t
        .get(&format!("/v1/liveness?after={next}&state=alive"))
        .await
        .json();
    assert_eq!((ids(v.clone()), &v["next"]), (vec![7], &Value::Null));
    for bad in ["0000000000000009x", "000000000000000A", "9"] {
        let a = t.get(&format!("/v1/liveness?after={bad}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(a.error_code(), "invalid_cursor", "{bad}");
    }
    for id in [3, 12, 9] {
        let a = t
            .send(
                Method::DELETE,
                &format!("/v1/datanodes/{id}"),
                String::new(),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }

    // The former incarnation is fenced; an unknown datanode is 404.
    let a = heartbeat(&t, 7, old).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "fenced");
    let a = heartbeat(&t, 99, epoch).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    assert_eq!(a.error_code(), "not_found");

    // Registered again: the former incarnation's heartbeats no longer count.
    let newer = t.register_datanode(7).await;
    let d7 = entry(&t.get("/v1/liveness").await.json(), 7);
    assert_eq!(d7["state"], "unknown", "{d7}");
    assert!(d7["heard_ms_ago"].is_null(), "{d7}");
    let a = heartbeat(&t, 7, newer).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let d7 = entry(&t.get("/v1/liveness").await.json(), 7);
    assert_eq!(d7["state"], "alive", "{d7}");

    // Removed: gone from the report.
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = t.get("/v1/liveness").await.json();
    assert_eq!(v["datanodes"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(entry(&v, 7), Value::Null);
}

/// A removed datanode no longer counts alive in the leader's metrics at once, not only once a
/// liveness read or its timeout came: a cluster whose datanodes come and go counted hundreds
/// of removed ones alive, which hid as many down (`registry - alive` alerts).
#[tokio::test]
async fn a_removed_datanode_no_longer_counts_alive() {
    let t = leader_node_tuned(None, |c| c.datanode_timeout = Duration::from_secs(600)).await;
    let alive = |n: u64| format!("\nmetaserver_datanodes_alive {n}\n");
    for id in [7, 8] {
        let epoch = t.register_datanode(id).await;
        let a = heartbeat(&t, id, epoch).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let metrics = String::from_utf8(t.get("/metrics").await.body.to_vec()).unwrap();
    assert!(metrics.contains(&alive(2)), "{metrics}");
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7", String::new())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let metrics = String::from_utf8(t.get("/metrics").await.body.to_vec()).unwrap();
    assert!(metrics.contains(&alive(1)), "{metrics}");
}

/// With a short timeout, a datanode that fell silent and one never heard from both end up
/// down (polled until they are, each poll reading the leader's view afresh).
#[tokio::test]
async fn silent_datanodes_go_down() {
    let t = leader_node_tuned(None, |c| c.datanode_timeout = Duration::from_millis(300)).await;
    let epoch = t.register_datanode(7).await;
    t.register_datanode(8).await;
    let a = heartbeat(&t, 7, epoch).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        let v = t.get("/v1/liveness").await.json();
        let (d7, d8) = (entry(&v, 7), entry(&v, 8));
        if d7["state"] == "down" && d8["state"] == "down" {
            let down = t.get("/v1/liveness?state=down").await.json();
            assert_eq!(down["datanodes"].as_array().unwrap().len(), 2, "{down}");
            // Down once silent for more than the timeout; the answer's ms are truncated.
            assert!(d7["heard_ms_ago"].as_u64().unwrap() >= 300, "{v}");
            assert!(d8["heard_ms_ago"].is_null(), "{v}");
            assert!(v["collecting_ms"].as_u64().unwrap() >= 300, "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "never down: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = String::from_utf8(t.get("/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("\nmetaserver_datanodes_alive 0\n"),
        "{metrics}"
    );
}

/// A removal cut off after its first piece (its request timed out, its leader crashed) leaves
/// the datanode marked as being removed: its view says so, and no batch, prune or heartbeat is
/// taken under any epoch, the one the removal raised it to included (a datanode that read it
/// there was revived under an epoch no registration gave, and a second removal then dropped
/// what it had been told was registered). Removing it again ends the removal; registering it
/// again keeps it.
#[tokio::test]
async fn a_datanode_being_removed_takes_no_request_under_any_epoch() {
    let t = leader_node(None).await;
    for id in [7, 8] {
        let epoch = t.register_datanode(id).await;
        let shards: Vec<_> = (0..5_000)
            .map(|s| json!({"id": s, "generation": 1, "size": 10}))
            .collect();
        let body = json!({"epoch": epoch, "shards": shards}).to_string();
        let a = t
            .send(Method::POST, &format!("/v1/datanodes/{id}/shards"), body)
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        // The removal's first piece only, as a removal whose request was cut off leaves it.
        t.node
            .write(meta_consensus::Command::RemoveDatanode { id })
            .await
            .unwrap();
        let view = t.get(&format!("/v1/datanodes/{id}")).await.json();
        assert_eq!(view["removing"], true, "{view}");
        let raised = view["epoch"].as_u64().unwrap();
        assert_eq!(raised, epoch + 1, "{view}");
        for epoch in [epoch, raised] {
            let batch =
                json!({"epoch": epoch, "shards": [{"id": 99_999, "generation": 1, "size": 1}]});
            let answers = [
                heartbeat(&t, id, epoch).await,
                t.send(
                    Method::POST,
                    &format!("/v1/datanodes/{id}/shards"),
                    batch.to_string(),
                )
                .await,
                t.send(
                    Method::POST,
                    &format!("/v1/datanodes/{id}/prune"),
                    json!({ "epoch": epoch }).to_string(),
                )
                .await,
            ];
            for a in answers {
                assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
                assert_eq!(a.error_code(), "fenced", "{a:?}");
                assert!(a.error_message().contains("being removed"), "{a:?}");
            }
        }
        assert_eq!(
            t.get("/v1/shards/99999").await.status,
            StatusCode::NOT_FOUND
        );
        let listed = t.get("/v1/datanodes").await.json();
        assert_eq!(entry(&listed, id)["removing"], true, "{listed}");
        let liveness = t.get("/v1/liveness").await.json();
        assert_eq!(entry(&liveness, id)["removing"], true, "{liveness}");
    }
    // Removed again: gone. Registered again: kept, and no longer marked.
    let a = t
        .send(Method::DELETE, "/v1/datanodes/7", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(t.get("/v1/datanodes/7").await.status, StatusCode::NOT_FOUND);
    let epoch = t.register_datanode(8).await;
    let view = t.get("/v1/datanodes/8").await.json();
    assert!(view.get("removing").is_none(), "{view}");
    assert_eq!(heartbeat(&t, 8, epoch).await.status, StatusCode::OK);
}

/// A page of the liveness report that asks for one state reads the registry a chunk at a time
/// until it is full: the pages of a state that few datanodes are in, each spread over more
/// than one chunk (1,024 datanodes), list each such datanode once, in order, and the last page
/// says no more follow.
#[tokio::test]
async fn liveness_pages_of_one_state_span_the_registry() {
    let t = leader_node_tuned(None, |c| c.datanode_timeout = Duration::from_secs(600)).await;
    let mut alive = Vec::new();
    for id in 1..=1_100 {
        let epoch = t.register_datanode(id).await;
        if [5, 1_030, 1_100].contains(&id) {
            assert_eq!(heartbeat(&t, id, epoch).await.status, StatusCode::OK);
            alive.push(id);
        }
    }
    let ids = listed_ids;
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/liveness?state=alive&limit=2&after={a}"),
            None => "/v1/liveness?state=alive&limit=2".to_owned(),
        };
        let v = t.get(&path).await.json();
        listed.extend(ids(&v));
        pages += 1;
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "{v}");
    }
    assert_eq!(listed, alive);
    assert_eq!(pages, 2, "3 alive datanodes: 2 + 1, and no empty page");
    // Without a state: the page is the registry's page.
    let v = t
        .get("/v1/liveness?limit=2&after=00000000000003ff")
        .await
        .json();
    assert_eq!(ids(&v), [1_024, 1_025]);
    assert_eq!(v["next"], "0000000000000401");
    let v = t.get("/v1/liveness?after=0000000000000440").await.json();
    assert_eq!(ids(&v), (1_089..=1_100).collect::<Vec<u64>>());
    assert!(v["next"].is_null(), "{v}");
}
