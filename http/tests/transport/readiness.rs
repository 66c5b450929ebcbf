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

/// A follower never asked before asks its leader for the commit index it must reach: when the
/// leader is paused (its port takes connections nobody answers), the probe still answers
/// within a second, as probes' own timeouts expect (it took about 1.5 s, waiting for the
/// forwarding to give up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_first_asked_while_its_leader_is_paused_answers_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster(&dir).await;
    let leader = the_leader(&servers).node.id();
    let follower = servers.keys().copied().find(|id| *id != leader).unwrap();
    let paused = servers.remove(&leader).unwrap().stop_keeping_port().await;
    paused.stop_answering();
    let started = std::time::Instant::now();
    let r = http_client()
        .get(format!("http://{}/readyz", servers[&follower].addr))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert!(
        took < std::time::Duration::from_secs(1),
        "answered {status} after {took:?}: {body}"
    );
    drop(paused);
    stop_all(servers).await;
}
