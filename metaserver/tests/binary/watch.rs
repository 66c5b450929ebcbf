//! The `watch` command: it prints the changes with their history, refuses a lost history (also
//! one given to resume with) and rides out members without a leader or a read index.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::common::{poll, run, send, spawn};
use crate::helpers::default_server;

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
    // With the history its index counts in, which a script gives back to resume.
    assert!(start["history"].is_string(), "{start}");
    assert_eq!(lines[0]["history"], start["history"], "{out}");
    // A history the cluster does not count in (it was restored from a backup since) is
    // refused, not watched from an index that would skip its changes.
    let args = [
        "watch",
        "--server",
        &addr,
        "--after",
        &after,
        "--history",
        "0123456789abcdef",
        "--once",
    ];
    let (ok, _, err) = bounded(args.iter().map(|a| a.to_string()).collect()).await;
    assert!(!ok);
    assert!(err.contains("compacted"), "{err}");

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
            // A member's 503 `no_leader` says when to ask again, as a member's does: one without
            // would say waiting does not help.
            let retry = if status == 503 {
                "retry-after: 1\r\n"
            } else {
                ""
            };
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 {retry}connection: close\r\n\r\n{body}",
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
