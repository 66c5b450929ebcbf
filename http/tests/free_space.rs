//! The free-space guard: a leader short of disk refuses writes that add data with 507
//! `insufficient_storage` and changes nothing, while deletes and reads still work.

mod common;

use axum::http::{Method, StatusCode};
use common::leader_node_tuned;

#[tokio::test]
async fn a_leader_short_of_disk_refuses_what_adds_data_and_allows_deletes() {
    // No disk is ever enough.
    let t = leader_node_tuned(None, |cfg| cfg.min_free_bytes = u64::MAX).await;
    let before = t.digest().await;
    for (method, uri, body) in [
        (Method::PUT, "/v1/kv/k", "v"),
        (
            Method::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"10.0.0.1:9000"}"#,
        ),
    ] {
        let a = t.send(method, uri, body).await;
        assert_eq!(a.status, StatusCode::INSUFFICIENT_STORAGE, "{uri}: {a:?}");
        assert_eq!(a.error_code(), "insufficient_storage");
        assert!(a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deletes still work"));
    }
    assert_eq!(t.digest().await, before, "nothing changed");
    // Deletes pass the guard (and find nothing to delete here), reads pass.
    let a = t.send(Method::DELETE, "/v1/kv/k", "").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    let a = t.get("/v1/kv?prefix=").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
}
