//! Storage failures: one that stops the Raft core ends the process with an error, and a
//! snapshot that cannot be written leaves the node serving.

use reqwest::Method;
use serde_json::json;

use crate::common;
use crate::common::{client, poll, send, spawn};
use crate::helpers::register_datanode;

/// Starts a node in `dir` with `args` and `env`, waits until it is ready, and registers
/// datanode 1; returns the process, its base URL and the datanode's epoch.
async fn start_with_a_datanode(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (common::Proc, String, u64) {
    let http = client();
    let mut server = spawn(dir, dir, args, env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    let epoch = register_datanode(&http, &base, 1, None).await;
    (server, base, epoch)
}

/// Replaces the snapshot directory of the data dir `data` by a file, so that writing a
/// snapshot fails; returns its path.
fn break_snapshot_dir(data: &std::path::Path) -> std::path::PathBuf {
    let snapshots = data.join("snapshots");
    std::fs::remove_dir_all(&snapshots).unwrap();
    std::fs::write(&snapshots, "not a directory").unwrap();
    snapshots
}

/// A storage failure that stops the Raft core (here a log that cannot move to a new segment: its
/// directory was replaced by a file) makes the process log why and exit with an error, for a
/// supervisor to restart it, instead of staying up unable to serve. Restarted with its storage
/// repaired, the node has everything it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_raft_core_ends_the_process_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let data = dir.path().join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--wal-segment-bytes",
        "4096",
    ];
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let (mut server, base, epoch) = start_with_a_datanode(dir.path(), &args, &env).await;

    let (wal, moved) = (data.join("wal"), data.join("wal.moved"));
    std::fs::rename(&wal, &moved).unwrap();
    std::fs::write(&wal, "not a directory").unwrap();
    // A batch larger than a segment: the log must move to a new one. The answer does not
    // matter (the core may stop before or after it is sent).
    let shards: Vec<_> = (0..10_000u64)
        .map(|id| json!({"id": id, "generation": 1, "size": 1}))
        .collect();
    let _ = send(
        &http,
        Method::POST,
        &format!("{base}/v1/datanodes/1/shards"),
        None,
        Some(json!({"epoch": epoch, "shards": shards}).to_string()),
    )
    .await;
    let status = server.wait_exit().await;
    assert!(!status.success(), "exited with {status}: {}", server.logs());
    assert!(
        server.logs().contains("the Raft core stopped"),
        "{}",
        server.logs()
    );

    std::fs::remove_file(&wal).unwrap();
    std::fs::rename(&moved, &wal).unwrap();
    let mut server = spawn(dir.path(), dir.path(), &args, &env, false);
    let base = format!("http://{}", server.address());
    let v = poll(&http, &format!("{base}/v1/datanodes/1"), None, |_| true).await;
    assert_eq!(v["epoch"], epoch, "{v}");
    server.stop().await;
}

/// A snapshot that cannot be written leaves the node serving, whether it has an older one or
/// none yet: the request for it answers an error naming the cause, writes go on, and once the
/// directory is repaired a snapshot is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_snapshot_keeps_the_node_serving() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let data = dir.path().join("data");
    let args = ["--data-dir", data.to_str().unwrap()];
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let (mut server, base, epoch) = start_with_a_datanode(dir.path(), &args, &env).await;
    let snapshot = format!("{base}/v1/cluster/snapshot");
    let register_url = format!("{base}/v1/datanodes/1/shards");
    let register = |shard: u64| {
        let body = json!({"epoch": epoch, "shards": [{"id": shard, "generation": 1, "size": 1}]});
        send(
            &http,
            Method::POST,
            &register_url,
            None,
            Some(body.to_string()),
        )
    };
    for (shard, older) in [(7, false), (8, true)] {
        let snapshots = break_snapshot_dir(&data);
        let (status, v) = register(shard).await.unwrap();
        assert_eq!(status, 200, "{v}");
        let (status, v) = send(&http, Method::POST, &snapshot, None, None)
            .await
            .unwrap();
        assert!(status >= 500, "older snapshot {older}: {status} {v}");
        assert!(v.to_string().contains("building a snapshot failed"), "{v}");
        let v = poll(&http, &format!("{base}/v1/shards/{shard}"), None, |_| true).await;
        assert_eq!(v["replicas"][0]["datanode"], 1, "{v}");

        std::fs::remove_file(&snapshots).unwrap();
        std::fs::create_dir(&snapshots).unwrap();
        let (status, v) = send(&http, Method::POST, &snapshot, None, None)
            .await
            .unwrap();
        assert_eq!(status, 200, "repaired: {v}");
    }
    server.stop().await;
}
