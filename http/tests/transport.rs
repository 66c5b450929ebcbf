//! The HTTP transport end to end: three nodes, each behind a real HTTP server on an
//! ephemeral loopback port, talking Raft over `/raft/...` with a token. Writes and
//! linearizable reads sent to followers are forwarded to the leader, or answered by the
//! follower with the leader's read index, and a learner that joins after the leader purged its
//! log catches up by a streamed snapshot.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{test_config, wait_for, DEADLINE};
use meta_consensus::{MetaNode, Node, Role};
use meta_http::follower_read::CatchUp;
use meta_http::{AppState, HttpNetwork, Token};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const TOKEN: &str = "transport-token";

struct Server {
    node: MetaNode,
    addr: String,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(id: u64, dir: &TempDir) -> Server {
    start_with(id, dir, Some(meta_http::follower_read::CATCH_UP)).await
}

/// Starts node `id`; with `follower_reads`, a follower answers reads itself as it says;
/// without, it replays every read at the leader.
async fn start_with(id: u64, dir: &TempDir, follower_reads: Option<CatchUp>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = test_config(id, &addr, &dir.path().join(format!("node{id}")));
    // Three nodes over real HTTP in a debug build on a shared machine: elections slower than
    // the single-node tests', so a starved moment does not cost the leader.
    cfg.election_min_ms = 1000;
    cfg.election_max_ms = 2000;
    cfg.snapshot_logs_since_last = 0;
    cfg.max_in_snapshot_log_to_keep = 0;
    let token = Token::new(Some(TOKEN));
    let network = HttpNetwork::new(&cfg, token.clone());
    let node = MetaNode::open(cfg, network).await.unwrap();
    let mut state =
        AppState::new(node.clone(), token).with_follower_reads(follower_reads.is_some());
    if let Some(catch_up) = follower_reads {
        state = state.with_follower_read_catch_up(catch_up);
    }
    let app = meta_http::router(state);
    let task = tokio::spawn(async move {
        axum::serve(meta_http::LimitedListener::new(listener, 10_000), app)
            .await
            .unwrap();
    });
    Server { node, addr, task }
}

struct Client {
    http: reqwest::Client,
}

impl Client {
    fn new() -> Self {
        Client {
            http: reqwest::Client::new(),
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        server: &Server,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("http://{}{path}", server.addr))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Asks `leader` to move member `id` to `addr` (`PUT /v1/cluster/members/{id}`).
    async fn move_member(&self, leader: &Server, id: u64, addr: &str) -> (u16, Value) {
        let body = json!({ "addr": addr });
        let path = format!("/v1/cluster/members/{id}");
        self.send(reqwest::Method::PUT, leader, &path, Some(body))
            .await
    }
}

/// Starts node 1 as a cluster of its own and waits until it leads.
async fn start_alone(dir: &TempDir) -> Server {
    let leader = start(1, dir).await;
    leader
        .node
        .initialize(BTreeMap::from([(1, Node::new(leader.addr.clone()))]))
        .await
        .unwrap();
    wait_for(|| leader.node.status().role == Role::Leader, "node 1 leads").await;
    leader
}

/// The server whose node leads.
fn the_leader(servers: &BTreeMap<u64, Server>) -> &Server {
    servers
        .values()
        .find(|s| s.node.status().role == Role::Leader)
        .expect("a leader")
}

/// Starts nodes 1 to 3 over HTTP, initializes them as one cluster from node 1, and waits until
/// all three agree on a leader.
async fn start_cluster(dir: &TempDir) -> BTreeMap<u64, Server> {
    start_cluster_with(dir, Some(meta_http::follower_read::CATCH_UP)).await
}

async fn start_cluster_with(
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
) -> BTreeMap<u64, Server> {
    let mut servers = BTreeMap::new();
    for id in 1..=3 {
        servers.insert(id, start_with(id, dir, follower_reads).await);
    }
    let members = servers
        .iter()
        .map(|(id, s)| (*id, Node::new(s.addr.clone())))
        .collect();
    servers[&1].node.initialize(members).await.unwrap();
    wait_for(
        || {
            let leader = servers[&1].node.status().leader_id;
            leader.is_some()
                && servers
                    .values()
                    .all(|s| s.node.status().leader_id == leader)
        },
        "three nodes agree on a leader",
    )
    .await;
    servers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let leader = servers[&1].node.status().leader_id.unwrap();
    let followers: Vec<u64> = servers.keys().copied().filter(|id| *id != leader).collect();
    let client = Client {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };

    // A write at a follower is forwarded to the leader.
    let f1 = &servers[&followers[0]];
    let f2 = &servers[&followers[1]];
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            f1,
            "/v1/datanodes/5",
            Some(json!({"addr": "10.0.0.5:9000"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let epoch = v["epoch"].as_u64().unwrap();
    for batch in 0..2u64 {
        let shards: Vec<Value> = (0..10_000u64)
            .map(|i| json!({"id": batch * 10_000 + i, "generation": 1, "size": i}))
            .collect();
        let (status, v) = client
            .send(
                reqwest::Method::POST,
                f2,
                "/v1/datanodes/5/shards",
                Some(json!({"epoch": epoch, "shards": shards})),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["accepted"], 10_000);
    }
    // Concurrent writes at a follower share forwarded batches; each gets its own answer.
    let writes = (0..30u64).map(|i| {
        let shards: Vec<Value> = (0..=i)
            .map(|j| json!({"id": 100_000 + i * 100 + j, "generation": 1, "size": 1}))
            .collect();
        let (client, f1) = (&client, f1);
        async move {
            client
                .send(
                    reqwest::Method::POST,
                    f1,
                    "/v1/datanodes/5/shards",
                    Some(json!({"epoch": epoch, "shards": shards})),
                )
                .await
        }
    });
    for (i, (status, v)) in futures::future::join_all(writes)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["accepted"], i + 1, "write {i}: {v}");
    }
    let expected_shards = 20_000 + (1..=30).sum::<u64>();
    // A linearizable read at a follower sees the writes.
    let (status, v) = client
        .send(reqwest::Method::GET, f1, "/v1/shards/19999", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["replicas"][0]["datanode"], 5);
    let (status, v) = client
        .send(reqwest::Method::GET, f2, "/v1/datanodes/5", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["shards"], expected_shards);

    // Replication ran over streamed exchanges, not one request per AppendEntries.
    for f in [f1, f2] {
        let (status, metrics) = client.send(reqwest::Method::GET, f, "/metrics", None).await;
        assert_eq!(status, 200);
        let metrics = metrics.as_str().expect("metrics are text");
        let streamed = "metaserver_http_requests_total{route=\"/raft/append-stream\",method=\"POST\",status=\"200\"}";
        assert!(metrics.contains(streamed), "{metrics}");
        assert!(!metrics.contains("route=\"/raft/append\""), "{metrics}");
    }
    // The writes sent to a follower reached the leader in forwarded batches.
    let (_, metrics) = client
        .send(reqwest::Method::GET, &servers[&leader], "/metrics", None)
        .await;
    let batches = "metaserver_http_requests_total{route=\"/raft/forward-commands\",method=\"POST\",status=\"200\"}";
    assert!(metrics.as_str().unwrap().contains(batches), "{metrics}");

    // The leader snapshots and purges its log; a new learner must catch up by snapshot.
    let l = &servers[&leader];
    let (status, v) = client
        .send(reqwest::Method::POST, l, "/v1/cluster/snapshot", None)
        .await;
    assert_eq!(status, 200, "{v}");
    let snapshot_index = v["index"].as_u64().unwrap();
    wait_for(
        || l.node.status().purged >= Some(snapshot_index),
        "the leader purges its log up to the snapshot",
    )
    .await;

    let learner = &start(4, &dir).await;
    let (status, v) = client
        .send(
            reqwest::Method::POST,
            &servers[&followers[0]],
            "/v1/cluster/learners",
            Some(json!({"id": 4, "addr": learner.addr})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["learners"], json!([4]));

    let target = l.node.status().applied;
    wait_for(
        || learner.node.status().applied >= target,
        "the learner catches up",
    )
    .await;
    assert!(
        learner.node.status().state_machine.snapshot_installs >= 1,
        "the learner caught up by snapshot"
    );
    let deadline = Instant::now() + DEADLINE;
    loop {
        let want = l.node.registry_digest().await.unwrap();
        let got = learner.node.registry_digest().await.unwrap();
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "learner registry {got:?} != {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(learner.node.status().role, Role::Learner);

    // Wrong token on the Raft routes: refused, the cluster is unaffected.
    let response = client
        .http
        .post(format!("http://{}/raft/vote", l.addr))
        .bearer_auth("wrong")
        .body(vec![1u8])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(l.node.status().role, Role::Leader);

    for server in servers.values().chain([learner]) {
        server.node.shutdown().await.unwrap();
    }
}

/// Values of the largest allowed size commit over the HTTP transport: an AppendEntries carrying
/// one is not timed out for its size, so it is not resent forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn largest_values_commit_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let value = vec![b'v'; meta_http::limits::MAX_VALUE_BYTES];
    for i in 0..3 {
        // Sent to node 1: forwarded when it does not lead. A 503 (no leader for a moment on a
        // starved machine) is retried, as clients are told to; anything else must be 200.
        let deadline = Instant::now() + DEADLINE;
        loop {
            let response = client
                .put(format!("http://{}/v1/kv/big/{i}", servers[&1].addr))
                .bearer_auth(TOKEN)
                .body(value.clone())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            if status == 503 && Instant::now() < deadline {
                // Back off briefly before retrying, as the Retry-After answer asks.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(status, 200, "write {i}: {text}");
            break;
        }
    }
    wait_for(
        || servers[&1].node.status().leader_id.is_some(),
        "a leader with a quorum",
    )
    .await;
    let leader = servers[&1].node.status().leader_id.unwrap();
    let target = servers[&leader].node.status().applied;
    wait_for(
        || servers.values().all(|s| s.node.status().applied >= target),
        "every node applies the large values",
    )
    .await;
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}

/// The requests `route` (with `method`) that a node answered, from its `/metrics`.
async fn served(client: &Client, server: &Server, method: &str, route: &str) -> u64 {
    let (status, metrics) = client
        .send(reqwest::Method::GET, server, "/metrics", None)
        .await;
    assert_eq!(status, 200);
    let prefix = format!(
        "metaserver_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"200\"}} "
    );
    metrics
        .as_str()
        .expect("metrics are text")
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// Linearizable and lease reads at a follower see every write acknowledged before them (each
/// read follows a write acknowledged by another member). With time to catch up and no backlog
/// limit, the follower answers them with the leader's read index: the leader answers read
/// indexes, not the reads. With no time, a follower that has not applied the index yet replays
/// the read with it; by default, one still applying replays it at once too. The reads are right
/// either way, and the followers count how each was answered. With follower reads off, the
/// leader answers the reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_answer_linearizable_reads_with_the_leaders_read_index() {
    let client = Client {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };
    let patient = CatchUp {
        wait: Duration::from_secs(10),
        max_backlog: u64::MAX,
    };
    let hasty = CatchUp {
        wait: Duration::ZERO,
        max_backlog: u64::MAX,
    };
    let arms = [
        Some(patient),
        Some(hasty),
        Some(meta_http::follower_read::CATCH_UP),
        None,
    ];
    for follower_reads in arms {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_cluster_with(&dir, follower_reads).await;
        let leader = servers[&1].node.status().leader_id.unwrap();
        let followers: Vec<&Server> = servers
            .iter()
            .filter(|(id, _)| **id != leader)
            .map(|(_, s)| s)
            .collect();
        let l = &servers[&leader];
        for i in 0..40u64 {
            // Written at the leader or through the other follower, read at this one.
            let (writer, reader) = match i % 3 {
                0 => (l, followers[0]),
                1 => (followers[1], followers[0]),
                _ => (followers[0], followers[1]),
            };
            let (status, v) = client
                .send(
                    reqwest::Method::PUT,
                    writer,
                    "/v1/kv/follower-read",
                    Some(json!({"value": i.to_string()})),
                )
                .await;
            assert_eq!(status, 200, "{v}");
            let consistency = if i % 2 == 0 { "linearizable" } else { "lease" };
            let (status, v) = client
                .send(
                    reqwest::Method::GET,
                    reader,
                    &format!("/v1/kv/follower-read?consistency={consistency}"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["value"], i.to_string(), "read {i} ({consistency}): {v}");
        }
        let read_indexes = served(&client, l, "POST", "/raft/read-index").await;
        let replayed = served(&client, l, "GET", "/v1/kv/{*key}").await;
        // What the followers counted: every read answered locally, replayed with the index or
        // replayed at once, as many replayed as the leader answered, and no more exchanges than
        // reads that asked for an index.
        let mut counted = [0u64; 4];
        for f in &followers {
            let metrics = client
                .send(reqwest::Method::GET, f, "/metrics", None)
                .await
                .1;
            let metrics = metrics.as_str().unwrap();
            for (i, name) in [
                "metaserver_follower_reads_total{outcome=\"local\"}",
                "metaserver_follower_reads_total{outcome=\"replayed\"}",
                "metaserver_follower_reads_total{outcome=\"behind\"}",
                "metaserver_read_index_exchanges_total",
            ]
            .iter()
            .enumerate()
            {
                counted[i] += metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} ")))
                    .map_or(0, |n| n.parse::<u64>().unwrap());
            }
        }
        let [local, with_index, behind, exchanges] = counted;
        match follower_reads {
            Some(catch_up) => {
                assert_eq!(local + with_index + behind, 40, "{counted:?}");
                assert_eq!(with_index + behind, replayed, "{counted:?}");
                assert!(exchanges <= local + with_index, "{counted:?}");
                assert_eq!(read_indexes > 0, exchanges > 0, "{counted:?}");
                if catch_up == patient {
                    assert_eq!(replayed, 0, "the leader answered reads sent to followers");
                }
                if catch_up.max_backlog == u64::MAX {
                    assert_eq!(behind, 0, "{counted:?}");
                }
                println!(
                    "{catch_up:?}: local, replayed with the index, at once, exchanges: {counted:?}"
                );
            }
            None => {
                assert_eq!(read_indexes, 0);
                assert_eq!(replayed, 40, "every read was replayed at the leader");
                assert_eq!(counted, [0, 0, 0, 0]);
            }
        }
        for server in servers.values() {
            server.node.shutdown().await.unwrap();
        }
    }
}

/// A peer that cannot be replicated to is retried with openraft's backoff, not in a loop: a
/// leader whose learner's address accepts connections and drops them at once makes at most a
/// few attempts a second (heartbeats and replication together), where without the backoff it
/// made thousands (and logged a warning for each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_is_retried_with_backoff() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;

    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let dropper = tokio::spawn(async move {
        while let Ok((socket, _)) = dead.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            drop(socket);
        }
    });
    leader
        .node
        .add_learner(2, Node::new(dead_addr))
        .await
        .unwrap();

    // Count attempts until there are 40: with the backoff (20 ms doubling to 500 ms) and
    // heartbeats every 50 ms that takes well over a second; without it, milliseconds.
    // Attempts made while add_learner waited for its commit do not count: the time is
    // measured from here, so the attempts must be too.
    let started = Instant::now();
    let before = attempts.load(Ordering::Relaxed);
    wait_for(
        || attempts.load(Ordering::Relaxed) >= before + 40,
        "40 attempts to reach the peer",
    )
    .await;
    let took = started.elapsed();
    dropper.abort();
    assert!(
        took >= Duration::from_millis(1000),
        "40 attempts in {took:?}: the peer is retried without backoff"
    );
}

/// A follower removed from the voters learns it from the members' answers to its vote
/// requests, carried over HTTP (the change is made on the node, so the leader's notice, sent by
/// the HTTP handler, is not what tells it): its `/v1/cluster` says `removed`, and a write sent
/// to it is refused with 503 naming the members, not forwarded to a leader it no longer follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_follower_is_told_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let client = Client::new();
    let leader = the_leader(&servers);
    let removed_id = *servers.keys().find(|id| **id != leader.node.id()).unwrap();
    let others = servers.keys().copied().filter(|id| *id != removed_id);
    leader.node.change_voters(others.collect()).await.unwrap();

    let removed = &servers[&removed_id];
    wait_for(
        || removed.node.status().role == Role::Removed,
        "the removed follower is told",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, removed, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["role"], "removed", "{v}");
    assert_eq!(v["leader_id"], Value::Null, "{v}");
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            removed,
            "/v1/datanodes/7",
            Some(json!({"addr": "10.0.0.7:9000"})),
        )
        .await;
    assert_eq!(status, 503, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("removed from the cluster"), "{message}");
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}

/// A removed learner never asks for votes, and the leader stops replicating to it at once: the
/// leader tells it, and it reports `removed` instead of a learner that still knows a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_learner_is_told_by_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let learner = start(4, &dir).await;
    let client = Client::new();
    let leader = the_leader(&servers);
    let (status, v) = client
        .send(
            reqwest::Method::POST,
            leader,
            "/v1/cluster/learners",
            Some(json!({"id": 4, "addr": learner.addr})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    wait_for(
        || learner.node.status().role == Role::Learner,
        "the learner joins",
    )
    .await;
    // The leader's view shows how far the learner is, and when it last answered.
    wait_for(
        || {
            leader
                .node
                .status()
                .replication
                .iter()
                .any(|r| r.node == 4 && r.matched.is_some() && r.heard_ms.is_some())
        },
        "the leader hears from the learner",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, leader, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["replication"]["4"]["matched"].is_u64(), "{v}");
    assert!(v["replication"]["4"]["heard_ms"].is_u64(), "{v}");
    assert!(v["replication"]["4"]["lag"].is_u64(), "{v}");
    assert!(
        v["replication"].get(leader.node.id().to_string()).is_none(),
        "{v}"
    );

    let (status, v) = client
        .send(
            reqwest::Method::DELETE,
            leader,
            "/v1/cluster/learners/4",
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    wait_for(
        || learner.node.status().role == Role::Removed,
        "the removed learner is told",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, &learner, "/readyz", None)
        .await;
    assert_eq!(status, 503, "{v}");
    for server in servers.values().chain([&learner]) {
        server.node.shutdown().await.unwrap();
    }
}

/// One process cannot answer for two members: a learner added (on the node, past the HTTP
/// handler's probe) at the address of a process with another id is never served by it, since
/// every message names its addressee and that process refuses messages for another id. The
/// leader never hears from the learner and refuses to make it a voter; the process stays out
/// of the cluster. Through the API the add is refused at once (409 `wrong_node`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_cannot_be_two_members() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;
    let other = start(2, &dir).await;
    let honest = start(3, &dir).await;
    let client = Client::new();

    let (status, v) = client
        .send(
            reqwest::Method::POST,
            &leader,
            "/v1/cluster/learners",
            Some(json!({"id": 5, "addr": other.addr})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    assert!(leader.node.status().learners.is_empty());

    // Past the probe (as if node 2 had been down when it was added), then a real learner
    // after it: once that one caught up, node 5 would have too, had anything answered for it.
    leader
        .node
        .add_learner(5, Node::new(other.addr.clone()))
        .await
        .unwrap();
    leader
        .node
        .add_learner(3, Node::new(honest.addr.clone()))
        .await
        .unwrap();
    wait_for(
        || {
            let s = leader.node.status();
            s.replication
                .iter()
                .any(|r| r.node == 3 && r.matched.is_some() && r.lag == 0)
        },
        "learner 3 catches up",
    )
    .await;
    let s = leader.node.status();
    let five = s.replication.iter().find(|r| r.node == 5).expect("node 5");
    assert_eq!((five.matched, five.heard_ms), (None, None), "{s:?}");
    assert_eq!(other.node.status().last_log_index, None);
    let e = leader.node.change_voters([1, 5].into()).await.unwrap_err();
    assert!(matches!(e, meta_consensus::Error::Conflict(_)), "{e}");

    // A member's address under a second id is refused by the leader itself, also when the
    // process there cannot be asked.
    let e = leader
        .node
        .add_learner(6, Node::new(honest.addr.clone()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is the address of node 3"), "{e}");
    for server in [&leader, &other, &honest] {
        server.node.shutdown().await.unwrap();
    }
}

/// A member restarted at another address is moved there with `PUT /v1/cluster/members/{id}`,
/// once it answers there as itself: the leader then replicates to it at the new address. An
/// address where nothing answers, or where another node answers, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_moves_to_a_new_address() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;
    let learner = start(2, &dir).await;
    leader
        .node
        .add_learner(2, Node::new(learner.addr.clone()))
        .await
        .unwrap();
    wait_for(
        || learner.node.status().role == Role::Learner,
        "the learner joins",
    )
    .await;
    let client = Client::new();

    // While node 2 still answers at its old address, no other process is taken for it, even
    // one that holds this cluster's id: two processes answering for one member could vote
    // twice in a term.
    let copy_dir = tempfile::tempdir().unwrap();
    let copy = start(2, &copy_dir).await;
    copy.node
        .accept_cluster(leader.node.cluster_id().unwrap())
        .await
        .unwrap();
    let (status, v) = client.move_member(&leader, 2, &copy.addr).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("still answers at its old address"),
        "{v}"
    );
    copy.node.shutdown().await.unwrap();
    drop(copy);

    // Node 2 restarts from its data dir on another port.
    learner.node.shutdown().await.unwrap();
    drop(learner);
    let moved = start(2, &dir).await;
    // Node 2 no longer answers at its old address; still, a server that is no metaserver node
    // (it answers 404 to everything) is not taken for it.
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap().to_string();
    let plain_task = tokio::spawn(async move {
        axum::serve(plain, axum::Router::new()).await.unwrap();
    });
    let (status, v) = client.move_member(&leader, 2, &plain_addr).await;
    assert_eq!(status, 409, "{v}");
    plain_task.abort();
    // A bound socket that does not listen: connections to its port are refused.
    let refused = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    refused.bind(&any.into()).unwrap();
    let refused_addr = refused
        .local_addr()
        .unwrap()
        .as_socket()
        .unwrap()
        .to_string();
    let (status, v) = client.move_member(&leader, 2, &refused_addr).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not answer"),
        "{v}"
    );
    let (status, v) = client.move_member(&leader, 2, &leader.addr).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    // A new node started with id 2 (an empty data dir) is not the member: two processes
    // answering for one member could vote twice in a term.
    let other_dir = tempfile::tempdir().unwrap();
    let impostor = start(2, &other_dir).await;
    let (status, v) = client.move_member(&leader, 2, &impostor.addr).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    assert_eq!(impostor.node.cluster_id(), None, "it adopted the cluster");
    impostor.node.shutdown().await.unwrap();

    let (status, v) = client.move_member(&leader, 2, &moved.addr).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(leader.node.status().nodes[&2], moved.addr);
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            &leader,
            "/v1/kv/after-the-move",
            Some(json!("x")),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let index = leader.node.status().last_log_index;
    wait_for(
        || moved.node.status().applied >= index,
        "the moved learner applies the write",
    )
    .await;
    for server in [&leader, &moved] {
        server.node.shutdown().await.unwrap();
    }
}

/// A write sent to a follower whose leader just stopped is not refused: the stopped leader did
/// nothing with it (its port is closed), so the follower sends it on to the leader elected
/// next, within two election timeouts, and the client gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_outlives_the_leader_it_was_forwarded_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster(&dir).await;
    let leader = the_leader(&servers).node.id();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    let old = servers.remove(&leader).unwrap();
    let old_node = old.node.clone();
    // Its port closes first (once its server task has ended, its listener is gone); its Raft
    // core runs on, so the follower still names it.
    old.task.abort();
    while !old.task.is_finished() {
        tokio::task::yield_now().await;
    }
    drop(old);
    assert_eq!(servers[&follower].node.status().leader_id, Some(leader));
    let put = {
        let http = reqwest::Client::new();
        let url = format!("http://{}/v1/kv/after-the-leader", servers[&follower].addr);
        tokio::spawn(async move {
            let r = http
                .put(url)
                .bearer_auth(TOKEN)
                .body("\"x\"")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
    };
    // Then the leader stops, and the others elect a new one.
    old_node.shutdown().await.unwrap();
    let (status, text) = put.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let new = servers[&follower].node.status().leader_id;
    assert!(new.is_some() && new != Some(leader), "{new:?}");
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}
