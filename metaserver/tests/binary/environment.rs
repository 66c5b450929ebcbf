//! Settings from the environment: the node's `METASERVER_*` variables are read by the node
//! only.

use std::time::Duration;

use crate::common::run;

/// A bad `serve` setting in the environment fails `serve`, and leaves the operator commands
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_node_variable_fails_the_node_only() {
    let bad = [("METASERVER_WORKER_THREADS", "many")];
    let dir = tempfile::tempdir().unwrap();
    // An operator command that fails on its own (it reads its file before it sends anything).
    let missing = dir.path().join("missing.json");
    let register = [
        "register",
        "--datanode",
        "1",
        "--file",
        missing.to_str().unwrap(),
    ];
    let (ok, _, err) = run(&register, &bad).await;
    assert!(!ok, "the file is missing");
    assert!(!err.contains("worker-threads"), "{err}");
    assert!(err.contains("missing.json"), "{err}");
    let data = dir.path().join("data");
    let args = ["serve", "--data-dir", data.to_str().unwrap()];
    let serve = run(&args, &bad);
    let (ok, _, err) = tokio::time::timeout(Duration::from_secs(60), serve)
        .await
        .expect("serve refuses a bad setting at once");
    assert!(!ok);
    assert!(err.contains("worker-threads"), "{err}");
}
