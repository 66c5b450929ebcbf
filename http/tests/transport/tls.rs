//! A node served over TLS (`Server::tls`): clients that trust its authority are answered,
//! plain HTTP is told to use TLS, clients that trust another authority are not answered, a client that never completes
//! its handshake holds up no other, changed files are taken by later connections (unless they
//! do not work together), a missing file is reported once, unusable TLS files are refused
//! naming the file, and `/metrics` tells when the certificate expires and whether the files
//! are refused.

use std::path::Path;
use std::time::Duration;

use meta_http::connection_metrics::HandshakeFailure;
use meta_http::{LimitedListener, PeerClient, Server, Tls, TlsError, Token};
use tempfile::TempDir;
use tokio::net::TcpListener;

use crate::common::{certificates, certificates_with, leader_node, Certificates, DEADLINE};

fn client_trusting(ca: &Path) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(DEADLINE)
        .use_preconfigured_tls(meta_http::tls::client_config_from(ca).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_node_served_over_tls_answers_only_over_tls_with_its_authority() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let theirs = certificates(dir.path(), "theirs");
    let tls = Tls::load(&ours.cert, &ours.key, &ours.ca).unwrap();

    let served = Served::start(tls).await;
    let addr = served.addr;

    // A connection that opens and never says anything does not hold up the others: the
    // handshakes run on their own.
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();

    let trusting = client_trusting(&ours.ca);
    let url = format!("https://{addr}/v1/kv/k");
    let answer = trusting.put(&url).body("v").send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let answer = trusting.get(&url).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "v");

    // Plain HTTP is told to use TLS, and changes nothing; a client of another authority gets
    // no answer.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let refused = plain
        .put(format!("http://{addr}/v1/kv/k"))
        .body("plain")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "tls_required", "{body}");
    let answer = trusting.get(&url).send().await.unwrap();
    assert_eq!(answer.text().await.unwrap(), "v");
    let refused = client_trusting(&theirs.ca)
        .get(format!("https://{addr}/healthz"))
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");

    // Both counted, once the node's end of each connection is done with it.
    let connections = served.metrics.connections();
    crate::common::wait_for(
        || {
            connections.handshake_failures(HandshakeFailure::NotTls) == 1
                && connections.handshake_failures(HandshakeFailure::CertificateRefused) == 1
        },
        "the plain request and the refusal are counted",
    )
    .await;
    let text = served.metrics.encode().unwrap();
    assert!(text.contains("metaserver_connection_slots 100\n"), "{text}");
    assert!(text.contains("metaserver_connections_open "), "{text}");

    // The node still serves, with the silent client still connected.
    let answer = trusting
        .get(format!("https://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    drop(silent);
    served.stop().await;
}

/// A leader node served over TLS on an ephemeral port.
struct Served {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    metrics: meta_http::Metrics,
    _node: crate::common::TestNode,
}

impl Served {
    async fn start(tls: Tls) -> Served {
        let node = leader_node(None).await;
        let state = meta_http::AppState::new(node.node.clone(), Token::new(None));
        let metrics = state.metrics.clone();
        let app = meta_http::router(state);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            Server::new(LimitedListener::new(listener, 100), app)
                .tls(Some(tls))
                .metrics(metrics.connections().clone())
                .serve(async {
                    let _ = stopped.await;
                }),
        );
        Served {
            addr,
            stop,
            task,
            metrics,
            _node: node,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server stops")
            .unwrap();
    }
}

/// Whether a new client trusting `ca` is answered at `addr`.
async fn answered(ca: &Path, addr: std::net::SocketAddr) -> bool {
    client_trusting(ca)
        .get(format!("https://{addr}/healthz"))
        .send()
        .await
        .is_ok_and(|a| a.status() == 200)
}

/// Where a node's own TLS files are kept in `dir`, which a test fills with [`install`].
fn node_files(dir: &Path) -> Certificates {
    Certificates {
        ca: dir.join("node-ca.pem"),
        cert: dir.join("node-cert.pem"),
        key: dir.join("node-key.pem"),
    }
}

/// Writes the files of `from` over `to`'s.
fn install(from: &Certificates, to: &Certificates) {
    std::fs::copy(&from.ca, &to.ca).unwrap();
    std::fs::copy(&from.cert, &to.cert).unwrap();
    std::fs::copy(&from.key, &to.key).unwrap();
}

#[tokio::test]
async fn changed_tls_files_are_taken_by_later_connections() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let theirs = certificates(dir.path(), "theirs");
    let files = node_files(dir.path());
    let install = |from: &Certificates| install(from, &files);
    install(&ours);
    let tls = Tls::load(&files.cert, &files.key, &files.ca).unwrap();
    // The node's own client for the other members, made at start as the binary makes it.
    let peers = PeerClient::new(Some(&tls));
    let served = Served::start(tls.clone()).await;
    let addr = served.addr;
    assert!(!tls.reload(None).unwrap(), "nothing changed");
    assert!(answered(&ours.ca, addr).await);

    // New files: later connections are answered with the new certificate, and the node's
    // client checks members against the new authority.
    install(&theirs);
    assert!(tls.reload(None).unwrap());
    assert!(answered(&theirs.ca, addr).await);
    assert!(!answered(&ours.ca, addr).await);
    let asked = peers
        .http()
        .get(peers.url(&addr.to_string(), "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 200);

    // A key that is not the certificate's is refused, and the node keeps what it had; the
    // refused set is not tried again until a file changes.
    std::fs::copy(&ours.key, &files.key).unwrap();
    let err = tls.reload(None).unwrap_err();
    assert!(matches!(err, TlsError::Config(_)), "{err}");
    assert!(answered(&theirs.ca, addr).await);
    assert!(!tls.reload(None).unwrap());
    served.stop().await;
}

/// A gauge of the node's `/metrics`, read over TLS with `ca`.
async fn gauge(ca: &Path, addr: std::net::SocketAddr, name: &str) -> i64 {
    let text = client_trusting(ca)
        .get(format!("https://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Why the node at `addr` refuses its TLS files as they are now, as its `GET /v1/cluster`
/// says (`health` reads it there), read over TLS with `ca`.
async fn files_refused(ca: &Path, addr: std::net::SocketAddr) -> Option<String> {
    let view: serde_json::Value = client_trusting(ca)
        .get(format!("https://{addr}/v1/cluster"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    view["tls_files_refused"].as_str().map(str::to_owned)
}

/// Fails unless the node at `addr` says it refuses its TLS files naming `what`.
async fn refused_naming(ca: &Path, addr: std::net::SocketAddr, what: &str) {
    let refused = files_refused(ca, addr).await.unwrap_or_default();
    assert!(refused.contains(what), "{refused:?}");
}

/// `/metrics` gives when the members stop accepting the certificate taken last (its end of
/// validity, to the second), and whether the files as they are now are refused: a refused
/// set, a missing file, and neither once the files taken before are back. The node's status
/// says why it refuses them.
#[tokio::test]
async fn the_metrics_tell_the_certificates_end_and_refused_files() {
    const EXPIRY: &str = "metaserver_tls_certificate_expiry_timestamp_seconds";
    const REFUSED: &str = "metaserver_tls_files_refused";
    let dir = TempDir::new().unwrap();
    let until = |name, year| {
        certificates_with(dir.path(), name, |p| {
            p.not_after = rcgen::date_time_ymd(year, 1, 1);
        })
    };
    let (to_2100, to_2090) = (until("to-2100", 2100), until("to-2090", 2090));
    let files = node_files(dir.path());
    let install = |from: &Certificates| install(from, &files);
    install(&to_2100);
    let tls = Tls::load(&files.cert, &files.key, &files.ca).unwrap();
    let served = Served::start(tls.clone()).await;
    let addr = served.addr;
    // 2100-01-01T00:00:00Z and 2090-01-01T00:00:00Z.
    assert_eq!(gauge(&to_2100.ca, addr, EXPIRY).await, 4_102_444_800);
    assert_eq!(gauge(&to_2100.ca, addr, REFUSED).await, 0);

    install(&to_2090);
    assert!(tls.reload(None).unwrap());
    assert_eq!(gauge(&to_2090.ca, addr, EXPIRY).await, 3_786_912_000);

    // A key that is not the certificate's: refused, the certificate in use is unchanged.
    std::fs::copy(&to_2100.key, &files.key).unwrap();
    tls.reload(None).unwrap_err();
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 1);
    assert_eq!(gauge(&to_2090.ca, addr, EXPIRY).await, 3_786_912_000);
    let mismatch = files_refused(&to_2090.ca, addr).await.unwrap_or_default();
    assert!(mismatch.contains("key"), "{mismatch:?}");
    assert!(!tls.reload(None).unwrap(), "the same refused set");
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 1);
    assert_eq!(
        files_refused(&to_2090.ca, addr).await,
        Some(mismatch.clone())
    );
    std::fs::copy(&to_2090.key, &files.key).unwrap();
    assert!(tls.reload(None).unwrap());
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 0);
    assert_eq!(files_refused(&to_2090.ca, addr).await, None);

    // A missing file, then the bytes taken before back: nothing to take, nothing refused.
    std::fs::remove_file(&files.ca).unwrap();
    tls.reload(None).unwrap_err();
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 1);
    refused_naming(&to_2090.ca, addr, &files.ca.display().to_string()).await;
    std::fs::copy(&to_2090.ca, &files.ca).unwrap();
    assert!(!tls.reload(None).unwrap());
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 0);
    assert_eq!(files_refused(&to_2090.ca, addr).await, None);

    // A refused set, a file missing meanwhile, then the refused set back: refused for what
    // is wrong with the set, not for the file that was missing.
    std::fs::copy(&to_2100.key, &files.key).unwrap();
    tls.reload(None).unwrap_err();
    std::fs::remove_file(&files.ca).unwrap();
    tls.reload(None).unwrap_err();
    refused_naming(&to_2090.ca, addr, &files.ca.display().to_string()).await;
    std::fs::copy(&to_2090.ca, &files.ca).unwrap();
    assert!(!tls.reload(None).unwrap());
    assert_eq!(gauge(&to_2090.ca, addr, REFUSED).await, 1);
    assert_eq!(files_refused(&to_2090.ca, addr).await, Some(mismatch));
    served.stop().await;
}

#[test]
fn unusable_tls_files_are_refused_naming_the_file() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let theirs = certificates(dir.path(), "theirs");
    let missing = dir.path().join("missing.pem");

    let err = Tls::load(&missing, &ours.key, &ours.ca).unwrap_err();
    assert!(matches!(err, TlsError::File { .. }), "{err}");
    assert!(err.to_string().contains("missing.pem"), "{err}");

    // A key file holds no certificate, and a certificate no key.
    let err = Tls::load(&ours.key, &ours.key, &ours.ca).unwrap_err();
    assert!(err.to_string().contains("ours-key.pem"), "{err}");
    let err = Tls::load(&ours.cert, &ours.cert, &ours.ca).unwrap_err();
    assert!(err.to_string().contains("no PEM private key"), "{err}");
    let encrypted = dir.path().join("encrypted.pem");
    std::fs::write(
        &encrypted,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let err = Tls::load(&ours.cert, &encrypted, &ours.ca).unwrap_err();
    assert!(err.to_string().contains("the key is encrypted"), "{err}");

    // Another certificate's key.
    let err = Tls::load(&ours.cert, &theirs.key, &ours.ca).unwrap_err();
    assert!(matches!(err, TlsError::Config(_)), "{err}");
    assert!(err.to_string().contains("not the certificate's"), "{err}");
    assert!(err.to_string().contains("ours-cert.pem"), "{err}");

    // An X.509 version 1 certificate (no extensions) is named as such, not as a key mismatch.
    let (v1_cert, v1_key, v1_ca) = (
        dir.path().join("v1-cert.pem"),
        dir.path().join("v1-key.pem"),
        dir.path().join("v1-ca.pem"),
    );
    std::fs::write(&v1_cert, V1_CERT).unwrap();
    std::fs::write(&v1_key, V1_KEY).unwrap();
    std::fs::write(&v1_ca, V1_CA).unwrap();
    let err = Tls::load(&v1_cert, &v1_key, &v1_ca).unwrap_err();
    assert!(err.to_string().contains("X.509 version 1"), "{err}");
    assert!(!err.to_string().contains("not the certificate's"), "{err}");
}

/// A certificate for 127.0.0.1 made as `openssl x509 -req` makes one without `-extfile`:
/// X.509 version 1, signed by [`V1_CA`]; its key is [`V1_KEY`].
const V1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBHDCBxAIUDHowBCY+7KcVUhk0EUZDSV7mB5YwCgYIKoZIzj0EAwIwDTELMAkG
A1UEAwwCY2EwIBcNMjYxMjA3MDc0NzUyWhgPMjEyNjExMTMwNzQ3NTJaMBQxEjAQ
BgNVBAMMCTEyNy4wLjAuMTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABCEdjboU
X0sHvhllUJM3tpLHCdykNPaiPPcmNPg2paupvhJiOT87suldqFVGK0YwYxVy7aOl
2q7jZWifEju+4JswCgYIKoZIzj0EAwIDRwAwRAIgJC563/6mUN6D8duKwis93tYV
Bp1pveHmVf1NyaUDLiMCIG4ZtS7e4EKv9XAIR22ea/FlASuGXcoV/Gtxp0HM7gWe
-----END CERTIFICATE-----\n";
const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgavbVnD7fT64v79wD
9Bhm1Q8Oo3tGJYX95C2LAq9ackahRANCAAQhHY26FF9LB74ZZVCTN7aSxwncpDT2
ojz3JjT4NqWrqb4SYjk/O7LpXahVRitGMGMVcu2jpdqu42VonxI7vuCb
-----END PRIVATE KEY-----\n";
const V1_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBcTCCARegAwIBAgIUcOoHm5j0sYEwtN2XJMy7T85aaiQwCgYIKoZIzj0EAwIw
DTELMAkGA1UEAwwCY2EwIBcNMjYxMjA3MDc0NzUyWhgPMjEyNjExMTMwNzQ3NTJa
MA0xCzAJBgNVBAMMAmNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEubjbyDJT
s5/LBeMK6L8kUnji383dl6U28Zsrm35qCRvVAcGIbUpwPNAnU0rxqbD0y4Z/vjKW
IaUq8N36pVDQj6NTMFEwHQYDVR0OBBYEFItw73gNKXYaE2SaG3wXq0QsmPErMB8G
A1UdIwQYMBaAFItw73gNKXYaE2SaG3wXq0QsmPErMA8GA1UdEwEB/wQFMAMBAf8w
CgYIKoZIzj0EAwIDSAAwRQIgFKfjacG9kWHpvRJKDccsGC6J1y68Xem1s3AvJjys
wIkCIQC6I6AE/dbAx7anAZXQ56j11L0HaHycbsKcAAwLeJYqhw==
-----END CERTIFICATE-----\n";

/// A connection in the members' reserve that completes no handshake is closed after the
/// reserve's own short wait, not the idle timeout: outsiders cannot keep the members out.
#[tokio::test(start_paused = true)]
async fn a_reserve_connection_without_a_handshake_is_closed_soon() {
    use tokio::io::AsyncReadExt as _;

    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let tls = Tls::load(&ours.cert, &ours.key, &ours.ca).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let tcp = meta_http::connection_limit::bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = tcp.local_addr().unwrap();
    let idle = meta_http::server::MEMBERS_IDLE_TIMEOUT * 20;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        Server::new(LimitedListener::new(tcp, 1), app)
            .idle_timeout(Some(idle))
            .tls(Some(tls))
            .serve(async {
                let _ = stopped.await;
            }),
    );
    // The one slot, taken by a client that says nothing; the next connection is the reserve's.
    let first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut reserve = tokio::net::TcpStream::connect(addr).await.unwrap();
    let before = tokio::time::Instant::now();
    let mut bytes = Vec::new();
    let _ = reserve.read_to_end(&mut bytes).await;
    assert!(bytes.is_empty());
    assert!(before.elapsed() < idle, "{:?}", before.elapsed());
    let _ = stop.send(());
    drop(first);
    task.await.unwrap();
}

/// A node checks its own certificate as the members will: signed by an authority of its
/// `--tls-ca`, naming the node's host, valid now; and says when it expires soon.
#[test]
fn a_certificate_the_members_would_refuse_is_found_before_it_is_used() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let theirs = certificates(dir.path(), "theirs");
    let tls = Tls::load(&ours.cert, &ours.key, &ours.ca).unwrap();
    tls.check_identity(Some("127.0.0.1")).unwrap();
    let err = tls.check_identity(Some("127.0.0.2")).unwrap_err();
    assert!(err.to_string().contains("ours-cert.pem"), "{err}");
    assert!(err.to_string().contains("127.0.0.2"), "{err}");

    // Signed by another authority than the members'.
    let foreign = Tls::load(&ours.cert, &ours.key, &theirs.ca).unwrap();
    let err = foreign.check_identity(Some("127.0.0.1")).unwrap_err();
    // Also for a node that gives no host (it listens on every interface): only the name is
    // not checked.
    foreign.check_identity(None).unwrap_err();
    Tls::load(&ours.cert, &ours.key, &ours.ca)
        .unwrap()
        .check_identity(None)
        .unwrap();
    assert!(err.to_string().contains("theirs-ca.pem"), "{err}");

    // Expired, and valid for a while yet.
    let expired = certificates_with(dir.path(), "expired", |p| {
        p.not_before = rcgen::date_time_ymd(2019, 1, 1);
        p.not_after = rcgen::date_time_ymd(2020, 1, 1);
    });
    let tls = Tls::load(&expired.cert, &expired.key, &expired.ca).unwrap();
    let err = tls.check_identity(Some("127.0.0.1")).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
    tls.check_identity(None).unwrap_err();
    assert_eq!(tls.expires_within_days(), Some(0));
    let until_2100 = certificates_with(dir.path(), "until-2100", |p| {
        p.not_after = rcgen::date_time_ymd(2100, 1, 1);
    });
    let tls = Tls::load(&until_2100.cert, &until_2100.key, &until_2100.ca).unwrap();
    let day = Duration::from_secs(86_400);
    assert!(tls.valid_for(Some("127.0.0.1"), day));
    assert!(!tls.valid_for(Some("127.0.0.1"), day * 365 * 200));
    assert_eq!(tls.expires_within_days(), None);
}

/// With the node's host, a reload refuses files whose certificate does not name it.
#[test]
fn a_reload_refuses_a_certificate_for_another_host() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let elsewhere = certificates_with(dir.path(), "elsewhere", |p| {
        p.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.2".parse().unwrap())];
    });
    let files = dir.path().join("node");
    std::fs::create_dir(&files).unwrap();
    let (ca, cert, key) = (files.join("ca"), files.join("cert"), files.join("key"));
    for (from, to) in [(&ours.ca, &ca), (&ours.cert, &cert), (&ours.key, &key)] {
        std::fs::copy(from, to).unwrap();
    }
    let tls = Tls::load(&cert, &key, &ca).unwrap();
    for (from, to) in [
        (&elsewhere.ca, &ca),
        (&elsewhere.cert, &cert),
        (&elsewhere.key, &key),
    ] {
        std::fs::copy(from, to).unwrap();
    }
    let err = tls.reload(Some("127.0.0.1")).unwrap_err();
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
    tls.check_identity(Some("127.0.0.1")).unwrap();
}

/// A file that goes missing is reported by one reload, not by every one while it stays
/// missing; once it is back (the same bytes), nothing changed, and a file that goes missing
/// again is reported again.
#[test]
fn a_missing_file_is_reported_once_while_it_stays_missing() {
    let dir = TempDir::new().unwrap();
    let ours = certificates(dir.path(), "ours");
    let ca = dir.path().join("node-ca.pem");
    std::fs::copy(&ours.ca, &ca).unwrap();
    let tls = Tls::load(&ours.cert, &ours.key, &ca).unwrap();

    std::fs::remove_file(&ca).unwrap();
    let err = tls.reload(None).unwrap_err();
    assert!(matches!(err, TlsError::File { .. }), "{err}");
    assert!(err.to_string().contains("node-ca.pem"), "{err}");
    for _ in 0..3 {
        assert!(!tls.reload(None).unwrap(), "reported again");
    }

    std::fs::copy(&ours.ca, &ca).unwrap();
    assert!(!tls.reload(None).unwrap(), "the same bytes are no change");
    std::fs::remove_file(&ca).unwrap();
    assert!(tls.reload(None).is_err(), "missing again: reported again");
}
