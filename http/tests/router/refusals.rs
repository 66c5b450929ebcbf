//! Requests refused before they reach the registry: wrong methods and unknown routes, no
//! leader, a missing token, and stalled or oversized bodies.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use meta_http::{AppState, Token};
use serde_json::json;

use crate::common::{call, leader_node, open_node};

#[tokio::test]
async fn wrong_method_and_unknown_route() {
    let t = leader_node(None).await;
    for (method, uri) in [
        (Method::POST, "/v1/shards"),
        (Method::DELETE, "/v1/cluster"),
        (Method::GET, "/v1/cluster/init"),
        (Method::PATCH, "/v1/datanodes/1"),
        (Method::POST, "/v1/kv/a"),
        (Method::GET, "/raft/vote"),
        (Method::POST, "/healthz"),
    ] {
        let a = t.send(method.clone(), uri, Body::empty()).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert_eq!(a.error_code(), "method_not_allowed");
    }
    for uri in ["/", "/v2/shards", "/v1/datanodes/1/other"] {
        let a = t.get(uri).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(a.error_code(), "not_found");
    }
}

#[tokio::test]
async fn no_leader_answers_503_with_retry_after() {
    // A node that was never initialized knows no leader.
    let t = open_node(None).await;
    let before = t.digest().await;
    let a = t
        .send(Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#)
        .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    assert_eq!(a.headers["retry-after"], "1");
    // It says why: it belongs to no cluster.
    let message = a.error_message();
    assert!(message.contains("not a member"), "{message}");
    let a = t.get("/v1/datanodes").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
    // Not even a local read: its empty state is no cluster's.
    let a = t.get("/v1/datanodes?consistency=local").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert!(a.error_message().contains("not a member"), "{a:?}");
    assert_eq!(t.digest().await, before);
}

#[tokio::test]
async fn token_is_required_except_for_probes() {
    let t = leader_node(Some("s3cret")).await;
    let before = t.digest().await;
    for (method, uri, body) in [
        (Method::GET, "/v1/cluster", ""),
        (Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#),
        (Method::GET, "/v1/shards", ""),
        (Method::PUT, "/v1/kv/a", "x"),
        (Method::POST, "/raft/vote", ""),
        (Method::POST, "/raft/append", ""),
    ] {
        for headers in [
            vec![],
            vec![("authorization", "Bearer wrong")],
            vec![("authorization", "Bearer s3cret2")],
            vec![("authorization", "s3cret")],
            vec![("authorization", "Basic s3cret")],
        ] {
            let a = call(&t.app, method.clone(), uri, body.to_owned(), &headers).await;
            assert_eq!(
                a.status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {headers:?}"
            );
            assert_eq!(a.error_code(), "unauthorized");
            assert!(a.headers.contains_key("www-authenticate"), "{a:?}");
        }
    }
    assert_eq!(t.digest().await, before);
    for uri in ["/healthz", "/readyz", "/metrics"] {
        let a = t.get(uri).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
    }
    let auth = [("authorization", "Bearer s3cret")];
    let a = call(&t.app, Method::GET, "/v1/cluster", "", &auth).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = call(
        &t.app,
        Method::PUT,
        "/v1/datanodes/1",
        r#"{"addr":"10.0.0.1:1"}"#,
        &auth,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
}

/// A body that stalls part way is answered 408 once the body timeout passes, and the
/// connection is not kept; a declared length over the limit is refused before any byte is
/// read. Neither changes anything.
#[tokio::test]
async fn stalled_and_oversized_bodies_are_refused() {
    use futures::StreamExt as _;

    let t = leader_node(None).await;
    let app = meta_http::router(
        AppState::new(t.node.clone(), Token::new(None))
            .with_body_timeout(Duration::from_millis(300)),
    );
    let stalled = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
        b"{\"addr\"",
    ))])
    .chain(futures::stream::pending());
    let a = tokio::time::timeout(
        Duration::from_secs(20),
        call(
            &app,
            Method::PUT,
            "/v1/datanodes/7",
            Body::from_stream(stalled),
            &[("content-length", "100")],
        ),
    )
    .await
    .expect("a stalled body is answered");
    assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{a:?}");
    assert_eq!(a.error_code(), "body_timeout");
    assert_eq!(a.headers["connection"], "close");

    // Declared far over the limit, with no body at all: answered at once.
    let a = tokio::time::timeout(
        Duration::from_secs(20),
        call(
            &app,
            Method::GET,
            "/v1/cluster",
            Body::from_stream(futures::stream::pending::<
                Result<bytes::Bytes, std::io::Error>,
            >()),
            &[("content-length", "99999999999")],
        ),
    )
    .await
    .expect("an oversized body is answered");
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
    assert_eq!(a.error_code(), "body_too_large");
    assert_eq!(
        t.get("/v1/datanodes").await.json(),
        json!({"datanodes":[],"next":null})
    );
}

/// With a separate member token, only it opens the members' routes: a client holding the client
/// token cannot speak for a member. Its requests elsewhere are served, without the headers a
/// member's request carries (here a forward's marker and cluster id, which a forwarded request
/// is refused by when it names another cluster).
#[tokio::test]
async fn a_member_token_keeps_clients_off_the_members_routes() {
    let t = leader_node(None).await;
    let token = Token::new(Some("s3cret")).with_member(Some("m3mber"));
    let app = meta_http::router(AppState::new(t.node.clone(), token));
    let before = t.digest().await;
    let client = ("authorization", "Bearer s3cret");
    let member = ("authorization", "Bearer m3mber");
    let raw = ("x-metaserver-raw-path", "/v1/kv/raw");
    let routes = [
        (Method::POST, "/raft/vote", ""),
        (Method::POST, "/raft/append", ""),
        (Method::POST, "/raft/append-stream", ""),
        (
            Method::POST,
            "/raft/room",
            r#"{"id":1,"short":true,"free":1,"reserve":2}"#,
        ),
        (Method::POST, "/raft/identity", ""),
        (Method::POST, "/raft/term", ""),
        (Method::PUT, "/v1/raw-replay", "x"),
    ];
    for (method, uri, body) in routes.clone() {
        let a = call(&app, method.clone(), uri, body.to_owned(), &[client, raw]).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{method} {uri}: {a:?}");
    }
    assert_eq!(
        t.digest().await,
        before,
        "a refused request changed nothing"
    );
    for (method, uri, body) in routes {
        let a = call(&app, method.clone(), uri, body.to_owned(), &[member, raw]).await;
        assert_ne!(a.status, StatusCode::UNAUTHORIZED, "{method} {uri}: {a:?}");
    }
    let other = ("x-metaserver-cluster", "00000000000000ff");
    let by = ("x-metaserver-forwarded-by", "2");
    let a = call(
        &app,
        Method::PUT,
        "/v1/kv/a",
        "x".to_owned(),
        &[member, other, by],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "other_cluster");
    let a = call(
        &app,
        Method::PUT,
        "/v1/kv/a",
        "x".to_owned(),
        &[client, other, by],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = call(&app, Method::GET, "/v1/cluster", String::new(), &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{a:?}");
    // Nor can a client name an address the node then sends its members' messages to: they
    // would carry the member token there.
    let before = t.node.status();
    let naming = [
        (
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:9"}}"#,
        ),
        (
            Method::POST,
            "/v1/cluster/learners",
            r#"{"id":4,"addr":"127.0.0.1:9"}"#,
        ),
        (
            Method::PUT,
            "/v1/cluster/members/1",
            r#"{"addr":"127.0.0.1:9"}"#,
        ),
    ];
    for (method, uri, body) in naming.clone() {
        let a = call(&app, method.clone(), uri, body.to_owned(), &[client]).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{method} {uri}: {a:?}");
        assert_eq!(a.error_code(), "forbidden");
        assert!(a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("member token"));
    }
    let after = t.node.status();
    assert_eq!(
        (after.voters, after.learners),
        (before.voters, before.learners)
    );
    assert_eq!(after.nodes, before.nodes);
    // Nor raise epochs, which no request lowers again: one raised near the largest would leave
    // every later restore no epoch to give.
    let digest = t.digest().await;
    let raising = [
        (
            Method::PUT,
            "/v1/cluster/epoch-floor",
            r#"{"at_least":4503599627370496}"#,
        ),
        (
            Method::PUT,
            "/v1/datanodes/9",
            r#"{"addr":"10.0.0.9:7000","min_epoch":4503599627370496}"#,
        ),
    ];
    for (method, uri, body) in raising.clone() {
        let a = call(&app, method.clone(), uri, body.to_owned(), &[client]).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{method} {uri}: {a:?}");
        assert!(a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("raising epochs"));
    }
    // Nor write a key as a restore does: that write goes on while every other waits.
    let restore_put = "/v1/kv/r?restore=true";
    let a = call(&app, Method::PUT, restore_put, "x".to_owned(), &[client]).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{a:?}");
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("a restore's key write"));
    assert_eq!(t.digest().await, digest, "a refused raise changed nothing");
    // A registration without `min_epoch` is a client's; the member token may raise.
    let plain = r#"{"addr":"10.0.0.9:7000"}"#.to_owned();
    let a = call(&app, Method::PUT, "/v1/datanodes/9", plain, &[client]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    for (method, uri, body) in raising {
        let a = call(&app, method.clone(), uri, body.to_owned(), &[member]).await;
        assert_eq!(a.status, StatusCode::OK, "{method} {uri}: {a:?}");
    }
    // Past the token, the restore's write finds no restore under way.
    let a = call(&app, Method::PUT, restore_put, "x".to_owned(), &[member]).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    // The member token passes (to the handlers' own refusals: an initialized node, nothing at
    // the new address).
    for (method, uri, body) in [&naming[0], &naming[2]] {
        let a = call(&app, method.clone(), uri, body.to_string(), &[member]).await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{method} {uri}: {a:?}");
    }
}

/// A node without a token refuses what a web page sends it, and changes nothing: a write with
/// an `Origin` header (a page's cross-site request, which needs no preflight as plain text),
/// and, on a loopback node, a request addressed to a name that resolves to this machine (DNS
/// rebinding). Tools, which send neither, are served.
#[tokio::test]
async fn a_node_without_a_token_refuses_web_pages() {
    let t = leader_node(None).await;
    let token = Token::new(None).on_loopback(vec!["meta-1.internal".into()]);
    let app = meta_http::router(AppState::new(t.node.clone(), token));
    let before = t.digest().await;
    let page = ("origin", "http://evil.example");
    let plain = ("content-type", "text/plain");
    let rebound = ("host", "rebind.evil.example:7101");
    for headers in [&[page, plain][..], &[rebound], &[rebound, page]] {
        let a = call(&app, Method::PUT, "/v1/kv/a", "x".to_owned(), headers).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{headers:?}: {a:?}");
        assert_eq!(a.error_code(), "forbidden");
        for read in ["/v1/cluster", "/metrics"] {
            let a = call(&app, Method::GET, read, String::new(), headers).await;
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{read} {headers:?}: {a:?}");
        }
    }
    assert_eq!(
        t.digest().await,
        before,
        "a refused request changed nothing"
    );
    for host in [
        "127.0.0.1:7101",
        "localhost:7101",
        "meta-1.internal:7101",
        "t",
    ] {
        let a = call(
            &app,
            Method::PUT,
            "/v1/kv/a",
            "x".to_owned(),
            &[("host", host)],
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{host}: {a:?}");
    }
}
