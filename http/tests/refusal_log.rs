//! How often a node logs the messages between members it refuses. The only test of its binary:
//! it sets the process's subscriber to read what the node logs, which a test running beside it
//! would write to as well (and a subscriber set for one thread misses the lines of callsites
//! that other threads' tests reached first).

mod common;

use axum::http::{Method, StatusCode};
use common::{call, leader_node};

const CLUSTER: &str = "x-metaserver-cluster";

/// What the test's node logs.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A member of another cluster (a node wiped and initialized anew by mistake) retries several
/// times a second for as long as it runs: each cause of refusal is logged once, and again only
/// after a while, not once per message.
#[tokio::test]
async fn a_repeated_refusal_is_logged_once_per_cause() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let leader = leader_node(None).await;
    let app = &leader.app;
    for _ in 0..5 {
        for (name, value) in [(CLUSTER, "cd"), (CLUSTER, "ef"), ("x-metaserver-to", "7")] {
            let a = call(app, Method::POST, "/raft/vote", "", &[(name, value)]).await;
            assert_eq!(a.status, StatusCode::CONFLICT, "{name}: {value}: {a:?}");
        }
    }
    let logged = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    let lines = |text: &str| logged.lines().filter(|l| l.contains(text)).count();
    assert_eq!(
        lines("refused a message from another cluster"),
        2,
        "one line per other cluster:\n{logged}"
    );
    assert_eq!(
        lines("refused a message for node 7"),
        1,
        "one line for the other node:\n{logged}"
    );
}
