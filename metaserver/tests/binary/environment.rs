//! Settings: the node's `METASERVER_*` variables are read by the node only, and a first start
//! refused for its --peers leaves its data dir as it was.

use std::time::Duration;

use crate::common::run;

/// A bad `serve` setting in the environment fails `serve`, and leaves the operator commands
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_node_variable_fails_the_node_only() {
    let bad = [("METASERVER_WORKER_THREADS", "many")];
    let dir = tempfile::tempdir().unwrap();
    // An operator command that fails on its own (it reads its file before it sends anything).
    let missing = dir.path().join("missing.json");
    let register = [
        "register",
        "--datanode",
        "1",
        "--file",
        missing.to_str().unwrap(),
    ];
    let (ok, _, err) = run(&register, &bad).await;
    assert!(!ok, "the file is missing");
    assert!(!err.contains("worker-threads"), "{err}");
    assert!(err.contains("missing.json"), "{err}");
    let data = dir.path().join("data");
    let args = ["serve", "--data-dir", data.to_str().unwrap()];
    let serve = run(&args, &bad);
    let (ok, _, err) = tokio::time::timeout(Duration::from_secs(60), serve)
        .await
        .expect("serve refuses a bad setting at once");
    assert!(!ok);
    assert!(err.contains("worker-threads"), "{err}");
    // Named as the variable it came from, which is all the operator set.
    assert!(
        err.contains("came from the environment variable METASERVER_WORKER_THREADS"),
        "{err}"
    );
    // A flag given on the command line is the flag's.
    let typed = ["serve", "--worker-threads", "many"];
    let (ok, _, err) = run(&typed, &[]).await;
    assert!(!ok && err.contains("worker-threads"), "{err}");
    assert!(!err.contains("environment variable"), "{err}");
}

/// A node logs the settings it runs with, defaults filled in, so that an operator can confirm
/// that a variable took effect (and that a token is set, without the token), and where it
/// keeps its data (an absolute path) and listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_logs_the_settings_in_effect() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("METASERVER_LISTEN", "127.0.0.1:0"),
        ("METASERVER_KEEP_LOGS", "123"),
        ("METASERVER_TOKEN", "settings-secret"),
        ("METASERVER_WORKER_THREADS", "1"),
        ("METASERVER_IDLE_TIMEOUT_SECS", "60"),
        ("RUST_LOG", "info,openraft=warn"),
    ];
    let mut node = crate::common::spawn(dir.path(), dir.path(), &[], &env, false);
    node.address();
    node.stop().await;
    let logs = node.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("settings in effect"))
        .unwrap_or_else(|| panic!("no settings line in:\n{logs}"));
    for expected in [
        "keep_logs=123",
        "barrier=Shared",
        "wal_segment_bytes=67108864",
        "token=true",
        "worker_threads=1",
        "idle_timeout_secs=60",
        "stop_delay_ms=0",
        "init=true",
        "listen=127.0.0.1:0",
    ] {
        assert!(line.contains(expected), "{expected} missing from {line}");
    }
    // The default data dir, relative, is named as the absolute path it is at.
    let data_dir = dir.path().join("metaserver-data");
    let expected = format!("data_dir={} ", data_dir.display());
    assert!(line.contains(&expected), "{expected} missing from {line}");
    assert!(!logs.contains("settings-secret"), "the token was logged");
}

/// A first start with --init whose --peers cannot form a cluster (another node at this node's
/// address: a wrong --id) is refused before the data dir records the wrong id, so the start
/// with the right id goes on with the same dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_refused_for_its_peers_leaves_the_data_dir_unstamped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let peers = format!("1={listen},2=127.0.0.1:1");
    let args = |id: &'static str| {
        [
            "serve",
            "--id",
            id,
            "--listen",
            listen.as_str(),
            "--data-dir",
            data.to_str().unwrap(),
            "--peers",
            peers.as_str(),
            "--init",
            "--worker-threads",
            "1",
        ]
    };
    let (ok, _, err) = crate::common::run(&args("4"), &[]).await;
    assert!(!ok);
    assert!(err.contains("each member needs its own address"), "{err}");
    assert!(!data.join("node-id").exists(), "the dir records no id");

    let mut node = crate::common::spawn(dir.path(), dir.path(), &args("1"), &[], false);
    let addr = node.address();
    assert_eq!(addr, listen);
    node.stop().await;
    assert!(
        !node.logged("belongs to node"),
        "the dir was taken: {}",
        node.logs()
    );
}

/// A token given on the command line, where anyone on the machine reads it, is warned about;
/// one from the environment is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_on_the_command_line_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--init",
    ];
    let warning = "--token was given on the command line";
    let mut typed: Vec<&str> = args.to_vec();
    typed.extend(["--token", "s3cret"]);
    let mut node = crate::common::spawn(dir.path(), dir.path(), &typed, &[], false);
    node.address();
    assert!(node.logged(warning), "{}", node.logs());
    node.stop().await;
    let env = [("METASERVER_TOKEN", "s3cret")];
    let mut node = crate::common::spawn(dir.path(), dir.path(), &args, &env, false);
    node.address();
    assert!(!node.logged(warning), "{}", node.logs());
    node.stop().await;
}
