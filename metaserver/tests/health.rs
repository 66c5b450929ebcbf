//! `metaserver health`: every member's status and readiness at once, from any one member, and
//! an exit status that says whether the cluster is healthy.

mod common;

use common::{client, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_every_member_and_fails_on_one_down() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let (mut nodes, addrs) = common::spawn_members(&dirs, &[]);
    let leader = common::form_cluster(&http, "http", &addrs, None).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    let (ok, out, err) = run(&["health", "--server", &addrs[follower - 1]], &[]).await;
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three members: {out}");
    assert!(lines[0].starts_with("node"), "{out}");
    for (id, line) in (1..=3).zip(&lines[1..]) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[..2], [id.to_string(), addrs[id - 1].clone()], "{out}");
        assert_eq!(cells.last(), Some(&"yes"), "{out}");
    }
    let (ok, out, err) = run(&["health", "--server", &addrs[0], "--json"], &[]).await;
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["healthy"], true, "{report}");
    assert_eq!(report["leader_id"], leader, "{report}");
    assert_eq!(report["members"].as_array().unwrap().len(), 3, "{report}");
    // The leader counts each follower's lag.
    let lag = &report["members"][follower - 1]["status"]["lag"];
    assert!(lag.is_u64(), "{report}");

    // A paused member first in the list: the command asks it for the members for 5 s at
    // most, then the next (it waited 70 s), and names it.
    nodes[follower - 1].signal(libc::SIGSTOP);
    let servers = format!("{},{}", addrs[follower - 1], addrs[leader - 1]);
    let started = std::time::Instant::now();
    let (ok, out, err) = run(&["health", "--server", &servers], &[]).await;
    let took = started.elapsed();
    assert!(!ok, "{out}");
    let silent = format!("node {follower} at {} does not answer", addrs[follower - 1]);
    assert!(
        err.contains("not healthy") && err.contains(&silent),
        "{err}"
    );
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    nodes[follower - 1].signal(libc::SIGCONT);

    nodes[follower - 1].stop().await;
    let (ok, out, err) = run(&["health", "--server", &addrs[leader - 1]], &[]).await;
    assert!(!ok, "{out}");
    assert!(
        err.contains("not healthy") && err.contains(&silent),
        "{err}"
    );
    // A reader that goes away does not turn the verdict into success.
    let mut command = std::process::Command::new(common::binary());
    command
        .args(["health", "--server", &addrs[leader - 1]])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = command.spawn().unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    for node in &mut nodes {
        node.stop().await;
    }
}

/// With `--json`, a check that reaches no member still gets a report: unhealthy, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_in_json_also_when_no_member_answers() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (ok, out, err) = run(&["health", "--server", &closed, "--json"], &[]).await;
    assert!(!ok, "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert_eq!(report["healthy"], false, "{report}");
    let problem = report["problems"][0].as_str().unwrap();
    assert!(problem.contains(&closed), "{report}");
    assert_eq!(report["members"], serde_json::json!([]), "{report}");
}
