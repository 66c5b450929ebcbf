//! `local-cluster`: it elects a leader and takes writes at a follower (each node serving the socket
//! bound for it), refuses the serve options it sets itself, and passes a second signal on to its
//! nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{client, poll, poll_status, run, send, spawn, Proc};
use crate::helpers::register_datanode;

/// Starts `local-cluster` with `nodes` nodes on free ports under `dir`, passing `serve_options`
/// on; returns it and each node's base URL by id.
fn start(
    dir: &tempfile::TempDir,
    nodes: u64,
    serve_options: &[&str],
) -> (Proc, BTreeMap<u64, String>) {
    let data = dir.path().join("cluster");
    let nodes_arg = nodes.to_string();
    let mut args = vec![
        "local-cluster",
        "--nodes",
        &nodes_arg,
        "--base-port",
        "0",
        "--data-dir",
        data.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(serve_options);
    // The nodes' lines that name their leader, to tell whose lines are whose.
    let log = [("RUST_LOG", "warn,meta_consensus::node=info")];
    let mut cluster = spawn(dir.path(), dir.path(), &args, &log, true);
    let mut addrs = BTreeMap::new();
    for id in 1..=nodes {
        let line = cluster.wait_line(&format!("node {id} at "));
        let addr = line.split_whitespace().next().unwrap().to_owned();
        addrs.insert(id, format!("http://{addr}"));
    }
    (cluster, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_elects_a_leader_and_accepts_writes_at_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let (mut cluster, addrs) = start(&dir, 3, &["--snapshot-rate", "12345"]);
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
    // Each node's log lines say whose they are: here each node's line naming the leader.
    for id in 1..=3 {
        let line = format!("[node {id}] ");
        assert!(
            cluster.logged(&line) && cluster.logged(&format!("node {leader} leads")),
            "no line of node {id}: {}",
            cluster.logs()
        );
    }
    for base in addrs.values() {
        assert!(
            send(&http, Method::GET, &format!("{base}/healthz"), None, None)
                .await
                .is_err(),
            "{base} still answers"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_refuses_serve_options_it_sets_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data = data.to_str().unwrap();
    let local = ["local-cluster", "--base-port", "0", "--data-dir", data];
    for option in ["--data-dir", "--id=4", "--init"] {
        let args: Vec<&str> = local.into_iter().chain(["--", option, "x"]).collect();
        let (ok, _, err) = run(&args, &[]).await;
        assert!(!ok, "{option} accepted");
        let name = option.split('=').next().unwrap();
        assert!(
            err.contains(&format!("{name} is set by local-cluster")),
            "{err}"
        );
    }
    // An empty token, which every node would refuse, is refused before any starts.
    let args: Vec<&str> = local.into_iter().chain(["--token", ""]).collect();
    let (ok, out, err) = run(&args, &[]).await;
    assert!(!ok && err.contains("is empty"), "{err}");
    assert!(!out.contains("running"), "{out}");
    assert!(!std::path::Path::new(data).exists(), "nothing was started");
}

/// A second signal to `local-cluster` is passed on to the nodes: it ends their stop delay, and
/// they stop cleanly instead of being killed when the wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_is_passed_on_to_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    // Longer than the test may take: only a second signal ends the wait.
    let (mut cluster, addrs) = start(&dir, 1, &["--stop-delay-ms", "600000"]);
    let base = &addrs[&1];
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;

    // The first signal reaches the node: it reports that it is stopping, and waits.
    cluster.signal(libc::SIGTERM);
    poll_status(&http, &format!("{base}/readyz"), 503).await;
    cluster.signal(libc::SIGTERM);
    let exit = cluster.wait_exit().await;
    assert!(exit.success(), "{exit:?}; stderr:\n{}", cluster.logs());
}

/// A Ctrl-C at a terminal signals the whole process group. The nodes hear it from their parent
/// alone, once: it starts their stop, and their stop delay runs, rather than counting as the
/// second signal that cuts the stop short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_c_to_the_process_group_reaches_each_node_once() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let (mut cluster, addrs) = start(&dir, 1, &["--stop-delay-ms", "600000"]);
    let ready = format!("{}/readyz", addrs[&1]);
    poll(&http, &ready, None, |_| true).await;
    cluster.signal_group(libc::SIGINT);
    poll_status(&http, &ready, 503).await;
    // It stays stopping (a second signal would have ended the delay, and the node, at once).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        poll_status(&http, &ready, 503).await;
    }
    cluster.signal(libc::SIGTERM);
    let exit = cluster.wait_exit().await;
    assert!(exit.success(), "{exit:?}; stderr:\n{}", cluster.logs());
}

/// `serve --listen-fd` (how `local-cluster` hands a node the socket it bound for it) serves only
/// a listening socket: a descriptor that is none (here its standard input, `/dev/null`) is
/// refused at once, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_inherited_descriptor_that_is_not_a_listening_socket() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen-fd",
        "0",
    ];
    let (ok, _, err) = run(&args, &[]).await;
    assert!(!ok, "served a descriptor that is not a listening socket");
    assert!(
        err.contains("--listen-fd 0 is not a listening socket"),
        "{err}"
    );
}
