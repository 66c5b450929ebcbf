//! `GET /v1/watch` against a real single-node `MetaNode`: the starting index, the events of
//! every kind with their JSON shape, filters, paging, a long poll woken by a write, the
//! compacted answer, and a stopping node answering its waiting watches.

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{leader_node, leader_node_tuned};
use serde_json::{json, Value};

/// The index a watch without `after` answers.
async fn start(t: &common::TestNode) -> u64 {
    let a = t.get("/v1/watch").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = a.json();
    assert_eq!(v["events"], json!([]));
    v["index"].as_u64().unwrap()
}

/// The events of a watch answer, without their indexes.
fn changes(v: &Value) -> Vec<Value> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("index");
            e
        })
        .collect()
}

/// Sends `GET uri` on its own task: a watch that may wait.
fn watch_in_background(
    t: &common::TestNode,
    uri: String,
) -> tokio::task::JoinHandle<common::Answer> {
    let app = t.app.clone();
    tokio::spawn(async move { common::call(&app, Method::GET, &uri, "", &[]).await })
}

#[tokio::test]
async fn reports_every_kind_of_change_with_filters_and_pages() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let epoch = t.register_datanode(7).await;
    let body = json!({"epoch": epoch, "shards": [
        {"id": 1, "generation": 1, "size": 10}, {"id": 2, "generation": 1, "size": 10}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The same again changes nothing, and reports nothing.
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.json()["unchanged"], 2);
    let a = t.send(Method::DELETE, "/v1/datanodes/7/shards/2", "").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.send(Method::PUT, "/v1/kv/cfg/a", "1").await;
    let revision = a.json()["revision"].as_u64().unwrap();
    t.send(Method::DELETE, "/v1/kv/cfg/a", "").await;
    t.send(Method::DELETE, "/v1/datanodes/7", "").await;

    let a = t.get(&format!("/v1/watch?after={from}&wait_ms=0")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let all = a.json();
    assert_eq!(
        changes(&all),
        vec![
            json!({"kind":"datanode_registered","datanode":7,"addr":"10.0.0.7:9000","epoch":epoch}),
            json!({"kind":"replicas_registered","datanode":7,"shards":[1,2]}),
            json!({"kind":"replicas_removed","datanode":7,"shards":[2]}),
            json!({"kind":"kv_put","key":"cfg/a"}),
            json!({"kind":"kv_deleted","key":"cfg/a"}),
            json!({"kind":"datanode_removed","datanode":7,"replicas_removed":1}),
        ]
    );
    assert_eq!(all["events"][0]["index"], epoch);
    assert_eq!(all["events"][3]["index"], revision);
    let last = all["index"].as_u64().unwrap();
    assert!(last >= all["events"][5]["index"].as_u64().unwrap());

    let a = t
        .get(&format!("/v1/watch?after={from}&wait_ms=0&prefix=cfg/"))
        .await;
    assert_eq!(changes(&a.json()).len(), 2, "{a:?}");
    assert_eq!(a.json()["index"], last);
    let a = t
        .get(&format!(
            "/v1/watch?after={from}&wait_ms=0&datanode=7&consistency=local"
        ))
        .await;
    assert_eq!(changes(&a.json()).len(), 4, "{a:?}");

    // Pages of two, each going on from the last.
    let mut seen = Vec::new();
    let mut at = from;
    loop {
        let a = t
            .get(&format!("/v1/watch?after={at}&wait_ms=0&limit=2"))
            .await;
        let v = a.json();
        if v["events"].as_array().unwrap().is_empty() {
            assert_eq!(v["index"].as_u64().unwrap(), last);
            break;
        }
        seen.extend(changes(&v));
        at = v["index"].as_u64().unwrap();
    }
    assert_eq!(seen, changes(&all));
}

#[tokio::test]
async fn a_waiting_watch_answers_the_write_that_wakes_it() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let waiting = watch_in_background(&t, format!("/v1/watch?after={from}&prefix=k"));
    // Written before or after the watch began to wait, it is in the answer.
    let a = t.send(Method::PUT, "/v1/kv/k1", "v").await;
    let revision = a.json()["revision"].as_u64().unwrap();
    let a = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch did not wake on the write")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(
        a.json()["events"],
        json!([{"index": revision, "kind":"kv_put","key":"k1"}])
    );
}

#[tokio::test]
async fn a_watch_with_nothing_new_answers_at_its_wait_with_the_index_reached() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    // A change the filter leaves out moves the index on.
    t.send(Method::PUT, "/v1/kv/other", "v").await;
    let a = t
        .get(&format!("/v1/watch?after={from}&prefix=cfg/&wait_ms=50"))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["events"], json!([]));
    assert!(a.json()["index"].as_u64().unwrap() > from);
}

#[tokio::test]
async fn an_index_from_before_the_history_kept_is_gone() {
    // A history of two units: a registration of one shard (two units) pushes out the rest.
    let t = leader_node_tuned(None, |cfg| cfg.watch_history = 2).await;
    let from = start(&t).await;
    let epoch = t.register_datanode(1).await;
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/1/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.get(&format!("/v1/watch?after={from}")).await;
    assert_eq!(a.status, StatusCode::GONE, "{a:?}");
    assert_eq!(a.error_code(), "compacted");
    let message = a.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("watch from the index"), "{message}");
    // From the floor on, the rest is there.
    let a = t
        .get(&format!(
            "/v1/watch?after={}&wait_ms=0",
            t.node.watch_floor()
        ))
        .await;
    assert_eq!(
        changes(&a.json()),
        vec![json!({"kind":"replicas_registered","datanode":1,"shards":[1]})]
    );
}

#[tokio::test]
async fn a_stopping_node_answers_its_waiting_watches_at_once() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let waiting = watch_in_background(&t, format!("/v1/watch?after={from}&wait_ms=55000"));
    // Whether the watch waits yet or not, closing answers it.
    t.node.begin_close();
    let a = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("a closing node kept a watch waiting")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["events"], json!([]));
}
