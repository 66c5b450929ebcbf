//! Helpers shared by the binary tests: registering a datanode, and a default node ready to
//! serve.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::common;
use crate::common::{client, poll, send, spawn};

/// Registers datanode `id` and returns its epoch.
pub async fn register_datanode(
    http: &reqwest::Client,
    base: &str,
    id: u64,
    token: Option<&str>,
) -> u64 {
    // An election may be under way for a moment (no leader: 503); registering again only
    // starts a newer epoch.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, v) = send(
            http,
            Method::PUT,
            &format!("{base}/v1/datanodes/{id}"),
            token,
            Some(json!({"addr": format!("10.0.{}.{}:9000", id / 256 % 256, id % 256)}).to_string()),
        )
        .await
        .unwrap();
        if status == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(status, 200, "{v}");
        return v["epoch"].as_u64().unwrap();
    }
}

/// A node started with no arguments (one-node cluster, port picked by the system) in a temp dir,
/// ready: the dir, a client, the process and its base URL.
pub async fn default_server() -> (tempfile::TempDir, reqwest::Client, common::Proc, String) {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let env = [("METASERVER_LISTEN", "127.0.0.1:0")];
    let mut server = spawn(dir.path(), dir.path(), &[], &env, false);
    let base = format!("http://{}", server.address());
    poll(&http, &format!("{base}/readyz"), None, |_| true).await;
    (dir, http, server, base)
}
