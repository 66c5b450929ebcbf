//! The harness itself: the `metaserver` binary is found (built when missing) and a started process
//! is killed when its handle is dropped, so no test leaves a process behind.

use std::time::Duration;

use meta_tests::binary::metaserver_binary;
use meta_tests::process::{LaunchSpec, ServerProcess};

#[test]
fn metaserver_binary_is_built_and_found() {
    let path = metaserver_binary().expect("the metaserver binary");
    assert!(path.is_file(), "{}", path.display());
}

#[tokio::test]
async fn dropped_process_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let spec = LaunchSpec {
        binary: "sleep".into(),
        args: vec![String::from("600")],
        env: Vec::new(),
        stdout_log: dir.path().join("out"),
        stderr_log: dir.path().join("err"),
    };
    let mut process = ServerProcess::spawn(&spec).expect("spawn sleep");
    let pid = process.pid();
    assert!(process.try_exit().unwrap().is_none());
    assert!(
        process.listening(Duration::from_secs(5)).await.is_err(),
        "sleep prints nothing"
    );
    drop(process);
    // The process is reaped by the drop, so its pid no longer names our child.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(
        !status.contains(&format!("PPid:\t{}", std::process::id())),
        "{status}"
    );
}
