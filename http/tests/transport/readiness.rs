//! `/readyz` on followers while writes flow.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::wait_for;
use crate::helpers::{
    http_client, keep_writing, start_cluster, stop_all, stop_writing, the_leader,
};

/// A follower that keeps up with a stream of writes is ready the first time it is asked while
/// they flow: it applies a few entries behind the leader's commit index, and gets a moment to
/// apply up to it, rather than be found behind by every first probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_keeps_up_is_ready_when_first_asked_under_writes() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let leader = the_leader(&servers);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers = keep_writing(vec![leader.addr.clone(); 4], "ready/", &stop, &done);
    wait_for(|| done.load(Ordering::Relaxed) >= 100, "writes flowing").await;
    let http = http_client();
    for follower in servers.values().filter(|s| s.node.id() != leader.node.id()) {
        let r = http
            .get(format!("http://{}/readyz", follower.addr))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, 200, "node {}: {body}", follower.node.id());
    }
    let refused = stop_writing(&stop, writers).await;
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
    stop_all(servers).await;
}
