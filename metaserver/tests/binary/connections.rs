//! Connections beyond the node's budget: a flood of idle ones leaves the descriptors the
//! node needs for its own files.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{client, poll, spawn_with_open_files};

/// One HTTP/1.1 connection, kept open, for requests that must not open another.
struct RawHttp {
    tcp: tokio::net::TcpStream,
}

impl RawHttp {
    async fn connect(addr: &str) -> RawHttp {
        RawHttp {
            tcp: tokio::net::TcpStream::connect(addr).await.unwrap(),
        }
    }

    /// Sends a request with a JSON `body` and returns the status and the JSON answer (the
    /// server sends a content length with every answer). Bounded by 30 s.
    async fn request(&mut self, method: &str, path: &str, body: &str) -> (u16, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let exchange = async {
            self.tcp.write_all(head.as_bytes()).await.unwrap();
            self.tcp.write_all(body.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = self.tcp.read(&mut buf).await.unwrap();
                assert!(n > 0, "the server closed the connection");
                got.extend_from_slice(&buf[..n]);
                let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .expect("a content length")
                    .trim()
                    .parse()
                    .unwrap();
                if got.len() >= end + 4 + len {
                    let status = head[9..12].parse().unwrap();
                    let body = &got[end + 4..end + 4 + len];
                    let v = serde_json::from_slice(body)
                        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()));
                    return (status, v);
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("an answer within 30 s")
    }
}

/// A node with its data in `dir`, on a free port, limited to `open_files` open files.
fn limited_to(dir: &tempfile::TempDir, open_files: u64) -> crate::common::Proc {
    let data = dir.path().join("data");
    spawn_with_open_files(
        dir.path(),
        dir.path(),
        &["--data-dir", data.to_str().unwrap()],
        &[("METASERVER_LISTEN", "127.0.0.1:0")],
        false,
        Some(open_files),
    )
}

/// A limit of open files too low for the node's own files and a useful number of connections
/// is warned about, naming the remedy (it was an INFO line like any other limit's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_open_files_limit_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = limited_to(&dir, 300);
    server.address();
    assert!(
        server.logged("WARN") && server.logged("the open-files limit is low"),
        "{}",
        server.logs()
    );
    server.stop().await;
}

/// Idle connections beyond the node's connection budget wait unaccepted, so a flood of them
/// leaves the descriptors the node needs for its own files. With 400 open files (a budget of
/// 144 connections) and 500 idle connections, a node that accepted them all ran out of
/// descriptors, and the snapshot asked for below stopped its Raft core ("too many open files"
/// listing the snapshot directory): every later request was refused until a restart. Now the
/// node builds the snapshot and takes writes on a connection it had, and serves new
/// connections once the flood ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_leaves_descriptors_for_the_nodes_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let mut server = limited_to(&dir, 400);
    let addr = server.address();
    let base = format!("http://{addr}");
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    // A connection of its own, accepted before the flood (a pooled client might open a new
    // one for the next request, which would wait in the accept queue).
    let mut own = RawHttp::connect(&addr).await;
    let (status, v) = own
        .request("PUT", "/v1/datanodes/1", r#"{"addr":"10.0.0.1:9000"}"#)
        .await;
    assert_eq!(status, 200, "{v}");
    let epoch = v["epoch"].as_u64().unwrap();

    let mut flood = Vec::new();
    // No more beyond the budget than the kernel's accept queue holds, so every connect
    // completes (the queue is 4,096 long on current kernels, 128 on old ones).
    let queue: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(128);
    for _ in 0..500.min(144 + queue - 16) {
        flood.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.logs().contains("every connection slot is taken") {
        assert!(
            Instant::now() < deadline,
            "the node never reached its connection budget: {}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shards = json!({"epoch": epoch, "shards": [{"id": 7, "generation": 1, "size": 1}]});
    let (status, v) = own
        .request("POST", "/v1/datanodes/1/shards", &shards.to_string())
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = own.request("POST", "/v1/cluster/snapshot", "").await;
    assert_eq!(status, 200, "building a snapshot during the flood: {v}");

    drop(flood);
    let fresh = client();
    let v = poll(&fresh, &format!("{base}/v1/shards/7"), None, |_| true).await;
    assert_eq!(v["replicas"][0]["datanode"], 1, "{v}");
    server.stop().await;
}
