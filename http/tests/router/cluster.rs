//! The cluster routes: membership and the node's config, init on a fresh node, and
//! snapshots.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use meta_consensus::Role;
use serde_json::json;

use crate::common::{leader_node, leader_node_tuned, open_node, refusing, wait_for};

#[tokio::test]
async fn cluster_membership_and_config() {
    let t = leader_node(None).await;
    let v = t.get("/v1/cluster").await.json();
    assert_eq!(v["id"], 1);
    assert_eq!(v["role"], "leader");
    assert_eq!(v["leader_id"], 1);
    assert_eq!(v["leader_addr"], "127.0.0.1:1");
    assert_eq!(v["voters"], json!([1]));
    assert_eq!(v["learners"], json!([]));
    assert_eq!(v["joint"], json!(null), "no voter change is half done");
    assert!(v["term"].as_u64().unwrap() >= 1);
    assert!(v["committed"].as_u64().unwrap() >= 1);
    for field in [
        "last_log_index",
        "applied",
        "wal",
        "snapshot",
        "datanodes",
        "replicas",
    ] {
        assert!(v.get(field).is_some(), "{field} missing: {v}");
    }
    assert!(v["wal"]["appends_per_barrier"].is_number());
    assert_eq!(v["purged"], 0, "a fresh log has purged nothing");

    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error_code(), "already_initialized");
    // It says so before it asks the other members it names (which would name another cause):
    // nothing connects to the address given.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let members = json!({"members": {"1": "127.0.0.1:1", "2": addr}}).to_string();
    let a = t.send(Method::POST, "/v1/cluster/init", members).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "already_initialized");
    assert!(
        listener
            .accept()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "the initialized node asked the address"
    );

    // A learner that is never reachable still joins the membership.
    let (_four, four) = refusing();
    let (_other, other) = refusing();
    let learner = json!({"id": 4, "addr": four}).to_string();
    let a = t
        .send(Method::POST, "/v1/cluster/learners", learner.clone())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["learners"], json!([4]));
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1]}"#)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["voters"], json!([1]));
    // A voter that is not a learner is refused.
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1,5]}"#)
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    assert_eq!(t.get("/v1/cluster").await.json()["voters"], json!([1]));
    // So is promoting the unreachable learner: it would leave the cluster without a quorum.
    let a = t
        .send(Method::PUT, "/v1/cluster/voters", r#"{"voters":[1,4]}"#)
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    assert_eq!(a.error_code(), "conflict");
    // It says where a learner short of disk tells why it does not catch up.
    assert!(a.json().to_string().contains("snapshot_refused"), "{a:?}");
    let v = t.get("/v1/cluster").await.json();
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1]), &json!([4])));
    // The same, one voter named in the path; and the only voter cannot leave.
    for (method, path, status, cause) in [
        (
            Method::PUT,
            "/v1/cluster/voters/4",
            409,
            "cannot become a voter yet",
        ),
        (
            Method::PUT,
            "/v1/cluster/voters/5",
            400,
            "add it as a learner first",
        ),
        (Method::PUT, "/v1/cluster/voters/1", 200, ""),
        (
            Method::DELETE,
            "/v1/cluster/voters/1",
            409,
            "the only voter",
        ),
        (Method::DELETE, "/v1/cluster/voters/4", 404, "not a voter"),
    ] {
        let a = t.send(method.clone(), path, "").await;
        assert_eq!(a.status.as_u16(), status, "{method} {path}: {a:?}");
        if !cause.is_empty() {
            let message = a.error_message();
            assert!(message.contains(cause), "{method} {path}: {message}");
        }
    }
    let v = t.get("/v1/cluster").await.json();
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1]), &json!([4])));
    let a = t.send(Method::PUT, "/v1/kv/still-writable", "x").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // A learner again at its address is a no-op. At another address, a voter, or at a
    // member's address, a conflict that names its cause.
    for (body, status, cause) in [
        (learner.clone(), StatusCode::OK, ""),
        (
            json!({"id": 4, "addr": other}).to_string(),
            StatusCode::CONFLICT,
            "remove it before adding it",
        ),
        (
            json!({"id": 1, "addr": other}).to_string(),
            StatusCode::CONFLICT,
            "node 1 is a voter already",
        ),
        (
            json!({"id": 5, "addr": four}).to_string(),
            StatusCode::CONFLICT,
            "is the address of node 4 already",
        ),
        (
            json!({"id": 6, "addr": "127.0.0.1:1"}).to_string(),
            StatusCode::CONFLICT,
            "is the address of node 1 already",
        ),
    ] {
        let a = t
            .send(Method::POST, "/v1/cluster/learners", body.clone())
            .await;
        assert_eq!(a.status, status, "{body}: {a:?}");
        if !cause.is_empty() {
            let message = a.error_message();
            assert!(message.contains(cause), "{body}: {message}");
        }
    }
    // Learners can be removed; voters and strangers cannot.
    for (id, status) in [
        (1, StatusCode::CONFLICT),
        (4, StatusCode::OK),
        (4, StatusCode::NOT_FOUND),
    ] {
        let a = t
            .send(
                Method::DELETE,
                &format!("/v1/cluster/learners/{id}"),
                Body::empty(),
            )
            .await;
        assert_eq!(a.status, status, "remove {id}: {a:?}");
    }
    let v = t.get("/v1/cluster").await.json();
    assert_eq!((&v["voters"], &v["learners"]), (&json!([1]), &json!([])));

    let a = t.get("/v1/config").await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":0}));
    let a = t
        .send(
            Method::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":1048576}"#,
        )
        .await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":1048576}));
    assert_eq!(t.node.snapshot_rate(), 1_048_576);
    let a = t.send(Method::PATCH, "/v1/config", "{}").await;
    assert_eq!(a.json(), json!({"snapshot_max_bytes_per_sec":1048576}));
}

#[tokio::test]
async fn init_on_a_fresh_node() {
    let t = open_node(None).await;
    let a = t.get("/v1/cluster").await;
    assert_eq!(a.json()["role"], "uninitialized", "{a:?}");
    // Its empty state is no cluster's: not even a local read or a watch is answered from it.
    for path in [
        "/v1/kv/x?consistency=local",
        "/v1/watch?consistency=local&wait_ms=0",
    ] {
        let a = t.get(path).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {a:?}");
        let message = a.error_message();
        assert!(
            message.contains("not a member of a cluster yet"),
            "{path}: {message}"
        );
    }
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json(), json!({"voters":[1],"joint":null,"learners":[]}));
    wait_for(|| t.node.status().role == Role::Leader, "leader").await;
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/init",
            r#"{"members":{"1":"127.0.0.1:1"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn snapshots_build_and_download() {
    let t = leader_node(None).await;
    let a = t.get("/v1/cluster/snapshot").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "not_found");

    let epoch = t.register_datanode(1).await;
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    t.send(Method::POST, "/v1/datanodes/1/shards", body.to_string())
        .await;
    let a = t
        .send(Method::POST, "/v1/cluster/snapshot", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = a.json();
    let index = v["index"].as_u64().unwrap();
    assert!(index >= 3, "{v}");
    assert!(v["bytes"].as_u64().unwrap() > 0);

    let a = t.get("/v1/cluster/snapshot").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/octet-stream");
    let file = std::fs::read(t.node.newest_snapshot_file().unwrap()).unwrap();
    assert_eq!(&a.body[..], &file[..]);
    assert_eq!(
        t.get("/v1/cluster").await.json()["snapshot"]["index"],
        index
    );
    assert_eq!(t.node.status().snapshot_throttle_pauses, 0, "unlimited");

    // A download is paced by the snapshot rate: at five times the file's size a second, it
    // takes at least a fifth of a second (less one tick of tokio's timer).
    let rate = 5 * file.len() as u64;
    t.node.set_snapshot_rate(rate);
    let started = std::time::Instant::now();
    let a = t.get("/v1/cluster/snapshot").await;
    let took = started.elapsed();
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(&a.body[..], &file[..]);
    assert!(took >= Duration::from_millis(199), "{took:?}");
    assert!(t.node.status().snapshot_throttle_pauses >= 1);

    // A node that begins to close lifts the rate: a download that would take an hour at it
    // finishes at once rather than holding the drain.
    t.node.set_snapshot_rate(file.len() as u64 / 3600 + 1);
    t.node.begin_close();
    let a = tokio::time::timeout(Duration::from_secs(20), t.get("/v1/cluster/snapshot"))
        .await
        .expect("the download held the close");
    assert_eq!(&a.body[..], &file[..]);
    assert_eq!(t.node.snapshot_rate(), 0);
}

/// A leader whose cluster's version is past the base one (a prune raised it), from which a
/// learner is added only if its build answered.
async fn leader_past_the_base_version() -> crate::common::TestNode {
    let t = leader_node(None).await;
    let epoch = t.register_datanode(7).await;
    let a = t
        .send(
            Method::POST,
            "/v1/datanodes/7/prune",
            json!({ "epoch": epoch }).to_string(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert!(t.node.cluster_version() >= 2);
    t
}

/// Once the cluster's version was raised, a learner is added only if its build answered
/// lately. What another process with the learner's id answered a moment ago (a learner just
/// removed, at its old address) does not count for the node at the new address, which did not
/// answer.
#[tokio::test]
async fn a_learner_is_judged_by_its_own_answer_not_another_process_with_its_id() {
    let t = leader_past_the_base_version().await;
    // Node 4, of a current build, answered at its old address just now.
    t.node
        .config()
        .peer_versions
        .note(4, meta_consensus::BUILD_VERSION);
    let (_new, new) = refusing();
    let a = t
        .send(
            Method::POST,
            "/v1/cluster/learners",
            json!({"id": 4, "addr": new}).to_string(),
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{a:?}");
    let message = a.error_message();
    assert!(message.contains("node 4 has not answered"), "{message}");
    assert_eq!(t.get("/v1/cluster").await.json()["learners"], json!([]));
}

#[tokio::test]
async fn a_learner_the_membership_rules_out_is_refused_for_that_before_its_address_is_asked() {
    // Past the base version a learner that does not answer is refused too: that must not be
    // the cause named for these.
    let t = leader_past_the_base_version().await;
    let (_other, other) = refusing();
    for (body, cause) in [
        (json!({"id": 1, "addr": other}), "node 1 is a voter already"),
        (
            json!({"id": 6, "addr": "127.0.0.1:1"}),
            "is the address of node 1 already",
        ),
    ] {
        let a = t
            .send(Method::POST, "/v1/cluster/learners", body.to_string())
            .await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{body}: {a:?}");
        let message = a.error_message();
        assert!(message.contains(cause), "{body}: {message}");
    }
    assert_eq!(t.get("/v1/cluster").await.json()["learners"], json!([]));
}

/// A node initialized as the first of three voters whose others never start: it never has a
/// leader.
async fn first_of_three() -> crate::common::TestNode {
    let t = open_node(None).await;
    let members = (1..=3)
        .map(|id| (id, meta_consensus::Node::new(format!("127.0.0.1:{id}"))))
        .collect();
    t.node.initialize(members).await.unwrap();
    t
}

/// A node that has known no leader for two election timeouts (here the first of three voters
/// of a new cluster, the others never started) answers 503 `no_leader` at once: waiting for an
/// election that too few voters answer would hold every request for its whole timeout.
#[tokio::test]
async fn a_node_without_a_leader_for_long_refuses_at_once() {
    let t = first_of_three().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while t.node.long_leaderless().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            t.node.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // An election timeout: a request that waited for a leader would take its whole timeout.
    let within = Duration::from_millis(600);
    for (method, uri, body) in [
        (Method::PUT, "/v1/kv/k", "v"),
        (Method::GET, "/v1/kv/k", ""),
        (Method::GET, "/v1/kv/k?consistency=lease", ""),
        (Method::PUT, "/v1/datanodes/1", r#"{"addr":"10.0.0.1:1"}"#),
    ] {
        let a = tokio::time::timeout(within, t.send(method.clone(), uri, body))
            .await
            .unwrap_or_else(|_| panic!("{method} {uri} waited for a leader"));
        assert_eq!(
            a.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {uri}: {a:?}"
        );
        assert_eq!(a.error_code(), "no_leader", "{method} {uri}");
        assert!(
            a.error_message().contains("no leader was elected for"),
            "{method} {uri}: {a:?}"
        );
        // Nothing listens at the others' addresses: the answer names them.
        assert!(
            a.error_message()
                .contains("nothing listens at the addresses of voters [2, 3]"),
            "{method} {uri}: {a:?}"
        );
    }
}

/// A write waiting for a leader on a node that comes to have known none for two election
/// timeouts is refused at that moment, as the requests that arrive later are, not when it
/// would next have looked for a leader (an election timeout later).
#[tokio::test]
async fn a_write_waiting_for_a_leader_is_refused_when_none_is_elected_for_long() {
    let t = first_of_three().await;
    let election = t.node.config().election_timeout();
    // Mid-way: it next looks for a leader an election timeout after it is first refused.
    tokio::time::sleep(election).await;
    let app = t.app.clone();
    let write =
        tokio::spawn(
            async move { crate::common::call(&app, Method::PUT, "/v1/kv/k", "v", &[]).await },
        );
    tokio::time::timeout(Duration::from_secs(30), t.node.leaderless_silenced())
        .await
        .unwrap();
    let a = tokio::time::timeout(election / 4, write)
        .await
        .expect("the write was not refused when no leader was elected for long")
        .unwrap();
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "no_leader");
}

/// A node below a quarter of its reserve builds no snapshot: the build would take the last of
/// the room its log and registry need. Asked for one, it answers 507 saying so.
#[tokio::test]
async fn a_build_on_a_nearly_full_disk_is_refused() {
    let t = leader_node_tuned(None, |cfg| {
        cfg.min_free_bytes = 8 << 20;
        cfg.free_space = meta_consensus::FreeSpace::fixed((2 << 20) - 1);
    })
    .await;
    let a = t
        .send(Method::POST, "/v1/cluster/snapshot", Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::INSUFFICIENT_STORAGE, "{a:?}");
    assert!(
        a.json().to_string().contains("quarter of --min-free-bytes"),
        "{a:?}"
    );
}
