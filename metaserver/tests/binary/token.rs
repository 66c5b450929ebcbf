//! The token: required by the API and the operator commands when the node is given one.

use reqwest::Method;

use crate::common::{client, poll, run, send, spawn};
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
