//! `metaserver member`: a cluster grown from one node to three, its leadership moved and a
//! voter removed, with the commands an operator runs, sent to any member; and a command that
//! waits for a leader says why.

mod common;

use common::{client, poll, run, send};
use reqwest::Method;
use serde_json::{json, Value};

/// Runs `metaserver member ARGS --server SERVER`; its printed JSON on success, else the test
/// fails with its stderr.
async fn member(args: &[&str], server: &str) -> Value {
    let (ok, out, err) = member_answer(args, server).await;
    assert!(ok, "member {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("member {args:?}: {e}: {out}"))
}

async fn member_answer(args: &[&str], server: &str) -> (bool, String, String) {
    let mut all = vec!["member"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--server", server]);
    run(&all, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grows_moves_its_leader_and_shrinks_by_commands() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let (mut nodes, addrs) = common::spawn_members(&dirs, &[]);
    let members = json!({"members": {"1": addrs[0]}});
    let url = format!("http://{}/v1/cluster/init", addrs[0]);
    let (status, v) = send(&http, Method::POST, &url, None, Some(members.to_string()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");

    // Node 2 added and promoted in one command; node 3 added through a follower, then promoted.
    let v = member(&["add", "2", &addrs[1], "--voter"], &addrs[0]).await;
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1, 2]), &json!([])));
    // The same command run again (its first answer lost, say) finds what it makes: done. As a
    // learner only, or at another address, the voter is refused.
    let v = member(&["add", "2", &addrs[1], "--voter"], &addrs[0]).await;
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1, 2]), &json!([])));
    let (ok, _, err) = member_answer(&["add", "2", &addrs[1]], &addrs[0]).await;
    assert!(!ok, "{err}");
    let (ok, _, err) = member_answer(&["add", "2", "127.0.0.1:1", "--voter"], &addrs[0]).await;
    assert!(!ok, "{err}");
    // Node 3, in no cluster yet, knows no leader and tells little of the cluster: `status`
    // given it first moves on to the next member.
    let first_alone = format!("{},{}", addrs[2], addrs[0]);
    let (ok, out, err) = run(&["status", "--server", &first_alone], &[]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&v["id"], &v["voters"]), (&json!(1), &json!([1, 2])), "{v}");
    let v = member(&["add", "3", &addrs[2]], &addrs[1]).await;
    assert_eq!(
        (&v["voters"], &v["learners"]),
        (&json!([1, 2]), &json!([3]))
    );
    let both = format!("{},{}", addrs[1], addrs[0]);
    let v = member(&["promote", "3"], &both).await;
    assert_eq!(
        (&v["voters"], &v["learners"]),
        (&json!([1, 2, 3]), &json!([]))
    );
    // A node that is not even a learner is refused at once, not waited for.
    let (ok, _, err) = member_answer(&["promote", "9", "--wait-secs", "600"], &addrs[0]).await;
    assert!(!ok);
    assert!(err.contains("add it as a learner first"), "{err}");

    let v = member(&["leader", "2"], &addrs[2]).await;
    assert_eq!(v["leader"], 2, "{v}");

    let v = member(&["remove", "1"], &addrs[2]).await;
    assert_eq!((&v["voters"], &v["learners"]), (&json!([2, 3]), &json!([])));
    poll(
        &http,
        &format!("http://{}/v1/cluster", addrs[1]),
        None,
        |v| v["voters"] == json!([2, 3]),
    )
    .await;
    let (ok, _, err) = member_answer(&["remove", "1"], &addrs[1]).await;
    assert!(!ok);
    assert!(
        err.contains("node 1 is neither a voter nor a learner"),
        "{err}"
    );
    // Node 1 runs on, removed: `status` and `health` given it first move on to the next
    // member, as the other commands do (its view is of the cluster it left).
    poll(
        &http,
        &format!("http://{}/v1/cluster", addrs[0]),
        None,
        |v| v["role"] == "removed",
    )
    .await;
    let first_removed = format!("{},{}", addrs[0], addrs[1]);
    let (ok, out, err) = run(&["status", "--server", &first_removed], &[]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&v["id"], &v["voters"]), (&json!(2), &json!([2, 3])), "{v}");
    let (ok, out, err) = run(&["health", "--server", &first_removed], &[]).await;
    assert!(ok, "{out}{err}");
    for node in &mut nodes {
        node.stop().await;
    }
}

/// A command that rides out a cluster without a leader says so on stderr once the wait is
/// noticeable, naming why, rather than wait a minute in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_waits_for_a_leader_says_why() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let (status, retry, body) = if started.elapsed() < std::time::Duration::from_secs(6) {
                (
                    503,
                    "retry-after: 1\r\n",
                    r#"{"error":{"code":"no_leader","message":"an election runs"}}"#,
                )
            } else {
                (200, "", r#"{"voters":[1,4],"joint":null,"learners":[]}"#)
            };
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 {retry}connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    let (ok, out, err) = member_answer(&["promote", "4"], &addr).await;
    assert!(ok, "{err}");
    assert!(out.contains("\"voters\""), "{out}");
    assert_eq!(
        err.matches("cannot take the request yet").count(),
        1,
        "{err}"
    );
    assert!(err.contains("an election runs"), "{err}");
}
