//! A three-node cluster over TLS, as an operator sets one up: every member started with
//! `--tls-cert`, `--tls-key` and `--tls-ca`. The cluster forms (the init check asks the
//! members over TLS), writes sent to a follower reach the leader and reads at a follower are
//! answered, plain HTTP is told to use TLS, and operator commands speak TLS with `--tls-ca`.
//! Certificates the members would refuse are refused before they are used.

mod common;

use std::path::{Path, PathBuf};

use common::{poll, run, send, spawn};
use reqwest::Method;
use serde_json::json;

/// A certificate authority and a certificate it signed for 127.0.0.1 (every member's, as they
/// all listen there), as PEM files.
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    /// Makes them in `dir`.
    fn make(dir: &Path) -> Files {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let name = dir.display().to_string();
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("authority of {name}"));
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let files = Files {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&files.ca, ca.pem()).unwrap();
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    /// The `serve` flags that give a node these files.
    fn flags(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.to_str().unwrap().to_string();
        vec![
            "--tls-cert".into(),
            path(&self.cert),
            "--tls-key".into(),
            path(&self.key),
            "--tls-ca".into(),
            path(&self.ca),
        ]
    }

    /// A client that trusts the authority.
    fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(30))
            .use_preconfigured_tls(meta_http::tls::client_config_from(&self.ca).unwrap())
            .build()
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_serves_and_tells_plain_http_to_use_tls() {
    let certs_dir = tempfile::tempdir().unwrap();
    let files = Files::make(certs_dir.path());
    let http = files.client();

    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (mut nodes, addrs) = common::spawn_members(&dirs, &files.flags());
    let leader = common::form_cluster(&http, "https", &addrs, None).await;
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
    let ca_arg = files.ca.to_str().unwrap();
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

    // A member restarted without its TLS flags takes none of the others' messages, nor they
    // its: each side says that TLS is on one side only.
    let plain_id = followers[0];
    common::restart_member(&mut nodes, &dirs, &addrs, plain_id, &[], &[]).await;
    nodes[plain_id - 1]
        .wait_logged("speaks TLS only, and this node plain HTTP")
        .await;
    nodes[leader - 1]
        .wait_logged(&format!("node {plain_id} answers in plain HTTP"))
        .await;
    // `health` names it so too.
    let leader_addr = addrs[leader - 1].as_str();
    let (ok, _, err) = run(
        &["health", "--server", leader_addr, "--tls-ca", ca_arg],
        &[],
    )
    .await;
    assert!(
        !ok && err.contains(&format!("node {plain_id} at"))
            && err.contains("answers in plain HTTP, not TLS"),
        "{err}"
    );
    // A command with --tls-ca sent to it says that it answers in plain HTTP.
    let plain_addr = addrs[plain_id - 1].as_str();
    // At once: a failed handshake is not waited out as a member without a leader would be.
    for command in [
        &["status"][..],
        &["health"],
        &["watch"],
        &["member", "leader", "1"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--server", plain_addr, "--tls-ca", ca_arg]);
        let bounded = tokio::time::timeout(std::time::Duration::from_secs(30), run(&args, &[]));
        let (ok, _, err) = bounded
            .await
            .unwrap_or_else(|_| panic!("{command:?} did not give up in time"));
        assert!(
            !ok && err.contains("answers in plain HTTP"),
            "{command:?}: {err}"
        );
    }
    // With another member given after it, that one is asked.
    let both = format!("{plain_addr},{leader_addr}");
    let leader_id = leader.to_string();
    let args = [
        "member", "leader", &leader_id, "--server", &both, "--tls-ca", ca_arg,
    ];
    let (ok, out, err) = run(&args, &[]).await;
    assert!(ok, "{out}{err}");

    for node in &mut nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_part_of_its_tls_files_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::make(dir.path());
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--tls-cert",
        files.cert.to_str().unwrap(),
    ];
    let (ok, _, err) = run(&args, &[]).await;
    assert!(!ok);
    assert!(
        err.contains("--tls-key and --tls-ca missing"),
        "names what is missing: {err}"
    );
    assert!(!data.exists(), "nothing was made");
}

/// A private key's file that every user may read is warned of at start (whoever reads it can
/// answer as the node); one readable by its owner only is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_every_user_may_read_is_warned_of() {
    use std::os::unix::fs::PermissionsExt as _;
    let certs_dir = tempfile::tempdir().unwrap();
    let files = Files::make(certs_dir.path());
    const WARNING: &str = "readable by every user of this machine (mode 644)";
    for (mode, warned) in [(0o644, true), (0o600, false)] {
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(mode)).unwrap();
        let dirs = [tempfile::tempdir().unwrap()];
        // Started once it said where it listens, which it does after loading the files.
        let (mut nodes, _addrs) = common::spawn_members(&dirs, &files.flags());
        assert_eq!(nodes[0].logged(WARNING), warned, "mode {mode:o}");
        nodes[0].stop().await;
    }
}

/// `serve` of node `id` with its data in `dir`, on a port of the system's choosing, with
/// `extra` flags.
fn serve_args(id: &str, dir: &Path, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--id",
        id,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.join(format!("node{id}")).to_str().unwrap(),
        "--worker-threads",
        "1",
    ]
    .map(String::from)
    .to_vec();
    args.extend_from_slice(extra);
    args
}

/// A node whose certificate the members would refuse does not start; a member that answers
/// over TLS with a certificate this node does not trust is not added, nor one without TLS to a
/// cluster with it, nor the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_the_members_would_refuse_are_refused_first() {
    let ours_dir = tempfile::tempdir().unwrap();
    let theirs_dir = tempfile::tempdir().unwrap();
    let ours = Files::make(ours_dir.path());
    let theirs = Files::make(theirs_dir.path());

    // Its certificate names 127.0.0.1, not the host it is reached at.
    let mut extra = vec!["--advertise".to_string(), "localhost:7999".to_string()];
    extra.extend(ours.flags());
    let args = serve_args("1", ours_dir.path(), &extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = run(&args, &[]).await;
    assert!(!ok);
    assert!(
        err.contains("would refuse this node's certificate"),
        "{err}"
    );
    assert!(err.contains("localhost"), "{err}");
    assert!(!ours_dir.path().join("node1").exists(), "nothing was made");

    // Node 2 has TLS of its own: another authority than the cluster's signed its certificate.
    let start = |dir: &Path, id: &str, files: Option<&Files>, init: bool| {
        let mut extra = files.map(Files::flags).unwrap_or_default();
        if init {
            extra.push("--init".into());
        }
        let args = serve_args(id, dir, &extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        spawn(dir, dir, &args, &[], false)
    };
    let mut one = start(ours_dir.path(), "1", Some(&ours), true);
    let mut two = start(theirs_dir.path(), "2", Some(&theirs), false);
    let (one_addr, two_addr) = (one.address(), two.address());
    let http = ours.client();
    poll(&http, &format!("https://{one_addr}/readyz"), None, |_| true).await;
    let one_url = format!("https://{one_addr}");
    let message = refused_learner(&http, &one_url, 2, &two_addr).await;
    assert!(message.contains("TLS handshake"), "{message}");
    let v = poll(
        &http,
        &format!("https://{one_addr}/v1/cluster"),
        None,
        |_| true,
    )
    .await;
    assert_eq!(v["learners"], json!([]), "{v}");

    // A member without TLS is not added to a cluster with it, nor the other way round.
    let plain_dir = tempfile::tempdir().unwrap();
    let mut three = start(plain_dir.path(), "3", None, false);
    let message = refused_learner(&http, &one_url, 3, &three.address()).await;
    assert!(message.contains("does not speak TLS"), "{message}");
    let mut four = start(plain_dir.path(), "4", None, true);
    let plain = common::client();
    let four_url = format!("http://{}", four.address());
    poll(&plain, &format!("{four_url}/readyz"), None, |_| true).await;
    let message = refused_learner(&plain, &four_url, 2, &two_addr).await;
    assert!(message.contains("speaks TLS only"), "{message}");
    for node in [&mut one, &mut two, &mut three, &mut four] {
        node.stop().await;
    }
}

/// Asks the member at `base` to add node `id` at `addr` as a learner; the add must be refused
/// with 409, whose message is returned.
async fn refused_learner(http: &reqwest::Client, base: &str, id: u64, addr: &str) -> String {
    let body = json!({"id": id, "addr": addr}).to_string();
    let url = format!("{base}/v1/cluster/learners");
    let (status, v) = send(http, Method::POST, &url, None, Some(body))
        .await
        .unwrap();
    assert_eq!(status, 409, "{v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}
