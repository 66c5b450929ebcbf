//! The `metaserver` binary as operators use it: the command-less default node, restarts,
//! the token, graceful shutdown on SIGTERM, the operator commands and `local-cluster`.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, poll, run, send, spawn, spawn_with_open_files};
use reqwest::Method;
use serde_json::{json, Value};

/// Registers datanode `id` and returns its epoch.
async fn register_datanode(
    http: &reqwest::Client,
    base: &str,
    id: u64,
    token: Option<&str>,
) -> u64 {
    // An election may be under way for a moment (no leader: 503); registering again only
    // starts a newer epoch.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, v) = send(
            http,
            Method::PUT,
            &format!("{base}/v1/datanodes/{id}"),
            token,
            Some(json!({"addr": format!("10.0.0.{id}:9000")}).to_string()),
        )
        .await
        .unwrap();
        if status == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(status, 200, "{v}");
        return v["epoch"].as_u64().unwrap();
    }
}

/// A node started with no arguments (one-node cluster, port picked by the system) in a temp dir,
/// ready: the dir, a client, the process and its base URL.
async fn default_server() -> (tempfile::TempDir, reqwest::Client, common::Proc, String) {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    (dir, http, server, base)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_arguments_serve_and_keep_data_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let http = client();
    // No arguments at all; only the listen port is made ephemeral through the environment.
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let mut server = spawn(cwd, cwd, &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    assert!(
        cwd.join("metaserver-data").is_dir(),
        "data in ./metaserver-data"
    );
    let v = poll(&http, &format!("{base}/v1/cluster"), None, |_| true).await;
    assert_eq!(v["role"], "leader");
    assert_eq!(v["id"], 1);
    assert_eq!(v["voters"], json!([1]));

    let epoch = register_datanode(&http, &base, 7, None).await;
    let shards = json!({"epoch": epoch, "shards": [
        {"id": 1, "generation": 1, "size": 10},
        {"id": 2, "generation": 1, "size": 20},
    ]});
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{base}/v1/datanodes/7/shards"),
        None,
        Some(shards.to_string()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    let (status, v) = send(
        &http,
        Method::PUT,
        &format!("{base}/v1/kv/greeting"),
        None,
        Some("hello".into()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");

    // Operator commands against it.
    let addr = base.trim_start_matches("http://").to_owned();
    let (ok, out, err) = run(&["status", "--server", &addr], &[]).await;
    assert!(ok, "{err}");
    let status_view: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status_view["role"], "leader");

    let file = cwd.join("shards.json");
    std::fs::write(
        &file,
        r#"[{"id":3,"generation":1,"size":30},{"id":4,"generation":2,"size":40}]"#,
    )
    .unwrap();
    let (ok, out, err) = run(
        &[
            "register",
            "--server",
            &addr,
            "--datanode",
            "7",
            "--file",
            file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["accepted"], 2, "{out}");

    let (ok, out, err) = run(&["shards", "--server", &addr, "--datanode", "7"], &[]).await;
    assert!(ok, "{err}");
    let ids: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [1, 2, 3, 4]);

    let backup = cwd.join("backup.snap");
    let (ok, out, err) = run(
        &[
            "snapshot",
            "save",
            "--server",
            &addr,
            backup.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let len = std::fs::metadata(&backup).unwrap().len();
    assert!(len > 0);
    assert_eq!(v["bytes"], len);

    // Unknown datanode: a clear error, non-zero exit.
    let (ok, _, err) = run(
        &[
            "register",
            "--server",
            &addr,
            "--datanode",
            "99",
            "--file",
            file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("not_found"), "{err}");

    server.stop().await;

    // Restart from the same directory: no second initialization, same data.
    let mut server = spawn(cwd, cwd, &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    let v = poll(&http, &format!("{base}/v1/datanodes/7"), None, |_| true).await;
    assert_eq!(v["shards"], 4);
    assert_eq!(v["epoch"], epoch);
    let (status, v) = send(
        &http,
        Method::GET,
        &format!("{base}/v1/kv/greeting"),
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!((status, v), (200, Value::String("hello".into())));
    let v = poll(&http, &format!("{base}/v1/cluster"), None, |_| true).await;
    assert_eq!(v["voters"], json!([1]));

    // A second process on the same data dir stops before touching it.
    let mut second = spawn(cwd, cwd, &[], &env, false);
    let exit = second.wait_exit().await;
    assert!(
        !exit.success(),
        "a second server started on a data dir in use"
    );
    assert!(second.logs().contains("in use"), "{}", second.logs());
    let (status, _) = send(&http, Method::GET, &format!("{base}/readyz"), None, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "the first server still serves");

    // Datanode 7 restarts holding shards 1 and 3 only: a new incarnation, its full report from
    // a file, and the prune drops 2 and 4.
    let addr = base.trim_start_matches("http://").to_owned();
    register_datanode(&http, &base, 7, None).await;
    std::fs::write(
        &file,
        r#"[{"id":1,"generation":1,"size":10},{"id":3,"generation":1,"size":30}]"#,
    )
    .unwrap();
    let (ok, out, err) = run(
        &[
            "register",
            "--server",
            &addr,
            "--datanode",
            "7",
            "--file",
            file.to_str().unwrap(),
            "--prune",
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    // 1 and 3 were registered before: unchanged, now under the new epoch.
    assert_eq!(
        (v["unchanged"].clone(), v["pruned"].clone()),
        (json!(2), json!(2)),
        "{out}"
    );
    let (ok, out, err) = run(&["shards", "--server", &addr, "--datanode", "7"], &[]).await;
    assert!(ok, "{err}");
    let ids: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [1, 3]);
    let (ok, out, err) = run(&["liveness", "--server", &addr], &[]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["datanodes"][0]["id"], 7, "{out}");
    assert_eq!(v["datanodes"][0]["shards"], 2, "{out}");

    server.signal(libc::SIGINT);
    assert!(server.wait_exit().await.success(), "{}", server.logs());

    // The data dir belongs to node 1: starting it as node 2 is refused.
    let mut other = spawn(cwd, cwd, &["--id", "2"], &env, false);
    let exit = other.wait_exit().await;
    assert!(!exit.success(), "node 2 started on node 1's data dir");
    assert!(
        other.logs().contains("belongs to node 1, not node 2"),
        "{}",
        other.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let data = dir.path().join("data");
    let mut server = spawn(
        dir.path(),
        dir.path(),
        &["--data-dir", data.to_str().unwrap()],
        &[
            ("METASERVER_LISTEN", "127.0.0.1:0"),
            ("METASERVER_TOKEN", "s3cret"),
        ],
        false,
    );
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    for token in [None, Some("wrong")] {
        for (method, path) in [
            (Method::GET, "/v1/cluster"),
            (Method::PUT, "/v1/datanodes/1"),
        ] {
            let (status, v) = send(
                &http,
                method.clone(),
                &format!("{base}{path}"),
                token,
                Some(r#"{"addr":"a:1"}"#.into()),
            )
            .await
            .unwrap();
            assert_eq!(status, 401, "{method} {path} {token:?}: {v}");
            assert_eq!(v["error"]["code"], "unauthorized");
        }
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _) = send(&http, Method::GET, &format!("{base}{path}"), None, None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{path}");
    }
    register_datanode(&http, &base, 1, Some("s3cret")).await;
    let (status, v) = send(
        &http,
        Method::GET,
        &format!("{base}/v1/datanodes"),
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 401, "{v}");

    let addr = base.trim_start_matches("http://").to_owned();
    let (ok, _, err) = run(&["status", "--server", &addr], &[]).await;
    assert!(!ok);
    assert!(err.contains("unauthorized"), "{err}");
    let (ok, out, err) = run(&["status", "--server", &addr, "--token", "s3cret"], &[]).await;
    assert!(ok, "{err}");
    assert!(out.contains("\"leader\""), "{out}");
    let (ok, _, err) = run(
        &["status", "--server", &addr],
        &[("METASERVER_TOKEN", "s3cret")],
    )
    .await;
    assert!(ok, "{err}");

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
    let data = dir.path().join("data");
    let mut server = spawn_with_open_files(
        dir.path(),
        dir.path(),
        &["--data-dir", data.to_str().unwrap()],
        &[("METASERVER_LISTEN", "127.0.0.1:0")],
        false,
        Some(400),
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_cleanly_and_loses_nothing_acknowledged() {
    let (dir, http, mut server, base) = default_server().await;
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];

    // Eight writers put keys as fast as they can; every acknowledged one is recorded.
    let acked: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (http, base, acked) = (http.clone(), base.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            for i in 0..100_000u64 {
                let key = format!("w{w}/k{i:06}");
                let value = format!("value {w} {i}");
                match send(
                    &http,
                    Method::PUT,
                    &format!("{base}/v1/kv/{key}"),
                    None,
                    Some(value.clone()),
                )
                .await
                {
                    Ok((200, _)) => {
                        acked.lock().unwrap().insert(key, value);
                    }
                    // The server is going away: refused connections or 503 while draining.
                    _ => return,
                }
            }
        }));
    }
    let deadline = std::time::Instant::now() + common::DEADLINE;
    while acked.lock().unwrap().len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "writes are not acknowledged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.stop().await;
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    let mut missing = Vec::new();
    for (key, value) in &acked {
        let (status, body) = send(
            &http,
            Method::GET,
            &format!("{base}/v1/kv/{key}"),
            None,
            None,
        )
        .await
        .unwrap();
        if status != 200 || body != Value::String(value.clone()) {
            missing.push(format!("{key}: {status} {body}"));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes lost: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_waiting_watch_at_once() {
    let (_dir, http, mut server, base) = default_server().await;
    let start = poll(&http, &format!("{base}/v1/watch"), None, |_| true).await;
    let index = start["index"].as_u64().unwrap();
    let watch = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let url = format!("{base}/v1/watch?after={index}&wait_ms=55000");
            send(&http, Method::GET, &url, None, None).await
        })
    };
    // Once the watch waits at the server (its gauge says so), stop the server.
    poll(&http, &format!("{base}/metrics"), None, |v| {
        v.as_str()
            .is_some_and(|t| t.contains("metaserver_watches_waiting 1"))
    })
    .await;
    let stopping = Instant::now();
    server.stop().await;
    // The drain waits for running requests up to 15 s: a watch that held it would show here.
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "stopping took {took:?}");
    let (status, v) = watch.await.unwrap().expect("the watch was answered");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["events"], json!([]), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_command_prints_the_changes_and_refuses_a_lost_history() {
    let (dir, http, mut server, base) = default_server().await;
    let addr = base.trim_start_matches("http://").to_owned();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let start = poll(&http, &format!("{base}/v1/watch"), None, |_| true).await;
    let after = start["index"].as_u64().unwrap().to_string();
    for (key, value) in [("cfg/a b", "1"), ("other", "2")] {
        let url = format!("{base}/v1/kv/{}", key.replace(' ', "%20"));
        let (status, v) = send(&http, Method::PUT, &url, None, Some(value.into()))
            .await
            .unwrap();
        assert_eq!(status, 200, "{v}");
    }
    let bounded = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tokio::time::timeout(Duration::from_secs(30), run(&args, &[]))
            .await
            .expect("the watch command returned")
    };
    let args = [
        "watch", "--server", &addr, "--after", &after, "--prefix", "cfg/", "--once",
    ];
    let (ok, out, err) = bounded(args.iter().map(|a| a.to_string()).collect()).await;
    assert!(ok, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["kind"], "kv_put");
    assert_eq!(lines[0]["key"], "cfg/a b");

    // After a restart the member no longer knows the changes after that index.
    server.stop().await;
    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let addr = server.address();
    poll(&http, &format!("http://{addr}/readyz"), None, |_| true).await;
    let args = ["watch", "--server", &addr, "--after", &after, "--once"];
    let (ok, _, err) = bounded(args.iter().map(|a| a.to_string()).collect()).await;
    assert!(!ok);
    assert!(err.contains("compacted"), "{err}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_elects_a_leader_and_accepts_writes_at_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let data = dir.path().join("cluster");
    let mut cluster = spawn(
        dir.path(),
        dir.path(),
        &[
            "local-cluster",
            "--nodes",
            "3",
            "--base-port",
            "0",
            "--data-dir",
            data.to_str().unwrap(),
            "--",
            "--snapshot-rate",
            "12345",
        ],
        &[],
        true,
    );
    let mut addrs = BTreeMap::new();
    for id in 1..=3u64 {
        let line = cluster.wait_line(&format!("node {id} at "));
        let addr = line.split_whitespace().next().unwrap().to_owned();
        addrs.insert(id, format!("http://{addr}"));
    }
    // Every node reports the same leader.
    let mut leader = None;
    for base in addrs.values() {
        let v = poll(&http, &format!("{base}/v1/cluster"), None, |v| {
            v["leader_id"].is_u64() && v["voters"] == json!([1, 2, 3])
        })
        .await;
        let id = v["leader_id"].as_u64().unwrap();
        leader.get_or_insert(id);
    }
    let leader = leader.unwrap();
    for base in addrs.values() {
        poll(&http, &format!("{base}/v1/cluster"), None, |v| {
            v["leader_id"] == leader
        })
        .await;
    }
    // The options after `--` reached every node.
    for base in addrs.values() {
        let (status, config) = send(&http, Method::GET, &format!("{base}/v1/config"), None, None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{config}");
        assert_eq!(config["snapshot_max_bytes_per_sec"], 12345, "{config}");
    }
    let followers: Vec<u64> = addrs.keys().copied().filter(|id| *id != leader).collect();
    let f1 = &addrs[&followers[0]];
    let f2 = &addrs[&followers[1]];

    // Registrations sent to a follower are forwarded to the leader.
    let epoch = register_datanode(&http, f1, 11, None).await;
    let shards: Vec<Value> = (0..1000u64)
        .map(|i| json!({"id": i, "generation": 1, "size": i}))
        .collect();
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{f1}/v1/datanodes/11/shards"),
        None,
        Some(json!({"epoch": epoch, "shards": shards}).to_string()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["accepted"], 1000);
    // A linearizable read at the other follower sees it; so, eventually, does every local read.
    let (status, v) = send(
        &http,
        Method::GET,
        &format!("{f2}/v1/datanodes/11"),
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["shards"], 1000);
    for base in addrs.values() {
        poll(
            &http,
            &format!("{base}/v1/datanodes/11?consistency=local"),
            None,
            |v| v["shards"] == 1000,
        )
        .await;
    }

    // A heartbeat at a follower reaches the leader, whose liveness report any member relays;
    // a prune at a follower goes to the leader piece by piece.
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{f1}/v1/datanodes/11/heartbeat"),
        None,
        Some(json!({"epoch": epoch}).to_string()),
    )
    .await
    .unwrap();
    assert_eq!(
        (status, v["timeout_ms"].clone()),
        (200, json!(10_000)),
        "{v}"
    );
    let (status, v) = send(&http, Method::GET, &format!("{f2}/v1/liveness"), None, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["leader_id"], leader, "{v}");
    assert_eq!(v["datanodes"][0]["id"], 11, "{v}");
    assert_eq!(v["datanodes"][0]["state"], "alive", "{v}");
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{f2}/v1/datanodes/11/prune"),
        None,
        Some(json!({"epoch": epoch}).to_string()),
    )
    .await
    .unwrap();
    assert_eq!((status, v["removed"].clone()), (200, json!(0)), "{v}");

    // Ctrl-C stops the whole cluster cleanly.
    cluster.signal(libc::SIGINT);
    let exit = cluster.wait_exit().await;
    assert!(exit.success(), "{exit:?}; stderr:\n{}", cluster.logs());
    for base in addrs.values() {
        assert!(
            send(&http, Method::GET, &format!("{base}/healthz"), None, None)
                .await
                .is_err(),
            "{base} still answers"
        );
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_refuses_serve_options_it_sets_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data = data.to_str().unwrap();
    for option in ["--data-dir", "--id=4", "--init"] {
        let args = [
            "local-cluster",
            "--base-port",
            "0",
            "--data-dir",
            data,
            "--",
        ];
        let args: Vec<&str> = args.into_iter().chain([option, "x"]).collect();
        let (ok, _, err) = run(&args, &[]).await;
        assert!(!ok, "{option} accepted");
        let name = option.split('=').next().unwrap();
        assert!(
            err.contains(&format!("{name} is set by local-cluster")),
            "{err}"
        );
    }
    assert!(!std::path::Path::new(data).exists(), "nothing was started");
}

/// With a stop delay, a signalled node first reports not ready while it still serves (so a
/// load balancer takes it out of rotation before its port closes), and a second signal ends
/// the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_delay_reports_not_ready_while_still_serving() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    // Longer than the test may take: only the second signal ends the wait.
    let env = [
        ("METASERVER_LISTEN", "127.0.0.1:0"),
        ("METASERVER_STOP_DELAY_MS", "600000"),
    ];
    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;

    server.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, v) = send(&http, Method::GET, &format!("{base}/readyz"), None, None)
            .await
            .unwrap();
        if status == 503 {
            assert!(v.to_string().contains("stopping"), "{v}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready after the signal: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Still serving.
    register_datanode(&http, &base, 3, None).await;

    let stopping = Instant::now();
    server.signal(libc::SIGTERM);
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the second signal took {took:?}"
    );
}

/// `metaserver watch` rides out a member that answers 504 (a leader that did not give a read
/// index in time) or 503 (no leader), where it used to stop at the first 504. The member is a
/// stand-in that answers 504, then 503, then one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_command_rides_out_504_and_503() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    let member = tokio::spawn(async move {
        let answers = [
            (
                504,
                r#"{"error":{"code":"timeout","message":"the leader did not answer"}}"#,
            ),
            (
                503,
                r#"{"error":{"code":"no_leader","message":"no leader"}}"#,
            ),
            (
                200,
                r#"{"index":7,"events":[{"index":7,"kind":"kv_put","key":"a"}]}"#,
            ),
        ];
        for (status, body) in answers {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let line = String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap()
                .to_string();
            seen.lock().unwrap().push(line);
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
        }
    });
    let (ok, out, err) = run(&["watch", "--server", &addr, "--after", "5", "--once"], &[]).await;
    assert!(ok, "{err}");
    assert!(out.contains(r#""kind":"kv_put""#), "{out}");
    tokio::time::timeout(Duration::from_secs(10), member)
        .await
        .expect("the stand-in answered three requests")
        .unwrap();
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 3);
    assert!(
        requests.iter().all(|r| r.contains("after=5")),
        "{requests:?}"
    );
}
