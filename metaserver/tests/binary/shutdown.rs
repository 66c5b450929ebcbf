//! Graceful shutdown: SIGTERM loses nothing acknowledged and answers waiting watches at
//! once, a stop delay reports not ready while the node still serves, and SIGHUP stops it as
//! SIGTERM does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::{json, Value};

use crate::common;
use crate::common::{client, poll, poll_status, send, spawn};
use crate::helpers::{default_server, register_datanode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_cleanly_and_loses_nothing_acknowledged() {
    let (dir, http, mut server, base) = default_server().await;
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];

    // Eight writers put keys as fast as they can; every acknowledged one is recorded.
    let acked: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (http, base, acked) = (http.clone(), base.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            for i in 0..100_000u64 {
                let key = format!("w{w}/k{i:06}");
                let value = format!("value {w} {i}");
                match send(
                    &http,
                    Method::PUT,
                    &format!("{base}/v1/kv/{key}"),
                    None,
                    Some(value.clone()),
                )
                .await
                {
                    Ok((200, _)) => {
                        acked.lock().unwrap().insert(key, value);
                    }
                    // The server is going away: refused connections or 503 while draining.
                    _ => return,
                }
            }
        }));
    }
    let deadline = std::time::Instant::now() + common::DEADLINE;
    while acked.lock().unwrap().len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "writes are not acknowledged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.stop().await;
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    let mut missing = Vec::new();
    for (key, value) in &acked {
        let (status, body) = send(
            &http,
            Method::GET,
            &format!("{base}/v1/kv/{key}"),
            None,
            None,
        )
        .await
        .unwrap();
        if status != 200 || body != Value::String(value.clone()) {
            missing.push(format!("{key}: {status} {body}"));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes lost: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_waiting_watch_at_once() {
    let (_dir, http, mut server, base) = default_server().await;
    let start = poll(&http, &format!("{base}/v1/watch"), None, |_| true).await;
    let index = start["index"].as_u64().unwrap();
    let watch = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let url = format!("{base}/v1/watch?after={index}&wait_ms=55000");
            send(&http, Method::GET, &url, None, None).await
        })
    };
    // Once the watch waits at the server (its gauge says so), stop the server.
    poll(&http, &format!("{base}/metrics"), None, |v| {
        v.as_str()
            .is_some_and(|t| t.contains("metaserver_watches_waiting 1"))
    })
    .await;
    server.stop().await;
    // The drain waits for running requests up to 15 s: a watch that held it would show here.
    server.assert_drained();
    let (status, v) = watch.await.unwrap().expect("the watch was answered");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["events"], json!([]), "{v}");
}

/// With a stop delay, a signalled node first reports not ready while it still serves (so a
/// load balancer takes it out of rotation before its port closes), and a second signal ends
/// the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_delay_reports_not_ready_while_still_serving() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    // Longer than the test may take: only the second signal ends the wait.
    let env = [
        ("METASERVER_LISTEN", "127.0.0.1:0"),
        ("METASERVER_STOP_DELAY_MS", "600000"),
    ];
    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;

    server.signal(libc::SIGTERM);
    let v = poll_status(&http, &format!("{base}/readyz"), 503).await;
    assert!(v.to_string().contains("stopping"), "{v}");
    // Still serving.
    register_datanode(&http, &base, 3, None).await;

    // The stop delay outlasts the wait for the exit: only the second signal ends it.
    server.signal(libc::SIGTERM);
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
}

/// SIGHUP (the terminal that started the node went away) stops it as SIGTERM does, cleanly,
/// instead of killing it without a hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_the_node_cleanly() {
    let (_dir, http, mut server, base) = default_server().await;
    register_datanode(&http, &base, 3, None).await;
    server.signal(libc::SIGHUP);
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{exit:?}: {}", server.logs());
}
