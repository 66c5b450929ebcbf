//! What a node logs of what it refuses: the messages between members of another cluster, and
//! TLS clients that refuse its certificate, and how often. The binary's tests share the
//! process's subscriber (a subscriber set for one thread misses the lines of callsites that
//! other threads' tests reached first); each counts only lines no other test of it writes.

mod common;

use axum::http::{Method, StatusCode};
use common::{call, leader_node};

const CLUSTER: &str = "x-metaserver-cluster";

/// What the test's node logs.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the process logs, from the first call on.
fn captured() -> Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            captured
        })
        .clone()
}

/// A member of another cluster (a node wiped and initialized anew by mistake) retries several
/// times a second for as long as it runs: each cause of refusal is logged once, and again only
/// after a while, not once per message.
#[tokio::test]
async fn a_repeated_refusal_is_logged_once_per_cause() {
    let captured = captured();
    let leader = leader_node(None).await;
    let app = &leader.app;
    for _ in 0..5 {
        for (name, value) in [(CLUSTER, "cd"), (CLUSTER, "ef"), ("x-metaserver-to", "7")] {
            let a = call(app, Method::POST, "/raft/vote", "", &[(name, value)]).await;
            assert_eq!(a.status, StatusCode::CONFLICT, "{name}: {value}: {a:?}");
        }
    }
    let logged = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    let lines = |text: &str| logged.lines().filter(|l| l.contains(text)).count();
    assert_eq!(
        lines("refused a message from another cluster"),
        2,
        "one line per other cluster:\n{logged}"
    );
    assert_eq!(
        lines("refused a message for node 7"),
        1,
        "one line for the other node:\n{logged}"
    );
}

/// Clients that refuse this node's certificate (signed by an authority they do not trust) are
/// logged at WARN, once for several: only they can tell that the certificate is at fault.
#[tokio::test]
async fn clients_that_refuse_the_certificate_are_logged_once_in_a_while() {
    let captured = captured();
    let dir = tempfile::TempDir::new().unwrap();
    let ours = common::certificates(dir.path(), "ours");
    let theirs = common::certificates(dir.path(), "theirs");
    let (ca, their_ca) = (ours.ca.clone(), theirs.ca);
    let tls = meta_http::Tls::load(&ours.cert, &ours.key, &ours.ca).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let tcp = meta_http::connection_limit::bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(
        meta_http::Server::new(meta_http::LimitedListener::new(tcp, 100), app)
            .tls(Some(tls))
            .serve(async {
                let _ = stopped.await;
            }),
    );
    let refusing = reqwest::Client::builder()
        .no_proxy()
        .use_preconfigured_tls(meta_http::tls::client_config_from(&their_ca).unwrap())
        .build()
        .unwrap();
    for _ in 0..3 {
        let refused = refusing.get(format!("https://{addr}/")).send().await;
        assert!(refused.is_err(), "{refused:?}");
    }
    let trusting = reqwest::Client::builder()
        .no_proxy()
        .use_preconfigured_tls(meta_http::tls::client_config_from(&ca).unwrap())
        .build()
        .unwrap();
    let a = trusting
        .get(format!("https://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    // The refusals reach the node's handshakes after the clients gave up.
    let logged = || String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    let refused = "refused this node's certificate";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !logged().contains(refused) {
        assert!(std::time::Instant::now() < deadline, "{}", logged());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    served.await.unwrap();
    let logged = logged();
    let warned: Vec<&str> = logged.lines().filter(|l| l.contains(refused)).collect();
    assert_eq!(warned.len(), 1, "{logged}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("UnknownCA"),
        "{logged}"
    );
}
