//! `/readyz` on followers while writes flow.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::wait_for;
use crate::helpers::{http_client, start_cluster, stop_all, the_leader, TOKEN};

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
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let (stop, done) = (stop.clone(), done.clone());
        let leader = leader.addr.clone();
        let http = http_client();
        writers.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .put(format!("http://{leader}/v1/kv/w{w}-{i}"))
                    .bearer_auth(TOKEN)
                    .body("\"x\"")
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{}", r.status());
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
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
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = writers.join_next().await {
        joined.unwrap();
    }
    stop_all(servers).await;
}
