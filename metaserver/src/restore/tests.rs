//! Tests of the restore's steps against stand-in members.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{
    being_removed, check_addrs, check_empty, claim, epoch_floor, kv_path, own_claim,
    raise_epoch_floor, Claimed,
};
use crate::cli::ClientArgs;
use crate::operator::Operator;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use meta_consensus::DatanodeInfo;

/// A stand-in member on 127.0.0.1 that answers every request with `status` and `body` (and
/// `Retry-After` if `retry`); an operator of it, and how many requests it answered.
async fn answering(status: u16, retry: bool, body: &'static str) -> (Operator, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = axum::Router::new().fallback(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut r = (StatusCode::from_u16(status).unwrap(), body).into_response();
            if retry {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            r
        }
    });
    (serving(app).await, asked)
}

/// An operator of `app`, served on 127.0.0.1.
async fn serving(app: axum::Router) -> Operator {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Operator::new(&ClientArgs {
        server: addr.to_string(),
        token: None,
        member_token: None,
        tls_ca: None,
    })
    .unwrap()
}

#[tokio::test]
async fn a_floor_the_cluster_cannot_keep_is_given_up_at_once_and_other_refusals_fail() {
    let older =
        r#"{"error":{"code":"cluster_version","message":"node 3 runs a build of version 3"}}"#;
    // A member of an older build: refused without Retry-After, asked once.
    let (op, asked) = answering(503, false, older).await;
    assert_eq!(raise_epoch_floor(&op, 5).await.unwrap(), None);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    // A leader whose build predates the route.
    let (op, _) = answering(
        404,
        false,
        r#"{"error":{"code":"not_found","message":"?"}}"#,
    )
    .await;
    assert_eq!(raise_epoch_floor(&op, 5).await.unwrap(), None);
    // Anything else fails the restore.
    let (op, _) = answering(500, false, r#"{"error":{"code":"internal","message":"x"}}"#).await;
    let e = raise_epoch_floor(&op, 5).await.unwrap_err();
    assert!(format!("{e:#}").contains("internal"), "{e:#}");
    // Raised: the floor the member answers.
    let (op, _) = answering(200, false, r#"{"epoch_floor":7}"#).await;
    assert_eq!(raise_epoch_floor(&op, 5).await.unwrap(), Some(7));
}

/// A stand-in leader that refuses a claim whose body holds `field` with `status` and `refusal`
/// and takes any other, answering the floor 7; its operator, and the bodies it was sent.
async fn refusing_claims_with(
    field: &'static str,
    status: u16,
    refusal: &'static str,
) -> (Operator, Arc<std::sync::Mutex<Vec<String>>>) {
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = bodies.clone();
    let app = axum::Router::new().fallback(move |body: String| {
        let refused = body.contains(&format!("\"{field}\""));
        seen.lock().unwrap().push(body);
        async move {
            match refused {
                true => (StatusCode::from_u16(status).unwrap(), refusal).into_response(),
                false => (StatusCode::OK, r#"{"epoch_floor":7}"#).into_response(),
            }
        }
    });
    let op = serving(app).await;
    (op, bodies)
}

const ORIGIN: meta_consensus::RestoreOrigin = meta_consensus::RestoreOrigin {
    index: 9,
    datanodes: 1,
    replicas: 2,
    keys: 3,
};

/// A leader of build 7 knows neither the mark nor the hold on keys: the restore claims the
/// cluster without a mark (and will not end one). A leader that refuses the body for another
/// field fails the claim, with nothing written.
#[tokio::test]
async fn a_leader_that_cannot_mark_is_claimed_without_a_mark() {
    let older = r#"{"error":{"code":"invalid_body","message":"invalid request body: unknown field `restore`, expected `at_least` or `if_fresh` at line 1 column 40"}}"#;
    let (op, bodies) = refusing_claims_with("restore", 400, older).await;
    let plain = Claimed {
        floor: Some(7),
        marked: false,
        holds_keys: false,
    };
    assert_eq!(claim(&op, 5, &ORIGIN).await.unwrap(), plain);
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert!(bodies[0].contains(r#""hold_keys":true"#), "{bodies:?}");
    assert!(bodies[1].contains(r#""replicas":2"#), "{bodies:?}");
    assert!(!bodies[1].contains("hold_keys"), "{bodies:?}");
    assert!(!bodies[2].contains("restore"), "{bodies:?}");
    let other = r#"{"error":{"code":"invalid_body","message":"invalid request body: unknown field `x`, expected one of `at_least`, `if_fresh`, `restore`"}}"#;
    let (op, bodies) = refusing_claims_with("restore", 400, other).await;
    let e = claim(&op, 5, &ORIGIN).await.unwrap_err();
    assert!(e.is::<super::NothingWritten>(), "{e:#}");
    assert_eq!(bodies.lock().unwrap().len(), 1);
}

/// A cluster with a member of build 8 cannot hold keys back (503 `cluster_version`): the restore
/// claims it with a mark only, and writes its keys as plain writes.
#[tokio::test]
async fn a_cluster_that_cannot_hold_keys_is_claimed_with_a_mark_only() {
    let version =
        r#"{"error":{"code":"cluster_version","message":"node 3 runs a build of version 8"}}"#;
    let (op, bodies) = refusing_claims_with("hold_keys", 503, version).await;
    let marked = Claimed {
        floor: Some(7),
        marked: true,
        holds_keys: false,
    };
    assert_eq!(claim(&op, 5, &ORIGIN).await.unwrap(), marked);
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(bodies[1].contains(r#""keys":3"#), "{bodies:?}");
    assert!(!bodies[1].contains("hold_keys"), "{bodies:?}");
    // Every member of build 9: keys are held.
    let (op, _) = refusing_claims_with("nothing", 503, version).await;
    let held = claim(&op, 5, &ORIGIN).await.unwrap();
    assert_eq!((held.marked, held.holds_keys), (true, true));
}

/// The check that the cluster is empty rides out a cluster without a leader yet (503, as
/// while it elects one), as the restore's writes do.
#[tokio::test]
async fn the_emptiness_check_waits_for_a_leader() {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                let no_leader = r#"{"error":{"code":"no_leader","message":"electing"}}"#;
                let mut r = (StatusCode::SERVICE_UNAVAILABLE, no_leader).into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return r;
            }
            let body = match uri.path() {
                "/v1/datanodes" => r#"{"datanodes":[],"next":null}"#,
                _ => r#"{"keys":[],"next":null}"#,
            };
            (StatusCode::OK, body).into_response()
        }
    });
    let op = serving(app).await;
    check_empty(&op).await.unwrap();
    assert_eq!(asked.load(Ordering::SeqCst), 3);
}

/// A claim refused for holding nothing but this restore's floor is its own; one refused
/// for another floor, or for datanodes or keys as well, is another's.
#[test]
fn a_refused_claim_is_told_from_this_restores_own() {
    use meta_http::handlers::cluster::not_fresh;
    assert!(own_claim(&not_fresh(1_700, false, false), 1_700));
    assert!(!own_claim(&not_fresh(1_700, false, false), 170));
    assert!(!own_claim(&not_fresh(1_700, true, false), 1_700));
    assert!(!own_claim(&not_fresh(1_700, false, true), 1_700));
    assert!(!own_claim(&not_fresh(0, true, true), 0));
}

#[test]
fn restored_epochs_pass_the_time_and_every_epoch_of_the_backup() {
    let datanode = |id, epoch| DatanodeInfo {
        id,
        addr: "10.0.0.1:9000".into(),
        epoch,
        registered_index: 1,
        shards: 0,
        removing: false,
    };
    let now = 1_800_000_000_000_000;
    assert_eq!(epoch_floor(now, &[], 0), now);
    assert_eq!(epoch_floor(now, &[datanode(1, 5), datanode(2, 9)], 7), now);
    let raised = [datanode(1, 5), datanode(2, now + 41), datanode(3, now + 7)];
    assert_eq!(epoch_floor(now, &raised, 0), now + 42);
    assert_eq!(epoch_floor(now, &raised, now + 50), now + 51);
    assert_eq!(epoch_floor(now, &[datanode(1, u64::MAX)], 0), u64::MAX);
    assert_eq!(epoch_floor(now, &[], u64::MAX), u64::MAX);
}

#[test]
fn datanodes_being_removed_in_the_backup_are_named() {
    let datanode = |id, removing| DatanodeInfo {
        id,
        addr: "10.0.0.1:9000".into(),
        epoch: 1,
        registered_index: 1,
        shards: 0,
        removing,
    };
    assert_eq!(being_removed(&[datanode(1, false)]), None);
    let one = being_removed(&[datanode(1, false), datanode(7, true)]).unwrap();
    assert!(one.starts_with("datanode 7 was being removed"), "{one}");
    let two = being_removed(&[datanode(3, true), datanode(7, true)]).unwrap();
    assert!(
        two.starts_with("datanodes 3, 7 were being removed"),
        "{two}"
    );
}

#[test]
fn an_address_the_cluster_refuses_stops_the_restore_before_anything_is_sent() {
    let datanode = |id, addr: &str| DatanodeInfo {
        id,
        addr: addr.into(),
        epoch: 1,
        registered_index: 1,
        shards: 0,
        removing: false,
    };
    check_addrs(&[datanode(1, "10.0.0.1:9000"), datanode(2, "[::1]:7")]).unwrap();
    let err = check_addrs(&[datanode(1, "10.0.0.1:9000"), datanode(2, "h:1:2")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("datanode 2"), "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
}

#[test]
fn keys_keep_their_slashes_and_escape_the_rest() {
    assert_eq!(kv_path("config/replication"), "/v1/kv/config/replication");
    assert_eq!(kv_path("a b?c#d%"), "/v1/kv/a%20b%3Fc%23d%25");
    assert_eq!(kv_path("é"), "/v1/kv/%C3%A9");
}
