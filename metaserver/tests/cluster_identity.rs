//! A node initialized on its own (started with `--init`, or with no arguments) cannot be added
//! to another cluster: the add is refused with a clear error and the cluster keeps its leader.

mod common;

use common::{client, poll, send, spawn};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_not_added_as_a_learner() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    // Two one-node clusters: each initializes itself on its first start.
    let mut a = spawn(a_dir.path(), a_dir.path(), &[], &env, false);
    let mut b = spawn(b_dir.path(), b_dir.path(), &[], &env, false);
    let (a_addr, b_addr) = (a.address(), b.address());
    let base = format!("http://{a_addr}");
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    poll(&http, &format!("http://{b_addr}/readyz"), None, |_| true).await;

    let body = json!({"id": 2, "addr": b_addr}).to_string();
    let (status, v) = send(
        &http,
        Method::POST,
        &format!("{base}/v1/cluster/learners"),
        None,
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "other_cluster", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--init"), "{message}");

    // Another server at the address (it answers 404, or 501, to everything) is no metaserver.
    for status_line in ["404 Not Found", "501 Not Implemented"] {
        let other_addr = other_server(status_line).await;
        let body = json!({"id": 2, "addr": other_addr}).to_string();
        let url = format!("{base}/v1/cluster/learners");
        let (status, v) = send(&http, Method::POST, &url, None, Some(body))
            .await
            .unwrap();
        assert_eq!(status, 409, "{status_line}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("not a metaserver node"), "{message}");
    }

    // Nothing changed: no learner, and the cluster still takes writes.
    let v = poll(&http, &format!("{base}/v1/cluster"), None, |_| true).await;
    assert_eq!(v["learners"], json!([]), "{v}");
    assert_eq!(v["role"], "leader", "{v}");
    let (status, v) = send(
        &http,
        Method::PUT,
        &format!("{base}/v1/kv/k"),
        None,
        Some("v".into()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    a.stop().await;
    b.stop().await;
}

/// The address of a server that answers every request with `status_line`, as a server of
/// another kind than a metaserver would.
async fn other_server(status_line: &'static str) -> String {
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = other.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = other.accept().await {
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let answer =
                format!("HTTP/1.1 {status_line}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    addr
}

/// A node restarted at another address has the cluster move it there: a one-node cluster's
/// membership (which learners and forwarding members read) names the new address, not the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_another_address_is_moved_there() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let mut first = spawn(dir.path(), dir.path(), &[], &env, false);
    let old = first.address();
    poll(&http, &format!("http://{old}/readyz"), None, |_| true).await;
    first.stop().await;
    // Held while the node starts again, so that its port 0 cannot give it the old port.
    let _old_port = std::net::TcpListener::bind(&old).unwrap();

    let mut second = spawn(dir.path(), dir.path(), &[], &env, false);
    let new = second.address();
    assert_ne!(old, new);
    let v = poll(&http, &format!("http://{new}/v1/cluster"), None, |v| {
        v["leader_addr"] == new.as_str()
    })
    .await;
    assert_eq!(v["role"], "leader", "{v}");
    second.stop().await;
}

/// Initializing a cluster whose named members include a node of another cluster, or another
/// node than named, is refused before anything is changed (a node that formed such a cluster
/// could never lead it, nor be initialized again): over the API with 409, and at the start of a
/// node given `--init`, which exits with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_not_initialized_over_a_node_of_another_cluster() {
    let (b_dir, a_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    // Node 1 of a one-node cluster, and node 9, which waits to be initialized.
    let mut b = spawn(b_dir.path(), b_dir.path(), &[], &env, false);
    let b_addr = b.address();
    poll(&http, &format!("http://{b_addr}/readyz"), None, |_| true).await;
    let waiting = ["serve", "--id", "9", "--init", "false"];
    let mut a = spawn(a_dir.path(), a_dir.path(), &waiting, &env, false);
    let a_addr = a.address();
    let base = format!("http://{a_addr}");
    poll(&http, &format!("{base}/healthz"), None, |_| true).await;

    let init = |members: serde_json::Value| {
        let http = http.clone();
        let url = format!("{base}/v1/cluster/init");
        async move {
            let body = json!({ "members": members }).to_string();
            send(&http, Method::POST, &url, None, Some(body))
                .await
                .unwrap()
        }
    };
    let (status, v) = init(json!({"9": a_addr, "2": b_addr})).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("wrong_node")),
        "{v}"
    );
    let not_metaserver = other_server("501 Not Implemented").await;
    let (status, v) = init(json!({"9": a_addr, "3": not_metaserver})).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("conflict")),
        "{v}"
    );
    let (status, v) = init(json!({"9": a_addr, "1": b_addr})).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("other_cluster")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("belongs to a cluster already"),
        "{message}"
    );
    let v = poll(&http, &format!("{base}/v1/cluster"), None, |_| true).await;
    assert_eq!(v["role"], "uninitialized", "{v}");
    // Node 10 adopted a cluster's id (as the probe of a failed add leaves it), and so did
    // node 9: the initialize would give node 9 a fresh id, which node 10 refuses.
    let d_dir = tempfile::tempdir().unwrap();
    let waiting = ["serve", "--id", "10", "--init", "false"];
    let mut d = spawn(d_dir.path(), d_dir.path(), &waiting, &env, false);
    let d_addr = d.address();
    poll(&http, &format!("http://{d_addr}/healthz"), None, |_| true).await;
    for (id, addr) in [("9", &a_addr), ("10", &d_addr)] {
        let adopted = http
            .post(format!("http://{addr}/raft/identity"))
            .header("x-metaserver-cluster", "00000000000000ab")
            .header("x-metaserver-to", id)
            .send()
            .await
            .unwrap();
        assert_eq!(adopted.status(), 204, "node {id} adopts the id");
    }
    let (status, v) = init(json!({"9": a_addr, "10": d_addr})).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("other_cluster")),
        "{v}"
    );
    d.stop().await;
    // The refusals changed nothing: node 9 forms a cluster of its own, node 1 still leads.
    let (status, v) = init(json!({ "9": a_addr })).await;
    assert_eq!(status, 200, "{v}");
    let v = poll(&http, &format!("http://{b_addr}/v1/cluster"), None, |_| {
        true
    })
    .await;
    assert_eq!(v["role"], "leader", "{v}");
    a.stop().await;

    // Started with --init and --peers naming node 1, node 5 exits before it initializes.
    let c_dir = tempfile::tempdir().unwrap();
    let peers = format!("1={b_addr}");
    let args = ["serve", "--id", "5", "--peers", &peers, "--init"];
    let mut c = spawn(c_dir.path(), c_dir.path(), &args, &env, false);
    let exit = c.wait_exit().await;
    assert!(!exit.success(), "node 5 initialized a cluster over node 1");
    assert!(
        c.logs().contains("belongs to a cluster already"),
        "{}",
        c.logs()
    );
    b.stop().await;
}
