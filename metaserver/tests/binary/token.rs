//! The token: required by the API and the operator commands when the node is given one.

use reqwest::Method;

use crate::common::{client, poll, restart_member as restart, run, send, spawn};
use crate::helpers::register_datanode;

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

/// A member restarted with another token takes none of the others' messages, nor they its: both
/// sides say so in their logs and their status, naming the other, and a request sent through it
/// is answered 503 (ask another member), not 500, naming the token once the member counts its
/// leader silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_token_is_named_in_the_logs() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let token = ["--token".to_owned(), "first".to_owned()];
    let (mut nodes, addrs) = crate::common::spawn_members(&dirs, &token);
    let leader = crate::common::form_cluster(&http, "http", &addrs, Some("first")).await;
    let other = (1..=3).find(|id| *id != leader).unwrap();

    restart(
        &mut nodes,
        &dirs,
        &addrs,
        other,
        &["--token", "second"],
        &[],
    )
    .await;
    let refused = |by: usize| format!("node {by} refuses this node's token");
    nodes[leader - 1].wait_logged(&refused(other)).await;
    nodes[other - 1].wait_logged(&refused(leader)).await;
    let url = format!("http://{}/v1/kv/k", addrs[other - 1]);
    let (status, v) = send(&http, Method::PUT, &url, Some("second"), Some("v".into()))
        .await
        .unwrap();
    assert_eq!(status, 503, "{v}");
    // Each side's status names the other.
    let names = |v: &serde_json::Value, id: usize| {
        v["token_refused_by"]
            .as_array()
            .is_some_and(|ids| ids.contains(&id.into()))
    };
    let status_of = |n: usize| format!("http://{}/v1/cluster", addrs[n - 1]);
    poll(&http, &status_of(leader), Some("first"), |v| {
        names(v, other)
    })
    .await;
    poll(&http, &status_of(other), Some("second"), |v| {
        names(v, leader)
    })
    .await;
    // Once the member counts its leader silent (it hears nothing from it), it answers at once,
    // naming the token. Until then it sends requests on to that leader, which refuses them.
    let last_leader = format!("node {leader}, the last leader");
    let deadline = std::time::Instant::now() + crate::common::DEADLINE;
    let (retry_after, message) = loop {
        let answer = http
            .put(&url)
            .bearer_auth("second")
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 503);
        let retry_after = answer.headers().get("retry-after").cloned();
        let v: serde_json::Value = answer.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap().to_owned();
        if message.contains(&last_leader) {
            break (retry_after, message);
        }
        assert!(std::time::Instant::now() < deadline, "{message}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Asking this member again does not help until the token is fixed.
    assert_eq!(retry_after, None, "{message}");
    assert!(message.contains("refuses this node's token"), "{message}");
    let status = send(&http, Method::GET, &status_of(other), Some("second"), None)
        .await
        .unwrap()
        .1;
    assert!(status["leader_id"].is_null(), "{status}");
    for node in &mut nodes {
        node.stop().await;
    }
}

/// With a member token, the members speak with it (a cluster forms and a write through a
/// follower is forwarded to the leader), and the client token does not open their routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_token_is_the_members_own() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let args = ["--token", "client", "--member-token", "member"].map(str::to_owned);
    let (mut nodes, addrs) = crate::common::spawn_members(&dirs, &args);
    // Forming a cluster names where its members listen: it takes the member token.
    let url = format!("http://{}/v1/cluster/init", addrs[0]);
    let members = format!(r#"{{"members":{{"1":"{}"}}}}"#, addrs[0]);
    let (status, v) = send(&http, Method::POST, &url, Some("client"), Some(members))
        .await
        .unwrap();
    assert_eq!(status, 403, "{v}");
    let leader = crate::common::form_cluster(&http, "http", &addrs, Some("member")).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    // So does adding a learner, through the command too; the command sends the member token
    // when it is given.
    let (ok, _, err) = run(
        &[
            "member",
            "add",
            "4",
            "127.0.0.1:9",
            "--server",
            &addrs[0],
            "--token",
            "client",
        ],
        &[],
    )
    .await;
    assert!(!ok && err.contains("member token"), "{err}");
    let (ok, out, err) = run(
        &["status", "--server", &addrs[0]],
        &[("METASERVER_MEMBER_TOKEN", "member")],
    )
    .await;
    assert!(ok && out.contains("\"leader\""), "{out}{err}");
    let url = format!("http://{}/v1/kv/k", addrs[follower - 1]);
    let (status, v) = send(&http, Method::PUT, &url, Some("client"), Some("v".into()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    for path in ["/raft/append", "/raft/identity"] {
        let url = format!("http://{}{path}", addrs[leader - 1]);
        let (status, v) = send(&http, Method::POST, &url, Some("client"), None)
            .await
            .unwrap();
        assert_eq!(status, 401, "{path}: {v}");
    }
    let (ok, out, err) = run(
        &[
            "status",
            "--server",
            &addrs[leader - 1],
            "--token",
            "client",
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("\"leader\""), "{out}");
    // A request a follower sends on to the leader is the follower's own then: it carries the
    // member token, not the client's (here one the leader does not take).
    let member = ["--token", "own", "--member-token", "member"];
    restart(&mut nodes, &dirs, &addrs, follower, &member, &[]).await;
    for (method, path, body) in [
        (Method::GET, "/v1/liveness", None),
        (Method::PUT, "/v1/kv/through-own", Some("v")),
    ] {
        let url = format!("http://{}{path}", addrs[follower - 1]);
        let deadline = std::time::Instant::now() + crate::common::DEADLINE;
        loop {
            let body = body.map(str::to_owned);
            let (status, v) = send(&http, method.clone(), &url, Some("own"), body)
                .await
                .unwrap();
            if status == 200 {
                break;
            }
            // Until the restarted follower hears from its leader, it answers 503.
            assert_eq!(status, 503, "{method} {path}: {v}");
            assert!(std::time::Instant::now() < deadline, "{method} {path}: {v}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    for node in &mut nodes {
        node.stop().await;
    }
}

/// A member restarted with a token while the others have none hears no refusal of its own
/// messages (the others take any): it says that it refuses theirs, naming the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_wants_a_token_the_others_do_not_send_says_so() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let (mut nodes, addrs) = crate::common::spawn_members(&dirs, &[]);
    let leader = crate::common::form_cluster(&http, "http", &addrs, None).await;
    let other = (1..=3).find(|id| *id != leader).unwrap();
    let env = [("METASERVER_TOKEN", "tok")];
    restart(&mut nodes, &dirs, &addrs, other, &[], &env).await;
    nodes[other - 1]
        .wait_logged(&format!("refused a message that names node {leader}"))
        .await;
    for node in &mut nodes {
        node.stop().await;
    }
}

/// With a separate member token, a node started with another client token than the cluster's
/// (the member token alone does not show it) is refused where it would join: naming it when a
/// cluster is formed, and adding it as a learner. Datanodes holding the cluster's token would be
/// refused there. The refused node joins no cluster, and is added once started with the
/// cluster's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_client_token_is_not_taken_in() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let http = client();
    let ours = ["--token", "client", "--member-token", "member"];
    let (mut nodes, addrs) = crate::common::spawn_members(&dirs, &ours.map(str::to_owned));
    let other = ["--token", "other", "--member-token", "member"];
    restart(&mut nodes, &dirs, &addrs, 2, &other, &[]).await;
    let url = format!("http://{}/v1/cluster/init", addrs[0]);
    let both = format!(r#"{{"members":{{"1":"{}","2":"{}"}}}}"#, addrs[0], addrs[1]);
    let (status, v) = send(&http, Method::POST, &url, Some("member"), Some(both))
        .await
        .unwrap();
    assert_eq!(status, 409, "{v}");
    assert!(v.to_string().contains("another client token"), "{v}");
    let alone = format!(r#"{{"members":{{"1":"{}"}}}}"#, addrs[0]);
    let (status, v) = send(&http, Method::POST, &url, Some("member"), Some(alone))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    let status_url = format!("http://{}/v1/cluster", addrs[0]);
    poll(&http, &status_url, Some("client"), |v| v["leader_id"] == 1).await;
    let add = ["member", "add", "2", &addrs[1], "--server", &addrs[0]];
    let member_token = [("METASERVER_MEMBER_TOKEN", "member")];
    let (ok, _, err) = run(&add, &member_token).await;
    assert!(!ok && err.contains("another client token"), "{err}");
    let refused_url = format!("http://{}/v1/cluster", addrs[1]);
    let (_, v) = send(&http, Method::GET, &refused_url, Some("other"), None)
        .await
        .unwrap();
    assert_eq!(v["role"], "uninitialized", "the refused node joined: {v}");
    restart(&mut nodes, &dirs, &addrs, 2, &ours, &[]).await;
    let (ok, out, err) = run(&add, &member_token).await;
    assert!(ok, "{out}{err}");
    let learner = |v: &serde_json::Value| v["role"] == "learner";
    poll(&http, &refused_url, Some("client"), learner).await;
    // A member restarted with another client token keeps its place (the member token opens
    // the members' routes), and `health`, given both tokens, names it.
    restart(&mut nodes, &dirs, &addrs, 2, &other, &[]).await;
    let both_tokens = [
        ("METASERVER_TOKEN", "client"),
        ("METASERVER_MEMBER_TOKEN", "member"),
    ];
    let health = ["health", "--server", &addrs[0]];
    let (ok, out, err) = run(&health, &both_tokens).await;
    assert!(
        !ok && err.contains("node 2") && err.contains("refuses the client token"),
        "{out}{err}"
    );
    // A wrong member token is named as such: the command sent it instead of --token.
    let wrong = [
        ("METASERVER_TOKEN", "client"),
        ("METASERVER_MEMBER_TOKEN", "x"),
    ];
    let (ok, _, err) = run(&["status", "--server", &addrs[0]], &wrong).await;
    assert!(!ok && err.contains("sent the member token"), "{err}");
    for node in &mut nodes {
        node.stop().await;
    }
}

/// A member token without a client token leaves the admin API open: the node says so at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_token_alone_is_warned_of() {
    let dirs: Vec<_> = (0..1).map(|_| tempfile::tempdir().unwrap()).collect();
    let args = ["--member-token", "member"].map(str::to_owned);
    let (mut nodes, _addrs) = crate::common::spawn_members(&dirs, &args);
    nodes[0].wait_logged("--member-token without --token").await;
    for node in &mut nodes {
        node.stop().await;
    }
}
