//! Operator commands whose reader goes away (`metaserver shards | head -1`) end quietly and
//! successfully, as `cat` does, instead of panicking or reporting a broken pipe; a watch that
//! waits for changes, without printing anything, ends too. `health`, whose exit status is its
//! verdict, fails instead.

use std::process::Stdio;

use reqwest::Method;
use serde_json::json;

use crate::common::{binary, send, COMMAND_DEADLINE};
use crate::helpers::{default_server, register_datanode};

/// Runs `metaserver ARGS` whose stdout's reader goes away before the command has its answer to
/// print: how it ended, and its stderr.
async fn run_without_reader(args: &[&str]) -> (std::process::Output, String) {
    let mut child = tokio::process::Command::new(binary())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run metaserver");
    drop(child.stdout.take());
    let out = tokio::time::timeout(COMMAND_DEADLINE, child.wait_with_output())
        .await
        .expect("the command ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

#[tokio::test]
async fn a_command_whose_reader_went_away_ends_quietly() {
    let (_dir, http, mut server, base) = default_server().await;
    let epoch = register_datanode(&http, &base, 7, None).await;
    let shards: Vec<_> = (1..=100)
        .map(|id| json!({"id": id, "generation": 1, "size": 10}))
        .collect();
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{base}/v1/datanodes/7/shards"),
        None,
        Some(json!({"epoch": epoch, "shards": shards}).to_string()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    let addr = base.trim_start_matches("http://").to_owned();
    // A watch that waits for changes which never come notices too.
    for args in [
        &["liveness", "--server", &addr][..],
        &["status", "--server", &addr],
        &["shards", "--server", &addr],
        &["shards", "--server", &addr, "--datanode", "7"],
        &["watch", "--server", &addr],
    ] {
        let (out, stderr) = run_without_reader(args).await;
        assert!(
            out.status.success() && stderr.is_empty(),
            "metaserver {args:?}: {} {stderr}",
            out.status
        );
    }
    // `health` answers with its exit status, which a check reads with the report: a report its
    // reader did not get is a failure, with a reason, also for a healthy cluster.
    let (out, stderr) = run_without_reader(&["health", "--server", &addr]).await;
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("did not get the report"), "{stderr}");
    server.signal(libc::SIGINT);
    assert!(server.wait_exit().await.success(), "{}", server.logs());
}

/// A command whose member takes the request and says nothing (a paused process) says on
/// stderr what it waits for, rather than wait out its 70 s in silence: a read, and a write
/// (a membership command), which is not sent to a second member while the first may act.
#[tokio::test]
async fn a_command_waiting_on_a_silent_member_says_so() {
    for command in [&["status"][..], &["member", "leader", "1"]] {
        waits_saying_so(command).await;
    }
}

async fn waits_saying_so(command: &[&str]) {
    use tokio::io::AsyncBufReadExt;

    // Takes connections and never answers; holds them until the test ends.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut child = tokio::process::Command::new(binary())
        .args(command)
        .args(["--server", &addr])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run metaserver");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(COMMAND_DEADLINE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("has not answered in 5 s") {
                return line;
            }
        }
        panic!("stderr ended without the notice");
    })
    .await
    .unwrap_or_else(|_| panic!("{command:?} says what it waits for"));
    assert!(said.contains(&addr), "{said}");
    child.kill().await.unwrap();
    held.abort();
}
