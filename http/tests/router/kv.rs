//! The key-value routes.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::Value;

use crate::common::leader_node;

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
    // A key no write can make says so.
    for a in [
        t.get("/v1/kv/x/%2E%2E/y").await,
        t.send(Method::DELETE, "/v1/kv/x/%2E", Body::empty()).await,
    ] {
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
        assert!(a.error_message().contains("so no write makes it"), "{a:?}");
    }
}

/// A key's reads and writes name the history its revision counts in, and a write that gives
/// it back is refused (410, nothing written) when the cluster's is another: a cluster restored
/// from a backup counts revisions again, and an old revision could match a rolled-back value.
#[tokio::test]
async fn a_write_with_another_history_is_refused() {
    let t = leader_node(None).await;
    let a = t.send(Method::PUT, "/v1/kv/k?if_revision=0", "1").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let history = a.json()["history"].as_str().unwrap().to_owned();
    let rev = a.json()["revision"].as_u64().unwrap();
    let watch = t.get("/v1/watch?wait_ms=0").await.json();
    assert_eq!(watch["history"], history.as_str(), "the watch's history");
    let a = t.get("/v1/kv/k").await;
    assert_eq!(a.headers["x-history"], history.as_str());
    assert_eq!(
        t.get("/v1/kv?prefix=").await.json()["history"],
        history.as_str()
    );

    let other = if history == "0000000000000000" {
        "0000000000000001"
    } else {
        "0000000000000000"
    };
    for (method, body) in [(Method::PUT, "2"), (Method::DELETE, "")] {
        let path = format!("/v1/kv/k?if_revision={rev}&history={other}");
        let a = t.send(method.clone(), &path, body).await;
        assert_eq!(a.status, StatusCode::GONE, "{a:?}");
        assert_eq!(a.error_code(), "compacted");
        assert!(a.error_message().contains("read the key again"), "{a:?}");
    }
    let a = t.get("/v1/kv/k").await;
    assert_eq!(
        (&a.body[..], a.headers["x-revision"].to_str().unwrap()),
        (&b"1"[..], rev.to_string().as_str())
    );
    let a = t.send(Method::PUT, "/v1/kv/k?history=ABC", "2").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    // Its own history: the compare-and-swap goes on as without it.
    let path = format!("/v1/kv/k?if_revision={rev}&history={history}");
    let a = t.send(Method::PUT, &path, "2").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.send(Method::DELETE, &path, Body::empty()).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
}

/// Large answers that wait to be read hold a budget of memory: past it, a large answer is
/// refused 503 `overloaded` (the client asks again), and once the first was read, the next
/// passes.
#[tokio::test]
async fn large_answers_past_the_budget_wait_for_one_to_be_read() {
    use tower::ServiceExt;
    let t = leader_node(None).await;
    // 120 keys of about 1,000 bytes: a listing of about 120 KB.
    for i in 0..120 {
        let key = format!("big/{i:03}{}", "k".repeat(990));
        let a = t.send(Method::PUT, &format!("/v1/kv/{key}"), "v").await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let state = meta_http::AppState::new(t.node.clone(), meta_http::Token::new(None));
    let app = meta_http::router(state.with_answer_budget(200 << 10));
    let ask = || {
        let request = axum::http::Request::get("/v1/kv?prefix=big/")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    // Answered, not read yet.
    let first = ask().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = ask().await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = axum::body::to_bytes(second.into_body(), usize::MAX)
        .await
        .unwrap();
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "overloaded", "{error}");
    let listed = axum::body::to_bytes(first.into_body(), usize::MAX)
        .await
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed).unwrap();
    assert_eq!(listed["keys"].as_array().map(Vec::len), Some(120));
    let third = ask().await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
}
