//! Datanodes and their shards: registration, epochs and fencing, replica sets, removal, and
//! shard listings that paginate.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common;
use crate::common::leader_node;

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
        json!({
            "datanodes":[{"id":7,"addr":"10.0.0.7:9000","epoch":epoch,"shards":0}],
            "next":null
        })
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

    // A former incarnation's deregistration is fenced, and a bad epoch refused: neither changes
    // anything.
    // (The first drop with an epoch raises the cluster's version to 5, which the digest counts.)
    let stale = format!("/v1/datanodes/7/shards/3?epoch={}", epoch - 1);
    let a = t.send(Method::DELETE, &stale, Body::empty()).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "fenced");
    let held = t.get("/v1/shards/3").await.json();
    assert_eq!(held["replicas"][0]["datanode"], 7, "{held}");
    assert_eq!(t.get("/v1/datanodes/7").await.json()["shards"], 3);
    let before = t.digest().await;
    for bad in ["epoch=x", "epoch=01", "epoch=1&other=2", "epoch=-1"] {
        let uri = format!("/v1/datanodes/7/shards/3?{bad}");
        let a = t.send(Method::DELETE, &uri, Body::empty()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {a:?}");
    }
    assert_eq!(t.digest().await, before);

    // Deregister one replica (its current incarnation); again is 404.
    let current = format!("/v1/datanodes/7/shards/3?epoch={epoch}");
    let a = t.send(Method::DELETE, &current, Body::empty()).await;
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
    assert_eq!(
        t.get("/v1/datanodes").await.json(),
        json!({"datanodes":[],"next":null})
    );
}

/// Follows `next` cursors until the end, returning the shard items in order.
async fn all_pages(t: &common::TestNode, path: &str, limit: u64) -> Vec<Value> {
    pages_of(t, path, "shards", limit).await
}

/// Follows `next` cursors until the end, returning the items of `field` in order.
async fn pages_of(t: &common::TestNode, path: &str, field: &str, limit: u64) -> Vec<Value> {
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
        let page = v[field].as_array().unwrap();
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
async fn the_datanode_listing_paginates() {
    let t = leader_node(None).await;
    // Ids on both sides of a byte boundary, registered out of order.
    let ids = [300u64, 2, 255, 1, 256, 9, 7];
    for id in ids {
        t.register_datanode(id).await;
    }
    let mut sorted = ids.to_vec();
    sorted.sort();
    for limit in [1, 2, 3, 7, 10] {
        let listed: Vec<u64> = pages_of(&t, "/v1/datanodes", "datanodes", limit)
            .await
            .iter()
            .map(|d| d["id"].as_u64().unwrap())
            .collect();
        assert_eq!(listed, sorted, "limit {limit}");
    }

    // A page that ends the listing says so, also when it is exactly full.
    let v = t.get("/v1/datanodes?limit=7").await.json();
    assert_eq!(v["datanodes"].as_array().unwrap().len(), 7);
    assert_eq!(v["next"], Value::Null);
    let v = t.get("/v1/datanodes?limit=6").await.json();
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let v = t.get(&format!("/v1/datanodes?after={next}")).await.json();
    assert_eq!(v["datanodes"][0]["id"], 300);
    assert_eq!(v["next"], Value::Null);

    // A cursor holds its place when the datanode it names is removed.
    let v = t.get("/v1/datanodes?limit=2").await.json();
    let next = v["next"].as_str().expect("a next cursor").to_owned();
    let a = t
        .send(Method::DELETE, "/v1/datanodes/2", String::new())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = t
        .get(&format!("/v1/datanodes?limit=2&after={next}"))
        .await
        .json();
    let ids: Vec<u64> = v["datanodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [7, 9]);
}
