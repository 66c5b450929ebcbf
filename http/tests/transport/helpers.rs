//! The nodes of the transport tests: each behind a real HTTP server on an ephemeral loopback
//! port, started alone or as a three-node cluster, and a client that sends them requests
//! with the token.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use meta_consensus::{MetaNode, Node, NodeConfig, Role};
use meta_http::follower_read::CatchUp;
use meta_http::{AppState, HttpNetwork, Token};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common::{test_config, wait_for, DEADLINE};

pub const TOKEN: &str = "transport-token";

pub struct Server {
    pub node: MetaNode,
    pub addr: String,
    pub task: JoinHandle<()>,
    /// Tells the HTTP server to close its connections and stop ([`Server::stop`]).
    stop: Option<oneshot::Sender<()>>,
}

impl Server {
    /// Stops the node, then its HTTP server, closing every connection to it (a client's pooled
    /// connection would otherwise still reach the stopped node), so that another process can
    /// serve at its address.
    pub async fn stop(mut self) {
        self.node.shutdown().await.unwrap();
        let _ = self.stop.take().expect("stopped once").send(());
        tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("the HTTP server closes its connections")
            .unwrap();
    }
}

/// The address of a stopped server, kept bound (not listening: connections to it are refused,
/// as to a stopped process) so that no other test's ephemeral port takes it before a node
/// starts there again ([`start_at`]).
pub struct KeptPort {
    socket: socket2::Socket,
}

impl Server {
    /// [`Server::stop`], keeping its address for a later [`start_at`].
    pub async fn stop_keeping_port(self) -> KeptPort {
        let addr = self.addr.clone();
        self.stop().await;
        let at: std::net::SocketAddr = addr.parse().unwrap();
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // The closed server's connections may linger in TIME_WAIT on the port.
        socket.set_reuse_address(true).unwrap();
        socket
            .bind(&at.into())
            .expect("the stopped server's port was taken before it could be kept");
        KeptPort { socket }
    }
}

impl KeptPort {
    /// Makes the kept address take connections and never answer on them, as a paused process
    /// does (the kernel completes the handshakes; nothing reads the requests).
    pub fn stop_answering(&self) {
        self.socket.listen(1024).unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start(id: u64, dir: &TempDir) -> Server {
    start_with(id, dir, Some(meta_http::follower_read::CATCH_UP)).await
}

/// Starts node `id`; with `follower_reads`, a follower answers reads itself as it says;
/// without, it replays every read at the leader.
pub async fn start_with(id: u64, dir: &TempDir, follower_reads: Option<CatchUp>) -> Server {
    start_tuned(id, dir, follower_reads, |_| {}).await
}

/// [`start_with`], with `tune` adjusting the node's config last.
pub async fn start_tuned(
    id: u64,
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
    tune: impl FnOnce(&mut NodeConfig),
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    launch(id, dir, listener, follower_reads, tune, Tasks::USUAL).await
}

/// Starts node `id` at the address `port` kept (where a node served before it was stopped),
/// listening on the very socket that kept it.
pub async fn start_at(id: u64, dir: &TempDir, port: KeptPort) -> Server {
    port.socket.listen(1024).unwrap();
    port.socket.set_nonblocking(true).unwrap();
    let listener = TcpListener::from_std(port.socket.into()).unwrap();
    launch(
        id,
        dir,
        listener,
        Some(meta_http::follower_read::CATCH_UP),
        |_| {},
        Tasks::USUAL,
    )
    .await
}

/// The tasks the binary runs beside each node, as a test runs them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Tasks {
    /// Whether a leader tells the nodes a membership change removed (as the binary's leader
    /// does), or leaves them to learn it from the answers to their vote requests.
    removal_notices: bool,
    /// How often a leader's disk look asks the voters for their room (also when its role,
    /// leader or membership changes).
    disk_look_every: std::time::Duration,
}

impl Tasks {
    /// As the binary runs them, the disk look more often.
    const USUAL: Tasks = Tasks {
        removal_notices: true,
        disk_look_every: std::time::Duration::from_millis(200),
    };
}

async fn launch(
    id: u64,
    dir: &TempDir,
    listener: TcpListener,
    follower_reads: Option<CatchUp>,
    tune: impl FnOnce(&mut NodeConfig),
    tasks: Tasks,
) -> Server {
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = test_config(id, &addr, &dir.path().join(format!("node{id}")));
    // Three nodes over real HTTP in a debug build on a shared machine: elections slower than
    // the single-node tests', so a starved moment does not cost the leader.
    cfg.election_min_ms = 1000;
    cfg.election_max_ms = 2000;
    cfg.snapshot_logs_since_last = 0;
    cfg.max_in_snapshot_log_to_keep = 0;
    tune(&mut cfg);
    let token = Token::new(Some(TOKEN));
    let network = HttpNetwork::new(&cfg, token.clone());
    let node = MetaNode::open(cfg, network).await.unwrap();
    let mut state =
        AppState::new(node.clone(), token).with_follower_reads(follower_reads.is_some());
    if let Some(catch_up) = follower_reads {
        state = state.with_follower_read_catch_up(catch_up);
    }
    if tasks.removal_notices {
        tokio::spawn(meta_http::removal_notices::run(state.clone()));
    }
    tokio::spawn(meta_http::disk_handover::run(
        state.clone(),
        tasks.disk_look_every,
    ));
    tokio::spawn(meta_http::disk_alarm::run(
        state.clone(),
        meta_http::disk_alarm::CHECK_EVERY,
    ));
    let app = meta_http::router(state);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(meta_http::LimitedListener::new(listener, 10_000), app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Server {
        node,
        addr,
        task,
        stop: Some(stop),
    }
}

/// The requests `route` (with `method`) that a node answered with `status`, from its
/// `/metrics` (each node counts its own).
pub async fn served_with(
    client: &Client,
    server: &Server,
    method: &str,
    route: &str,
    status: u16,
) -> u64 {
    let (answered, metrics) = client
        .send(reqwest::Method::GET, server, "/metrics", None)
        .await;
    assert_eq!(answered, 200);
    let prefix = format!(
        "metaserver_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} "
    );
    metrics
        .as_str()
        .expect("metrics are text")
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// The requests `route` (with `method`) that a node answered with 200.
pub async fn served(client: &Client, server: &Server, method: &str, route: &str) -> u64 {
    served_with(client, server, method, route, 200).await
}

pub struct Client {
    pub http: reqwest::Client,
}

/// An HTTP client for the tests: no proxy, and a request that gets no answer within 60 s fails
/// (every request of these tests is answered in far less, or the node under test is broken).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap()
}

impl Client {
    pub fn new() -> Self {
        Client {
            http: http_client(),
        }
    }

    pub async fn send(
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
    pub async fn move_member(&self, leader: &Server, id: u64, addr: &str) -> (u16, Value) {
        let body = json!({ "addr": addr });
        let path = format!("/v1/cluster/members/{id}");
        self.send(reqwest::Method::PUT, leader, &path, Some(body))
            .await
    }
}

/// Starts node 1 as a cluster of its own and waits until it leads.
pub async fn start_alone(dir: &TempDir) -> Server {
    let leader = start(1, dir).await;
    leader
        .node
        .initialize(BTreeMap::from([(1, Node::new(leader.addr.clone()))]))
        .await
        .unwrap();
    wait_for(|| leader.node.status().role == Role::Leader, "node 1 leads").await;
    leader
}

/// Starts node 1 alone, writes keys `k0` to `k19` with values of `value_bytes`, builds a
/// snapshot and waits until the log is purged up to it: a member that joins now needs the
/// snapshot.
pub async fn leader_with_purged_log(dir: &TempDir, value_bytes: usize) -> Server {
    let leader = start_alone(dir).await;
    for i in 0..20 {
        let put = meta_consensus::Command::Put {
            key: format!("k{i}"),
            value: vec![7; value_bytes],
            if_revision: None,
        };
        leader.node.write(put).await.unwrap();
    }
    snapshot_and_purge(&leader).await;
    leader
}

/// Makes `leader` build a snapshot, and waits until it purged its log up to it: a member that
/// joins then needs the snapshot.
pub async fn snapshot_and_purge(leader: &Server) {
    let snapshot = leader.node.snapshot_now().await.unwrap();
    wait_for(
        || leader.node.status().purged >= Some(snapshot.index),
        "the leader purges its log up to the snapshot",
    )
    .await;
}

/// Adds `learner` to `leader`'s cluster as a learner, on the node (past the HTTP handler).
async fn add_learner(leader: &Server, learner: &Server) {
    let node = Node::new(learner.addr.clone());
    leader
        .node
        .add_learner(learner.node.id(), node)
        .await
        .unwrap();
}

/// Adds `learner` to `leader`'s cluster as a learner (on the node), and waits until it
/// installed a snapshot from the leader (one whose log the leader purged needs one).
pub async fn join_by_snapshot(leader: &Server, learner: &Server) {
    add_learner(leader, learner).await;
    wait_for(
        || learner.node.status().state_machine.snapshot_installs >= 1,
        "the learner installs the leader's snapshot",
    )
    .await;
}

/// Adds `learner` to `leader`'s cluster as a learner (on the node, past the HTTP handler), and
/// waits until it knows it is one.
pub async fn join_as_learner(leader: &Server, learner: &Server) {
    add_learner(leader, learner).await;
    wait_for(
        || learner.node.status().role == Role::Learner,
        "the learner joins",
    )
    .await;
}

/// A three-node cluster whose elections take 3 to 4 s (a follower still names a leader that
/// stopped a moment ago) and whose requests may wait a minute, with its leader and a follower.
pub async fn slow_election_cluster(
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
) -> (BTreeMap<u64, Server>, u64, u64) {
    let servers = start_cluster_tuned(dir, follower_reads, |_, cfg| {
        cfg.election_min_ms = 3000;
        cfg.election_max_ms = 4000;
        cfg.request_timeout = std::time::Duration::from_secs(60);
    })
    .await;
    let leader = the_leader(&servers).node.id();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    (servers, leader, follower)
}

/// Stops every server of `servers`.
pub async fn stop_all(servers: BTreeMap<u64, Server>) {
    for server in servers.into_values() {
        server.stop().await;
    }
}

pub fn the_leader(servers: &BTreeMap<u64, Server>) -> &Server {
    servers
        .values()
        .find(|s| s.node.status().role == Role::Leader)
        .expect("a leader")
}

/// Has `leader` hand its leadership over (as before a planned stop) and returns the node that
/// took over. A voter is picked only once it was heard from within the lease: it asks until
/// one is, for at most 20 s.
pub async fn hand_over(leader: &Server) -> u64 {
    use openraft::async_runtime::watch::WatchReceiver as _;
    let mut new = None;
    let mut metrics = leader.node.raft().metrics();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while new.is_none() && std::time::Instant::now() < deadline {
        new = leader
            .node
            .hand_over_leadership(std::time::Duration::from_secs(5))
            .await
            .unwrap();
        if new.is_none() {
            let wait = std::time::Duration::from_millis(100);
            let _ = tokio::time::timeout(wait, metrics.changed()).await;
        }
    }
    new.expect("a voter took over")
}

/// Starts nodes 1 to 3 over HTTP, initializes them as one cluster from node 1, and waits until
/// all three agree on a leader.
pub async fn start_cluster(dir: &TempDir) -> BTreeMap<u64, Server> {
    start_cluster_with(dir, Some(meta_http::follower_read::CATCH_UP)).await
}

pub async fn start_cluster_with(
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
) -> BTreeMap<u64, Server> {
    start_cluster_tuned(dir, follower_reads, |_, _| {}).await
}

/// [`start_cluster_with`], with `tune` adjusting each node's config (given its id) last.
pub async fn start_cluster_tuned(
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
    tune: impl Fn(u64, &mut NodeConfig),
) -> BTreeMap<u64, Server> {
    cluster(dir, follower_reads, tune, Tasks::USUAL).await
}

/// [`start_cluster_tuned`], but a leader's disk look asks the voters for their room only when
/// its role, leader or membership changes: what it learns of their disks otherwise comes from
/// their own alarms.
pub async fn start_cluster_looking_rarely(
    dir: &TempDir,
    tune: impl Fn(u64, &mut NodeConfig),
) -> BTreeMap<u64, Server> {
    let tasks = Tasks {
        disk_look_every: std::time::Duration::from_secs(3600),
        ..Tasks::USUAL
    };
    cluster(dir, Some(meta_http::follower_read::CATCH_UP), tune, tasks).await
}

/// [`start_cluster`], but a leader sends no removal notices: a removed node learns it only from
/// the answers to its vote requests.
pub async fn start_cluster_without_notices(dir: &TempDir) -> BTreeMap<u64, Server> {
    let catch_up = Some(meta_http::follower_read::CATCH_UP);
    let tasks = Tasks {
        removal_notices: false,
        ..Tasks::USUAL
    };
    cluster(dir, catch_up, |_, _| {}, tasks).await
}

async fn cluster(
    dir: &TempDir,
    follower_reads: Option<CatchUp>,
    tune: impl Fn(u64, &mut NodeConfig),
    tasks: Tasks,
) -> BTreeMap<u64, Server> {
    let mut servers = BTreeMap::new();
    for id in 1..=3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tune = |cfg: &mut NodeConfig| tune(id, cfg);
        let server = launch(id, dir, listener, follower_reads, tune, tasks).await;
        servers.insert(id, server);
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

/// Sends `PUT /v1/kv/{key}` with the value `"x"` to `server`.
pub async fn put_kv(server: &Server, key: &str) -> reqwest::Response {
    http_client()
        .put(format!("http://{}/v1/kv/{key}", server.addr))
        .bearer_auth(TOKEN)
        .body("\"x\"")
        .send()
        .await
        .unwrap()
}

/// Writers that put keys `{prefix}{w}-{i}` through the members at `addrs`, writer `w` through
/// `addrs[w]`, until `stop` is set; `done` counts the answered writes. Each writer ends with
/// the writes it saw refused (which, the status and body, and how long the answer took).
pub fn keep_writing(
    addrs: Vec<String>,
    prefix: &str,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
) -> tokio::task::JoinSet<Vec<String>> {
    let mut writers = tokio::task::JoinSet::new();
    for (w, addr) in addrs.into_iter().enumerate() {
        let (http, stop, done) = (http_client(), stop.clone(), done.clone());
        let base = format!("http://{addr}/v1/kv/{prefix}{w}-");
        writers.spawn(async move {
            let mut refused = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let sent = std::time::Instant::now();
                let r = http
                    .put(format!("{base}{i}"))
                    .bearer_auth(TOKEN)
                    .body("x")
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                if status != 200 {
                    refused.push(format!(
                        "{base}{i} after {:?}: {status} {}",
                        sent.elapsed(),
                        r.text().await.unwrap()
                    ));
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            refused
        });
    }
    writers
}

/// Stops the writers of [`keep_writing`] and returns every write they saw refused.
pub async fn stop_writing(
    stop: &AtomicBool,
    mut writers: tokio::task::JoinSet<Vec<String>>,
) -> Vec<String> {
    stop.store(true, Ordering::Relaxed);
    let mut refused = Vec::new();
    while let Some(joined) = writers.join_next().await {
        refused.extend(joined.unwrap());
    }
    refused
}
