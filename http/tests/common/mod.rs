//! Shared helpers of the router tests: a real single-node `MetaNode` over a temp dir (with
//! the in-process transport, initialized as a one-node cluster) behind the real router, and
//! a small request helper for tower's `oneshot`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use meta_consensus::transport::LocalRouter;
use meta_consensus::{MetaNode, Node, NodeConfig, Role};
use meta_http::{AppState, Token};
use serde_json::Value;
use tempfile::TempDir;
use tower::ServiceExt;

/// How long a test waits for the node to reach a state.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A node, its router and its data dir (deleted on drop).
pub struct TestNode {
    pub node: MetaNode,
    pub app: Router,
    pub dir: TempDir,
}

/// A node's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (panics with the body if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The error code of an error answer, checking the error shape on the way.
    pub fn error_code(&self) -> String {
        let v = self.json();
        let error = v
            .get("error")
            .unwrap_or_else(|| panic!("not an error body: {v}"));
        assert!(
            error.get("message").and_then(Value::as_str).is_some(),
            "{v}"
        );
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
        error["code"].as_str().expect("code").to_owned()
    }

    /// The message of an error answer (panics if it is none).
    pub fn error_message(&self) -> String {
        let v = self.json();
        v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message: {v}"))
            .to_owned()
    }
}

/// A config for a test node: short timeouts so failures surface quickly.
pub fn test_config(id: u64, addr: &str, dir: &std::path::Path) -> NodeConfig {
    let mut cfg = NodeConfig::new(id, addr, dir);
    cfg.heartbeat_ms = 50;
    cfg.election_min_ms = 300;
    cfg.election_max_ms = 600;
    // The version rises only when a command needs it, as in a cluster formed by an older
    // build: tests that add a learner without asking it first (as the API does) and tests that
    // compare the registry before and after a request must not race a raise at formation
    // (the real binary's clusters raise it: `tests/`, and `consensus/tests/cluster_version.rs`).
    cfg.raise_version_at_formation = false;
    cfg
}

/// Opens a node over the in-process transport, without initializing it.
pub async fn open_node(token: Option<&str>) -> TestNode {
    open_node_tuned(token, |_| {}).await
}

/// [`open_node`] with `tune` applied to the node's config.
pub async fn open_node_tuned(token: Option<&str>, tune: fn(&mut NodeConfig)) -> TestNode {
    let dir = tempfile::tempdir().expect("temp dir");
    let router = LocalRouter::new();
    let mut cfg = test_config(1, "127.0.0.1:1", dir.path());
    tune(&mut cfg);
    let node = MetaNode::open(cfg, router.network(1))
        .await
        .expect("open node");
    router.register(node.clone());
    let app = meta_http::router(AppState::new(node.clone(), Token::new(token)));
    TestNode { node, app, dir }
}

/// Opens a node and initializes it as a one-node cluster; returns once it leads.
pub async fn leader_node(token: Option<&str>) -> TestNode {
    leader_node_tuned(token, |_| {}).await
}

/// [`leader_node`] with `tune` applied to the node's config.
pub async fn leader_node_tuned(token: Option<&str>, tune: fn(&mut NodeConfig)) -> TestNode {
    let t = open_node_tuned(token, tune).await;
    t.node
        .initialize(BTreeMap::from([(1, Node::new("127.0.0.1:1"))]))
        .await
        .expect("initialize");
    wait_for(
        || {
            let s = t.node.status();
            // Leading, and its first entry (the leader's blank entry) committed and applied.
            s.role == Role::Leader && s.applied >= Some(1)
        },
        "node 1 leads",
    )
    .await;
    // The router's readiness latch was created before the cluster existed; rebuild it.
    let app = meta_http::router(AppState::new(t.node.clone(), Token::new(token)));
    TestNode { app, ..t }
}

/// Polls `cond` until it holds or the deadline passes.
pub async fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends one request through the router.
pub async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(body.into()).expect("request"))
        .await
        .expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    Answer {
        status,
        headers,
        body,
    }
}

impl TestNode {
    pub async fn get(&self, uri: &str) -> Answer {
        call(&self.app, Method::GET, uri, Body::empty(), &[]).await
    }

    pub async fn send(&self, method: Method, uri: &str, body: impl Into<Body>) -> Answer {
        call(&self.app, method, uri, body, &[]).await
    }

    /// A digest of the whole registry (its primary data: datanodes, replicas, keys, ...).
    pub async fn digest(&self) -> (u64, u64) {
        self.node.registry_digest().await.expect("digest")
    }

    /// Registers datanode `id` and returns its epoch.
    pub async fn register_datanode(&self, id: u64) -> u64 {
        let a = self
            .send(
                Method::PUT,
                &format!("/v1/datanodes/{id}"),
                format!(r#"{{"addr":"10.0.{}.{}:9000"}}"#, id / 256 % 256, id % 256),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        a.json()["epoch"].as_u64().expect("epoch")
    }
}

/// A loopback address nothing answers at (connections are refused at once): a bound socket
/// that does not listen, which keeps its port from anyone else while it lives.
pub fn refusing() -> (socket2::Socket, String) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).unwrap();
    let addr = socket
        .local_addr()
        .unwrap()
        .as_socket()
        .unwrap()
        .to_string();
    (socket, addr)
}

/// A certificate authority (named for `name`) and a certificate it signed for 127.0.0.1,
/// written as PEM files into `dir`.
pub struct Certificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn certificates(dir: &Path, name: &str) -> Certificates {
    certificates_with(dir, name, |_| {})
}

/// [`certificates`], with the member certificate's parameters changed by `change`.
pub fn certificates_with(
    dir: &Path,
    name: &str,
    change: impl FnOnce(&mut rcgen::CertificateParams),
) -> Certificates {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test authority"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    change(&mut params);
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let write = |file: &str, pem: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, pem).unwrap();
        path
    };
    Certificates {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", cert.pem()),
        key: write("key.pem", key.serialize_pem()),
    }
}
