//! The bad-input matrix: every malformed request gets its status and error code, and the
//! registry is exactly as it was afterwards.

#[path = "../common/mod.rs"]
mod common;

mod bodies;
mod datanodes;
mod fuzz;
mod helpers;
mod keys;
mod members;
mod paths;
mod queries;
mod raft;
mod tokens;

use axum::body::Body;
use axum::http::{Method, StatusCode};

use crate::common::call;
use crate::helpers::{populated, Case, AUTH};

/// Every bad request of the matrix, in order.
fn matrix(epoch: u64) -> Vec<Case> {
    let mut cases = bodies::json(epoch);
    cases.extend(paths::ids());
    cases.extend(queries::parameters());
    cases.extend(bodies::batches_and_sizes(epoch));
    cases.extend(bodies::unexpected(epoch));
    cases.extend(keys::keys_and_prefixes());
    cases.extend(members::addresses_and_members());
    cases.extend(queries::cursors_and_consistency());
    cases.extend(datanodes::lifecycle(epoch));
    cases.extend(paths::wrong_methods_and_paths());
    cases.extend(paths::raw_replays());
    cases.extend(tokens::missing_wrong_and_malformed());
    cases.extend(raft::garbled_bodies());
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let (t, epoch) = populated().await;
    let before = t.digest().await;
    let cluster_before = t.node.status();
    let mut failures = Vec::new();
    for c in matrix(epoch) {
        let a = call(
            &t.app,
            c.method.clone(),
            &c.uri,
            Body::from(c.body),
            &c.headers,
        )
        .await;
        let code = if a.body.is_empty() {
            String::new()
        } else {
            a.error_code()
        };
        if a.status != c.status || code != c.code {
            failures.push(format!(
                "{}: {} {} answered {} {code:?} ({}), expected {} {:?}",
                c.what,
                c.method,
                c.uri.chars().take(80).collect::<String>(),
                a.status,
                String::from_utf8_lossy(&a.body)
                    .chars()
                    .take(200)
                    .collect::<String>(),
                c.status,
                c.code
            ));
        }
        let after = t.digest().await;
        assert_eq!(after, before, "{}: the registry changed", c.what);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Neither the membership nor the node's settings moved.
    let cluster_after = t.node.status();
    assert_eq!(cluster_after.voters, cluster_before.voters);
    assert_eq!(cluster_after.learners, cluster_before.learners);
    assert_eq!(t.node.snapshot_rate(), 0);
    // And the node still serves.
    let a = call(&t.app, Method::GET, "/v1/shards/1", "", &[AUTH]).await;
    assert_eq!(a.status, StatusCode::OK);
}
