//! The command-less default node: it serves, keeps its data across restarts, and answers
//! the operator commands.

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{client, poll, run, send, spawn};
use crate::helpers::register_datanode;

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
    let (ok, out, err) = register_file(&addr, "7", &file, &[]).await;
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
    // Saved through a symbolic link, the backup replaces the file the link leads to; a path
    // that is no file at all is refused, and left as it was.
    let link = cwd.join("latest.snap");
    std::os::unix::fs::symlink(&backup, &link).unwrap();
    std::fs::write(&backup, b"an older backup").unwrap();
    // The file replaced keeps its permissions.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&backup, std::fs::Permissions::from_mode(0o640)).unwrap();
    // And its group, where the test may give it another (as root).
    // SAFETY: geteuid has no preconditions.
    let other_group = (unsafe { libc::geteuid() } == 0).then_some(65_534);
    if let Some(gid) = other_group {
        std::os::unix::fs::chown(&backup, None, Some(gid)).unwrap();
    }
    let save = |to: &std::path::Path| {
        let to = to.to_str().unwrap().to_owned();
        let addr = addr.clone();
        async move { run(&["snapshot", "save", "--server", &addr, &to], &[]).await }
    };
    let (ok, _, err) = save(&link).await;
    assert!(ok, "{err}");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(std::fs::metadata(&backup).unwrap().len(), len);
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640, "{mode:o}");
    if let Some(gid) = other_group {
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&backup).unwrap().gid(), gid);
    }
    let (ok, _, err) = save(cwd).await;
    assert!(!ok && err.contains("is a directory"), "{err}");
    assert!(cwd.is_dir());

    // A shard listed twice is refused before anything is sent, also when the two entries
    // would go in different batches (the server sees each batch alone).
    let twice = cwd.join("twice.json");
    let mut listed: Vec<Value> = (1000..11_000)
        .map(|id| json!({"id": id, "generation": 1, "size": 1}))
        .collect();
    listed.push(json!({"id": 1000, "generation": 1, "size": 2}));
    std::fs::write(&twice, Value::Array(listed).to_string()).unwrap();
    let (ok, _, err) = register_file(&addr, "7", &twice, &[]).await;
    assert!(!ok && err.contains("shard 1000 twice"), "{err}");
    let v = poll(&http, &format!("{base}/v1/datanodes/7"), None, |_| true).await;
    assert_eq!(v["shards"], 4, "a refused file registered shards");

    // Unknown datanode: a clear error, non-zero exit.
    let (ok, _, err) = register_file(&addr, "99", &file, &[]).await;
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
    let (ok, out, err) = register_file(&addr, "7", &file, &["--prune"]).await;
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

/// `metaserver register --server ADDR --datanode ID --file FILE`, then `extra`.
async fn register_file(
    addr: &str,
    datanode: &str,
    file: &std::path::Path,
    extra: &[&str],
) -> (bool, String, String) {
    let file = file.to_str().unwrap();
    let mut args = vec![
        "register",
        "--server",
        addr,
        "--datanode",
        datanode,
        "--file",
        file,
    ];
    args.extend_from_slice(extra);
    run(&args, &[]).await
}
