//! A three-node cluster over TLS, as an operator sets one up: every member started with
//! `--tls-cert`, `--tls-key` and `--tls-ca`. The cluster forms (the init check asks the
//! members over TLS), writes sent to a follower reach the leader and reads at a follower are
//! answered, plain HTTP is told to use TLS, and operator commands speak TLS with `--tls-ca`.

mod common;

use std::path::{Path, PathBuf};

use common::{poll, run, send, spawn};
use reqwest::Method;
use serde_json::json;

/// Writes a certificate authority and a certificate it signed for 127.0.0.1 (every member's,
/// as they all listen there) as PEM files: (authority, certificate, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let files = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&files.0, ca.pem()).unwrap();
    std::fs::write(&files.1, cert.pem()).unwrap();
    std::fs::write(&files.2, key.serialize_pem()).unwrap();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_serves_and_tells_plain_http_to_use_tls() {
    let certs_dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs_dir.path());
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(30))
        .use_preconfigured_tls(meta_http::tls::client_config_from(&ca).unwrap())
        .build()
        .unwrap();

    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    let mut addrs = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = (i + 1).to_string();
        let data = dir.path().join("data");
        let args = [
            "serve",
            "--id",
            &id,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--worker-threads",
            "1",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-ca",
            ca.to_str().unwrap(),
        ];
        let mut node = spawn(dir.path(), dir.path(), &args, &[], false);
        addrs.push(node.address());
        nodes.push(node);
    }
    let members = json!({"members": {"1": addrs[0], "2": addrs[1], "3": addrs[2]}});
    let url = format!("https://{}/v1/cluster/init", addrs[0]);
    let (status, v) = send(&http, Method::POST, &url, None, Some(members.to_string()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    for addr in &addrs {
        poll(&http, &format!("https://{addr}/readyz"), None, |_| true).await;
    }
    let view = poll(
        &http,
        &format!("https://{}/v1/cluster", addrs[0]),
        None,
        |v| v["leader_id"].is_u64(),
    )
    .await;
    let leader = view["leader_id"].as_u64().unwrap() as usize;
    let followers: Vec<usize> = (1..=3).filter(|id| *id != leader).collect();

    // A write at a follower goes on to the leader; a read at the other follower sees it.
    let url = format!("https://{}/v1/kv/k", addrs[followers[0] - 1]);
    let (status, v) = send(&http, Method::PUT, &url, None, Some("v".into()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    let url = format!("https://{}/v1/kv/k", addrs[followers[1] - 1]);
    let (status, v) = send(&http, Method::GET, &url, None, None).await.unwrap();
    assert_eq!((status, v), (200, json!("v")));

    // Plain HTTP is told to use TLS.
    let plain = common::client();
    let url = format!("http://{}/v1/cluster", addrs[0]);
    let (status, v) = send(&plain, Method::GET, &url, None, None).await.unwrap();
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "tls_required", "{v}");

    // Operator commands speak TLS with --tls-ca, to host:port or https://host:port.
    let ca_arg = ca.to_str().unwrap();
    for server in [addrs[0].clone(), format!("https://{}", addrs[1])] {
        let (ok, out, err) = run(&["status", "--server", &server, "--tls-ca", ca_arg], &[]).await;
        assert!(ok, "{server}: {err}");
        assert!(out.contains("\"leader_id\""), "{out}");
    }
    // Without it, an https address is refused before anything is sent.
    let https = format!("https://{}", addrs[0]);
    let (ok, _, err) = run(&["status", "--server", &https], &[]).await;
    assert!(!ok);
    assert!(err.contains("--tls-ca"), "{err}");

    for node in &mut nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_part_of_its_tls_files_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cert, _) = certificates(dir.path());
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
    ];
    let (ok, _, err) = run(&args, &[]).await;
    assert!(!ok);
    assert!(
        err.contains("--tls-key and --tls-ca missing"),
        "names what is missing: {err}"
    );
    assert!(!data.exists(), "nothing was made");
}

/// A node whose certificate the members would refuse does not start; a member that answers
/// over TLS with a certificate this node does not trust is not added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_the_members_would_refuse_are_refused_first() {
    let ours_dir = tempfile::tempdir().unwrap();
    let theirs_dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(ours_dir.path());
    let (their_ca, their_cert, their_key) = certificates(theirs_dir.path());
    let tls = |(ca, cert, key): (&Path, &Path, &Path)| {
        vec![
            "--tls-cert".to_string(),
            cert.to_str().unwrap().to_string(),
            "--tls-key".to_string(),
            key.to_str().unwrap().to_string(),
            "--tls-ca".to_string(),
            ca.to_str().unwrap().to_string(),
        ]
    };

    // Its certificate names 127.0.0.1, not the host it is reached at.
    let data = ours_dir.path().join("elsewhere");
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--advertise",
        "localhost:7999",
        "--data-dir",
        data.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(tls((&ca, &cert, &key)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = run(&args, &[]).await;
    assert!(!ok);
    assert!(
        err.contains("would refuse this node's certificate"),
        "{err}"
    );
    assert!(err.contains("localhost"), "{err}");
    assert!(!data.exists(), "nothing was made");

    // Node 2 has TLS of its own: another authority than the cluster's signed its certificate.
    let start = |dir: &Path, id: &str, files: (&Path, &Path, &Path), init: bool| {
        let data = dir.join(format!("node{id}"));
        let mut args: Vec<String> = [
            "serve",
            "--id",
            id,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--worker-threads",
            "1",
        ]
        .map(String::from)
        .to_vec();
        args.extend(tls(files));
        if init {
            args.push("--init".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        spawn(dir, dir, &args, &[], false)
    };
    let mut one = start(ours_dir.path(), "1", (&ca, &cert, &key), true);
    let theirs = (
        their_ca.as_path(),
        their_cert.as_path(),
        their_key.as_path(),
    );
    let mut two = start(theirs_dir.path(), "2", theirs, false);
    let (one_addr, two_addr) = (one.address(), two.address());
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(30))
        .use_preconfigured_tls(meta_http::tls::client_config_from(&ca).unwrap())
        .build()
        .unwrap();
    poll(&http, &format!("https://{one_addr}/readyz"), None, |_| true).await;
    let url = format!("https://{one_addr}/v1/cluster/learners");
    let body = json!({"id": 2, "addr": two_addr}).to_string();
    let (status, v) = send(&http, Method::POST, &url, None, Some(body))
        .await
        .unwrap();
    assert_eq!(status, 409, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("TLS handshake"), "{message}");
    let v = poll(
        &http,
        &format!("https://{one_addr}/v1/cluster"),
        None,
        |_| true,
    )
    .await;
    assert_eq!(v["learners"], json!([]), "{v}");
    one.stop().await;
    two.stop().await;
}
